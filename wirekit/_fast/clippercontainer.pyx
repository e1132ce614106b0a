# cython: language_level=3, boundscheck=False, wraparound=False
"""Cython twin of ``wirekit.clipper._lane``: a model container's per-message path in C.

Request frames -> decoded request -> model call -> checked outputs -> response frames -> send,
in one loop: messages move straight on libzmq through ``wirekit._fast.zio`` (GIL released
only to wait), the clock is ``clock_gettime`` (the clock ``time.monotonic`` reads), and the
session's deadline is tracked here instead of asked for per message.  The common answer (a
list of ``str``, one per input, for 2017 and v3) is checked and encoded here; every other
outcome (2016 numbers, a model that raised or returned bad outputs, heartbeat replies,
malformed frames, a standby thread that took the socket over) goes to the container's and the
session's Python methods, which stay the reference behaviour.
"""

from cpython.unicode cimport PyUnicode_CheckExact
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from wirekit._fast.zio cimport _handle, _recv_on, _send_on

import zmq

from wirekit.clipper import decode as _decode
from wirekit.clipper import encode as _encode
from wirekit.clipper._lane import DUE, END, IDLE, LOOK, STOP
from wirekit.clipper._zio import FAST_WAIT, FAST_WAIT_MS
from wirekit.clipper.messages import Direction, Generation, PredictRequest
from wirekit.clipper.session import _new_response
from wirekit.errors import DecodeError, EncodeError

cdef object _TO_CONTAINER = Direction.TO_CONTAINER
cdef object _G2016 = Generation.G2016
cdef type _REQUEST = PredictRequest
cdef str _CLOSED = "closed", _REGISTERED = "registered"
cdef double _INF = float("inf")
cdef double _FAST_WAIT = FAST_WAIT
cdef int _FAST_WAIT_MS = FAST_WAIT_MS
cdef int _IDLE = IDLE, _LOOK = LOOK, _DUE = DUE, _END = END, _STOP = STOP


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline int _timeout_ms(double wait) noexcept:
    # _zio.timeout_ms for a finite wait below FAST_WAIT
    return max(0, <int>(wait * 1000) + 1)


cdef class Lane:
    """The per-message path of one container session (see ``wirekit.clipper._lane``)."""

    cdef object container, sock, session, send, predict, generation, release, acquire
    cdef void *sock_handle
    cdef bint threaded, strings, heartbeats, synced
    cdef double poll_interval, activity_timeout, deadline
    cdef public int rcvtimeo

    def __init__(self, container, sock, session, send):
        self.container = container
        self.sock = sock
        self.sock_handle = _handle(sock)  # the socket outlives the lane (closed after it)
        self.session = session
        self.send = send
        self.predict = container.predict
        self.generation = session.generation
        self.threaded = container.threaded
        self.release = container._sock_lock.release
        self.acquire = container._sock_lock.acquire
        self.strings = self.generation is not _G2016
        self.heartbeats = session.heartbeats
        self.poll_interval = session.poll_interval
        self.activity_timeout = session.activity_timeout
        self.synced = False
        self.rcvtimeo = -1

    def handle(self, frames, double now):
        """Handle one message received at ``now``; False when the session is over."""
        return self._handle(frames, now)

    cdef bint _handle(self, frames, double now) except -1:
        session = self.session
        try:
            msg = _decode(frames, self.generation, _TO_CONTAINER)
        except DecodeError:
            msg = None
        if type(msg) is not _REQUEST or session.state == _CLOSED:
            self.synced = False
            return self.container._handle_actions(session.receive(frames, now), session,
                                                  self.send)
        session.last_received = now
        if session.state != _REGISTERED:
            session.state = _REGISTERED
        session.requests += 1
        return self._serve(msg, now)

    cdef bint _serve(self, request, double received) except -1:
        """Run the model on ``request`` and answer; False when the session ended meanwhile."""
        cdef object container = self.container
        cdef object outputs = None, failure = None
        if self.threaded:
            # The standby thread may take the socket while the model runs (see container.py).
            container._model_started = received
            self.release()
            try:
                outputs = self.predict(request.inputs)
            except Exception as exc:
                failure = exc
            finally:
                container._model_started = None
                if container._standby_active:
                    container._wake()
                self.acquire()
            if (container._lost is not None or container._lost_error is not None
                    or container._backlog):
                self.synced = False
                return container._after_standby(request, outputs, failure, self.session,
                                                self.send)
        else:
            try:
                outputs = self.predict(request.inputs)
            except Exception as exc:
                failure = exc
        cdef double now = _now()
        if failure is None and self._respond(request, outputs, now):
            return True
        self.synced = False
        container._finish(request, outputs, failure, self.session, self.send, now)
        return True

    cdef bint _respond(self, request, outputs, double now) except -1:
        """Send the answer when ``outputs`` are one ``str`` per input (2017, v3); False
        leaves every other case to the container's reference path."""
        cdef Py_ssize_t i, n
        if not self.strings or type(outputs) is not list:
            return False
        n = len(<list>outputs)
        if n == 0 or n != len(request.inputs):
            return False
        for i in range(n):
            if not PyUnicode_CheckExact((<list>outputs)[i]):
                return False
        session = self.session
        if session.state == _CLOSED:
            return False
        try:
            frames = _encode(_new_response(request.msg_id, outputs), self.generation)
        except EncodeError:
            return False
        _send_on(self.sock_handle, frames, 0)
        session.last_sent = now
        self.container.served += 1
        if self.heartbeats:
            self.deadline = min(now + self.poll_interval,
                                <double>session.last_received + self.activity_timeout)
        return True

    def run(self):
        """Serve messages while each comes within ``FAST_WAIT`` of the last; return why it
        stopped (``IDLE``, ``LOOK``, ``DUE``, ``END``, ``STOP`` of ``wirekit.clipper._lane``)."""
        cdef object container = self.container
        cdef double now = _now(), received, wait
        cdef double look_at = now + _FAST_WAIT
        cdef int ms
        self.synced = False
        while not container._stopping:
            if not self.synced:
                self.deadline = self.session.deadline()
                self.synced = True
            wait = self.deadline - now
            if wait <= 0:
                return _DUE
            ms = _FAST_WAIT_MS if wait >= _FAST_WAIT else _timeout_ms(wait)
            if ms != self.rcvtimeo:
                self.sock.setsockopt(zmq.RCVTIMEO, ms)
                self.rcvtimeo = ms
            frames = _recv_on(self.sock_handle, True, False, 0.0)
            if frames is None:
                return _IDLE
            received = _now()
            if not self._handle(frames, received):
                return _END
            if received >= look_at:
                return _LOOK
            now = _now()
        return _STOP
