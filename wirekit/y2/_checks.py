"""Argument checks and error texts shared by both y2 twins.

The Cython kernels and the NumPy reference both call these, so a bad argument gives the same
exception with the same text from either.  Value checks that scan whole arrays are done by
each twin itself (fast in C, vectorized in NumPy); only the message for the position they
find is built here.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np

from wirekit.errors import DecodeError, EncodeError

from .messages import (
    MAX_ARRAY_SIZE,
    MAX_INDEX,
    MAX_LAYER,
    MAX_LAYERS,
    PARAM_SHIFT,
    PROTOCOL,
    U32_MAX,
)

#: The four word fields in the order pack() checks them, with their largest value.
PACK_FIELDS = (("layer", MAX_LAYER), ("is_weight", 1), ("index", MAX_INDEX), ("positive", 1))


def int_array(value: Any, field: str, *, keep_order: bool = False) -> np.ndarray:
    """``value`` as a 1-D integer array (bools become uint8, no copy where possible).

    Byte-swapped arrays become native unless ``keep_order``.
    """
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise EncodeError(PROTOCOL, field, f"not an array of integers ({exc})") from None
    if arr.ndim != 1:
        raise EncodeError(PROTOCOL, field, f"expected a 1-D array, got {arr.ndim} dimensions")
    if arr.dtype == np.bool_:
        return arr.view(np.uint8)
    if arr.dtype.kind not in "iu":
        if arr.size == 0 and arr.dtype.kind == "f":  # np.asarray([]) is float64
            return arr.astype(np.uint8)
        raise EncodeError(PROTOCOL, field, f"expected integers, got dtype {arr.dtype}")
    if not (keep_order or arr.dtype.isnative):
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def pack_arrays(layer: Any, is_weight: Any, index: Any, positive: Any) -> list[np.ndarray]:
    """The four pack() inputs as 1-D integer arrays of one length."""
    values = (layer, is_weight, index, positive)
    arrays = [
        int_array(value, name) for value, (name, _top) in zip(values, PACK_FIELDS, strict=True)
    ]
    n = len(arrays[0])
    for arr, (name, _top) in zip(arrays, PACK_FIELDS, strict=True):
        if len(arr) != n:
            raise EncodeError(PROTOCOL, name, f"length {len(arr)}, but layer has length {n}")
    return arrays


def check_pack_values(arrays: list[np.ndarray]) -> None:
    """Raise the EncodeError of the first position holding an out-of-range value, if any."""
    n = len(arrays[0])
    if not n:
        return
    bad = np.zeros(n, dtype=bool)
    for arr, (_name, top) in zip(arrays, PACK_FIELDS, strict=True):
        bad |= (arr < 0) | (arr > top)
    if bad.any():
        raise pack_error(arrays, int(np.argmax(bad)))


def pack_error(arrays: list[np.ndarray], i: int) -> EncodeError:
    """The error for position ``i``, the first one holding an out-of-range value."""
    for arr, (name, top) in zip(arrays, PACK_FIELDS, strict=True):
        value = int(arr[i])
        if not 0 <= value <= top:
            return EncodeError(PROTOCOL, f"{name}[{i}]", f"{value} is out of range 0..{top}")
    raise AssertionError(f"position {i} holds no out-of-range value")  # pragma: no cover


def word_array(words: Any, field: str = "words") -> np.ndarray:
    """``words`` as a 1-D uint32 array; native or big-endian order, no copy when already so.

    Other integer dtypes are accepted when every value fits 0..2**32-1 (then copied).
    """
    arr = int_array(words, field, keep_order=True)
    if arr.dtype.itemsize == 4 and arr.dtype.kind == "u":
        return arr
    if arr.size and (arr.dtype.kind == "i" or arr.dtype.itemsize > 4):
        bad = (arr < 0) | (arr > U32_MAX)
        if bad.any():
            i = int(np.argmax(bad))
            raise EncodeError(
                PROTOCOL, f"{field}[{i}]", f"{int(arr[i])} is out of range 0..{U32_MAX}"
            )
    return arr.astype(np.uint32)


def native_words(words: Any, field: str = "words") -> np.ndarray:
    """``words`` as a native-order uint32 array (a copy only if it was big-endian)."""
    arr = word_array(words, field)
    if not arr.dtype.isnative:
        return arr.astype(np.uint32)
    return arr


#: unpack's four results: name and dtype.
UNPACK_FIELDS = (
    ("layer", np.dtype(np.uint16)),
    ("is_weight", np.dtype(np.bool_)),
    ("index", np.dtype(np.uint32)),
    ("positive", np.dtype(np.uint8)),
)


def unpack_out(out: Any, words: np.ndarray) -> tuple[np.ndarray, ...]:
    """Validate unpack's ``out`` for ``words`` (the array actually read): four writeable,
    contiguous 1-D arrays of the words' length with the result dtypes, sharing no memory
    with the words or with one another."""
    try:
        arrays = tuple(out)
    except TypeError:
        raise TypeError(
            f"{PROTOCOL}: out must be a sequence of 4 arrays, got {type(out).__name__}"
        ) from None
    if len(arrays) != 4:
        raise TypeError(
            f"{PROTOCOL}: out must hold 4 arrays (layer, is_weight, index, positive), "
            f"got {len(arrays)}"
        )
    n = len(words)
    for given, (name, dtype) in zip(arrays, UNPACK_FIELDS, strict=True):
        arr = plain_array(given)
        if arr is None:
            raise TypeError(
                f"{PROTOCOL}: out {name} must be a numpy array, got {type(given).__name__}"
            )
        if arr.dtype != dtype:
            raise TypeError(f"{PROTOCOL}: out {name} must have dtype {dtype}, got {arr.dtype}")
        if arr.shape != (n,):
            raise ValueError(f"{PROTOCOL}: out {name} must have shape ({n},), got {arr.shape}")
        if not arr.flags.c_contiguous:
            raise ValueError(f"{PROTOCOL}: out {name} must be contiguous")
        if not arr.flags.writeable:
            raise ValueError(f"{PROTOCOL}: out {name} is read-only")
    plain = [plain_array(arr) for arr in arrays]
    for k, (arr, (name, _dtype)) in enumerate(zip(plain, UNPACK_FIELDS, strict=True)):
        if np.shares_memory(arr, words):
            raise ValueError(f"{PROTOCOL}: out {name} shares memory with the words")
        later = zip(plain[k + 1 :], UNPACK_FIELDS[k + 1 :], strict=True)
        for other, (other_name, _dtype) in later:
            if np.shares_memory(arr, other):
                raise ValueError(f"{PROTOCOL}: out {name} shares memory with out {other_name}")
    return arrays


def plain_array(value: Any) -> np.ndarray | None:
    """A plain ``np.ndarray`` over the memory of ``value`` if it is a NumPy array (of any
    subclass), else None.

    Checks and kernels read shape, dtype, strides and flags from this view, never from the
    subclass: an override (``size``, ``shape``, ``reshape``, ``np.matrix``'s 2-D rows) cannot
    make them address memory outside the array.
    """
    if not issubclass(type(value), np.ndarray):  # not isinstance: __class__ can be faked
        return None
    if type(value) is np.ndarray:
        return value
    return np.asarray(value)  # C-level view: no method of the subclass is called


def position_error(pos: int, size: int) -> IndexError:
    """Raised by ``check_handshake`` and ``decode_prefix`` for a ``pos`` outside the buffer."""
    return IndexError(f"position {pos} outside a buffer of {size} bytes")


def wire_size_error(nbytes: int) -> DecodeError:
    """Raised by ``from_wire`` when the bytes are not whole words."""
    return DecodeError(
        PROTOCOL,
        "words",
        nbytes - nbytes % 4,
        f"{nbytes} bytes is not a whole number of 4-byte words",
    )


def model(params: Any, what: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """``params`` as a list of (weights, biases) pairs of writeable float arrays.

    Arrays of NumPy subclasses become plain arrays over the same memory (see
    :func:`plain_array`), so updates in place still reach the caller's arrays.
    """
    try:
        layers = list(params)
    except TypeError:
        raise TypeError(
            f"{PROTOCOL}: {what} must be a sequence of (weights, biases) pairs, "
            f"got {type(params).__name__}"
        ) from None
    out = []
    for k, pair in enumerate(layers):
        try:
            weights, biases = pair
        except (TypeError, ValueError):
            raise TypeError(f"{PROTOCOL}: {what}[{k}] must be a (weights, biases) pair") from None
        plain = []
        for name, given in (("weights", weights), ("biases", biases)):
            arr = plain_array(given)
            if arr is None or arr.dtype.kind != "f":
                got = type(given).__name__ if arr is None else arr.dtype
                raise TypeError(
                    f"{PROTOCOL}: {what}[{k}].{name} must be a floating-point numpy array, "
                    f"got {got}"
                )
            if not arr.flags.writeable:
                raise ValueError(f"{PROTOCOL}: {what}[{k}].{name} is read-only")
            plain.append(arr)
        out.append((plain[0], plain[1]))
    return out


def tau_value(tau: Any) -> float:
    """``tau`` as a Python float; it must be finite and > 0."""
    try:
        value = float(tau)
    except (TypeError, ValueError):
        raise EncodeError(PROTOCOL, "tau", f"expected a number, got {type(tau).__name__}") from None
    if not (math.isfinite(value) and value > 0):
        raise EncodeError(PROTOCOL, "tau", f"must be finite and > 0, got {value!r}")
    return value


def check_compressible(layers: list[tuple[np.ndarray, np.ndarray]], tau: float) -> None:
    """Every element of every residual array must be addressable by a word; tau representable."""
    if len(layers) > MAX_LAYERS:
        raise EncodeError(
            PROTOCOL,
            "residuals",
            f"{len(layers)} layers, but a word addresses at most {MAX_LAYERS}",
        )
    for k, pair in enumerate(layers):
        for name, arr in zip(("weights", "biases"), pair, strict=True):
            if arr.size > MAX_ARRAY_SIZE:
                raise EncodeError(
                    PROTOCOL,
                    f"residuals[{k}].{name}",
                    f"{arr.size} elements, but a word addresses at most {MAX_ARRAY_SIZE}",
                )
    check_tau_fits(layers, tau, "residuals")


def check_tau_fits(layers: list[tuple[np.ndarray, np.ndarray]], tau: float, what: str) -> None:
    """tau rounded to each array's dtype must stay finite and > 0 (not inf, not 0)."""
    representable: dict[np.dtype, bool] = {}
    for k, pair in enumerate(layers):
        for name, arr in zip(("weights", "biases"), pair, strict=True):
            ok = representable.get(arr.dtype)
            if ok is None:
                with np.errstate(over="ignore", under="ignore"):  # inf or 0: not representable
                    t = arr.dtype.type(tau)
                ok = representable[arr.dtype] = bool(np.isfinite(t) and t > 0)
            if not ok:
                raise EncodeError(
                    PROTOCOL,
                    "tau",
                    f"{tau!r} is not a finite positive {arr.dtype} ({what}[{k}].{name})",
                )


def threads_value(threads: Any) -> int | None:
    """``threads`` as an int >= 1, or None (automatic)."""
    if threads is None:
        return None
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"{PROTOCOL}: threads must be an int >= 1 or None, got {threads!r}")
    return threads


