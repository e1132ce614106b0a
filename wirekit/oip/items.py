"""The wirekit MIP items that carry OIP requests and replies (specs/oip.md), and the pieces
of the mapping both twins share: building and reading each item, splitting tensors into rows.

Item types (the MIP item ``type`` u32) are a block of their own, ``0x4F495001`` and up
(``"OIP"`` then a number), far from KubeMo's 1..3:

========== ============ ==============================================================
type       name         data
========== ============ ==============================================================
0x4F495001 REQUEST      JSON object: ``parameters`` and ``outputs`` (each ``name`` and
                        ``parameters``) of the request, the empty ones left out
0x4F495002 TENSOR       8-byte head (big-endian), name, shape, parameters, raw bytes
0x4F495003 PARAMETERS   JSON object: a reply's parameters
0x4F495004 ERROR        UTF-8 text: the message of a model's error
========== ============ ==============================================================

The TENSOR item's byte layout is declared once, as ``wirekit.oip.spec.TENSOR_ITEM`` (its
diagram is there and in specs/oip.md).

The transport's parameters (``binary_data_size``, ``binary_data``, ``binary_data_output``)
are never carried: they say how the tensor travelled to the door, not what it is, and
leaving them out lets a cached answer serve a JSON and a binary client alike.
"""

from __future__ import annotations

import json
import struct
from enum import IntEnum
from typing import Any

from wirekit.errors import DecodeError

from .messages import BY_CODE, DATATYPES, PROTOCOL, Buffer, InferRequest, RequestedOutput, Tensor
from .tensors import bytes_elements, check_tensor, element_count, shape_text


class OipItem(IntEnum):
    """The MIP item types of the OIP mapping."""

    REQUEST = 0x4F495001
    TENSOR = 0x4F495002
    PARAMETERS = 0x4F495003
    ERROR = 0x4F495004


#: datatype u8, ndim u8, name_length u16, parameters_length u32 (big-endian)
TENSOR_HEAD = struct.Struct(">BBHI")
TENSOR_HEAD_SIZE = TENSOR_HEAD.size
MAX_NAME_LENGTH = 0xFFFF
MAX_NDIM = 0xFF
#: the tensors one sample can carry beside its REQUEST item (MIP's n_input is a u8)
MAX_TENSORS = 0xFF - 1
#: the rows one message can carry (MIP's batch_size is a u16)
MAX_ROWS = 0xFFFF
U32_MAX = 0xFFFFFFFF
TRANSPORT = frozenset({"binary_data_size", "binary_data", "binary_data_output"})


def _fail(field: str, offset: int, message: str) -> DecodeError:
    return DecodeError(PROTOCOL, field, offset, message)


def _json(value: dict[str, Any], field: str) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=True).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise _fail(field, 0, f"not JSON: {exc}") from None


def _kept(parameters: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in parameters.items() if k not in TRANSPORT}


# --------------------------------------------------------------------------- writing


def request_item(req: InferRequest) -> bytes:
    """The REQUEST item's data: the request's parameters and requested outputs (not its
    ``id``: the door keeps it, so equal requests make equal items and the cache can hit)."""
    if not req.parameters and not req.outputs:
        return b"{}"
    document: dict[str, Any] = {}
    parameters = _kept(req.parameters)
    if parameters:
        document["parameters"] = parameters
    if req.outputs:
        outputs = []
        for o in req.outputs:
            entry: dict[str, Any] = {"name": o.name}
            kept = _kept(o.parameters)
            if kept:
                entry["parameters"] = kept
            outputs.append(entry)
        document["outputs"] = outputs
    return _json(document, "parameters")


def parameters_item(parameters: dict[str, Any]) -> bytes:
    """The PARAMETERS item's data: a reply's parameters as a JSON object."""
    return _json(parameters, "parameters")


def tensor_parameters(t: Tensor, field: str) -> bytes:
    """A TENSOR item's parameters: the tensor's own (not the transport's) as a JSON object,
    or nothing when it has none."""
    kept = _kept(t.parameters)
    return _json(kept, f"{field}.parameters") if kept else b""


