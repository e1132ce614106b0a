"""Compact coding of a range's sums of y2 words, for the DDP hook's reduce-scatter exchange.

In :mod:`wirekit.y2.torch`'s ``reduce-scatter`` exchange every rank owns a range of a bucket's
elements: the other ranks send it their delta words there, it adds them up (a word of rank
``r`` is ``±tau_r``) and sends every rank the sums.  A sum is sent as a signed index into a
table of magnitudes that every rank builds from the ranks' taus (all ranks have them all),
:func:`magnitudes`, in units of the smallest tau:

* every rank has the same tau (a fixed tau, as in y2): the table is ``1, 2, ... W`` (``W``
  ranks, at most one word per rank and element): every sum is exact;
* otherwise (each rank's own adaptive tau): ``LEVELS`` magnitudes from 1 (the smallest tau)
  in equal ratios towards the sum of all taus: a sum is rounded to the nearest magnitude
  (or 0), which is exact for the smallest tau's lone words and within half a step of the
  others; the owner keeps what was rounded off in its residual (nothing is lost).

Whole units of one common tau would need no table, but with ranks' taus far apart they
round the words of a rank with a small tau to 0 step after step; the geometric table keeps
every lone word within about ``(ratio ** (1/16) - 1) / 2`` of its value.

A block codes one range's codes as::

    nonzeros k (uint32, little-endian) | bitmap (one bit per element of the range) | codes

The bitmap's bit ``i`` (least significant bit of each byte first) is set where the code of
element ``i`` is not 0; then, in element order, one code of ``value_bits(L)`` bits per nonzero
(``L`` magnitudes; ``v + L`` for ``v < 0``, ``v + L - 1`` for ``v > 0``: the ``2 L`` possible
values, 5 bits for the 16 levels), packed the same way.  A block for ``m`` elements with ``k``
nonzero codes takes ``block_size(m, k, L)`` bytes: ``m / 8`` bytes of bitmap whatever the
sums, plus ``k × value_bits(L) / 8``.

    >>> import numpy as np
    >>> table = magnitudes([0.5, 2.0])           # two ranks' taus, unit 0.5
    >>> table.size, float(table[0])
    (16, 1.0)
    >>> codes = quantize(np.array([0.0, 1.0, -5.0]), table)  # none, +0.5, -(0.5 + 2.0)
    >>> codes.tolist(), values(codes, table).round(3).tolist()   # the sum 5 beyond the table
    ([0, 1, -16], [0.0, 1.0, -4.522])

NumPy, and the y2 twin (Cython, or NumPy in :mod:`wirekit.y2._pure`) for what the DDP
hook runs every step: :func:`sum_range` (the owner of a range checks, sums, rounds and codes
the ranks' words there in one pass over the words and one over the nonzero sums) and
:func:`decode_into` (a block's sums written into the update in one pass); the blocks are a
few kilobytes to a few megabytes per step.  The bitmap is the only part that grows with
the range (one bit an element).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from wirekit._impl import select
from wirekit.errors import DecodeError, EncodeError

from . import _checks, _pure
from .messages import PROTOCOL

#: Bytes before the bitmap: the count of nonzero codes.
HEADER = _checks.SUMS_HEADER
#: The count of a block that stands for none: its range's owner refused a peer's words (and
#: says why in its own error), so that every rank stops, not only the owner.
REFUSED = 0xFFFFFFFF
#: Magnitudes in the table of ranks with different taus: 5-bit codes.
LEVELS = 16
#: :func:`sum_range` sums this many elements of a range at a time: its ``scratch`` needs
#: ``min(hi - lo, SCRATCH)`` float64 zeros.
SCRATCH = 8192


def magnitudes(taus: Sequence[float]) -> np.ndarray:
    """The table of sum magnitudes for ranks with these taus, ascending, in units of the
    smallest tau (float64).

    One tau for all: ``1 .. W``.  Otherwise ``LEVELS`` values ``q ** k`` (``k = 0 ..
    LEVELS - 1``) with ``q = (sum(taus) / min(taus)) ** (1 / 16)``; ``q`` is taken by four
    square roots and the powers by repeated products, each correctly rounded in IEEE
    arithmetic, so every rank builds the same table bit for bit from the same taus.
    """
    smallest = min(taus)
    if all(t == smallest for t in taus):
        return np.arange(1, len(taus) + 1, dtype=np.float64)
    ratio = math.fsum(taus) / smallest
    for _ in range(4):
        ratio = math.sqrt(ratio)
    table = [1.0]
    for _ in range(LEVELS - 1):
        table.append(table[-1] * ratio)
    return np.array(table, np.float64)


def quantize(sums: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Each sum's code (int64): ``±(k + 1)`` for the nearest magnitude ``table[k]``, 0 where
    0 is nearer than ``table[0]``; beyond the table, its largest magnitude."""
    sums = np.asarray(sums, np.float64)
    size = np.abs(sums)
    above = np.searchsorted(table, size)  # table[above - 1] < size <= table[above]
    padded = np.concatenate([[0.0], table, [table[-1]]])
    lower, upper = padded[above], padded[above + 1]
    index = np.where(size - lower <= upper - size, above, np.minimum(above + 1, table.size))
    return (np.sign(sums) * index).astype(np.int64)


