"""The control plane of the ``oip`` and ``tfserving`` backends: whether a model server and
its model are ready, and the OIP repository extension's load and unload.

Where the data plane (:mod:`wirekit.serve.backends.oip`) sends requests, this module asks the
same servers about themselves, at a :class:`~wirekit.serve.backends.servers.ServerAddress`:

===========  =====================================  ======================================
call         REST (``rest_port``)                   gRPC (only when there is no REST port)
===========  =====================================  ======================================
probe        ``GET /v2/health/ready``, then         ``ServerReady``, then ``ModelReady``
             ``GET /v2/models/{model}/ready``
             (``tfserving``: ``GET /v1/models/
             {model}``, a version ``AVAILABLE``)
load         ``POST /v2/repository/models/          ``RepositoryModelLoad``
             {model}/load``, then model ready
unload       ``POST /v2/repository/models/          ``RepositoryModelUnload``
             {model}/unload``
===========  =====================================  ======================================

Every call is bounded by the ``timeout`` it is given (the whole call: connecting, asking,
and for :func:`load` waiting until the server says the model is ready).  A server that
refuses or fails a load or an unload raises :class:`RepositoryError`, whose text names the
server (``host:port``) and carries the server's own error message intact (the ``error`` of
an OIP error body; the last line of a Python traceback a server sent as its body).

The repository RPCs over gRPC are those of ``inference.GRPCInferenceService`` (Triton's
layout: ``repository_name`` = 1, ``model_name`` = 2, which MLServer follows); KServe's
``ModelServer`` declares the same RPCs with ``model_name`` = 1, so a server whose
``ServerMetadata`` names itself ``kserve`` gets its model's name in field 1 (and, since
KServe 0.21 answers ``INTERNAL`` to these calls whether they worked or not, its model's
readiness says whether they did).  TF Serving has no repository API: a ``tfserving``
backend is probed, never loaded.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from wirekit.errors import WirekitError

from ..control.catalog import CatalogError

if TYPE_CHECKING:
    from .servers import ServerAddress

T = TypeVar("T")

#: characters of a server's error message kept in a :class:`RepositoryError` or a probe's
#: reason (a whole traceback is cut to its last line first)
MESSAGE_LIMIT = 1000
#: seconds between two readiness checks while :func:`load` waits for the model
READY_POLL = 0.1


class RepositoryError(WirekitError, RuntimeError):
    """A model server refused or failed a load or an unload (or could not be asked in
    time); ``str()`` says which server (``host:port``) and why, in the server's words."""


class ModelLoadError(CatalogError):
    """A model's servers did not all load it: nothing was added.  ``results``: row key ->
    ``loaded`` / ``already loaded`` / ``failed: <the server's reason>`` (those loaded by
    this attempt were unloaded again: ``rollback`` says how that went)."""

    def __init__(self, name: str, results: dict[str, str], rollback: dict[str, str]) -> None:
        self.results = results
        self.rollback = rollback
        failed = sum(1 for r in results.values() if r.startswith("failed"))
        parts = []
        for key, result in results.items():
            if key in rollback:
                result += f" (then {rollback[key]})"
            parts.append(f"{key}: {result}")
        super().__init__(
            f"model {name!r} not added: its load failed on {failed} of {len(results)}"
            f" device(s): " + "; ".join(parts)
        )


def where(address: ServerAddress) -> str:
    """``host:port`` of the port this module talks to (REST, else gRPC ``(gRPC)``)."""
    host = f"[{address.host}]" if ":" in address.host else address.host
    if address.rest_port is not None:
        return f"{host}:{address.rest_port}"
    return f"{host}:{address.grpc_port} (gRPC)"


