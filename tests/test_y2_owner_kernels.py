"""The DDP hook's owner kernels in both y2 twins: ``sum_range`` (a range's words checked,
summed, rounded to the table and coded into a sums block), ``sums_into`` (a block's sums
written into the update) and ``word_positions``.  The twins give the same bytes, the same
residual parts and the same update on random inputs, and refuse malformed words and blocks
with the same error (field, offset, text); the pure twin is checked against
:mod:`wirekit.y2.sums`'s ``quantize``/``encode``/``decode`` (no torch needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from twins import IMPLEMENTATIONS, load_codec

from wirekit.errors import DecodeError
from wirekit.y2 import sums
from wirekit.y2.messages import PARAM_SHIFT

PURE_FIRST = tuple(reversed(IMPLEMENTATIONS))  # WIREKIT_PURE=1 skips at fast, after pure ran


def _word(slot: int, index: int, positive: bool) -> int:
    return (slot << PARAM_SHIFT) | (index << 1) | int(positive)


@st.composite
def layouts(draw):
    """(slot_start, slot_size, n): a bucket's y2 parameters laid out one after the other
    (some empty), ``n`` elements in all."""
    sizes = draw(st.lists(st.integers(0, 40), min_size=1, max_size=6))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return starts, np.array(sizes, np.int64), int(sum(sizes))


def _words_at(positions, signs, starts, sizes) -> np.ndarray:
    """The words of buffer ``positions`` (each in a nonempty slot) with those signs."""
    out = []
    for p, positive in zip(positions, signs, strict=True):
        slot = int(np.searchsorted(starts + sizes, p, side="right"))
        out.append(_word(slot, int(p - starts[slot]), positive))
    return np.array(out, np.uint32)


@st.composite
def owner_cases(draw):
    """Everything ``sum_range`` takes, words valid: each rank's words an ascending subset
    of the range ``lo:hi``; the table from taus (all equal: whole taus; else 16 levels)."""
    starts, sizes, n = draw(layouts())
    lo = draw(st.integers(0, n))
    hi = draw(st.integers(lo, n))
    world = draw(st.integers(1, 6))
    same = draw(st.booleans())
    tau_list = st.floats(1e-3, 10.0, allow_nan=False)
    taus = (
        [draw(tau_list)] * world
        if same
        else draw(st.lists(tau_list, min_size=world, max_size=world))
    )
    unit = min(taus)
    received = []
    for _ in range(world):
        chosen = (
            sorted(draw(st.sets(st.integers(lo, max(lo, hi - 1)), max_size=hi - lo)))
            if hi > lo
            else []
        )
        signs = draw(st.lists(st.booleans(), min_size=len(chosen), max_size=len(chosen)))
        received.append(_words_at(chosen, signs, starts, sizes))
    most = draw(st.one_of(st.just(-1), st.integers(0, max(0, hi - lo))))
    weights = np.array([t / unit for t in taus], np.float64)
    return received, weights, starts, sizes, lo, hi, sums.magnitudes(taus), unit, most


def _results(case):
    results = {}
    for impl in PURE_FIRST:
        results[impl] = load_codec("y2", impl).sum_range(*case)
    return results


@given(owner_cases())
def test_twins_sum_and_code_a_range_alike(case):
    results = _results(case)
    block, left_at, left, wanted = results["pure"]
    for impl, (b, at, rest, w) in results.items():
        assert b.dtype == np.uint8 and at.dtype == np.int64 and rest.dtype == np.float64, impl
        assert b.tobytes() == block.tobytes(), impl
        assert at.tolist() == left_at.tolist() and rest.tolist() == left.tolist(), impl
        assert w == wanted, impl


@given(owner_cases())
def test_the_pure_twins_block_is_the_sums_quantized_and_encoded(case):
    received, weights, starts, _sizes, lo, hi, table, unit, most = case
    block, left_at, left, wanted = load_codec("y2", "pure").sum_range(*case)
    total = np.zeros(hi - lo)
    for r, words in enumerate(received):
        for w in words.tolist():
            p = int(starts[w >> PARAM_SHIFT]) + ((w >> 1) & 0x1FFFFF)
            total[p - lo] += weights[r] if w & 1 else -weights[r]
    codes = sums.quantize(total, table)
    assert wanted == np.count_nonzero(codes)
    where, got = sums.decode(block, hi - lo, table.size, "f")
    kept = np.zeros(hi - lo, np.int64)
    kept[where] = got
    if most < 0 or wanted <= most:
        assert kept.tolist() == codes.tolist()
    else:  # the largest ``most`` sums, the others wait
        assert np.count_nonzero(kept) == most
        assert np.all(kept[kept != 0] == codes[kept != 0])
    # nothing is lost: what the block says plus what waits is the sum
    said = np.zeros(hi - lo)
    said[where] = sums.values(got, table)
    rest = np.zeros(hi - lo)
    rest[left_at - lo] = left / unit
    assert np.allclose(said + rest, total, rtol=1e-12, atol=1e-12)


@st.composite
def blocks(draw):
    """(out, start, block, size, table, scale): a valid block of random codes for a range
    at ``start`` of an update of float16, 32 or 64."""
    levels = draw(st.one_of(st.integers(1, 40), st.integers(1, 3000)))
    table = np.cumsum(draw(st.lists(st.floats(0.01, 5.0), min_size=levels, max_size=levels)))
    size = draw(st.integers(0, 300))
    marked = sorted(draw(st.sets(st.integers(0, max(0, size - 1)), max_size=size))) if size else []
    codes = [draw(st.integers(1, levels)) * draw(st.sampled_from([1, -1])) for _ in marked]
    block = sums.encode_sparse(np.array(marked, np.int64), np.array(codes, np.int64), size, levels)
    pad = draw(st.integers(0, 9))
    block = np.concatenate([block, np.full(pad, 0xA5, np.uint8)])
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    start = draw(st.integers(0, 20))
    out = np.full(start + size + draw(st.integers(0, 5)), 7, dtype)
    return out, start, block, size, table, draw(st.floats(1e-4, 2.0))


@given(blocks())
def test_twins_write_a_blocks_sums_alike(case):
    out, start, block, size, table, scale = case
    where, codes = sums.decode(block, size, table.size, "f")
    want = out.copy()
    want[start + where] = sums.values(codes, table) * scale
    count = int(block[:4].view("<u4")[0])
    for impl in PURE_FIRST:
        got = out.copy()
        load_codec("y2", impl).sums_into(got, start, block, size, count, table, scale, "f")
        assert got.tobytes() == want.tobytes(), impl


@given(layouts(), st.lists(st.integers(0, 2**32 - 1), max_size=30))
def test_twins_find_the_same_positions_or_the_same_unaddressed_word(layout, words):
    starts, sizes, _n = layout
    raw = np.array(words, np.uint32)
    outcomes = []
    for impl in PURE_FIRST:
        try:
            outcomes.append(load_codec("y2", impl).word_positions(raw, starts, sizes, "w").tolist())
        except DecodeError as exc:
            outcomes.append((exc.field, exc.offset, str(exc)))
    assert all(o == outcomes[0] for o in outcomes)


# --- malformed words and blocks: the same refusal from both twins --------------------------


def _refusals(call) -> list[tuple]:
    out = []
    for impl in PURE_FIRST:
        with pytest.raises(DecodeError) as info:
            call(load_codec("y2", impl))
        exc = info.value
        out.append((exc.field, exc.offset, str(exc)))
    assert all(o == out[0] for o in out), out
    return out[0]


STARTS, SIZES = np.array([0, 10, 10], np.int64), np.array([10, 0, 6], np.int64)
TABLE = sums.magnitudes([1.0, 1.0])


@pytest.mark.parametrize(
    ("ranks", "field", "offset", "text"),
    [
        (  # a parameter beyond the bucket's
            [[_word(0, 4, True)], [_word(0, 5, True), _word(7, 0, True)]],
            "rank[1].words[1]",
            4,
            "word 0x01c00001 addresses no element of this bucket",
        ),
        (  # an index beyond its parameter (and an empty one)
            [[_word(2, 6, False)]],
            "rank[0].words[0]",
            0,
            "word 0x0080000c addresses no element of this bucket",
        ),
        ([[_word(1, 0, True)]], "rank[0].words[0]", 0, "word 0x00400001 addresses no element"),
        (  # outside the owner's range 2:14
            [[_word(0, 3, True), _word(0, 1, True)]],
            "rank[0].words[1]",
            4,
            "element 1 is not after the previous word's in range 2:14",
        ),
        (
            [[_word(2, 5, True)]],
            "rank[0].words[0]",
            0,
            "element 15 is not after the previous word's in range 2:14",
        ),
        (  # twice the same element, then out of order
            [[], [_word(0, 3, True), _word(0, 3, False), _word(0, 2, True)]],
            "rank[1].words[1]",
            4,
            "element 3 is not after the previous word's in range 2:14",
        ),
        (  # a rank's unaddressed word is named before its words out of order
            [[_word(0, 5, True), _word(0, 4, True), _word(9, 0, True)]],
            "rank[0].words[2]",
            8,
            "word 0x02400001 addresses no element",
        ),
    ],
)
def test_malformed_words_are_refused_alike_by_both_twins(ranks, field, offset, text):
    received = [np.array(r, np.uint32) for r in ranks]
    weights = np.ones(len(received))
    got = _refusals(
        lambda codec: codec.sum_range(received, weights, STARTS, SIZES, 2, 14, TABLE, 1.0, -1)
    )
    assert got[:2] == (field, offset)
    assert text in got[2]


@given(owner_cases(), st.data())
def test_random_corruption_of_the_words_is_refused_alike(case, data):
    received, weights, starts, sizes, lo, hi, table, unit, most = case
    flat = [w for r in received for w in r.tolist()]
    if not flat:
        return
    r = data.draw(st.sampled_from([k for k, words in enumerate(received) if words.size]))
    i = data.draw(st.integers(0, received[r].size - 1))
    corrupted = [words.copy() for words in received]
    corrupted[r][i] = data.draw(st.integers(0, 2**32 - 1))
    case = (corrupted, weights, starts, sizes, lo, hi, table, unit, most)
    outcomes = []
    for impl in PURE_FIRST:
        try:
            block, at, rest, wanted = load_codec("y2", impl).sum_range(*case)
            outcomes.append((block.tobytes(), at.tolist(), rest.tolist(), wanted))
        except DecodeError as exc:
            outcomes.append((exc.field, exc.offset, str(exc)))
    assert all(o == outcomes[0] for o in outcomes)


@pytest.mark.parametrize(
    ("block", "offset", "text"),
    [
        (np.array([2, 0, 0, 0, 0b111, 0, 0], np.uint8), 4, "the bitmap marks 3 sums, not 2"),
        (np.array([1, 0, 0, 0, 0b1, 7], np.uint8), 5, "code 7 is beyond a table of 3"),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_malformed_blocks_are_refused_alike_before_anything_is_written(block, offset, text, dtype):
    table = np.array([1.0, 2.0, 3.0])
    out = np.full(8, 3, dtype)
    got = _refusals(lambda codec: codec.sums_into(out, 0, block, 8, int(block[0]), table, 1.0, "s"))
    assert got[:2] == ("s", offset) and text in got[2]
    assert np.all(out == 3)  # nothing written
    with pytest.raises(DecodeError, match=text):  # what decode says, at the same byte
        sums.decode(block, 8, 3, "s")


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_arguments_beyond_the_kernels_are_refused_alike(impl):
    codec = load_codec("y2", impl)
    none = np.zeros(0, np.uint32)
    with pytest.raises(ValueError, match="2 weights for the words of 1 ranks"):
        codec.sum_range([none], np.ones(2), STARTS, SIZES, 0, 4, TABLE, 1.0)
    with pytest.raises(ValueError, match="3 slot starts for 2 slot sizes"):
        codec.sum_range([none], np.ones(1), STARTS, SIZES[:2], 0, 4, TABLE, 1.0)
    with pytest.raises(ValueError, match="range 5:4 is not a range of elements"):
        codec.sum_range([none], np.ones(1), STARTS, SIZES, 5, 4, TABLE, 1.0)
    with pytest.raises(ValueError, match="a table of 0 magnitudes"):
        codec.sum_range([none], np.ones(1), STARTS, SIZES, 0, 4, np.zeros(0), 1.0)
    with pytest.raises(ValueError, match="elements 3:11 are beyond an update of 10"):
        codec.sums_into(np.zeros(10, np.float32), 3, np.zeros(9, np.uint8), 8, 0, TABLE, 1.0, "s")
