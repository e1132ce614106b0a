# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``wirekit.mip._pure``: same functions, same results, same errors."""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject_GenericSetAttr
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset


cdef extern from "Python.h":
    void PyTuple_SET_ITEM(object p, Py_ssize_t pos, object o)
    object PyType_GenericAlloc(type t, Py_ssize_t n)

from wirekit._encoding import checked_int, contiguous_bytes
from wirekit.errors import DecodeError, EncodeError
from wirekit.mip import _pure
from wirekit.mip.messages import DEFAULT_MAX_ITEMS, ErrorCode, ErrorReply, Inference, Item, Kind, Ping

DEF HEADER_SIZE = 8
DEF INFERENCE_HEADER_SIZE = 4
DEF ITEM_HEADER_SIZE = 8
DEF U32_MAX = 0xFFFFFFFF

cdef object _new_tuple = tuple.__new__
cdef Py_ssize_t COPY_BELOW = _pure.COPY_BELOW
cdef tuple _KIND_NAMES = ("error", "ping", "inference")
cdef tuple _ERROR_CODES = tuple(ErrorCode)
cdef object _PING_REQUEST = Ping(False)
cdef object _PING_RESPONSE = Ping(True)


cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline void _put32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v >> 24
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


cdef inline object _new_item(uint32_t kind, object data):
    """``Item(kind, data)`` without a Python-level call (what tuple.__new__ does for a subclass)."""
    cdef object item = PyType_GenericAlloc(_ITEM_TYPE, 2)
    cdef object k = kind
    Py_INCREF(k)
    PyTuple_SET_ITEM(item, 0, k)
    Py_INCREF(data)
    PyTuple_SET_ITEM(item, 1, data)
    return item


cdef type _ITEM_TYPE = Item
cdef type _INFERENCE_TYPE = Inference
cdef str _RESPONSE = "response", _N_INPUT = "n_input", _N_OUTPUT = "n_output"
cdef str _BATCH_SIZE = "batch_size", _ITEMS = "items"


cdef object _new_inference(bint response, int n_input, int n_output, int batch, tuple items):
    """An ``Inference`` built through its slots, skipping the frozen dataclass ``__init__``."""
    cdef object msg = PyType_GenericAlloc(_INFERENCE_TYPE, 0)
    PyObject_GenericSetAttr(msg, _RESPONSE, True if response else False)
    PyObject_GenericSetAttr(msg, _N_INPUT, n_input)
    PyObject_GenericSetAttr(msg, _N_OUTPUT, n_output)
    PyObject_GenericSetAttr(msg, _BATCH_SIZE, batch)
    PyObject_GenericSetAttr(msg, _ITEMS, items)
    return msg


cdef object _fail(str field, Py_ssize_t offset, str text, int code):
    return DecodeError("mip", field, offset, text, code=code)


cdef int _header_fault(const uint8_t* h) noexcept nogil:
    """Which check the 8 header bytes at ``h`` fail (0: none) -- the one header rule, in the
    order the errors are reported: 1 version, 2 reserved, 3 kind, 4 subtype, 5 remaining."""
    if h[0] != 0:
        return 1
    if h[3] != 0:
        return 2
    if h[1] > 2:
        return 3
    if h[1] == 0:
        if h[2] > 5:
            return 4
    elif h[2] > 1:
        return 4
    if h[1] != 2 and (h[4] | h[5] | h[6] | h[7]) != 0:
        return 5
    return 0


cdef object _header_error(const uint8_t* h, Py_ssize_t pos, int fault):
    cdef int kind = h[1], subtype = h[2]
    if fault == 1:
        return _fail("version", pos, f"unsupported version {h[0]} (expected 0)", 0)
    if fault == 2:
        return _fail("reserved", pos + 3, f"must be 0, got {h[3]}", 0)
    if fault == 3:
        return _fail("kind", pos + 1, f"unknown kind {kind}", 2)
    if fault == 4:
        if kind == 0:
            return _fail("subtype", pos + 2, f"unknown error code {subtype}", 1)
        return _fail("subtype", pos + 2, f"unknown subtype {subtype} (0 request, 1 response)", 1)
    return _fail(
        "remaining", pos + 4,
        f"{_KIND_NAMES[kind]} message has no payload, header announces {_be32(h + 4)} bytes",
        4,
    )


