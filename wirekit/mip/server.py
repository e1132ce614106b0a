"""An ``asyncio`` MIP server: many connections, persistent or one-shot, answered in order.

>>> async def handler(batch):            # per sample, its input items
...     return [[item.as_text().upper()] for (item,) in batch]
>>> server = Server(handler)
>>> await server.start("tcp://127.0.0.1:5000")     # doctest: +SKIP
>>> await server.serve_forever()                   # doctest: +SKIP

The server only moves bytes: framing, error replies, reply order and when to stop reading are
decided by the sans-IO :class:`~wirekit.mip.connection.Connection`, decoding by the codec;
the handler gets typed items and returns output values (see
:func:`~wirekit.mip.runtime.build_reply`).  Sync handlers run in a thread pool, coroutine
functions are awaited on the loop (and need no task when they finish without suspending).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import stat
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import Executor
from functools import partial
from typing import Any

from wirekit import mip
from wirekit._memory import MemoryReturn
from wirekit.errors import EncodeError

from .connection import Connection, Rejected, Request, Slot, error_reply
from .decoder import DEFAULT_MAX_MESSAGE_SIZE
from .limits import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_WRITE_STALL_TIMEOUT,
    Limits,
    MemoryBudget,
)
from .messages import DEFAULT_MAX_ITEMS, ErrorCode, Inference
from .runtime import (
    Batch,
    OutputShapeError,
    _singles,
    _start,
    async_echo,
    build_reply,
    echo,
    format_address,
    parse_address,
)

log = logging.getLogger("wirekit.mip.server")

#: ``handler(batch) -> outputs`` or ``async handler(batch) -> outputs``
Handler = Callable[[Batch], Any] | Callable[[Batch], Awaitable[Any]]

_ASYNC, _INLINE, _POOL = "async", "inline", "pool"  # how the handler is called
#: After answering a request that broke the stream (PROTOCOL, MEMORY) the server half-closes
#: and discards what the client still sends for this long, so the reply is not lost to a reset.
LINGER = 2.0


def _is_async(handler: Any) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - objects with async __call__
    return inspect.iscoroutinefunction(call)


class _Resume:
    """Awaitable that carries on a coroutine already advanced by one ``send``.

    The server starts a coroutine handler eagerly: most finish without suspending and need
    no task.  One that does suspend is wrapped in this and handed to a task, which then
    drives it exactly as if it had started it (values, results and cancellation pass through).
    """

    __slots__ = ("coro", "first")

    def __init__(self, coro: Any, first: Any) -> None:
        self.coro = coro
        self.first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self.coro, self.first
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _finish(resume: _Resume) -> Any:
    return await resume


class Server:
    """A MIP server for one handler, listening on any number of TCP and Unix addresses.

    The limits (:mod:`wirekit.mip.limits` has the full table): ``max_message_size``: larger
    requests get MEMORY from their header, then the connection is closed.  ``max_items``:
    requests of more items get MEMORY, and the connection goes on.  ``timeout``: seconds a
    request may take to arrive, from its first byte, before the connection is dropped.
    ``idle_timeout``: seconds a connection with nothing received, buffered or owed is kept.
    ``write_stall_timeout``: seconds a connection whose replies wait unsent (its client does
    not read them) is kept without progress.  ``memory_budget`` (old name ``max_buffered``):
    bytes all connections together may hold -- bytes read, requests in flight, replies
    unsent; a connection that owes answers stops being read when the budget is full, one
    that holds only a partial request is answered MEMORY and closed.  ``budget``: a
    :class:`~wirekit.mip.limits.MemoryBudget` to share with other servers of the process
    (default: one of this server's own, of ``memory_budget``).  A timeout of None is off.
    ``max_in_flight``: requests per connection being handled at once; past it the server
    stops reading that connection until replies go out.  ``executor``: where sync handlers
    run (default: the loop's default thread pool).  ``inline=True`` calls a sync handler on
    the event loop instead, with no thread hop: for handlers that return at once (a lookup,
    an echo), never for ones that compute or block, which would stall every connection.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        max_items: int = DEFAULT_MAX_ITEMS,
        memory_budget: int | None = None,
        write_stall_timeout: float | None = DEFAULT_WRITE_STALL_TIMEOUT,
        budget: MemoryBudget | None = None,
        max_buffered: int | None = None,
        max_in_flight: int = 64,
        executor: Executor | None = None,
        backlog: int = 1024,
        inline: bool = False,
    ) -> None:
        if not callable(handler):
            raise TypeError(f"handler must be callable, not {handler!r}")
        self.handler = handler
        self.is_async = _is_async(handler)
        self.inline = inline and not self.is_async
        self._mode = _ASYNC if self.is_async else _INLINE if self.inline else _POOL
        self.limits = Limits(
            request_timeout=timeout,
            idle_timeout=idle_timeout,
            max_message_size=max_message_size,
            max_items=max_items,
            memory_budget=memory_budget,
            write_stall_timeout=write_stall_timeout,
            max_buffered=max_buffered,
        )
        #: the memory budget every connection of this server charges
        self.budget = budget if budget is not None else MemoryBudget(self.limits.memory_budget)
        self.max_message_size = max_message_size
        self.max_items = max_items
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.max_in_flight = max(1, max_in_flight)
        self.executor = executor
        self.backlog = backlog
        self._servers: list[asyncio.AbstractServer] = []
        self._addresses: list[str] = []
        self._unix_paths: list[str] = []
        self._connections: set[_Connection] = set()
        self._closing = False
        self._stopped: asyncio.Event | None = None
        #: gives memory back to the system after big connections end (wirekit._memory)
        self.memory_return = MemoryReturn()
        self.requests_served = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self, *listen: str) -> None:
        """Bind and listen on each address (``tcp://host:port``, ``unix:///path``)."""
        loop = asyncio.get_running_loop()
        if self._stopped is None:
            self._stopped = asyncio.Event()
        if not listen:
            raise ValueError("start() needs at least one address to listen on")
        for address in listen:
            family, target = parse_address(address)
            if family == "tcp":
                assert isinstance(target, tuple)
                host, port = target
                srv = await loop.create_server(
                    self._protocol, host, port, reuse_address=True, backlog=self.backlog
                )
                for sock in srv.sockets:
                    self._addresses.append(format_address("tcp", sock.getsockname()))
            else:
                path = str(target)
                _remove_stale_socket(path)
                srv = await loop.create_unix_server(self._protocol, path, backlog=self.backlog)
                self._unix_paths.append(path)
                self._addresses.append(format_address("unix", path))
            self._servers.append(srv)
        for address in self._addresses:
            log.info("listening on %s", address)

    @property
    def addresses(self) -> list[str]:
        """Every bound address, with the port the system chose for port 0."""
        return list(self._addresses)

    @property
    def address(self) -> str:
        """The first bound address."""
        if not self._addresses:
            raise RuntimeError("the server is not listening yet: await start(...) first")
        return self._addresses[0]

    @property
    def connection_count(self) -> int:
        """Connections open right now."""
        return len(self._connections)

    @property
    def buffered_bytes(self) -> int:
        """Bytes all connections hold in the memory budget right now."""
        return self.budget.total

    async def serve_forever(self) -> None:
        """Wait until :meth:`shutdown` has finished."""
        if self._stopped is None:
            raise RuntimeError("await start(...) before serve_forever()")
        await self._stopped.wait()

    async def shutdown(self, grace: float | None = 10.0) -> None:
        """Stop accepting, finish the requests already received, then close every connection.

        Connections still busy after ``grace`` seconds are aborted.
        """
        if self._closing:
            if self._stopped is not None:
                await self._stopped.wait()
            return
        self._closing = True
        for srv in self._servers:
            srv.close()
        conns = list(self._connections)
        for conn in conns:
            conn.begin_shutdown()
        waits = [conn.closed for conn in conns if not conn.closed.done()]
        if waits:
            _done, pending = await asyncio.wait(waits, timeout=grace)
            if pending:
                log.warning("aborting %d connection(s) still busy after %s s", len(pending), grace)
                for conn in conns:
                    conn.abort()
                await asyncio.wait(pending, timeout=1.0)
        for srv in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(srv.wait_closed(), 1.0)
        for path in self._unix_paths:
            _remove_stale_socket(path)
        log.info("stopped")
        if self._stopped is not None:
            self._stopped.set()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _protocol(self) -> _Connection:
        return _Connection(self)