def affinity_cores() -> int:
    """How many cores this process may run on (its CPU affinity; the CPU count elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


#: ``(when, value)`` of the last measured :func:`idle_cores` (the kernel updates the load
#: average every 5 s; the affinity rarely changes): measured again after ``IDLE_CORES_TTL`` s.
_idle: tuple[float, int] = (-math.inf, 1)
IDLE_CORES_TTL = 1.0


def default_threads() -> int:
    """The thread count a kernel uses with ``threads=None`` for work above its break-even
    size: :func:`idle_cores`, measured at most once per ``IDLE_CORES_TTL`` seconds (a
    measurement costs a few µs, a call on small work may not)."""
    global _idle
    now = time.monotonic()
    if now - _idle[0] >= IDLE_CORES_TTL:
        _idle = (now, idle_cores())
    return _idle[1]


def idle_cores(
    cores: int | None = None, total: int | None = None, load: float | None = None
) -> int:
    """The cores a kernel call may use by default: those it may run on that are not busy.

    ``cores`` defaults to :func:`affinity_cores`, ``total`` to the machine's CPU count and
    ``load`` to its one-minute load average (runnable threads, this one included).  Other
    work keeps about ``load - 1`` of the ``total`` cores busy; the rest, rounded down, are
    free.  The result is at most ``cores`` and at least 1.  On a machine whose cores are
    shared with other work a second thread waits for a core and makes a call slower than one
    thread, so the default then stays at one thread.
    """
    if cores is None:
        cores = affinity_cores()
    if total is None:
        total = os.cpu_count() or cores
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # pragma: no cover - no load average
            load = 0.0
    free = int(total - max(0.0, load - 1.0))
    return max(1, min(cores, free))


def bad_word(i: int, word: int, layers: list[tuple[np.ndarray, np.ndarray]]) -> DecodeError:
    """The error for delta word ``i`` (``word``), which does not address a parameter."""
    param = word >> PARAM_SHIFT
    layer, is_bias = param >> 1, param & 1
    index = (word >> 1) & MAX_INDEX
    if layer >= len(layers):
        text = (
            f"parameter {param} (layer {layer}) does not exist "
            f"(the model has {len(layers)} layers, parameters 0..{2 * len(layers) - 1})"
        )
    else:
        kind, plural = ("bias", "biases") if is_bias else ("weight", "weights")
        size = layers[layer][is_bias].size
        text = (
            f"{kind} index {index} is out of range for parameter {param} "
            f"(layer {layer}: {size} {plural if size != 1 else kind})"
        )
    return DecodeError(PROTOCOL, f"words[{i}]", 4 * i, f"0x{word:08x}: {text}")


def size_table(layers: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Element count per y2 parameter index (a word's top 10 bits): entry ``2 * layer`` for
    the weights, ``2 * layer + 1`` for the biases; 0 past the model."""
    table = np.zeros(2 * MAX_LAYERS, dtype=np.int64)
    for k, (weights, biases) in enumerate(layers[:MAX_LAYERS]):
        table[2 * k] = weights.size
        table[2 * k + 1] = biases.size
    return table


