# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled helpers for the MIP runtime's per-request Python work (not a codec twin).

``wirekit.mip.runtime`` uses these when built (and ``WIREKIT_PURE`` is not set) in place of
its own pure-Python functions of the same names, which define the behaviour: same results,
same exceptions.  ``tests/test_mip_runtime_accel.py`` checks the two agree.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyObject, PyObject_GenericSetAttr
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport uint8_t

from wirekit._fast.mip cimport _frame_ok


cdef extern from "Python.h":
    void PyTuple_SET_ITEM(object p, Py_ssize_t pos, object o)
    object PyTuple_New(Py_ssize_t n)
    object PyType_GenericAlloc(type t, Py_ssize_t n)


cdef type _ITEM = None
cdef type _INFERENCE = None
cdef object _to_item = None
cdef object _ragged = None
cdef tuple _single = ()
cdef object _TEXT = 1
cdef str _RESPONSE = "response", _N_INPUT = "n_input", _N_OUTPUT = "n_output"
cdef str _BATCH_SIZE = "batch_size", _ITEMS = "items"


def bind(item, inference, to_item, ragged, single, text):
    """Called once by ``wirekit.mip.runtime`` with the classes and fallbacks it defines."""
    global _ITEM, _INFERENCE, _to_item, _ragged, _single, _TEXT
    _ITEM = item
    _INFERENCE = inference
    _to_item = to_item
    _ragged = ragged
    _single = single
    _TEXT = text


cdef inline object _text_item(str value):
    cdef object item = PyType_GenericAlloc(_ITEM, 2)
    cdef object data = value.encode("utf-8")
    Py_INCREF(_TEXT)
    PyTuple_SET_ITEM(item, 0, _TEXT)
    Py_INCREF(data)
    PyTuple_SET_ITEM(item, 1, data)
    return item


def flatten(samples):
    """Items of every sample in order, items per sample, and the number of samples."""
    cdef list items = []
    cdef Py_ssize_t width = -1, w, n = 0, j
    cdef object values, v
    cdef type cls
    for sample in samples:
        cls = type(sample)
        if cls is list or cls is tuple:
            values = sample
        elif isinstance(sample, _single):
            values = (sample,)
        else:
            values = tuple(sample)
        w = len(values)
        if w != width:
            if width != -1:
                raise _ragged(n, w, width)
            width = w
        if type(values) is tuple:  # no iterator: index the tuple
            for j in range(w):
                v = <object>PyTuple_GET_ITEM(values, j)
                cls = type(v)
                if cls is _ITEM:
                    items.append(v)
                elif cls is str:
                    items.append(_text_item(<str>v))
                else:
                    items.append(_to_item(v))
        else:
            for v in values:
                cls = type(v)
                if cls is _ITEM:
                    items.append(v)
                elif cls is str:
                    items.append(_text_item(<str>v))
                else:
                    items.append(_to_item(v))
        n += 1
    return tuple(items), (width if width > 0 else 0), n


def new_inference(bint response, int n_input, int n_output, int batch_size, tuple items):
    """``Inference(...)`` without the frozen dataclass ``__init__`` (fields set directly)."""
    cdef object msg = PyType_GenericAlloc(_INFERENCE, 0)
    PyObject_GenericSetAttr(msg, _RESPONSE, True if response else False)
    PyObject_GenericSetAttr(msg, _N_INPUT, n_input)
    PyObject_GenericSetAttr(msg, _N_OUTPUT, n_output)
    PyObject_GenericSetAttr(msg, _BATCH_SIZE, batch_size)
    PyObject_GenericSetAttr(msg, _ITEMS, items)
    return msg


def singles(tuple items):
    """``tuple((item,) for item in items)``: a one-item sample per item."""
    cdef Py_ssize_t i, n = PyTuple_GET_SIZE(items)
    cdef object out = PyTuple_New(n)
    cdef object one, item
    for i in range(n):
        item = <object>PyTuple_GET_ITEM(items, i)
        one = PyTuple_New(1)
        Py_INCREF(item)
        PyTuple_SET_ITEM(one, 0, item)
        Py_INCREF(one)
        PyTuple_SET_ITEM(out, i, one)
    return out


cdef extern from "Python.h":
    int PyIter_Send(object iter, object arg, PyObject** presult)


cdef int _send_none(object coro, PyObject** out) except -1:
    # PyIter_Send: 0 returned (PYGEN_RETURN), 1 suspended (PYGEN_NEXT), -1 raised (set).
    cdef int r = PyIter_Send(coro, None, out)
    if r == -1:
        return -1
    return r


def start(coro):
    """Run a coroutine to its first suspension without a StopIteration for a return:
    ``(True, result)`` if it returned, ``(False, yielded)`` if it suspended; what it
    raises propagates."""
    cdef PyObject* result = NULL
    cdef int r = _send_none(coro, &result)
    value = <object>result
    Py_DECREF(value)  # PyIter_Send gave a new reference; <object> took another
    return r == 0, value


def deliver(bytes data, waiting, Py_ssize_t max_size):
    """The whole inference replies at the start of ``data``, each to the call at the head of
    ``waiting``; returns (replies taken, bytes used).  See ``runtime._deliver_py``."""
    cdef const uint8_t* b = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data), pos = 0, end, size, taken = 0
    cdef object fut, popleft = waiting.popleft
    while waiting and n - pos >= 8:
        size = _frame_ok(b, n, pos, max_size)  # the codec's frame check
        if size < 0 or b[pos + 1] != 2:
            break
        end = pos + size
        fut = popleft().future
        taken += 1
        if not fut.done():
            fut.set_result(data if end - pos == n
                           else PyBytes_FromStringAndSize(<const char*>b + pos, end - pos))
        pos = end
    return taken, pos
