"""A lean HTTP/1.1 client for the model-server backends: keep-alive connections to one
server, at most ``limit`` open, one request at a time on each (no pipelining).

Why not aiohttp's client: per request it builds request and response objects, a header
multidict, a timer context and a payload writer -- about as much CPU as the dispatcher's
whole work on a small inference (measured, the MIP <-> OIP mapping included: ~410 µs of
client CPU per OIP REST request through aiohttp, ~150-190 µs through this, same machine
and load).  Why not h11 (the sans-IO HTTP/1.1 state machine, made for exactly this): in pure
Python it costs ~78 µs to write one such request and read its answer (measured, one
``Connection`` per exchange) -- half of this whole client's cost per request.  A backend
sends one kind of request (``POST`` with a body) and reads one kind of answer, so this
reads only what it needs:

* the status line (``HTTP/1.1`` or ``HTTP/1.0``) and the header block (at most
  :data:`MAX_HEAD` bytes), of which ``Content-Length``, ``Transfer-Encoding: chunked``,
  ``Connection`` and any header the caller names (``Inference-Header-Content-Length``);
* a body of ``Content-Length`` bytes, chunked, or (neither given) up to the end of the
  connection; at most ``max_body`` bytes.

A connection is reused when the answer allows it (HTTP/1.1 without ``Connection: close``,
the body framed), closed otherwise, and closed when its call is cancelled (the dispatcher's
timeout) or fails.  A reused connection that closes before a byte of the answer came (the
server closed it while it was idle: uvicorn does after some errors, without saying so) is
tried once more on a new connection -- as the dispatcher would resubmit the request.
Anything the server breaks -- a refused or lost connection, a status
line or header block that is not HTTP's, a body over the limit -- is :class:`HttpError`
(a ConnectionError: the dispatcher resubmits).  No socket code anywhere else in the
backends touches HTTP.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

#: the header block of an answer, at most (aiohttp's own line limit is 8190)
MAX_HEAD = 64 * 1024
#: the body of an answer, at most (default of ``max_body``)
MAX_BODY = 1 << 30


class HttpError(ConnectionError):
    """The server could not be reached, or broke HTTP."""


class _Answer:
    """One answer being read: its status, the headers asked for, its body."""

    __slots__ = ("body", "headers", "keep", "status")

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.body = b""
        self.keep = False


class _Connection(asyncio.Protocol):
    """One keep-alive connection: bytes in, one answer at a time out."""

    def __init__(self, wanted: frozenset[bytes], max_body: int) -> None:
        self.wanted = wanted
        self.max_body = max_body
        self.transport: Any = None
        self.closed = False
        self._buffer = bytearray()
        self._waiter: asyncio.Future[_Answer] | None = None
        self._answer: _Answer | None = None
        self._state = "head"  # head, length, chunk-size, chunk, chunk-end, trailer, eof
        self._left = 0
        self._parts: list[bytes] = []
        self._size = 0
        #: answers read on it so far (a reused connection may have been closed by the
        #: server meanwhile: see :meth:`HttpPool.post`)
        self.answered = 0
        #: whether a byte of the current answer has come
        self.heard = False

    # -- asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._state == "eof" and self._answer is not None:
                self._finish()
            else:
                waiter.set_exception(HttpError(f"connection lost before the answer ({exc})"))

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self._fail("bytes from the server while no request was pending")
            return
        self.heard = True
        self._buffer += data
        try:
            self._parse()
        except HttpError as exc:
            self._fail(str(exc))

    # -- one exchange
    def send(self, pieces: list[bytes]) -> asyncio.Future[_Answer]:
        self._waiter = asyncio.get_running_loop().create_future()
        self._answer = _Answer()
        self._state = "head"
        self._parts, self._size = [], 0
        self.heard = False
        self.transport.writelines(pieces)
        return self._waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, why: str) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(HttpError(why))
        self.close()

    def _finish(self) -> None:
        answer = self._answer
        assert answer is not None and self._waiter is not None
        answer.body = b"".join(self._parts)
        self._parts = []
        self.answered += 1
        self._waiter.set_result(answer)

    def _take_body(self, count: int) -> None:
        self._size += count
        if self._size > self.max_body:
            raise HttpError(f"an answer over {self.max_body} bytes")

    def _parse(self) -> None:
        buf = self._buffer
        while True:
            state = self._state
            if state == "head":
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD:
                        raise HttpError(f"a header block over {MAX_HEAD} bytes")
                    return
                self._head(bytes(buf[:end]))
                del buf[: end + 4]
            elif state == "length":
                take = min(self._left, len(buf))
                self._parts.append(bytes(buf[:take]))
                del buf[:take]
                self._left -= take
                if self._left:
                    return
                self._done()
                return
            elif state == "chunk-size":
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise HttpError("a chunk size line over 1024 bytes")
                    return
                text = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[: end + 2]
                try:
                    self._left = int(text, 16)
                except ValueError:
                    raise HttpError(f"a chunk size that is not hex: {text[:20]!r}") from None
                self._take_body(self._left)
                self._state = "chunk" if self._left else "trailer"
            elif state == "chunk":
                take = min(self._left, len(buf))
                self._parts.append(bytes(buf[:take]))
                del buf[:take]
                self._left -= take
                if self._left:
                    return
                self._state = "chunk-end"
            elif state == "chunk-end":
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise HttpError("a chunk not followed by CRLF")
                del buf[:2]
                self._state = "chunk-size"
            elif state == "trailer":
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(buf[:end])
                del buf[: end + 2]
                if not line:
                    self._done()
                    return
            else:  # eof: the body runs to the end of the connection
                self._take_body(len(buf))
                self._parts.append(bytes(buf))
                del buf[:]
                return

    def _head(self, head: bytes) -> None:
        answer = self._answer
        assert answer is not None
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or not parts[1].isdigit():
            raise HttpError(f"not an HTTP/1.x status line: {lines[0][:40]!r}")
        answer.status = int(parts[1])
        if 100 <= answer.status < 200:  # an interim answer (100 Continue): the next one
            return
        keep = parts[0] == b"HTTP/1.1"
        length: int | None = None
        chunked = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise HttpError(f"a header line without a colon: {line[:40]!r}")
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise HttpError(f"a bad Content-Length: {value[:20]!r}")
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = value.lower().endswith(b"chunked")
            elif name == b"connection":
                tokens = {t.strip() for t in value.lower().split(b",")}
                if b"close" in tokens:
                    keep = False
                elif b"keep-alive" in tokens:
                    keep = True
            elif name in self.wanted:
                answer.headers[name] = value
        if answer.status in (204, 304):
            length, chunked = 0, False
        if chunked:
            self._state = "chunk-size"
        elif length is not None:
            self._take_body(length)
            self._left = length
            self._state = "length"
            if not length:
                answer.keep = keep
                self._done()
                return
        else:
            keep = False
            self._state = "eof"
        answer.keep = keep

    def _done(self) -> None:
        answer = self._answer
        assert answer is not None
        self._state = "idle"
        if self._buffer:  # bytes past the answer: the connection cannot be trusted
            answer.keep = False
        self._finish()


class HttpPool:
    """HTTP/1.1 connections to ``host:port``, at most ``limit`` open at once; a request
    waits for a free one (first come, first served)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        limit: int,
        wanted: frozenset[bytes] = frozenset(),
        max_body: int = MAX_BODY,
    ) -> None:
        self.host = host
        self.port = port
        self.limit = limit
        self.wanted = frozenset(name.lower() for name in wanted)
        self.max_body = max_body
        self._host_header = (f"[{host}]" if ":" in host else host).encode() + b":%d" % port
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def post(
        self, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[bytes, bytes], bytes]:
        """``(status, wanted headers by lowercase name, body)`` of ``POST path``;
        :class:`HttpError` when the server cannot be reached or breaks HTTP."""
        lines = [b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n" % (
            path.encode("ascii"), self._host_header, len(body))]  # fmt: skip
        for name, value in headers.items():
            lines.append(f"{name}: {value}\r\n".encode("latin-1"))
        lines.append(b"\r\n")
        pieces = [b"".join(lines), body]
        for _turn in range(2):
            conn = await self._acquire()
            try:
                answer = await conn.send(pieces)
            except HttpError:
                stale = conn.answered > 0 and not conn.heard
                conn.close()
                self._release(conn)
                if stale:  # closed by the server while idle: once more, on a new one
                    continue
                raise
            except BaseException:
                conn.close()
                self._release(conn)
                raise
            if not answer.keep:
                conn.close()
            self._release(conn)
            return answer.status, answer.headers, answer.body
        raise HttpError("a kept-alive connection and a new one both closed before an answer")

    async def _acquire(self) -> _Connection:
        while True:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
                self._open -= 1
            if self._open < self.limit:
                self._open += 1
                try:
                    loop = asyncio.get_running_loop()
                    _transport, conn = await loop.create_connection(
                        lambda: _Connection(self.wanted, self.max_body), self.host, self.port
                    )
                except BaseException as exc:
                    self._open -= 1
                    self._wake()
                    if isinstance(exc, OSError):
                        raise HttpError(f"{exc.strerror or exc}") from None
                    raise
                return conn
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # pass the turn on
                else:
                    self._waiters.remove(waiter)
                raise

    def _release(self, conn: _Connection) -> None:
        if self._closed:
            conn.close()
        if conn.closed:
            self._open -= 1
        else:
            self._idle.append(conn)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    @property
    def open(self) -> int:
        """Connections open (idle or in use)."""
        return self._open

    async def close(self) -> None:
        """Close every idle connection (those in use close when their call ends)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
            self._open -= 1


__all__ = ["MAX_BODY", "MAX_HEAD", "HttpError", "HttpPool"]
