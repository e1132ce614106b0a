"""wirekit.y2.sums coded from the nonzero sums only (what the DDP hook's owner of a range
does): ``encode_sparse`` gives the bytes of ``encode`` of the dense codes, ``decode`` reads
them back, at every width of code and alignment of the bitmap; the two y2 twins' kernels
that read a block (``bitmap_positions``, ``read_fields``) give the same results (no torch
needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from twins import IMPLEMENTATIONS, load_codec

from wirekit.errors import EncodeError
from wirekit.y2 import sums


@st.composite
def sparse_codes(draw, max_levels: int = 2**12):
    """(size, levels, positions, codes): a range's nonzero codes, ascending positions."""
    levels = draw(st.one_of(st.integers(1, 64), st.integers(1, max_levels)))
    size = draw(st.integers(0, 700))
    marked = draw(st.sets(st.integers(0, max(0, size - 1)), max_size=size)) if size else set()
    positions = np.array(sorted(marked), np.int64)
    values = draw(
        st.lists(
            st.integers(1, levels).flatmap(lambda v: st.sampled_from([v, -v])),
            min_size=positions.size,
            max_size=positions.size,
        )
    )
    return size, levels, positions, np.array(values, np.int64)


@given(sparse_codes())
def test_sparse_encoding_gives_the_dense_encodings_bytes(case):
    size, levels, positions, codes = case
    dense = np.zeros(size, np.int64)
    dense[positions] = codes
    block = sums.encode_sparse(positions, codes, size, levels)
    assert block.dtype == np.uint8
    assert block.tobytes() == sums.encode(dense, levels).tobytes()
    assert block.size == sums.block_size(size, codes.size, levels)


@given(sparse_codes(), st.integers(0, 9))
def test_sparse_blocks_round_trip_with_any_padding(case, pad):
    size, levels, positions, codes = case
    block = sums.encode_sparse(positions, codes, size, levels)
    padded = np.concatenate([block, np.full(pad, 0xA5, np.uint8)])  # padding is ignored
    got_positions, got_codes = sums.decode(padded, size, levels, "f")
    assert got_positions.tolist() == positions.tolist()
    assert got_codes.tolist() == codes.tolist()


@pytest.mark.parametrize("levels", [2**13, 2**24, 2**40])
def test_codes_wider_than_a_byte_and_than_a_window_round_trip(levels):
    # 15, 26 and 42 bits a code: read through the 4-byte window, then bit by bit
    positions = np.array([0, 3, 4, 10], np.int64)
    codes = np.array([levels, -levels, 1, -1], np.int64)
    block = sums.encode_sparse(positions, codes, 11, levels)
    dense = np.zeros(11, np.int64)
    dense[positions] = codes
    assert block.tobytes() == sums.encode(dense, levels).tobytes()
    got_positions, got_codes = sums.decode(block, 11, levels, "f")
    assert got_positions.tolist() == positions.tolist()
    assert got_codes.tolist() == codes.tolist()


def test_quantize_and_values_of_the_nonzero_sums_are_the_dense_ones():
    # what the hook does: the codes of the nonzero sums equal the dense codes there
    rng = np.random.default_rng(7)
    table = sums.magnitudes([0.3, 0.5, 0.5, 2.0])
    dense = np.where(rng.random(500) < 0.2, rng.normal(0, 4, 500), 0.0)
    nonzero = np.flatnonzero(dense)
    codes = sums.quantize(dense[nonzero], table)
    assert codes.tolist() == sums.quantize(dense, table)[nonzero].tolist()
    assert not sums.quantize(dense, table)[dense == 0].any()
    sent = codes != 0
    block = sums.encode_sparse(nonzero[sent], codes[sent], 500, table.size)
    assert block.tobytes() == sums.encode(sums.quantize(dense, table), table.size).tobytes()


@pytest.mark.parametrize(
    ("codes", "text"),
    [([1, 3], r"codes\[7\].*code 3 is beyond ±2 magnitudes"), ([0, 1], r"codes\[2\].*code 0")],
)
def test_sparse_encoding_refuses_a_code_0_or_beyond_the_table(codes, text):
    positions = np.array([2, 7], np.int64)
    with pytest.raises(EncodeError, match=text):
        sums.encode_sparse(positions, np.array(codes, np.int64), 8, 2)


# --- the twins' block readers -----------------------------------------------------------


@given(st.binary(max_size=200), st.integers(0, 1700))
def test_twins_find_the_same_bitmap_positions(data, size):
    bitmap = np.frombuffer(data, np.uint8)
    results = []
    for impl in reversed(IMPLEMENTATIONS):  # pure first: WIREKIT_PURE=1 skips at fast
        codec = load_codec("y2", impl)
        if bitmap.size < (size + 7) // 8:
            with pytest.raises(ValueError, match=f"{bitmap.size} bytes hold fewer than {size}"):
                codec.bitmap_positions(bitmap, size)
            continue
        got = codec.bitmap_positions(bitmap, size)
        assert got.dtype == np.int64
        results.append(got.tolist())
    bits = np.unpackbits(bitmap, bitorder="little")[:size]
    for got in results:
        assert got == np.flatnonzero(bits).tolist()


@given(st.binary(max_size=120), st.integers(0, 7), st.integers(0, 40), st.integers(1, 56))
def test_twins_read_the_same_fields(data, lead, count, width):
    raw = np.frombuffer(data, np.uint8)
    fits = (lead + count * width + 7) // 8 <= raw.size
    bits = np.unpackbits(raw, bitorder="little")
    for impl in reversed(IMPLEMENTATIONS):  # pure first: WIREKIT_PURE=1 skips at fast
        codec = load_codec("y2", impl)
        if not fits:
            with pytest.raises(ValueError, match="beyond the data"):
                codec.read_fields(raw, lead, count, width)
            continue
        got = codec.read_fields(raw, lead, count, width)
        want = [
            sum(int(bits[lead + i * width + j]) << j for j in range(width)) for i in range(count)
        ]
        assert got.dtype == np.int64 and got.tolist() == want


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("width", [0, 57])
def test_fields_of_no_bits_or_beyond_56_are_refused(impl, width):
    with pytest.raises(ValueError, match=f"fields of {width} bits: 1 to 56 only"):
        load_codec("y2", impl).read_fields(np.zeros(16, np.uint8), 0, 1, width)
