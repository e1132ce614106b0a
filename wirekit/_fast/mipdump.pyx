# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``wirekit.mip.dump.format_run_pure``: the same text, faster.

Each message is first decoded by the active MIP codec (``wirekit._fast.mip.decode_prefix``:
the one truth about what is well-formed); only a message it accepts is formatted, straight
from its bytes, into one growing buffer.  Everything not well-formed or incomplete is left to
the caller, exactly like the pure twin.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport uint32_t
from libc.string cimport memcpy, strlen

import json

from wirekit._fast import mip as _codec
from wirekit.errors import DecodeError

cdef object _decode_prefix = _codec.decode_prefix
cdef object _json_str = json.encoder.encode_basestring
cdef const char* _HEX = b"0123456789abcdef"
cdef tuple _CODE_NAMES = ("PROTOCOL", "SUBTYPE", "METHOD", "MEMORY", "SHAPE", "INTERNAL")
cdef tuple _TYPE_NAMES = (None, "TEXT", "JSON", "IMAGE")
DEF PREVIEW = 16
DEF TEXT_PREVIEW = 64


cdef struct Buf:
    char* p
    Py_ssize_t n
    Py_ssize_t cap


cdef int _grow(Buf* b, Py_ssize_t more) except -1:
    cdef Py_ssize_t cap = b.cap
    cdef char* p
    if b.n + more <= cap:
        return 0
    while cap < b.n + more:
        cap = cap * 2 + 64
    p = <char*>PyMem_Realloc(b.p, cap)
    if p == NULL:
        raise MemoryError()
    b.p = p
    b.cap = cap
    return 0


cdef inline int _put(Buf* b, const char* s, Py_ssize_t n) except -1:
    _grow(b, n)
    memcpy(b.p + b.n, s, n)
    b.n += n
    return 0


cdef inline int _puts(Buf* b, const char* s) except -1:
    return _put(b, s, strlen(s))


cdef int _putu(Buf* b, unsigned long long v) except -1:
    cdef char tmp[24]
    cdef int k = 24
    if v == 0:
        return _put(b, b"0", 1)
    while v:
        k -= 1
        tmp[k] = <char>(48 + v % 10)
        v //= 10
    return _put(b, tmp + k, 24 - k)


cdef int _put_str(Buf* b, str s) except -1:
    cdef Py_ssize_t n
    cdef const char* p = PyUnicode_AsUTF8AndSize(s, &n)
    return _put(b, p, n)


cdef int _pad(Buf* b, Py_ssize_t used, Py_ssize_t width) except -1:
    cdef Py_ssize_t k
    _grow(b, width)
    for k in range(used, width):
        b.p[b.n] = 32
        b.n += 1
    return 0


cdef int _hex(Buf* b, const unsigned char* d, Py_ssize_t n, bint spaced) except -1:
    # Writes through a local pointer: stores through ``b.p`` would alias ``b.n``.
    cdef Py_ssize_t k
    cdef char* o
    cdef const char* hx = _HEX
    cdef unsigned char c
    _grow(b, 3 * n)
    o = b.p + b.n
    if spaced:
        for k in range(n):
            c = d[k]
            if k:
                o[0] = 32
                o += 1
            o[0] = hx[c >> 4]
            o[1] = hx[c & 15]
            o += 2
    else:
        for k in range(n):
            c = d[k]
            o[2 * k] = hx[c >> 4]
            o[2 * k + 1] = hx[c & 15]
        o += 2 * n
    b.n = o - b.p
    return 0


cdef inline uint32_t _u32(const unsigned char* d):
    return (<uint32_t>d[0] << 24) | (<uint32_t>d[1] << 16) | (<uint32_t>d[2] << 8) | d[3]


cdef int _type_name(Buf* b, uint32_t t, bint padded) except -1:
    cdef Py_ssize_t start = b.n
    if 1 <= t <= 3:
        _put_str(b, _TYPE_NAMES[t])
    else:
        _put(b, b"TYPE", 4)
        _putu(b, t)
    if padded:
        _pad(b, b.n - start, 6)
    return 0


cdef object _text(const unsigned char* d, Py_ssize_t n):
    """The UTF-8 text of ``d[:n]``, or None when it is not valid UTF-8."""
    try:
        return PyUnicode_DecodeUTF8(<const char*>d, n, NULL)
    except UnicodeDecodeError:
        return None