# --- the DDP hook's owner of a range and its sums blocks (wirekit.y2.sums) -----------------

#: Bytes before a sums block's bitmap: the count of nonzero codes (uint32, little-endian).
SUMS_HEADER = 4


def code_bits(levels: int) -> int:
    """Bits of one nonzero code for a table of ``levels`` magnitudes (``2 × levels`` codes)."""
    return max(1, (2 * levels - 1).bit_length())


def unaddressed_word(field: str, i: int, word: int) -> DecodeError:
    """The error for word ``i`` of ``field``, which addresses no element of the bucket."""
    return DecodeError(
        PROTOCOL, f"{field}[{i}]", 4 * i, f"word {word:#010x} addresses no element of this bucket"
    )


def word_out_of_order(rank: int, i: int, position: int, lo: int, hi: int) -> DecodeError:
    """The error for word ``i`` of ``rank``'s words for the range ``lo:hi``: its element
    ``position`` is outside the range or not after the previous word's."""
    return DecodeError(
        PROTOCOL,
        f"rank[{rank}].words[{i}]",
        4 * i,
        f"element {position} is not after the previous word's in range {lo}:{hi}",
    )


def bitmap_count_error(field: str, marked: int, count: int) -> DecodeError:
    """The error for a sums block whose bitmap marks ``marked`` sums, not its ``count``."""
    return DecodeError(PROTOCOL, field, SUMS_HEADER, f"the bitmap marks {marked} sums, not {count}")


