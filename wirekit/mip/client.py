"""MIP clients: a blocking :class:`Client` and an ``asyncio`` :class:`AsyncClient`.

>>> with Client("tcp://127.0.0.1:5000") as client:            # doctest: +SKIP
...     client.ping()                                          # round trip, in seconds
...     client.infer([["a text", {"a": "json"}, png_bytes]])   # one sample, three inputs
[(Item(type=TEXT, ...), Item(type=JSON, ...), Item(type=IMAGE, ...))]

Both keep one connection open and reuse it; when the server closed it after a reply (KubeMo's
server does, after every reply) they reconnect and send again.  The async client pipelines:
any number of concurrent calls share the connection and are answered in order.  Inputs are
read, never consumed or modified.  Error replies raise :class:`ServerError` (with ``code``);
timeouts raise :class:`ClientTimeout`; an unreachable server :class:`ConnectionLost`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from wirekit import mip

from .decoder import DEFAULT_MAX_MESSAGE_SIZE, Decoder
from .messages import DEFAULT_MAX_ITEMS, Inference, Item, Message, Ping
from .runtime import (
    ClientTimeout,
    ConnectionLost,
    ServerError,
    UnexpectedReply,
    build_request,
    check_reply,
    decode_reply,
    deliver_replies,
    parse_address,
    samples_of,
)

_PING = mip.encode(Ping(False))
_RECV_SIZE = 256 * 1024


class _Unanswered(Exception):
    """The connection closed before this request's reply (retryable or not)."""

    def __init__(self, retryable: bool, cause: BaseException | None = None) -> None:
        super().__init__(retryable, cause)
        self.retryable = retryable
        self.cause = cause


def _connect_socket(address: str, timeout: float) -> socket.socket:
    family, target = parse_address(address)
    try:
        if family == "tcp":
            sock = socket.create_connection(target, timeout=timeout)  # type: ignore[arg-type]
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(target)
            except BaseException:
                sock.close()
                raise
    except TimeoutError:
        raise ClientTimeout(f"mip: connecting to {address} timed out after {timeout:g} s") from None
    except OSError as exc:
        raise ConnectionLost(f"mip: cannot connect to {address}: {exc.strerror or exc}") from exc
    return sock


