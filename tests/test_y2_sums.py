"""wirekit.y2.sums: the table of sum magnitudes and the blocks of range sums the DDP hook's
reduce-scatter exchange sends (no torch needed: the coding is NumPy)."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wirekit.errors import DecodeError, EncodeError
from wirekit.y2 import sums


def test_the_module_example_runs():
    assert doctest.testmod(sums).failed == 0


def test_one_tau_for_all_ranks_makes_whole_taus_exact():
    table = sums.magnitudes([0.8] * 5)
    assert table.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    exact = np.array([0.0, 1.0, -3.0, 5.0, -5.0])
    codes = sums.quantize(exact, table)
    assert codes.tolist() == [0, 1, -3, 5, -5]
    assert sums.values(codes, table).tolist() == exact.tolist()


@given(st.lists(st.floats(1e-6, 1e3), min_size=2, max_size=64).filter(lambda t: len(set(t)) > 1))
def test_ranks_taus_make_a_geometric_table_from_the_smallest_tau(taus):
    table = sums.magnitudes(taus)
    assert table.size == sums.LEVELS and table[0] == 1.0
    ratio = math.fsum(taus) / min(taus)
    steps = table[1:] / table[:-1]
    assert np.allclose(steps, ratio ** (1 / 16), rtol=1e-12)
    assert np.all(table <= ratio)  # the top of the table: the sum of all taus, one step up


@given(st.lists(st.floats(1e-3, 10), min_size=2, max_size=16).filter(lambda t: len(set(t)) > 1))
def test_every_lone_word_is_within_half_a_step(taus):
    """A word of rank r alone at an element (the common case) comes back within half a
    step of the table of its value; the smallest tau's exactly."""
    unit = min(taus)
    table = sums.magnitudes(taus)
    step = table[1] / table[0]
    lone = np.array([t / unit for t in taus] + [-t / unit for t in taus])
    said = sums.values(sums.quantize(lone, table), table)
    assert np.all(np.sign(said) == np.sign(lone))
    inside = np.abs(lone) <= table[-1]
    assert np.all(np.abs(said - lone)[inside] <= (step - 1) / 2 * np.abs(lone)[inside] + 1e-12)
    assert said[int(np.argmin(taus))] == 1.0


@given(st.lists(st.floats(-50, 50), max_size=50), st.lists(st.floats(0.01, 5), min_size=2))
def test_quantize_picks_the_nearest_magnitude(values, taus):
    table = sums.magnitudes(taus)
    v = np.array(values, np.float64)
    got = sums.values(sums.quantize(v, table), table)
    candidates = np.concatenate([[0.0], table])
    best = np.min(np.abs(np.abs(v)[:, None] - candidates[None, :]), axis=1) if v.size else v
    assert np.allclose(np.abs(np.abs(v) - np.abs(got)), best)
    assert np.all((got == 0) | (np.sign(got) == np.sign(v)))


@given(st.integers(1, 64), st.data())
def test_blocks_round_trip_at_their_size(levels, data):
    codes = data.draw(st.lists(st.integers(-levels, levels), max_size=300))
    block = sums.encode(np.array(codes, np.int64), levels)
    nonzero = sum(v != 0 for v in codes)
    assert block.size == sums.block_size(len(codes), nonzero, levels)
    padded = np.concatenate([block, np.full(5, 0xAA, np.uint8)])  # padding is ignored
    positions, got = sums.decode(padded, len(codes), levels, "f")
    assert positions.tolist() == [i for i, v in enumerate(codes) if v]
    assert got.tolist() == [v for v in codes if v]


def test_a_block_is_a_bitmap_then_codes_of_log2_2l_bits():
    # a table of 8 magnitudes (8 ranks, one tau): 4-bit codes; -8 -> 0, -1 -> 7, +1 -> 8, +8 -> 15
    block = sums.encode(np.array([0, -8, 0, 1, 8, -1, 0, 0, 0, 0]), 8)
    assert sums.value_bits(8) == 4 and sums.value_bits(2) == 2 and sums.value_bits(1) == 1
    assert sums.value_bits(sums.LEVELS) == 5
    assert block[:4].tolist() == [4, 0, 0, 0]  # 4 nonzero sums
    # bitmap 0b0000111010 over 10 bits, then the codes 0, 8, 15, 7, least significant first
    bits = np.unpackbits(block[4:], bitorder="little")
    assert bits[:10].tolist() == [0, 1, 0, 1, 1, 1, 0, 0, 0, 0]
    codes = bits[10:26].reshape(4, 4) @ np.array([1, 2, 4, 8])
    assert codes.tolist() == [0, 8, 15, 7]
    assert block.size == 4 + (10 + 16 + 7) // 8


def test_a_code_beyond_the_table_is_refused_when_encoding():
    with pytest.raises(EncodeError, match=r"codes\[2\].*code 3 is beyond ±2 magnitudes"):
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


def test_a_code_beyond_the_table_is_refused():
    # 3 magnitudes: 3-bit codes, 0..5 valid; one nonzero sum coded 7
    block = np.array([1, 0, 0, 0, 0b1110_0001, 0], np.uint8)
    with pytest.raises(DecodeError, match="byte 4: code 7 is beyond a table of 3 magnitudes"):
        sums.decode(block, 5, 3, "f")
