# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``wirekit.clipper._pure``: same functions, same results, same errors.

Frames are read in place (``bytes`` directly, anything else through one memoryview each);
numeric inputs become NumPy arrays built with the C API over the frame memory (no copy, no
Python-level call per input).  Encoding takes a fast path for the common input shapes
(exact-dtype C-contiguous 2-D arrays, lists of ``str``) and otherwise lets the shared
normaliser of ``wirekit.clipper.messages`` validate and convert, so that the errors are the
pure path's.
"""

cimport numpy as cnp
from cpython.buffer cimport PyBuffer_IsContiguous
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_New
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject_GenericSetAttr
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_Check, PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcpy

from wirekit._fast.littleendian cimport _put32, _put64, _rd32, _rd64

cnp.import_array()


cdef extern from "Python.h":
    object PyType_GenericAlloc(type t, Py_ssize_t n)
    object PyMemoryView_FromObject(object o)
    Py_buffer* PyMemoryView_GET_BUFFER(object mv)
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    void PyList_SET_ITEM(object l, Py_ssize_t i, object o)
    object PyLong_FromUnsignedLong(unsigned long v)

import numpy as np

from wirekit.clipper import messages as _m
from wirekit.clipper.messages import (
    Direction,
    Generation,
    Heartbeat,
    HeartbeatReply,
    HeartbeatType,
    InputType,
    NewContainer,
    PredictRequest,
    PredictResponse,
)
from wirekit.errors import DecodeError, EncodeError

DEF G16 = 0
DEF G17 = 1
DEF V3 = 2
DEF RPC_VERSION = 3
DEF U32_MAX = 0xFFFFFFFF

cdef tuple _GEN_NAMES = ("2016", "2017", "v3")
cdef tuple _TYPE_NAMES = ("bytes", "int32", "float32", "float64", "string")
cdef tuple _INPUT_TYPES = tuple(InputType)
cdef int[4] _TYPENUM = [cnp.NPY_UINT8, cnp.NPY_INT32, cnp.NPY_FLOAT32, cnp.NPY_FLOAT64]
cdef int[4] _ELEMENT_SIZE = [1, 4, 4, 8]
cdef object _G2016 = Generation.G2016, _G2017 = Generation.G2017, _V3 = Generation.V3
cdef object _TO_CLIPPER = Direction.TO_CLIPPER, _TO_CONTAINER = Direction.TO_CONTAINER
cdef object _HEARTBEAT = Heartbeat()
cdef tuple _HB_REPLIES = (HeartbeatReply(HeartbeatType(0)), HeartbeatReply(HeartbeatType(1)))
cdef type _REQUEST_TYPE = PredictRequest
cdef type _RESPONSE_TYPE = PredictResponse
cdef str _MSG_ID = "msg_id", _INPUT_TYPE = "input_type", _INPUTS = "inputs"
cdef str _REQ_TYPE = "request_type", _OUTPUTS = "outputs"
cdef object _ZERO = 0
cdef bytes _EMPTY = b""


cdef bytes _b32(uint32_t v):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 4)
    _put32(<uint8_t*>PyBytes_AS_STRING(out), v)
    return out


cdef bytes _b64(uint64_t v):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 8)
    _put64(<uint8_t*>PyBytes_AS_STRING(out), v)
    return out


cdef bytes _T0 = _b32(0), _T1 = _b32(1), _T2 = _b32(2), _T3 = _b32(3)


cdef object _fail(str field, Py_ssize_t offset, str text, Py_ssize_t frame):
    return DecodeError("clipper", field, offset, text, frame=frame)


# --- frames ----------------------------------------------------------------------------------


cdef struct FrameRef:
    const uint8_t* p
    Py_ssize_t n
    bint readonly


DEF SMALL = 40


cdef class _Frames:
    """The frames of one message: a pointer and size for each, and the object owning it
    (the frame itself for ``bytes``, else the memoryview taken of it)."""

    cdef Py_ssize_t n
    cdef FrameRef* refs
    cdef FrameRef small[SMALL]
    cdef object frames
    cdef list views

    def __dealloc__(self):
        if self.refs != self.small:
            PyMem_Free(self.refs)

    cdef inline object owner(self, Py_ssize_t i):
        if self.views is not None and self.views[i] is not None:
            return self.views[i]
        return self.frames[i]

    cdef load(self, object frames):
        cdef Py_ssize_t i, n
        cdef Py_buffer* view
        if type(frames) is not list and type(frames) is not tuple:
            frames = list(frames)
        n = len(frames)
        self.n = n
        self.frames = frames
        if n <= SMALL:
            self.refs = self.small
        else:
            self.refs = <FrameRef*>PyMem_Malloc(n * sizeof(FrameRef))
            if self.refs == NULL:
                raise MemoryError()
        for i in range(n):
            f = frames[i]
            if type(f) is bytes:
                self.refs[i].p = <const uint8_t*>PyBytes_AS_STRING(f)
                self.refs[i].n = PyBytes_GET_SIZE(f)
                self.refs[i].readonly = True
            else:
                try:
                    mv = PyMemoryView_FromObject(f)
                except TypeError:
                    raise TypeError(
                        f"frame {i}: expected a bytes-like object, got {type(f).__name__}"
                    ) from None
                view = PyMemoryView_GET_BUFFER(mv)
                if not PyBuffer_IsContiguous(view, b'C'):
                    raise TypeError(f"frame {i}: not a contiguous buffer")
                self.refs[i].p = <const uint8_t*>view.buf
                self.refs[i].n = view.len
                self.refs[i].readonly = view.readonly != 0
                if self.views is None:
                    self.views = [None] * n
                self.views[i] = mv


cdef object _view(_Frames fr, Py_ssize_t i, Py_ssize_t start, int nd, cnp.npy_intp* dims,
                  int itype):
    """An array of ``dims`` over frame ``i`` from byte ``start``, owned by the frame."""
    cdef cnp.ndarray arr = cnp.PyArray_SimpleNewFromData(
        nd, dims, _TYPENUM[itype], <void*>(fr.refs[i].p + start))
    cnp.set_array_base(arr, fr.owner(i))
    if fr.refs[i].readonly:
        cnp.PyArray_CLEARFLAGS(arr, cnp.NPY_ARRAY_WRITEABLE)
    return arr


cdef inline void _need(_Frames fr, Py_ssize_t count, str what, object arg=None) except *:
    """Exactly ``count`` frames; ``what`` is formatted with ``arg`` only on error."""
    if fr.n != count:
        what = what.format(arg)
        raise _fail("frames", 0, f"{what} has {count} frames, got {fr.n}", min(fr.n, count))


cdef inline void _at_least(_Frames fr, Py_ssize_t count, str what, object arg=None) except *:
    if fr.n < count:
        what = what.format(arg)
        raise _fail("frames", 0, f"{what} has at least {count} frames, got {fr.n}", fr.n)


cdef uint32_t _u32(_Frames fr, Py_ssize_t i, str field) except? 0xFFFFFFFF:
    cdef Py_ssize_t n = fr.refs[i].n
    if n != 4:
        raise _fail(field, min(n, 4), f"expected 4 bytes, got {n}", i)
    return _rd32(fr.refs[i].p)


cdef uint64_t _u64(_Frames fr, Py_ssize_t i, str field) except? 0xFFFFFFFFFFFFFFFF:
    cdef Py_ssize_t n = fr.refs[i].n
    if n != 8:
        raise _fail(field, min(n, 8), f"expected 8 bytes, got {n}", i)
    return _rd64(fr.refs[i].p)


cdef int64_t _size_2017(_Frames fr, Py_ssize_t i, str field) except? -0x7FFFFFFFFFFFFFFF:
    cdef Py_ssize_t n = fr.refs[i].n
    if n == 8:
        return <int64_t>_rd64(fr.refs[i].p)
    if n == 4:
        return <int32_t>_rd32(fr.refs[i].p)
    raise _fail(field, min(n, 8), f"expected 8 bytes (or 4, as the markdown spec says), got {n}", i)


cdef uint32_t _msg_id_2017(_Frames fr, Py_ssize_t i) except? 0xFFFFFFFF:
    cdef Py_ssize_t n = fr.refs[i].n
    cdef uint64_t value
    if n == 8:
        value = _rd64(fr.refs[i].p)
        if value > U32_MAX:
            raise _fail("msg_id", 4, f"8-byte id {value} does not fit 32 bits", i)
        return <uint32_t>value
    if n != 4:
        raise _fail(
            "msg_id", min(n, 4),
            f"expected 4 bytes (or 8, as the JVM container sends), got {n}", i,
        )
    return _rd32(fr.refs[i].p)


cdef str _utf8(const uint8_t* p, Py_ssize_t n, str field, Py_ssize_t index, Py_ssize_t base,
               Py_ssize_t frame):
    """``p[:n]`` decoded; on bad UTF-8 a DecodeError on ``field`` (``field[index]`` when
    ``index`` >= 0, formatted only then)."""
    try:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError as exc:
        if index >= 0:
            field = f"{field}[{index}]"
        raise _fail(field, base + exc.start, f"invalid UTF-8: {exc.reason}", frame) from None


cdef void _request_type(_Frames fr, Py_ssize_t i) except *:
    cdef uint32_t rt = _u32(fr, i, "request_type")
    if rt == 1:
        raise _fail(
            "request_type", 0,
            "feedback request (type 1): Clipper defines no body for it and never sends one; "
            "not decoded", i,
        )
    if rt != 0:
        raise _fail("request_type", 0, f"unknown request type {rt} (0 predict, 1 feedback)", i)


cdef inline bint _is_ws(uint8_t c) noexcept nogil:
    return c == 32 or (9 <= c <= 13)


cdef object _ascii_input_type(_Frames fr, Py_ssize_t i):
    cdef const uint8_t* d = fr.refs[i].p
    cdef Py_ssize_t n = fr.refs[i].n, p = 0, start, digits
    cdef bint negative = False, big = False
    cdef int value = 0
    while p < n and _is_ws(d[p]):
        p += 1
    start = p
    if p < n and (d[p] == 43 or d[p] == 45):
        negative = d[p] == 45
        p += 1
    digits = p
    while p < n and 48 <= d[p] <= 57:
        if value > 4:
            big = True
        else:
            value = value * 10 + (d[p] - 48)
        p += 1
    if p == digits:
        raise _fail("input_type", digits, "expected a decimal integer (read by std::stoi)", i)
    if big or value > 4 or (negative and value != 0):
        # At most 20 bytes shown (and copied): the frame may hold millions of digits.
        shown = (<bytes>PyBytes_FromStringAndSize(
            <const char*>d + start, p - start if p - start <= 20 else 20)).decode()
        if p - start > 20:
            shown += "..."
        raise _fail("input_type", start, f"unknown input type {shown} (0..4)", i)
    return _INPUT_TYPES[value]


# --- decode ----------------------------------------------------------------------------------


cdef object _new_container(_Frames fr, int gen):
    cdef Py_ssize_t k = 0 if gen == G16 else 1
    cdef uint32_t rpc
    _need(fr, 4 + k + (1 if gen == V3 else 0), "a {} registration", _GEN_NAMES[gen])
    name = _utf8(fr.refs[k + 1].p, fr.refs[k + 1].n, "model_name", -1, 0, k + 1)
    version = _utf8(fr.refs[k + 2].p, fr.refs[k + 2].n, "model_version", -1, 0, k + 2)
    if gen == G16 and not _m.stoi_prefix(
            PyBytes_FromStringAndSize(<const char*>fr.refs[k + 2].p, fr.refs[k + 2].n)):
        raise _fail(
            "model_version", 0,
            "2016 Clipper parses the version with std::stoi; it does not start with an integer",
            k + 2,
        )
    itype = _ascii_input_type(fr, k + 3)
    rpc_obj = None
    if gen == V3:
        rpc = _u32(fr, 5, "rpc_version")
        if rpc != RPC_VERSION:
            raise _fail("rpc_version", 0, f"expected {RPC_VERSION}, got {rpc}", 5)
        rpc_obj = RPC_VERSION
    return NewContainer(name, version, itype, rpc_obj)


cdef object _new_response(uint32_t msg_id, object outputs):
    cdef object msg = PyType_GenericAlloc(_RESPONSE_TYPE, 0)
    PyObject_GenericSetAttr(msg, _MSG_ID, PyLong_FromUnsignedLong(msg_id))
    PyObject_GenericSetAttr(msg, _OUTPUTS, outputs)
    return msg


cdef object _new_request(uint32_t msg_id, int itype, object inputs):
    cdef object msg = PyType_GenericAlloc(_REQUEST_TYPE, 0)
    PyObject_GenericSetAttr(msg, _MSG_ID, PyLong_FromUnsignedLong(msg_id))
    PyObject_GenericSetAttr(msg, _INPUT_TYPE, _INPUT_TYPES[itype])
    PyObject_GenericSetAttr(msg, _INPUTS, inputs)
    PyObject_GenericSetAttr(msg, _REQ_TYPE, _ZERO)
    return msg


cdef object _response_2016(_Frames fr):
    cdef uint32_t msg_id = _u32(fr, 1, "msg_id")
    cdef Py_ssize_t n = fr.refs[2].n
    cdef cnp.npy_intp dims[1]
    if n % 4:
        raise _fail("outputs", n - n % 4, f"{n} bytes is not a whole number of float32 values", 2)
    if n == 0:
        raise _fail("outputs", 0, "no outputs (a response has one per input)", 2)
    dims[0] = n // 4
    return _new_response(msg_id, _view(fr, 2, 0, 1, dims, 2))


cdef object _response_2017(_Frames fr):
    cdef uint32_t msg_id, count, length
    cdef Py_ssize_t size, room, start, p, i
    cdef uint64_t total = 0
    cdef const uint8_t* f
    _need(fr, 4, "a 2017 prediction response")
    msg_id = _msg_id_2017(fr, 2)
    f = fr.refs[3].p
    size = fr.refs[3].n
    if size < 4:
        raise _fail("payload", size, f"truncated: need 4 bytes for the output count, have {size}", 3)
    count = _rd32(f)
    if count == 0:
        raise _fail("payload", 0, "no outputs (a response has one per input)", 3)
    room = (size - 4) // 4
    if count > room:
        raise _fail(
            "payload", 4, f"{count} outputs announced, the frame holds at most {room} lengths", 3
        )
    start = 4 + 4 * <Py_ssize_t>count
    for i in range(count):
        total += _rd32(f + 4 + 4 * i)
    if total != <uint64_t>(size - start):
        raise _fail(
            "payload", start, f"the lengths add up to {total} bytes, {size - start} follow them", 3
        )
    cdef list outputs = PyList_New(count)
    p = start
    for i in range(count):
        length = _rd32(f + 4 + 4 * i)
        s = _utf8(f + p, length, "outputs", i, p, 3)
        Py_INCREF(s)
        PyList_SET_ITEM(outputs, i, s)
        p += length
    return _new_response(msg_id, outputs)


cdef object _response_v3(_Frames fr):
    cdef uint32_t msg_id
    cdef uint64_t announced, count, length
    cdef Py_ssize_t hl, i
    cdef const uint8_t* h
    _at_least(fr, 5, "a v3 prediction response")
    msg_id = _u32(fr, 2, "msg_id")
    announced = _u64(fr, 3, "header_size")
    h = fr.refs[4].p
    hl = fr.refs[4].n
    if announced != <uint64_t>hl:
        raise _fail("header_size", 0, f"announces {announced} bytes, the header frame has {hl}", 3)
    if hl % 8:
        raise _fail("header", hl - hl % 8, f"{hl} bytes is not a whole number of u64 values", 4)
    if hl == 0:
        raise _fail("header", 0, "truncated: need 8 bytes for the output count, have 0", 4)
    count = _rd64(h)
    if count == 0:
        raise _fail("header", 0, "no outputs (a response has one per input)", 4)
    if count != <uint64_t>(hl // 8 - 1):
        raise _fail(
            "header", 0, f"announces {count} outputs, the frame holds {hl // 8 - 1} lengths", 4
        )
    _need(fr, 5 + <Py_ssize_t>count, "a v3 prediction response with {} outputs", count)
    cdef list outputs = PyList_New(<Py_ssize_t>count)
    for i in range(<Py_ssize_t>count):
        length = _rd64(h + 8 + 8 * i)
        if <uint64_t>fr.refs[5 + i].n != length:
            raise _fail(
                f"lengths[{i}]", 8 + 8 * i,
                f"announces {length} bytes, output frame {5 + i} has {fr.refs[5 + i].n}", 4,
            )
        s = _utf8(fr.refs[5 + i].p, fr.refs[5 + i].n, "outputs", i, 0, 5 + i)
        Py_INCREF(s)
        PyList_SET_ITEM(outputs, i, s)
    return _new_response(msg_id, outputs)


cdef int _header_u32(_Frames fr, Py_ssize_t hi, uint32_t* n_out) except -1:
    """Check the u32 header of a 2016/2017 request; return the input type, store n."""
    cdef const uint8_t* h = fr.refs[hi].p
    cdef Py_ssize_t hl = fr.refs[hi].n
    cdef uint32_t itype, n
    if hl % 4:
        raise _fail("header", hl - hl % 4, f"{hl} bytes is not a whole number of u32 values", hi)
    if hl < 8:
        raise _fail(
            "header", hl, f"truncated: need 8 bytes (input type, number of inputs), have {hl}", hi
        )
    itype = _rd32(h)
    if itype > 4:
        raise _fail("input_type", 0, f"unknown input type {itype} (0..4)", hi)
    n = _rd32(h + 4)
    if n == 0:
        raise _fail("num_inputs", 4, "no inputs (Clipper never sends an empty batch)", hi)
    if <Py_ssize_t>n - 1 != hl // 4 - 2:
        raise _fail(
            "num_inputs", 4, f"{n} inputs need {n - 1} offsets, the header holds {hl // 4 - 2}", hi
        )
    n_out[0] = n
    return itype


cdef list _split_strings(_Frames fr, Py_ssize_t ci, Py_ssize_t n):
    cdef const uint8_t* d = fr.refs[ci].p
    cdef Py_ssize_t size = fr.refs[ci].n, p = 0, i
    cdef const uint8_t* nul
    cdef list out = PyList_New(n)
    for i in range(n):
        nul = <const uint8_t*>memchr(d + p, 0, size - p)
        if nul == NULL:
            raise _fail("content", p, f"string {i} of {n} has no NUL terminator", ci)
        s = _utf8(d + p, nul - (d + p), "inputs", i, p, ci)
        Py_INCREF(s)
        PyList_SET_ITEM(out, i, s)
        p = nul - d + 1
    if p != size:
        raise _fail("content", p, f"{size - p} bytes after the last of {n} strings", ci)
    return out


cdef object _content(_Frames fr, Py_ssize_t hi, Py_ssize_t ci, int itype, Py_ssize_t n):
    """Inputs of a 2016/2017 request: header frame ``hi``, content frame ``ci``."""
    cdef const uint8_t* offs = fr.refs[hi].p + 8
    cdef Py_ssize_t i, size, es, total, off, prev, width, start
    cdef bint equal = True
    cdef cnp.npy_intp dims[2]
    if itype == 4:
        for i in range(n - 1):
            off = _rd32(offs + 4 * i)
            if off != i + 1:
                raise _fail(
                    f"offsets[{i}]", 8 + 4 * i,
                    f"expected {i + 1} (Clipper counts each string as one element), got {off}", hi,
                )
        return _split_strings(fr, ci, n)
    size = fr.refs[ci].n
    es = _ELEMENT_SIZE[itype]
    if size % es:
        raise _fail(
            "content", size - size % es,
            f"{size} bytes is not a whole number of {_TYPE_NAMES[itype]} values", ci,
        )
    total = size // es
    width = _rd32(offs) if n > 1 else total
    prev = 0
    for i in range(n - 1):
        off = _rd32(offs + 4 * i)
        if off < prev:
            raise _fail(f"offsets[{i}]", 8 + 4 * i, f"{off} is less than the previous {prev}", hi)
        if off > total:
            raise _fail(
                f"offsets[{i}]", 8 + 4 * i, f"{off} is past the {total} elements of the content",
                hi,
            )
        if off - prev != width:
            equal = False
        prev = off
    if total - prev != width:
        equal = False
    if equal:
        dims[0] = n
        dims[1] = width
        return _view(fr, ci, 0, 2, dims, itype)
    cdef list out = PyList_New(n)
    prev = 0
    for i in range(n):
        off = _rd32(offs + 4 * i) if i < n - 1 else total
        dims[0] = off - prev
        arr = _view(fr, ci, prev * es, 1, dims, itype)
        Py_INCREF(arr)
        PyList_SET_ITEM(out, i, arr)
        prev = off
    return out


cdef object _request_2016(_Frames fr):
    cdef uint32_t msg_id, n
    cdef int itype
    _need(fr, 5, "a 2016 prediction request")
    msg_id = _u32(fr, 1, "msg_id")
    _request_type(fr, 2)
    itype = _header_u32(fr, 3, &n)
    return _new_request(msg_id, itype, _content(fr, 3, 4, itype, n))


cdef object _request_2017(_Frames fr):
    cdef uint32_t msg_id, n
    cdef int itype
    cdef int64_t announced
    _need(fr, 8, "a 2017 prediction request")
    msg_id = _u32(fr, 2, "msg_id")
    _request_type(fr, 3)
    announced = _size_2017(fr, 4, "header_size")
    if announced != fr.refs[5].n:
        raise _fail(
            "header_size", 0, f"announces {announced} bytes, the header frame has {fr.refs[5].n}", 4
        )
    itype = _header_u32(fr, 5, &n)
    announced = _size_2017(fr, 6, "content_size")
    if announced != fr.refs[7].n:
        raise _fail(
            "content_size", 0, f"announces {announced} bytes, the content frame has {fr.refs[7].n}",
            6,
        )
    return _new_request(msg_id, itype, _content(fr, 5, 7, itype, n))


cdef object _request_v3(_Frames fr):
    cdef uint32_t msg_id
    cdef uint64_t announced, itype64, n64, size
    cdef Py_ssize_t hl, i, n, es = 0, width
    cdef int itype
    cdef bint equal = True
    cdef const uint8_t* h
    cdef cnp.npy_intp dims[2]
    cdef cnp.ndarray batch
    cdef char* dst
    _at_least(fr, 7, "a v3 prediction request")
    msg_id = _u32(fr, 3, "msg_id")
    _request_type(fr, 4)
    announced = _u64(fr, 5, "header_size")
    h = fr.refs[6].p
    hl = fr.refs[6].n
    if announced != <uint64_t>hl:
        raise _fail("header_size", 0, f"announces {announced} bytes, the header frame has {hl}", 5)
    if hl % 8:
        raise _fail("header", hl - hl % 8, f"{hl} bytes is not a whole number of u64 values", 6)
    if hl < 16:
        raise _fail(
            "header", hl, f"truncated: need 16 bytes (input type, number of inputs), have {hl}", 6
        )
    itype64 = _rd64(h)
    if itype64 > 4:
        raise _fail("input_type", 0, f"unknown input type {itype64} (0..4)", 6)
    itype = <int>itype64
    n64 = _rd64(h + 8)
    if n64 == 0:
        raise _fail("num_inputs", 8, "no inputs (Clipper never sends an empty batch)", 6)
    if n64 != <uint64_t>(hl // 8 - 2):
        raise _fail(
            "num_inputs", 8, f"{n64} inputs need {n64} sizes, the header holds {hl // 8 - 2}", 6
        )
    n = <Py_ssize_t>n64
    _need(fr, 7 + n, "a v3 prediction request with {} inputs", n)
    cdef list out = None
    if itype == 4:
        out = PyList_New(n)
    else:
        es = _ELEMENT_SIZE[itype]
    width = fr.refs[7].n
    for i in range(n):
        size = _rd64(h + 16 + 8 * i)
        if <uint64_t>fr.refs[7 + i].n != size:
            raise _fail(
                f"sizes[{i}]", 16 + 8 * i,
                f"announces {size} bytes, input frame {7 + i} has {fr.refs[7 + i].n}", 6,
            )
        if itype == 4:
            s = _utf8(fr.refs[7 + i].p, fr.refs[7 + i].n, "inputs", i, 0, 7 + i)
            Py_INCREF(s)
            PyList_SET_ITEM(out, i, s)
            continue
        if size % es:
            raise _fail(
                f"inputs[{i}]", size - size % es,
                f"{size} bytes is not a whole number of {_TYPE_NAMES[itype]} values", 7 + i,
            )
        if fr.refs[7 + i].n != width:
            equal = False
    if itype == 4:
        return _new_request(msg_id, itype, out)
    if equal:
        # One frame per input: a 2-D batch needs one copy (as Clipper's own container makes).
        dims[0] = n
        dims[1] = width // es
        batch = cnp.PyArray_EMPTY(2, dims, _TYPENUM[itype], 0)
        dst = <char*>cnp.PyArray_DATA(batch)
        for i in range(n):
            memcpy(dst + i * width, fr.refs[7 + i].p, width)
        return _new_request(msg_id, itype, batch)
    out = PyList_New(n)
    for i in range(n):
        dims[0] = fr.refs[7 + i].n // es
        arr = _view(fr, 7 + i, 0, 1, dims, itype)
        Py_INCREF(arr)
        PyList_SET_ITEM(out, i, arr)
    return _new_request(msg_id, itype, out)


cdef object _heartbeat_reply(_Frames fr, Py_ssize_t base, int gen):
    cdef uint32_t hb
    _need(fr, base + 2, "a {} heartbeat reply", _GEN_NAMES[gen])
    hb = _u32(fr, base + 1, "heartbeat_type")
    if hb > 1:
        raise _fail(
            "heartbeat_type", 0, f"unknown heartbeat type {hb} (0 keep-alive, 1 request metadata)",
            base + 1,
        )
    return _HB_REPLIES[hb]


cdef object _unknown_type(uint32_t mtype, Py_ssize_t frame):
    return _fail(
        "msg_type", 0, f"unknown message type {mtype} (0 new container, 1 content, 2 heartbeat)",
        frame,
    )


cdef int _gen(object generation) except -1:
    if generation is _G2017:
        return G17
    if generation is _V3:
        return V3
    if generation is _G2016:
        return G16
    return _gen(_m.as_generation(generation))


cdef bint _to_clipper(object direction) except -1:
    if direction is _TO_CONTAINER:
        return False
    if direction is _TO_CLIPPER:
        return True
    return _to_clipper(_m.as_direction(direction))


def decode(frames, generation, direction):
    """Decode one message from its frames as the container sees them (delimiter first)."""
    cdef int gen = _gen(generation)
    cdef bint out = _to_clipper(direction)
    cdef _Frames fr = _Frames.__new__(_Frames)
    cdef uint32_t mtype, rpc
    cdef Py_ssize_t n, base
    fr.load(frames)
    n = fr.n
    if n == 0:
        raise _fail("delimiter", 0, "no frames (expected an empty delimiter frame first)", 0)
    if fr.refs[0].n:
        raise _fail(
            "delimiter", 0, f"expected an empty frame, got {fr.refs[0].n} bytes (for a ROUTER-side "
            f"message, strip the identity with from_router first)", 0,
        )
    if gen == G16:
        if not out:
            return _request_2016(fr)
        if n == 4:
            return _new_container(fr, gen)
        if n == 3:
            return _response_2016(fr)
        raise _fail(
            "frames", 0, f"a 2016 message to Clipper has 3 frames (prediction response) or 4 "
            f"(registration), got {n}", min(n, 4),
        )
    if out:
        _at_least(fr, 2, "a {} message to Clipper", _GEN_NAMES[gen])
        mtype = _u32(fr, 1, "msg_type")
        if mtype == 2:
            _need(fr, 2, "a {} heartbeat", _GEN_NAMES[gen])
            return _HEARTBEAT
        if mtype == 0:
            return _new_container(fr, gen)
        if mtype == 1:
            return _response_2017(fr) if gen == G17 else _response_v3(fr)
        raise _unknown_type(mtype, 1)
    base = 1
    if gen == V3:
        _at_least(fr, 2, "a v3 message to the container")
        rpc = _u32(fr, 1, "rpc_version")
        if rpc != RPC_VERSION:
            raise _fail("rpc_version", 0, f"expected {RPC_VERSION}, got {rpc}", 1)
        base = 2
    _at_least(fr, base + 1, "a {} message to the container", _GEN_NAMES[gen])
    mtype = _u32(fr, base, "msg_type")
    if mtype == 2:
        return _heartbeat_reply(fr, base, gen)
    if mtype == 1:
        return _request_2017(fr) if gen == G17 else _request_v3(fr)
    if mtype == 0:
        raise _fail("msg_type", 0, "message type 0 (new container) is only sent to Clipper", base)
    raise _unknown_type(mtype, base)


# --- encode ----------------------------------------------------------------------------------


cdef class _Parts:
    """``n`` byte ranges to copy out (strings, rows), kept alive by ``keep``."""

    cdef Py_ssize_t n
    cdef const char** ptr
    cdef Py_ssize_t* size
    cdef object keep

    def __dealloc__(self):
        PyMem_Free(self.ptr)
        PyMem_Free(self.size)

    cdef alloc(self, Py_ssize_t n):
        self.n = n
        self.ptr = <const char**>PyMem_Malloc((n + 1) * sizeof(char*))
        self.size = <Py_ssize_t*>PyMem_Malloc((n + 1) * sizeof(Py_ssize_t))
        if self.ptr == NULL or self.size == NULL:
            raise MemoryError()


cdef _Parts _str_parts(object seq, bint for_outputs):
    """UTF-8 of a list/tuple of ``str`` in place, or None when it needs the slow path."""
    cdef Py_ssize_t i, n
    cdef _Parts parts
    if type(seq) is not list and type(seq) is not tuple:
        return None
    n = len(seq)
    parts = _Parts.__new__(_Parts)
    parts.alloc(n)
    parts.keep = seq
    for i in range(n):
        s = seq[i]
        if not PyUnicode_Check(s):
            return None
        try:
            parts.ptr[i] = PyUnicode_AsUTF8AndSize(s, &parts.size[i])
        except UnicodeEncodeError:
            return None
    return parts


cdef _Parts _bytes_parts(list items):
    """Byte ranges of normalised items (``bytes`` or C-contiguous arrays)."""
    cdef Py_ssize_t i, n = len(items)
    cdef _Parts parts = _Parts.__new__(_Parts)
    cdef cnp.ndarray arr
    parts.alloc(n)
    parts.keep = items
    for i in range(n):
        x = items[i]
        if type(x) is bytes:
            parts.ptr[i] = PyBytes_AS_STRING(x)
            parts.size[i] = PyBytes_GET_SIZE(x)
        else:
            arr = x
            parts.ptr[i] = <const char*>cnp.PyArray_DATA(arr)
            parts.size[i] = cnp.PyArray_NBYTES(arr)
    return parts


cdef uint32_t _check_u32(object value, str field) except? 0xFFFFFFFF:
    cdef unsigned long long v
    if type(value) is int and value >= 0:
        try:
            v = value
        except OverflowError:
            v = U32_MAX + 1
        if v <= U32_MAX:
            return <uint32_t>v
    return _m.check_u32(value, field)


cdef int _check_itype(object value) except -1:
    cdef int k
    for k in range(5):
        if value is _INPUT_TYPES[k]:
            return k
    if type(value) is int and 0 <= value <= 4:
        return value
    return int(_m.check_input_type(value))


cdef bint _fast_array(object x, int nd, int itype):
    """True for a C-contiguous native array of ``itype``'s exact dtype and ``nd`` dims."""
    cdef cnp.ndarray arr
    if type(x) is not cnp.ndarray:
        return False
    arr = x
    return (arr.ndim == nd and cnp.PyArray_TYPE(arr) == _TYPENUM[itype]
            and cnp.PyArray_ISNOTSWAPPED(arr) and cnp.PyArray_IS_C_CONTIGUOUS(arr))