def values(codes: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The sums that ``codes`` stand for (float64, in the table's unit)."""
    codes = np.asarray(codes, np.int64)
    padded = np.concatenate([[0.0], table])
    return np.sign(codes) * padded[np.abs(codes)]


def value_bits(levels: int) -> int:
    """Bits of one nonzero code for a table of ``levels`` magnitudes (``2 × levels`` codes)."""
    return _checks.code_bits(levels)


def block_size(size: int, nonzeros: int, levels: int) -> int:
    """Bytes of the block of a range of ``size`` elements with ``nonzeros`` nonzero codes."""
    return HEADER + (size + nonzeros * value_bits(levels) + 7) // 8


def refused() -> np.ndarray:
    """The block an owner sends instead of its sums when it refused the words it got."""
    return np.array([REFUSED], "<u4").view(np.uint8)


def _bits(values: np.ndarray, width: int) -> np.ndarray:
    """Each value's ``width`` low bits, least significant first, as one flat 0/1 array."""
    if width <= 8:
        small = values.astype(np.uint8)[:, None]
        return np.unpackbits(small, axis=1, count=width, bitorder="little").ravel()
    return ((values[:, None] >> np.arange(width, dtype=values.dtype)) & 1).astype(np.uint8).ravel()


def _kernels() -> ModuleType:
    """The y2 twin (Cython, or :mod:`wirekit.y2._pure`) that reads bitmaps and codes."""
    return select("y2", _pure)


def encode(codes: np.ndarray, levels: int) -> np.ndarray:
    """The block (``uint8``) of one range's ``codes`` (integers in ``-levels..levels``).

    :class:`EncodeError` (field ``codes``) for a code outside that range.
    """
    codes = np.asarray(codes, dtype=np.int64)
    nonzero = np.flatnonzero(codes)
    return encode_sparse(nonzero, codes[nonzero], codes.size, levels)


def encode_sparse(positions: np.ndarray, codes: np.ndarray, size: int, levels: int) -> np.ndarray:
    """The block (``uint8``) of a range of ``size`` elements whose nonzero codes are
    ``codes`` (``±1 .. ±levels``) at ``positions`` (ascending, distinct, below ``size``):
    the same bytes as :func:`encode` of the dense codes, without a pass over every
    element's code.

    :class:`EncodeError` (field ``codes[position]``) for a code 0 or beyond the table.
    """
    positions = np.asarray(positions, dtype=np.int64)
    codes = np.asarray(codes, dtype=np.int64)
    if codes.size:
        bad = (np.abs(codes) > levels) | (codes == 0)
        if bad.any():
            i = int(np.argmax(bad))
            at, code = int(positions[i]), int(codes[i])
            text = f"code {code} is beyond ±{levels} magnitudes" if code else "code 0 is marked"
            raise EncodeError(PROTOCOL, f"codes[{at}]", text)
    width = value_bits(levels)
    block = np.zeros(block_size(size, codes.size, levels), np.uint8)
    block[:HEADER] = np.array([codes.size], "<u4").view(np.uint8)
    if not codes.size:
        return block
    # the bitmap: a byte of 0/1 per element packed (cheaper than any per-word arithmetic)
    marks = np.zeros(size, np.uint8)
    marks[positions] = 1
    block[HEADER : HEADER + (size + 7) // 8] = np.packbits(marks, bitorder="little")
    # the codes, from bit ``size`` on: packed behind ``size % 8`` zero bits, then or-ed in
    coded = np.where(codes < 0, codes + levels, codes + levels - 1)
    lead = size % 8
    bits = np.concatenate([np.zeros(lead, np.uint8), _bits(coded, width)])
    packed = np.packbits(bits, bitorder="little")
    start = HEADER + size // 8
    block[start : start + packed.size] |= packed
    return block


def decode(block: np.ndarray, size: int, levels: int, field: str) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, codes)`` of a block of ``size`` elements: where in the range the codes
    are not 0 (ascending) and those codes (``±1 .. ±levels``), checked first.

    ``block`` may be longer than the block (padding is ignored).  :class:`DecodeError`
    (``field``, the offset in the block) for a count beyond the range or the block, a
    bitmap that does not hold that many bits, or a code beyond the table.  The bitmap and
    the codes are read by the y2 twin's ``bitmap_positions`` and ``read_fields`` (Cython,
    or NumPy in :mod:`wirekit.y2._pure`).
    """
    block = np.asarray(block, dtype=np.uint8)
    count = _count(block, size, levels, field)
    width = value_bits(levels)
    kernels = _kernels()
    positions = kernels.bitmap_positions(block[HEADER : HEADER + (size + 7) // 8], size)
    if positions.size != count:
        raise _checks.bitmap_count_error(field, positions.size, count)
    start = HEADER + size // 8
    stop = HEADER + (size + count * width + 7) // 8
    if width <= 56:
        coded = kernels.read_fields(block[start:stop], size % 8, count, width)
    else:  # beyond any table the hook builds: bit by bit
        bits = np.unpackbits(block[start:stop], bitorder="little")[size % 8 :]
        weights = np.left_shift(np.int64(1), np.arange(width, dtype=np.int64))
        coded = bits[: count * width].reshape(count, width).astype(np.int64) @ weights
    if coded.size and int(coded.max()) >= 2 * levels:
        at = int(np.argmax(coded >= 2 * levels))
        offset = HEADER + (size + at * width) // 8
        raise _checks.code_beyond_error(field, offset, int(coded[at]), levels)
    return positions, np.where(coded < levels, coded - levels, coded - levels + 1)


def _count(block: np.ndarray, size: int, levels: int, field: str) -> int:
    """The count of nonzero codes of a block (``uint8``) of ``size`` elements, checked
    against the range and the block's length (:class:`DecodeError` ``field`` at byte 0)."""
    if block.size < HEADER:
        raise DecodeError(PROTOCOL, field, 0, f"{block.size} bytes, shorter than its header")
    count = int(block[:HEADER].view("<u4")[0])
    if count == REFUSED:
        raise DecodeError(
            PROTOCOL, field, 0, "that rank refused the words it received (its error says why)"
        )
    if count > size or block_size(size, count, levels) > block.size:
        raise DecodeError(
            PROTOCOL,
            field,
            0,
            f"{count} nonzero sums do not fit {size} elements in {block.size} bytes",
        )
    return count


def decode_into(
    out: np.ndarray,
    start: int,
    block: np.ndarray,
    size: int,
    table: np.ndarray,
    scale: float,
    field: str,
    zero_rest: bool = False,
) -> None:
    """Write the sums of a block of ``size`` elements into ``out[start:start + size]``,
    each ``values(code, table) × scale`` (cast to ``out``'s dtype) where the bitmap marks
    a nonzero code; the other elements are left alone, or set to 0 with ``zero_rest``
    (then ``out`` need not be zeroed first).

    The same checks and errors as :func:`decode` (``levels`` is the table's size), all made
    before anything is written; ValueError for elements beyond ``out``.  One pass of the y2
    twin's ``sums_into`` (Cython, or NumPy in :mod:`wirekit.y2._pure`) reads the bitmap and
    the codes and writes the values.
    """
    block = np.asarray(block, dtype=np.uint8)
    table = np.asarray(table, np.float64)
    count = _count(block, size, table.size, field)
    _kernels().sums_into(out, start, block, size, count, table, scale, field, zero_rest)


def sum_range(
    received: Sequence[np.ndarray],
    weights: np.ndarray,
    slot_start: np.ndarray,
    slot_size: np.ndarray,
    lo: int,
    hi: int,
    table: np.ndarray,
    unit: float,
    most: int = -1,
    scratch: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The owner's side of a range ``lo:hi`` of a bucket's buffer: ``(block, left_at, left,
    wanted)``, every rank's words there checked and summed (each ``±weights[r]``), the
    nonzero sums coded as :func:`quantize` and :func:`encode_sparse` code them (at most
    ``most``, ``-1`` for all: past it the smallest wait), what the codes do not say (times
    ``unit``) at the buffer positions ``left_at``, and how many nonzero codes it wanted.

    ``slot_start``/``slot_size``: where each y2 parameter (a word's top 10 bits) starts in
    the buffer and its size.  :class:`DecodeError` (``rank[r].words[i]``) for a word that
    addresses no element, or one outside the range or not after the previous one.  The y2
    twin's ``sum_range`` (Cython: one pass over the words and one over the nonzero sums; or
    NumPy in :mod:`wirekit.y2._pure`).  ``scratch``: float64 zeros that the Cython twin
    sums in and leaves zeros (kept by a caller that sums every step;
    None: a new one each call); ``min(hi - lo, SCRATCH)`` of them are enough.
    """
    return _kernels().sum_range(  # type: ignore[no-any-return]
        received, weights, slot_start, slot_size, lo, hi, table, unit, most, scratch
    )


def word_positions(
    words: np.ndarray, slot_start: np.ndarray, slot_size: np.ndarray, field: str
) -> np.ndarray:
    """Where in a bucket's buffer each word's element is (int64), with the layout of
    :func:`sum_range`; :class:`DecodeError` (``field[i]``) for the first word that
    addresses no element.  The y2 twin's ``word_positions``."""
    return _kernels().word_positions(words, slot_start, slot_size, field)  # type: ignore[no-any-return]
