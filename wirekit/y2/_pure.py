"""The pure y2 codec: the construct spec for messages, plain vectorized NumPy for kernels.

This is the reference the Cython twin (``wirekit/_fast/y2.pyx``) is tested against, and the
path wirekit uses when the extension is not built.  Same functions, same results, same
errors (field, offset and text) as the twin; keep the checks in one order in both.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from construct import Container

from wirekit.errors import DecodeError, EncodeError

from . import _checks, spec
from .messages import (
    BIAS_SHIFT,
    HANDSHAKE_SIZE,
    I32_MAX,
    I32_MIN,
    LAYER_SHIFT,
    MAX_DELTA_WORDS,
    MAX_INDEX,
    NODE_INDEX_SIZE,
    PARAM_SHIFT,
    PROTOCOL,
    RUNTIME_SIZES,
    Delta,
    Finished,
    Message,
    MessageType,
    NodeIndex,
    Runtime,
)

Buffer = Any
_NATIVE_BIG = sys.byteorder == "big"


# --- messages -------------------------------------------------------------------------------


def _fail(field: str, offset: int, text: str) -> DecodeError:
    return DecodeError(PROTOCOL, field, offset, text)


def _bytes_view(buf: Buffer) -> memoryview:
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


def check_handshake(buf: Buffer, pos: int = 0) -> tuple[int, int]:
    """Validate the handshake at ``pos``; return ``(type, size)``.

    Only the 8 handshake bytes are read, so a stream reader can reject a bad message (or one
    over its size limit) before any payload arrives.
    """
    view = _bytes_view(buf)
    if pos < 0 or pos > len(view):
        raise _checks.position_error(pos, len(view))
    have = len(view) - pos
    if have < HANDSHAKE_SIZE:
        raise _fail("handshake", len(view), f"truncated: need {HANDSHAKE_SIZE} bytes, have {have}")
    h = spec.HANDSHAKE.parse(bytes(view[pos : pos + HANDSHAKE_SIZE]))
    if not 0 <= h.type <= MessageType.FINISHED:
        raise _fail("type", pos, f"unknown message type {h.type} (0..3)")
    if h.size < 0:
        raise _fail("size", pos + 4, f"negative payload size {h.size}")
    kind = MessageType(h.type)
    if kind == MessageType.NODE_INDEX and h.size != NODE_INDEX_SIZE:
        raise _fail(
            "size", pos + 4, f"a node_index payload is {NODE_INDEX_SIZE} bytes, got {h.size}"
        )
    if kind == MessageType.RUNTIME and h.size not in RUNTIME_SIZES:
        raise _fail("size", pos + 4, f"a runtime payload is 16 or 20 bytes, got {h.size}")
    if kind == MessageType.FINISHED and h.size != 0:
        raise _fail("size", pos + 4, f"a finished message has no payload, got {h.size} bytes")
    if kind == MessageType.DELTA and h.size % 4:
        raise _fail("size", pos + 4, f"a delta payload is whole 4-byte words, got {h.size} bytes")
    return h.type, h.size


def scan_deltas(
    buf: Buffer, pos: int, end: int, max_bytes: int, max_message_size: int
) -> tuple[int, int]:
    """The run of whole Delta messages at ``buf[pos:end]``: ``(stop, count)``.

    Walks consecutive messages whose handshake is a valid Delta's (type 1, a size of whole
    words) of at most ``max_message_size`` bytes each and lying wholly before ``end``; stops
    before anything else (another type, a bad handshake, a partial message) and before a
    message that would take the run past ``max_bytes`` (the first is always taken).  Nothing
    is raised for what stops the run: the caller's stream decoder reports it.  ``stop`` is
    where the run ends (``pos`` if there is none), ``count`` how many messages it holds.
    ``IndexError`` unless ``0 <= pos <= end <= len(buf)``.
    """
    view = _bytes_view(buf)
    if not 0 <= end <= len(view):
        raise _checks.position_error(end, len(view))
    if not 0 <= pos <= end:
        raise _checks.position_error(pos, end)
    start, count = pos, 0
    while end - pos >= HANDSHAKE_SIZE:
        kind = int.from_bytes(view[pos : pos + 4], "big", signed=True)
        size = int.from_bytes(view[pos + 4 : pos + 8], "big", signed=True)
        stop = pos + HANDSHAKE_SIZE + size
        if (
            kind != MessageType.DELTA
            or size < 0
            or size % 4
            or HANDSHAKE_SIZE + size > max_message_size
            or stop > end
            or (count and stop - start > max_bytes)
        ):
            break
        pos = stop
        count += 1
    return pos, count


def decode_prefix(buf: Buffer, pos: int = 0) -> tuple[Message, int]:
    """Decode the message that starts at ``pos``; return it and the offset just past it."""
    view = _bytes_view(buf)
    kind, size = check_handshake(view, pos)  # IndexError for a pos outside the buffer
    start = pos + HANDSHAKE_SIZE
    end = start + size
    if end > len(view):
        raise _fail(
            "payload",
            len(view),
            f"truncated: handshake announces {size} bytes, {len(view) - start} present",
        )
    payload = view[start:end]
    if kind == MessageType.NODE_INDEX:
        p = spec.NODE_INDEX.parse(bytes(payload))
        if p.node_count < 1:
            raise _fail("node_count", start + 4, f"must be >= 1, got {p.node_count}")
        if not 0 <= p.node_id < p.node_count:
            raise _fail("node_id", start, f"must be in 0..{p.node_count - 1}, got {p.node_id}")
        return NodeIndex(p.node_id, p.node_count), end
    if kind == MessageType.DELTA:
        return Delta(from_wire(payload)), end
    if kind == MessageType.RUNTIME:
        r = spec.RUNTIME.parse(bytes(payload))
        msg = Runtime(
            r.sample_count, r.decompression_ms, r.training_ms, r.compression_ms, r.loss_milli
        )
        return msg, end
    return Finished(), end


def decode(buf: Buffer) -> Message:
    """Decode exactly one complete message; trailing bytes are an error."""
    msg, end = decode_prefix(buf, 0)
    size = _bytes_view(buf).nbytes
    if end != size:
        raise _fail("message", end, f"{size - end} bytes after the end of the message")
    return msg


def _i32(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise EncodeError(PROTOCOL, field, f"expected an int, got {type(value).__name__}")
    if not I32_MIN <= value <= I32_MAX:
        raise EncodeError(PROTOCOL, field, f"{value} is out of range {I32_MIN}..{I32_MAX}")
    return value


def to_container(msg: Message) -> dict[str, Any]:
    """Validate ``msg`` and map it onto ``spec.MESSAGE``'s fields (encode and the tests)."""
    if isinstance(msg, NodeIndex):
        node_id = _i32(msg.node_id, "node_id")
        count = _i32(msg.node_count, "node_count")
        if count < 1:
            raise EncodeError(PROTOCOL, "node_count", f"must be >= 1, got {count}")
        if not 0 <= node_id < count:
            raise EncodeError(PROTOCOL, "node_id", f"must be in 0..{count - 1}, got {node_id}")
        return dict(type=0, payload=dict(node_id=node_id, node_count=count))
    if isinstance(msg, Delta):
        words = _delta_words(msg.words)
        fields = [
            dict(param=w >> PARAM_SHIFT, index=w >> 1 & MAX_INDEX, positive=bool(w & 1))
            for w in words.tolist()
        ]
        return dict(type=1, payload=dict(words=fields))
    if isinstance(msg, Runtime):
        payload = dict(
            sample_count=_i32(msg.sample_count, "sample_count"),
            decompression_ms=_i32(msg.decompression_ms, "decompression_ms"),
            training_ms=_i32(msg.training_ms, "training_ms"),
            compression_ms=_i32(msg.compression_ms, "compression_ms"),
            loss_milli=None if msg.loss_milli is None else _i32(msg.loss_milli, "loss_milli"),
        )
        return dict(type=2, payload=payload)
    if isinstance(msg, Finished):
        return dict(type=3, payload={})
    raise EncodeError(PROTOCOL, "message", f"not a y2 message: {type(msg).__name__}")