cdef uint32_t _check_header(const uint8_t* base, Py_ssize_t size, Py_ssize_t pos,
                            int* kind_out, int* subtype_out) except? 0xFFFFFFFF:
    cdef Py_ssize_t have = size - pos
    if have < HEADER_SIZE:
        raise _fail("header", size, f"truncated: need {HEADER_SIZE} bytes, have {have}", 4)
    cdef const uint8_t* h = base + pos
    cdef int fault = _header_fault(h)
    if fault:
        raise _header_error(h, pos, fault)
    kind_out[0] = h[1]
    subtype_out[0] = h[2]
    return _be32(h + 4)


cdef Py_ssize_t _frame_ok(const uint8_t* base, Py_ssize_t size, Py_ssize_t pos,
                          Py_ssize_t max_size) noexcept nogil:
    """``frame_size`` without an exception, for the runtimes' compiled lanes: the size of the
    complete message at ``base[pos:size]``, -1 while it is incomplete (its header, if here,
    valid and within ``max_size``; -1: no limit), -2 if :func:`frame_size` would raise."""
    cdef Py_ssize_t total
    if size - pos < HEADER_SIZE:
        return -1
    if _header_fault(base + pos):
        return -2
    total = HEADER_SIZE + <Py_ssize_t>_be32(base + pos + 4)
    if 0 <= max_size < total:
        return -2
    return total if size - pos >= total else -1


cdef Py_ssize_t _frame_size(const uint8_t* base, Py_ssize_t size, Py_ssize_t pos,
                            Py_ssize_t max_size) except -2:
    cdef Py_ssize_t got = _frame_ok(base, size, pos, max_size)
    cdef int fault
    if got != -2:
        return got
    fault = _header_fault(base + pos)
    if fault:
        raise _header_error(base + pos, pos, fault)
    got = HEADER_SIZE + <Py_ssize_t>_be32(base + pos + 4)
    raise _fail("remaining", pos + 4,
                f"message of {got} bytes exceeds the limit of {max_size}", 3)


def check_header(buf, Py_ssize_t pos=0):
    """Validate the fixed header at ``pos``; return ``(kind, subtype, remaining)``."""
    cdef Py_buffer view
    cdef int kind = 0, subtype = 0
    cdef uint32_t remaining
    if type(buf) is bytes:
        remaining = _check_header(<const uint8_t*>PyBytes_AS_STRING(buf), PyBytes_GET_SIZE(buf),
                                  pos, &kind, &subtype)
        return kind, subtype, remaining
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        remaining = _check_header(<const uint8_t*>view.buf, view.len, pos, &kind, &subtype)
    finally:
        PyBuffer_Release(&view)
    return kind, subtype, remaining


def frame_size(buf, Py_ssize_t pos=0, max_size=None):
    """The size of the complete message at ``buf[pos:]``, or None while it is incomplete."""
    cdef Py_buffer view
    cdef Py_ssize_t limit = -1
    cdef Py_ssize_t got
    if max_size is not None:
        if max_size < 0:
            raise ValueError(f"max_size must be >= 0 or None, got {max_size!r}")
        limit = max_size
    if type(buf) is bytes:
        if pos < 0 or pos > PyBytes_GET_SIZE(buf):
            raise IndexError(f"position {pos} outside a buffer of {PyBytes_GET_SIZE(buf)} bytes")
        got = _frame_size(<const uint8_t*>PyBytes_AS_STRING(buf), PyBytes_GET_SIZE(buf),
                          pos, limit)
        return None if got < 0 else got
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or pos > view.len:
            raise IndexError(f"position {pos} outside a buffer of {view.len} bytes")
        got = _frame_size(<const uint8_t*>view.buf, view.len, pos, limit)
    finally:
        PyBuffer_Release(&view)
    return None if got < 0 else got


