"""The Clipper side of the container RPC: a ROUTER that hosts model containers.

>>> with Frontend("tcp://127.0.0.1:7000", "v3") as fe:        # doctest: +SKIP
...     fe.wait_for("sum")
...     fe.predict("sum", [[1.0, 2.0], [3.0]], timeout=5.0)
['3.0', '3.0']

One thread owns the ROUTER (and the optional query socket) and moves frames between them and
a :class:`~wirekit.clipper.session.FrontendState` (the only place that changes the frontend's
state; its compiled twin, ``wirekit._fast.clipperfront``, compiles its per-message methods
``try_send`` and ``complete``, and its ``Wire`` moves the common v3 messages on libzmq);
callers hand work to it through a queue and get :class:`concurrent.futures.Future` results
(``predict`` blocks on one, ``apredict`` awaits one).  Containers that disconnect (seen
through a socket monitor) or stay silent longer than the activity timeout are dropped and
their batches sent to another replica.

The optional query socket (``query=``) answers JSON requests from ``wirekit clipper predict``:
``{"model": ..., "inputs": [...], "input_type": "doubles", "timeout": 5}`` ->
``{"outputs": [...]}`` or ``{"error": "..."}``.  A :class:`~wirekit.clipper.queries.QueryDesk`
takes or refuses each query within its caps (size, queries and bytes waiting, timeout); the
queries it takes are decoded on a thread of their own ("clipper-queries"), so a big one does
not hold up the socket loop while it is read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import json
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

import zmq
import zmq.utils.monitor

from wirekit._impl import fallback, load_fast, pure_requested
from wirekit.errors import DecodeError, WirekitError

from . import _zio
from ._zio import FAST_WAIT, FAST_WAIT_MS, NOBLOCK, recv_message, send_frames, timeout_ms, zmq_poll
from .container import parse_input_type
from .messages import Generation, InputType, as_generation
from .queries import (
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_MAX_QUERY_SIZE,
    DEFAULT_MAX_TIMEOUT,
    QueryDesk,
    Ticket,
)
from .session import (
    DEFAULT_ACTIVITY_TIMEOUT,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_REJECTED,
    Completed,
    Failed,
    FrontendState,
    PredictionError,
    Replica,
    zmq_max_frame_size,
)

log = logging.getLogger("wirekit.clipper.frontend")

DEFAULT_LISTEN = "tcp://127.0.0.1:7000"
DEFAULT_QUERY = "tcp://127.0.0.1:7001"
#: How long the background thread sleeps while a blocking caller drives the sockets: at first
#: _LOOK_AGAIN, twice as long after each look that found a caller still driving, at most
#: _LOOK_LATEST (a caller that leaves work behind kicks it at once; each wake-up of a sleeping
#: thread costs the caller's round trip tens of microseconds on a busy machine).
_LOOK_AGAIN = 0.005
_LOOK_LATEST = 0.1
#: How long a blocking ``predict`` caller keeps looking for its answer before it sleeps.
DEFAULT_SPIN = 0.0002
#: At most this many more answers already waiting are handled before the work they bring is
#: sent: the sends then go out together and wake the I/O thread once (each wake-up costs
#: several microseconds of kernel time on a virtual machine).
_BURST = 4


class Callback:
    """The token of one :meth:`Frontend.submit_callback`: calls ``fn(outputs, None)`` or
    ``fn(None, error)`` once (no lock, no condition variable: it is completed on the thread
    that drives the sockets); an exception the callback raises is logged.  (The compiled
    ``wirekit._fast.clipperfront.Callback`` is its twin.)"""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[Any, BaseException | None], Any]) -> None:
        self._fn: Callable[[Any, BaseException | None], Any] | None = fn

    def done(self) -> bool:
        return self._fn is None

    def set_result(self, value: Any) -> None:
        self._complete(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._complete(None, error)

    def _complete(self, value: Any, error: BaseException | None) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            try:
                fn(value, error)
            except Exception:
                log.exception("clipper frontend: a submit_callback callback raised")


class _Call:
    """The token of one blocking :meth:`Frontend.predict`: the part of a Future's interface
    the socket loop uses, without a condition variable per call (the caller usually
    completes it on its own thread; an event is made only when it has to wait)."""

    __slots__ = ("_done", "_error", "_event", "_value")

    def __init__(self) -> None:
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._event: threading.Event | None = None

    def done(self) -> bool:
        return self._done

    def set_result(self, value: Any) -> None:
        if not self._done:
            self._value = value
            self._finish()

    def set_exception(self, error: BaseException) -> None:
        if not self._done:
            self._error = error
            self._finish()

    def _finish(self) -> None:
        self._done = True
        event = self._event  # read after _done is set: a waiter sets it before re-checking
        if event is not None:
            event.set()

    def wait(self, timeout: float) -> bool:
        if self._done:
            return True
        if self._event is None:
            self._event = threading.Event()
        if self._done:
            return True
        return self._event.wait(timeout)


class Frontend:
    """Bind a ROUTER at ``listen`` and host Clipper model containers of ``generation``.

    ``max_in_flight`` batches are sent to each container before its answer (Clipper 2017
    keeps one); ``activity_timeout`` (TO, Clipper's 30 s) drops heartbeating containers that
    fall silent, checked every ``check_interval`` (TO/3).  A blocking :meth:`predict` caller
    that drives the sockets keeps looking for its answer for ``spin`` seconds (200 µs; the GIL
    released and the CPU yielded between looks) before it sleeps: on virtual machines a
    sleeping thread takes tens of microseconds to wake; ``spin=0`` turns this off.
    ``start()`` binds (errors surface there) and runs the socket thread; ``stop()`` ends it.
    ``max_rejected`` bounds how many peers of another generation are remembered
    (:attr:`FrontendState.rejected <wirekit.clipper.session.FrontendState>`);
    ``max_frame_size`` (256 MiB; None or 0: no limit) is the largest frame a container may
    send: libzmq disconnects a peer that announces a larger one before buffering it.

    The query socket's caps (see :class:`~wirekit.clipper.queries.QueryDesk`, held in
    :attr:`queries`): ``max_query_size`` (8 MiB) is the largest query body decoded;
    ``max_pending_queries`` (256) and ``max_pending_query_bytes`` (64 MiB of bodies) bound
    the queries taken and not yet answered; ``max_query_timeout`` (300 s) is the longest
    timeout a query may ask for.  A query past any of them is answered with an error at once.

    No input on any socket stops the socket loop.  Should it crash anyway (a bug), the
    traceback is logged, :attr:`error` holds the exception, every outstanding prediction
    fails with a :class:`PredictionError` saying so, every later one fails at once, and
    :meth:`wait` returns (``wirekit clipper frontend`` then exits with status 1).
    """

    def __init__(
        self,
        listen: str = DEFAULT_LISTEN,
        generation: Generation | str = Generation.V3,
        *,
        activity_timeout: float = DEFAULT_ACTIVITY_TIMEOUT,
        check_interval: float | None = None,
        max_in_flight: int = 1,
        query: str | None = None,
        context: zmq.Context[Any] | None = None,
        spin: float = DEFAULT_SPIN,
        max_rejected: int = DEFAULT_MAX_REJECTED,
        max_frame_size: int | None = DEFAULT_MAX_FRAME_SIZE,
        max_query_size: int = DEFAULT_MAX_QUERY_SIZE,
        max_pending_queries: int = DEFAULT_MAX_PENDING,
        max_pending_query_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        max_query_timeout: float = DEFAULT_MAX_TIMEOUT,
    ) -> None:
        self.listen = listen
        #: the query socket's caps and what is taken now
        self.queries = QueryDesk(
            max_query_size=max_query_size,
            max_pending=max_pending_queries,
            max_pending_bytes=max_pending_query_bytes,
            max_timeout=max_query_timeout,
        )
        # Queries taken, for the decoding thread (None: it ends); what it decoded, for the
        # thread driving the sockets: (ticket, Query or the DecodeError to answer).
        self._to_decode: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
        self._decoded: deque[Any] = deque()
        self._decoder: threading.Thread | None = None
        self._maxmsgsize = zmq_max_frame_size(max_frame_size)
        self.spin = spin
        self.generation = as_generation(generation)
        self.state: FrontendState = _STATE(
            self.generation,
            activity_timeout=activity_timeout,
            check_interval=check_interval,
            max_in_flight=max_in_flight,
            max_rejected=max_rejected,
        )
        #: the exception that crashed the socket loop (a bug), else None
        self.error: BaseException | None = None
        self._ended = threading.Event()  # the socket thread has ended
        self.query_address = query
        self.context = context or zmq.Context.instance()
        self.endpoint: str | None = None
        self.query_endpoint: str | None = None
        self._submissions: deque[Any] = deque()
        # Set by the thread driving the sockets when the state has batches to dispatch.
        self._submitted = False
        self._stop = threading.Event()
        self._stopping = False  # the same as _stop.is_set(), read without a call
        self._thread: threading.Thread | None = None
        self._owner: int | None = None  # the thread driving the sockets now, if any
        self._bg_ident: int | None = None
        # Wake-ups travel as a message into the ROUTER itself (from a DEALER on inproc, used
        # under _wake_lock): the thread driving the sockets sees them whether it polls or sits
        # in a blocking receive on the ROUTER.
        self._waker: zmq.Socket[Any] | None = None
        self._closed = False
        self._wake_lock = threading.Lock()
        self._wake_pending = False  # a wake-up is on its way to the thread driving the sockets
        self._sock: zmq.Socket[Any] | None = None
        # How ROUTER messages are sent and received (the compiled Wire's, or pyzmq's
        # through _zio), made with the sockets; answers completed by the Wire whose callers
        # are not completed at once wait in _later as (token, outputs).
        self._send: Callable[[Any], None] = _unbound
        self._receive: Callable[[bool, float], Any] = _unbound
        self._later: list[Any] = []
        self._monitor: zmq.Socket[Any] | None = None
        self._query: zmq.Socket[Any] | None = None
        self._fd_of: dict[bytes, int] = {}
        #: held by the thread moving frames (the background thread, or a blocking caller)
        self._io = threading.Lock()
        self._want_lock = threading.Lock()
        self._want = 0  # blocking callers waiting to drive the sockets themselves
        self._kick = threading.Event()
        self._sockets_closed = False
        self._poll_items: list[tuple[Any, int]] = []
        self._rcvtimeo = -1

    # -- lifecycle --

    def start(self) -> Frontend:
        """Bind the sockets and start the socket thread."""
        sock = self.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self._maxmsgsize)
        try:
            # Disconnections drop replicas; CLOSED tells stop() the port is free again.
            self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
            sock.bind(self.listen)
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            # A serial, not id(self): a stopped frontend's inproc name is released when
            # ZeroMQ closes its socket, after stop() returns, and a new frontend can have
            # the old one's id -- it then failed to bind ("Address already in use").
            wake_at = f"inproc://wirekit-clipper-wake-{os.getpid()}-{next(_WAKE_SERIAL)}"
            sock.bind(wake_at)
            self._waker = self.context.socket(zmq.DEALER)
            self._waker.setsockopt(zmq.LINGER, 0)
            self._waker.setsockopt(zmq.ROUTING_ID, _WAKE_ID)
            self._waker.connect(wake_at)
            if self.query_address:
                self._query = self.context.socket(zmq.ROUTER)
                self._query.setsockopt(zmq.LINGER, 0)
                self._query.setsockopt(zmq.MAXMSGSIZE, self.queries.max_frame_size)
                self._query.bind(self.query_address)
                self.query_endpoint = self._query.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException:
            self._close_sockets(sock)
            raise
        self._sock = sock
        if _FAST is not None:
            wire = _FAST.Wire(sock, (_FAST.Callback, _Call), self._later)
            self._send = wire.send
            self._receive = functools.partial(wire.receive, self.state)
        else:
            self._send = functools.partial(send_frames, sock)
            self._receive = functools.partial(recv_message, sock)
        self._poll_items = [
            (polled, zmq.POLLIN)
            for polled in (sock, self._monitor, self._query)
            if polled is not None
        ]
        if self._query is not None:
            self._decoder = threading.Thread(
                target=self._decode_queries, name="clipper-queries", daemon=True
            )
            self._decoder.start()
        self._thread = threading.Thread(target=self._loop, name="clipper-frontend", daemon=True)
        self._thread.start()
        log.info("clipper frontend (%s) listening on %s", self.generation.value, self.endpoint)
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        """End the socket thread; unfinished predictions fail."""
        self._stopping = True
        self._stop.set()
        self._wake()
        self._kick.set()
        self._to_decode.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._decoder is not None:
            self._decoder.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the socket thread has ended (:meth:`stop`, or a crash: see
        :attr:`error`); True when it has, False after ``timeout`` seconds."""
        return self._ended.wait(timeout)

    def _crashed(self, exc: BaseException) -> None:
        """The socket loop hit a bug: log it and stop; the socket thread fails the
        outstanding predictions, and every later one fails at once."""
        if self.error is None:
            self.error = exc
            log.critical(
                "clipper frontend: the socket loop crashed; stopping (every prediction now fails)",
                exc_info=exc,
            )
        self._stopping = True
        self._stop.set()
        self._kick.set()

    def _stopped_reason(self) -> str:
        error = self.error
        if error is None:
            return "the frontend stopped"
        return (
            f"the frontend's socket loop crashed ({type(error).__name__}: {error}); it is stopped"
        )

    def __enter__(self) -> Frontend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _close_sockets(self, sock: zmq.Socket[Any]) -> None:
        with self._wake_lock:
            self._closed = True
            if self._waker is not None:
                self._waker.close(0)
        if self._monitor is not None:
            if self.endpoint is not None:
                _release(sock, self.endpoint, self._monitor)
            sock.disable_monitor()
            self._monitor.close(0)
        if self._query is not None:
            if self.query_endpoint is not None:
                monitor = self._query.get_monitor_socket(zmq.EVENT_CLOSED)
                _release(self._query, self.query_endpoint, monitor)
                self._query.disable_monitor()
                monitor.close(0)
            self._query.close(0)
        sock.close(0)

    def _wake(self) -> None:
        # One wake-up in flight is enough: the thread driving the sockets clears the flag
        # when it receives it, before it looks at the submissions (a burst of submits from
        # another thread then costs one wake-up, not one each).
        if self._wake_pending:
            return
        with self._wake_lock:
            if self._closed:
                return
            self._wake_pending = True
            with contextlib.suppress(zmq.ZMQError):  # zmq.Again: wake-ups already queued
                send_frames(self._waker, (b"",), NOBLOCK)

    # -- the public API (any thread) --

    def submit(
        self,
        model: str,
        inputs: Any,
        timeout: float = 5.0,
        input_type: InputType | str | int | None = None,
    ) -> concurrent.futures.Future[Any]:
        """Queue one batch for ``model``; the future gets one output per input."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._submit(model, inputs, timeout, input_type, False, future)
        return future

    def submit_callback(
        self,
        model: str,
        inputs: Any,
        callback: Callable[[Any, BaseException | None], Any],
        timeout: float = 5.0,
        input_type: InputType | str | int | None = None,
    ) -> None:
        """Queue one batch for ``model``; ``callback(outputs, None)`` or ``callback(None,
        error)`` is called exactly once, on the thread that drives the sockets (or at once,
        on this thread, when the frontend is not running).

        The lightest way to keep many predictions in flight: no Future, no lock per call.
        The callback must be quick and must not block (it holds up every other answer); it
        may submit more work.  An exception it raises is logged and otherwise ignored.
        """
        token = _CALLBACK(callback)
        if input_type is None and self._owner == threading.get_ident() and not self._stopping:
            # A callback submitting the next batch: the _submit path without its checks.
            self._submit_here(model, inputs, time.monotonic() + timeout, token, None)
            return
        self._submit(model, inputs, timeout, input_type, False, token)

    def _submit_here(
        self, model: str, inputs: Any, deadline: float, token: Any, input_type: InputType | None
    ) -> None:
        """Submit on the thread driving the sockets: sent at once when nothing waits and a
        replica has room (``FrontendState.try_send``), else queued in the state (dispatched
        before the next sends)."""
        message = self.state.try_send(model, inputs, deadline, token, input_type)
        if message is None:
            self.state.submit(model, inputs, deadline, token, input_type)
            self._submitted = True
        else:
            self._send(message)

    def _submit(
        self, model: str, inputs: Any, timeout: float, input_type: Any, will_drive: bool, token: Any
    ) -> None:
        if input_type is not None:
            input_type = parse_input_type(input_type)
        if self._stopping or self._thread is None:
            token.set_exception(
                PredictionError(
                    "the frontend is not running" if self.error is None else self._stopped_reason()
                )
            )
            return
        deadline = time.monotonic() + timeout
        owner = self._owner
        if owner is not None and owner == threading.get_ident():
            self._submit_here(model, inputs, deadline, token, input_type)
            return
        self._submissions.append((model, inputs, deadline, token, input_type))
        if owner is None:
            if not will_drive:
                self._kick.set()  # nobody drives the sockets: the background thread will
        elif owner != threading.get_ident() and not (will_drive and owner == self._bg_ident):
            self._wake()

    def predict(
        self,
        model: str,
        inputs: Any,
        timeout: float = 5.0,
        input_type: InputType | str | int | None = None,
    ) -> Any:
        """Blocking prediction: the outputs, or :class:`PredictionError`.

        The calling thread moves the frames itself when no other caller is doing so (no hop
        to the socket thread and back).
        """
        me = threading.get_ident()
        call = _Call()
        drive = me != self._owner
        self._submit(model, inputs, timeout, input_type, drive, call)
        if drive and not call._done:
            self._run_as_caller(call)
        if not call.wait(timeout + 1.0):
            raise PredictionError(f"model {model!r}: no answer within {timeout} s")
        if call._error is not None:
            raise call._error
        return call._value

    async def apredict(
        self,
        model: str,
        inputs: Any,
        timeout: float = 5.0,
        input_type: InputType | str | int | None = None,
    ) -> Any:
        """``asyncio`` form of :meth:`predict`."""
        return await asyncio.wrap_future(self.submit(model, inputs, timeout, input_type))

    def replicas(self, model: str | None = None) -> list[Replica]:
        """A snapshot of the registered replicas (of one model, or all)."""
        found = list(self.state.replicas.values())
        return [r for r in found if model is None or r.model_name == model]

    def wait_for(self, model: str, count: int = 1, timeout: float = 10.0) -> list[Replica]:
        """Block until ``count`` replicas of ``model`` are registered, else TimeoutError."""
        end = time.monotonic() + timeout
        while True:
            found = self.replicas(model)
            if len(found) >= count:
                return found
            if time.monotonic() >= end:
                raise TimeoutError(
                    f"{len(found)} of {count} replicas of {model!r} registered after {timeout} s"
                )
            time.sleep(0.005)

    # -- the socket loop (run by whichever thread holds ``_io``) --

    def _loop(self) -> None:
        """The background thread: drives the sockets whenever no blocking caller does."""
        me = self._bg_ident = threading.get_ident()
        look = _LOOK_AGAIN
        try:
            while not self._stop.is_set():
                if not self._want and self._io.acquire(blocking=False):
                    look = _LOOK_AGAIN
                    try:
                        if not self._want:  # checked again now that we hold the sockets
                            self._owner = me
                            self._drive(None)
                    finally:
                        self._owner = None
                        self._io.release()
                else:
                    look = min(look * 2, _LOOK_LATEST)
                if not self._stop.is_set():
                    # A caller drives: wait for it to hand back work (or look again later).
                    if self._kick.wait(look):
                        look = _LOOK_AGAIN
                    self._kick.clear()
        except Exception as exc:  # a bug: make it loud, fail every prediction
            self._crashed(exc)
        finally:
            try:
                with self._io:
                    self._owner = me
                    try:
                        self._fail_all(self._stopped_reason())
                    finally:
                        self._owner = None
                        self._sockets_closed = True
                        self._close_sockets(
                            cast("zmq.Socket[Any]", self._sock)
                        )  # made before the loop
            finally:
                self._ended.set()

    def _drive(self, future: _Call | None) -> None:
        """Move frames until ``future`` is done (a caller) or a caller wants the sockets (the
        background thread, ``future`` None), or the frontend stops.  Hold ``_io``."""
        state, items = self.state, self._poll_items
        sock = cast("zmq.Socket[Any]", self._sock)  # made before any frame moves
        out: list[Any] = []
        self._flush(time.monotonic(), out)
        # While messages keep coming, the driving thread does blocking receives on the ROUTER
        # (a zmq_poll over every socket costs several syscalls per message; wake-ups arrive
        # on the ROUTER too); the monitor and query sockets are looked at every FAST_WAIT s,
        # and after a receive waits that long the full poll takes over.
        fast = future is not None
        # A blocking caller keeps looking for its answer a moment before it sleeps (waking a
        # sleeping thread costs tens of microseconds on a virtual machine).
        spin = self.spin if future is not None else 0.0
        look_at = time.monotonic() + FAST_WAIT
        receive = self._receive  # the Wire handles common answers, hands back the rest
        later = self._later
        while not self._stopping:
            if future is None:
                if self._want:
                    return
            elif future._done:
                return
            now = time.monotonic()
            due = state.deadline()
            wait = due - now
            if fast:
                ms = FAST_WAIT_MS if wait >= FAST_WAIT else timeout_ms(wait)
                if ms != self._rcvtimeo:
                    sock.setsockopt(zmq.RCVTIMEO, ms)
                    self._rcvtimeo = ms
                message = receive(True, spin)
                if message is None:
                    fast = False
                    continue
                now = time.monotonic()
                taken = 0
                while True:  # this message, and up to _BURST more already waiting
                    if type(message) is tuple:
                        self._handle(message, now, out)
                    elif message == _ANSWERED_QUEUE_WAITS:
                        self._submitted = True  # the replica has room again: dispatch
                    taken += 1
                    if taken > _BURST:
                        break
                    message = receive(False, 0.0)
                    if message is None:
                        break
                if now >= look_at:
                    look_at = now + FAST_WAIT
                    self._look_around(zmq_poll(items, 0), now, out)
                if (
                    out
                    or self._submitted
                    or self._submissions
                    or self._decoded
                    or state.events
                    or later
                    or now >= due
                ):
                    self._flush(now, out, due)
                continue
            if self._look_around(zmq_poll(items, timeout_ms(wait)), time.monotonic(), out):
                fast = True
                look_at = time.monotonic() + FAST_WAIT
            self._flush(time.monotonic(), out)

    def _look_around(self, ready: list[Any], now: float, out: list[Any]) -> bool:
        """Handle what ``zmq_poll`` found ready; True when the ROUTER had messages."""
        sock, monitor, query = self._sock, self._monitor, self._query
        busy = False
        for polled, _ in ready:
            if polled is sock:
                self._drain(sock, now, out, 256, until_event=True)
                busy = True
            elif polled is monitor:
                self._drain_monitor(now, out)
            elif polled is query:
                self._drain_queries(query, now)
        return busy

    def _flush(self, now: float, out: list[Any], due: float | None = None) -> None:
        """Take submissions, dispatch, tick when due, send ``out``, resolve futures.

        ``due``: ``state.deadline()`` as computed a moment ago, if known (any batch added
        since has a later deadline, or is looked at on the next turn)."""
        state, sock = self.state, self._sock
        while True:
            if self._decoded:
                self._take_queries(now)
            if self._submissions or self._submitted:
                self._submitted = False
                self._take_submissions(now)
                out.extend(state.dispatch(now))
            if now >= (state.deadline() if due is None else due):
                out.extend(state.tick(now))
            due = None
            for frames in out:
                send_frames(sock, frames)
            out.clear()
            if not (state.events or self._later):
                break
            self._resolve()
            if not (self._submissions or self._submitted):
                break

    def _run_as_caller(self, future: _Call) -> None:
        """Drive the sockets on the caller's thread until ``future`` is done: no hop to the
        socket thread and back.  When another caller drives them, it serves this batch too
        (and hands it to the background thread if it leaves first)."""
        if not self._io.acquire(blocking=False):
            with self._want_lock:
                self._want += 1
            try:
                self._wake()  # the background thread yields the sockets at its next turn
                while True:
                    if self._io.acquire(timeout=0.001):
                        break
                    if future.done() or self._owner not in (None, self._bg_ident):
                        self._kick.set()  # in case that caller left before seeing our batch
                        return
            finally:
                with self._want_lock:
                    self._want -= 1
        try:
            if self._sockets_closed or future.done():
                return
            self._owner = threading.get_ident()
            try:
                self._drive(future)
            except Exception as exc:  # a bug: the background thread fails every prediction
                self._crashed(exc)
            finally:
                self._owner = None
        finally:
            self._io.release()
            state = self.state
            if self._submissions or self._decoded or state.in_flight or any(state.pending.values()):
                self._kick.set()  # others' work is outstanding: the background thread takes it

    def _drain_monitor(self, now: float, out: list[Any]) -> None:
        monitor = cast("zmq.Socket[Any]", self._monitor)  # drained only when it exists
        while True:
            try:
                event = zmq.utils.monitor.recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] != zmq.EVENT_DISCONNECTED:
                continue
            fd = event["value"]
            for identity, known in list(self._fd_of.items()):
                if known == fd:
                    del self._fd_of[identity]
                    out.extend(self.state.remove(identity, "disconnected", now))

    def _drain(
        self, sock: zmq.Socket[Any], now: float, out: list[Any], limit: int, until_event: bool
    ) -> None:
        """Handle the messages waiting on the ROUTER (at most ``limit``, so timers and
        callers get their turn); with ``until_event``, stop once one completes a batch (its
        caller is woken first; the next poll sees the rest at once)."""
        state = self.state
        recv = recv_message
        for _ in range(limit):
            message = recv(sock, False)
            if message is None:
                return
            self._handle(message, now, out)
            if until_event and state.events:
                return

    def _handle(self, message: tuple[list[bytes], int], now: float, out: list[Any]) -> None:
        """One message from a container: ``(frames, source fd)``, the identity in front."""
        state = self.state
        replicas = state.replicas
        frames, fd = message
        identity = frames[0]
        if identity == _WAKE_ID:  # a wake-up: it did its job by ending the receive
            self._wake_pending = False
            return
        if len(frames) == 1:
            log.warning("clipper frontend: empty message from %s dropped", identity.hex())
            return
        del frames[0]
        if identity in replicas:
            out.extend(state.receive(identity, frames, now))
            return
        out.extend(state.receive(identity, frames, now))
        if identity in replicas:
            for other, other_fd in list(self._fd_of.items()):
                if other_fd == fd:  # that connection is gone: its fd is reused
                    del self._fd_of[other]
                    out.extend(state.remove(other, "its connection was replaced", now))
            self._fd_of[identity] = fd
        if len(self._fd_of) != len(replicas):
            for gone in [i for i in self._fd_of if i not in replicas]:
                del self._fd_of[gone]

    def _take_submissions(self, now: float) -> None:
        submissions, state = self._submissions, self.state
        while submissions:
            model, inputs, deadline, token, input_type = submissions.popleft()
            state.submit(model, inputs, deadline, token, input_type)

    def _resolve(self) -> None:
        later = self._later
        while later:  # answers the Wire matched, their callers not yet completed
            token, outputs = later.pop(0)
            self._complete(token, outputs, None)
        events, self.state.events = self.state.events, []
        for event in events:
            if type(event) is Completed:
                self._complete(event.token, event.outputs, None)
            else:
                self._complete(event.token, None, cast(Failed, event).error)

    def _complete(self, token: Any, outputs: Any, error: BaseException | None) -> None:
        if type(token) is tuple:
            self._answer_query(token[1], outputs, error)
            return
        try:  # a token already done (a cancelled future) refuses: nothing to do
            if error is None:
                token.set_result(outputs)
            else:
                token.set_exception(error)
        except concurrent.futures.InvalidStateError:
            pass

    def _fail_all(self, reason: str) -> None:
        state = self.state
        self._take_queries(time.monotonic())
        while True:  # queries not decoded yet are answered too
            try:
                ticket = self._to_decode.get_nowait()
            except queue.Empty:
                break
            if ticket is not None:
                self._answer_query(ticket, None, PredictionError(reason))
        self._to_decode.put(None)  # the decoding thread ends
        self._take_submissions(time.monotonic())
        for batch in list(state.in_flight.values()):
            state.events.append(_failed(batch.token, reason))
        for waiting in state.pending.values():
            for batch in waiting:
                state.events.append(_failed(batch.token, reason))
            waiting.clear()
        state.in_flight.clear()
        try:
            self._resolve()
        except Exception:  # pragma: no cover
            log.exception("clipper frontend: failing outstanding predictions")

    # -- JSON queries (wirekit clipper predict) --

    def _drain_queries(self, query: zmq.Socket[Any], now: float) -> None:
        """Take or refuse the queries waiting on the query socket (at most 64 at a turn):
        what the desk refuses is answered; a small query taken is decoded here, a larger
        one on the decoding thread (the socket loop goes on meanwhile)."""
        desk = self.queries
        for _ in range(64):
            try:
                frames = query.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            taken = desk.take(frames, now)
            if not isinstance(taken, Ticket):
                self._send_query(taken)
            elif taken.charged <= _DECODE_HERE:
                self._decode(taken)
            else:
                self._to_decode.put(taken)

    def _decode(self, ticket: Ticket) -> None:
        """Decode a query taken, for the thread driving the sockets to submit (or to answer
        its error)."""
        try:
            self._decoded.append((ticket, self.queries.decode(ticket)))
        except DecodeError as exc:
            self._decoded.append((ticket, exc))
        except Exception as exc:  # a bug: answered all the same, and loud
            log.exception("clipper frontend: decoding a query failed")
            self._decoded.append((ticket, PredictionError(f"the query could not be read: {exc}")))

    def _decode_queries(self) -> None:
        """The decoding thread: decode each large query taken, hand it to the thread driving
        the sockets, until told to end."""
        inbox = self._to_decode
        while True:
            ticket = inbox.get()
            if ticket is None or self._stopping:
                return
            log.debug(
                "clipper frontend: decoding a query of %d bytes from %s",
                ticket.charged,
                ticket.identity.hex(),
            )
            self._decode(ticket)
            if self._owner is None:
                self._kick.set()  # nobody drives the sockets: the background thread will
            else:
                self._wake()

    def _take_queries(self, now: float) -> None:
        """Submit the queries decoded (their timeout counts from when they were taken), or
        answer what is wrong with them."""
        decoded, state = self._decoded, self.state
        while decoded:
            ticket, query = decoded.popleft()
            if isinstance(query, BaseException):
                self._answer_query(ticket, None, query)
                continue
            refused = self.queries.admit(ticket, query)
            if refused is not None:
                self._send_query(refused)
                continue
            deadline = ticket.received + query.timeout
            state.submit(query.model, query.inputs, deadline, ("query", ticket), query.input_type)
            self._submitted = True  # dispatch it now, not at the next tick

    def _answer_query(self, ticket: Ticket, outputs: Any, error: BaseException | None) -> None:
        self.queries.answered(ticket)
        self._send_query(self.queries.reply(ticket.identity, outputs, error))

    def _send_query(self, frames: list[bytes]) -> None:
        if self._query is not None and not self._sockets_closed:
            self._query.send_multipart(frames)


#: Queries up to this many bytes are decoded on the thread driving the sockets (it takes
#: microseconds); larger ones on the decoding thread.
_DECODE_HERE = 64 << 10


#: The compiled twin of the frontend's per-message path (``FrontendState`` with its
#: per-message methods compiled, the ROUTER's ``Wire``, ``Callback``): it moves frames with
#: the Cython ``zio``, so only with it; else None (the reference classes are used).
def _load_fast() -> Any:
    if _zio.IMPLEMENTATION != "fast":  # the compiled Wire moves frames with the Cython zio
        if not pure_requested():
            fallback("clipperfront", "the compiled zio is not in use")
        return None
    return load_fast("clipperfront")


_FAST: Any = _load_fast()
_STATE: type = FrontendState if _FAST is None else _FAST.FrontendState
_CALLBACK: type = Callback if _FAST is None else _FAST.Callback
#: ``"fast"`` (compiled) or ``"pure"``.
IMPLEMENTATION = "pure" if _FAST is None else "fast"
#: The compiled Wire's ``receive`` result for an answer handled whose model has a queue.
_ANSWERED_QUEUE_WAITS = 2


def _unbound(*args: Any) -> Any:
    raise RuntimeError("the frontend has not been started")


#: How long stopping a frontend waits, per bound socket, for ZeroMQ to close its listening
#: socket: ZeroMQ closes it on its I/O thread, after ``zmq_close``/``zmq_unbind`` return, so
#: without the wait a frontend bound to the same address at once finds it still in use.
_RELEASE_WAIT = 2.0


def _release(sock: zmq.Socket[Any], endpoint: str, monitor: zmq.Socket[Any]) -> bool:
    """Unbind ``endpoint`` (bound by ``sock``) and wait, at most ``_RELEASE_WAIT`` s, until
    ``monitor`` (``sock``'s, watching ``EVENT_CLOSED``) reports the listening socket closed;
    False when it did not say so in time (logged)."""
    try:
        sock.unbind(endpoint)
    except zmq.ZMQError:  # pragma: no cover - already unbound
        return False
    wanted = endpoint.encode()
    end = time.monotonic() + _RELEASE_WAIT
    while True:
        left = end - time.monotonic()
        if left <= 0 or not monitor.poll(max(1, int(left * 1000))):
            log.warning(
                "clipper frontend: %s was not released within %.3g s", endpoint, _RELEASE_WAIT
            )
            return False
        event = zmq.utils.monitor.recv_monitor_message(monitor)
        if event["event"] == zmq.EVENT_CLOSED and event["endpoint"] == wanted:
            return True


#: The routing id of the frontend's own wake-up socket (containers get 5-byte ids from the
#: ROUTER, which start with a zero byte; an id set by a peer cannot).
_WAKE_ID = b"\x00wirekit-wake"
_WAKE_SERIAL = itertools.count()  # names each frontend's inproc wake-up endpoint


def _failed(token: Any, reason: str) -> Failed:
    return Failed(token, PredictionError(reason))


def query(
    address: str,
    model: str,
    inputs: Sequence[Any],
    input_type: InputType | str | None = None,
    timeout: float = 5.0,
    context: zmq.Context[Any] | None = None,
) -> list[Any]:
    """Ask a running frontend's query socket for a prediction (``wirekit clipper predict``).

    Returns the outputs; raises :class:`PredictionError` with the frontend's message.
    """
    ctx = context or zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        body: dict[str, Any] = {"model": model, "inputs": list(inputs), "timeout": timeout}
        if input_type is not None:
            itype = parse_input_type(input_type)
            body["input_type"] = itype.name.lower()
            if itype == InputType.BYTES:
                body["inputs"] = [bytes(x).hex() for x in inputs]
        sock.send_multipart([b"", json.dumps(body).encode()])
        if not sock.poll(int((timeout + 1.0) * 1000)):
            raise PredictionError(f"no answer from the frontend at {address}")
        frames = sock.recv_multipart()
        reply = json.loads(frames[-1])
    finally:
        sock.close(0)
    if "error" in reply:
        raise PredictionError(reply["error"])
    return reply["outputs"]


__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_QUERY",
    "Frontend",
    "PredictionError",
    "WirekitError",
    "query",
]
