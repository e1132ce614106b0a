"""A Clipper model container: serves a Python predict function over a DEALER socket.

>>> def predict(inputs):                       # doctest: +SKIP
...     return [str(x.sum()) for x in inputs]
>>> ModelContainer(predict, "sum", "1", "doubles", "tcp://127.0.0.1:7000").run()  # +SKIP

The socket thread owns the DEALER and moves frames between it and a
:class:`~wirekit.clipper.session.ContainerSession`, the only place that changes the session's
state.  While requests flow, a loop (:mod:`wirekit.clipper._lane`) serves them: the pure twin
hands every message to ``ContainerSession.receive``; the Cython twin decodes the common ones
itself and keeps the session's state through its public methods (it makes no Python object
per message but the model's inputs and outputs).  The socket thread runs the model itself (no hop to
another thread and back for fast models); when a call outlasts half the heartbeat period, a
standby thread takes the socket over until the model returns, so heartbeats keep flowing
while a slow model works (a v3 Clipper expires containers silent for 30 s).  The socket is
used by one thread at a time, handed over under a lock (ZeroMQ sockets are not thread-safe,
but may move between threads with a memory barrier).
Malformed messages are logged and dropped; a model that raises or returns the wrong outputs
is logged with the message id and the container keeps serving.  :meth:`ModelContainer.run`
raises :class:`~wirekit.clipper.session.VersionMismatch` when the peer speaks another
generation (its first messages read as another generation only; once it has spoken this one,
such a message is malformed: logged and dropped).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, cast

import zmq
import zmq.utils.monitor

from wirekit._callables import load_callable

from ._lane import END, IDLE, LOOK, Lane
from ._zio import recv_message, send_frames, timeout_ms, zmq_poll
from .messages import RPC_VERSION, Generation, InputType, NewContainer, as_generation
from .session import (
    DEFAULT_ACTIVITY_TIMEOUT,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_POLL_INTERVAL,
    ContainerSession,
    OutputError,
    Predict,
    Reconnect,
    Send,
    VersionMismatch,
    check_seconds,
    zmq_max_frame_size,
)

log = logging.getLogger("wirekit.clipper.container")

DEFAULT_PORT = 7000
_INPUT_TYPE_NAMES = {t.name.lower(): t for t in InputType} | {
    "byte": InputType.BYTES,
    "int": InputType.INTS,
    "integers": InputType.INTS,
    "float": InputType.FLOATS,
    "double": InputType.DOUBLES,
    "string": InputType.STRINGS,
    "str": InputType.STRINGS,
}

PredictFn = Callable[[Any], Any]


def parse_input_type(value: str | int | InputType) -> InputType:
    """An input type from its code (0..4) or name ("doubles", "strings", ...)."""
    if isinstance(value, InputType):
        return value
    code = -1
    if isinstance(value, int):
        code = value
    elif isinstance(value, str) and value.strip().isdecimal():
        digits = value.strip().lstrip("0") or "0"
        code = int(digits) if len(digits) == 1 else -1  # no int() of a peer's long string
    elif isinstance(value, str) and value.strip().lower() in _INPUT_TYPE_NAMES:
        return _INPUT_TYPE_NAMES[value.strip().lower()]
    if 0 <= code <= 4:
        return InputType(code)
    raise ValueError(
        f"unknown input type {value!r:.40} (bytes, ints, floats, doubles, strings or 0..4)"
    )


def load_function(spec: str) -> PredictFn:
    """Import the predict function named ``package.module:function``."""
    return load_callable(spec)


def address_from_env(environ: Mapping[str, str] | None = None) -> str:
    """``tcp://CLIPPER_IP:CLIPPER_PORT`` (defaults 127.0.0.1 and 7000)."""
    env = os.environ if environ is None else environ
    ip = env.get("CLIPPER_IP", "127.0.0.1")
    port = int(env.get("CLIPPER_PORT", DEFAULT_PORT))
    if not 0 < port < 65536:
        raise ValueError(f"CLIPPER_PORT must be a TCP port (1 to 65535), got {port}")
    return f"tcp://{ip}:{port}"


