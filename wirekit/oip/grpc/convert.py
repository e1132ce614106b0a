"""OIP gRPC messages to and from wirekit's OIP types (:mod:`wirekit.oip.messages`), sans-IO.

An input tensor comes as ``raw_input_contents`` (its bytes, in the form every wirekit tensor
holds: little-endian, row-major; BYTES as u32-LE length + bytes per element) or as typed
``contents`` (one field per datatype family, below); one request uses one form for all its
inputs.  An output always goes as ``raw_output_contents``.  Problems are
:class:`~wirekit.errors.DecodeError` ("oip", the field, offset 0, why), answered
INVALID_ARGUMENT by the door.

=========================  ===============================================================
datatype                   typed ``contents`` field
=========================  ===============================================================
BOOL                       ``bool_contents``
UINT8, UINT16, UINT32      ``uint_contents`` (each value must fit the datatype)
INT8, INT16, INT32         ``int_contents`` (each value must fit the datatype)
INT64 / UINT64             ``int64_contents`` / ``uint64_contents``
FP32 / FP64                ``fp32_contents`` / ``fp64_contents``
BYTES                      ``bytes_contents``, one entry per element
FP16, BF16                 none: raw only
=========================  ===============================================================
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

import numpy as np

from wirekit.errors import DecodeError

from ..messages import DATATYPES, PROTOCOL, Buffer, InferRequest, RequestedOutput, Tensor

#: datatype -> (its typed contents field, NumPy's dtype of that field's values)
TYPED_CONTENTS: dict[str, tuple[str, str]] = {
    "BOOL": ("bool_contents", "?"),
    "UINT8": ("uint_contents", "<u4"),
    "UINT16": ("uint_contents", "<u4"),
    "UINT32": ("uint_contents", "<u4"),
    "UINT64": ("uint64_contents", "<u8"),
    "INT8": ("int_contents", "<i4"),
    "INT16": ("int_contents", "<i4"),
    "INT32": ("int_contents", "<i4"),
    "INT64": ("int64_contents", "<i8"),
    "FP32": ("fp32_contents", "<f4"),
    "FP64": ("fp64_contents", "<f8"),
    "BYTES": ("bytes_contents", "O"),
}

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
_LENGTH = struct.Struct("<I")


def _error(field: str, message: str) -> DecodeError:
    return DecodeError(PROTOCOL, field, 0, message)


def parameters_from_grpc(params: Mapping[str, Any]) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as a dict of plain values (an unset parameter: None)."""
    doc: dict[str, Any] = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        doc[key] = None if choice is None else getattr(param, choice)
    return doc


def parameters_to_grpc(doc: Mapping[str, Any], params: MutableMapping[str, Any]) -> None:
    """Fill the ``map<string, InferParameter>`` ``params`` from ``doc``: a bool, an integer
    (int64, else uint64), a float, a string; None an unset parameter; anything else (a JSON
    list or object from another door) its JSON text."""
    for key, value in doc.items():
        param = params[key]
        if value is None:
            param.SetInParent()
        elif isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int) and _INT64_MIN <= value <= _INT64_MAX:
            param.int64_param = value
        elif isinstance(value, int) and 0 <= value <= _UINT64_MAX:
            param.uint64_param = value
        elif isinstance(value, float):
            param.double_param = value
        elif isinstance(value, str):
            param.string_param = value
        else:
            param.string_param = json.dumps(value, separators=(",", ":"))


def _typed_bytes(where: str, datatype: str, shape: tuple[int, ...], contents: Any) -> bytes:
    """A tensor's raw bytes from its typed ``contents``."""
    typed = TYPED_CONTENTS.get(datatype)
    if typed is None:
        raise _error(where, f"{datatype} has no typed contents: send it in raw_input_contents")
    name, source = typed
    values = getattr(contents, name)
    for other, _ in set(TYPED_CONTENTS.values()):
        if other != name and len(getattr(contents, other)):
            raise _error(f"{where}.{other}", f"a {datatype} tensor's values go in {name}")
    count = 1
    for dim in shape:
        count *= dim
    if len(values) != count:
        raise _error(
            f"{where}.{name}", f"{len(values)} values for shape {list(shape)} ({count} elements)"
        )
    if datatype == "BYTES":
        return b"".join(_LENGTH.pack(len(v)) + v for v in values)
    array = np.asarray(values, dtype=source)
    target = np.dtype(DATATYPES[datatype].numpy)
    cast = array.astype(target)
    if target != array.dtype and not np.array_equal(cast.astype(source), array):
        raise _error(f"{where}.{name}", f"a value does not fit {datatype}")
    return cast.tobytes()


