"""The Open Inference Protocol (OIP, "KServe v2") over REST, at the HTTP door.

=============================================  ===============================================
``GET /v2/health/live``                        ``{"live": true}`` while the process answers
``GET /v2/health/ready``                       200 ``{"ready": true}``, or 503 with the
                                               reasons: the same truth as ``/readyz``
``GET /v2``                                    server metadata: name, version, extensions
``GET /v2/models/NAME[/versions/V]``           model metadata: versions, platform, inputs,
                                               outputs (the model's config)
``GET /v2/models/NAME[/versions/V]/ready``     200 ``{"name", "ready": true}``, or 503: the
                                               same truth as ``/readyz?model=NAME``
``POST /v2/models/NAME[/versions/V]/infer``    an inference request, JSON or with the binary
                                               tensor data extension
=============================================  ===============================================

A request body with an ``Inference-Header-Content-Length`` header is the binary tensor data
extension's: that many bytes of JSON, then the inputs' bytes that their ``binary_data_size``
parameters announce.  The answer is binary for the outputs the request asks so
(``binary_data_output``, or an output's own ``binary_data``): then it is
``application/octet-stream`` with the same header; otherwise JSON.

A request is read within the HTTP door's limits and charged to the memory budget
(:class:`~wirekit.serve.doors.httpbody.BodyReader`), decoded (:mod:`wirekit.oip`), checked
against the inputs its model declares (:func:`wirekit.oip.metadata.check_inputs`), then
mapped onto one MIP request (:func:`wirekit.oip.request_to_mip`; the model's ``tensors`` rule
says whether the request is one MIP sample or a sample per row) and submitted to the
dispatcher like any other.  The backend's reply is mapped back
(:func:`wirekit.oip.response_from_mip`) and the outputs asked for are answered.

Every error is ``{"error": message}``: 400 a request that is not OIP or not what the model
takes (answered at once, never sent to a backend) and the model's own error message (the
OIP ERROR item of its reply, passed on intact), 404 an unknown model or version, 410 a
model removed, 413 a body or a tensor over the limits, and the dispatcher's outcomes as
every HTTP door answers them (:func:`~wirekit.serve.doors.answers.outcome_status`: 502, 503, 504).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from wirekit import oip
from wirekit.errors import DecodeError, EncodeError
from wirekit.mip import DEFAULT_MAX_ITEMS, Inference
from wirekit.mip.decoder import DEFAULT_MAX_MESSAGE_SIZE
from wirekit.mip.limits import BufferBudget
from wirekit.oip.metadata import check_inputs, model_metadata, server_metadata

from ..config import HttpLimits, ModelConfig
from ..control.metrics import DOOR_OIP_REST
from ..dispatch.dispatcher import Dispatcher, Outcome, UnknownModel
from ..dispatch.payload import Payload
from ..record.store import OK
from .answers import outcome_reason, outcome_status, unknown_name
from .httpbody import READER_KEY, BodyReader

#: the binary tensor data extension's header: the bytes of JSON at the start of a body
HEADER_LENGTH = oip.HEADER_LENGTH
#: the status of an inference the model itself answered with an error (its OIP ERROR item):
#: 400, as Triton answers a model's error (:class:`wirekit.oip.BackendError`), as
#: :func:`~wirekit.serve.doors.answers.outcome_status` answers the dispatcher's outcome of it
MODEL_ERROR = 400
#: a binary answer of this many bytes or more is written piece by piece (:func:`send`)
STREAM_FROM = 64 * 1024
OCTET_STREAM = "application/octet-stream"
#: a path segment naming a model or a version (one whole segment, as the HTTP routes' NAME)
SEGMENT = "[^/]+"


class Refused(Exception):
    """An OIP request refused with ``status`` and ``message`` (answered ``{"error": ...}``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_answer(doc: Any, status: int = 200) -> web.Response:
    """``doc`` as JSON, ``Content-Type: application/json`` with no charset parameter (some
    clients, KServe's among them, compare the header whole)."""
    body = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    return web.Response(body=body, status=status, content_type="application/json")


def error_answer(status: int, message: str) -> web.Response:
    """The OIP error answer: ``{"error": message}`` with ``status``."""
    return json_answer({"error": message}, status)


def header_length(value: str | None) -> int | None:
    """The value of an ``Inference-Header-Content-Length`` header (None: no header), or
    :class:`Refused` (400) when it is not a byte count."""
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()):  # not a number, a sign, a fraction
        raise Refused(400, f"{HEADER_LENGTH} must be a number of bytes (0 or more), got {value!r}")
    return int(text)


