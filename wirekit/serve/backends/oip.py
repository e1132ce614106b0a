"""Model servers as backends: the Open Inference Protocol (REST, gRPC) and TF Serving's REST
API -- the data plane of the backend kinds ``oip`` and ``tfserving``.

A request reaches a backend as a MIP message.  Its items must be OIP items (a REQUEST item
and TENSOR items: what the OIP REST, OIP gRPC and TF Serving doors make, and what a MIP
client may send); they are mapped onto an OIP request by
:func:`wirekit.oip.mapping.mip_to_request` (the model's ``tensors`` rule: with ``rows`` the
samples are stacked along dim 0) and the server's answer back onto a MIP reply by
:func:`~wirekit.oip.mapping.reply_to_mip` (rows split again).  Tensor bytes travel as bytes:

* :class:`OipRestBackend` -- ``POST /v2/models/{model}/infer`` over HTTP/1.1 with keep-alive
  (at most ``connections`` open; :mod:`.httpclient`), with the binary data extension (the
  inputs' bytes after the JSON document, ``Inference-Header-Content-Length``;
  ``binary_data_output`` asked for).
  KServe 0.21 takes it; MLServer 1.7.1 does not (its REST API reads JSON only: it answers
  500, or drops the connection): a server that fails the first binary request (any status
  but 200, a lost connection) is asked again in JSON, and from then on in JSON only when
  that one is answered (the binary requests already in flight then are asked again in JSON
  too); one that answered a binary request once is not asked in JSON again.
* :class:`OipGrpcBackend` -- ``inference.GRPCInferenceService/ModelInfer`` (grpc.aio), the
  inputs in ``raw_input_contents``; outputs read from ``raw_output_contents`` or, where the
  server answers typed ``contents`` (MLServer), from those.
* :class:`TfServingBackend` -- TF Serving's ``POST /v1/models/{model}:predict``: the inputs
  as ``instances`` (row format) when they all have the same dim 0, else as columnar
  ``inputs``; one input goes bare, several named.  The answer's ``predictions`` (or
  ``outputs``) carry no datatypes: a declared output (``models.<name>.outputs``) gives its
  own, else it is read from the JSON values as the TF Serving door reads an undeclared
  input (:func:`wirekit.serve.doors.tfserving.infer_datatype`); a bare answer is named
  ``predictions`` (``outputs``) unless the model declares one output.

Plain MIP items (TEXT, JSON, ...) are refused before anything is sent: :class:`BadRequest`
naming the backend kind (the HTTP doors answer 400, the MIP door a SHAPE error reply).

What the server says, and what wirekit makes of it (one table for the three):

====================================================  =========================================
the server says                                       wirekit's end state
====================================================  =========================================
200 / gRPC OK                                         the answer
400, 422 and the other 4xx not below /                the model's error: its message intact
INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE   (the body's ``error``, else its text) in
                                                      an OIP ERROR item (:func:`error_to_mip`);
                                                      the doors answer 400 / INVALID_ARGUMENT;
                                                      not resubmitted, the device not backed off
404 (the model is not on that server), 408, 429,      :class:`BackendUnavailable`: resubmitted
5xx / NOT_FOUND, UNAVAILABLE, INTERNAL, UNKNOWN,      to another device, this one backed off
RESOURCE_EXHAUSTED, ABORTED, UNIMPLEMENTED, every
other code; connection refused or reset; a body
that is not OIP's (TF Serving's)
no answer within the model's ``timeout`` /            timed out: resubmitted (the dispatcher's
DEADLINE_EXCEEDED                                     own deadline)
====================================================  =========================================

The dispatcher treats these backends as any other: the general attempt loop (resubmission,
back-off, the model's timeout, the cache, the request record, the metrics).  They offer no
pipelined MIP connection (``lane_client``, ``send_nowait``), so the MIP lane and the first
attempt's callback path never take them, and they are not ``batchable``.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from wirekit.errors import DecodeError, EncodeError
from wirekit.mip import Inference
from wirekit.oip import (
    HEADER_LENGTH,
    InferRequest,
    Tensor,
    decode_rest_response,
    encode_rest_request,
    error_to_mip,
    mip_to_request,
    reply_to_mip,
)
from wirekit.oip.metadata import TensorSpec
from wirekit.oip.rest import BINARY_DATA_OUTPUT

from ..config import ModelConfig
from ..dispatch.payload import Payload
from .httpclient import HttpError, HttpPool
from .remote import BackendUnavailable, BadRequest
from .servers import ServerAddress

#: HTTP statuses that say the server (not the request) failed: resubmitted elsewhere
UNAVAILABLE_STATUSES = frozenset({404, 408, 429})
#: gRPC status names that are the model's error about the request (not resubmitted)
MODEL_ERROR_CODES = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"})
#: how much of a body that is not an OIP error document a message quotes
QUOTED = 500


class ModelError(Exception):
    """The server answered that the model failed on the request: ``message`` its words."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


