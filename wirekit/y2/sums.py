"""Compact coding of a range's sums of y2 signs, for the DDP hook's reduce-scatter exchange.

In :mod:`wirekit.y2.torch`'s ``reduce-scatter`` exchange every rank owns a range of a bucket's
elements: the other ranks send it their delta words there, it sums them, and sends every rank
the sums.  All ranks use one tau, so a sum is a whole number of taus between ``-W`` and ``W``
(``W`` ranks, at most one word per rank and element), most of them 0.  A block codes one
range's sums as::

    nonzeros k (uint32, little-endian) | bitmap (one bit per element of the range) | codes

The bitmap's bit ``i`` (least significant bit of each byte first) is set where the sum of
element ``i`` is not 0; then, in element order, one code of ``value_bits(W)`` bits per
nonzero sum (``v + W`` for ``v < 0``, ``v + W - 1`` for ``v > 0``: the ``2 W`` possible values,
4 bits at 8 ranks), packed the same way.  A block for ``m`` elements with ``k`` nonzero sums
takes ``block_size(m, k, W)`` bytes: ``m / 8`` bytes of bitmap whatever the sums, plus
``k × value_bits(W) / 8``.

NumPy only: the blocks are a few kilobytes to a few megabytes per step.
"""

from __future__ import annotations

import numpy as np

from wirekit.errors import DecodeError, EncodeError

from .messages import PROTOCOL

#: Bytes before the bitmap: the count of nonzero sums.
HEADER = 4
#: The count of a block that stands for none: its range's owner refused a peer's words (and
#: says why in its own error), so that every rank stops, not only the owner.
REFUSED = 0xFFFFFFFF


def value_bits(world: int) -> int:
    """Bits of one nonzero sum's code with ``world`` ranks (its ``2 × world`` values)."""
    return max(1, (2 * world - 1).bit_length())


def block_size(size: int, nonzeros: int, world: int) -> int:
    """Bytes of the block of a range of ``size`` elements with ``nonzeros`` nonzero sums."""
    return HEADER + (size + nonzeros * value_bits(world) + 7) // 8


def refused() -> np.ndarray:
    """The block an owner sends instead of its sums when it refused the words it got."""
    return np.array([REFUSED], "<u4").view(np.uint8)


def _bits(values: np.ndarray, width: int) -> np.ndarray:
    """Each value's ``width`` low bits, least significant first, as one flat 0/1 array."""
    return ((values[:, None] >> np.arange(width, dtype=values.dtype)) & 1).astype(np.uint8).ravel()


def encode(sums: np.ndarray, world: int) -> np.ndarray:
    """The block (``uint8``) of one range's ``sums`` (integers in ``-world..world``).

    :class:`EncodeError` (field ``sums``) for a sum outside that range.
    """
    sums = np.asarray(sums, dtype=np.int64)
    nonzero = np.flatnonzero(sums)
    values = sums[nonzero]
    if values.size and int(np.abs(values).max()) > world:
        at = int(nonzero[np.argmax(np.abs(values) > world)])
        raise EncodeError(
            PROTOCOL, f"sums[{at}]", f"sum {int(sums[at])} of {world} ranks' signs is impossible"
        )
    codes = np.where(values < 0, values + world, values + world - 1)
    bits = np.zeros(sums.size + values.size * value_bits(world), np.uint8)
    bits[nonzero] = 1
    bits[sums.size :] = _bits(codes, value_bits(world))
    head = np.array([values.size], "<u4").view(np.uint8)
    return np.concatenate([head, np.packbits(bits, bitorder="little")])


def decode(block: np.ndarray, size: int, world: int, field: str) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, sums)`` of a block of ``size`` elements: where in the range the sums
    are not 0 (ascending) and those sums, checked first.

    ``block`` may be longer than the block (padding is ignored).  :class:`DecodeError`
    (``field``, the offset in the block) for a count beyond the range or the block, a
    bitmap that does not hold that many bits, or a code that is no sum of ``world`` signs.
    """
    block = np.asarray(block, dtype=np.uint8)
    if block.size < HEADER:
        raise DecodeError(PROTOCOL, field, 0, f"{block.size} bytes, shorter than its header")
    count = int(block[:HEADER].view("<u4")[0])
    if count == REFUSED:
        raise DecodeError(
            PROTOCOL, field, 0, "that rank refused the words it received (its error says why)"
        )
    width = value_bits(world)
    if count > size or block_size(size, count, world) > block.size:
        raise DecodeError(
            PROTOCOL,
            field,
            0,
            f"{count} nonzero sums do not fit {size} elements in {block.size} bytes",
        )
    bits = np.unpackbits(block[HEADER:], count=size + count * width, bitorder="little")
    positions = np.flatnonzero(bits[:size])
    if positions.size != count:
        raise DecodeError(
            PROTOCOL, field, HEADER, f"the bitmap marks {positions.size} sums, not {count}"
        )
    weights = np.left_shift(np.int64(1), np.arange(width, dtype=np.int64))
    codes = bits[size:].reshape(count, width).astype(np.int64) @ weights
    if codes.size and int(codes.max()) >= 2 * world:
        at = int(np.argmax(codes >= 2 * world))
        raise DecodeError(
            PROTOCOL,
            field,
            HEADER + (size + at * width) // 8,
            f"code {int(codes[at])} is no sum of {world} signs",
        )
    return positions, np.where(codes < world, codes - world, codes - world + 1)