def from_container(c: Container) -> Message:
    """Map a container parsed by ``spec.MESSAGE`` back to a message (test oracle)."""
    p = c.payload
    if c.type == MessageType.NODE_INDEX:
        return NodeIndex(p.node_id, p.node_count)
    if c.type == MessageType.DELTA:
        return Delta(
            np.array(
                [(w.param << PARAM_SHIFT) | (w.index << 1) | w.positive for w in p.words],
                dtype=np.uint32,
            )
        )
    if c.type == MessageType.RUNTIME:
        return Runtime(
            p.sample_count, p.decompression_ms, p.training_ms, p.compression_ms, p.loss_milli
        )
    return Finished()


def _delta_words(words: Any) -> np.ndarray:
    arr = _checks.word_array(words)
    if len(arr) > MAX_DELTA_WORDS:
        raise EncodeError(PROTOCOL, "words", f"{len(arr)} words do not fit an i32 payload size")
    return arr


def encode(msg: Message) -> bytes:
    """Encode one message (handshake and payload) to bytes."""
    if isinstance(msg, Delta):  # a construct list of 4-byte BitStructs would be very slow
        words = _delta_words(msg.words)
        head = spec.HANDSHAKE.build(dict(type=1, size=4 * len(words)))
        return head + words.astype(">u4").tobytes()
    return spec.MESSAGE.build(to_container(msg))


