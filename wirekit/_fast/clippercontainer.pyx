# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``wirekit.clipper._lane``: a model container's per-message path in C.

Request frames -> decoded request -> model call -> checked outputs -> response frames -> send,
in one loop, on libzmq directly (through ``wirekit._fast.zio``; the GIL is released only to
wait).  The common messages never become Python frames: a v3 request with numeric inputs of
equal length is read from the received parts into the batch array the model gets (the copy
the codec makes too, so every request gets a fresh array), and an answer of one ``str`` per
input (2017, v3) is written from the strings into the parts sent.  The clock is
``clock_gettime`` (the clock ``time.monotonic`` reads) and the session's deadline is tracked
here instead of asked for per message.

Anything else goes the reference way, with the same results: the parts become ``bytes``
frames for the codec and the session (other generations and input types, heartbeat replies,
malformed frames: acceptance here is a subset of the codec's, so every error comes from the
codec), and the container's Python methods take the rest (2016 numbers, a model that raised
or returned bad outputs, a standby thread that took the socket over).
"""

cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.unicode cimport PyUnicode_CheckExact
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from wirekit._fast.clipper cimport _new_request
from wirekit._fast.littleendian cimport _put32, _put64, _rd32, _rd64
from wirekit._fast.zio cimport (
    Received,
    _handle,
    _now,
    _new_part,
    _send_msg,
    part_data,
    part_size,
    zmq_msg_t,
)

cnp.import_array()


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL

import zmq

from wirekit.clipper import decode as _decode
from wirekit.clipper._lane import DUE, END, IDLE, LOOK, STOP
from wirekit.clipper._zio import FAST_WAIT, FAST_WAIT_MS
from wirekit.clipper.messages import Direction, Generation, PredictRequest
from wirekit.errors import DecodeError

cdef object _TO_CONTAINER = Direction.TO_CONTAINER
cdef object _G2017 = Generation.G2017, _V3 = Generation.V3
cdef type _REQUEST = PredictRequest
cdef str _CLOSED = "closed"
cdef double _FAST_WAIT = FAST_WAIT
cdef int _FAST_WAIT_MS = FAST_WAIT_MS
cdef int _IDLE = IDLE, _LOOK = LOOK, _DUE = DUE, _END = END, _STOP = STOP
# The codec's numeric input types (bytes, ints, floats, doubles): NumPy type, element size.
cdef int[4] _TYPENUM = [cnp.NPY_UINT8, cnp.NPY_INT32, cnp.NPY_FLOAT32, cnp.NPY_FLOAT64]
cdef Py_ssize_t[4] _ELEMENT_SIZE = [1, 4, 4, 8]

DEF ZMQ_SNDMORE = 2
DEF RPC_VERSION = 3
DEF U32_MAX = 0xFFFFFFFF
DEF SMALL = 16  # outputs gathered without an allocation


cdef inline int _timeout_ms(double wait) noexcept:
    # _zio.timeout_ms for a finite wait below FAST_WAIT
    return max(0, <int>(wait * 1000) + 1)


cdef class Lane:
    """The per-message path of one container session (see ``wirekit.clipper._lane``)."""

    cdef object container, sock, session, send, generation
    cdef void *sock_handle
    cdef Received msg  # the message being read
    cdef bint threaded, v3, g2017, heartbeats, synced
    cdef double poll_interval, activity_timeout, deadline
    cdef public int rcvtimeo

    def __init__(self, container, sock, session, send):
        self.container = container
        self.sock = sock
        self.sock_handle = _handle(sock)  # the socket outlives the lane (closed after it)
        self.msg = Received()
        self.session = session
        self.send = send
        self.generation = session.generation
        self.threaded = container.threaded
        self.v3 = self.generation is _V3
        self.g2017 = self.generation is _G2017
        self.heartbeats = session.heartbeats
        self.poll_interval = session.poll_interval
        self.activity_timeout = session.activity_timeout
        self.synced = False
        self.rcvtimeo = -1

    # -- receiving --

    cdef int _receive(self) except -2:
        """Read one message into ``msg``: 0, or -1 when none came before RCVTIMEO."""
        return self.msg.read(self.sock_handle, True, 0.0)

    cdef inline bint _u32_is(self, Py_ssize_t i, uint32_t value) noexcept:
        return part_size(self.msg, i) == 4 and _rd32(part_data(self.msg, i)) == value

    cdef object _v3_batch(self, uint32_t *msg_id, int *itype_out):
        """The inputs of a v3 request with numeric inputs of equal length, as one fresh 2-D
        array (``msg_id``, ``itype_out`` set), or None for anything else (the codec then
        decodes it, or names what is wrong)."""
        cdef Received m = self.msg
        cdef const uint8_t *h
        cdef size_t hl, width
        cdef uint64_t itype, n, i
        cdef Py_ssize_t es
        cdef cnp.npy_intp dims[2]
        cdef cnp.ndarray batch
        cdef char *dst
        if m.count < 8 or part_size(m, 0) != 0:
            return None
        if not (self._u32_is(1, RPC_VERSION) and self._u32_is(2, 1) and self._u32_is(4, 0)):
            return None
        if part_size(m, 3) != 4 or part_size(m, 5) != 8:
            return None
        hl = part_size(m, 6)
        h = part_data(m, 6)
        if _rd64(part_data(m, 5)) != hl or hl % 8 or hl < 16:
            return None
        itype = _rd64(h)
        n = _rd64(h + 8)
        if itype > 3 or n == 0 or n != hl // 8 - 2 or <uint64_t>m.count != 7 + n:
            return None
        es = _ELEMENT_SIZE[itype]
        width = part_size(m, 7)
        if width % es:
            return None
        for i in range(n):
            if _rd64(h + 16 + 8 * i) != width or part_size(m, 7 + i) != width:
                return None
        dims[0] = <cnp.npy_intp>n
        dims[1] = <cnp.npy_intp>(width // es)
        batch = cnp.PyArray_EMPTY(2, dims, _TYPENUM[itype], 0)
        dst = <char *>cnp.PyArray_DATA(batch)
        for i in range(n):
            memcpy(dst + i * width, part_data(m, 7 + i), width)
        msg_id[0] = _rd32(part_data(m, 3))
        itype_out[0] = <int>itype
        return batch

    cdef bint _take(self, double received) except -1:
        """Handle the message in ``parts``; False when the session is over."""
        cdef uint32_t msg_id = 0
        cdef int itype = 0
        batch = self._v3_batch(&msg_id, &itype) if self.v3 else None
        if batch is None:
            frames = self.msg.frames()
            self.msg.close()
            return self._handle(frames, received)
        self.msg.close()
        session = self.session
        if session.state == _CLOSED:
            return True
        session.request_received(received)
        return self._serve(None, msg_id, itype, batch, received)

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
            return self.container.handle_actions(session.receive(frames, now), session,
                                                 self.send)
        session.request_received(now)
        return self._serve(msg, msg.msg_id, 0, msg.inputs, now)

    # -- the model and the answer --

    cdef bint _serve(self, request, uint32_t msg_id, int itype, inputs,
                     double received) except -1:
        """Run the model on the inputs of message ``msg_id`` (``request``, or built from
        ``itype`` and ``inputs`` when None) and answer; False when the session ended."""
        cdef object container = self.container
        cdef object outputs, failure
        cdef double now
        # The model runs with the socket left to the standby thread (when threaded).
        outputs, failure = container.run_model(inputs)
        if self.threaded and container.standby_intervened():
            self.synced = False
            if request is None:
                request = _new_request(msg_id, itype, inputs)
            return container.after_model(request, outputs, failure, self.session, self.send)
        now = _now()
        if failure is None and self._respond(msg_id, len(inputs), outputs, now):
            return True
        self.synced = False
        if request is None:
            request = _new_request(msg_id, itype, inputs)
        container.finish(request, outputs, failure, self.session, self.send, now)
        return True

    cdef bint _respond(self, uint32_t msg_id, Py_ssize_t count, outputs,
                       double now) except -1:
        """Send the answer when ``outputs`` are a list of one ``str`` per input (2017, v3):
        the frames ``encode(PredictResponse(msg_id, outputs))`` makes, written straight into
        the parts sent.  False (nothing sent) leaves every other case to the container."""
        cdef Py_ssize_t i, n
        cdef const char *small_ptr[SMALL]
        cdef Py_ssize_t small_size[SMALL]
        cdef const char **ptr = small_ptr
        cdef Py_ssize_t *size = small_size
        if not (self.v3 or self.g2017) or type(outputs) is not list:
            return False
        n = len(<list>outputs)
        if n == 0 or n != count:
            return False
        if n > SMALL:
            ptr = <const char **>PyMem_Malloc(n * sizeof(char *))
            size = <Py_ssize_t *>PyMem_Malloc(n * sizeof(Py_ssize_t))
        try:
            if ptr == NULL or size == NULL:
                raise MemoryError()
            for i in range(n):
                item = (<list>outputs)[i]
                if not PyUnicode_CheckExact(item):
                    return False
                try:
                    ptr[i] = PyUnicode_AsUTF8AndSize(item, &size[i])
                except UnicodeEncodeError:  # a lone surrogate: the codec names it
                    return False
                if self.g2017 and <uint64_t>size[i] > U32_MAX:
                    return False
            session = self.session
            if session.state == _CLOSED:
                return False
            # ``outputs`` keeps the strings (and their UTF-8) alive until sent.  Counted
            # before the send, as the pure path does: once the peer has the answer, so
            # does ``served``.
            self.container.served += 1
            if self.v3:
                self._send_v3(msg_id, n, ptr, size)
            else:
                self._send_2017(msg_id, n, ptr, size)
        finally:
            if n > SMALL:
                PyMem_Free(ptr)
                PyMem_Free(size)
        session.response_sent(now)
        if self.heartbeats:
            self.deadline = min(now + self.poll_interval,
                                <double>session.last_received + self.activity_timeout)
        return True

    cdef int _head(self, uint32_t msg_id) except -1:
        """The parts every 2017/v3 response starts with: "", message type 1, ``msg_id``."""
        cdef zmq_msg_t msg
        _new_part(&msg, 0)
        _send_msg(self.sock_handle, &msg, ZMQ_SNDMORE, True)
        _put32(_new_part(&msg, 4), 1)
        _send_msg(self.sock_handle, &msg, ZMQ_SNDMORE, True)
        _put32(_new_part(&msg, 4), msg_id)
        _send_msg(self.sock_handle, &msg, ZMQ_SNDMORE, True)
        return 0

    cdef int _send_v3(self, uint32_t msg_id, Py_ssize_t n, const char **ptr,
                      Py_ssize_t *size) except -1:
        # ["", 1, msg_id, u64 header size, header (u64 n, u64 sizes), output per frame]
        cdef zmq_msg_t msg
        cdef uint8_t *o
        cdef Py_ssize_t i
        self._head(msg_id)
        _put64(_new_part(&msg, 8), 8 * (n + 1))
        _send_msg(self.sock_handle, &msg, ZMQ_SNDMORE, True)
        o = _new_part(&msg, 8 * (n + 1))
        _put64(o, n)
        for i in range(n):
            _put64(o + 8 + 8 * i, size[i])
        _send_msg(self.sock_handle, &msg, ZMQ_SNDMORE, True)
        for i in range(n):
            o = _new_part(&msg, size[i])
            memcpy(o, ptr[i], size[i])
            _send_msg(self.sock_handle, &msg, ZMQ_SNDMORE if i < n - 1 else 0, True)
        return 0

    cdef int _send_2017(self, uint32_t msg_id, Py_ssize_t n, const char **ptr,
                        Py_ssize_t *size) except -1:
        # ["", 1, msg_id, payload (u32 n, u32 sizes, the outputs one after another)]
        cdef zmq_msg_t msg
        cdef uint8_t *o
        cdef Py_ssize_t i, total = 4 + 4 * n, at
        for i in range(n):
            total += size[i]
        self._head(msg_id)
        o = _new_part(&msg, total)
        _put32(o, <uint32_t>n)
        at = 4 + 4 * n
        for i in range(n):
            _put32(o + 4 + 4 * i, <uint32_t>size[i])
            memcpy(o + at, ptr[i], size[i])
            at += size[i]
        _send_msg(self.sock_handle, &msg, 0, True)
        return 0

    # -- the loop --

    def run(self):
        """Serve messages while each comes within ``FAST_WAIT`` of the last; return why it
        stopped (``IDLE``, ``LOOK``, ``DUE``, ``END``, ``STOP`` of ``wirekit.clipper._lane``)."""
        cdef object container = self.container
        cdef double now = _now(), received, wait
        cdef double look_at = now + _FAST_WAIT
        cdef int ms
        self.synced = False
        while not container.stopping:
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
            if self._receive() < 0:
                return _IDLE
            received = _now()
            if not self._take(received):
                return _END
            if received >= look_at:
                return _LOOK
            now = _now()
        return _STOP