#: ``ModelInferRequest.raw_input_contents``: field 7
RAW_INPUT_FIELD = 7


def _read_varint(body: memoryview, at: int, field: str) -> tuple[int, int]:
    """The varint at ``at`` of ``body`` and the offset after it."""
    value = shift = 0
    end = len(body)
    while True:
        if at >= end:
            raise DecodeError(PROTOCOL, field, at, "the message ends inside a varint")
        byte = body[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise DecodeError(PROTOCOL, field, at, "a varint longer than 10 bytes")


def split_raw_inputs(body: Buffer) -> tuple[bytes, list[memoryview]]:
    """A serialized ``ModelInferRequest`` as ``(head, raw)``: ``raw`` its
    ``raw_input_contents``, in order, as memoryviews into ``body`` (not copied), and
    ``head`` the message's other fields (its bytes without those; parse it with protobuf).

    Only the top level is walked (each field's tag and extent); what the head holds is left
    to protobuf to check.  A message cut short or with a wire type protobuf does not write
    is a :class:`~wirekit.errors.DecodeError` with its byte offset."""
    view = memoryview(body).cast("B")
    head: list[memoryview] = []
    raw: list[memoryview] = []
    at, end = 0, len(view)
    while at < end:
        start = at
        tag, at = _read_varint(view, at, "ModelInferRequest")
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            _, at = _read_varint(view, at, f"field {number}")
        elif wire_type == 1:
            at += 8
        elif wire_type == 5:
            at += 4
        elif wire_type == 2:
            size, at = _read_varint(view, at, f"field {number}")
            if number == RAW_INPUT_FIELD:
                if at + size > end:
                    raise DecodeError(
                        PROTOCOL, "raw_input_contents", at, "the message ends inside a raw content"
                    )
                raw.append(view[at : at + size])
                at += size
                continue
            at += size
        else:
            raise DecodeError(
                PROTOCOL, f"field {number}", start, f"wire type {wire_type} is not read here"
            )
        if at > end:
            raise DecodeError(PROTOCOL, f"field {number}", start, "the message ends inside it")
        head.append(view[start:at])
    return b"".join(head), raw


def _tensors(entries: Any, raw: Any, role: str, hint: str = "", *, one_kind: bool) -> list[Tensor]:
    """The tensors of a gRPC message's ``inputs`` or ``outputs`` (``role``): each from its
    raw contents (``raw``: one per entry, in order, seen through memoryviews) when the message
    has any, else from its typed ``contents``; checked as they are read (a known datatype, no
    negative dimension; ``one_kind``: typed contents beside raw ones refused -- a client's
    request must not give both; MLServer's answers do, and its raw ones are read)."""
    raw_field = f"raw_{role[:-1]}_contents"
    if raw and len(raw) != len(entries):
        raise _error(raw_field, f"{len(raw)} raw contents for {len(entries)} {role}{hint}")
    tensors = []
    for i, given in enumerate(entries):
        where = f"{role}[{i}]"
        shape = tuple(given.shape)
        if given.datatype not in DATATYPES:
            raise _error(f"{where}.datatype", f"unknown datatype {given.datatype!r}")
        if any(dim < 0 for dim in shape):
            raise _error(f"{where}.shape", f"a negative dimension in {list(shape)}")
        if raw:
            if one_kind and given.HasField("contents"):
                raise _error(f"{where}.contents", f"contents and {raw_field} given: give one")
            data: bytes | memoryview = memoryview(raw[i])
        else:
            data = _typed_bytes(f"{where}.contents", given.datatype, shape, given.contents)
        tensors.append(
            Tensor(given.name, given.datatype, shape, data, parameters_from_grpc(given.parameters))
        )
    return tensors


def request_from_grpc(msg: Any, raw_inputs: list[memoryview] | None = None) -> InferRequest:
    """The :class:`InferRequest` of a ``ModelInferRequest`` (``msg``).  ``raw_inputs``: its
    raw contents as :func:`split_raw_inputs` found them (None: the message's own
    ``raw_input_contents``, seen through memoryviews)."""
    raw = msg.raw_input_contents if raw_inputs is None else raw_inputs
    inputs = _tensors(msg.inputs, raw, "inputs", ": give one per input, in order", one_kind=True)
    outputs = [
        RequestedOutput(out.name, parameters_from_grpc(out.parameters)) for out in msg.outputs
    ]
    return InferRequest(
        inputs,
        id=msg.id or None,
        outputs=outputs,
        parameters=parameters_from_grpc(msg.parameters),
    )


def response_to_grpc(
    response_class: Any,
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Iterable[Tensor],
    parameters: Mapping[str, Any],
) -> Any:
    """The ``ModelInferResponse`` (of ``response_class``) answering ``outputs`` and the
    response's ``parameters``, every output's bytes in ``raw_output_contents``."""
    resp = response_class(model_name=model_name, model_version=model_version, id=request_id or "")
    parameters_to_grpc(parameters, resp.parameters)
    raw = resp.raw_output_contents
    for tensor in outputs:
        out = resp.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        parameters_to_grpc(tensor.parameters, out.parameters)
        raw.append(bytes(tensor.data))
    return resp


#: the tag of ``ModelInferResponse.raw_output_contents`` (field 6, length-delimited)
RAW_OUTPUT_TAG = bytes([6 << 3 | 2])


def _varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_response(
    response_class: Any,
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: list[Tensor],
    parameters: Mapping[str, Any],
) -> bytes:
    """The serialized ``ModelInferResponse`` that :func:`response_to_grpc` builds, with each
    output's bytes copied once: the message without ``raw_output_contents`` is serialized by
    protobuf, and those (field 6, the message's last) are appended to it as protobuf writes
    them -- a tag, a varint length, the bytes -- straight from the tensors' buffers
    (memoryviews into the backend's reply)."""
    head = response_to_grpc(
        response_class,
        model_name,
        model_version,
        request_id,
        (Tensor(t.name, t.datatype, t.shape, b"", t.parameters) for t in outputs),
        parameters,
    )
    del head.raw_output_contents[:]
    pieces: list[Any] = [head.SerializeToString()]
    for tensor in outputs:
        pieces += (RAW_OUTPUT_TAG, _varint(memoryview(tensor.data).nbytes), tensor.data)
    return b"".join(pieces)


def request_to_grpc(request_class: Any, model_name: str, req: InferRequest) -> Any:
    """The ``ModelInferRequest`` (of ``request_class``) a client sends for ``req`` to the
    model ``model_name``: every input's bytes in ``raw_input_contents`` (the tensors' own
    form: nothing is turned into numbers)."""
    msg = request_class(model_name=model_name, id=req.id or "")
    parameters_to_grpc(req.parameters, msg.parameters)
    raw = msg.raw_input_contents
    for tensor in req.inputs:
        given = msg.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        parameters_to_grpc(tensor.parameters, given.parameters)
        raw.append(bytes(tensor.data))
    for out in req.outputs:
        parameters_to_grpc(out.parameters, msg.outputs.add(name=out.name).parameters)
    return msg


def response_from_grpc(msg: Any) -> tuple[list[Tensor], dict[str, Any]]:
    """The outputs and parameters of a ``ModelInferResponse`` (the client's side of
    :func:`response_to_grpc`): each output from ``raw_output_contents`` when the server
    sent them, else from its typed ``contents`` (MLServer's habit)."""
    outputs = _tensors(msg.outputs, msg.raw_output_contents, "outputs", one_kind=False)
    return outputs, parameters_from_grpc(msg.parameters)


def metadata_to_grpc(response_class: Any, doc: Mapping[str, Any]) -> Any:
    """The ``ModelMetadataResponse`` (of ``response_class``) of OIP's model metadata
    document ``doc`` (:func:`wirekit.oip.metadata.model_metadata`)."""
    resp = response_class(
        name=doc["name"], versions=list(doc["versions"]), platform=doc["platform"]
    )
    for role in ("inputs", "outputs"):
        tensors = getattr(resp, role)
        for spec in doc[role]:
            tensors.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
    return resp


__all__ = [
    "RAW_INPUT_FIELD",
    "RAW_OUTPUT_TAG",
    "TYPED_CONTENTS",
    "encode_response",
    "metadata_to_grpc",
    "parameters_from_grpc",
    "parameters_to_grpc",
    "request_from_grpc",
    "request_to_grpc",
    "response_from_grpc",
    "response_to_grpc",
    "split_raw_inputs",
]