def _remove_stale_socket(path: str) -> None:
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.remove(path)


_ERR = {code: error_reply(code) for code in ErrorCode}


class Watchdog:
    """Runs the deadlines of a sans-IO :class:`~wirekit.mip.connection.Connection` on the
    event loop: one timer, armed for its guard's ``next_check``; when it fires the runtime's
    transport says how many bytes it holds unsent (``unsent()``, given to
    ``conn.written``), the connection decides (``conn.expired``), and a reason to drop it
    goes to ``drop(reason)``.  Every front door uses it: both MIP front doors (this server
    and :mod:`wirekit.serve.doors.mipfront`) over their connection, the dispatcher's HTTP
    door (:mod:`wirekit.serve.doors.httpdoor`) over a
    :class:`~wirekit.mip.limits.UnsentReplies`, which answers as a connection's write side
    does (``guard``, ``write_paused``, ``written``, ``expired``); ``clock`` is the guard's
    clock (monotonic seconds)."""

    __slots__ = ("clock", "conn", "drop", "due", "guard", "loop", "timer", "unsent")

    def __init__(
        self,
        conn: Any,
        loop: asyncio.AbstractEventLoop,
        clock: Callable[[], float],
        unsent: Callable[[], int],
        drop: Callable[[str], None],
    ) -> None:
        self.conn = conn
        self.guard = conn.guard
        self.loop = loop
        self.clock = clock
        self.unsent = unsent
        self.drop = drop
        self.timer: asyncio.TimerHandle | None = None
        self.due = 0.0

    def arm(self, now: float) -> None:
        """Make sure the timer fires by the guard's next check (at the start, and whenever
        ``guard.received`` says a request started)."""
        due = self.guard.next_check(now)
        if due is None:
            return
        if self.timer is not None:
            if self.due <= due:
                return
            self.timer.cancel()
        self.due = due
        self.timer = self.loop.call_later(due - now, self._fire)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self) -> None:
        self.timer = None
        now = self.clock()
        conn = self.conn
        if conn.write_paused:
            conn.written(self.unsent(), now)
        why = conn.expired(now)
        if why is not None:
            self.drop(why)
        else:
            self.arm(now)