# --- kernels (the NumPy reference) ----------------------------------------------------------


def pack(
    layer: Any, is_weight: Any, index: Any, positive: Any, *, threads: int | None = None
) -> np.ndarray:
    """Four equal-length integer arrays -> native uint32 delta words.

    The word of ``(layer, is_weight, index, positive)`` addresses y2's parameter ``2 ×
    layer`` (a weight) or ``2 × layer + 1`` (a bias); ``positive`` 1 is +tau, 0 is -tau.
    An out-of-range value raises :class:`EncodeError` naming the first bad position (and,
    there, the first bad field in the order layer, is_weight, index, positive).  ``threads``
    is accepted for signature parity with the Cython twin.
    """
    arrays = _checks.pack_arrays(layer, is_weight, index, positive)
    _checks.threads_value(threads)
    _checks.check_pack_values(arrays)
    lay, wgt, idx, pos = (a.astype(np.uint32) for a in arrays)
    return (lay << LAYER_SHIFT) | ((wgt ^ 1) << BIAS_SHIFT) | (idx << 1) | pos


def unpack(
    words: Any, *, out: Any = None, threads: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Delta words -> ``(layer uint16, is_weight bool, index uint32, positive uint8)``.

    ``out``: four arrays to write into (and return) instead of new ones; each 1-D,
    contiguous, writeable, of the words' length and exactly those dtypes, sharing no memory
    with the words or with one another.  ``threads`` is accepted for signature parity with
    the Cython twin.
    """
    raw = _checks.word_array(words)
    _checks.threads_value(threads)
    if out is None:
        n = len(raw)
        out = (
            np.empty(n, np.uint16),
            np.empty(n, np.bool_),
            np.empty(n, np.uint32),
            np.empty(n, np.uint8),
        )
    else:
        out = _checks.unpack_out(out, raw)
    w = raw if raw.dtype.isnative else raw.astype(np.uint32)
    layer, is_weight, index, positive = out
    # ufuncs writing straight into the results: no temporaries (faster than astype chains)
    np.right_shift(w, LAYER_SHIFT, out=layer, casting="unsafe")
    flag = is_weight.view(np.uint8)
    np.right_shift(w, BIAS_SHIFT, out=flag, casting="unsafe")  # the low 8 bits of param
    np.bitwise_and(flag, 1, out=flag)
    np.bitwise_xor(flag, 1, out=flag)  # an even param is a weight
    np.right_shift(w, 1, out=index)
    np.bitwise_and(index, MAX_INDEX, out=index)
    np.bitwise_and(w, 1, out=positive, casting="unsafe")
    return layer, is_weight, index, positive


def to_wire(words: Any) -> bytes:
    """Delta words -> their big-endian bytes (a Delta message's payload)."""
    return _checks.word_array(words).astype(">u4", copy=False).tobytes()


def from_wire(buf: Buffer, *, copy: bool = True) -> np.ndarray:
    """Big-endian bytes -> delta words.

    ``copy=True``: a new native-order uint32 array.  ``copy=False``: a zero-copy ``>u4``
    view of ``buf`` (read-only if ``buf`` is); every kernel accepts it as is.
    """
    view = _bytes_view(buf)
    if len(view) % 4:
        raise _checks.wire_size_error(len(view))
    arr = np.frombuffer(view, dtype=">u4")
    return arr.astype(np.uint32) if copy else arr


def flat_target(arr: np.ndarray) -> tuple[np.ndarray, bool]:
    """A 1-D array sharing ``arr``'s memory, or a contiguous copy (then True: write it back).

    A 1-D array whose elements overlap one another (a stride shorter than an element, e.g.
    0) is copied too: the kernels then see distinct elements, and the write-back leaves in
    each memory location the value of the last element stored there.  Both twins use this.
    """
    if arr.ndim == 1 and (arr.size < 2 or abs(arr.strides[0]) >= arr.itemsize):
        return arr, False
    if arr.flags.c_contiguous:
        return arr.reshape(-1), False
    return np.ascontiguousarray(arr).reshape(-1), True


def apply_array(arr: np.ndarray, index: np.ndarray, positive: np.ndarray, tau: float) -> None:
    """``arr.flat[index[k]] += +tau if positive[k] else -tau`` for each k, in order.

    Each addition is done in ``arr``'s dtype with tau rounded to that dtype first.
    """
    t = arr.dtype.type(tau)
    flat, copied = flat_target(arr)
    np.add.at(flat, index, np.where(positive, t, -t).astype(arr.dtype))
    if copied:
        arr[...] = flat.reshape(arr.shape)


def apply(params: Any, words: Any, tau: float) -> None:
    """Add +tau or -tau to the parameter each word addresses, in place.

    ``params`` is a sequence of (weights, biases) float arrays per layer, indexed flat in C
    order.  Every word is checked against the actual shapes first: a word addressing a
    missing layer or an index past its array raises :class:`DecodeError` (field
    ``words[i]``, offset ``4 * i``) and no parameter changes; so does a tau that is not a
    finite positive number in some array's dtype (:class:`EncodeError`, field ``tau``).
    A word's top 10 bits are y2's parameter index ``p``: layer ``p >> 1``'s weights for an
    even ``p``, its biases for an odd one (see :func:`parameter_pairs`).  The arrays are
    updated one after another in the order of ``p``, each written back before the next is
    read, so arrays sharing memory (tied weights, views) receive every update.  Only layers
    0..511 can be addressed; a longer model is accepted and its further layers are left
    alone.
    """
    layers = _checks.model(params, "params")
    tau = _checks.tau_value(tau)
    _checks.check_tau_fits(layers, tau, "params")
    w = _checks.native_words(words)
    if not len(w):
        return
    key = (w >> PARAM_SHIFT).astype(np.int64)  # y2's parameter index: 2 * layer + is_bias
    index = ((w >> 1) & MAX_INDEX).astype(np.int64)
    table = _checks.size_table(layers)
    bad = index >= table[key]
    if bad.any():
        i = int(np.argmax(bad))
        raise _checks.bad_word(i, int(w[i]), layers)
    positive = (w & 1).astype(bool)
    for k in np.unique(key).tolist():
        sel = key == k
        apply_array(layers[k >> 1][k & 1], index[sel], positive[sel], tau)


def compress_array(arr: np.ndarray, base: int, tau: float, rest: float = 0.0) -> np.ndarray:
    """Threshold-quantize one residual array in place; its words (``base``: the param bits).

    With ``rest``, each quantized element then moves toward zero by ``rest`` too (rounded
    to the dtype: ``apply`` of the flipped words by ``rest``)."""
    t = arr.dtype.type(tau)
    flat, copied = flat_target(arr)
    hit = np.flatnonzero((flat >= t) | (flat <= -t))
    positive = flat[hit] > 0
    flat[hit] -= np.where(positive, t, -t).astype(arr.dtype)
    if rest:
        r = arr.dtype.type(rest)
        flat[hit] += np.where(positive, -r, r).astype(arr.dtype)
    if copied:
        arr[...] = flat.reshape(arr.shape)
    return np.uint32(base) | (hit.astype(np.uint32) << 1) | positive.astype(np.uint32)


def compress(residuals: Any, tau: float, *, threads: int | None = None) -> np.ndarray:
    """1-bit threshold quantization of a model's residuals, in place.

    For every element with ``|r| >= tau`` a word is emitted and ``r`` moves toward zero by
    tau (``r - tau`` if positive, word bit 0 set: +tau; ``r + tau`` if negative, bit 0
    clear: -tau), as y2's trainer does.  Words are ordered by y2's parameter index (layer,
    weights before biases), index ascending: ascending words.  ``threads`` is accepted for
    signature parity with the Cython twin (whose output does not depend on it).
    """
    layers = _checks.model(residuals, "residuals")
    tau = _checks.tau_value(tau)
    _checks.threads_value(threads)
    _checks.check_compressible(layers, tau)
    return _compress_layers(layers, tau, 0.0)


def _compress_layers(
    layers: list[tuple[np.ndarray, np.ndarray]], tau: float, rest: float
) -> np.ndarray:
    """:func:`compress`'s words, each array at ``tau`` then moved by ``rest`` (checked)."""
    parts = [np.zeros(0, dtype=np.uint32)]
    for k, (weights, biases) in enumerate(layers):
        parts.append(compress_array(weights, (2 * k) << PARAM_SHIFT, tau, rest))
        parts.append(compress_array(biases, (2 * k + 1) << PARAM_SHIFT, tau, rest))
    return np.concatenate(parts)


def compress_with_rest(
    residuals: Any, threshold: float, rest: float, *, threads: int | None = None
) -> np.ndarray:
    """:func:`compress` at ``threshold`` with each quantized element then moved toward
    zero by ``rest`` as well (rounded to its dtype; a rest that rounds to 0 moves nothing):
    the same residuals and words as ``words = compress(residuals, threshold)`` followed by
    ``apply(residuals, words ^ 1, rest)``, in one pass (the DDP hook's words move by
    ``tau = threshold + rest``).  :class:`EncodeError` (field ``rest``) for a rest that is
    negative, not finite, or not finite in some array's dtype, before anything changes."""
    layers = _checks.model(residuals, "residuals")
    threshold = _checks.tau_value(threshold)
    _checks.threads_value(threads)
    _checks.check_compressible(layers, threshold)
    rest = _checks.rest_value(rest, layers)
    return _compress_layers(layers, threshold, rest)


def accumulate(
    residuals: Any,
    gradients: Any,
    every: int,
    velocity: Any = None,
    momentum: float = 0.0,
) -> np.ndarray:
    """A step's gradients into the residuals, in place, and the tau sample: ``|r|`` of
    every ``every``-th element of each non-empty array, in the model's order (layer,
    weights then biases), each array from its first element (``every=0``: no sample, an
    empty array).  With ``velocity`` (momentum correction), each array's velocity first
    (``u = momentum × u + g``, in its dtype) and ``r += u``.  The models are laid out
    alike (:func:`wirekit.y2._checks.accumulation`); the DDP hook's first pass over a
    bucket."""
    layers, grads, speeds, every, rate = _checks.accumulation(
        residuals, gradients, every, velocity, momentum
    )
    for k, (pair, gpair) in enumerate(zip(layers, grads, strict=True)):
        for res, grad, j in zip(pair, gpair, (0, 1), strict=True):
            if speeds is not None:
                speed = speeds[k][j]
                speed *= speed.dtype.type(rate)
                speed += grad
                grad = speed
            res += grad
    return tau_sample(layers, every)


def tau_sample(layers: list[tuple[np.ndarray, np.ndarray]], every: int) -> np.ndarray:
    """The adaptive tau's sample of a model: ``|r|`` of every ``every``-th element of each
    non-empty array, in the model's order (layer, weights then biases), each array from
    its first element; an empty array for ``every=0`` or an empty model."""
    flat = [a for pair in layers for a in pair if a.size]
    if not every or not flat:
        return np.zeros(0, layers[0][0].dtype if layers else np.float64)
    return np.abs(np.concatenate([a.reshape(-1)[::every] for a in flat]))


# --- the DDP hook's sum blocks (wirekit.y2.sums): bitmap and packed codes ----------------


def bitmap_positions(bitmap: Any, size: int) -> np.ndarray:
    """The positions (int64, ascending) of the set bits among the first ``size`` bits of
    ``bitmap`` (uint8, least significant bit of each byte first; at least
    ``ceil(size / 8)`` bytes)."""
    bits = np.ascontiguousarray(bitmap, dtype=np.uint8)
    nbytes = (size + 7) // 8
    if bits.size < nbytes:
        raise ValueError(f"{bits.size} bytes hold fewer than {size} bits")
    marks = np.unpackbits(bits[:nbytes], count=size, bitorder="little")
    return np.flatnonzero(marks).astype(np.int64)


def read_fields(data: Any, lead: int, count: int, width: int) -> np.ndarray:
    """``count`` unsigned fields of ``width`` bits (1 to 56) from bit ``lead`` of ``data``
    on (uint8, least significant bit of each byte first), as int64."""
    d = np.ascontiguousarray(data, dtype=np.uint8)
    if not 1 <= width <= 56:
        raise ValueError(f"fields of {width} bits: 1 to 56 only")
    if lead < 0 or count < 0 or (lead + count * width + 7) // 8 > d.size:
        raise ValueError(f"{count} fields of {width} bits from bit {lead} beyond the data")
    offsets = lead + np.arange(count, dtype=np.int64) * width
    if width > 25:  # wider than a 4-byte window holds at every shift: bit by bit
        bits = np.unpackbits(d, bitorder="little")
        at = offsets[:, None] + np.arange(width, dtype=np.int64)
        weights = np.left_shift(np.int64(1), np.arange(width, dtype=np.int64))
        return np.asarray(bits[at].astype(np.int64) @ weights, np.int64)
    padded = np.zeros(d.size + 4, np.int64)
    padded[: d.size] = d
    byte = offsets >> 3
    window = padded[byte] | padded[byte + 1] << 8 | padded[byte + 2] << 16 | padded[byte + 3] << 24
    return np.asarray((window >> (offsets & 7)) & ((1 << width) - 1), np.int64)


# --- the DDP hook's owner of a range: words summed and coded; a sums block into the update --


def word_positions(words: Any, slot_start: Any, slot_size: Any, field: str) -> np.ndarray:
    """Where in a bucket's buffer each word's element is (int64): ``slot_start[p] + index``
    for a word of parameter ``p`` (its top 10 bits), when ``index < slot_size[p]``.

    :class:`DecodeError` (``field[i]``, byte ``4 i``) for the first word that addresses no
    element of the bucket.
    """
    w = np.asarray(words, np.uint32)
    starts = np.asarray(slot_start, np.int64)
    sizes = np.asarray(slot_size, np.int64)
    if starts.size != sizes.size:
        raise ValueError(f"{PROTOCOL}: {starts.size} slot starts for {sizes.size} slot sizes")
    slot = (w >> PARAM_SHIFT).astype(np.int64)
    index = ((w >> 1) & MAX_INDEX).astype(np.int64)
    inside = slot < sizes.size
    inside[inside] = index[inside] < sizes[slot[inside]]
    if not inside.all():
        i = int(np.argmin(inside))
        raise _checks.unaddressed_word(field, i, int(w[i]))
    return starts[slot] + index


def sum_range(
    received: Any,
    weights: Any,
    slot_start: Any,
    slot_size: Any,
    lo: int,
    hi: int,
    table: Any,
    unit: float,
    most: int = -1,
    scratch: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The owner of the buffer's range ``lo:hi`` sums every rank's words there and codes
    the sums: ``(block, left_at, left, wanted)``.  ``scratch`` (the Cython twin's
    accumulator, float64 zeros it leaves zeros) is not needed here.

    ``received[r]``: rank ``r``'s words (one per element, in buffer order, inside the
    range; checked, :class:`DecodeError` ``rank[r].words[i]``), each ``±weights[r]`` (its
    tau in units of ``unit``); ``slot_start``/``slot_size``: the bucket's layout
    (:func:`word_positions`).  Each nonzero sum is coded as the nearest magnitude of
    ``table`` (``wirekit.y2.sums.quantize``), at most ``most`` of them (``-1``: all; past it
    the smallest wait, ties in element order), and ``block`` is
    ``wirekit.y2.sums.encode_sparse`` of those codes.  ``left``: what the codes do not say
    (times ``unit``) at the buffer positions ``left_at`` (ascending), for the residual;
    ``wanted``: the count of nonzero codes before ``most``.
    """
    from .sums import encode_sparse, quantize, values  # sums imports this module

    received = list(received)
    weight = np.asarray(weights, np.float64)
    starts = np.asarray(slot_start, np.int64)
    sizes = np.asarray(slot_size, np.int64)
    magnitudes = np.asarray(table, np.float64)
    _checks.sum_range_args(len(received), weight.size, starts.size, sizes.size, lo, hi)
    _checks.table_args(magnitudes.size)
    total = np.zeros(hi - lo, np.float64)
    for r, rank_words in enumerate(received):
        words = np.asarray(rank_words, np.uint32)
        where = word_positions(words, starts, sizes, f"rank[{r}].words")
        bad = (where < lo) | (where >= hi)
        bad[1:] |= where[1:] <= where[:-1]
        if bad.any():
            i = int(np.argmax(bad))
            raise _checks.word_out_of_order(r, i, int(where[i]), lo, hi)
        # one word per element and rank: a plain indexed add, in rank order
        total[where - lo] += np.where(words & 1, 1.0, -1.0) * weight[r]
    nonzero = np.flatnonzero(total)
    sums = total[nonzero]
    codes = quantize(sums, magnitudes)
    marked = np.flatnonzero(codes)
    if 0 <= most < marked.size:  # beyond the block: the smallest wait
        smallest = np.argsort(np.abs(sums[marked]), kind="stable")[: marked.size - most]
        codes[marked[smallest]] = 0
    left = sums - values(codes, magnitudes)
    off = np.flatnonzero(left)
    sent = codes != 0
    block = encode_sparse(nonzero[sent], codes[sent], hi - lo, magnitudes.size)
    return block, lo + nonzero[off], left[off] * unit, int(marked.size)


def sums_into(
    out: np.ndarray,
    start: int,
    block: Any,
    size: int,
    count: int,
    table: Any,
    scale: float,
    field: str,
    zero_rest: bool = False,
) -> None:
    """Write the sums of a block of ``size`` elements into ``out[start:start + size]``:
    each nonzero code's magnitude of ``table`` times ``scale``, where the bitmap marks it
    (the other elements are left alone, or set to 0 with ``zero_rest``).

    ``count``: the block's count of nonzero codes, its header already checked against the
    block's length (``wirekit.y2.sums.decode_into``).  Everything is checked before
    anything is written: :class:`DecodeError` (``field``) for a bitmap that does not mark
    ``count`` sums or a code beyond the table; ValueError for elements beyond ``out``.
    """
    magnitudes = np.asarray(table, np.float64)
    levels = magnitudes.size
    _checks.table_args(levels)
    _checks.update_span(start, size, out.shape[0])
    width = _checks.code_bits(levels)
    data = np.asarray(block, np.uint8)
    head = _checks.SUMS_HEADER
    if data.size < head + (size + count * width + 7) // 8:
        raise ValueError(f"{PROTOCOL}: {data.size} bytes hold no block of {count} sums")
    positions = bitmap_positions(data[head : head + (size + 7) // 8], size)
    if positions.size != count:
        raise _checks.bitmap_count_error(field, positions.size, count)
    first = head + size // 8
    coded = read_fields(data[first:], size % 8, count, width)
    if coded.size and int(coded.max()) >= 2 * levels:
        at = int(np.argmax(coded >= 2 * levels))
        offset = head + (size + at * width) // 8
        raise _checks.code_beyond_error(field, offset, int(coded[at]), levels)
    codes = np.where(coded < levels, coded - levels, coded - levels + 1)
    padded = np.concatenate([[0.0], magnitudes])
    if zero_rest:
        out[start : start + size] = 0
    out[start + positions] = np.sign(codes) * padded[np.abs(codes)] * scale