def server_message(body: bytes, limit: int = MESSAGE_LIMIT) -> str:
    """A server's error message from its answer's body: the ``error`` (OIP) or ``detail``
    (FastAPI's validation answer) of a JSON object, else the text -- a Python traceback cut
    to its last line, the exception itself; at most ``limit`` characters."""
    text = body.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        for key in ("error", "detail", "message"):
            if key in doc:
                value = doc[key]
                text = value if isinstance(value, str) else json.dumps(value)
                break
    if text.startswith("Traceback (most recent call last)"):
        lines = [line for line in text.splitlines() if line.strip()]
        text = lines[-1].strip()
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _why(exc: BaseException) -> str:
    """A failure to reach a server, in a few words."""
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer in time"
    if callable(getattr(exc, "details", None)) and callable(getattr(exc, "code", None)):
        return _grpc_text(exc)  # a gRPC error
    text = getattr(exc, "strerror", None) or str(exc)
    os_error = getattr(exc, "os_error", exc)  # aiohttp's ClientConnectorError wraps one
    if isinstance(os_error, OSError) and os_error.errno:
        text = os.strerror(os_error.errno)
    return text or type(exc).__name__


async def _bounded(call: Awaitable[T], timeout: float) -> T:
    return await asyncio.wait_for(call, timeout)


# --- REST ---------------------------------------------------------------------------------


async def _rest(
    address: ServerAddress, method: str, path: str, timeout: float
) -> tuple[int, bytes]:
    """One HTTP call to the server's REST port: (status, body).  Raises what aiohttp
    raises, or :class:`asyncio.TimeoutError`."""
    import aiohttp

    limit = aiohttp.ClientTimeout(total=timeout)
    async with (
        aiohttp.ClientSession(timeout=limit) as session,
        session.request(method, address.rest_url + path) as resp,
    ):
        return resp.status, await resp.read()


def _model_path(address: ServerAddress) -> str:
    return quote(address.model, safe="")


async def _rest_probe(address: ServerAddress, timeout: float) -> str | None:
    model = _model_path(address)
    if address.kind == "tfserving":
        status, body = await _rest(address, "GET", f"/v1/models/{model}", timeout)
        if status != 200:
            return f"model {address.model!r} not ready (HTTP {status}: {server_message(body)})"
        return _tfserving_status(address, body)
    status, body = await _rest(address, "GET", "/v2/health/ready", timeout)
    if status != 200:
        text = server_message(body)
        return "server not ready (HTTP " + str(status) + (f": {text})" if text else ")")
    status, body = await _rest(address, "GET", f"/v2/models/{model}/ready", timeout)
    if status != 200:
        text = server_message(body)
        return f"model {address.model!r} not ready (HTTP {status}" + (f": {text})" if text else ")")
    return None


def _tfserving_status(address: ServerAddress, body: bytes) -> str | None:
    """None when TF Serving's model status (``GET /v1/models/NAME``) has a version
    ``AVAILABLE`` (or, as KServe's V1 protocol answers, ``"ready": true``); else why not."""
    try:
        doc = json.loads(body)
    except ValueError:
        return f"model {address.model!r}: the model status is not JSON"
    if not isinstance(doc, dict):
        return f"model {address.model!r}: the model status is not a JSON object"
    if doc.get("ready") is True:
        return None
    versions = doc.get("model_version_status")
    if isinstance(versions, list):
        states = [v for v in versions if isinstance(v, dict)]
        if any(v.get("state") == "AVAILABLE" for v in states):
            return None
        said = ", ".join(f"version {v.get('version')} {v.get('state')}" for v in states)
        return f"model {address.model!r} not ready ({said or 'no version'})"
    return f"model {address.model!r} not ready ({server_message(body)})"


# --- gRPC ---------------------------------------------------------------------------------

_SERVICE = "/inference.GRPCInferenceService/"


def _string_field(number: int, text: str) -> bytes:
    """One protobuf string field (wire type 2): the repository RPCs' requests are one or
    two of them."""
    data = text.encode()
    out = bytearray([(number << 3) | 2])
    n = len(data)
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + data


def _grpc_text(exc: Any) -> str:
    """A gRPC error: its status code's name and the server's details, intact."""
    code = exc.code()
    details = exc.details() or ""
    if len(details) > MESSAGE_LIMIT:
        details = details[: MESSAGE_LIMIT - 3] + "..."
    name = code.name if code is not None else "UNKNOWN"
    return f"{name}: {details}" if details else name