cdef inline bint _ascii(const unsigned char* d, Py_ssize_t n):
    cdef Py_ssize_t k
    for k in range(n):
        if d[k] >= 128:
            return False
    return True


cdef int _repr_ascii(Buf* b, const unsigned char* d, Py_ssize_t n) except -1:
    """``repr()`` of the ASCII text ``d[:n]``, as Python writes it."""
    cdef Py_ssize_t k
    cdef unsigned char c, quote = 39
    cdef bint single = False, double = False
    cdef char* o
    for k in range(n):
        if d[k] == 39:
            single = True
        elif d[k] == 34:
            double = True
    if single and not double:
        quote = 34
    _grow(b, 4 * n + 2)
    o = b.p + b.n
    o[0] = quote
    o += 1
    for k in range(n):
        c = d[k]
        if c == quote or c == 92:
            o[0] = 92
            o[1] = c
            o += 2
        elif c == 9 or c == 10 or c == 13:
            o[0] = 92
            o[1] = 116 if c == 9 else (110 if c == 10 else 114)
            o += 2
        elif c < 32 or c == 127:
            o[0] = 92
            o[1] = 120
            o[2] = _HEX[c >> 4]
            o[3] = _HEX[c & 15]
            o += 4
        else:
            o[0] = c
            o += 1
    o[0] = quote
    o += 1
    b.n = o - b.p
    return 0


cdef int _json_ascii(Buf* b, const unsigned char* d, Py_ssize_t n) except -1:
    """``json.encoder.encode_basestring`` of the ASCII text ``d[:n]``."""
    cdef Py_ssize_t k
    cdef unsigned char c
    cdef char* o
    _grow(b, 6 * n + 2)
    o = b.p + b.n
    o[0] = 34
    o += 1
    for k in range(n):
        c = d[k]
        if c == 34 or c == 92:
            o[0] = 92
            o[1] = c
            o += 2
        elif c >= 32:
            o[0] = c
            o += 1
        elif c == 10 or c == 13 or c == 9 or c == 8 or c == 12:
            o[0] = 92
            o[1] = (110 if c == 10 else 114 if c == 13 else 116 if c == 9
                    else 98 if c == 8 else 102)
            o += 2
        else:
            o[0] = 92
            o[1] = 117
            o[2] = 48
            o[3] = 48
            o[4] = _HEX[c >> 4]
            o[5] = _HEX[c & 15]
            o += 6
    o[0] = 34
    o += 1
    b.n = o - b.p
    return 0