def body_reader(request: web.Request) -> BodyReader:
    """The request's :class:`BodyReader`, given by the door; an application served without
    the door reads within the default limits."""
    reader: BodyReader | None = request.get(READER_KEY)
    if reader is None:
        reader = BodyReader(HttpLimits(), BufferBudget(4 * HttpLimits().max_body_size))
    return reader


def model_version(model: ModelConfig, version: str | None) -> str:
    """The version a request names (``version``, from its path) as answered, or
    :class:`Refused` (404) when ``model`` has no such version; no version in the path is
    the model's latest."""
    versions = model.versions
    if version is None:
        return str(max(versions))
    if not (version.isascii() and version.isdigit()) or int(version) not in versions:
        raise Refused(404, f"unknown version {version!r} of model {model.name!r}")
    return str(int(version))


def tensors_over_limit(req: oip.InferRequest, limit: int) -> str | None:
    """Why the input tensors of ``req`` cannot be one MIP message of at most ``limit``
    bytes (the largest tensor named), or None when they can."""
    total = 0
    for tensor in req.inputs:
        size = len(tensor.data)
        if size > limit:
            return (
                f"input tensor {tensor.name!r} takes {size} bytes: over the limit of {limit}"
                f" bytes of a request (mip.max_message_size)"
            )
        total += size
    if total > limit:
        return (
            f"the input tensors take {total} bytes: over the limit of {limit} bytes of a"
            f" request (mip.max_message_size)"
        )
    return None


def unknown_outputs(model: ModelConfig, req: oip.InferRequest) -> str | None:
    """The 400 message of a request asking for an output its model does not declare (None:
    every output asked for is declared, or the model declares none)."""
    if not model.outputs or not req.outputs:
        return None
    declared = {spec.name for spec in model.outputs}
    for wanted in req.outputs:
        if wanted.name not in declared:
            return f"unknown output {wanted.name!r} of model {model.name!r}"
    return None


def failure(outcome: Outcome) -> Refused:
    """The answer to a request that did not end ``ok``: the model's own message (its OIP
    ERROR item) intact, or the outcome's status and reason."""
    return Refused(outcome_status(outcome), outcome_reason(outcome))