def tensor_head(t: Tensor, field: str) -> bytes:
    """A TENSOR item's data up to its raw bytes (head, name, shape, parameters).  The tensor
    must be checked already (:func:`check_tensor`); a name over 65 535 UTF-8 bytes or more
    than 255 dimensions is a DecodeError."""
    name = t.name.encode("utf-8", "surrogatepass")
    if len(name) > MAX_NAME_LENGTH:
        raise _fail(
            f"{field}.name",
            0,
            f'tensor "{t.name[:64]}...": a name of {len(name)} bytes, at most {MAX_NAME_LENGTH}',
        )
    if len(t.shape) > MAX_NDIM:
        raise _fail(
            f"{field}.shape",
            0,
            f'tensor "{t.name}": {len(t.shape)} dimensions, at most {MAX_NDIM}',
        )
    parameters = tensor_parameters(t, field)
    code = DATATYPES[t.datatype].code
    return b"".join(
        (
            TENSOR_HEAD.pack(code, len(t.shape), len(name), len(parameters)),
            name,
            struct.pack(f">{len(t.shape)}q", *t.shape),
            parameters,
        )
    )


def split_rows(tensors: list[Tensor], key: str) -> tuple[int, list[list[Tensor]]]:
    """The "rows" rule: dim 0 of every tensor is the batch; return the row count and, per
    row, each tensor's row (shape without dim 0, data a memoryview slice).  Every tensor
    must have a dim 0, the same one, at least 1 and at most 65 535; they are checked first."""
    if not tensors:
        raise _fail(key, 0, f"rows: no {key} to take the rows of")
    count = -1
    first = ""
    for index, t in enumerate(tensors):
        check_tensor(t, f"{key}[{index}]")
        if not t.shape:
            raise _fail(
                f"{key}[{index}].shape",
                0,
                f'rows: tensor "{t.name}" has no dimension 0 to split into rows',
            )
        if count < 0:
            count, first = t.shape[0], t.name
        elif t.shape[0] != count:
            raise _fail(
                f"{key}[{index}].shape",
                0,
                f'rows: tensor "{t.name}" has {t.shape[0]} rows, tensor "{first}" has {count}',
            )
    if count == 0:
        raise _fail(f"{key}[0].shape", 0, f'rows: tensor "{first}" has 0 rows, need at least 1')
    if count > MAX_ROWS:
        raise _fail(
            f"{key}[0].shape",
            0,
            f'rows: tensor "{first}" has {count} rows, a MIP message carries at most {MAX_ROWS}',
        )
    rows: list[list[Tensor]] = [[] for _ in range(count)]
    for t in tensors:
        view = memoryview(t.data).cast("B")
        row_shape = t.shape[1:]
        per_row = element_count(row_shape)
        size = DATATYPES[t.datatype].size
        if size:
            step = per_row * size
            bounds = [(r * step, (r + 1) * step) for r in range(count)]
        else:
            starts = [
                start - 4 for start, _end in bytes_elements(t.name, view, count * per_row, key)
            ]
            starts.append(len(view))
            bounds = [(starts[r * per_row], starts[(r + 1) * per_row]) for r in range(count)]
        for r, (start, end) in enumerate(bounds):
            rows[r].append(Tensor(t.name, t.datatype, row_shape, view[start:end], t.parameters))
    return count, rows


# --------------------------------------------------------------------------- reading