def status_outcome(status: int, message: str, where: str) -> ModelError | BackendUnavailable:
    """What an HTTP answer with ``status`` (not 200) and the error ``message`` is (the
    module's table): the model's error (a 4xx but 404, 408, 429), else the server's."""
    if 400 <= status < 500 and status not in UNAVAILABLE_STATUSES:
        return ModelError(message)
    return BackendUnavailable(f"{where}: HTTP {status}: {message}")


def error_message(body: bytes) -> str:
    """The message of an error body: OIP's and TF Serving's ``{"error": message}``, else
    the body's text (at most :data:`QUOTED` characters)."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return doc["error"]
    text = body.decode("utf-8", "replace").strip()
    return text[:QUOTED] or "(no message)"


class ServerBackend:
    """What the three backends share: the MIP <-> OIP mapping, the in-flight count, the
    answer of a model's error."""

    #: a server is sent one request at a time per call: the dispatcher never joins them
    batchable = False

    def __init__(self, address: ServerAddress, model: ModelConfig, *, timeout: float) -> None:
        self.address = address
        self.model = model.name
        self.kind = address.kind
        self.rows = model.tensors == "rows"
        #: seconds one call may take (the dispatcher enforces it, and sets it on a change)
        self.timeout = timeout
        self.in_flight = 0  #: requests sent and not answered yet

    def oip_request(self, msg: Any) -> InferRequest:
        """The OIP request a MIP request message carries; :class:`BadRequest` for one that
        is not OIP items."""
        try:
            return mip_to_request(msg, rows=self.rows)
        except DecodeError as exc:
            raise BadRequest(
                f"model {self.model!r} is served by {self.kind} backends, which take OIP"
                f" tensors: {exc.field}: {exc.reason}"
            ) from None

    async def infer(self, request: Payload) -> Payload:
        msg = request.message
        req = self.oip_request(msg)
        assert isinstance(msg, Inference)  # mip_to_request took it
        self.in_flight += 1
        try:
            outputs, parameters = await self.call(req)
        except ModelError as exc:
            reply = error_to_mip(exc.message, batch_size=msg.batch_size, n_input=msg.n_input)
            return Payload(None, reply)
        finally:
            self.in_flight -= 1
        try:
            reply = reply_to_mip(outputs, parameters, rows=self.rows, n_input=msg.n_input)
        except (DecodeError, EncodeError) as exc:
            raise BackendUnavailable(f"{self.where}: an answer that is not OIP's: {exc}") from None
        if self.rows and reply.batch_size != msg.batch_size:
            raise BackendUnavailable(
                f"{self.where}: {reply.batch_size} rows answered for {msg.batch_size} asked"
                " (tensors: rows)"
            )
        return Payload(None, reply)

    @property
    def where(self) -> str:
        """The server, for messages."""
        raise NotImplementedError

    async def call(self, req: InferRequest) -> tuple[list[Tensor], dict[str, Any]]:
        """The server's outputs and parameters for ``req``; :class:`ModelError` or
        :class:`BackendUnavailable` as the module's table says."""
        raise NotImplementedError

    async def close(self) -> None:
        return None


class _Http:
    """The HTTP/1.1 connections of one backend (:class:`~.httpclient.HttpPool`), its
    failures as :class:`BackendUnavailable`."""

    def __init__(self, address: ServerAddress, connections: int) -> None:
        assert address.rest_port is not None
        self.pool = HttpPool(
            address.host, address.rest_port, limit=connections, wanted=frozenset({_HEADER})
        )

    async def post(
        self, path: str, body: bytes, headers: dict[str, str], where: str
    ) -> tuple[int, bytes, dict[bytes, bytes]]:
        """``(status, body, headers)`` of a POST; :class:`BackendUnavailable` when the
        server cannot be reached or breaks HTTP."""
        try:
            status, answer_headers, answer = await self.pool.post(path, body, headers)
        except HttpError as exc:
            raise BackendUnavailable(f"{where}: {exc}") from None
        return status, answer, answer_headers

    async def close(self) -> None:
        await self.pool.close()


