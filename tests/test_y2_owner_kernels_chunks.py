"""The owner kernels of the y2 twins on ranges longer than the Cython ``sum_range``'s
accumulator (``sums.SCRATCH`` elements at a time) and on ``sums_into``'s ``zero_rest``:
both twins give the same block, residual parts and update, the caller's scratch is left
zeros, and the update's unmarked elements are zeros."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twins import IMPLEMENTATIONS, load_codec

from wirekit.y2 import sums
from wirekit.y2.messages import PARAM_SHIFT

PURE_FIRST = tuple(reversed(IMPLEMENTATIONS))  # WIREKIT_PURE=1 skips at fast, after pure ran


@st.composite
def long_ranges(draw):
    """A layout of up to four y2 parameters of up to 3 × SCRATCH elements, a range across
    several accumulator chunks and each rank's words in it (sparse, ascending), the ranks'
    taus few (the sums repeat) or all different."""
    sizes = np.array(
        draw(st.lists(st.integers(0, 3 * sums.SCRATCH), min_size=1, max_size=4)), np.int64
    )
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    n = int(sizes.sum())
    lo = draw(st.integers(0, n))
    hi = draw(st.integers(lo, n))
    world = draw(st.integers(1, 5))
    taus = draw(st.lists(st.sampled_from([0.5, 1.0, 1.25, 3.0]), min_size=world, max_size=world))
    unit = min(taus)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    received = []
    for _ in range(world):
        count = min(hi - lo, int(rng.integers(0, 400)))
        chosen = np.sort(rng.choice(np.arange(lo, hi), count, replace=False)) if count else []
        words = []
        for p in np.asarray(chosen, np.int64).tolist():
            slot = int(np.searchsorted(starts + sizes, p, side="right"))
            positive = int(rng.integers(0, 2))
            words.append((slot << PARAM_SHIFT) | ((p - int(starts[slot])) << 1) | positive)
        received.append(np.array(words, np.uint32))
    most = draw(st.one_of(st.just(-1), st.integers(0, 600)))
    weights = np.array([t / unit for t in taus], np.float64)
    return received, weights, starts, sizes, lo, hi, sums.magnitudes(taus), unit, most


@settings(max_examples=40, deadline=None)
@given(long_ranges())
def test_twins_sum_long_ranges_alike_and_leave_the_scratch_zeros(case):
    results = {}
    for impl in PURE_FIRST:
        scratch = np.zeros(sums.SCRATCH, np.float64)
        results[impl] = load_codec("y2", impl).sum_range(*case, scratch)
        assert not scratch.any(), impl
    block, left_at, left, wanted = results["pure"]
    for impl, (b, at, rest, w) in results.items():
        assert b.tobytes() == block.tobytes(), impl
        assert at.tolist() == left_at.tolist() and rest.tolist() == left.tolist(), impl
        assert w == wanted, impl
    # and without a scratch (a new one each call): the same
    for impl in PURE_FIRST:
        b, at, rest, w = load_codec("y2", impl).sum_range(*case)
        assert b.tobytes() == block.tobytes() and w == wanted, impl


def test_a_scratch_too_small_is_refused():
    words = [np.zeros(0, np.uint32)]
    starts, sizes = np.zeros(1, np.int64), np.array([100], np.int64)
    codec = load_codec("y2", "fast")  # the pure twin needs no scratch
    with pytest.raises(ValueError, match="scratch"):
        codec.sum_range(words, np.ones(1), starts, sizes, 0, 100, np.ones(1), 1.0, -1, np.zeros(9))


@st.composite
def zero_rest_blocks(draw):
    """(out, start, block, size, table, scale) with ranges over several 64-bit words of the
    bitmap, in float16, 32 or 64 updates full of junk."""
    levels = draw(st.sampled_from([1, 3, 4, 16, 17]))
    table = np.cumsum(draw(st.lists(st.floats(0.01, 5.0), min_size=levels, max_size=levels)))
    size = draw(st.integers(0, 700))
    marked = sorted(draw(st.sets(st.integers(0, max(0, size - 1)), max_size=size))) if size else []
    codes = [draw(st.integers(1, levels)) * draw(st.sampled_from([1, -1])) for _ in marked]
    block = sums.encode_sparse(np.array(marked, np.int64), np.array(codes, np.int64), size, levels)
    block = np.concatenate([block, np.full(draw(st.integers(0, 9)), 0xA5, np.uint8)])
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    start = draw(st.integers(0, 70))
    out = np.full(start + size + draw(st.integers(0, 70)), np.nan, dtype)
    return out, start, block, size, table, draw(st.floats(1e-4, 2.0))


@settings(max_examples=60, deadline=None)
@given(zero_rest_blocks())
def test_twins_write_a_whole_range_with_zero_rest(case):
    out, start, block, size, table, scale = case
    where, codes = sums.decode(block, size, table.size, "f")
    want = out.copy()
    want[start : start + size] = 0
    want[start + where] = sums.values(codes, table) * scale
    count = int(block[:4].view("<u4")[0])
    for impl in PURE_FIRST:
        got = out.copy()
        load_codec("y2", impl).sums_into(got, start, block, size, count, table, scale, "f", True)
        assert got.tobytes() == want.tobytes(), impl
    got = out.copy()
    sums.decode_into(got, start, block, size, table, scale, "f", zero_rest=True)
    assert got.tobytes() == want.tobytes()
