"""The Open Inference Protocol's gRPC door (``inference.GRPCInferenceService``, grpc.aio in
the service's own event loop), on a port of its own (``listen.grpc_port``).

ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and ModelInfer are
served; every other method of the service (model repository, streaming, statistics, shared
memory) is answered UNIMPLEMENTED by gRPC itself.  A ModelInfer request goes the way of an
OIP REST request: its tensors (:func:`wirekit.oip.grpc.request_from_grpc`) are checked
against the model's declared inputs, mapped onto MIP items
(:func:`wirekit.oip.request_to_mip`, the model's ``tensors`` rule) and submitted to the
dispatcher, which records it; the answer's tensors come back from the MIP reply
(:func:`wirekit.oip.response_from_mip`) as ``raw_output_contents``.

What is refused, and how (a refusal before the dispatcher is answered at once and, as the
HTTP door's refusals, not recorded):

=========================================  ================================================
a message over ``grpc.max_message_size``   RESOURCE_EXHAUSTED (gRPC itself)
more than ``grpc.max_in_flight`` RPCs      RESOURCE_EXHAUSTED (gRPC itself)
the memory budget cannot hold the request  RESOURCE_EXHAUSTED (the HTTP door's message)
more MIP items than ``mip.max_items``      RESOURCE_EXHAUSTED
an unknown (or removed) model, a version   NOT_FOUND
it does not declare
a message that is not a ModelInferRequest,  INVALID_ARGUMENT naming the tensor or field
tensors that do not match their shape or
the model's declared inputs, an unknown
output asked for
=========================================  ================================================

An outcome of the dispatcher that is not ``ok`` gets the HTTP door's status, as a gRPC code
(specs/oip.md): 400 INVALID_ARGUMENT, 413 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504
DEADLINE_EXCEEDED, 502 INTERNAL; an OIP error a MIP model answered, INVALID_ARGUMENT with its
message (as REST answers it: 400).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError as ProtobufDecodeError

from wirekit import oip
from wirekit.errors import DecodeError
from wirekit.mip.limits import BufferBudget
from wirekit.oip import metadata
from wirekit.oip.grpc import messages as pb
from wirekit.oip.grpc.convert import (
    encode_response,
    metadata_to_grpc,
    request_from_grpc,
    split_raw_inputs,
)

from ..config import GrpcLimits, ModelConfig
from ..control.metrics import DOOR_OIP_GRPC
from ..dispatch.dispatcher import MODEL_ERROR, Dispatcher, Outcome, UnknownModel
from ..dispatch.payload import Payload
from .answers import outcome_reason, outcome_status, unknown_name
from .httpbody import Charge

#: the HTTP status of a refusal or an outcome -> the gRPC code it is answered with
STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    410: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    500: grpc.StatusCode.INTERNAL,
    502: grpc.StatusCode.INTERNAL,
}


def unknown_model(dispatcher: Dispatcher, name: str) -> str:
    """The message of the NOT_FOUND for a model ``name`` not served (removed or never)."""
    return unknown_name(dispatcher, name)[1]


class Refusal(Exception):
    """A request answered with a gRPC error: ``code`` and the message for the client."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _outcome_message(outcome: Outcome) -> str:
    """What the client reads of an outcome that is not ``ok``: why, and the request's id."""
    return f"{outcome_reason(outcome)} (request {outcome.id})"


def _bad(exc: DecodeError) -> Refusal:
    """INVALID_ARGUMENT for a request the OIP codecs refused (its field, and why)."""
    return Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"{exc.field}: {exc.reason}")


def client_name(context: grpc.aio.ServicerContext) -> str:
    """The request record's client: ``grpc:`` and the peer's address (``ipv4:1.2.3.4:5``:
    its host)."""
    peer = context.peer() or "?"
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        address = address.rsplit(":", 1)[0]
        return f"grpc:{address.strip('[]')}"
    return f"grpc:{peer}"