#: the binary data extension's header, as the client reads it
_HEADER = HEADER_LENGTH.lower().encode("ascii")


class OipRestBackend(ServerBackend):
    """An OIP server's REST API (module docstring): ``POST /v2/models/{model}/infer``."""

    def __init__(
        self, address: ServerAddress, model: ModelConfig, *, connections: int, timeout: float
    ) -> None:
        super().__init__(address, model, timeout=timeout)
        self.path = f"/v2/models/{quote(address.model, safe='')}/infer"
        self.url = f"{address.rest_url}{self.path}"
        self._http = _Http(address, connections)
        #: whether the server takes the binary data extension: None until it answers
        self.binary: bool | None = None

    @property
    def where(self) -> str:
        return self.url

    async def call(self, req: InferRequest) -> tuple[list[Tensor], dict[str, Any]]:
        if self.binary is False:
            status, body, headers = await self._post(req, binary=False)
        else:
            try:
                status, body, headers = await self._post(req, binary=True)
            except BackendUnavailable:
                if self.binary is True or not _as_json(req):
                    raise
                status = 0  # MLServer may drop the connection rather than answer 500
            if status == 200:
                self.binary = True
            elif self.binary is not True and _as_json(req):
                # not found out yet, or found JSON-only by a request answered meanwhile
                status, body, headers = await self._post(req, binary=False)
                if status == 200:
                    self.binary = False
        if status != 200:
            raise status_outcome(status, error_message(body), self.url)
        try:
            length = headers.get(_HEADER)
            resp = decode_rest_response(body, None if length is None else length.decode("latin-1"))
        except DecodeError as exc:
            raise BackendUnavailable(f"{self.url}: an answer that is not OIP's: {exc}") from None
        return resp.outputs, resp.parameters

    async def _post(self, req: InferRequest, *, binary: bool) -> tuple[int, bytes, Any]:
        headers = {"Content-Type": "application/json"}
        if binary:
            sent = InferRequest(
                req.inputs, None, req.outputs, {**req.parameters, BINARY_DATA_OUTPUT: True}
            )
            body, length = encode_rest_request(sent, binary=True)
            headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(length)}
        else:
            try:
                body, _ = encode_rest_request(req)
            except EncodeError as exc:  # a BYTES element that is not UTF-8
                raise BadRequest(
                    f"{self.url} takes tensors in JSON only (not the binary data extension):"
                    f" {exc.reason}"
                ) from None
        return await self._http.post(self.path, body, headers, self.url)

    async def close(self) -> None:
        await self._http.close()


def _as_json(req: InferRequest) -> bool:
    """Whether ``req`` can be written in JSON (every BYTES element UTF-8)."""
    try:
        encode_rest_request(req)
    except EncodeError:
        return False
    return True