cdef object _decode_at(object buf, const uint8_t* base, Py_ssize_t size, Py_ssize_t pos,
                       Py_ssize_t max_items, Py_ssize_t* end_out):
    """Decode the message at ``base[pos:]`` (``buf`` owns the memory); store its end."""
    cdef int kind = 0, subtype = 0
    cdef uint32_t remaining, tl_type, tl_size
    cdef Py_ssize_t start, end, p, i, count
    cdef int n_input, n_output, batch
    cdef object mv = None, data, item
    cdef tuple items
    cdef list overflow = None
    if pos < 0 or pos > size:
        raise IndexError(f"position {pos} outside a buffer of {size} bytes")
    remaining = _check_header(base, size, pos, &kind, &subtype)
    start = pos + HEADER_SIZE
    end = start + <Py_ssize_t>remaining
    if end > size:
        raise _fail(
            "payload", size,
            f"truncated: header announces {remaining} bytes, {size - start} present", 4,
        )
    end_out[0] = end
    if kind == 0:
        return ErrorReply(_ERROR_CODES[subtype])
    if kind == 1:
        return _PING_RESPONSE if subtype == 1 else _PING_REQUEST
    if remaining < INFERENCE_HEADER_SIZE:
        raise _fail(
            "inference header", start,
            f"truncated: need {INFERENCE_HEADER_SIZE} bytes, payload has {remaining}", 4,
        )
    n_input = base[start]
    n_output = base[start + 1]
    batch = (base[start + 2] << 8) | base[start + 3]
    count = batch * (n_output if subtype == 1 else n_input)
    if count > max_items:
        raise _fail(
            "batch_size", start + 2,
            f"{count} items exceed the limit of {max_items} per message", 3,
        )
    p = start + INFERENCE_HEADER_SIZE
    # Every item needs 8 bytes: only a count the payload can hold sizes an allocation.
    if count * ITEM_HEADER_SIZE <= end - p:
        items = PyTuple_New(count)
    else:
        items = None
        overflow = []
    for i in range(count):
        if end - p < ITEM_HEADER_SIZE:
            raise _fail(
                f"items[{i}]", p,
                f"truncated item header: need {ITEM_HEADER_SIZE} bytes, "
                f"{end - p} left in the payload", 4,
            )
        tl_type = _be32(base + p)
        tl_size = _be32(base + p + 4)
        p += ITEM_HEADER_SIZE
        if tl_size > end - p:
            raise _fail(
                f"items[{i}].data", p,
                f"size {tl_size} exceeds the {end - p} bytes left in the payload", 4,
            )
        if tl_size < COPY_BELOW:
            data = PyBytes_FromStringAndSize(<const char*>base + p, tl_size)
        else:
            if mv is None:
                mv = memoryview(buf)
                if mv.ndim != 1 or mv.itemsize != 1:
                    mv = mv.cast("B")
            data = mv[p:p + tl_size]
        item = _new_item(tl_type, data)
        if overflow is None:
            Py_INCREF(item)
            PyTuple_SET_ITEM(items, i, item)
        else:
            overflow.append(item)
        p += tl_size
    if p != end:
        raise _fail("payload", p, f"{end - p} bytes after the last of {count} items", 4)
    if overflow is not None:  # unreachable: an over-count always runs out of payload
        items = tuple(overflow)
    return _new_inference(subtype == 1, n_input, n_output, batch, items)


cdef object _decode(object buf, Py_ssize_t pos, Py_ssize_t max_items, bint whole):
    cdef Py_buffer view
    cdef Py_ssize_t end = 0, size
    cdef object msg
    if type(buf) is bytes:
        size = PyBytes_GET_SIZE(buf)
        msg = _decode_at(buf, <const uint8_t*>PyBytes_AS_STRING(buf), size, pos, max_items,
                         &end)
    else:
        PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
        try:
            size = view.len
            msg = _decode_at(buf, <const uint8_t*>view.buf, size, pos, max_items, &end)
        finally:
            PyBuffer_Release(&view)
    if whole:
        if end != size:
            raise _fail("message", end, f"{size - end} bytes after the end of the message", 4)
        return msg
    return msg, end


def decode_prefix(buf, Py_ssize_t pos=0, Py_ssize_t max_items=DEFAULT_MAX_ITEMS):
    """Decode the message that starts at ``pos``; return it and the offset just past it."""
    return _decode(buf, pos, max_items, False)


def decode(buf, Py_ssize_t max_items=DEFAULT_MAX_ITEMS):
    """Decode exactly one complete message; trailing bytes are an error."""
    return _decode(buf, 0, max_items, True)


cdef uint32_t _int_in(object value, str field, uint64_t top,
                      Py_ssize_t index=-1) except? 0xFFFFFFFF:
    """``value`` as a C integer if it is an int in 0..top; else EncodeError naming ``field``.

    With ``field=None`` the field is ``items[index].type``, formatted only on error.
    """
    cdef unsigned long long v
    if type(value) is int and value >= 0:
        try:
            v = value
        except OverflowError:
            v = top + 1
        if v <= top:
            return <uint32_t>v
    if field is None:
        field = f"items[{index}].type"
    return checked_int("mip", value, field, top)


