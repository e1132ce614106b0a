# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``wirekit.oip._pure``: the OIP mapping's hot path, same results, same errors.

``request_to_mip`` writes the MIP wire directly: one ``bytes`` of the exact size, each
tensor's bytes copied once, into it.  ``response_from_mip`` reads TENSOR items in C, their
data memoryviews into the reply (no copy).  Anything the fast paths do not take (rows of more
than one sample, a bad tensor, an unusual buffer) goes to the pure twin, so every error is the
pure twin's own, raised by the same code.  Every length read from the wire or from a tensor
(datatype code, ndim, name length, parameters length, dimensions, BYTES lengths) is checked
against the bytes present before it is used.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from wirekit.mip.messages import Inference
from wirekit.oip import _pure
from wirekit.oip.errors import BackendError
from wirekit.oip.items import (
    MAX_TENSORS,
    OipItem,
    read_json_object,
    read_request_item,
    read_tensor_item,
    request_item,
    stack_rows,
    tensor_parameters,
)
from wirekit.oip.messages import BY_CODE, DATATYPES, PROTOCOL, Tensor
from wirekit.errors import DecodeError

DEF MIP_HEAD = 12          # MIP header (8) + inference header (4)
DEF ITEM_HEAD = 8          # type u32, size u32
DEF TENSOR_HEAD = 8        # datatype u8, ndim u8, name_length u16, parameters_length u32
DEF MAX_NDIM = 255
DEF MAX_NAME = 0xFFFF
DEF U32_MAX = 0xFFFFFFFF
DEF INT64_MAX = 0x7FFFFFFFFFFFFFFF
DEF N_CODES = 15           # datatype codes 1..14; 0 and >= 15 are unknown

cdef uint32_t _REQUEST = OipItem.REQUEST
cdef uint32_t _TENSOR = OipItem.TENSOR
cdef uint32_t _PARAMETERS = OipItem.PARAMETERS
cdef uint32_t _ERROR = OipItem.ERROR
cdef int _MAX_TENSORS = MAX_TENSORS
cdef dict _CODES = {name: d.code for name, d in DATATYPES.items()}
cdef tuple _NAMES = tuple(BY_CODE[c].name if c in BY_CODE else None for c in range(N_CODES))
# element size per code (0: BYTES); index only after checking 1 <= code < N_CODES
cdef int _SIZES[N_CODES]
for _code in range(N_CODES):
    _SIZES[_code] = BY_CODE[_code].size if _code in BY_CODE else -1
cdef type _TENSOR_TYPE = Tensor
cdef type _INFERENCE_TYPE = Inference


cdef inline void _put32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v >> 24
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


cdef inline void _put64(uint8_t* p, uint64_t v) noexcept nogil:
    _put32(p, <uint32_t>(v >> 32))
    _put32(p + 4, <uint32_t>v)


cdef inline void _put_request_head(uint8_t* out, uint32_t remaining, uint8_t n_input,
                                   uint16_t batch_size) noexcept nogil:
    """The 12 bytes that open a MIP inference request (specs/mip.md): version 0, kind 2
    (inference), subtype 0 (request), reserved 0, ``remaining``; ``n_input``, n_output 0,
    ``batch_size``."""
    out[0] = 0
    out[1] = 2
    out[2] = 0
    out[3] = 0
    _put32(out + 4, remaining)
    out[8] = n_input
    out[9] = 0
    out[10] = <uint8_t>(batch_size >> 8)
    out[11] = <uint8_t>(batch_size & 0xFF)


cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint32_t _le32(const uint8_t* p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline int64_t _be64(const uint8_t* p) noexcept nogil:
    return <int64_t>((<uint64_t>_be32(p) << 32) | _be32(p + 4))


cdef bint _bytes_ok(const uint8_t* p, Py_ssize_t size, uint64_t count) noexcept nogil:
    """True when ``p[:size]`` is exactly ``count`` well-framed BYTES elements (the walk stops
    at the bytes present, so a huge ``count`` costs nothing)."""
    cdef Py_ssize_t pos = 0
    cdef uint32_t length
    cdef uint64_t i = 0
    while i < count:
        if size - pos < 4:
            return False
        length = _le32(p + pos)
        pos += 4
        if length > <uint64_t>(size - pos):
            return False
        pos += length
        i += 1
    return pos == size


cdef bint _data_ok(int code, const uint8_t* p, Py_ssize_t size, uint64_t count,
                   bint counted) noexcept nogil:
    """True when ``size`` bytes at ``p`` are what ``count`` elements of datatype ``code``
    (already checked to be known) take; ``counted`` False: the count overflowed 64 bits."""
    cdef int width = _SIZES[code]
    if not counted:
        return False
    if width == 0:
        return _bytes_ok(p, size, count)
    if count > <uint64_t>size:  # cannot fit, and count * width might overflow
        return False
    return count * <uint64_t>width == <uint64_t>size


def bytes_framing_ok(data, count) -> bool:
    """True when ``data`` is exactly ``count`` well-framed BYTES elements (the C walk behind
    :func:`wirekit.oip.check_tensor`; False: the pure walk finds and names the problem)."""
    cdef Py_buffer view
    cdef bint ok
    if type(count) is not int or count < 0 or count > 0xFFFFFFFFFFFFFFFF:
        return False
    if PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) != 0:
        return False
    try:
        ok = _bytes_ok(<const uint8_t*>view.buf, view.len, <uint64_t>count)
    finally:
        PyBuffer_Release(&view)
    return ok


# --------------------------------------------------------------------------- request_to_mip


cdef struct _Plan:
    int code
    int ndim
    Py_ssize_t head_size      # tensor head + name + shape + parameters
    Py_ssize_t data_size


def request_to_mip(req, *, bint rows=False):
    """The MIP inference request wire that carries ``req`` (see the pure twin)."""
    if rows:
        width, samples = _pure.request_plan(req, True)
        return _write_plan(width, samples)
    inputs = req.inputs
    cdef Py_ssize_t n = len(inputs)
    if n > _MAX_TENSORS:
        return _pure.request_to_mip(req)
    cdef bytes request = request_item(req)
    cdef Py_buffer* views = <Py_buffer*>PyMem_Malloc((n if n else 1) * sizeof(Py_buffer))
    cdef _Plan* plans = <_Plan*>PyMem_Malloc((n if n else 1) * sizeof(_Plan))
    cdef Py_ssize_t held = 0, i, d, total = 4 + ITEM_HEAD + len(request)
    cdef list names = [], shapes = [], params = []
    cdef object t, code, dim, elements
    cdef bytes name, parameters
    cdef uint64_t count
    cdef bint counted, fallback = False
    cdef bytes wire
    cdef uint8_t* out
    cdef tuple shape
    if views == NULL or plans == NULL:
        PyMem_Free(views)
        PyMem_Free(plans)
        raise MemoryError()
    try:
        for i in range(n):
            t = inputs[i]
            code = _CODES.get(t.datatype) if type(t.datatype) is str else None
            shape = t.shape if type(t.shape) is tuple else None
            if code is None or shape is None or len(shape) > MAX_NDIM:
                fallback = True
                break
            elements = 1
            for dim in shape:
                if type(dim) is not int or dim < 0 or dim > INT64_MAX:
                    fallback = True
                    break
                elements *= dim
            if fallback:
                break
            counted = elements <= 0xFFFFFFFFFFFFFFFF
            count = elements if counted else 0
            if PyObject_GetBuffer(t.data, &views[i], PyBUF_SIMPLE) != 0:
                fallback = True
                break
            held += 1
            if not _data_ok(code, <const uint8_t*>views[i].buf, views[i].len, count, counted):
                fallback = True
                break
            try:  # a bad name or parameters: the pure twin says which, in its order
                name = t.name.encode("utf-8", "surrogatepass")
                parameters = tensor_parameters(t, f"inputs[{i}]") if t.parameters else b""
            except Exception:
                fallback = True
                break
            if len(name) > MAX_NAME:
                fallback = True
                break
            plans[i].code = code
            plans[i].ndim = len(shape)
            plans[i].head_size = TENSOR_HEAD + len(name) + 8 * len(shape) + len(parameters)
            plans[i].data_size = views[i].len
            names.append(name)
            shapes.append(shape)
            params.append(parameters)
            total += ITEM_HEAD + plans[i].head_size + plans[i].data_size
            if total > U32_MAX:
                fallback = True
                break
        if fallback:
            return _pure.request_to_mip(req)
        wire = PyBytes_FromStringAndSize(NULL, 8 + total)
        out = <uint8_t*>PyBytes_AS_STRING(wire)
        _put_request_head(out, <uint32_t>total, <uint8_t>(1 + n), 1)
        out += MIP_HEAD
        _put32(out, _REQUEST)
        _put32(out + 4, <uint32_t>len(request))
        memcpy(out + ITEM_HEAD, PyBytes_AS_STRING(request), len(request))
        out += ITEM_HEAD + len(request)
        for i in range(n):
            name = names[i]
            parameters = params[i]
            shape = shapes[i]
            _put32(out, _TENSOR)
            _put32(out + 4, <uint32_t>(plans[i].head_size + plans[i].data_size))
            out += ITEM_HEAD
            out[0] = <uint8_t>plans[i].code
            out[1] = <uint8_t>plans[i].ndim
            out[2] = <uint8_t>(len(name) >> 8)
            out[3] = <uint8_t>(len(name) & 0xFF)
            _put32(out + 4, <uint32_t>len(parameters))
            out += TENSOR_HEAD
            memcpy(out, PyBytes_AS_STRING(name), len(name))
            out += len(name)
            for d in range(plans[i].ndim):
                _put64(out, <uint64_t><int64_t>shape[d])
                out += 8
            memcpy(out, PyBytes_AS_STRING(parameters), len(parameters))
            out += len(parameters)
            memcpy(out, views[i].buf, plans[i].data_size)
            out += plans[i].data_size
        return wire
    finally:
        for i in range(held):
            PyBuffer_Release(&views[i])
        PyMem_Free(views)
        PyMem_Free(plans)


