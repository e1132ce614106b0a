"""OIP tensors: the checks of a tensor's raw bytes, and the JSON ``data`` form of a tensor.

A tensor is held as its raw bytes (:mod:`wirekit.oip.messages`).  :func:`check_tensor` says
whether those bytes are what its datatype and shape announce; :func:`tensor_from_json` and
:func:`tensor_to_json_data` convert between them and the REST ``data`` array (flat, or nested
row-major as the OIP allows).  Every problem is a :class:`~wirekit.errors.DecodeError` of
protocol ``"oip"`` naming the tensor; nothing is allocated beyond the bytes present (a shape
claiming 10^12 elements with 8 bytes of data fails before any allocation).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from wirekit.errors import DecodeError, EncodeError

from .messages import DATATYPES, PROTOCOL, Buffer, Datatype, Tensor

_U32 = struct.Struct("<I")
INT64_MAX = 2**63 - 1
_INTEGERS = frozenset(f"{sign}INT{bits}" for sign in ("", "U") for bits in (8, 16, 32, 64))
#: each integer datatype's range
_LIMITS = {
    name: (int(np.iinfo(DATATYPES[name].numpy).min), int(np.iinfo(DATATYPES[name].numpy).max))
    for name in _INTEGERS
}


def _fail(field: str, offset: int, message: str) -> DecodeError:
    return DecodeError(PROTOCOL, field, offset, message)


def shape_text(shape: Any) -> str:
    """A shape as the error messages write it: ``[2, 3]``."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def element_count(shape: tuple[int, ...]) -> int:
    """The elements a shape holds (1 for ``()``); a Python int, so it never overflows."""
    count = 1
    for dim in shape:
        count *= dim
    return count


def datatype_of(name: str, datatype: Any, field: str) -> Datatype:
    """The :class:`Datatype` named ``datatype``; DecodeError naming the tensor otherwise."""
    found = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if found is None:
        raise _fail(f"{field}.datatype", 0, f'tensor "{name}": unknown datatype {datatype!r}')
    return found


def check_shape(name: str, shape: Any, field: str) -> tuple[int, ...]:
    """``shape`` as a tuple of ints >= 0; DecodeError naming the tensor otherwise."""
    if type(shape) is tuple or type(shape) is list:
        for dim in shape:  # the common case: plain ints in range, one pass
            if type(dim) is not int or dim < 0 or dim > INT64_MAX:
                break
        else:
            return tuple(shape)
    if not isinstance(shape, list | tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in shape
    ):
        raise _fail(f"{field}.shape", 0, f'tensor "{name}": shape must be a list of integers')
    for dim in shape:
        if dim > INT64_MAX:
            raise _fail(
                f"{field}.shape",
                0,
                f'tensor "{name}": dimension {dim} in shape {shape_text(shape)} exceeds 2**63-1',
            )
        if dim < 0:
            raise _fail(
                f"{field}.shape",
                0,
                f'tensor "{name}": negative dimension {dim} in shape {shape_text(shape)}',
            )
    return tuple(shape)


