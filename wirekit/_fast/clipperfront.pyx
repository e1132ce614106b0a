# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``wirekit.clipper._frontlane``: the frontend's common answer and common
submission in C (same class, same bookkeeping, same results; see that module).

The per-message objects (batch, request, completion event) are built without their Python
constructors, and the state's maps are read and written through the C API.  Given the ROUTER
itself, the lane also moves the common v3 messages on libzmq directly (through
``wirekit._fast.zio``; the GIL is released only to wait): an answer of one ``str`` per
input is read from the received parts, and a request whose inputs are one C-contiguous 2-D
array of the replica's dtype is written from the array into the parts sent.  Those messages
never become ``bytes`` frames; everything else does, and takes the codec's path, so
acceptance here is a subset of the codec's and every error still comes from the codec.
"""

cimport numpy as cnp
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_Contains, PyDict_GetItem
from cpython.list cimport PyList_New
from cpython.object cimport PyObject, PyObject_GenericSetAttr
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from wirekit._fast.clipper cimport _fast_array, _new_request
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
    object PyType_GenericAlloc(type t, Py_ssize_t n)
    void PyList_SET_ITEM(object l, Py_ssize_t i, object o)
    object PyLong_FromUnsignedLong(unsigned long v)

import logging

from wirekit.clipper import decode as _decode
from wirekit.clipper import encode as _encode
from wirekit.clipper._frontlane import ANSWERED, ANSWERED_QUEUE_WAITS, NOT_MINE
from wirekit.clipper.messages import Direction, Generation, PredictResponse
from wirekit.clipper.session import _TYPE_OF_DTYPE, Batch, Completed, infer_input_type
from wirekit.errors import DecodeError, EncodeError

cdef object _TO_CLIPPER = Direction.TO_CLIPPER
cdef object _V3 = Generation.V3
cdef object _log = logging.getLogger("wirekit.clipper.frontend")
cdef type _RESPONSE = PredictResponse
cdef type _BATCH = Batch
cdef type _COMPLETED = Completed
cdef object _ONE = 1
cdef str _EMPTY = ""
cdef dict _DTYPE_TYPES = _TYPE_OF_DTYPE
cdef int _NOT_MINE = NOT_MINE, _ANSWERED = ANSWERED, _QUEUE_WAITS = ANSWERED_QUEUE_WAITS

DEF ZMQ_SNDMORE = 2
DEF RPC_VERSION = 3


cdef object _input_type_of(object inputs):
    """``infer_input_type`` with the common case (an array of a wire dtype) in C."""
    cdef PyObject *found
    if type(inputs) is cnp.ndarray:
        found = PyDict_GetItem(_DTYPE_TYPES, <object>cnp.PyArray_DESCR(<cnp.ndarray>inputs))
        if found != NULL:
            return <object>found
    return infer_input_type(inputs)


cdef inline void _set(object obj, str name, object value) except *:
    PyObject_GenericSetAttr(obj, name, value)


cdef object _new_batch(str model_name, object inputs, object input_type, double deadline,
                       object token, Py_ssize_t count, object msg_id, object replica):
    """``Batch(model_name, inputs, input_type, deadline, token, count, msg_id, replica, 1)``
    without the dataclass ``__init__``."""
    cdef object batch = PyType_GenericAlloc(_BATCH, 0)
    _set(batch, "model_name", model_name)
    _set(batch, "inputs", inputs)
    _set(batch, "input_type", input_type)
    _set(batch, "deadline", deadline)
    _set(batch, "token", token)
    _set(batch, "count", count)
    _set(batch, "msg_id", msg_id)
    _set(batch, "replica", replica)
    _set(batch, "attempts", _ONE)
    _set(batch, "lost", _EMPTY)
    return batch


cdef object _new_completed(object token, object outputs):
    cdef object event = PyType_GenericAlloc(_COMPLETED, 0)
    _set(event, "token", token)
    _set(event, "outputs", outputs)
    return event


cdef class Callback:
    """The token of one ``Frontend.submit_callback`` (see ``wirekit.clipper._frontlane``)."""

    cdef object _fn

    def __init__(self, fn):
        self._fn = fn

    def done(self):
        return self._fn is None

    def set_result(self, value):
        self._complete(value, None)

    def set_exception(self, error):
        self._complete(None, error)

    cdef _complete(self, object value, object error):
        cdef object fn = self._fn
        if fn is None:
            return
        self._fn = None
        try:
            fn(value, error)
        except Exception:
            _log.exception("clipper frontend: a submit_callback callback raised")


cdef class FrontLane:
    """The per-message lane of one frontend (see ``wirekit.clipper._frontlane``)."""

    cdef readonly object state, send, generation
    cdef readonly tuple direct
    cdef dict replicas, in_flight, pending, models
    cdef bint v3
    cdef void *sock_handle  # the ROUTER, when given: NULL otherwise
    cdef Received msg  # the message being read

    def __cinit__(self):
        self.sock_handle = NULL

    def __init__(self, state, send, tuple direct, sock=None):
        self.state = state
        self.send = send
        self.direct = direct
        self.generation = state.generation
        self.v3 = self.generation is _V3
        # The state keeps these maps for its whole life (it never rebinds them).
        self.replicas = state.replicas
        self.in_flight = state.in_flight
        self.pending = state.pending
        self.models = state.models
        if sock is not None:
            self.sock_handle = _handle(sock)  # the socket outlives the lane
            self.msg = Received()

    # -- answers --

    def answer(self, list frames, double now):
        """Handle a ROUTER message (identity first) if it is a common answer."""
        cdef PyObject *found
        cdef object replica, msg, batch
        if len(frames) < 2:
            return _NOT_MINE
        found = PyDict_GetItem(self.replicas, frames[0])
        if found == NULL:
            return _NOT_MINE
        replica = <object>found
        try:
            msg = _decode(frames[1:], self.generation, _TO_CLIPPER)
        except DecodeError:
            return _NOT_MINE
        if type(msg) is not _RESPONSE:
            return _NOT_MINE
        return self._complete(replica, msg.msg_id, msg.outputs, now)

    cdef int _complete(self, object replica, object msg_id, object outputs,
                       double now) except -1:
        """The batch ``msg_id`` that ``replica`` holds answered with ``outputs``; NOT_MINE
        (nothing changed) unless it is held and the count is right."""
        cdef PyObject *found
        cdef dict held = replica.in_flight
        found = PyDict_GetItem(held, msg_id)
        if found == NULL:
            return _NOT_MINE
        batch = <object>found
        if len(outputs) != <Py_ssize_t>batch.count:
            return _NOT_MINE
        del held[msg_id]
        del self.in_flight[msg_id]
        replica.last_seen = now
        token = batch.token
        if type(token) is Callback:
            (<Callback>token)._complete(outputs, None)
        elif type(token) in self.direct:
            token.set_result(outputs)
        else:
            self.state.events.append(_new_completed(token, outputs))
        found = PyDict_GetItem(self.pending, replica.model_name)
        if found != NULL and len(<object>found):
            return _QUEUE_WAITS
        return _ANSWERED

    def receive(self, bint block, double spin):
        """Take the next message from the ROUTER given at construction: ANSWERED or
        ANSWERED_QUEUE_WAITS when it was a common answer (handled), else ``(frames, source
        fd)`` for the general path, or None when none came (nothing waiting without
        ``block``, or RCVTIMEO passed).  With ``block`` and ``spin`` > 0, keep looking that
        long before sleeping."""
        cdef int taken, fd
        if self.sock_handle == NULL:
            raise RuntimeError("this lane was made without a socket")
        try:
            if self.msg.read(self.sock_handle, block, spin) < 0:
                return None
            if self.v3:
                taken = self._v3_answer()
                if taken:
                    return taken
            frames = self.msg.frames()
            fd = self.msg.source_fd()
        finally:
            self.msg.close()
        if not self.v3:  # 2016 and 2017 answers: through the codec
            taken = self.answer(frames, _now())
            if taken:
                return taken
        return frames, fd

    cdef inline const uint8_t *_at(self, Py_ssize_t i) noexcept:
        return part_data(self.msg, i)

    cdef inline size_t _size(self, Py_ssize_t i) noexcept:
        return part_size(self.msg, i)

    cdef int _v3_answer(self) except -1:
        """The message in ``parts`` if it is a v3 answer of strings to a batch its sender
        holds: [identity, "", 1, msg_id, u64 header size, header (u64 n, u64 sizes), output
        per part], checked as the codec checks it."""
        cdef Py_ssize_t i, c = self.msg.count
        cdef uint64_t n, hl
        cdef const uint8_t *h
        cdef PyObject *found
        if c < 7 or self._size(1) != 0 or self._size(2) != 4 or _rd32(self._at(2)) != 1:
            return _NOT_MINE
        if self._size(3) != 4 or self._size(4) != 8:
            return _NOT_MINE
        hl = self._size(5)
        h = self._at(5)
        if _rd64(self._at(4)) != hl or hl % 8 or hl < 16:
            return _NOT_MINE
        n = _rd64(h)
        if n != hl // 8 - 1 or <uint64_t>c != 6 + n:
            return _NOT_MINE
        for i in range(<Py_ssize_t>n):
            if _rd64(h + 8 + 8 * i) != self._size(6 + i):
                return _NOT_MINE
        identity = PyBytes_FromStringAndSize(<char *>self._at(0), self._size(0))
        found = PyDict_GetItem(self.replicas, identity)
        if found == NULL:
            return _NOT_MINE
        cdef list outputs = PyList_New(<Py_ssize_t>n)
        for i in range(<Py_ssize_t>n):
            try:
                s = PyUnicode_DecodeUTF8(<char *>self._at(6 + i), self._size(6 + i), NULL)
            except UnicodeDecodeError:  # the codec names it
                return _NOT_MINE
            Py_INCREF(s)
            PyList_SET_ITEM(outputs, i, s)
        return self._complete(<object>found, PyLong_FromUnsignedLong(_rd32(self._at(3))),
                              outputs, _now())

    # -- submissions --

    cdef object _new_id(self):
        """``FrontendState._new_id``: the next message id not in flight (ids wrap at 2**32)."""
        cdef object state = self.state
        cdef unsigned long long msg_id = state._next_id
        while True:
            state._next_id = (msg_id + 1) & 0xFFFFFFFF
            if not PyDict_Contains(self.in_flight, msg_id):
                return msg_id
            msg_id = (msg_id + 1) & 0xFFFFFFFF

    def submit(self, str model_name, inputs, double deadline, token, input_type):
        """Send this batch now if nothing waits before it and a replica has room."""
        cdef PyObject *found
        cdef object state = self.state, best = None, r, msg_id, frames, batch
        cdef list replicas, message
        cdef Py_ssize_t count, limit, least = 0, load
        cdef int itype
        found = PyDict_GetItem(self.pending, model_name)
        if found != NULL and len(<object>found):
            return False  # first come, first served
        found = PyDict_GetItem(self.models, model_name)
        if found == NULL:
            return False
        replicas = <list>found
        try:
            count = len(inputs)
        except TypeError:
            return False
        if count == 0:
            return False
        if input_type is None:
            input_type = _input_type_of(inputs)
        limit = state.max_in_flight
        for r in replicas:  # FrontendState._pick: the least work in flight
            if not r.alive:
                continue
            load = len(<dict>r.in_flight)
            if load >= limit:
                continue
            if input_type is not None and r.input_type != input_type:
                continue
            if best is None or load < least:
                best, least = r, load
        if best is None:
            return False
        msg_id = self._new_id()
        itype = best.input_type
        if self.sock_handle != NULL and self.v3 and itype != 4 and _fast_array(inputs, 2, itype):
            self._send_v3_request(best.identity, <uint32_t>msg_id, itype, inputs)
        else:
            try:
                frames = _encode(_new_request(<uint32_t>msg_id, itype, inputs), self.generation)
            except EncodeError:  # the state reports it: give the id back
                state._next_id = msg_id
                return False
            message = [best.identity]
            message.extend(frames)
            self.send(message)
        batch = _new_batch(model_name, inputs, input_type, deadline, token, count, msg_id, best)
        (<dict>best.in_flight)[msg_id] = batch
        self.in_flight[msg_id] = batch
        if deadline < <double>state._due:
            state._due = deadline
        return True

    cdef int _put(self, zmq_msg_t *msg, bint more) except -1:
        return _send_msg(self.sock_handle, msg, ZMQ_SNDMORE if more else 0, True)

    cdef int _send_v3_request(self, bytes identity, uint32_t msg_id, int itype,
                              cnp.ndarray inputs) except -1:
        # [identity, "", 3, 1, msg_id, 0, u64 header size, header (u64 input type, u64 n,
        #  u64 sizes), one row per part]: the frames encode(PredictRequest(...)) makes
        cdef zmq_msg_t msg
        cdef uint8_t *o
        cdef Py_ssize_t i, n = cnp.PyArray_DIMS(inputs)[0]
        cdef Py_ssize_t row = cnp.PyArray_DIMS(inputs)[1] * cnp.PyArray_ITEMSIZE(inputs)
        cdef const char *data = <const char *>cnp.PyArray_DATA(inputs)
        memcpy(_new_part(&msg, len(identity)), <char *>identity, len(identity))
        self._put(&msg, True)
        _new_part(&msg, 0)
        self._put(&msg, True)
        _put32(_new_part(&msg, 4), RPC_VERSION)
        self._put(&msg, True)
        _put32(_new_part(&msg, 4), 1)
        self._put(&msg, True)
        _put32(_new_part(&msg, 4), msg_id)
        self._put(&msg, True)
        _put32(_new_part(&msg, 4), 0)
        self._put(&msg, True)
        _put64(_new_part(&msg, 8), 8 * (n + 2))
        self._put(&msg, True)
        o = _new_part(&msg, 8 * (n + 2))
        _put64(o, itype)
        _put64(o + 8, n)
        for i in range(n):
            _put64(o + 16 + 8 * i, row)
        self._put(&msg, True)
        for i in range(n):
            memcpy(_new_part(&msg, row), data + i * row, row)
            self._put(&msg, i < n - 1)
        return 0