def code_beyond_error(field: str, offset: int, code: int, levels: int) -> DecodeError:
    """The error for a sums block's code ``code`` (at byte ``offset``) beyond the table."""
    return DecodeError(
        PROTOCOL, field, offset, f"code {code} is beyond a table of {levels} magnitudes"
    )


def sum_range_args(count: int, weights: int, starts: int, sizes: int, lo: int, hi: int) -> None:
    """The shapes ``sum_range`` needs: a weight per rank's words, a start per slot size,
    ``0 <= lo <= hi``; ValueError otherwise."""
    if weights != count:
        raise ValueError(f"{PROTOCOL}: {weights} weights for the words of {count} ranks")
    if starts != sizes:
        raise ValueError(f"{PROTOCOL}: {starts} slot starts for {sizes} slot sizes")
    if not 0 <= lo <= hi:
        raise ValueError(f"{PROTOCOL}: range {lo}:{hi} is not a range of elements")


def table_args(levels: int) -> None:
    """A table of sum magnitudes the kernels code: 1 to 2^55 magnitudes (codes of at most
    56 bits); ValueError otherwise."""
    if not 1 <= levels <= 1 << 55:
        raise ValueError(f"{PROTOCOL}: a table of {levels} magnitudes, not 1 to 2**55")


def update_span(start: int, size: int, length: int) -> None:
    """The elements ``start:start + size`` a sums block writes must lie in an update of
    ``length``; ValueError otherwise."""
    if not (start >= 0 and size >= 0 and start + size <= length):
        raise ValueError(
            f"{PROTOCOL}: elements {start}:{start + size} are beyond an update of {length}"
        )