class OipGrpcHandlers:
    """The RPCs of ``inference.GRPCInferenceService`` over what they read: ``dispatcher``
    (the models served, where requests go), ``budget`` (the process's memory budget),
    ``max_items`` (MIP items per request, ``mip.max_items``) and ``readiness`` (the
    ``/readyz`` document: ``readiness(model)``, None for every model)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        budget: BufferBudget,
        *,
        max_items: int,
        readiness: Callable[[str | None], dict[str, Any]] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.budget = budget
        self.max_items = max_items
        self.readiness = readiness

    # ------------------------------------------------------------------ the model asked for

    def _model(self, name: str, version: str) -> ModelConfig:
        """The config of the model ``name`` at ``version`` ("" any), or NOT_FOUND."""
        cfg = self.dispatcher.models.get(name)
        if cfg is None:
            raise Refusal(grpc.StatusCode.NOT_FOUND, unknown_model(self.dispatcher, name))
        if version and not (
            version.isascii() and version.isdigit() and int(version) in cfg.versions
        ):
            raise Refusal(
                grpc.StatusCode.NOT_FOUND,
                f"unknown version {version!r} of model {name!r} (its versions: "
                f"{', '.join(str(v) for v in cfg.versions)})",
            )
        return cfg

    def _ready(self, model: str | None) -> bool:
        return self.readiness is None or bool(self.readiness(model)["ready"])

    # ------------------------------------------------------------------ the RPCs

    async def server_live(self, _request: Any, _context: grpc.aio.ServicerContext) -> Any:
        """ServerLive: the process answers."""
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, _request: Any, _context: grpc.aio.ServicerContext) -> Any:
        """ServerReady: ``/readyz``'s truth."""
        return pb.ServerReadyResponse(ready=self._ready(None))

    async def model_ready(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """ModelReady: ``/readyz?model=NAME``'s truth (NOT_FOUND: no such model, version)."""
        try:
            self._model(request.name, request.version)
        except Refusal as refusal:
            await context.abort(refusal.code, refusal.message)
        return pb.ModelReadyResponse(ready=self._ready(request.name))

    async def server_metadata(self, _request: Any, _context: grpc.aio.ServicerContext) -> Any:
        """ServerMetadata: :func:`wirekit.oip.metadata.server_metadata`."""
        doc = metadata.server_metadata()
        return pb.ServerMetadataResponse(
            name=doc["name"], version=doc["version"], extensions=doc["extensions"]
        )

    async def model_metadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """ModelMetadata: what the config declares of the model."""
        try:
            cfg = self._model(request.name, request.version)
        except Refusal as refusal:
            await context.abort(refusal.code, refusal.message)
        return metadata_to_grpc(pb.ModelMetadataResponse, metadata.model_metadata(cfg))

    async def model_infer(self, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """ModelInfer: ``body`` is the serialized request (parsed here, once it is charged to
        the memory budget); the answer, serialized."""
        charge = Charge(self.budget)
        try:
            return await self._infer(body, charge, context)
        except Refusal as refusal:
            await context.abort(refusal.code, refusal.message)
            raise  # not reached: abort raises
        finally:
            charge.release()

    def _hold(self, charge: Charge, size: int, what: str) -> None:
        """Charge ``size`` bytes for ``what`` to the memory budget, or RESOURCE_EXHAUSTED
        (the HTTP door's messages)."""
        if charge.grow(size):
            return
        limit = self.budget.limit
        if not charge.fits_ever(size):
            message = (
                f"{what} would take {size} bytes: over the process's memory budget of {limit} bytes"
            )
        else:
            message = (
                f"{what} would take {size} bytes: the process's memory budget ({limit}"
                f" bytes) is taken by other requests, try again"
            )
        raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, message)

    async def _infer(self, body: bytes, charge: Charge, context: grpc.aio.ServicerContext) -> bytes:
        self._hold(charge, len(body), "the request")
        try:  # the tensors' bytes stay in ``body``: protobuf parses the rest
            head, raw_inputs = split_raw_inputs(body)
            msg = pb.ModelInferRequest.FromString(head)
        except (DecodeError, ProtobufDecodeError) as exc:
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT, f"not a ModelInferRequest: {exc}"
            ) from None
        model = msg.model_name
        cfg = self._model(model, msg.model_version)
        version = msg.model_version or str(max(cfg.versions))  # "": the latest
        rows = cfg.tensors == "rows"
        try:
            req = request_from_grpc(msg, raw_inputs)
            for i, tensor in enumerate(req.inputs):
                oip.check_tensor(tensor, f"inputs[{i}]")
        except DecodeError as exc:
            raise _bad(exc) from None
        problem = metadata.check_inputs(cfg, req)
        if problem is not None:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, problem)
        try:
            items = oip.mip_item_count(req, rows=rows)
            if items > self.max_items:
                raise Refusal(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{items} items exceed the limit of {self.max_items} per request"
                    " (mip.max_items)",
                )
            wire = oip.request_to_mip(req, rows=rows)
        except DecodeError as exc:
            raise _bad(exc) from None
        self._hold(charge, len(wire), "the request's MIP items")
        try:
            outcome = await self.dispatcher.submit(
                model, Payload(wire=wire), client_name(context), door=DOOR_OIP_GRPC
            )
        except UnknownModel:  # removed while the request was read
            raise Refusal(
                grpc.StatusCode.NOT_FOUND, unknown_model(self.dispatcher, model)
            ) from None
        if outcome.cause == MODEL_ERROR:  # the model's own OIP error: its message, intact
            raise Refusal(STATUS_CODES[outcome_status(outcome)], outcome.detail)
        if not outcome.ok:
            raise Refusal(STATUS_CODES[outcome_status(outcome)], _outcome_message(outcome))
        try:
            outputs, parameters = oip.response_from_mip(outcome.response.message, rows=rows)
        except oip.BackendError as exc:  # the model's own OIP error (a reply the dispatcher
            # did not classify: one of several rows): its message, as REST answers it
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except DecodeError as exc:
            raise Refusal(
                grpc.StatusCode.INTERNAL, f"the backend's answer is not OIP tensors: {exc}"
            ) from None
        try:
            selected = oip.select_outputs(outputs, req.outputs)
        except DecodeError as exc:
            raise _bad(exc) from None
        return encode_response(pb.ModelInferResponse, model, version, req.id, selected, parameters)

    def service(self) -> grpc.GenericRpcHandler:
        """The generic handler of ``inference.GRPCInferenceService`` (its methods but
        ModelInfer parse their small requests with the message classes; ModelInfer gets the
        bytes, to charge them before parsing)."""

        def unary(fn: Any, request: Any | None, response: bool) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn,
                request_deserializer=None if request is None else request.FromString,
                response_serializer=(lambda m: m.SerializeToString()) if response else None,
            )

        return grpc.method_handlers_generic_handler(
            pb.SERVICE,
            {
                "ServerLive": unary(self.server_live, pb.ServerLiveRequest, True),
                "ServerReady": unary(self.server_ready, pb.ServerReadyRequest, True),
                "ModelReady": unary(self.model_ready, pb.ModelReadyRequest, True),
                "ServerMetadata": unary(self.server_metadata, pb.ServerMetadataRequest, True),
                "ModelMetadata": unary(self.model_metadata, pb.ModelMetadataRequest, True),
                "ModelInfer": unary(self.model_infer, None, False),
            },
        )


class GrpcDoor:
    """The gRPC server of :class:`OipGrpcHandlers` (grpc.aio, in the running loop), within
    ``limits`` (the ``grpc`` table)."""

    def __init__(self, handlers: OipGrpcHandlers, limits: GrpcLimits) -> None:
        self.handlers = handlers
        self.limits = limits
        self._server: grpc.aio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host``:``port`` (0: any free port); the port bound.  OSError when it
        cannot listen."""
        limits = self.limits
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limits.max_message_size),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),  # a port in use is an error, as the HTTP door's
            ],
            maximum_concurrent_rpcs=limits.max_in_flight,
        )
        server.add_generic_rpc_handlers((self.handlers.service(),))
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc's way of saying the port is taken
            raise OSError(f"gRPC door on {address}: {exc}") from None
        if not bound:
            raise OSError(f"gRPC door on {address}: cannot listen")
        await server.start()
        self._server = server
        return bound

    async def stop(self, grace: float = 5.0) -> None:
        """Stop listening; RPCs in flight have ``grace`` seconds to finish."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)


__all__ = ["STATUS_CODES", "GrpcDoor", "OipGrpcHandlers", "Refusal", "client_name"]
