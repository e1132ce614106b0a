"""Backends: where the dispatcher forwards a request.  Each has ``async infer(request) ->
response`` (both :class:`~wirekit.serve.payload.Payload`) and ``async close()``.

A backend that cannot be reached, drops the connection or sends bytes that are not MIP raises
:class:`BackendUnavailable`; the dispatcher then resubmits the request to another device and
backs this one off.  A MIP error reply is an answer, returned like any other.

* :class:`MipBackend` — a MIP server (wirekit's, or anything speaking MIP), through the
  pipelined asyncio client of :mod:`wirekit.mip.client`.
* :func:`KubeMoBackend` — KubeMo's server, which answers one message per connection.
"""

from __future__ import annotations

from typing import Protocol

from wirekit.errors import DecodeError, WirekitError
from wirekit.mip.client import AsyncClient
from wirekit.mip.runtime import ClientTimeout, ConnectionLost, UnexpectedReply

from .payload import Payload


class BackendUnavailable(WirekitError, ConnectionError):
    """The backend could not be reached or broke the exchange."""


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
        self._client = AsyncClient(self.address, timeout=timeout, max_in_flight=max_in_flight)

    async def infer(self, request: Payload) -> Payload:
        try:
            reply = await self._client.request(request.message)
        except ClientTimeout:
            raise
        except (ConnectionLost, UnexpectedReply, DecodeError, OSError) as exc:
            raise BackendUnavailable(f"{self.address}: {exc}") from None
        return Payload(None, reply)

    async def close(self) -> None:
        await self._client.close()


def KubeMoBackend(host: str, port: int, *, timeout: float = 60.0) -> MipBackend:
    """KubeMo's MIP server: one request at a time, a connection per request."""
    return MipBackend(host, port, max_in_flight=1, timeout=timeout)
