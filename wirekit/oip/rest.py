"""OIP over REST: the JSON bodies of ``/v2/models/NAME/infer`` and the binary tensor data
extension (specs/oip.md).

Without the extension a body is one JSON document and every tensor carries a JSON ``data``
array.  With it the HTTP header ``Inference-Header-Content-Length: N`` says the first ``N``
bytes of the body are the JSON document; each tensor whose ``parameters`` hold
``binary_data_size: S`` has no ``data`` and its raw bytes follow, in the order of the tensors
in the document, ``S`` bytes each, nothing after the last.  Decoded binary tensors are
memoryviews into the body (no copy); encoded ones go out as the tensors' own buffers (pieces
for ``writelines``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from wirekit.errors import DecodeError

from .messages import PROTOCOL, Buffer, InferRequest, InferResponse, RequestedOutput, Tensor
from .tensors import check_shape, check_tensor, datatype_of, tensor_from_json, tensor_to_json_data

#: the HTTP header that announces the JSON part's length (request and response)
HEADER_LENGTH = "Inference-Header-Content-Length"
#: the parameters that belong to the transport, not the tensor or the request
BINARY_DATA_SIZE = "binary_data_size"
BINARY_DATA = "binary_data"
BINARY_DATA_OUTPUT = "binary_data_output"
TRANSPORT_PARAMETERS = frozenset({BINARY_DATA_SIZE, BINARY_DATA})


def _fail(field: str, offset: int, message: str) -> DecodeError:
    return DecodeError(PROTOCOL, field, offset, message)


def _document(
    body: Buffer, header_length: int | str | None
) -> tuple[dict[str, Any], memoryview, int]:
    """Split ``body`` into its JSON document (parsed) and the binary part after it."""
    if header_length is None and type(body) is bytes:  # all JSON: parse it as it is
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _fail("body", 0, f"not a JSON document: {exc}") from None
        if not isinstance(document, dict):
            raise _fail("body", 0, "the JSON document must be an object")
        return document, memoryview(body), len(body)
    view = memoryview(body).cast("B") if not isinstance(body, memoryview) else body
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    size = len(view)
    if header_length is None:
        end = size
    else:
        if isinstance(header_length, str):  # the HTTP header's text, as it came
            text = header_length.strip()
            if not (text.isascii() and text.isdigit()):
                raise _fail(HEADER_LENGTH, 0, f"{header_length!r} is not a byte count")
            header_length = int(text)
        if isinstance(header_length, bool) or not isinstance(header_length, int):
            raise _fail(HEADER_LENGTH, 0, f"{header_length!r} is not a byte count")
        if header_length < 0 or header_length > size:
            raise _fail(
                HEADER_LENGTH,
                0,
                f"{header_length} is not within the body of {size} bytes",
            )
        end = header_length
    try:
        document = json.loads(bytes(view[:end]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise _fail("body", 0, f"not a JSON document: {exc}") from None
    if not isinstance(document, dict):
        raise _fail("body", 0, "the JSON document must be an object")
    return document, view, end


def _object(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(field, 0, "must be a JSON object")
    return value


def _string(value: Any, field: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _fail(field, 0, "must be a string")
    return value


class _Binary:
    """The binary part of a body, handed out tensor by tensor in order."""

    def __init__(self, view: memoryview, start: int, present: bool) -> None:
        self.view = view
        self.pos = start
        self.present = present

    def take(self, name: str, size: Any, field: str) -> tuple[memoryview, int]:
        if not self.present:
            raise _fail(
                f"{field}.parameters.{BINARY_DATA_SIZE}",
                0,
                f'tensor "{name}": binary data without an {HEADER_LENGTH} header',
            )
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise _fail(
                f"{field}.parameters.{BINARY_DATA_SIZE}",
                0,
                f'tensor "{name}": {size!r} is not a byte count',
            )
        left = len(self.view) - self.pos
        if size > left:
            raise _fail(
                f"{field}.data",
                self.pos,
                f'tensor "{name}": binary_data_size {size} exceeds the {left} bytes left '
                "in the body",
            )
        start = self.pos
        self.pos += size
        return self.view[start : self.pos], start

    def finish(self) -> None:
        left = len(self.view) - self.pos
        if left:
            raise _fail(
                "body",
                self.pos,
                f"{left} bytes after the last binary tensor",
            )


def _tensors(document: dict[str, Any], key: str, binary: _Binary) -> list[Tensor]:
    entries = document.get(key)
    if not isinstance(entries, list):
        raise _fail(key, 0, "must be a list of tensors")
    tensors = []
    for index, entry in enumerate(entries):
        field = f"{key}[{index}]"
        if not isinstance(entry, dict):
            raise _fail(field, 0, "must be a JSON object")
        name = _string(entry.get("name"), f"{field}.name")
        assert name is not None
        parameters = _object(entry.get("parameters"), f"{field}.parameters")
        datatype = entry.get("datatype")
        shape = entry.get("shape")
        if BINARY_DATA_SIZE in parameters:
            data, offset = binary.take(name, parameters[BINARY_DATA_SIZE], field)
            kept = {k: v for k, v in parameters.items() if k not in TRANSPORT_PARAMETERS}
            dtype = datatype_of(name, datatype, field)
            tensor = Tensor(name, dtype.name, check_shape(name, shape, field), data, kept)
            check_tensor(tensor, field, offset)
        elif "data" in entry:
            kept = {k: v for k, v in parameters.items() if k not in TRANSPORT_PARAMETERS}
            tensor = tensor_from_json(name, datatype, shape, entry["data"], kept, field=field)
        else:
            raise _fail(f"{field}.data", 0, f'tensor "{name}": no data and no binary_data_size')
        tensors.append(tensor)
    return tensors


def decode_rest_request(body: Buffer, header_length: int | str | None = None) -> InferRequest:
    """The inference request a REST body holds; ``header_length`` is the value of the
    ``Inference-Header-Content-Length`` header, an int or the header's text (None when absent:
    the whole body is JSON; anything but a byte count within the body is a DecodeError).
    Binary tensors are memoryviews into ``body``."""
    document, view, end = _document(body, header_length)
    binary = _Binary(view, end, header_length is not None)
    inputs = _tensors(document, "inputs", binary)
    binary.finish()
    outputs = []
    requested = document.get("outputs")
    if requested is not None:
        if not isinstance(requested, list):
            raise _fail("outputs", 0, "must be a list")
        for index, entry in enumerate(requested):
            field = f"outputs[{index}]"
            if not isinstance(entry, dict):
                raise _fail(field, 0, "must be a JSON object")
            name = _string(entry.get("name"), f"{field}.name")
            assert name is not None
            outputs.append(
                RequestedOutput(name, dict(_object(entry.get("parameters"), f"{field}.parameters")))
            )
    return InferRequest(
        inputs=inputs,
        id=_string(document.get("id"), "id", optional=True),
        outputs=outputs,
        parameters=dict(_object(document.get("parameters"), "parameters")),
    )


def decode_rest_response(body: Buffer, header_length: int | str | None = None) -> InferResponse:
    """The inference response a REST body holds (the client's side of
    :func:`encode_rest_response`); binary outputs are memoryviews into ``body``."""
    document, view, end = _document(body, header_length)
    binary = _Binary(view, end, header_length is not None)
    outputs = _tensors(document, "outputs", binary)
    binary.finish()
    version = document.get("model_version")
    return InferResponse(
        model_name=_string(document.get("model_name"), "model_name") or "",
        outputs=outputs,
        model_version=_string(version, "model_version", optional=True),
        id=_string(document.get("id"), "id", optional=True),
        parameters=dict(_object(document.get("parameters"), "parameters")),
    )


def _dumps(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


def _tensor_entry(t: Tensor, binary: bool, pieces: list[Buffer]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
    parameters = {k: v for k, v in t.parameters.items() if k not in TRANSPORT_PARAMETERS}
    if binary:
        check_tensor(t)
        parameters[BINARY_DATA_SIZE] = memoryview(t.data).nbytes
        pieces.append(t.data)
    if parameters:
        entry["parameters"] = parameters
    if not binary:
        entry["data"] = tensor_to_json_data(t)
    return entry


def encode_rest_request(req: InferRequest, *, binary: bool = False) -> tuple[bytes, int | None]:
    """A REST body for ``req`` (what a client sends): every input as JSON ``data``, or with
    ``binary`` every input's bytes after the JSON document; returns the body and the
    ``Inference-Header-Content-Length`` value (None without binary data)."""
    pieces: list[Buffer] = []
    document: dict[str, Any] = {}
    if req.id is not None:
        document["id"] = req.id
    if req.parameters:
        document["parameters"] = req.parameters
    document["inputs"] = [_tensor_entry(t, binary, pieces) for t in req.inputs]
    if req.outputs:
        document["outputs"] = [
            {"name": o.name, **({"parameters": o.parameters} if o.parameters else {})}
            for o in req.outputs
        ]
    head = _dumps(document)
    if not binary:
        return head, None
    return b"".join([head, *pieces]), len(head)


def encode_rest_response(
    resp: InferResponse, *, binary: Callable[[str], bool] | bool = False
) -> tuple[bytes | list[Buffer], int | None]:
    """A REST body for ``resp``: outputs for which ``binary`` (a bool, or a function of the
    output's name: :func:`binary_outputs`) is true go as binary data after the JSON document,
    the others as JSON ``data``.  Returns the body -- ``bytes`` when nothing is binary, else
    the pieces for ``writelines`` (the JSON document, then each binary output's own buffer,
    not copied) -- and the ``Inference-Header-Content-Length`` value (None: no binary part)."""
    chosen: Callable[[str], bool] = binary if callable(binary) else (lambda _name: binary)
    pieces: list[Buffer] = []
    document: dict[str, Any] = {"model_name": resp.model_name}
    if resp.model_version is not None:
        document["model_version"] = resp.model_version
    if resp.id is not None:
        document["id"] = resp.id
    if resp.parameters:
        document["parameters"] = resp.parameters
    document["outputs"] = [_tensor_entry(t, bool(chosen(t.name)), pieces) for t in resp.outputs]
    head = _dumps(document)
    if not pieces:
        return head, None
    return [head, *pieces], len(head)


def binary_outputs(req: InferRequest) -> Callable[[str], bool]:
    """Which outputs of the answer to ``req`` go as binary data: an output's own
    ``parameters.binary_data`` when the request names it, else the request's
    ``parameters.binary_data_output`` (default False)."""
    default = bool(req.parameters.get(BINARY_DATA_OUTPUT, False))
    named = {
        o.name: bool(o.parameters[BINARY_DATA]) for o in req.outputs if BINARY_DATA in o.parameters
    }
    if not named:
        return lambda _name: default
    return lambda name: named.get(name, default)


__all__ = [
    "BINARY_DATA",
    "BINARY_DATA_OUTPUT",
    "BINARY_DATA_SIZE",
    "HEADER_LENGTH",
    "TRANSPORT_PARAMETERS",
    "binary_outputs",
    "decode_rest_request",
    "decode_rest_response",
    "encode_rest_request",
    "encode_rest_response",
]
