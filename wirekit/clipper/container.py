"""A Clipper model container: serves a Python predict function over a DEALER socket.

>>> def predict(inputs):                       # doctest: +SKIP
...     return [str(x.sum()) for x in inputs]
>>> ModelContainer(predict, "sum", "1", "doubles", "tcp://127.0.0.1:7000").run()  # +SKIP

The socket thread owns the DEALER and only moves frames between it and a
:class:`~wirekit.clipper.session.ContainerSession`; the model runs on its own thread, so
heartbeats keep flowing while it works (a v3 Clipper expires containers silent for 30 s).
Malformed messages are logged and dropped; a model that raises or returns the wrong outputs
is logged with the message id and the container keeps serving.  :meth:`ModelContainer.run`
raises :class:`~wirekit.clipper.session.VersionMismatch` when the peer speaks another
generation.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import zmq
import zmq.utils.monitor

from .messages import RPC_VERSION, Generation, InputType, NewContainer, as_generation
from .session import (
    DEFAULT_ACTIVITY_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    ContainerSession,
    OutputError,
    Predict,
    Reconnect,
    Send,
    VersionMismatch,
)

log = logging.getLogger("wirekit.clipper.container")
NOBLOCK = int(zmq.NOBLOCK)

DEFAULT_PORT = 7000
_INPUT_TYPE_NAMES = {t.name.lower(): t for t in InputType} | {
    "byte": InputType.BYTES, "int": InputType.INTS, "integers": InputType.INTS,
    "float": InputType.FLOATS, "double": InputType.DOUBLES, "string": InputType.STRINGS,
    "str": InputType.STRINGS,
}

PredictFn = Callable[[Any], Any]


def parse_input_type(value: str | int | InputType) -> InputType:
    """An input type from its code (0..4) or name ("doubles", "strings", ...)."""
    if isinstance(value, InputType):
        return value
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        code = int(value)
        if 0 <= code <= 4:
            return InputType(code)
    elif isinstance(value, str) and value.strip().lower() in _INPUT_TYPE_NAMES:
        return _INPUT_TYPE_NAMES[value.strip().lower()]
    raise ValueError(
        f"unknown input type {value!r} (bytes, ints, floats, doubles, strings or 0..4)"
    )


def load_function(spec: str) -> PredictFn:
    """Import ``package.module:function`` (``function`` may be dotted, e.g. ``Cls.method``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected package.module:function, got {spec!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec} is not callable")
    return obj


def address_from_env(environ: Mapping[str, str] | None = None) -> str:
    """``tcp://CLIPPER_IP:CLIPPER_PORT`` (defaults 127.0.0.1 and 7000)."""
    env = os.environ if environ is None else environ
    ip = env.get("CLIPPER_IP", "127.0.0.1")
    port = int(env.get("CLIPPER_PORT", DEFAULT_PORT))
    return f"tcp://{ip}:{port}"


class ModelContainer:
    """Serve ``predict`` as model ``model_name:model_version`` to a Clipper at ``address``.

    ``predict`` gets the decoded inputs of one request (a 2-D array, a list of 1-D arrays or
    a list of ``str``) and returns one output per input: numbers for 2016, ``str`` for 2017
    and v3.  ``poll_interval`` (D) and ``activity_timeout`` (TO) are Clipper's 5 s and 30 s
    by default.  ``threaded=False`` runs the model on the socket thread (no heartbeats while
    it runs: only for models much faster than TO).
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
        context: zmq.Context | None = None,
    ) -> None:
        self.predict = predict
        self.generation = as_generation(generation)
        self.registration = NewContainer(
            model_name, str(model_version), parse_input_type(input_type),
            RPC_VERSION if self.generation is Generation.V3 else None,
        )
        self.address = address
        self.poll_interval = poll_interval
        self.activity_timeout = activity_timeout
        self.threaded = threaded
        self.context = context or zmq.Context.instance()
        #: sessions started so far (one per socket); ``served``: responses sent
        self.sessions = 0
        self.served = 0
        self.failures = 0
        self.session: ContainerSession | None = None
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closed = False
        self._wake_lock = threading.Lock()
        self._results: deque[tuple[int, Any, Any, BaseException | None]] = deque()
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
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
        self._thread = threading.Thread(target=self._run_catching, name="clipper-container",
                                        daemon=True)
        self._thread.start()
        return self

    def _run_catching(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # reported through .error
            self.error = exc
            log.error("clipper container stopped: %s", exc)

    def stop(self, timeout: float | None = 5.0) -> None:
        """Ask the loop to end and wait for the background thread."""
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout)

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

    # -- the model thread --

    def _model_loop(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            session_no, request = item
            self._results.append((session_no, request, *self._call(request)))
            self._wake()

    def _call(self, request: Any) -> tuple[Any, BaseException | None]:
        try:
            return self.predict(request.inputs), None
        except Exception as exc:
            return None, exc

    # -- the socket thread --

    def _new_socket(self) -> tuple[zmq.Socket, zmq.Socket | None]:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        monitor = None
        if self.generation is Generation.G2016:
            # 2016 Clipper never speaks first: watch the connection to notice it go away.
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sock.connect(self.address)
        return sock, monitor

    def run(self) -> None:
        """Serve until :meth:`stop`; raises :class:`VersionMismatch` on a wrong peer."""
        if self.threaded:
            self._worker = threading.Thread(target=self._model_loop, name="clipper-model",
                                            daemon=True)
            self._worker.start()
        try:
            while not self._stop.is_set():
                if not self._serve_one_socket():
                    break
        finally:
            if self._worker is not None:
                self._work.put(None)
                self._worker.join(timeout=1.0)
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
            self.generation, self.registration, poll_interval=self.poll_interval,
            activity_timeout=self.activity_timeout, now=now,
        )
        log.info("clipper container: session %d to %s (%s)", session_no, self.address,
                 self.generation.value)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        if monitor is not None:
            poller.register(monitor, zmq.POLLIN)
        recv, send = sock.recv_multipart, sock.send_multipart
        try:
            for action in session.start(now):
                send(action.frames)
            while not self._stop.is_set():
                wait = session.deadline() - time.monotonic()
                timeout = None if wait == float("inf") else max(0, int(wait * 1000) + 1)
                events = dict(poller.poll(timeout))
                now = time.monotonic()
                if sock in events:
                    for _ in range(64):  # drain what is there, bounded
                        try:
                            frames = recv(NOBLOCK)
                        except zmq.Again:
                            break
                        for action in session.receive(frames, now):
                            if type(action) is Predict:
                                self._dispatch(session_no, action.request, session, send)
                            elif type(action) is Send:
                                send(action.frames)
                            else:
                                log.warning("clipper container: %s; reconnecting",
                                            action.reason)
                                return True
                if self._wake_r in events:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                if self._results:
                    self._flush_results(session_no, session, send, now)
                if monitor is not None and monitor in events:
                    event = zmq.utils.monitor.recv_monitor_message(monitor)
                    if event["event"] == zmq.EVENT_DISCONNECTED:
                        log.warning("clipper container: connection lost; reconnecting")
                        return True
                for action in session.tick(now):
                    if type(action) is Reconnect:
                        log.warning("clipper container: %s; reconnecting", action.reason)
                        return True
                    send(action.frames)
            return False
        except VersionMismatch:
            self._stop.set()
            raise
        finally:
            if monitor is not None:
                sock.disable_monitor()
                monitor.close(0)
            sock.close(0)

    def _dispatch(self, session_no: int, request: Any, session: ContainerSession,
                  send: Callable) -> None:
        if self.threaded:
            self._work.put((session_no, request))
            return
        outputs, exc = self._call(request)
        self._finish(session_no, session_no, request, outputs, exc, session, send,
                     time.monotonic())

    def _flush_results(self, session_no: int, session: ContainerSession, send: Callable,
                       now: float) -> None:
        results = self._results
        while results:
            done_in, request, outputs, exc = results.popleft()
            self._finish(session_no, done_in, request, outputs, exc, session, send, now)

    def _finish(self, session_no: int, done_in: int, request: Any, outputs: Any,
                exc: BaseException | None, session: ContainerSession, send: Callable,
                now: float) -> None:
        if exc is not None:
            self.failures += 1
            log.error("clipper container: model failed on message %d: %r", request.msg_id, exc)
            return
        if done_in != session_no:
            log.warning("clipper container: answer to message %d dropped: its session ended",
                        request.msg_id)
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