class ModelContainer:
    """Serve ``predict`` as model ``model_name:model_version`` to a Clipper at ``address``.

    ``predict`` gets the decoded inputs of one request (a 2-D array, a list of 1-D arrays or
    a list of ``str``) and returns one output per input: numbers for 2016, ``str`` for 2017
    and v3.  ``poll_interval`` (D) and ``activity_timeout`` (TO) are Clipper's 5 s and 30 s
    by default.  ``threaded=False`` turns the standby thread off (no heartbeats while the
    model runs: only for models much faster than TO).  ``max_frame_size`` (256 MiB; None or
    0: no limit) is the largest frame Clipper may send: libzmq drops the connection of a
    peer that announces a larger one before buffering it, and the container starts over.
    """

    def __init__(
        self,
        predict: PredictFn,
        model_name: str,
        model_version: str,
        input_type: InputType | str | int = InputType.DOUBLES,
        address: str = f"tcp://127.0.0.1:{DEFAULT_PORT}",
        *,
        generation: Generation | str = Generation.V3,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        activity_timeout: float = DEFAULT_ACTIVITY_TIMEOUT,
        threaded: bool = True,
        context: zmq.Context[Any] | None = None,
        max_frame_size: int | None = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self.predict = predict
        self._maxmsgsize = zmq_max_frame_size(max_frame_size)
        self.generation = as_generation(generation)
        self.registration = NewContainer(
            model_name,
            str(model_version),
            parse_input_type(input_type),
            RPC_VERSION if self.generation is Generation.V3 else None,
        )
        self.address = address
        self.poll_interval = check_seconds("poll_interval", poll_interval)
        self.activity_timeout = check_seconds("activity_timeout", activity_timeout)
        self.threaded = threaded
        self.context = context or zmq.Context.instance()
        #: sessions started so far (one per socket); ``served``: responses sent
        self.sessions = 0
        self.served = 0
        self.failures = 0
        self.session: ContainerSession | None = None
        self._stop = threading.Event()
        #: True once :meth:`stop` was called (the same as an event, read without a call)
        self.stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closed = False
        self._wake_lock = threading.Lock()
        # The socket is used by whoever holds _sock_lock: the socket thread, or the standby
        # thread while the model runs on the socket thread for longer than D/2.
        self._sock_lock = threading.Lock()
        self._model_started: float | None = None  # set while the model runs
        self._standby_active = False
        self._standby: threading.Thread | None = None
        self._io: tuple[Any, ...] | None = (
            None  # (socket, session, poller, monitor) of this session
        )
        self._backlog: deque[Any] = deque()  # requests the standby took while the model ran
        self._lost: str | None = None  # the standby saw the session end
        self._lost_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @classmethod
    def from_env(
        cls, predict: PredictFn, environ: Mapping[str, str] | None = None, **kwargs: Any
    ) -> ModelContainer:
        """Configure as Clipper's containers: ``CLIPPER_MODEL_NAME``, ``..._VERSION``,
        ``CLIPPER_IP``, ``CLIPPER_PORT`` (7000), ``CLIPPER_INPUT_TYPE`` (doubles)."""
        env = os.environ if environ is None else environ
        try:
            name = kwargs.pop("model_name", None) or env["CLIPPER_MODEL_NAME"]
            version = kwargs.pop("model_version", None) or env["CLIPPER_MODEL_VERSION"]
        except KeyError as exc:
            raise ValueError(f"{exc.args[0]} is not set and no explicit value given") from None
        input_type = kwargs.pop("input_type", None) or env.get("CLIPPER_INPUT_TYPE", "doubles")
        address = kwargs.pop("address", None) or address_from_env(env)
        return cls(predict, name, version, input_type, address, **kwargs)

    # -- lifecycle --

    def start(self) -> ModelContainer:
        """Run in a background thread (see :meth:`stop`, :attr:`error`)."""
        self._thread = threading.Thread(
            target=self._run_catching, name="clipper-container", daemon=True
        )
        self._thread.start()
        return self

    def _run_catching(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # reported through .error
            self.error = exc
            if isinstance(exc, VersionMismatch):
                log.error("clipper container stopped: %s", exc)
            else:  # a bug: the traceback says where
                log.critical("clipper container stopped: %s", exc, exc_info=exc)

    def stop(self, timeout: float | None = 5.0) -> None:
        """Ask the loop to end and wait for the background thread."""
        self.stopping = True
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the background thread has ended (:meth:`stop`, a version mismatch
        or a crash: see :attr:`error`); True when it has (or never started), False after
        ``timeout`` seconds."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def __enter__(self) -> ModelContainer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wake(self) -> None:
        with self._wake_lock:
            if self._closed:
                return
            with contextlib.suppress(BlockingIOError):  # a full pipe: the loop is awake
                os.write(self._wake_w, b"x")

    # -- the standby thread --

    def _standby_loop(self) -> None:
        """Sleep; take the socket over while a model call outlasts D/2, until it returns."""
        nap = max(self.poll_interval / 2, 0.001)
        while not self._stop.wait(nap):
            started = self._model_started
            if started is None or time.monotonic() - started < nap:
                continue
            if not self._sock_lock.acquire(blocking=False):
                continue
            try:
                self._standby_active = True
                if self._model_started is not None and self._io is not None:
                    self._keep_alive(*self._io)
            except BaseException as exc:  # VersionMismatch: the socket thread re-raises it
                self._lost_error = exc
            finally:
                self._standby_active = False
                self._sock_lock.release()

    def _keep_alive(
        self,
        sock: zmq.Socket[Any],
        session: ContainerSession,
        poller: zmq.Poller,
        monitor: zmq.Socket[Any] | None,
    ) -> None:
        """The socket loop while the model runs elsewhere: heartbeats, requests queued."""

        def send(frames: Any) -> None:
            send_frames(sock, frames)

        while self._model_started is not None and not self._stop.is_set():
            wait = session.deadline() - time.monotonic()
            timeout = None if wait == float("inf") else max(0, int(wait * 1000) + 1)
            events = dict(poller.poll(timeout))
            now = time.monotonic()
            if sock in events:
                for _ in range(64):
                    message = recv_message(sock, False)
                    if message is None:
                        break
                    for action in session.receive(message[0], now):
                        if type(action) is Predict:
                            self._backlog.append(action.request)
                        elif type(action) is Send:
                            send(action.frames)
                        else:
                            self._lost = cast(Reconnect, action).reason
                            return
            if self._wake_r in events:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            if monitor is not None and monitor in events:
                event = zmq.utils.monitor.recv_monitor_message(monitor)
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    self._lost = "connection lost"
                    return
            for action in session.tick(now):
                if type(action) is Reconnect:
                    self._lost = action.reason
                    return
                send(cast(Send, action).frames)

    # -- the socket thread --

    def _new_socket(self) -> tuple[zmq.Socket[Any], zmq.Socket[Any] | None]:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self._maxmsgsize)
        # A send that cannot leave for TO raises zmq.Again instead of blocking for ever: libzmq
        # does not reconnect a connection that broke the protocol (a frame over max_frame_size,
        # bytes that are not ZMTP), and a DEALER with no connection blocks in send.
        sock.setsockopt(zmq.SNDTIMEO, timeout_ms(self.activity_timeout))
        monitor = None
        if self.generation is Generation.G2016:
            # 2016 Clipper never speaks first: watch the connection to notice it go away.
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sock.connect(self.address)
        return sock, monitor

    def run(self) -> None:
        """Serve until :meth:`stop`; raises :class:`VersionMismatch` on a wrong peer."""
        if self.threaded:
            self._standby = threading.Thread(
                target=self._standby_loop, name="clipper-standby", daemon=True
            )
            self._standby.start()
        self._sock_lock.acquire()
        try:
            while not self._stop.is_set():
                if not self._serve_one_socket():
                    break
        finally:
            self._io = None
            self._sock_lock.release()
            if self._standby is not None:
                self._stop.set()
                self._standby.join(timeout=1.0)
            with self._wake_lock:
                self._closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _serve_one_socket(self) -> bool:
        """One session on a new socket; False when the container should stop."""
        sock, monitor = self._new_socket()
        self.sessions += 1
        session_no = self.sessions
        now = time.monotonic()
        session = self.session = ContainerSession(
            self.generation,
            self.registration,
            poll_interval=self.poll_interval,
            activity_timeout=self.activity_timeout,
            now=now,
        )
        log.info(
            "clipper container: session %d to %s (%s)",
            session_no,
            self.address,
            self.generation.value,
        )
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        if monitor is not None:
            poller.register(monitor, zmq.POLLIN)
        items = list(poller.sockets)
        others = [item for item in items if item[0] is not sock]

        send = functools.partial(send_frames, sock)
        self._io = (sock, session, poller, monitor)
        self._lost = self._lost_error = None
        self._backlog.clear()
        try:
            lane = Lane(self, sock, session, send)
            for action in session.start(now):
                send(action.frames)
            # While requests flow, the lane serves them with blocking receives on the DEALER
            # (a zmq_poll costs several syscalls per message) and comes back every FAST_WAIT s
            # for the wake-up pipe and the monitor; the full poll takes over once a receive
            # waits that long.
            fast = False
            while not self.stopping:
                if fast:
                    outcome = lane.run()
                    if outcome == END:
                        return True
                    fast = outcome != IDLE
                    ready = zmq_poll(others, 0) if outcome == LOOK else []
                else:
                    ready = zmq_poll(items, timeout_ms(session.deadline() - time.monotonic()))
                    now = time.monotonic()
                    for polled, _ in ready:
                        if polled is sock:
                            message = recv_message(sock, False)
                            if message is not None:
                                fast = True
                                if not lane.handle(message[0], now):
                                    return True
                if ready and not self._look_at(ready, sock, monitor):
                    return True
                now = time.monotonic()
                if now >= session.deadline() and not self.handle_actions(
                    session.tick(now), session, send
                ):
                    return True
            return False
        except VersionMismatch:
            self._stop.set()
            raise
        except zmq.Again:
            log.warning(
                "clipper container: nothing could be sent for %s s (no connection to "
                "Clipper); reconnecting",
                self.activity_timeout,
            )
            return True
        finally:
            self._io = None
            if monitor is not None:
                sock.disable_monitor()
                monitor.close(0)
            sock.close(0)

    def _look_at(
        self, ready: list[Any], sock: zmq.Socket[Any], monitor: zmq.Socket[Any] | None
    ) -> bool:
        """Drain the wake-up pipe and read the monitor; False when the connection is lost."""
        for polled, _ in ready:
            if polled is sock:
                continue
            if polled == self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            elif polled is monitor:
                event = zmq.utils.monitor.recv_monitor_message(monitor)
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    log.warning("clipper container: connection lost; reconnecting")
                    return False
        return True

    def handle_actions(
        self, actions: list[Any], session: ContainerSession, send: Callable[..., Any]
    ) -> bool:
        """Carry out the session's actions; False when the session is over (logged)."""
        for action in actions:
            kind = type(action)
            if kind is Send:
                send(action.frames)
            elif kind is Predict:
                if not self.serve_request(action.request, session, send):
                    return False
            else:
                log.warning("clipper container: %s; reconnecting", action.reason)
                return False
        return True

    # -- the per-message steps (also the compiled lane's: wirekit._fast.clippercontainer) --

    def run_model(self, inputs: Any) -> tuple[Any, BaseException | None]:
        """The model on ``inputs``: ``(outputs, None)`` or ``(None, the exception)``.  With
        the standby thread (``threaded``), the socket is left to it meanwhile: call with the
        socket lock held (as the socket thread always does), then see
        :meth:`standby_intervened`."""
        if not self.threaded:
            try:
                return self.predict(inputs), None
            except Exception as exc:
                return None, exc
        self._model_started = time.monotonic()
        self._sock_lock.release()  # the standby may keep the session alive meanwhile
        try:
            return self.predict(inputs), None
        except Exception as exc:
            return None, exc
        finally:
            self._model_started = None
            if self._standby_active:
                self._wake()  # the standby serves the socket: make it hand it back
            self._sock_lock.acquire()

    def standby_intervened(self) -> bool:
        """While the model ran, the standby thread saw the session end or queued requests:
        the answer must go through :meth:`after_model`."""
        return self._lost is not None or self._lost_error is not None or bool(self._backlog)

    def serve_request(
        self, request: Any, session: ContainerSession, send: Callable[..., Any]
    ) -> bool:
        """Run the model on ``request`` (and on any the standby queued meanwhile) and send
        the answers; False when the session ended while the model ran."""
        outputs, exc = self.run_model(request.inputs)
        return self.after_model(request, outputs, exc, session, send)

    def after_model(
        self,
        request: Any,
        outputs: Any,
        exc: BaseException | None,
        session: ContainerSession,
        send: Callable[..., Any],
    ) -> bool:
        """Once the model returned: answer ``request`` unless the session ended meanwhile
        (False), then serve the requests the standby queued."""
        while True:
            if self._lost_error is not None:
                raise self._lost_error
            if self._lost is not None:
                log.warning(
                    "clipper container: %s; reconnecting (answer to message %d dropped)",
                    self._lost,
                    request.msg_id,
                )
                return False
            self.finish(request, outputs, exc, session, send, time.monotonic())
            if not self._backlog:
                return True
            request = self._backlog.popleft()
            outputs, exc = self.run_model(request.inputs)

    def finish(
        self,
        request: Any,
        outputs: Any,
        exc: BaseException | None,
        session: ContainerSession,
        send: Callable[..., Any],
        now: float,
    ) -> None:
        """Send the answer to ``request``, or log why there is none."""
        if exc is not None:
            self.failures += 1
            log.error("clipper container: model failed on message %d: %r", request.msg_id, exc)
            return
        try:
            actions = session.respond(request, outputs, now)
        except OutputError as exc:
            self.failures += 1
            log.error("clipper container: message %d: %s; nothing sent", request.msg_id, exc)
            return
        for action in actions:
            self.served += 1
            send(action.frames)


__all__ = [
    "DEFAULT_PORT",
    "ModelContainer",
    "VersionMismatch",
    "address_from_env",
    "load_function",
    "parse_input_type",
]