def bytes_elements(
    name: str, data: Buffer, count: int, field: str, base: int = 0
) -> Iterator[tuple[int, int]]:
    """Walk a BYTES tensor's framing (each element a u32-LE length, then its bytes): yield
    ``(start, end)`` of each of its ``count`` elements in ``data``.  A length running past the
    data, fewer elements than ``count`` or bytes after the last one: DecodeError naming the
    tensor (offsets are ``base`` + the position in ``data``).  The walk stops at the bytes
    present, so a huge ``count`` costs nothing."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    size = len(view)
    pos = 0
    for index in range(count):
        if size - pos < 4:
            raise _fail(
                f"{field}.data",
                base + pos,
                f'tensor "{name}": BYTES element {index} of {count}: '
                f"{size - pos} bytes left, need a 4-byte length",
            )
        (length,) = _U32.unpack_from(view, pos)
        pos += 4
        if length > size - pos:
            raise _fail(
                f"{field}.data",
                base + pos - 4,
                f'tensor "{name}": BYTES element {index} of {count}: '
                f"length {length} exceeds the {size - pos} bytes left",
            )
        yield pos, pos + length
        pos += length
    if pos != size:
        raise _fail(
            f"{field}.data",
            base + pos,
            f'tensor "{name}": {size - pos} bytes after the last of {count} BYTES elements',
        )


def check_tensor(t: Tensor, field: str | None = None, base: int = 0) -> None:
    """Check that ``t`` is a well-formed tensor: a known datatype, dimensions >= 0, and data
    of exactly the bytes its shape announces (BYTES: exactly that many well-framed elements).
    ``field`` names it in errors (default its name); ``base`` is added to data offsets (the
    tensor's position in the body it came in)."""
    where = t.name if field is None else field
    dtype = datatype_of(t.name, t.datatype, where)
    shape = check_shape(t.name, t.shape, where)
    count = element_count(shape)
    have = memoryview(t.data).nbytes
    if dtype.size:
        need = count * dtype.size
        if have != need:
            raise _fail(
                f"{where}.data",
                base,
                f'tensor "{t.name}": {have} bytes of data, shape {shape_text(shape)} of '
                f"{dtype.name} needs {need}",
            )
        return
    walk = _compiled_walk()
    if walk is not None and walk(t.data, count):
        return
    for _ in bytes_elements(t.name, t.data, count, where, base):
        pass  # the pure walk: the reference, and the one that names a problem


_WALK: list[Any] = []


def _compiled_walk() -> Any:
    """The compiled twin's BYTES framing check (``wirekit._fast.oip.bytes_framing_ok``), or
    None on the pure path; looked up once, at first use (the twin imports this module)."""
    if not _WALK:
        from wirekit._impl import load_fast

        fast = load_fast("oip")
        _WALK.append(None if fast is None else fast.bytes_framing_ok)
    return _WALK[0]


# --------------------------------------------------------------------------- JSON data


def _flatten_strings(name: str, data: Any, field: str, out: list[bytes], limit: int) -> None:
    if isinstance(data, list):
        for item in data:
            _flatten_strings(name, item, field, out, limit)
        return
    if not isinstance(data, str):
        raise _fail(
            f"{field}.data",
            0,
            f'tensor "{name}": BYTES data must be strings, got {type(data).__name__}',
        )
    if len(out) >= limit:
        raise _fail(f"{field}.data", 0, f'tensor "{name}": more than {limit} elements')
    out.append(data.encode("utf-8", "surrogatepass"))


def _count_mismatch(
    name: str, field: str, got: int, shape: tuple[int, ...], need: int
) -> DecodeError:
    return _fail(
        f"{field}.data",
        0,
        f'tensor "{name}": {got} elements of data, shape {shape_text(shape)} needs {need}',
    )


def _bf16_from_float(values: np.ndarray) -> bytes:
    """Round float values to bfloat16 (nearest, ties to even; beyond the range: infinity;
    NaN stays a quiet NaN)."""
    with np.errstate(over="ignore"):
        single = values.astype("<f4")
    bits = single.view("<u4").astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    rounded[np.isnan(single)] = 0x7FC0
    return rounded.tobytes()


def _python_integers(name: str, datatype: str, data: list, field: str) -> np.ndarray:
    """JSON integers numpy could not give one exact type (some beyond int64 and the rest
    not) as uint64 when they all fit it; else the DecodeError naming what is wrong."""
    flat = np.asarray(data, dtype=object).ravel().tolist()
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        raise _fail(f"{field}.data", 0, f'tensor "{name}": {datatype} data must be integers')
    for v in flat:
        if not 0 <= v <= 0xFFFFFFFFFFFFFFFF:
            raise _fail(f"{field}.data", 0, f'tensor "{name}": {v} is out of range for {datatype}')
    return np.asarray(flat, dtype=np.uint64)


def tensor_from_json(
    name: str,
    datatype: Any,
    shape: Any,
    data: Any,
    parameters: dict[str, Any] | None = None,
    *,
    field: str | None = None,
) -> Tensor:
    """The tensor a REST JSON input or output describes, its ``data`` flat or nested
    (row-major).  Numbers must fit the datatype (integers in range; BOOL true/false; FP16,
    FP32 and BF16 round to nearest); BYTES elements are strings, kept as their UTF-8 bytes.
    ``field`` names it in errors (default its name)."""
    where = name if field is None else field
    dtype = datatype_of(name, datatype, where)
    dims = check_shape(name, shape, where)
    need = element_count(dims)
    params = dict(parameters or {})
    if dtype.name == "BYTES":
        elements: list[bytes] = []
        _flatten_strings(name, data, where, elements, need)
        if len(elements) != need:
            raise _count_mismatch(name, where, len(elements), dims, need)
        raw = b"".join(_U32.pack(len(e)) + e for e in elements)
        return Tensor(name, dtype.name, dims, raw, params)
    if not isinstance(data, list):
        raise _fail(f"{where}.data", 0, f'tensor "{name}": data must be a list')
    try:
        values = np.asarray(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise _fail(
            f"{where}.data", 0, f'tensor "{name}": data is not a list of numbers ({exc})'
        ) from None
    if values.size != need:
        raise _count_mismatch(name, where, int(values.size), dims, need)
    if need == 0:
        return Tensor(name, dtype.name, dims, b"", params)
    kind = values.dtype.kind
    if dtype.name == "BOOL":
        if kind != "b":
            raise _fail(f"{where}.data", 0, f'tensor "{name}": BOOL data must be true/false')
        return Tensor(name, dtype.name, dims, values.astype("?").tobytes(), params)
    if dtype.name in _INTEGERS:
        if kind in "fO":  # ints numpy made floats or objects (beyond int64), or not ints
            values = _python_integers(name, dtype.name, data, where)
            kind = "u"
        if kind not in "iu":
            raise _fail(f"{where}.data", 0, f'tensor "{name}": {dtype.name} data must be integers')
        if values.dtype == np.int64 and dtype.name == "INT64":  # in range by construction
            return Tensor(name, dtype.name, dims, values.astype("<i8").tobytes(), params)
        bottom, top = _LIMITS[dtype.name]
        low, high = int(values.min()), int(values.max())
        if low < bottom or high > top:
            bad = low if low < bottom else high
            raise _fail(
                f"{where}.data", 0, f'tensor "{name}": {bad} is out of range for {dtype.name}'
            )
        return Tensor(name, dtype.name, dims, values.astype(dtype.numpy).tobytes(), params)
    if kind == "O":  # numbers numpy could not give one type (ints beyond 64 bits)
        flat = np.asarray(data, dtype=object).ravel().tolist()
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in flat):
            values, kind = np.asarray([float(v) for v in flat]), "f"
    if kind not in "iuf":
        raise _fail(f"{where}.data", 0, f'tensor "{name}": {dtype.name} data must be numbers')
    if dtype.name == "BF16":
        return Tensor(name, dtype.name, dims, _bf16_from_float(values), params)
    if dtype.name == "FP64" or (dtype.name == "FP32" and kind != "f"):
        raw = values.astype(dtype.numpy).tobytes()  # cannot overflow
    else:
        with np.errstate(over="ignore"):  # beyond the type's range: infinity, as C casts
            raw = values.astype(dtype.numpy).tobytes()
    return Tensor(name, dtype.name, dims, raw, params)


def tensor_to_json_data(t: Tensor) -> list[Any]:
    """A tensor's elements as the flat list REST JSON ``data`` carries: numbers, booleans, or
    (BYTES) strings.  The tensor is checked first (:func:`check_tensor`); a BYTES element that
    is not UTF-8 cannot be JSON: EncodeError (ask for that output as binary data)."""
    check_tensor(t)
    dtype = DATATYPES[t.datatype]
    if dtype.name == "BYTES":
        view = memoryview(t.data).cast("B")
        strings = []
        for index, (start, end) in enumerate(
            bytes_elements(t.name, view, element_count(t.shape), t.name)
        ):
            try:
                strings.append(str(view[start:end], "utf-8"))
            except UnicodeDecodeError:
                raise EncodeError(
                    PROTOCOL,
                    f"{t.name}.data",
                    f'tensor "{t.name}": BYTES element {index} is not UTF-8, so not JSON '
                    "(ask for it as binary data)",
                ) from None
        return strings
    if dtype.name == "BF16":
        wide = np.frombuffer(t.data, "<u2").astype("<u4") << 16
        return wide.view("<f4").tolist()  # type: ignore[no-any-return]
    return np.frombuffer(t.data, dtype.numpy).tolist()  # type: ignore[no-any-return]


__all__ = [
    "bytes_elements",
    "check_shape",
    "check_tensor",
    "datatype_of",
    "element_count",
    "shape_text",
    "tensor_from_json",
    "tensor_to_json_data",
]