cdef bytes _encode_header_only(int kind, int subtype):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, HEADER_SIZE)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    memset(o, 0, HEADER_SIZE)
    o[1] = kind
    o[2] = subtype
    return out


cdef class _Views:
    """Holds the acquired buffers of every item for the duration of one encode."""
    cdef Py_buffer* views
    cdef uint32_t* types
    cdef Py_ssize_t held

    def __cinit__(self, Py_ssize_t n):
        self.views = <Py_buffer*>PyMem_Malloc(max(n, 1) * sizeof(Py_buffer))
        self.types = <uint32_t*>PyMem_Malloc(max(n, 1) * sizeof(uint32_t))
        self.held = 0
        if self.views == NULL or self.types == NULL:
            raise MemoryError()

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.held):
            PyBuffer_Release(&self.views[i])
        PyMem_Free(self.views)
        PyMem_Free(self.types)


def encode(msg):
    """Encode one message to bytes."""
    cdef bytes out
    cdef uint8_t* o
    cdef int n_input, n_output, batch, width
    cdef Py_ssize_t i, n, total, p, size
    cdef tuple items
    cdef _Views held
    cdef Py_buffer* view
    cls = type(msg)
    if cls is Ping:
        return _encode_header_only(1, 1 if msg.response else 0)
    if cls is ErrorReply:
        return _encode_header_only(0, _int_in(msg.code, "code", 5))
    if cls is not Inference:
        raise EncodeError("mip", "message", f"not a MIP message: {cls.__name__}")
    n_input = _int_in(msg.n_input, "n_input", 0xFF)
    n_output = _int_in(msg.n_output, "n_output", 0xFF)
    batch = _int_in(msg.batch_size, "batch_size", 0xFFFF)
    response = bool(msg.response)
    width = n_output if response else n_input
    items = tuple(msg.items)
    n = PyTuple_GET_SIZE(items)
    if n != batch * width:
        raise EncodeError(
            "mip", "items",
            f"{n} items, but batch_size {batch} × "
            f"{'n_output' if response else 'n_input'} {width} = {batch * width}",
        )
    # Validate every item and size the payload, holding each buffer until it is copied.
    held = _Views(n)
    total = INFERENCE_HEADER_SIZE
    for i in range(n):
        item = <object>PyTuple_GET_ITEM(items, i)
        if not PyTuple_Check(item) or PyTuple_GET_SIZE(item) != 2:
            item = tuple(item)
            if PyTuple_GET_SIZE(item) != 2:
                raise EncodeError("mip", f"items[{i}]", "expected a (type, data) pair")
        held.types[i] = _int_in(<object>PyTuple_GET_ITEM(item, 0), None, U32_MAX, i)
        data = <object>PyTuple_GET_ITEM(item, 1)
        view = &held.views[i]
        if type(data) is bytes:
            # No buffer to acquire: ``items`` keeps the bytes alive until they are copied,
            # and a view with obj NULL is a no-op for PyBuffer_Release.
            memset(view, 0, sizeof(Py_buffer))  # obj NULL: nothing to release
            view.buf = <void*>PyBytes_AS_STRING(data)
            view.len = PyBytes_GET_SIZE(data)
        else:
            try:
                PyObject_GetBuffer(data, view, PyBUF_SIMPLE)
            except (TypeError, BufferError):
                contiguous_bytes("mip", data, f"items[{i}].data")  # raises the shared error
                raise
        held.held = i + 1
        if view.len > U32_MAX:
            raise EncodeError("mip", f"items[{i}].data", "longer than 4 GiB - 1")
        total += ITEM_HEADER_SIZE + view.len
    if total > U32_MAX:
        raise EncodeError("mip", "payload", f"{total} bytes does not fit a u32 length")
    out = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + total)
    o = <uint8_t*>PyBytes_AS_STRING(out)
    o[0] = 0; o[1] = 2; o[2] = 1 if response else 0; o[3] = 0
    _put32(o + 4, <uint32_t>total)
    o[8] = n_input; o[9] = n_output; o[10] = batch >> 8; o[11] = batch & 0xFF
    p = HEADER_SIZE + INFERENCE_HEADER_SIZE
    for i in range(n):
        view = &held.views[i]
        _put32(o + p, held.types[i])
        _put32(o + p + 4, <uint32_t>view.len)
        memcpy(o + p + ITEM_HEADER_SIZE, view.buf, view.len)
        p += ITEM_HEADER_SIZE + view.len
    return out