class _Connection(asyncio.Protocol):
    """One client connection: moves bytes between the transport and a sans-IO
    :class:`~wirekit.mip.connection.Connection`, and runs the handler on its requests."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = loop = asyncio.get_running_loop()
        # loop.time() is time.monotonic() for asyncio's loops: call that directly
        self._clock = time.monotonic if type(loop).time is asyncio.BaseEventLoop.time else loop.time
        self.conn = conn = Connection(
            server.limits, server.budget, self._clock(), max_in_flight=server.max_in_flight
        )
        self.watchdog = Watchdog(conn, loop, self._clock, self._unsent, self._drop)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.read_paused = False  # the transport's reading, as last set
        self.eof = False
        self.lingering = False
        self.closed: asyncio.Future[None] = self.loop.create_future()

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = format_address("tcp", peer) if isinstance(peer, tuple) else "unix peer"
        if self.server._closing:
            transport.close()
            return
        self.server._connections.add(self)
        self.watchdog.arm(self._clock())
        log.debug("connection from %s", self.peer)

    def data_received(self, data: bytes) -> None:
        now = self._clock()
        conn = self.conn
        request = conn.receive_request(data, now)
        if request is not None:
            # The common case, one whole request in one read, answered without the pump.
            wire = self._infer(request.message)
            if wire is None:
                return  # owed: it goes out when the handler is done
            conn.reply(wire)
            out = conn.send(now)
            if self.transport is not None:
                self.transport.write(out)
            return
        self._pump(now)
        if conn.timer_wanted():
            self.watchdog.arm(now)

    def eof_received(self) -> bool:
        # The peer sends no more: answer what was received, then close (one-shot clients).
        self.eof = True
        conn = self.conn
        if conn.buffered and not conn.broken:
            log.debug("%s closed its side mid-request; dropping %d bytes", self.peer, conn.buffered)
        conn.end_of_input()
        self._pump(self._clock())
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        held = self.conn.held
        self.conn.release()
        self.server.memory_return.released(held)
        self.watchdog.stop()
        self.server._connections.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)
        log.debug("connection from %s closed (%s)", self.peer, exc or "clean")

    def pause_writing(self) -> None:
        now = self._clock()
        conn = self.conn
        transport = self.transport
        conn.writing(True, now, transport.get_write_buffer_size() if transport else 0)
        self._sync_reading()
        if conn.timer_wanted():  # the write-stall clock runs
            self.watchdog.arm(now)

    def resume_writing(self) -> None:
        self.conn.writing(False, self._clock())
        self._pump(self._clock())

    # ------------------------------------------------------------------ requests

    def _pump(self, now: float) -> None:
        """Take every event the connection has, write the answers ready, follow its
        decisions on reading and closing."""
        conn = self.conn
        transport = self.transport
        if transport is None:
            return
        next_event, reply, infer = conn.next_event, conn.reply, self._infer
        while True:
            while (event := next_event()) is not None:
                if type(event) is Request:
                    wire = infer(event.message)
                    if wire is not None:
                        reply(wire)
                elif type(event) is Rejected:
                    log.warning(
                        "%s: bad request, answering %s: %s",
                        self.peer,
                        event.code.name,
                        event.error,
                    )
            was_paused = conn.paused
            out = conn.send(now)
            if out:
                transport.write(out)
            if not was_paused or conn.paused:
                break  # else reading resumed: requests that arrived meanwhile are next
        self._sync_reading()
        if conn.done:
            self._close()

    def _infer(self, msg: Inference) -> bytes | None:
        """Run the handler on a request: its reply if it is ready now, else None (the reply
        then has its place in the order and goes out when the handler is done)."""
        server = self.server
        server.requests_served += 1
        if msg.batch_size == 0:
            return mip.encode(Inference(True, msg.n_input, 0, 0, ()))
        batch = msg.samples if msg.n_input != 1 else _singles(msg.items)
        mode = server._mode
        if mode is _ASYNC:
            try:
                coro = server.handler(batch)
                done, value = _start(coro)
            except Exception:
                log.exception("handler failed on a batch of %d from %s", msg.batch_size, self.peer)
                return _ERR[ErrorCode.INTERNAL]
            if done:
                return self._encode_reply(msg, value)
            fut: asyncio.Future[Any] = self.loop.create_task(_finish(_Resume(coro, value)))
        elif mode is _INLINE:
            try:
                value = server.handler(batch)
            except Exception:
                log.exception("handler failed on a batch of %d from %s", msg.batch_size, self.peer)
                return _ERR[ErrorCode.INTERNAL]
            return self._encode_reply(msg, value)
        else:
            fut = self.loop.run_in_executor(server.executor, server.handler, batch)
        slot = Slot()
        self.conn.owe(slot)
        fut.add_done_callback(partial(self._handled, slot, msg))
        return None

    def _handled(self, slot: Slot, msg: Inference, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            slot.wire = _ERR[ErrorCode.INTERNAL]
        elif (exc := fut.exception()) is not None:
            log.error(
                "handler failed on a batch of %d from %s", msg.batch_size, self.peer, exc_info=exc
            )
            slot.wire = _ERR[ErrorCode.INTERNAL]
        else:
            slot.wire = self._encode_reply(msg, fut.result())
        if self.transport is None:
            return  # the client went away; its replies go nowhere
        self._pump(self._clock())

    def _encode_reply(self, msg: Inference, outputs: Any) -> bytes:
        try:
            return mip.encode(build_reply(msg, outputs))
        except OutputShapeError as exc:
            log.warning("handler outputs do not match the batch from %s: %s", self.peer, exc)
            return _ERR[ErrorCode.SHAPE]
        except (EncodeError, TypeError, ValueError):
            log.exception("handler outputs for %s cannot be encoded", self.peer)
            return _ERR[ErrorCode.INTERNAL]

    # ------------------------------------------------------------------ flow control

    def _sync_reading(self) -> None:
        """Pause or resume the transport's reading as the connection says."""
        transport = self.transport
        if transport is None or self.lingering:
            return
        conn = self.conn
        if conn.paused or conn.write_paused:
            if not self.read_paused:
                self.read_paused = True
                transport.pause_reading()
        elif self.read_paused and not conn.closing:
            self.read_paused = False
            transport.resume_reading()

    def _close(self) -> None:
        transport = self.transport
        if transport is None:
            return
        if self.lingering:
            if self.eof:
                transport.close()
            return
        if self.conn.broken and not self.eof and transport.can_write_eof():
            # Half-close and drain: closing with unread input would reset the connection
            # and could destroy the error reply before the client reads it.
            self.lingering = True
            transport.write_eof()
            if self.read_paused:
                self.read_paused = False
                transport.resume_reading()
            self.loop.call_later(LINGER, self.abort)
        else:
            transport.close()

    def begin_shutdown(self) -> None:
        """Server shutdown: answer the requests already received, then close."""
        transport = self.transport
        if transport is None:
            return
        if not self.read_paused:
            self.read_paused = True
            transport.pause_reading()
        self.conn.shutdown()
        self._pump(self._clock())  # while closing, everything complete is dispatched

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # ------------------------------------------------------------------ timeouts

    def _unsent(self) -> int:
        transport = self.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def _drop(self, why: str) -> None:
        if self.transport is not None:
            log.info("dropping %s: %s", self.peer, why)
            self.conn.end_of_input()
            self.transport.abort()


