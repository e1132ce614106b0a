"""The MIP front door: one TCP listener per model, speaking MIP to clients.

Clients may pipeline: requests on one connection are dispatched concurrently and answered in
the order they came.  Malformed messages get the MIP error reply the codec names; after a bad
version or reserved byte, or a message over the size limit, the connection is closed after
the reply since the stream can no longer be trusted.

The limits are :mod:`wirekit.mip.limits`' (the config's ``mip`` table), decided by the same
:class:`~wirekit.mip.limits.Guard` and :class:`~wirekit.mip.server.Watchdog` as
``wirekit mip serve``'s: a request must be complete ``request_timeout`` after its first byte,
an idle connection is dropped after ``idle_timeout``, all front-door connections together hold
at most ``max_buffered`` bytes across reads (a connection that would exceed it is answered
MEMORY and closed), and a request of more than ``max_items`` items is answered MEMORY.

Well-formed inference requests of a model the MIP lane serves are taken a read at a time by
:class:`wirekit.serve.lane.Lane` (or its compiled twin); the rest, one message at a time, by
:meth:`Dispatcher.start`.  Either way the answers go back in order, after the journal write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from wirekit import mip
from wirekit.errors import DecodeError
from wirekit.mip import ErrorCode, ErrorReply, Inference, Ping
from wirekit.mip.limits import BufferBudget, Guard, Limits, OverBudget
from wirekit.mip.server import Watchdog

from .dispatcher import Dispatcher, Job
from .payload import Payload

log = logging.getLogger("wirekit.serve")

_PING_REPLY = mip.encode(Ping(response=True))
MAX_PIPELINED = 128  #: requests in flight per connection before reading pauses


def _error(code: int) -> bytes:
    return mip.encode(ErrorReply(int(code)))


class MipFrontDoor(asyncio.Protocol):
    """One client connection to the listener of ``model``.

    ``budget`` is shared by every front-door connection of the dispatcher (default: one of
    this connection's own, of ``limits.max_buffered``)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        model: str,
        tasks: set[asyncio.Task],
        limits: Limits | None = None,
        budget: BufferBudget | None = None,
    ) -> None:
        limits = limits if limits is not None else Limits()
        self.dispatcher = dispatcher
        self.store = dispatcher.store
        self._clock = dispatcher._clock
        self._now = 0.0
        self.loop = asyncio.get_running_loop()
        self.model = model
        self.tasks = tasks
        self.max_message_size = limits.max_message_size
        self.max_items = limits.max_items
        self.guard = Guard(
            limits, budget if budget is not None else BufferBudget(limits.max_buffered),
            time.monotonic(),
        )
        self.watchdog = Watchdog(self.guard, self.loop, time.monotonic, self._state, self._drop)
        self._buf = bytearray()
        self._skip = 0
        self._pending: deque[bytes | Job] = deque()
        self._paused = False
        self._flush_soon = False
        self._closing = False
        self.transport: asyncio.Transport | None = None
        self.client = "mip:?"
        self.lane = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.client = f"mip:{peer[0]}:{peer[1]}"
        d = self.dispatcher
        self.lane = d.lane.Lane(d, self.model, self.client, d.lane_route(self.model),
                                self.max_message_size, self.max_items, self._pending,
                                self._done)
        now = time.monotonic()
        self.guard.sent(now)
        self.watchdog.arm(now)

    def connection_lost(self, exc) -> None:
        self._closing = True
        self.transport = None
        self._buf.clear()
        self.guard.release()
        self.watchdog.stop()

    def _state(self) -> tuple[bool, bool]:
        return self._paused, bool(self._pending)

    def _drop(self, why: str) -> None:
        if self.transport is not None:
            log.info("dropping %s: %s", self.client, why)
            self._close_after_replies()
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._skip:
            drop = min(self._skip, len(data))
            self._skip -= drop
            data = data[drop:]
        buf = self._buf
        if buf or type(data) is not bytes:
            buf += data
            src = buf
        else:  # nothing buffered: frames are sliced from the read itself (one copy less)
            src = data
        pos = 0
        self._now = self._clock()  # the arrival time of the requests of this read
        n = len(src)
        take = self.lane.take if self.lane.enabled else None
        while n - pos >= mip.HEADER_SIZE and not self._closing:
            if take is not None:  # the well-formed requests, at once (wirekit.serve.lane)
                pos = take(src, pos, n, self._now)
                if n - pos < mip.HEADER_SIZE:
                    break
            header = bytes(src[pos : pos + mip.HEADER_SIZE])
            try:
                _kind, _sub, remaining = mip.check_header(header)
            except DecodeError as exc:
                code = exc.code if exc.code is not None else ErrorCode.SHAPE
                self._pending.append(_error(code))
                if exc.field in ("version", "reserved"):
                    self._close_after_replies()
                    break
                # Well framed: drop this message's bytes (those not here yet as they come).
                size = mip.HEADER_SIZE + int.from_bytes(header[4:], "big")
                here = min(size, n - pos)
                pos += here
                self._skip = size - here
                continue
            size = mip.HEADER_SIZE + remaining
            if size > self.max_message_size:
                self._pending.append(_error(ErrorCode.MEMORY))
                self._close_after_replies()
                break
            if n - pos < size:
                break
            if src is buf:
                with memoryview(buf) as view:  # one copy (a bytearray slice would be two)
                    frame = bytes(view[pos : pos + size])
            elif size == n:
                frame = data  # the read is exactly one message
            else:
                frame = data[pos : pos + size]
            pos += size
            self._handle(frame)
        if src is buf:
            del buf[:pos]
        elif pos < n and not self._closing:
            buf += memoryview(data)[pos:]
        if not self._closing:
            now = time.monotonic()
            try:
                if self.guard.received(now, len(buf), bool(buf or self._skip), pos > 0):
                    self.watchdog.arm(now)
            except OverBudget as exc:
                log.warning("%s: refused, answering MEMORY: %s", self.client, exc)
                self._pending.append(_error(ErrorCode.MEMORY))
                self._close_after_replies()
        self._flush()
        if len(self._pending) > MAX_PIPELINED and not self._paused and self.transport:
            self._paused = True
            self.transport.pause_reading()

    def _handle(self, frame: bytes) -> None:
        try:
            msg = mip.decode(frame, self.max_items)
        except DecodeError as exc:
            self._pending.append(_error(exc.code if exc.code is not None else ErrorCode.SHAPE))
            return
        if isinstance(msg, Ping):
            self._pending.append(_PING_REPLY if not msg.response else _error(ErrorCode.SUBTYPE))
            return
        if not isinstance(msg, Inference) or msg.response:
            self._pending.append(_error(ErrorCode.SUBTYPE))
            return
        # Its completion record waits for _flush, which writes the journal (all the
        # records of this loop pass at once) before any answer goes out.
        job = Job(self.model, Payload(frame, msg), self.client, self._done)
        job.t_in = self._now
        self._pending.append(job)
        try:
            self.dispatcher.start(job)
        except Exception as exc:  # answered INTERNAL, logged in _flush
            job.error = exc

    def _done(self, job) -> None:
        pending = self._pending
        if len(pending) == 1 and pending[0] is job and not self._flush_soon:
            self._flush()  # the only request in flight: answer it now
        elif not self._flush_soon:  # replies finished in one loop pass go out in one write
            self._flush_soon = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        pending = self._pending
        out = self.lane.answers(pending)  # records the lane's answers
        try:
            self.store.write_journal()  # before any answer: what is answered is on record
        except OSError as exc:
            self.store.error = exc
            log.error("cannot write the request journal: %s", exc)
        transport = self.transport
        if transport is None:
            return
        if out:
            transport.write(out[0] if len(out) == 1 else b"".join(out))
            self.guard.sent(time.monotonic())
        if self._closing and not pending:
            transport.close()
        elif self._paused and len(pending) <= MAX_PIPELINED // 2:
            self._paused = False
            self.guard.resumed(time.monotonic())
            transport.resume_reading()

    def _close_after_replies(self) -> None:
        self._closing = True
        self._buf.clear()
        self._skip = 0
        self.guard.release()