def read_json_object(data: Buffer, field: str) -> dict[str, Any]:
    """A JSON object item (REQUEST, PARAMETERS) parsed; DecodeError when it is not one."""
    try:
        value = json.loads(bytes(data))
    except (ValueError, UnicodeDecodeError) as exc:
        raise _fail(field, 0, f"not a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise _fail(field, 0, "not a JSON object")
    return value


def read_request_item(data: Buffer, field: str) -> tuple[dict[str, Any], list[RequestedOutput]]:
    """A REQUEST item's parameters and requested outputs."""
    document = read_json_object(data, field)
    parameters = document.get("parameters", {})
    outputs = document.get("outputs", [])
    if not isinstance(parameters, dict):
        raise _fail(field, 0, "parameters is not a JSON object")
    if not isinstance(outputs, list):
        raise _fail(field, 0, "outputs is not a list")
    requested = []
    for o in outputs:
        if (
            not isinstance(o, dict)
            or not isinstance(o.get("name"), str)
            or not isinstance(o.get("parameters", {}), dict)
        ):
            raise _fail(field, 0, "an output is not an object with a name")
        requested.append(RequestedOutput(o["name"], dict(o.get("parameters", {}))))
    return parameters, requested


def read_tensor_item(data: Buffer, field: str) -> Tensor:
    """The tensor a TENSOR item holds, its data a memoryview into ``data`` (no copy).  Every
    length is checked against the bytes present before it is used; the tensor is checked
    (:func:`check_tensor`, offsets within the item)."""
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    size = len(view)
    if size < TENSOR_HEAD_SIZE:
        raise _fail(field, 0, f"TENSOR item of {size} bytes, the head alone is {TENSOR_HEAD_SIZE}")
    code, ndim, name_length, parameters_length = TENSOR_HEAD.unpack_from(view, 0)
    dtype = BY_CODE.get(code)
    if dtype is None:
        raise _fail(field, 0, f"unknown datatype code {code}")
    pos = TENSOR_HEAD_SIZE
    need = name_length + 8 * ndim + parameters_length
    if need > size - pos:
        raise _fail(
            field,
            pos,
            f"name, shape and parameters need {need} bytes, {size - pos} left in the item",
        )
    try:
        name = str(view[pos : pos + name_length], "utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise _fail(field, pos, "the name is not UTF-8") from None
    pos += name_length
    shape = struct.unpack_from(f">{ndim}q", view, pos)
    for dim in shape:
        if dim < 0:
            raise _fail(
                field, pos, f'tensor "{name}": negative dimension {dim} in {shape_text(shape)}'
            )
    pos += 8 * ndim
    parameters = (
        read_json_object(view[pos : pos + parameters_length], field) if parameters_length else {}
    )
    pos += parameters_length
    tensor = Tensor(name, dtype.name, shape, view[pos:], parameters)
    check_tensor(tensor, field, pos)
    return tensor


def stack_rows(rows: list[list[Tensor]], field: str) -> list[Tensor]:
    """The inverse of :func:`split_rows`: the rows' tensors joined along a new dim 0.  Every
    row must hold the same tensors (names, datatypes, shapes, parameters) in one order."""
    first = rows[0]
    if len(rows) == 1:
        return [Tensor(t.name, t.datatype, (1, *t.shape), t.data, t.parameters) for t in first]
    stacked = []
    for j, t in enumerate(first):
        pieces = []
        for r, row in enumerate(rows):
            other = row[j] if j < len(row) else None
            if other is None or (other.name, other.datatype, other.shape, other.parameters) != (
                t.name,
                t.datatype,
                t.shape,
                t.parameters,
            ):
                raise _fail(
                    field,
                    0,
                    f'rows: row {r} does not carry tensor {j} as row 0 does ("{t.name}", '
                    f"{t.datatype}, {shape_text(t.shape)})",
                )
            pieces.append(other.data)
        stacked.append(
            Tensor(t.name, t.datatype, (len(rows), *t.shape), b"".join(pieces), t.parameters)
        )
    return stacked


__all__ = [
    "MAX_NAME_LENGTH",
    "MAX_NDIM",
    "MAX_ROWS",
    "MAX_TENSORS",
    "TENSOR_HEAD",
    "TENSOR_HEAD_SIZE",
    "OipItem",
    "parameters_item",
    "read_json_object",
    "read_request_item",
    "read_tensor_item",
    "request_item",
    "split_rows",
    "stack_rows",
    "tensor_head",
    "tensor_parameters",
]