class OipRestHandlers:
    """The handlers of the ``/v2`` routes, over what they read: ``dispatcher`` (the models
    served, where requests go), ``readiness`` (the ``/readyz`` document's callable: the
    same truth; None: always ready), ``max_items`` (MIP items per request, the config's
    ``mip.max_items``) and ``max_message_size`` (bytes of the MIP request a body becomes,
    ``mip.max_message_size``)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        readiness: Callable[[str | None], dict[str, Any]] | None = None,
        *,
        max_items: int = DEFAULT_MAX_ITEMS,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        self.dispatcher = dispatcher
        self.readiness = readiness
        self.max_items = max_items
        self.max_message_size = max_message_size

    # ------------------------------------------------------------------ health, metadata

    async def live(self, _request: web.Request) -> web.Response:
        """``GET /v2/health/live``."""
        return json_answer({"live": True})

    async def ready(self, _request: web.Request) -> web.Response:
        """``GET /v2/health/ready``: what ``/readyz`` says."""
        if self.readiness is None:
            return json_answer({"ready": True})
        doc = self.readiness(None)
        if doc["ready"]:
            return json_answer({"ready": True})
        return json_answer({"ready": False, "reasons": doc.get("reasons", [])}, 503)

    async def server(self, _request: web.Request) -> web.Response:
        """``GET /v2``: the server metadata."""
        return json_answer(server_metadata())

    async def model(self, request: web.Request) -> web.Response:
        """``GET /v2/models/NAME[/versions/V]``: the model metadata."""
        try:
            model, _version = self.model_of(request)
        except Refused as refused:
            return error_answer(refused.status, refused.message)
        return json_answer(model_metadata(model))

    async def model_ready(self, request: web.Request) -> web.Response:
        """``GET /v2/models/NAME[/versions/V]/ready``: what ``/readyz?model=NAME`` says."""
        try:
            model, _version = self.model_of(request)
        except Refused as refused:
            return error_answer(refused.status, refused.message)
        if self.readiness is None:
            return json_answer({"name": model.name, "ready": True})
        doc = self.readiness(model.name)
        if doc["ready"]:
            return json_answer({"name": model.name, "ready": True})
        reasons = doc.get("reasons", [])
        return json_answer({"name": model.name, "ready": False, "reasons": reasons}, 503)

    def model_of(self, request: web.Request) -> tuple[ModelConfig, str]:
        """The model the path names and the version answered, or :class:`Refused` (404,
        410)."""
        info = request.match_info
        return self.model_named(info["model"], info.get("version"))

    # ------------------------------------------------------------------ inference

    async def infer(self, request: web.Request) -> web.StreamResponse:
        """``POST /v2/models/NAME[/versions/V]/infer``."""
        try:
            return await self.answer(request)
        except Refused as refused:
            return error_answer(refused.status, refused.message)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        """The inference's answer (see the module docstring), or :class:`Refused`."""
        info = request.match_info
        reader = body_reader(request)
        model, version = self.model_named(info["model"], info.get("version"))
        json_length = header_length(request.headers.get(HEADER_LENGTH))
        body = await reader.read(request)
        response, binary = await self.infer_body(
            model, version, json_length, body, reader, client(request)
        )
        return await send(request, response, binary)

    def model_named(self, name: str, version: str | None) -> tuple[ModelConfig, str]:
        """The model ``name`` and the version answered (``version``: the path's), or
        :class:`Refused` (404, 410)."""
        model = self.dispatcher.models.get(name)
        if model is None:
            raise Refused(*unknown_name(self.dispatcher, name))
        return model, model_version(model, version)

    async def infer_body(
        self,
        model: ModelConfig,
        version: str,
        json_length: int | None,
        body: bytes | bytearray,
        reader: BodyReader,
        client_name: str,
    ) -> tuple[oip.InferResponse, Callable[[str], bool]]:
        """The inference of a request whose ``body`` has been read (``json_length``: its
        binary extension header's value): its response and which of its outputs go binary,
        or :class:`Refused`.  One truth for the aiohttp route (:meth:`answer`) and the HTTP
        door's lean path (:mod:`wirekit.serve.doors.lean`)."""
        req = self.decode(reader, body, json_length)
        rows = model.tensors == "rows"
        wire = self.mip_request(reader, model, req, rows)
        try:
            outcome = await self.dispatcher.submit(
                model.name, Payload(wire=wire), client_name, door=DOOR_OIP_REST
            )
        except UnknownModel:  # removed while the body was read
            raise Refused(*unknown_name(self.dispatcher, model.name)) from None
        if outcome.status != OK:
            raise failure(outcome)
        msg = outcome.response.message
        if type(msg) is not Inference:  # an ``ok`` outcome is an inference response
            raise Refused(502, f"unexpected backend answer: {msg}")
        try:
            outputs, parameters = oip.response_from_mip(msg, rows=rows)
        except oip.BackendError as exc:  # an error item answered as ``ok`` (not classified)
            raise Refused(MODEL_ERROR, str(exc)) from None
        except DecodeError as exc:
            raise Refused(502, f"the backend's answer is not an OIP reply: {exc}") from None
        try:
            outputs = oip.select_outputs(outputs, req.outputs)
        except DecodeError as exc:
            raise Refused(400, str(exc)) from None
        response = oip.InferResponse(model.name, outputs, version, req.id, parameters)
        return response, oip.binary_outputs(req)

    def decode(
        self, reader: BodyReader, body: bytes | bytearray, json_length: int | None
    ) -> oip.InferRequest:
        """The OIP request of ``body`` (``json_length``: its JSON part, binary extension),
        its parsed form charged to the budget first; :class:`Refused` (400) when it is not
        one."""
        if json_length is not None and json_length > len(body):
            raise Refused(
                400,
                f"{HEADER_LENGTH} is {json_length}: more than the {len(body)} bytes of the body",
            )
        reader.hold_json(body if json_length is None else bytes(memoryview(body)[:json_length]))
        try:
            return oip.decode_rest_request(body, json_length)
        except DecodeError as exc:
            raise Refused(400, str(exc)) from None
        except RecursionError:
            raise Refused(400, "the request's JSON is nested too deeply") from None

    def mip_request(
        self, reader: BodyReader, model: ModelConfig, req: oip.InferRequest, rows: bool
    ) -> bytes:
        """The MIP request of ``req`` for ``model``, once it is checked against the model and
        the limits (:class:`Refused` 400 or 413 otherwise) and its copy charged."""
        problem = check_inputs(model, req) or unknown_outputs(model, req)
        if problem is not None:
            raise Refused(400, problem)
        over = tensors_over_limit(req, self.max_message_size)
        if over is not None:
            raise Refused(413, over)
        try:
            count = oip.mip_item_count(req, rows=rows)
        except DecodeError as exc:
            raise Refused(400, str(exc)) from None
        if count > self.max_items:
            raise Refused(
                413,
                f"{count} items exceed the limit of {self.max_items} per request (mip.max_items)",
            )
        size = sum(len(tensor.data) for tensor in req.inputs)
        reader.hold(size, "the tensors copied into the MIP request")
        try:
            wire = oip.request_to_mip(req, rows=rows)
        except DecodeError as exc:
            raise Refused(400, str(exc)) from None
        if len(wire) > self.max_message_size:
            raise Refused(
                413,
                f"the request is a MIP message of {len(wire)} bytes: over the limit of"
                f" {self.max_message_size} (mip.max_message_size)",
            )
        return wire

    async def not_served(self, request: web.Request) -> web.Response:
        """Any other ``/v2`` path (Triton's model configuration, repository, statistics
        extensions...): a 404 an OIP client can read."""
        return error_answer(
            404, f"{request.method} {request.path} is not an endpoint this server serves"
        )

    def add_routes(self, app: web.Application) -> None:
        """Route the ``/v2`` requests of ``app`` to these handlers (any other ``/v2`` path
        to :meth:`not_served`)."""
        router = app.router
        router.add_get("/v2/health/live", self.live)
        router.add_get("/v2/health/ready", self.ready)
        router.add_get("/v2", self.server)
        for base in (
            f"/v2/models/{{model:{SEGMENT}}}",
            f"/v2/models/{{model:{SEGMENT}}}/versions/{{version:{SEGMENT}}}",
        ):
            router.add_get(base, self.model)
            router.add_get(f"{base}/ready", self.model_ready)
            router.add_post(f"{base}/infer", self.infer)
        router.add_route("*", "/v2/{path:.*}", self.not_served)