cdef list _frames_2017_request(bytes msg_id, bytes header, bytes content):
    return [_EMPTY, _T1, msg_id, _T0, _b64(PyBytes_GET_SIZE(header)), header,
            _b64(PyBytes_GET_SIZE(content)), content]


cdef list _encode_request(object msg, int gen):
    cdef uint32_t msg_id = _check_u32(msg.msg_id, "msg_id")
    cdef Py_ssize_t n, i, row = 0, total, p
    cdef int itype
    cdef _Parts parts = None
    cdef cnp.ndarray arr
    cdef const char* data = NULL
    cdef bytes header, content, id_frame
    cdef uint8_t* o
    rt = msg.request_type
    if not (type(rt) is int and rt == 0):
        _m.check_request_type(rt)
    itype = _check_itype(msg.input_type)
    inputs = msg.inputs
    # Either one exact-dtype 2-D array (rows of ``row`` bytes at ``data``) or ``parts``.
    if itype != 4 and _fast_array(inputs, 2, itype):
        arr = inputs
        n = cnp.PyArray_DIMS(arr)[0]
        row = cnp.PyArray_DIMS(arr)[1] * _ELEMENT_SIZE[itype]
        data = <const char*>cnp.PyArray_DATA(arr)
    else:
        if itype == 4:
            parts = _str_parts(inputs, False)
        if parts is None:
            parts = _bytes_parts(_m.normalize_inputs(inputs, itype))
        n = parts.n
    if n == 0:
        raise EncodeError("clipper", "inputs", "no inputs (Clipper never sends an empty batch)")
    id_frame = _b32(msg_id)
    if gen == V3:
        header = PyBytes_FromStringAndSize(NULL, 8 * (n + 2))
        o = <uint8_t*>PyBytes_AS_STRING(header)
        _put64(o, itype)
        _put64(o + 8, n)
        frames = PyList_New(7 + n)
        for k, f in enumerate((_EMPTY, _T3, _T1, id_frame, _T0, _b64(8 * (n + 2)), header)):
            Py_INCREF(f)
            PyList_SET_ITEM(frames, k, f)
        for i in range(n):
            if parts is None:
                f = PyBytes_FromStringAndSize(data + i * row, row)
            else:
                f = PyBytes_FromStringAndSize(parts.ptr[i], parts.size[i])
            _put64(o + 16 + 8 * i, PyBytes_GET_SIZE(f))
            Py_INCREF(f)
            PyList_SET_ITEM(frames, 7 + i, f)
        return frames
    if n > U32_MAX:
        raise EncodeError("clipper", "inputs", f"{n} inputs do not fit the u32 count")
    header = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
    o = <uint8_t*>PyBytes_AS_STRING(header)
    _put32(o, itype)
    _put32(o + 4, <uint32_t>n)
    if itype == 4:
        total = 0
        for i in range(n):
            if memchr(parts.ptr[i], 0, parts.size[i]) != NULL:
                raise EncodeError(
                    "clipper", f"inputs[{i}]",
                    f"contains a NUL byte, which ends a string in {_GEN_NAMES[gen]} content",
                )
            total += parts.size[i] + 1
        for i in range(n - 1):
            _put32(o + 8 + 4 * i, <uint32_t>(i + 1))
        content = PyBytes_FromStringAndSize(NULL, total)
        p = 0
        for i in range(n):
            memcpy(PyBytes_AS_STRING(content) + p, parts.ptr[i], parts.size[i])
            p += parts.size[i]
            PyBytes_AS_STRING(content)[p] = 0
            p += 1
    elif parts is None:
        if n * row // _ELEMENT_SIZE[itype] > U32_MAX:
            raise EncodeError(
                "clipper", "inputs",
                f"more than 4294967295 elements; {_GEN_NAMES[gen]} offsets are u32",
            )
        for i in range(n - 1):
            _put32(o + 8 + 4 * i, <uint32_t>((i + 1) * row // _ELEMENT_SIZE[itype]))
        content = PyBytes_FromStringAndSize(data, n * row)
    else:
        total = 0
        for i in range(n - 1):
            total += parts.size[i] // _ELEMENT_SIZE[itype]
            if total <= U32_MAX:
                _put32(o + 8 + 4 * i, <uint32_t>total)
        total = 0
        for i in range(n):
            total += parts.size[i]
        if total // _ELEMENT_SIZE[itype] > U32_MAX:
            raise EncodeError(
                "clipper", "inputs",
                f"more than 4294967295 elements; {_GEN_NAMES[gen]} offsets are u32",
            )
        content = PyBytes_FromStringAndSize(NULL, total)
        p = 0
        for i in range(n):
            memcpy(PyBytes_AS_STRING(content) + p, parts.ptr[i], parts.size[i])
            p += parts.size[i]
    if gen == G16:
        return [_EMPTY, id_frame, _T0, header, content]
    return _frames_2017_request(id_frame, header, content)


cdef list _encode_response(object msg, int gen):
    cdef uint32_t msg_id = _check_u32(msg.msg_id, "msg_id")
    cdef _Parts parts = None
    cdef cnp.ndarray arr
    cdef Py_ssize_t n, i, total, p
    cdef bytes payload, header
    cdef uint8_t* o
    outputs = msg.outputs
    if gen == G16:
        if _fast_array(outputs, 1, 2):
            arr = outputs
        else:
            arr = _m.normalize_outputs(outputs, _G2016)
        if cnp.PyArray_SIZE(arr) == 0:
            raise EncodeError("clipper", "outputs", "no outputs (a response has one per input)")
        return [_EMPTY, _b32(msg_id), PyBytes_FromStringAndSize(
            <const char*>cnp.PyArray_DATA(arr), cnp.PyArray_NBYTES(arr))]
    parts = _str_parts(outputs, True)
    if parts is None:
        parts = _bytes_parts(_m.normalize_outputs(outputs, _G2017))
    n = parts.n
    if n == 0:
        raise EncodeError("clipper", "outputs", "no outputs (a response has one per input)")
    if gen == G17:
        total = 4 + 4 * n
        for i in range(n):
            if <uint64_t>parts.size[i] > U32_MAX:
                raise EncodeError("clipper", f"outputs[{i}]", "longer than 4 GiB - 1")
            total += parts.size[i]
        payload = PyBytes_FromStringAndSize(NULL, total)
        o = <uint8_t*>PyBytes_AS_STRING(payload)
        _put32(o, <uint32_t>n)
        p = 4 + 4 * n
        for i in range(n):
            _put32(o + 4 + 4 * i, <uint32_t>parts.size[i])
            memcpy(o + p, parts.ptr[i], parts.size[i])
            p += parts.size[i]
        return [_EMPTY, _T1, _b32(msg_id), payload]
    header = PyBytes_FromStringAndSize(NULL, 8 * (n + 1))
    o = <uint8_t*>PyBytes_AS_STRING(header)
    _put64(o, n)
    frames = PyList_New(5 + n)
    for k, f in enumerate((_EMPTY, _T1, _b32(msg_id), _b64(8 * (n + 1)), header)):
        Py_INCREF(f)
        PyList_SET_ITEM(frames, k, f)
    for i in range(n):
        _put64(o + 8 + 8 * i, parts.size[i])
        f = PyBytes_FromStringAndSize(parts.ptr[i], parts.size[i])
        Py_INCREF(f)
        PyList_SET_ITEM(frames, 5 + i, f)
    return frames


def encode(msg, generation):
    """Encode one message to its frames as the container sees them (delimiter first)."""
    cdef int gen = _gen(generation)
    cdef uint32_t hb
    cls = type(msg)
    if cls is PredictRequest:
        return _encode_request(msg, gen)
    if cls is PredictResponse:
        return _encode_response(msg, gen)
    if cls is NewContainer:
        _, _, itype = _m.registration_fields(msg, (_G2016, _G2017, _V3)[gen])
        frames = [_EMPTY]
        if gen != G16:
            frames.append(_T0)
        frames.append(msg.model_name.encode("utf-8"))
        frames.append(msg.model_version.encode("utf-8"))
        frames.append(str(itype).encode("ascii"))
        if gen == V3:
            frames.append(_T3)
        return frames
    if cls is Heartbeat or cls is HeartbeatReply:
        if gen == G16:
            raise EncodeError("clipper", "message", "2016 Clipper has no heartbeats")
        if cls is Heartbeat:
            return [_EMPTY, _T2]
        hb = _m.check_u32(msg.heartbeat_type, "heartbeat_type")
        if hb > 1:
            raise EncodeError(
                "clipper", "heartbeat_type",
                f"unknown heartbeat type {hb} (0 keep-alive, 1 request metadata)",
            )
        if gen == V3:
            return [_EMPTY, _T3, _T2, _b32(hb)]
        return [_EMPTY, _T2, _b32(hb)]
    raise EncodeError("clipper", "message", f"not a Clipper message: {cls.__name__}")