cdef int _human(Buf* b, const unsigned char* d, Py_ssize_t size) except -1:
    cdef unsigned char kind = d[1], subtype = d[2]
    cdef Py_ssize_t k, k2, count, width, p, start, isize, shown
    cdef uint32_t t
    cdef object text
    if kind == 1:
        _puts(b, b"ping response" if subtype else b"ping request")
        return 0
    if kind == 0:
        _puts(b, b"error ")
        _put_str(b, _CODE_NAMES[subtype])
        _puts(b, b" (")
        _putu(b, subtype)
        _puts(b, b")")
        return 0
    cdef unsigned n_input = d[8], n_output = d[9]
    cdef unsigned batch = (d[10] << 8) | d[11]
    _puts(b, b"inference response  n_input=" if subtype else b"inference request  n_input=")
    _putu(b, n_input)
    _puts(b, b" n_output=")
    _putu(b, n_output)
    _puts(b, b" batch_size=")
    _putu(b, batch)
    _puts(b, b"  (")
    _putu(b, size)
    _puts(b, b" bytes)")
    width = n_output if subtype else n_input
    count = batch * width
    p = 12
    for k in range(count):
        t = _u32(d + p)
        isize = _u32(d + p + 4)
        p += 8
        _puts(b, b"\n    ")
        start = b.n
        _puts(b, b"[")
        _putu(b, k // width)
        _puts(b, b"][")
        _putu(b, k % width)
        _puts(b, b"]")
        _pad(b, b.n - start, 9)
        _puts(b, b" ")
        _type_name(b, t, True)
        _puts(b, b" ")
        start = b.n
        _putu(b, isize)
        if b.n - start < 7:  # right-justify in 7 columns
            shown = 7 - (b.n - start)
            _grow(b, shown)
            memcpy(b.p + start + shown, b.p + start, b.n - start)
            for k2 in range(shown):
                b.p[start + k2] = 32
            b.n += shown
        _puts(b, b" B  ")
        text = None
        shown = isize if isize < TEXT_PREVIEW else TEXT_PREVIEW
        if (t == 1 or t == 2) and _ascii(d + p, shown):
            _repr_ascii(b, d + p, shown)
            if isize > TEXT_PREVIEW:
                _puts(b, b"...")
            p += isize
            continue
        if t == 1 or t == 2:
            text = _text(d + p, shown)
        if text is not None:
            _put_str(b, repr(text))
            if isize > TEXT_PREVIEW:
                _puts(b, b"...")
        else:
            _hex(b, d + p, isize if isize < PREVIEW else PREVIEW, True)
            if isize > PREVIEW:
                _puts(b, b" ...")
        p += isize
    return 0


cdef int _json(Buf* b, const unsigned char* d, Py_ssize_t size) except -1:
    cdef unsigned char kind = d[1], subtype = d[2]
    cdef Py_ssize_t k, count, p, isize
    cdef uint32_t t
    cdef object text
    if kind == 1:
        _puts(b, b'"kind":"ping","response":true,"size":8' if subtype
              else b'"kind":"ping","response":false,"size":8')
        return 0
    if kind == 0:
        _puts(b, b'"kind":"error","code":')
        _putu(b, subtype)
        _puts(b, b',"code_name":"')
        _put_str(b, _CODE_NAMES[subtype])
        _puts(b, b'","size":8')
        return 0
    cdef unsigned n_input = d[8], n_output = d[9]
    cdef unsigned batch = (d[10] << 8) | d[11]
    _puts(b, b'"kind":"inference","response":true,"n_input":' if subtype
          else b'"kind":"inference","response":false,"n_input":')
    _putu(b, n_input)
    _puts(b, b',"n_output":')
    _putu(b, n_output)
    _puts(b, b',"batch_size":')
    _putu(b, batch)
    _puts(b, b',"size":')
    _putu(b, size)
    _puts(b, b',"items":[')
    count = batch * (n_output if subtype else n_input)
    p = 12
    for k in range(count):
        t = _u32(d + p)
        isize = _u32(d + p + 4)
        p += 8
        _puts(b, b'{"type":' if k == 0 else b',{"type":')
        _putu(b, t)
        _puts(b, b',"type_name":"')
        _type_name(b, t, False)
        _puts(b, b'","size":')
        _putu(b, isize)
        _puts(b, b',"data_hex":"')
        _hex(b, d + p, isize, False)
        _puts(b, b'"')
        if (t == 1 or t == 2) and _ascii(d + p, isize):
            _puts(b, b',"text":')
            _json_ascii(b, d + p, isize)
        elif t == 1 or t == 2:
            text = _text(d + p, isize)
            if text is not None:
                _puts(b, b',"text":')
                _put_str(b, _json_str(text))
        _puts(b, b"}")
        p += isize
    _puts(b, b"]")
    return 0


def format_run(bytes buf, Py_ssize_t pos, Py_ssize_t stop, Py_ssize_t base, bint as_json):
    """See ``wirekit.mip.dump.format_run_pure``: ``(text, pos, count)``."""
    cdef const unsigned char* d = <const unsigned char*>PyBytes_AS_STRING(buf)
    cdef Py_ssize_t end, count = 0
    cdef Buf b
    if stop > PyBytes_GET_SIZE(buf) or pos < 0:
        raise IndexError("run outside the buffer")
    b.p = NULL
    b.n = 0
    b.cap = 0
    # About the output's size up front (JSON: hex doubles the data), so few reallocations.
    _grow(&b, (stop - pos) * (3 if as_json else 1) // (1 if as_json else 2) + 4096)
    try:
        while stop - pos >= 8:
            end = pos + 8 + <Py_ssize_t>_u32(d + pos + 4)
            if end > stop:
                break
            try:
                _decode_prefix(buf, pos)  # the codec says whether it is well-formed
            except DecodeError:
                break
            if count:
                _put(&b, b"\n", 1)
            if as_json:
                _puts(&b, b'{"offset":')
                _putu(&b, base + pos)
                _puts(&b, b",")
                _json(&b, d + pos, end - pos)
                _puts(&b, b"}")
            else:
                _puts(&b, b"@")
                _putu(&b, base + pos)
                _puts(&b, b" ")
                _human(&b, d + pos, end - pos)
            count += 1
            pos = end
        text = PyBytes_FromStringAndSize(b.p, b.n)
    finally:
        PyMem_Free(b.p)
    return text, pos, count