def client(request: web.Request) -> str:
    """The client of ``request`` as the store records it (as the HTTP door's)."""
    return f"http:{request.remote or '?'}"


def encoded(
    response: oip.InferResponse, binary: Callable[[str], bool]
) -> tuple[str, int | None, list[Any]]:
    """``(content type, binary header value or None, body pieces)`` of ``response``: JSON,
    or with the outputs ``binary`` names in the binary tensor data extension; the pieces
    hold the outputs straight from the backend's reply (never copied into one body).
    :class:`Refused` (400) for an output JSON cannot hold."""
    try:
        body, json_length = oip.encode_rest_response(response, binary=binary)
    except EncodeError as exc:  # an output JSON cannot hold (BYTES that are not UTF-8)
        raise Refused(400, str(exc)) from None
    if json_length is None:
        assert isinstance(body, bytes)  # no binary part: one JSON document
        return "application/json", None, [body]
    pieces = [body] if isinstance(body, bytes) else body
    return OCTET_STREAM, json_length, pieces


async def send(
    request: web.Request, response: oip.InferResponse, binary: Callable[[str], bool]
) -> web.StreamResponse:
    """Answer ``response`` (:func:`encoded`).  A binary answer of :data:`STREAM_FROM` bytes
    or more is written piece by piece; a smaller one is joined first (one write costs less
    than several)."""
    content_type, json_length, pieces = encoded(response, binary)
    if json_length is None:
        return web.Response(body=pieces[0], content_type=content_type)
    headers = {HEADER_LENGTH: str(json_length)}
    size = sum(memoryview(piece).nbytes for piece in pieces)
    if size < STREAM_FROM:
        joined = b"".join(pieces)
        return web.Response(body=joined, content_type=OCTET_STREAM, headers=headers)
    answer = web.StreamResponse(headers=headers)
    answer.content_type = OCTET_STREAM
    answer.content_length = size
    await answer.prepare(request)
    for piece in pieces:
        await answer.write(piece)
    await answer.write_eof()
    return answer


__all__ = [
    "HEADER_LENGTH",
    "MODEL_ERROR",
    "STREAM_FROM",
    "OipRestHandlers",
    "Refused",
    "encoded",
    "error_answer",
    "header_length",
    "json_answer",
    "model_version",
    "send",
]