class OipGrpcBackend(ServerBackend):
    """An OIP server's gRPC API (module docstring): ``ModelInfer`` over one grpc.aio
    channel (HTTP/2: every call multiplexed on it)."""

    def __init__(self, address: ServerAddress, model: ModelConfig, *, timeout: float) -> None:
        super().__init__(address, model, timeout=timeout)
        self.target = address.grpc_target
        self._call: Any = None
        self._channel: Any = None

    @property
    def where(self) -> str:
        return f"grpc://{self.target}"

    def _stub(self) -> Any:
        if self._call is None:
            import grpc

            from wirekit.oip.grpc import messages as pb

            self._channel = grpc.aio.insecure_channel(
                self.target,
                options=[
                    ("grpc.max_receive_message_length", -1),
                    ("grpc.max_send_message_length", -1),
                    ("grpc.enable_http_proxy", 0),
                ],
            )
            self._call = self._channel.unary_unary(
                f"/{pb.SERVICE}/ModelInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
        return self._call

    async def call(self, req: InferRequest) -> tuple[list[Tensor], dict[str, Any]]:
        import grpc

        from wirekit.oip.grpc import messages as pb
        from wirekit.oip.grpc.convert import request_to_grpc, response_from_grpc

        msg = request_to_grpc(pb.ModelInferRequest, self.address.model, req)
        try:
            resp = await self._stub()(msg, wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"{self.where}: DEADLINE_EXCEEDED") from None
            details = exc.details() or "(no message)"
            if code.name in MODEL_ERROR_CODES:
                raise ModelError(details) from None
            raise BackendUnavailable(f"{self.where}: {code.name}: {details}") from None
        try:
            return response_from_grpc(resp)
        except DecodeError as exc:
            raise BackendUnavailable(f"{self.where}: an answer that is not OIP's: {exc}") from None

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._call = None


class TfServingBackend(ServerBackend):
    """A TF Serving REST API (module docstring): ``POST /v1/models/{model}:predict``."""

    def __init__(
        self, address: ServerAddress, model: ModelConfig, *, connections: int, timeout: float
    ) -> None:
        super().__init__(address, model, timeout=timeout)
        self.path = f"/v1/models/{quote(address.model, safe='')}:predict"
        self.url = f"{address.rest_url}{self.path}"
        self.outputs = model.outputs
        self._http = _Http(address, connections)

    @property
    def where(self) -> str:
        return self.url

    async def call(self, req: InferRequest) -> tuple[list[Tensor], dict[str, Any]]:
        form, body = predict_body(req)
        status, answer, _headers = await self._http.post(
            self.path, body, {"Content-Type": "application/json"}, self.url
        )
        if status != 200:
            raise status_outcome(status, error_message(answer), self.url)
        try:
            return predict_outputs(answer, form, self.outputs), {}
        except ValueError as exc:  # not JSON, or not tensors (the door's BadBody)
            raise BackendUnavailable(
                f"{self.url}: an answer that is not TF Serving's: {exc}"
            ) from None

    async def close(self) -> None:
        await self._http.close()


def predict_body(req: InferRequest) -> tuple[str, bytes]:
    """TF Serving's ``:predict`` body for ``req``: ``("instances", body)`` when every input
    has the same dim 0 (row format), else ``("inputs", body)`` (columnar); one input bare,
    several in an object by name.  A ``signature_name`` parameter goes as the body's."""
    from ..doors.tfserving import tensor_json

    values = {t.name: tensor_json(t) for t in req.inputs}
    dims = {t.shape[0] if t.shape else None for t in req.inputs}
    doc: dict[str, Any] = {}
    signature = req.parameters.get("signature_name")
    if isinstance(signature, str):
        doc["signature_name"] = signature
    if len(dims) == 1 and None not in dims:
        (count,) = dims
        assert count is not None
        if len(values) == 1:
            (only,) = values.values()
            doc["instances"] = only
        else:
            doc["instances"] = [{n: v[row] for n, v in values.items()} for row in range(count)]
        form = "instances"
    else:
        form = "inputs"
        doc["inputs"] = next(iter(values.values())) if len(values) == 1 else values
    return form, json.dumps(doc, separators=(",", ":")).encode("utf-8")


def predict_outputs(body: bytes, form: str, declared: tuple[TensorSpec, ...] = ()) -> list[Tensor]:
    """The output tensors of a ``:predict`` answer to a body of ``form``; ValueError (or the
    door's BadBody, a ValueError) for one that is not TF Serving's."""
    from ..doors.tfserving import json_tensor, undeclared_tensor

    doc = json.loads(body)
    key = "predictions" if form == "instances" else "outputs"
    if not isinstance(doc, dict) or key not in doc:
        raise ValueError(f"no {key!r} in the answer")
    value = doc[key]
    if form == "instances":
        if not isinstance(value, list):
            raise ValueError("predictions is not a list")
        if value and all(isinstance(row, dict) for row in value):
            columns: dict[str, list[Any]] = {}
            for row in value:
                for name, entry in row.items():
                    columns.setdefault(name, []).append(entry)
            named = columns
        else:
            named = {_bare_name(key, declared): value}
    elif isinstance(value, dict) and not ("b64" in value and len(value) == 1):
        named = dict(value)
    else:
        named = {_bare_name(key, declared): value}
    tensors = []
    for name, entry in named.items():
        spec = next((s for s in declared if s.name == name), None)
        tensors.append(json_tensor(spec, entry) if spec else undeclared_tensor(name, entry))
    return tensors


def _bare_name(key: str, declared: tuple[TensorSpec, ...]) -> str:
    """The name of an answer's one unnamed output: the model's one declared output's, else
    the answer's key."""
    return declared[0].name if len(declared) == 1 else key


__all__ = [
    "MODEL_ERROR_CODES",
    "UNAVAILABLE_STATUSES",
    "ModelError",
    "OipGrpcBackend",
    "OipRestBackend",
    "ServerBackend",
    "TfServingBackend",
    "error_message",
    "predict_body",
    "predict_outputs",
    "status_outcome",
]