cdef bytes _write_plan(int width, list samples):
    """The wire of a checked plan (``_pure.request_plan``): each item's head and buffer
    copied once into one ``bytes``."""
    cdef Py_ssize_t total = 4, size
    cdef object sample, entry, data
    cdef bytes head, wire
    cdef Py_buffer view
    cdef uint8_t* out
    for sample in samples:
        for entry in sample:
            total += ITEM_HEAD + len(<bytes>entry[1]) + memoryview(entry[2]).nbytes
    if total > U32_MAX:
        return _pure._write(width, samples)
    wire = PyBytes_FromStringAndSize(NULL, 8 + total)
    out = <uint8_t*>PyBytes_AS_STRING(wire)
    _put_request_head(out, <uint32_t>total, <uint8_t>width, <uint16_t>len(samples))
    out += MIP_HEAD
    for sample in samples:
        for entry in sample:
            head = entry[1]
            data = entry[2]
            PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
            try:
                size = len(head) + view.len
                _put32(out, <uint32_t>entry[0])
                _put32(out + 4, <uint32_t>size)
                memcpy(out + ITEM_HEAD, PyBytes_AS_STRING(head), len(head))
                memcpy(out + ITEM_HEAD + len(head), view.buf, view.len)
                out += ITEM_HEAD + size
            finally:
                PyBuffer_Release(&view)
    return wire


# --------------------------------------------------------------------------- response_from_mip


