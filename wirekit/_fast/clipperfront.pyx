# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of the frontend's per-message path.

* :class:`FrontendState` is ``wirekit.clipper.session.FrontendState`` with its per-message
  methods (``pick``, ``try_send``, ``complete``) compiled: the same class (a subclass), the
  same bookkeeping, the same results; every other method is the reference's own.  Its
  ``try_send`` returns, for a v3 request whose inputs are one C-contiguous 2-D array of the
  replica's dtype, an :class:`ArrayRequest` (the message, unencoded) instead of frames.
* :class:`Wire` is the runtime's frame mover for the ROUTER, on libzmq directly (through
  ``wirekit._fast.zio``; the GIL is released only to wait): it writes an
  :class:`ArrayRequest` from the array into the parts sent, and reads a v3 answer of one
  ``str`` per input from the received parts, handing it to the state's ``complete``.  Those
  messages never become ``bytes`` frames; everything else does and takes the codec's and the
  state's general path, so acceptance here is a subset of the codec's and every error still
  comes from the codec and the state.
* :class:`Callback` is the token of ``Frontend.submit_callback``.

Used unless ``WIREKIT_PURE=1``, it is not built, or the Cython ``zio`` twin is not in use.
"""

cimport cython
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
    _send_on,
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

import numpy as np

from wirekit.clipper import decode as _decode
from wirekit.clipper import encode as _encode
from wirekit.clipper import session as _session
from wirekit.clipper.messages import Generation, InputType
from wirekit.clipper.session import Batch, infer_input_type
from wirekit.errors import EncodeError

cdef object _V3 = Generation.V3
cdef object _log = logging.getLogger("wirekit.clipper.frontend")
cdef type _BATCH = Batch
cdef object _ONE = 1
cdef str _EMPTY = ""
# What infer_input_type says for arrays of the wire dtypes (one dict lookup).
cdef dict _DTYPE_TYPES = {np.dtype(d): infer_input_type(np.empty((0, 1), d))
                          for d in ("u1", "<i4", "<f4", "<f8")}
#: :meth:`Wire.receive` results besides a message handed back: a common answer was handled
#: (its batch completed); the same, and a batch of that model waits in the queue.
ANSWERED, ANSWERED_QUEUE_WAITS = 1, 2
cdef int _ANSWERED = ANSWERED, _QUEUE_WAITS = ANSWERED_QUEUE_WAITS

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


cdef class Callback:
    """The token of one ``Frontend.submit_callback`` (compiled twin of
    ``wirekit.clipper.frontend.Callback``)."""

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


cdef object _pick(dict models, str model_name, object input_type, Py_ssize_t limit):
    """``FrontendState.pick`` (the compiled ``pick`` and ``try_send`` share it)."""
    cdef PyObject *found = PyDict_GetItem(models, model_name)
    if found == NULL:
        return None
    cdef Py_ssize_t least = 0, load
    best = None
    for r in <list>found:
        if not r.alive:
            continue
        load = len(<dict>r.in_flight)
        if load >= limit:
            continue
        if input_type is not None and r.input_type != input_type:
            continue
        if best is None or load < least:
            best, least = r, load
    return best


class FrontendState(_session.FrontendState):
    """``wirekit.clipper.session.FrontendState`` with ``pick``, ``try_send`` and ``complete``
    compiled (see the module docstring); the same class in every other respect."""

    def complete(self, identity, msg_id, outputs, double now):
        """See ``FrontendState.complete``."""
        cdef PyObject *found = PyDict_GetItem(self.replicas, identity)
        if found == NULL:
            return None
        replica = <object>found
        cdef dict held = replica.in_flight
        found = PyDict_GetItem(held, msg_id)
        if found == NULL:
            return None
        batch = <object>found
        if len(outputs) != <Py_ssize_t>batch.count:
            return None
        del held[msg_id]
        del (<dict>self.in_flight)[msg_id]
        replica.last_seen = now
        return batch

    def pick(self, str model_name, input_type):
        """See ``FrontendState.pick``."""
        return _pick(self.models, model_name, input_type, self.max_in_flight)

    def try_send(self, str model_name, inputs, double deadline, token, input_type=None):
        """See ``FrontendState.try_send``."""
        cdef PyObject *found
        cdef Py_ssize_t count
        cdef unsigned long long msg_id
        cdef dict in_flight = self.in_flight
        found = PyDict_GetItem(self.pending, model_name)
        if found != NULL and len(<object>found):
            return None  # first come, first served
        cdef dict models = self.models
        found = PyDict_GetItem(models, model_name)
        if found == NULL or not len(<list>found):
            return None
        try:
            count = len(inputs)
        except TypeError:
            return None
        if count == 0:
            return None
        if input_type is None:
            input_type = _input_type_of(inputs)
        best = _pick(models, model_name, input_type, self.max_in_flight)
        if best is None:
            return None
        msg_id = self._next_id
        while PyDict_Contains(in_flight, msg_id):
            msg_id = (msg_id + 1) & 0xFFFFFFFF
        itype = best.input_type
        if self.generation is _V3 and itype != 4 and _fast_array(inputs, 2, itype):
            message = _array_request(best.identity, msg_id, itype, inputs)
        else:
            try:
                frames = _encode(_new_request(<uint32_t>msg_id, itype, inputs),
                                 self.generation)
            except EncodeError:
                return None
            message = [best.identity]
            message.extend(frames)
        self._next_id = (msg_id + 1) & 0xFFFFFFFF
        key = msg_id
        batch = _new_batch(model_name, inputs, input_type, deadline, token, count, key, best)
        (<dict>best.in_flight)[key] = batch
        in_flight[key] = batch
        if deadline < <double>self._due:
            self._due = deadline
        return message


cdef ArrayRequest _array_request(bytes identity, unsigned long msg_id, int input_type,
                                 cnp.ndarray inputs):
    cdef ArrayRequest request = ArrayRequest.__new__(ArrayRequest)
    request.identity = identity
    request.msg_id = msg_id
    request.input_type = input_type
    request.inputs = inputs
    return request


@cython.freelist(16)
cdef class ArrayRequest:
    """A v3 request whose inputs are one C-contiguous 2-D array of the replica's dtype, not
    yet encoded: :class:`Wire` writes it from the array; :meth:`frames` is the ROUTER
    message ``[identity, *encode(PredictRequest(...))]`` it stands for."""

    cdef readonly bytes identity
    cdef readonly unsigned long msg_id
    cdef readonly int input_type
    cdef readonly cnp.ndarray inputs

    def __init__(self, bytes identity, unsigned long msg_id, int input_type,
                 cnp.ndarray inputs):
        self.identity = identity
        self.msg_id = msg_id
        self.input_type = input_type
        self.inputs = inputs

    def frames(self):
        message = [self.identity]
        message.extend(_encode(_new_request(<uint32_t>self.msg_id, self.input_type,
                                            self.inputs), _V3))
        return message


cdef class Wire:
    """The frontend's ROUTER, moved on libzmq directly (see the module docstring).

    ``direct`` are token types completed at once with ``set_result`` (besides
    :class:`Callback`); others go to the runtime's list ``later``.
    """

    cdef readonly object sock
    cdef readonly tuple direct
    cdef void *sock_handle
    cdef Received msg  # the message being read
    cdef readonly list later  # (token, outputs) of answers the runtime completes

    def __init__(self, sock, tuple direct, list later):
        self.sock = sock
        self.direct = direct
        self.later = later
        self.sock_handle = _handle(sock)  # the socket outlives the wire
        self.msg = Received()

    # -- sending --

    def send(self, message):
        """Send one ROUTER message: a list of frames, or an :class:`ArrayRequest`."""
        if type(message) is ArrayRequest:
            self._send_array(<ArrayRequest>message)
        else:
            _send_on(self.sock_handle, message, 0)

    cdef int _put(self, zmq_msg_t *msg, bint more) except -1:
        return _send_msg(self.sock_handle, msg, ZMQ_SNDMORE if more else 0, True)

    cdef int _send_array(self, ArrayRequest request) except -1:
        # [identity, "", 3, 1, msg_id, 0, u64 header size, header (u64 input type, u64 n,
        #  u64 sizes), one row per part]: the frames encode(PredictRequest(...)) makes
        cdef zmq_msg_t msg
        cdef uint8_t *o
        cdef cnp.ndarray inputs = request.inputs
        cdef bytes identity = request.identity
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
        _put32(_new_part(&msg, 4), <uint32_t>request.msg_id)
        self._put(&msg, True)
        _put32(_new_part(&msg, 4), 0)
        self._put(&msg, True)
        _put64(_new_part(&msg, 8), 8 * (n + 2))
        self._put(&msg, True)
        o = _new_part(&msg, 8 * (n + 2))
        _put64(o, request.input_type)
        _put64(o + 8, n)
        for i in range(n):
            _put64(o + 16 + 8 * i, row)
        self._put(&msg, True)
        for i in range(n):
            memcpy(_new_part(&msg, row), data + i * row, row)
            self._put(&msg, i < n - 1)
        return 0

    # -- receiving --

    def receive(self, state, bint block, double spin):
        """Take the next message from the ROUTER.  A v3 answer of one ``str`` per input goes
        to ``state.complete``; when that takes it, its token is completed (a
        :class:`Callback` or a ``direct`` type at once; any other is appended to
        :attr:`later` as ``(token, outputs)``) and ANSWERED (or ANSWERED_QUEUE_WAITS: a
        batch of that model waits) is returned.  Anything else comes back as ``(frames,
        source fd)`` for the general path; None when no message came (nothing waiting
        without ``block``, or RCVTIMEO passed).  With ``block`` and ``spin`` > 0, keep
        looking that long before sleeping."""
        cdef int taken, fd
        try:
            if self.msg.read(self.sock_handle, block, spin) < 0:
                return None
            taken = self._v3_answer(state)
            if taken:
                return taken
            frames = self.msg.frames()
            fd = self.msg.source_fd()
        finally:
            self.msg.close()
        return frames, fd

    cdef inline const uint8_t *_at(self, Py_ssize_t i) noexcept:
        return part_data(self.msg, i)

    cdef inline size_t _size(self, Py_ssize_t i) noexcept:
        return part_size(self.msg, i)

    cdef int _v3_answer(self, state) except -1:
        """The message in ``msg`` if it is a v3 answer of strings that ``state.complete``
        takes: [identity, "", 1, msg_id, u64 header size, header (u64 n, u64 sizes), output
        per part], checked as the codec checks it."""
        cdef Py_ssize_t i, c = self.msg.count
        cdef uint64_t n, hl
        cdef const uint8_t *h
        cdef PyObject *found
        if state.generation is not _V3:
            return 0
        if c < 7 or self._size(1) != 0 or self._size(2) != 4 or _rd32(self._at(2)) != 1:
            return 0
        if self._size(3) != 4 or self._size(4) != 8:
            return 0
        hl = self._size(5)
        h = self._at(5)
        if _rd64(self._at(4)) != hl or hl % 8 or hl < 16:
            return 0
        n = _rd64(h)
        if n != hl // 8 - 1 or <uint64_t>c != 6 + n:
            return 0
        for i in range(<Py_ssize_t>n):
            if _rd64(h + 8 + 8 * i) != self._size(6 + i):
                return 0
        identity = PyBytes_FromStringAndSize(<char *>self._at(0), self._size(0))
        cdef list outputs = PyList_New(<Py_ssize_t>n)
        for i in range(<Py_ssize_t>n):
            try:
                s = PyUnicode_DecodeUTF8(<char *>self._at(6 + i), self._size(6 + i), NULL)
            except UnicodeDecodeError:  # the codec names it
                return 0
            Py_INCREF(s)
            PyList_SET_ITEM(outputs, i, s)
        batch = state.complete(identity, PyLong_FromUnsignedLong(_rd32(self._at(3))),
                               outputs, _now())
        if batch is None:
            return 0
        token = (<object>batch).token
        if type(token) is Callback:
            (<Callback>token)._complete(outputs, None)
        elif type(token) in self.direct:
            token.set_result(outputs)
        else:
            self.later.append((token, outputs))
        found = PyDict_GetItem(state.pending, (<object>batch).model_name)
        if found != NULL and len(<object>found):
            return _QUEUE_WAITS
        return _ANSWERED
