"""Backends: where the dispatcher forwards a request.  Each has ``async infer(request) ->
response`` (both :class:`~wirekit.serve.payload.Payload`) and ``async close()``.

A backend that cannot be reached, drops the connection or sends bytes that are not MIP raises
:class:`BackendUnavailable`; the dispatcher then resubmits the request to another device and
backs this one off.  A MIP error reply is an answer, returned like any other.

* :class:`MipBackend` — a MIP server that keeps connections open (wirekit's): a pool of
  connections, one request at a time on each.
* :class:`KubeMoBackend` — KubeMo's server, which answers one message per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from wirekit import mip
from wirekit.errors import DecodeError, WirekitError

from .payload import Payload

MAX_REPLY_SIZE = mip.DEFAULT_MAX_MESSAGE_SIZE


class BackendUnavailable(WirekitError, ConnectionError):
    """The backend could not be reached or broke the exchange."""


class Backend(Protocol):
    """What the dispatcher needs from a backend."""

    async def infer(self, request: Payload) -> Payload: ...

    async def close(self) -> None: ...


async def _read_reply(reader: asyncio.StreamReader, where: str) -> Payload:
    try:
        header = await reader.readexactly(mip.HEADER_SIZE)
        _kind, _subtype, remaining = mip.check_header(header)
        if mip.HEADER_SIZE + remaining > MAX_REPLY_SIZE:
            raise BackendUnavailable(f"{where}: reply of {remaining} bytes is over the limit")
        body = await reader.readexactly(remaining) if remaining else b""
    except asyncio.IncompleteReadError:
        raise BackendUnavailable(f"{where}: connection closed mid-reply") from None
    except DecodeError as exc:
        raise BackendUnavailable(f"{where}: bad reply: {exc}") from None
    wire = header + body
    try:
        message = mip.decode(wire)
    except DecodeError as exc:
        raise BackendUnavailable(f"{where}: bad reply: {exc}") from None
    return Payload(wire, message)


class MipBackend:
    """A pool of at most ``max_connections`` connections to one MIP server."""

    def __init__(self, host: str, port: int, *, max_connections: int = 16) -> None:
        self.host = host
        self.port = port
        self.where = f"mip://{host}:{port}"
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            raise BackendUnavailable(f"{self.where}: {exc.strerror or exc}") from None

    async def infer(self, request: Payload) -> Payload:
        async with self._slots:
            conn = self._idle.pop() if self._idle else await self._connect()
            reader, writer = conn
            ok = False
            try:
                writer.write(request.wire)
                reply = await _read_reply(reader, self.where)
                ok = True
                return reply
            except OSError as exc:
                raise BackendUnavailable(f"{self.where}: {exc.strerror or exc}") from None
            finally:
                # A connection whose exchange did not finish (timeout, error) is out of step:
                # a late reply would be read as the answer to the next request.
                if ok and not self._closed and not reader.at_eof():
                    self._idle.append(conn)
                else:
                    writer.close()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for _reader, writer in idle:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class KubeMoBackend:
    """KubeMo's MIP server: a new connection per request, closed by the server after it."""

    def __init__(self, host: str, port: int, *, max_connections: int = 16) -> None:
        self.host = host
        self.port = port
        self.where = f"kubemo://{host}:{port}"
        self._slots = asyncio.Semaphore(max_connections)

    async def infer(self, request: Payload) -> Payload:
        async with self._slots:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError as exc:
                raise BackendUnavailable(f"{self.where}: {exc.strerror or exc}") from None
            try:
                writer.write(request.wire)
                return await _read_reply(reader, self.where)
            except OSError as exc:
                raise BackendUnavailable(f"{self.where}: {exc.strerror or exc}") from None
            finally:
                writer.close()

    async def close(self) -> None:
        return None