class Client:
    """A blocking MIP client for one server address (not thread-safe: one per thread).

    ``timeout`` bounds each call (connect, send and the whole reply).  Replies larger than
    ``max_message_size``, or of more than ``max_items`` items, are refused.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_items: int = DEFAULT_MAX_ITEMS,
    ) -> None:
        parse_address(address)  # fail early on a bad address
        self.address = address
        self.timeout = timeout
        self.max_message_size = max_message_size
        self.max_items = max_items
        self._sock: socket.socket | None = None
        self._decoder: Decoder | None = None
        self._used = False  # the current connection has answered a request already
        self._sock_timeout = 0.0  # the socket's timeout now (settimeout is a system call)

    # ------------------------------------------------------------------ public API

    def ping(self) -> float:
        """Send a ping; return the round-trip time in seconds."""
        start = time.perf_counter()
        check_reply(self._call(_PING), Ping, 0, self.address)
        return time.perf_counter() - start

    def infer(self, batch: Iterable[Any]) -> list[tuple[Item, ...]]:
        """Run a batch: per sample, its inputs (str: TEXT, bytes: IMAGE, Item as is, else JSON).

        Returns, per sample, its output items.
        """
        request = build_request(batch)
        msg = check_reply(
            self._call(mip.encode(request)), Inference, request.batch_size, self.address
        )
        return samples_of(msg)  # type: ignore[arg-type]

    def infer_one(self, *inputs: Any) -> tuple[Item, ...]:
        """Run one sample; return its outputs."""
        return self.infer([inputs])[0]

    def request(self, message: Message) -> Message:
        """Send any message and return the server's reply as is (error replies included)."""
        return self._call(mip.encode(message))

    def close(self) -> None:
        """Close the connection (the next call opens a new one)."""
        sock, self._sock, self._decoder = self._sock, None, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _call(self, wire: bytes) -> Message:
        deadline = time.monotonic() + self.timeout
        while True:
            reused = self._sock is not None and self._used
            if self._sock is None:
                left = self._left(deadline)
                self._sock = _connect_socket(self.address, left)
                self._sock_timeout = left
                self._decoder = Decoder(self.max_message_size)
                self._used = False
            try:
                frame = self._exchange(wire, deadline)
            except _Unanswered as exc:
                self.close()
                if reused and exc.retryable:
                    continue  # the server closed a kept-alive connection: send it again
                raise ConnectionLost(
                    f"mip: {self.address} closed the connection without replying"
                ) from exc.cause
            except TimeoutError:
                self.close()
                raise ClientTimeout(
                    f"mip: no reply from {self.address} within {self.timeout:g} s"
                ) from None
            except BaseException:
                self.close()
                raise
            self._used = True
            try:
                return decode_reply(mip, frame, self.max_items)
            except BaseException:
                self.close()  # out of step with the server: start afresh next time
                raise

    def _left(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    def _settimeout(self, sock: socket.socket, deadline: float) -> None:
        left = self._left(deadline)
        # Within 5 ms of what the socket has already: skip the system call.
        if abs(self._sock_timeout - left) > 0.005:
            sock.settimeout(left)
            self._sock_timeout = left

    def _exchange(self, wire: bytes, deadline: float) -> bytes:
        sock, decoder = self._sock, self._decoder
        assert sock is not None and decoder is not None
        try:
            self._settimeout(sock, deadline)
            sock.sendall(wire)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _Unanswered(True, exc) from None
        got = False
        frame = decoder.next_frame() if decoder.buffered else None
        while frame is None:
            if got:
                self._settimeout(sock, deadline)
            try:
                data = sock.recv(_RECV_SIZE)
            except ConnectionResetError as exc:
                raise _Unanswered(not got, exc) from None
            if not data:
                raise _Unanswered(not got and not decoder.buffered)
            if not got:
                frame = decoder.take_whole(data)  # the whole reply in one read
                got = True
                if frame is not None:
                    return frame
            decoder.feed(data)
            frame = decoder.next_frame()
        return frame


_NEVER = float("inf")
_Future = asyncio.Future


class _Callback:
    """What a :class:`_Pending` settles instead of a future for :meth:`AsyncClient.send_nowait`:
    gives the call's slot back and calls ``fn(frame, None)`` or ``fn(None, exc)``, once."""

    __slots__ = ("client", "conn", "fn", "settled")

    def __init__(self, client: AsyncClient, conn: _ClientConnection, fn: Any) -> None:
        self.client = client
        self.conn = conn
        self.fn = fn
        self.settled = False

    def done(self) -> bool:
        return self.settled

    def set_result(self, frame: bytes) -> None:
        self.settled = True
        self.client.release_slot()
        self.fn(frame, None)

    def set_exception(self, exc: BaseException) -> None:
        self.settled = True
        self.client.call_failed(self.conn, exc)
        self.fn(None, exc)


class _Pending:
    __slots__ = ("deadline", "future", "timeout", "wire")

    def __init__(self, wire: bytes, future: Any, deadline: float, timeout: float) -> None:
        self.wire = wire
        self.future = future
        self.deadline = deadline  # loop time
        self.timeout = timeout  # for the error message


def _settle_lost(pending: _Pending, exc: BaseException) -> None:
    if not pending.future.done():
        pending.future.set_exception(exc)


class _ClientConnection(asyncio.Protocol):
    """One pipelined connection: requests written in order, replies matched in order."""

    def __init__(self, max_message_size: int, address: str = "") -> None:
        self.loop = asyncio.get_running_loop()
        self.decoder = Decoder(max_message_size)
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[_Pending] = deque()
        self.answered = 0
        self.closed = False
        self.out: list[bytes] | None = None
        self.error: BaseException | None = None
        # One timer for the whole connection (not one per call): due at the earliest
        # deadline of a call waiting here, it fails the calls past their deadline.
        self.timer: asyncio.TimerHandle | None = None
        self.timer_due = _NEVER

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, pending: _Pending) -> None:
        if self.transport is None:
            self._lost_before_sending((pending,))
            return
        if self.out is not None:
            self.out.append(pending.wire)
        elif self.waiting:
            # Calls made in the same loop iteration go out in one write.
            self.out = [pending.wire]
            self.loop.call_soon(self._flush)
        else:
            self.transport.write(pending.wire)  # type: ignore[union-attr]
        self.waiting.append(pending)
        if pending.deadline < self.timer_due:
            self.arm(pending.deadline)

    def send_many(self, frames: list[bytes], calls: list[Any], deadline: float) -> None:
        """Send ``frames`` as the pending ``calls`` (one each, none due later than
        ``deadline``) in one write, or with the writes gathered in this loop pass."""
        if self.transport is None:
            self._lost_before_sending(calls)
            return
        if self.out is not None:
            self.out.extend(frames)
        else:
            self.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))
        self.waiting.extend(calls)
        if deadline < self.timer_due:
            self.arm(deadline)

    def _lost_before_sending(self, calls: Iterable[Any]) -> None:
        """Lost before these requests were written: a peer that resets right after
        accepting can end the connection between ``connect`` and the first send.  Each is
        settled as a loss with the request unanswered (the caller resubmits or reports
        it), on the next loop pass -- never re-entrantly inside the caller's send."""
        lost = _Unanswered(False, ConnectionResetError("mip: connection lost before sending"))
        for call in calls:
            self.loop.call_soon(_settle_lost, call, lost)

    def arm(self, deadline: float) -> None:
        """Have the connection's timer go off at ``deadline`` (loop time; earlier than it
        is due now)."""
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(deadline, self._expire)
        self.timer_due = deadline

    def _expire(self) -> None:
        self.timer = None
        self.timer_due = _NEVER
        now = self.loop.time()
        due = None
        for pending in self.waiting:
            fut = pending.future
            if fut.done():
                continue
            if pending.deadline <= now:
                # Its slot stays: the late reply, if any, is matched to it and dropped.
                fut.set_exception(
                    ClientTimeout(f"mip: no reply from {self.address} within {pending.timeout:g} s")
                )
            elif due is None or pending.deadline < due:
                due = pending.deadline
        if due is not None and not self.closed:
            self.timer = self.loop.call_at(due, self._expire)
            self.timer_due = due

    def _flush(self) -> None:
        out, self.out = self.out, None
        if out and self.transport is not None and not self.closed:
            self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        decoder = self.decoder
        waiting = self.waiting
        if type(data) is bytes and decoder.idle:
            # The whole replies of this read, without the decoder (the rest goes through it)
            answered, used = deliver_replies(data, waiting, decoder.max_message_size)
            self.answered += answered
            decoder.taken(used)
            if used == len(data):
                return
            data = data[used:]
        decoder.feed(data)
        while True:
            try:
                frame = decoder.next_frame()
            except Exception as exc:  # a reply we cannot frame: the stream is lost
                self.error = exc
                self.transport.abort()  # type: ignore[union-attr]
                return
            if frame is None:
                return
            if not waiting:
                self.error = UnexpectedReply("mip: a reply arrived for no request")
                self.transport.abort()  # type: ignore[union-attr]
                return
            self.answered += 1
            fut = waiting.popleft().future
            if not fut.done():  # a timed-out or cancelled call leaves its slot behind
                fut.set_result(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self.transport is not None and self.waiting:
            self._read_what_is_left(self.transport)
        self.closed = True
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.timer_due = _NEVER
        waiting, self.waiting = self.waiting, deque()
        for n, pending in enumerate(waiting):
            if pending.future.done():
                continue
            if self.error is not None and n == 0:
                pending.future.set_exception(self.error)
            else:
                # Retry only when the server showed it closes kept-alive connections: it
                # answered something on this connection first (KubeMo answers exactly one).
                retryable = self.answered > 0 and (n > 0 or not self.decoder.buffered)
                pending.future.set_exception(_Unanswered(retryable, exc))

    def _read_what_is_left(self, transport: asyncio.BaseTransport) -> None:
        """Deliver the replies the server sent before the connection broke.

        A server that answers one request per connection (KubeMo) replies, then closes.
        Pipelined requests written after that close fail with a broken pipe (at once, on a
        Unix socket), and asyncio then drops the connection without reading the reply that
        is already in the socket's receive buffer.  The socket is still open while
        ``connection_lost`` runs (asyncio closes it afterwards; a closed one has fileno
        -1), so that reply is read here, without blocking, and matched to its call as any
        other: the calls behind it are then retryable, as after an orderly close."""
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        while fd >= 0 and self.waiting and self.error is None:
            try:
                data = os.read(fd, _RECV_SIZE)
            except OSError:  # nothing more (EAGAIN), or the reset took it (ECONNRESET)
                return
            if not data:
                return
            self.data_received(data)

    def close(self) -> None:
        """Close on the client's side: calls still waiting fail (no retry)."""
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.timer_due = _NEVER
        waiting, self.waiting = self.waiting, deque()
        for pending in waiting:
            if not pending.future.done():
                pending.future.set_exception(ConnectionLost("mip: the client was closed"))
        if self.transport is not None:
            self.transport.close()


class AsyncClient:
    """An ``asyncio`` MIP client; concurrent calls are pipelined on one connection.

    ``timeout`` bounds each call; ``max_in_flight`` caps the requests awaiting replies (more
    calls wait their turn).  Replies larger than ``max_message_size``, or of more than
    ``max_items`` items, are refused.  Use ``async with AsyncClient(...) as client:`` or
    ``await client.close()``.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        max_in_flight: int = 128,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_items: int = DEFAULT_MAX_ITEMS,
    ) -> None:
        self._family, self._target = parse_address(address)
        self.address = address
        self.timeout = timeout
        self.max_message_size = max_message_size
        self.max_items = max_items
        self.max_in_flight = max_in_flight
        self._conn: _ClientConnection | None = None
        self._connecting: asyncio.Future[_ClientConnection] | None = None
        self._in_flight = 0  # calls holding a slot (max_in_flight at most)
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        # Set once the server closed a kept-alive connection after answering on it (KubeMo
        # answers one request per connection): from then on requests go one at a time, each
        # on a fresh connection, since a request written behind an answered one is never read
        # and may even cost the answer (the server's close can reset the connection).
        self._one_shot: asyncio.Lock | None = None

    # ------------------------------------------------------------------ public API

    @property
    def in_flight(self) -> int:
        """The calls holding one of the ``max_in_flight`` slots now (sent and awaiting
        their replies, or being sent)."""
        return self._in_flight

    async def ping(self) -> float:
        """Send a ping; return the round-trip time in seconds."""
        start = time.perf_counter()
        check_reply(await self._call(_PING), Ping, 0, self.address)
        return time.perf_counter() - start

    async def infer(self, batch: Iterable[Any]) -> list[tuple[Item, ...]]:
        """Run a batch (see :meth:`Client.infer`); return, per sample, its output items."""
        request = build_request(batch)
        reply = await self._call(mip.encode(request))
        msg = check_reply(reply, Inference, request.batch_size, self.address)
        return samples_of(msg)  # type: ignore[arg-type]

    async def infer_one(self, *inputs: Any) -> tuple[Item, ...]:
        """Run one sample; return its outputs."""
        return (await self.infer([inputs]))[0]

    async def request(self, message: Message) -> Message:
        """Send any message and return the server's reply as is (error replies included)."""
        return await self._call(mip.encode(message))

    async def request_wire(self, wire: bytes) -> tuple[bytes, Message]:
        """Send one already-encoded message; return the reply's bytes as received and its
        decoded form (error replies included, as :meth:`request`).  For relays: the bytes
        can be passed on without encoding again.  When the reply needed KubeMo's
        ``n_output`` correction (see :func:`~wirekit.mip.runtime.decode_reply`), the bytes
        returned are the corrected message's encoding."""
        return await self._call(wire, raw=True)  # type: ignore[return-value]

    def send_nowait(self, wire: bytes, callback: Any) -> bool:
        """Send an encoded message now, without a coroutine, if the connection is open and a
        slot is free; then ``callback(frame, None)`` is called with the reply's bytes, or
        ``callback(None, exc)`` on a timeout or a lost connection, exactly once, from the
        loop.  Returns False (nothing sent) otherwise: use the coroutine calls then.

        ``exc`` may be the private retryable-loss marker: check it with
        :func:`unanswered_retryable`.  The reply is not decoded (see
        :func:`~wirekit.mip.runtime.decode_reply`)."""
        conn = self._conn
        if conn is None or conn.closed or self._in_flight >= self.max_in_flight:
            return False
        self._in_flight += 1
        conn.send(
            _Pending(
                wire, _Callback(self, conn, callback), conn.loop.time() + self.timeout, self.timeout
            )
        )
        return True

    async def connect(self) -> None:
        """Open the connection now (calls open it on demand anyway)."""
        await self._connection(asyncio.get_running_loop().time() + self.timeout)

    async def close(self) -> None:
        """Close the connection; calls still waiting fail with :class:`ConnectionLost`."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ internals

    async def _connection(self, deadline: float) -> _ClientConnection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._connecting is None:
            loop = asyncio.get_running_loop()
            self._connecting = loop.create_future()
            try:
                conn = await asyncio.wait_for(self._open(), max(deadline - loop.time(), 0))
            except BaseException as exc:
                fut, self._connecting = self._connecting, None
                err: BaseException = exc
                if isinstance(exc, asyncio.TimeoutError):
                    err = ClientTimeout(f"mip: connecting to {self.address} timed out")
                elif isinstance(exc, OSError):
                    err = ConnectionLost(
                        f"mip: cannot connect to {self.address}: {exc.strerror or exc}"
                    )
                fut.set_exception(err)
                fut.exception()  # retrieved: only the callers waiting on it re-raise
                if err is exc:
                    raise
                raise err from exc
            self._conn = conn
            fut, self._connecting = self._connecting, None
            fut.set_result(conn)
            return conn
        return await asyncio.shield(self._connecting)

    async def _open(self) -> _ClientConnection:
        loop = asyncio.get_running_loop()

        def factory() -> _ClientConnection:
            return _ClientConnection(self.max_message_size, self.address)

        if self._family == "tcp":
            assert isinstance(self._target, tuple)
            host, port = self._target
            _t, conn = await loop.create_connection(factory, host, port)
        else:
            _t, conn = await loop.create_unix_connection(factory, str(self._target))
        return conn

    async def _call(self, wire: bytes, raw: bool = False) -> Any:
        conn = self._conn
        # The connection's loop is the running one (a connection lives on one loop); asking
        # asyncio costs a getpid() system call per call on Python 3.11.
        loop = conn.loop if conn is not None else asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        if self._in_flight >= self.max_in_flight:
            await self._wait_for_slot(loop, deadline)
        else:
            self._in_flight += 1
        try:
            while True:  # the pipelined connection (inline: the hot path)
                if self._one_shot is not None:  # set now, or learnt while this call waited
                    frame = await self._exchange_alone(wire, loop, deadline)
                    break
                conn = self._conn
                if conn is None or conn.closed:
                    conn = await self._connection(deadline)
                fut: asyncio.Future[bytes] = _Future(loop=loop)
                conn.send(_Pending(wire, fut, deadline, self.timeout))
                try:
                    frame = await fut
                    break
                except _Unanswered as exc:
                    if self._conn is conn:
                        self._conn = None
                    if not (exc.retryable and loop.time() < deadline):
                        raise ConnectionLost(
                            f"mip: {self.address} closed the connection without replying"
                        ) from exc.cause
                    # retryable: the server answered on this connection, then closed it
                    if self._one_shot is None:
                        self._one_shot = asyncio.Lock()
            msg = decode_reply(mip, frame, self.max_items)
            if not raw:
                return msg
            if type(msg) is Inference and msg.response and msg.n_output != frame[9]:
                frame = mip.encode(msg)  # the corrected reply, not the quirky bytes
            return frame, msg
        finally:
            self.release_slot()

    async def _exchange_alone(
        self, wire: bytes, loop: asyncio.AbstractEventLoop, deadline: float
    ) -> bytes:
        """Send ``wire`` as the only request of a fresh connection (a server that answers
        one request per connection); return the reply's frame."""
        lock = self._one_shot
        assert lock is not None
        try:
            await asyncio.wait_for(lock.acquire(), max(deadline - loop.time(), 0))
        except asyncio.TimeoutError:
            raise ClientTimeout(
                f"mip: no turn on {self.address} (one request per connection) within "
                f"{self.timeout:g} s"
            ) from None
        try:
            conn = self._conn
            if conn is not None and not conn.closed and (conn.answered or conn.waiting):
                self._conn = None  # spent: the server closes it after its answer
                conn.transport.close()  # type: ignore[union-attr]
            conn = await self._connection(deadline)
            fut: asyncio.Future[bytes] = _Future(loop=loop)
            conn.send(_Pending(wire, fut, deadline, self.timeout))
            try:
                return await fut
            except _Unanswered as exc:
                if self._conn is conn:
                    self._conn = None
                raise ConnectionLost(
                    f"mip: {self.address} closed the connection without replying"
                ) from exc.cause
        finally:
            lock.release()

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Wait until a call in flight finishes and hands its slot over (FIFO)."""
        waiter: asyncio.Future[None] = loop.create_future()
        self._slot_waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, max(deadline - loop.time(), 0))
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.release_slot()  # handed over, but this call is leaving
            else:
                waiter.cancel()
            if isinstance(exc, asyncio.TimeoutError):
                raise ClientTimeout(
                    f"mip: {self.max_in_flight} calls to {self.address} still in flight after "
                    f"{self.timeout:g} s"
                ) from None
            raise

    # ------------------------------------------------ calls without a coroutine (relays)

    def free_slots(self) -> tuple[_ClientConnection, int, float] | None:
        """For :meth:`send_calls`: the open pipelined connection, how many calls can be sent
        on it now without waiting, and the deadline (its loop's time) of a call sent now;
        None when no connection is open (not connected yet, or lost)."""
        conn = self._conn
        if conn is None or conn.closed:
            return None
        return conn, self.max_in_flight - self._in_flight, conn.loop.time() + self.timeout

    def send_calls(
        self, conn: _ClientConnection, frames: list[bytes], calls: list[Any], deadline: float
    ) -> None:
        """Send the encoded ``frames`` on ``conn`` (from :meth:`free_slots`) in one write,
        as the pending calls ``calls`` (one per frame, each with ``future``, ``deadline`` --
        at most ``deadline`` -- and ``timeout``, settled like :meth:`send_nowait`'s), taking
        a slot each: the caller checked that there are that many free slots.  Each call
        gives its slot back with :meth:`release_slot` or :meth:`call_failed` when it is
        settled."""
        self._in_flight += len(calls)
        conn.send_many(frames, calls, deadline)

    def call_failed(self, conn: _ClientConnection, exc: BaseException) -> None:
        """A call sent without a coroutine (:meth:`send_nowait`, :meth:`send_calls`) failed
        on ``conn``: its slot goes back; a lost connection is not used again."""
        self.release_slot()
        if isinstance(exc, _Unanswered) and self._conn is conn:
            self._conn = None

    def release_slot(self) -> None:
        """A call sent without a coroutine got its reply: its slot goes back (to the first
        call waiting for one, if any)."""
        waiters = self._slot_waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on: the count stays
                return
        self._in_flight -= 1


def unanswered_retryable(exc: BaseException) -> bool | None:
    """For a ``send_nowait`` failure: None if it is not a lost connection, else whether the
    request may be sent again (the server closed a kept-alive connection before reading it,
    as KubeMo's does after each reply)."""
    return exc.retryable if isinstance(exc, _Unanswered) else None


__all__ = [
    "AsyncClient",
    "Client",
    "ClientTimeout",
    "ConnectionLost",
    "ServerError",
    "UnexpectedReply",
]
