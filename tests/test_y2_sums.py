"""wirekit.y2.sums: the blocks of range sums the DDP hook's reduce-scatter exchange sends
(no torch needed: the coding is NumPy)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wirekit.errors import DecodeError, EncodeError
from wirekit.y2 import sums


@given(st.integers(1, 64), st.data())
def test_blocks_round_trip_at_their_size(world, data):
    values = data.draw(st.lists(st.integers(-world, world), max_size=300))
    block = sums.encode(np.array(values, np.int64), world)
    nonzero = sum(v != 0 for v in values)
    assert block.size == sums.block_size(len(values), nonzero, world)
    padded = np.concatenate([block, np.full(5, 0xAA, np.uint8)])  # padding is ignored
    positions, got = sums.decode(padded, len(values), world, "f")
    assert positions.tolist() == [i for i, v in enumerate(values) if v]
    assert got.tolist() == [v for v in values if v]


def test_a_block_is_a_bitmap_then_codes_of_log2_2w_bits():
    # 8 ranks: 4-bit codes; -8 -> 0, -1 -> 7, +1 -> 8, +8 -> 15
    block = sums.encode(np.array([0, -8, 0, 1, 8, -1, 0, 0, 0, 0]), 8)
    assert sums.value_bits(8) == 4 and sums.value_bits(2) == 2 and sums.value_bits(1) == 1
    assert block[:4].tolist() == [4, 0, 0, 0]  # 4 nonzero sums
    # bitmap 0b0000111010 over 10 bits, then the codes 0, 8, 15, 7, least significant first
    bits = np.unpackbits(block[4:], bitorder="little")
    assert bits[:10].tolist() == [0, 1, 0, 1, 1, 1, 0, 0, 0, 0]
    codes = bits[10:26].reshape(4, 4) @ np.array([1, 2, 4, 8])
    assert codes.tolist() == [0, 8, 15, 7]
    assert block.size == 4 + (10 + 16 + 7) // 8


def test_a_sum_beyond_the_ranks_is_refused_when_encoding():
    with pytest.raises(EncodeError, match=r"sums\[2\].*sum 3 of 2 ranks' signs"):
        sums.encode(np.array([0, 1, 3]), 2)


@pytest.mark.parametrize(
    ("block", "size", "text"),
    [
        (np.zeros(3, np.uint8), 8, "at byte 0: 3 bytes, shorter than its header"),
        (np.array([9, 0, 0, 0, 0xFF], np.uint8), 8, "9 nonzero sums do not fit 8 elements"),
        (np.array([2, 0, 0, 0, 0], np.uint8), 8, "do not fit 8 elements in 5 bytes"),
        (np.array([2, 0, 0, 0, 0b111, 0], np.uint8), 8, "byte 4: the bitmap marks 3 sums, not 2"),
        (np.array([0xFF] * 4, np.uint8), 8, "that rank refused the words it received"),
    ],
)
def test_bad_blocks_are_refused_before_use(block, size, text):
    with pytest.raises(DecodeError, match=text) as info:
        sums.decode(block, size, 2, "rank[1].sums")
    assert info.value.field == "rank[1].sums"


def test_a_code_beyond_2w_is_refused():
    # 3 ranks: 3-bit codes, 0..5 valid; one nonzero sum coded 7
    block = np.array([1, 0, 0, 0, 0b1110_0001, 0], np.uint8)
    with pytest.raises(DecodeError, match="byte 4: code 7 is no sum of 3 signs"):
        sums.decode(block, 5, 3, "f")