cdef object _read_tensor(object data, Py_ssize_t index):
    """A TENSOR item's tensor (item ``index`` of the message), read in C; the pure reader
    (and its error) for anything not well-formed."""
    cdef Py_buffer view
    cdef const uint8_t* p
    cdef Py_ssize_t size, pos, need
    cdef int code, ndim, d
    cdef uint32_t name_length, parameters_length
    cdef int64_t dim
    cdef uint64_t count = 1
    cdef bint counted = True, zero = False
    cdef list shape
    cdef object name = None, parameters_json = None
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        p = <const uint8_t*>view.buf
        size = view.len
        if size < TENSOR_HEAD:
            return read_tensor_item(data, f"items[{index}]")
        code = p[0]
        ndim = p[1]
        name_length = (<uint32_t>p[2] << 8) | p[3]
        parameters_length = _be32(p + 4)
        if code < 1 or code >= N_CODES or _SIZES[code] < 0:
            return read_tensor_item(data, f"items[{index}]")
        need = <Py_ssize_t>name_length + 8 * <Py_ssize_t>ndim + <Py_ssize_t>parameters_length
        if need > size - TENSOR_HEAD:
            return read_tensor_item(data, f"items[{index}]")
        try:
            name = PyUnicode_DecodeUTF8(<const char*>p + TENSOR_HEAD, name_length, "surrogatepass")
        except UnicodeDecodeError:
            return read_tensor_item(data, f"items[{index}]")
        pos = TENSOR_HEAD + name_length
        shape = []
        for d in range(ndim):
            dim = _be64(p + pos + 8 * d)
            if dim < 0:
                return read_tensor_item(data, f"items[{index}]")
            if dim == 0:
                zero = True
            elif counted and count > (<uint64_t>0xFFFFFFFFFFFFFFFF) // <uint64_t>dim:
                counted = False
            elif counted:
                count *= <uint64_t>dim
            shape.append(dim)
        if zero:
            counted = True
            count = 0
        pos += 8 * ndim
        if parameters_length:
            parameters_json = PyBytes_FromStringAndSize(<const char*>p + pos, parameters_length)
        pos += parameters_length
        if not _data_ok(code, p + pos, size - pos, count, counted):
            return read_tensor_item(data, f"items[{index}]")
    finally:
        PyBuffer_Release(&view)
    parameters = {} if parameters_json is None else read_json_object(
        parameters_json, f"items[{index}]"
    )
    whole = memoryview(data)
    if whole.format != "B" or whole.ndim != 1:
        whole = whole.cast("B")
    return _TENSOR_TYPE(name, _NAMES[code], tuple(shape), whole[pos:], parameters)


cdef tuple _reply_sample(tuple items, Py_ssize_t first):
    cdef list outputs = []
    cdef object parameters = None
    cdef Py_ssize_t k
    cdef object item
    cdef str field
    for k in range(len(items)):
        item = items[k]
        if item.type == _TENSOR:
            outputs.append(_read_tensor(item.data, first + k))
            continue
        field = f"items[{first + k}]"
        if item.type == _PARAMETERS or item.type == _REQUEST:
            if parameters is not None:
                raise DecodeError(PROTOCOL, field, 0, "a second parameters item in one sample")
            if item.type == _PARAMETERS:
                parameters = read_json_object(item.data, field)
            else:
                parameters = read_request_item(item.data, field)[0]
        else:
            raise DecodeError(
                PROTOCOL, field, 0, f"item type {item.type:#x} is not one of an OIP reply"
            )
    return outputs, parameters


def response_from_mip(msg, *, bint rows=False):
    """The outputs and parameters a MIP backend's reply carries (see the pure twin)."""
    if type(msg) is not _INFERENCE_TYPE:
        return _pure.response_from_mip(msg, rows=rows)
    cdef tuple items = msg.items
    cdef object item
    for item in items:
        if item.type == _ERROR:
            raise BackendError(bytes(item.data).decode("utf-8", "replace"))
    cdef Py_ssize_t width = msg.width, batch = msg.batch_size, s
    if batch == 0 or (not rows and batch != 1):
        return _pure.response_from_mip(msg, rows=rows)
    cdef list samples = []
    cdef object parameters = None, found
    for s in range(batch):
        outputs, found = _reply_sample(items[s * width:(s + 1) * width], s * width)
        if s and found != parameters:
            raise DecodeError(
                PROTOCOL, f"items[{s * width}]", 0,
                f"rows: sample {s} has other parameters than sample 0",
            )
        parameters = found
        samples.append(outputs)
    if rows:
        return stack_rows(samples, "items"), parameters or {}
    return samples[0], parameters or {}
