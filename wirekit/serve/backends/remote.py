"""Backends: where the dispatcher forwards a request.  Each has ``async infer(request) ->
response`` (both :class:`~wirekit.serve.dispatch.payload.Payload`) and ``async close()``.

A backend that cannot be reached, drops the connection or sends bytes that are not MIP raises
:class:`BackendUnavailable`; the dispatcher then resubmits the request to another device and
backs this one off.  A MIP error reply is an answer, returned like any other.  A request
the backend cannot take as it is (inputs of a type its model does not take) raises
:class:`BadRequest`: the client's error, answered at once, neither resubmitted nor counted
against the device.

* :class:`MipBackend` — a MIP server (wirekit's, or anything speaking MIP), through the
  pipelined asyncio client of :mod:`wirekit.mip.client`.
* :func:`KubeMoBackend` — KubeMo's server, which answers one message per connection.
* :class:`ClipperBackend` — Clipper containers connected to the dispatcher's own Clipper
  RPC port (the embedded :mod:`wirekit.clipper.frontend`).
"""

from __future__ import annotations

from typing import Any, Protocol

from wirekit.errors import DecodeError, WirekitError
from wirekit.mip import ErrorCode, ErrorReply, Inference, Item, ItemType
from wirekit.mip.client import AsyncClient
from wirekit.mip.runtime import ClientTimeout, ConnectionLost, UnexpectedReply

from ..dispatch.payload import Payload


class BackendUnavailable(WirekitError, ConnectionError):
    """The backend could not be reached or broke the exchange."""


class BadRequest(WirekitError, ValueError):
    """The request's inputs are not what the backend's model takes (a Clipper container's
    input type, one input per sample): the client's error, with a message that says so."""


class Backend(Protocol):
    """What the dispatcher needs from a backend."""

    async def infer(self, request: Payload) -> Payload: ...

    async def close(self) -> None: ...


class MipBackend:
    """A MIP server, through wirekit's pipelined :class:`~wirekit.mip.client.AsyncClient`.

    Requests are pipelined on one connection (at most ``max_in_flight`` at a time); a call
    the dispatcher gives up on leaves its slot behind, so a late reply is dropped rather than
    taken for the next one.  KubeMo's server, which answers one message per connection, is
    the same thing with ``max_in_flight=1`` (the client reconnects after each answer).
    """

    def __init__(
        self, host: str, port: int, *, max_in_flight: int = 128, timeout: float = 60.0
    ) -> None:
        host_part = f"[{host}]" if ":" in host else host
        self.address = f"tcp://{host_part}:{port}"
        #: the client's own deadline bounds each call (raising a TimeoutError), so the
        #: dispatcher need not arm a second timer for the same timeout
        self.enforces_timeout = True
        #: a MIP server takes any batch: the dispatcher may join requests (``max_batch``)
        self.batchable = True
        self._client = AsyncClient(self.address, timeout=timeout, max_in_flight=max_in_flight)

    @property
    def timeout(self) -> float:
        """Seconds one call may take; set it to change the deadline of the calls made from
        then on (those in flight keep theirs)."""
        return self._client.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._client.timeout = seconds

    async def infer(self, request: Payload) -> Payload:
        try:
            wire, reply = await self._client.request_wire(request.wire)
        except ClientTimeout:
            raise
        except (ConnectionLost, UnexpectedReply, DecodeError, OSError) as exc:
            raise BackendUnavailable(f"{self.address}: {exc}") from None
        return Payload(wire, reply)  # the bytes go back to a MIP client as they came

    @property
    def in_flight(self) -> int:
        """Requests sent to this server and not answered yet (the client's slots held)."""
        return self._client.in_flight

    @property
    def lane_client(self) -> AsyncClient | None:
        """The pipelined client the dispatcher's MIP lane sends through (None for a
        one-at-a-time server such as KubeMo's, which the lane does not serve)."""
        return self._client if self._client.max_in_flight > 1 else None

    def send_nowait(self, wire: bytes, callback) -> bool:
        """The dispatcher's fast path: see :meth:`AsyncClient.send_nowait`."""
        return self._client.send_nowait(wire, callback)

    async def close(self) -> None:
        await self._client.close()


def KubeMoBackend(host: str, port: int, *, timeout: float = 60.0) -> MipBackend:
    """KubeMo's MIP server: one request at a time, a connection per request."""
    return MipBackend(host, port, max_in_flight=1, timeout=timeout)


class ClipperBackend:
    """Clipper containers of one device, registered with the dispatcher's embedded Clipper
    frontend (:class:`wirekit.clipper.frontend.Frontend`) under ``name``.

    A MIP request maps to one Clipper batch: each sample must have one input item.  TEXT is a
    string input, a JSON list of numbers a numeric input (converted to the container's type),
    a JSON string a string, other JSON its text, any other item type raw bytes.  Outputs come
    back as TEXT items (Clipper 2017/v3 strings) or JSON numbers (2016).  No container
    registered, or the frontend failing the batch, is "unavailable" (resubmitted elsewhere);
    inputs a container cannot take are a :class:`BadRequest`.
    """

    def __init__(self, frontend: Any, name: str, *, timeout: float = 60.0) -> None:
        self.frontend = frontend
        self.name = name
        self.timeout = timeout
        self.in_flight = 0  #: requests sent to the containers and not answered yet

    async def infer(self, request: Payload) -> Payload:
        self.in_flight += 1
        try:
            return await self._infer(request)
        finally:
            self.in_flight -= 1

    async def _infer(self, request: Payload) -> Payload:
        from wirekit.clipper.session import InputTypeMismatch, PredictionError

        msg = request.message
        if not isinstance(msg, Inference):
            return Payload(None, ErrorReply(int(ErrorCode.SHAPE)))
        if msg.n_input != 1:
            raise BadRequest(
                f"a Clipper model takes one input per sample; these samples have {msg.n_input}"
            )
        if not any(r.alive for r in self.frontend.replicas(self.name)):
            raise BackendUnavailable(f"clipper:{self.name}: no container registered")
        inputs = [_clipper_input(item) for item in msg.items]
        try:
            outputs = await self.frontend.apredict(self.name, inputs, self.timeout)
        except InputTypeMismatch as exc:
            raise BadRequest(str(exc)) from None
        except PredictionError as exc:
            raise BackendUnavailable(f"clipper:{self.name}: {exc}") from None
        if hasattr(outputs, "tolist"):
            outputs = outputs.tolist()
        if len(outputs) != msg.batch_size:
            raise BackendUnavailable(
                f"clipper:{self.name}: {len(outputs)} outputs for {msg.batch_size} inputs"
            )
        rows = [[Item.text(o) if isinstance(o, str) else Item.json(o)] for o in outputs]
        return Payload(None, Inference.reply(rows, n_input=1))

    async def close(self) -> None:
        return None


def _clipper_input(item: Item) -> Any:
    if item.type == ItemType.TEXT:
        return item.as_text()
    if item.type == ItemType.JSON:
        value = item.as_json()
        if isinstance(value, str | list):
            return value
        return item.as_text()
    return item.as_bytes()