# --------------------------------------------------------------------------- helpers


async def serve(handler: Handler, *listen: str, **options: Any) -> None:
    """Run a server until cancelled (then shut it down gracefully)."""
    server = Server(handler, **options)
    await server.start(*listen)
    try:
        await server.serve_forever()
    finally:
        await server.shutdown()


class ServerThread:
    """A server on its own event loop in a background thread (for blocking programs, tests).

    >>> with ServerThread(echo, "tcp://127.0.0.1:0") as running:   # doctest: +SKIP
    ...     Client(running.address).ping()
    """

    def __init__(self, handler: Handler, *listen: str, **options: Any) -> None:
        self.server = Server(handler, **options)
        self._listen = listen or ("tcp://127.0.0.1:0",)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def addresses(self) -> list[str]:
        return self.server.addresses

    def start(self, timeout: float = 10.0) -> ServerThread:
        self._thread = threading.Thread(target=self._run, name="wirekit-mip-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the MIP server thread did not start in time")
        if self._error is not None:
            self._thread.join(timeout)
            raise self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            try:
                loop.run_until_complete(self.server.start(*self._listen))
            except BaseException as exc:
                self._error = exc
                return
            finally:
                self._ready.set()
            loop.run_until_complete(self.server.serve_forever())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run ``fn()`` on the server's loop (a coroutine function is awaited) and return it."""
        assert self._loop is not None

        async def run() -> Any:
            result = fn()
            if inspect.isawaitable(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stop(self, grace: float | None = 10.0, timeout: float = 30.0) -> None:
        """Shut the server down gracefully and join the thread."""
        if self._loop is None or self._thread is None:
            return
        if self._thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(self.server.shutdown(grace), self._loop)
            fut.result(timeout)
        self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["Handler", "Server", "ServerThread", "Watchdog", "async_echo", "echo", "serve"]
