# cython: language_level=3, boundscheck=False, wraparound=False
"""Cython twin of ``wirekit.clipper._frontlane``: the frontend's common answer and common
submission in C (same class, same bookkeeping, same results; see that module).

The per-message objects (batch, request, completion event) are built without their Python
constructors, and the state's maps are read and written through the C API, so a round trip
costs the frontend's thread no Python frame of wirekit's own.
"""

cimport numpy as cnp
from cpython.dict cimport PyDict_Contains, PyDict_GetItem
from cpython.object cimport PyObject, PyObject_GenericSetAttr

cnp.import_array()


cdef extern from "Python.h":
    object PyType_GenericAlloc(type t, Py_ssize_t n)

import logging

from wirekit.clipper import decode as _decode
from wirekit.clipper import encode as _encode
from wirekit.clipper._frontlane import ANSWERED, ANSWERED_QUEUE_WAITS, NOT_MINE
from wirekit.clipper.messages import Direction, PredictRequest, PredictResponse
from wirekit.clipper.session import _TYPE_OF_DTYPE, Batch, Completed, infer_input_type
from wirekit.errors import DecodeError, EncodeError

cdef object _TO_CLIPPER = Direction.TO_CLIPPER
cdef object _log = logging.getLogger("wirekit.clipper.frontend")
cdef type _RESPONSE = PredictResponse
cdef type _REQUEST = PredictRequest
cdef type _BATCH = Batch
cdef type _COMPLETED = Completed
cdef object _ZERO = 0, _ONE = 1
cdef str _EMPTY = ""
cdef dict _DTYPE_TYPES = _TYPE_OF_DTYPE


cdef object _input_type_of(object inputs):
    """``infer_input_type`` with the common case (an array of a wire dtype) in C."""
    cdef PyObject *found
    if type(inputs) is cnp.ndarray:
        found = PyDict_GetItem(_DTYPE_TYPES, <object>cnp.PyArray_DESCR(<cnp.ndarray>inputs))
        if found != NULL:
            return <object>found
    return infer_input_type(inputs)
cdef int _NOT_MINE = NOT_MINE, _ANSWERED = ANSWERED, _QUEUE_WAITS = ANSWERED_QUEUE_WAITS


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


cdef object _new_request(object msg_id, object input_type, object inputs):
    cdef object msg = PyType_GenericAlloc(_REQUEST, 0)
    _set(msg, "msg_id", msg_id)
    _set(msg, "input_type", input_type)
    _set(msg, "inputs", inputs)
    _set(msg, "request_type", _ZERO)
    return msg


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

    def __init__(self, state, send, tuple direct):
        self.state = state
        self.send = send
        self.direct = direct
        self.generation = state.generation
        # The state keeps these maps for its whole life (it never rebinds them).
        self.replicas = state.replicas
        self.in_flight = state.in_flight
        self.pending = state.pending
        self.models = state.models

    def answer(self, list frames, double now):
        """Handle a ROUTER message (identity first) if it is a common answer."""
        cdef PyObject *found
        cdef object replica, msg, msg_id, outputs, batch, token, queue
        cdef dict held
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
        msg_id = msg.msg_id
        outputs = msg.outputs
        held = replica.in_flight
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
        try:
            frames = _encode(_new_request(msg_id, best.input_type, inputs), self.generation)
        except EncodeError:  # the state reports it: give the id back
            state._next_id = msg_id
            return False
        batch = _new_batch(model_name, inputs, input_type, deadline, token, count, msg_id, best)
        (<dict>best.in_flight)[msg_id] = batch
        self.in_flight[msg_id] = batch
        if deadline < <double>state._due:
            state._due = deadline
        message = [best.identity]
        message.extend(frames)
        self.send(message)
        return True