async def _grpc(
    address: ServerAddress,
    timeout: float,
    work: Callable[[Any], Awaitable[T]],
) -> T:
    """Run ``work(channel)`` on a channel to the server's gRPC port, closed after."""
    import grpc

    async with grpc.aio.insecure_channel(address.grpc_target) as channel:
        return await _bounded(work(channel), timeout)


def _unary(channel: Any, method: str, response: Any = None) -> Any:
    from wirekit.oip.grpc import messages

    if response is None:
        return channel.unary_unary(
            _SERVICE + method,
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
    return channel.unary_unary(
        _SERVICE + method,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=getattr(messages, response).FromString,
    )


async def _grpc_probe(address: ServerAddress, timeout: float) -> str | None:
    import grpc

    from wirekit.oip.grpc import messages

    async def work(channel: Any) -> str | None:
        try:
            ready = await _unary(channel, "ServerReady", "ServerReadyResponse")(
                messages.ServerReadyRequest(), timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            return f"server not ready ({_grpc_text(exc)})"
        if not ready.ready:
            return "server not ready (ServerReady: false)"
        try:
            ready = await _unary(channel, "ModelReady", "ModelReadyResponse")(
                messages.ModelReadyRequest(name=address.model), timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            return f"model {address.model!r} not ready ({_grpc_text(exc)})"
        if not ready.ready:
            return f"model {address.model!r} not ready (ModelReady: false)"
        return None

    return await _grpc(address, timeout, work)


async def _grpc_repository(address: ServerAddress, method: str, timeout: float) -> None:
    """``RepositoryModelLoad`` or ``RepositoryModelUnload`` of the address's model: the
    model's name in field 2 (Triton's and MLServer's layout), or field 1 for a server whose
    ``ServerMetadata`` says ``kserve``.  Raises :class:`grpc.aio.AioRpcError`.

    KServe 0.21 answers ``INTERNAL`` ("Internal server error") to every such call, done or
    not (its servicer reads the result of a load that returns nothing): from a ``kserve``
    server an ``INTERNAL`` is taken for done when ``ModelReady`` then says what was asked."""
    import grpc

    from wirekit.oip.grpc import messages

    async def work(channel: Any) -> None:
        meta = await _unary(channel, "ServerMetadata", "ServerMetadataResponse")(
            messages.ServerMetadataRequest(), timeout=timeout
        )
        kserve = meta.name.lower() == "kserve"
        try:
            await _unary(channel, method)(
                _string_field(1 if kserve else 2, address.model), timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            if not kserve or exc.code() != grpc.StatusCode.INTERNAL:
                raise
            try:
                answer = await _unary(channel, "ModelReady", "ModelReadyResponse")(
                    messages.ModelReadyRequest(name=address.model), timeout=timeout
                )
                ready = bool(answer.ready)
            except grpc.aio.AioRpcError:
                ready = False
            if ready != (method == "RepositoryModelLoad"):
                raise exc from None

    await _grpc(address, timeout, work)


# --- the calls ----------------------------------------------------------------------------


async def probe(address: ServerAddress, timeout: float) -> str | None:
    """None when the server at ``address`` is ready and so is its model; else why not, in
    a line naming ``host:port``.  Bounded by ``timeout`` seconds (the whole probe)."""
    try:
        if address.rest_port is not None:
            why = await _bounded(_rest_probe(address, timeout), timeout)
        elif address.grpc_port is not None and address.kind == "oip":
            why = await _grpc_probe(address, timeout)
        else:
            return f"{address.host}: no port to probe"
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # connection refused, reset, no answer in time, not HTTP
        why = _why(exc)
    return None if why is None else f"{where(address)}: {why}"


async def model_ready(address: ServerAddress, timeout: float) -> bool:
    """Whether the server at ``address`` says its model is ready (REST: ``GET
    /v2/models/{model}/ready`` answers 200; gRPC: ``ModelReady``; ``tfserving``: a version
    ``AVAILABLE``).  Raises :class:`RepositoryError` when the server cannot be asked within
    ``timeout`` seconds."""
    model = _model_path(address)
    try:
        if address.rest_port is not None:
            if address.kind == "tfserving":
                status, body = await _bounded(
                    _rest(address, "GET", f"/v1/models/{model}", timeout), timeout
                )
                return status == 200 and _tfserving_status(address, body) is None
            status, _body = await _bounded(
                _rest(address, "GET", f"/v2/models/{model}/ready", timeout), timeout
            )
            return status == 200
        if address.grpc_port is None:
            raise RepositoryError(f"{address.host}: no port to ask")
        return await _grpc_model_ready(address, timeout)
    except (asyncio.CancelledError, RepositoryError):
        raise
    except Exception as exc:
        raise RepositoryError(f"{where(address)}: cannot be asked: {_why(exc)}") from None


async def _grpc_model_ready(address: ServerAddress, timeout: float) -> bool:
    import grpc

    from wirekit.oip.grpc import messages

    async def work(channel: Any) -> bool:
        try:
            ready = await _unary(channel, "ModelReady", "ModelReadyResponse")(
                messages.ModelReadyRequest(name=address.model), timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            # the server answered, with an error: the model is not ready there (MLServer
            # says UNKNOWN for a model it does not have, others NOT_FOUND)
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            return False
        return bool(ready.ready)

    return await _grpc(address, timeout, work)


async def _repository(address: ServerAddress, action: str, timeout: float) -> None:
    """POST the repository extension's ``load`` or ``unload`` of the address's model (gRPC
    when there is no REST port); :class:`RepositoryError` unless the server says done."""
    if address.kind != "oip":
        raise RepositoryError(
            f"{where(address)}: a {address.kind} server has no repository API to {action}"
            f" model {address.model!r}"
        )
    prefix = f"{where(address)}: {action} of model {address.model!r}"
    if address.rest_port is not None:
        path = f"/v2/repository/models/{_model_path(address)}/{action}"
        try:
            status, body = await _bounded(_rest(address, "POST", path, timeout), timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise RepositoryError(f"{prefix} failed: {_why(exc)}") from None
        if status != 200:
            text = server_message(body)
            raise RepositoryError(
                f"{prefix} refused: HTTP {status}" + (f": {text}" if text else "")
            )
        return
    import grpc

    method = "RepositoryModelLoad" if action == "load" else "RepositoryModelUnload"
    try:
        await _grpc_repository(address, method, timeout)
    except grpc.aio.AioRpcError as exc:
        unreachable = exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        said = "failed" if unreachable else "refused"
        raise RepositoryError(f"{prefix} {said}: {_grpc_text(exc)}") from None
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        raise RepositoryError(f"{prefix} failed: {_why(exc)}") from None


async def load(address: ServerAddress, timeout: float) -> None:
    """Ask the server at ``address`` to load its model (repository extension), then wait
    until it says the model is ready; all within ``timeout`` seconds.  Raises
    :class:`RepositoryError` (the server's reason, or that it did not get ready in time)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout
    await _repository(address, "load", timeout)
    last = "not ready"
    while True:
        left = until - loop.time()
        if left <= 0:
            raise RepositoryError(
                f"{where(address)}: model {address.model!r} loaded but not ready within"
                f" {timeout:g} s ({last})"
            )
        try:
            if await model_ready(address, left):
                return
        except RepositoryError as exc:
            last = str(exc)
        await asyncio.sleep(min(READY_POLL, max(0.0, until - loop.time())))


async def unload(address: ServerAddress, timeout: float) -> None:
    """Ask the server at ``address`` to unload its model (repository extension), within
    ``timeout`` seconds.  Raises :class:`RepositoryError` (the server's reason)."""
    await _repository(address, "unload", timeout)


__all__ = [
    "ModelLoadError",
    "RepositoryError",
    "load",
    "model_ready",
    "probe",
    "server_message",
    "unload",
    "where",
]