def rest_value(rest: Any, layers: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """``compress_with_rest``'s ``rest`` as a Python float: finite and >= 0, and finite in
    every array's dtype (it may round to 0 there: then it moves nothing)."""
    try:
        value = float(rest)
    except (TypeError, ValueError):
        raise EncodeError(
            PROTOCOL, "rest", f"expected a number, got {type(rest).__name__}"
        ) from None
    if not (math.isfinite(value) and value >= 0):
        raise EncodeError(PROTOCOL, "rest", f"must be finite and >= 0, got {value!r}")
    for k, pair in enumerate(layers):
        for name, arr in zip(("weights", "biases"), pair, strict=True):
            with np.errstate(over="ignore"):
                fits = bool(np.isfinite(arr.dtype.type(value)))
            if not fits:
                raise EncodeError(
                    PROTOCOL,
                    "rest",
                    f"{value!r} is not a finite {arr.dtype} (residuals[{k}].{name})",
                )
    return value


def accumulation(
    residuals: Any, gradients: Any, every: Any, velocity: Any, momentum: Any
) -> tuple[
    list[tuple[np.ndarray, np.ndarray]],
    list[tuple[np.ndarray, np.ndarray]],
    list[tuple[np.ndarray, np.ndarray]] | None,
    int,
    float,
]:
    """``accumulate``'s arguments checked: the models (``gradients`` and ``velocity`` laid
    out as ``residuals``: as many layers, each array as many elements of the same dtype),
    ``every`` an int >= 0, ``momentum`` a finite number."""
    layers = model(residuals, "residuals")
    others = [("gradients", model(gradients, "gradients"))]
    if velocity is not None:
        others.append(("velocity", model(velocity, "velocity")))
    for what, other in others:
        if len(other) != len(layers):
            raise ValueError(f"{PROTOCOL}: {what} has {len(other)} layers, residuals {len(layers)}")
        for k, (mine, theirs) in enumerate(zip(layers, other, strict=True)):
            for name, res, arr in zip(("weights", "biases"), mine, theirs, strict=True):
                if arr.shape != res.shape or arr.dtype != res.dtype:
                    raise ValueError(
                        f"{PROTOCOL}: {what}[{k}].{name} is {arr.dtype} {arr.shape}, "
                        f"residuals[{k}].{name} {res.dtype} {res.shape}"
                    )
    if not isinstance(every, int) or isinstance(every, bool) or every < 0:
        raise ValueError(f"{PROTOCOL}: every must be an int >= 0, got {every!r}")
    try:
        rate = float(momentum)
    except (TypeError, ValueError):
        raise TypeError(
            f"{PROTOCOL}: momentum must be a number, got {type(momentum).__name__}"
        ) from None
    if not math.isfinite(rate):
        raise ValueError(f"{PROTOCOL}: momentum must be finite, got {rate!r}")
    return layers, others[0][1], others[1][1] if velocity is not None else None, every, rate
