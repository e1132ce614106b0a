# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Cython twin of ``wirekit.y2._pure``: same functions, same results, same errors.

The kernels run on NumPy arrays with the GIL released.  Argument checks that do not scan
arrays (types, shapes, tau) and the texts of value errors come from ``wirekit.y2._checks``,
shared with the pure path, so both raise identical exceptions.
"""

import sys

import numpy as np

cimport numpy as cnp
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdint cimport int8_t, int16_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

from wirekit.errors import DecodeError, EncodeError
from wirekit.y2 import _checks, _pure
from wirekit.y2.messages import Delta, Finished, NodeIndex, Runtime

cnp.import_array()

cdef extern from *:
    """
    /* The hot loops of pack and compress, in plain C so that the compiler vectorizes them
       (SSE2 is enough).  y2_buf is a growable word buffer owned by the caller. */
    #include <stdint.h>
    #include <stddef.h>
    #include <stdlib.h>
    #include <string.h>

    typedef struct { uint32_t *p; ptrdiff_t n; ptrdiff_t cap; } y2_buf;

    static int y2_push(y2_buf *b, uint32_t w) {
        if (b->n == b->cap) {
            ptrdiff_t cap = b->cap ? 2 * b->cap : 1024;
            uint32_t *grown = (uint32_t *)realloc(b->p, (size_t)cap * sizeof(uint32_t));
            if (!grown) return -1;
            b->p = grown;
            b->cap = cap;
        }
        b->p[b->n++] = w;
        return 0;
    }

    static int y2_reserve(y2_buf *b, ptrdiff_t more) {
        ptrdiff_t cap = b->cap ? b->cap : 1024;
        uint32_t *grown;
        if (b->n + more <= b->cap) return 0;
        while (cap < b->n + more) cap *= 2;
        grown = (uint32_t *)realloc(b->p, (size_t)cap * sizeof(uint32_t));
        if (!grown) return -1;
        b->p = grown;
        b->cap = cap;
        return 0;
    }

    #if defined(__GNUC__) || defined(__clang__)
    #define Y2_CTZ(m) __builtin_ctz(m)
    #else
    static int y2_ctz(uint32_t m) { int n = 0; while (!(m & 1u)) { m >>= 1; n++; } return n; }
    #define Y2_CTZ(m) y2_ctz(m)
    #endif

    /* Quantize the element *q (flat index k): emit its word if |v| >= t. */
    #define Y2_QUANT(T, q, k)                                                          \
        do {                                                                           \
            T v_ = *(q);                                                               \
            if (v_ >= t) {                                                             \
                *(q) = v_ - t;                                                         \
                if (y2_push(b, base | ((uint32_t)(k) << 1))) return -1;                \
            } else if (v_ <= -t) {                                                     \
                *(q) = v_ + t;                                                         \
                if (y2_push(b, base | ((uint32_t)(k) << 1) | 1u)) return -1;           \
            }                                                                          \
        } while (0)

    /* Visit the hits of a block: bit j of m set means |p[i + j]| >= t. */
    #define Y2_VISIT(T, p, i, m)                                                       \
        do {                                                                           \
            uint32_t m_ = (m);                                                         \
            ptrdiff_t k_;                                                              \
            T v_;                                                                      \
            int neg_;                                                                  \
            while (m_) {                                                               \
                k_ = (i) + Y2_CTZ(m_);                                                 \
                m_ &= m_ - 1;                                                          \
                v_ = (p)[k_];                                                          \
                neg_ = v_ < 0;                                                         \
                (p)[k_] = neg_ ? v_ + t : v_ - t;                                      \
                b->p[b->n++] = base | ((uint32_t)k_ << 1) | (uint32_t)neg_;            \
            }                                                                          \
        } while (0)

    #if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
    #include <emmintrin.h>
    #define Y2_SSE2 1
    #endif

    /* Contiguous arrays: 16 elements at a time, a 16-bit mask of |v| >= t (SSE2 on x86-64;
       elsewhere the scalar loop below does all the work). */
    static int y2_compress_f32(char *data, ptrdiff_t stride, ptrdiff_t start, ptrdiff_t stop,
                               float t, uint32_t base, y2_buf *b) {
        ptrdiff_t i = start;
    #ifdef Y2_SSE2
        if (stride == (ptrdiff_t)sizeof(float)) {
            float *p = (float *)data;
            const __m128 vt = _mm_set1_ps(t);
            const __m128 abs = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
            uint32_t m;
            for (; i + 16 <= stop; i += 16) {
                m = (uint32_t)_mm_movemask_ps(_mm_cmpge_ps(_mm_and_ps(_mm_loadu_ps(p + i), abs), vt))
                  | (uint32_t)_mm_movemask_ps(_mm_cmpge_ps(_mm_and_ps(_mm_loadu_ps(p + i + 4), abs), vt)) << 4
                  | (uint32_t)_mm_movemask_ps(_mm_cmpge_ps(_mm_and_ps(_mm_loadu_ps(p + i + 8), abs), vt)) << 8
                  | (uint32_t)_mm_movemask_ps(_mm_cmpge_ps(_mm_and_ps(_mm_loadu_ps(p + i + 12), abs), vt)) << 12;
                if (m) {
                    if (y2_reserve(b, 16)) return -1;
                    Y2_VISIT(float, p, i, m);
                }
            }
        }
    #endif
        for (; i < stop; i++) Y2_QUANT(float, (float *)(data + i * stride), i);
        return 0;
    }

    static int y2_compress_f64(char *data, ptrdiff_t stride, ptrdiff_t start, ptrdiff_t stop,
                               double t, uint32_t base, y2_buf *b) {
        ptrdiff_t i = start;
    #ifdef Y2_SSE2
        if (stride == (ptrdiff_t)sizeof(double)) {
            double *p = (double *)data;
            const __m128d vt = _mm_set1_pd(t);
            const __m128d abs = _mm_castsi128_pd(_mm_set1_epi64x(0x7fffffffffffffffLL));
            uint32_t m;
            int q;
            for (; i + 16 <= stop; i += 16) {
                m = 0;
                for (q = 0; q < 8; q++)
                    m |= (uint32_t)_mm_movemask_pd(
                        _mm_cmpge_pd(_mm_and_pd(_mm_loadu_pd(p + i + 2 * q), abs), vt)) << (2 * q);
                if (m) {
                    if (y2_reserve(b, 16)) return -1;
                    Y2_VISIT(double, p, i, m);
                }
            }
        }
    #endif
        for (; i < stop; i++) Y2_QUANT(double, (double *)(data + i * stride), i);
        return 0;
    }

    static int y2_compress_f80(char *data, ptrdiff_t stride, ptrdiff_t start, ptrdiff_t stop,
                               long double t, uint32_t base, y2_buf *b) {
        ptrdiff_t i;
        for (i = start; i < stop; i++) Y2_QUANT(long double, (long double *)(data + i * stride), i);
        return 0;
    }

    #if defined(_MSC_VER)
    #define Y2_RESTRICT __restrict
    #else
    #define Y2_RESTRICT restrict
    #endif

    /* unpack: contiguous native words into the four field arrays (vectorized). */
    static void y2_unpack(const uint32_t *Y2_RESTRICT w, ptrdiff_t n,
                          uint16_t *Y2_RESTRICT layer, uint8_t *Y2_RESTRICT is_weight,
                          uint32_t *Y2_RESTRICT index, uint8_t *Y2_RESTRICT sign) {
        ptrdiff_t i;
        uint32_t x;
        for (i = 0; i < n; i++) {
            x = w[i];
            layer[i] = (uint16_t)(x >> 23);
            is_weight[i] = (uint8_t)((x >> 22) & 1u);
            index[i] = (x >> 1) & 0x1FFFFFu;
            sign[i] = (uint8_t)(x & 1u);
        }
    }

    /* Copy n 32-bit words reversing each one's bytes (big-endian <-> little-endian).
       Written byte by byte on purpose: compilers vectorize this form with SSE2, while a
       32-bit bswap expression becomes one scalar instruction per word. */
    static void y2_swap_copy(const char *Y2_RESTRICT src, char *Y2_RESTRICT dst, ptrdiff_t n) {
        ptrdiff_t i;
        for (i = 0; i < 4 * n; i += 4) {
            dst[i] = src[i + 3];
            dst[i + 1] = src[i + 2];
            dst[i + 2] = src[i + 1];
            dst[i + 3] = src[i];
        }
    }

    /* pack: write (first) or OR one field into o[i0:i1]; nonzero if a value needs more
       than `bits` bits (negative values convert to huge unsigned ones). */
    #define Y2_FIELD(NAME, T, U)                                                       \
        static int NAME(const char *data, ptrdiff_t stride, ptrdiff_t i0, ptrdiff_t i1,  \
                        uint32_t *o, int shift, int bits, int first) {                 \
            U acc = 0, v;                                                              \
            ptrdiff_t i;                                                               \
            if (stride == (ptrdiff_t)sizeof(T)) {                                      \
                const T *p = (const T *)data;                                          \
                if (first)                                                             \
                    for (i = i0; i < i1; i++) {                                        \
                        v = (U)p[i]; acc |= v >> bits; o[i] = (uint32_t)v << shift;    \
                    }                                                                  \
                else                                                                   \
                    for (i = i0; i < i1; i++) {                                        \
                        v = (U)p[i]; acc |= v >> bits; o[i] |= (uint32_t)v << shift;   \
                    }                                                                  \
            } else {                                                                   \
                for (i = i0; i < i1; i++) {                                            \
                    v = (U)*(const T *)(data + i * stride);                            \
                    acc |= v >> bits;                                                  \
                    if (first) o[i] = (uint32_t)v << shift;                            \
                    else o[i] |= (uint32_t)v << shift;                                 \
                }                                                                      \
            }                                                                          \
            return acc != 0;                                                           \
        }

    Y2_FIELD(y2_field_i8, int8_t, uint32_t)
    Y2_FIELD(y2_field_i16, int16_t, uint32_t)
    Y2_FIELD(y2_field_i32, int32_t, uint32_t)
    Y2_FIELD(y2_field_i64, int64_t, uint64_t)
    Y2_FIELD(y2_field_u8, uint8_t, uint32_t)
    Y2_FIELD(y2_field_u16, uint16_t, uint32_t)
    Y2_FIELD(y2_field_u32, uint32_t, uint32_t)
    Y2_FIELD(y2_field_u64, uint64_t, uint64_t)

    static int y2_field(int code, const char *data, ptrdiff_t stride, ptrdiff_t i0,
                        ptrdiff_t i1, uint32_t *o, int shift, int bits, int first) {
        switch (code) {
        case 0: return y2_field_i8(data, stride, i0, i1, o, shift, bits, first);
        case 1: return y2_field_i16(data, stride, i0, i1, o, shift, bits, first);
        case 2: return y2_field_i32(data, stride, i0, i1, o, shift, bits, first);
        case 3: return y2_field_i64(data, stride, i0, i1, o, shift, bits, first);
        case 4: return y2_field_u8(data, stride, i0, i1, o, shift, bits, first);
        case 5: return y2_field_u16(data, stride, i0, i1, o, shift, bits, first);
        case 6: return y2_field_u32(data, stride, i0, i1, o, shift, bits, first);
        default: return y2_field_u64(data, stride, i0, i1, o, shift, bits, first);
        }
    }
    """
    ctypedef struct y2_buf:
        uint32_t* p
        Py_ssize_t n
        Py_ssize_t cap
    int y2_compress_f32(char*, Py_ssize_t, Py_ssize_t, Py_ssize_t, float, uint32_t,
                        y2_buf*) noexcept nogil
    int y2_compress_f64(char*, Py_ssize_t, Py_ssize_t, Py_ssize_t, double, uint32_t,
                        y2_buf*) noexcept nogil
    int y2_compress_f80(char*, Py_ssize_t, Py_ssize_t, Py_ssize_t, long double, uint32_t,
                        y2_buf*) noexcept nogil
    void y2_swap_copy(const char*, char*, Py_ssize_t) noexcept nogil
    void y2_unpack(const uint32_t*, Py_ssize_t, uint16_t*, uint8_t*, uint32_t*,
                   uint8_t*) noexcept nogil
    int y2_field(int, const char*, Py_ssize_t, Py_ssize_t, Py_ssize_t, uint32_t*, int, int,
                 int) noexcept nogil


DEF HANDSHAKE_SIZE = 8
DEF INDEX_MASK = 0x1FFFFF
DEF I32_MAX = 0x7FFFFFFF

cdef bint _LITTLE = sys.byteorder == "little"
cdef object _U32 = np.dtype(np.uint32)
cdef object _F32 = np.dtype(np.float32)
cdef object _F64 = np.dtype(np.float64)
cdef object _F128 = np.dtype(np.longdouble)
cdef tuple _PACK_TOPS = tuple(top for _name, top in _checks.PACK_FIELDS)


# --- byte order -----------------------------------------------------------------------------


cdef inline uint32_t _bswap(uint32_t x) noexcept nogil:
    return ((x >> 24) & 0xFF) | ((x >> 8) & 0xFF00) | ((x << 8) & 0xFF0000) | (x << 24)


cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline void _put32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v >> 24
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


cdef inline int32_t _bei32(const uint8_t* p) noexcept nogil:
    return <int32_t>_be32(p)


cdef tuple _words(object words):
    """``(native-dtype uint32 array over the same memory, byte-swapped?)``."""
    cdef object arr = _checks.word_array(words)
    if arr.dtype.isnative:
        return arr, False
    return arr.view(_U32), True


# --- messages -------------------------------------------------------------------------------


cdef object _fail(str field, Py_ssize_t offset, str text):
    return DecodeError("y2", field, offset, text)


cdef int32_t _check_handshake(const uint8_t* base, Py_ssize_t size, Py_ssize_t pos,
                              int* kind_out) except? -1:
    cdef Py_ssize_t have = size - pos
    if have < HANDSHAKE_SIZE:
        raise _fail("handshake", size, f"truncated: need {HANDSHAKE_SIZE} bytes, have {have}")
    cdef int32_t kind = _bei32(base + pos), n = _bei32(base + pos + 4)
    if kind < 0 or kind > 3:
        raise _fail("type", pos, f"unknown message type {kind} (0..3)")
    if n < 0:
        raise _fail("size", pos + 4, f"negative payload size {n}")
    if kind == 0 and n != 8:
        raise _fail("size", pos + 4, f"a node_index payload is 8 bytes, got {n}")
    if kind == 2 and n != 16 and n != 20:
        raise _fail("size", pos + 4, f"a runtime payload is 16 or 20 bytes, got {n}")
    if kind == 3 and n != 0:
        raise _fail("size", pos + 4, f"a finished message has no payload, got {n} bytes")
    if kind == 1 and n % 4:
        raise _fail("size", pos + 4, f"a delta payload is whole 4-byte words, got {n} bytes")
    kind_out[0] = kind
    return n


def check_handshake(buf, Py_ssize_t pos=0):
    """Validate the handshake at ``pos``; return ``(type, size)``."""
    cdef Py_buffer view
    cdef int kind = 0
    cdef int32_t n
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        n = _check_handshake(<const uint8_t*>view.buf, view.len, pos, &kind)
    finally:
        PyBuffer_Release(&view)
    return kind, n


cdef object _words_from_be(object buf, Py_ssize_t offset, Py_ssize_t count):
    """Native uint32 copies of ``count`` big-endian words at ``buf[offset:]``.

    NumPy's byte-swapping cast is used: it picks the best SIMD instructions of the CPU at
    run time, which a portable build of this module cannot (measured faster than a loop here).
    """
    return np.frombuffer(buf, dtype=">u4", count=count, offset=offset).astype(_U32)


cdef object _decode_at(object buf, const uint8_t* base, Py_ssize_t size, Py_ssize_t pos,
                       Py_ssize_t* end_out):
    cdef int kind = 0
    cdef int32_t n, node_id, count
    cdef Py_ssize_t start, end
    if pos < 0 or pos > size:
        raise IndexError(f"position {pos} outside a buffer of {size} bytes")
    n = _check_handshake(base, size, pos, &kind)
    start = pos + HANDSHAKE_SIZE
    end = start + n
    if end > size:
        raise _fail(
            "payload", size,
            f"truncated: handshake announces {n} bytes, {size - start} present",
        )
    end_out[0] = end
    cdef const uint8_t* p = base + start
    if kind == 0:
        node_id = _bei32(p)
        count = _bei32(p + 4)
        if count < 1:
            raise _fail("node_count", start + 4, f"must be >= 1, got {count}")
        if node_id < 0 or node_id >= count:
            raise _fail("node_id", start, f"must be in 0..{count - 1}, got {node_id}")
        return NodeIndex(node_id, count)
    if kind == 1:
        return Delta(_words_from_be(buf, start, n // 4))
    if kind == 2:
        return Runtime(
            _bei32(p), _bei32(p + 4), _bei32(p + 8), _bei32(p + 12),
            _bei32(p + 16) if n == 20 else None,
        )
    return Finished()


cdef object _decode(object buf, Py_ssize_t pos, bint whole):
    cdef Py_buffer view
    cdef Py_ssize_t end = 0, size
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        size = view.len
        msg = _decode_at(buf, <const uint8_t*>view.buf, size, pos, &end)
    finally:
        PyBuffer_Release(&view)
    if whole:
        if end != size:
            raise _fail("message", end, f"{size - end} bytes after the end of the message")
        return msg
    return msg, end


def decode_prefix(buf, Py_ssize_t pos=0):
    """Decode the message that starts at ``pos``; return it and the offset just past it."""
    return _decode(buf, pos, False)


def decode(buf):
    """Decode exactly one complete message; trailing bytes are an error."""
    return _decode(buf, 0, True)


cdef int32_t _i32(object value, str field) except? -1:
    if type(value) is not int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise EncodeError("y2", field, f"expected an int, got {type(value).__name__}")
    if not -2**31 <= value <= I32_MAX:
        raise EncodeError("y2", field, f"{value} is out of range {-2**31}..{I32_MAX}")
    return <int32_t>value


cdef bytes _message(int kind, tuple fields):
    cdef Py_ssize_t k, n = len(fields)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, HANDSHAKE_SIZE + 4 * n)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    _put32(o, kind)
    _put32(o + 4, 4 * n)
    for k in range(n):
        _put32(o + HANDSHAKE_SIZE + 4 * k, <uint32_t><int32_t>fields[k])
    return out


def encode(msg):
    """Encode one message (handshake and payload) to bytes."""
    cdef int32_t node_id, count
    cdef bint swap
    cls = type(msg)
    if cls is Delta:
        arr, swap = _words(msg.words)
        if len(arr) > _pure.MAX_DELTA_WORDS:
            raise EncodeError("y2", "words", f"{len(arr)} words do not fit an i32 payload size")
        return _to_wire(arr, swap, True)
    if cls is NodeIndex:
        node_id = _i32(msg.node_id, "node_id")
        count = _i32(msg.node_count, "node_count")
        if count < 1:
            raise EncodeError("y2", "node_count", f"must be >= 1, got {count}")
        if node_id < 0 or node_id >= count:
            raise EncodeError("y2", "node_id", f"must be in 0..{count - 1}, got {node_id}")
        return _message(0, (node_id, count))
    if cls is Runtime:
        fields = (
            _i32(msg.sample_count, "sample_count"),
            _i32(msg.decompression_ms, "decompression_ms"),
            _i32(msg.training_ms, "training_ms"),
            _i32(msg.compression_ms, "compression_ms"),
        )
        if msg.loss_milli is not None:
            fields += (_i32(msg.loss_milli, "loss_milli"),)
        return _message(2, fields)
    if cls is Finished:
        return _message(3, ())
    for known in (Delta, NodeIndex, Runtime, Finished):  # subclasses
        if isinstance(msg, known):
            return encode(known(*[getattr(msg, f) for f in known.__slots__]))
    raise EncodeError("y2", "message", f"not a y2 message: {cls.__name__}")


# --- pack / unpack / wire -------------------------------------------------------------------


cdef struct Field:
    const char* data
    Py_ssize_t stride  # bytes
    int code  # dtype: 0..3 int8..int64, 4..7 uint8..uint64
    int shift
    int bits


cdef dict _INT_CODES = {
    (kind, size): code
    for code, (kind, size) in enumerate(
        [("i", 1), ("i", 2), ("i", 4), ("i", 8), ("u", 1), ("u", 2), ("u", 4), ("u", 8)]
    )
}

DEF PACK_BLOCK = 2048


def pack(layer, is_weight, index, sign):
    """Four equal-length integer arrays -> native uint32 delta words."""
    arrays = _checks.pack_arrays(layer, is_weight, index, sign)
    cdef Py_ssize_t n = len(arrays[0]), i0, i1
    cdef cnp.ndarray out = np.empty(n, dtype=_U32)
    if n == 0:
        return out
    cdef Field fields[4]
    cdef int k, bad = 0
    cdef uint32_t* o = <uint32_t*>cnp.PyArray_DATA(out)
    held = []
    for k in range(4):
        a = arrays[k]
        held.append(a)
        fields[k].data = <const char*>cnp.PyArray_DATA(a)
        fields[k].stride = a.strides[0]
        fields[k].code = _INT_CODES[a.dtype.kind, a.itemsize]
        fields[k].shift = (23, 22, 1, 0)[k]
        fields[k].bits = (9, 1, 21, 1)[k]
    with nogil:
        # Block by block, so that the block of output stays in L1 for all four fields.
        i0 = 0
        while i0 < n and not bad:
            i1 = min(i0 + PACK_BLOCK, n)
            for k in range(4):
                bad |= y2_field(fields[k].code, fields[k].data, fields[k].stride, i0, i1, o,
                                fields[k].shift, fields[k].bits, k == 0)
            i0 = i1
    if bad:
        _checks.check_pack_values(arrays)  # finds the first bad position and raises
    return out


def unpack(words):
    """Delta words -> ``(layer uint16, is_weight bool, index uint32, sign uint8)``."""
    cdef bint swap
    arr, swap = _words(words)
    cdef const uint32_t[:] w = arr
    cdef Py_ssize_t i, n = w.shape[0]
    layer = np.empty(n, dtype=np.uint16)
    is_weight = np.empty(n, dtype=np.bool_)
    index = np.empty(n, dtype=np.uint32)
    sign = np.empty(n, dtype=np.uint8)
    cdef uint16_t[::1] lv = layer
    cdef uint8_t[::1] wv = is_weight.view(np.uint8)
    cdef uint32_t[::1] iv = index
    cdef uint8_t[::1] sv = sign
    cdef uint16_t* lp = &lv[0] if n else NULL
    cdef uint8_t* wp = &wv[0] if n else NULL
    cdef uint32_t* ip = &iv[0] if n else NULL
    cdef uint8_t* sp = &sv[0] if n else NULL
    cdef const uint32_t* src
    cdef uint32_t x
    with nogil:
        if n and w.strides[0] == 4 and not swap:
            y2_unpack(&w[0], n, lp, wp, ip, sp)
        elif n and w.strides[0] == 4:
            src = &w[0]
            for i in range(n):
                x = _bswap(src[i])
                lp[i] = x >> 23
                wp[i] = (x >> 22) & 1
                ip[i] = (x >> 1) & INDEX_MASK
                sp[i] = x & 1
        else:
            for i in range(n):
                x = _bswap(w[i]) if swap else w[i]
                lp[i] = x >> 23
                wp[i] = (x >> 22) & 1
                ip[i] = (x >> 1) & INDEX_MASK
                sp[i] = x & 1
    return layer, is_weight, index, sign


cdef bytes _to_wire(object arr, bint swap, bint message):
    """The big-endian bytes of ``arr`` (its memory byte-swapped if ``swap``); with
    ``message``, preceded by a Delta handshake."""
    cdef const uint32_t[:] w = arr
    cdef Py_ssize_t i, n = w.shape[0], head = HANDSHAKE_SIZE if message else 0
    cdef bytes out = PyBytes_FromStringAndSize(NULL, head + 4 * n)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    cdef uint32_t x
    cdef bint flip = swap != _LITTLE  # stored order differs from big-endian
    if message:
        _put32(o, 1)
        _put32(o + 4, <uint32_t>(4 * n))
    o += head
    with nogil:
        if not flip and w.strides[0] == 4 and n:
            memcpy(o, &w[0], 4 * n)
        elif w.strides[0] == 4 and n:
            y2_swap_copy(<const char*>&w[0], <char*>o, n)
        else:
            for i in range(n):
                x = w[i]
                _put32(o + 4 * i, _bswap(x) if swap else x)
    return out


def to_wire(words):
    """Delta words -> their big-endian bytes (a Delta message's payload)."""
    arr, swap = _words(words)
    return _to_wire(arr, swap, False)


def from_wire(buf, *, copy=True):
    """Big-endian bytes -> delta words (``copy=False``: a zero-copy ``>u4`` view)."""
    cdef Py_buffer view
    cdef object out
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if view.len % 4:
            raise _checks.wire_size_error(view.len)
        if copy:
            return _words_from_be(buf, 0, view.len // 4)
    finally:
        PyBuffer_Release(&view)
    return _pure.from_wire(buf, copy=False)


# --- apply ----------------------------------------------------------------------------------


cdef struct Target:
    char* data
    Py_ssize_t stride  # bytes
    int kind  # 0 float, 1 double, 2 long double, 3 handled by the NumPy path, 4 no array


cdef int _float_kind(object dtype):
    if dtype == _F32:
        return 0
    if dtype == _F64:
        return 1
    if dtype == _F128:
        return 2
    return 3


cdef tuple _flat(object arr):
    """A 1-D array over ``arr``'s memory (or a contiguous copy: then True)."""
    if arr.ndim == 1:
        return arr, False
    if arr.flags.c_contiguous:
        return arr.reshape(-1), False
    return np.ascontiguousarray(arr).reshape(-1), True


cdef Py_ssize_t _first_bad_word(const uint32_t[:] w, bint swap,
                                const int64_t* sizes) noexcept nogil:
    cdef Py_ssize_t i, n = w.shape[0]
    cdef uint32_t x
    for i in range(n):
        x = _bswap(w[i]) if swap else w[i]
        if <int64_t>((x >> 1) & INDEX_MASK) >= sizes[x >> 22]:
            return i
    return n


def apply(params, words, tau):
    """Add +tau or -tau to the parameter each word addresses, in place (all checked first)."""
    cdef bint swap
    layers = _checks.model(params, "params")
    cdef double t = _checks.tau_value(tau)
    arr, swap = _words(words)
    cdef const uint32_t[:] w = arr
    cdef Py_ssize_t i, n = w.shape[0], bad
    if n == 0:
        return
    cdef cnp.ndarray table = _checks.size_table(layers)
    cdef const int64_t* sizes = <const int64_t*>cnp.PyArray_DATA(table)
    with nogil:
        bad = _first_bad_word(w, swap, sizes)
    if bad < n:
        raise _checks.bad_word(bad, _bswap(w[bad]) if swap else w[bad], layers)

    cdef Target* targets = <Target*>malloc(1024 * sizeof(Target))
    if targets == NULL:
        raise MemoryError()
    cdef int key
    cdef uint32_t x
    cdef char* p
    cdef float tf = <float>t
    cdef long double tl = <long double>t
    cdef cnp.ndarray flat
    writeback = []
    slow = []
    try:
        for key in range(1024):
            targets[key].kind = 4
        for k, pair in enumerate(layers):
            for is_weight in (0, 1):
                a = pair[0 if is_weight else 1]
                key = 2 * k + is_weight
                kind = _float_kind(a.dtype)
                if kind == 3:
                    slow.append((key, a))
                    targets[key].kind = 3
                    continue
                flat, copied = _flat(a)
                if copied:
                    writeback.append((a, flat))
                targets[key].data = <char*>cnp.PyArray_DATA(flat)
                targets[key].stride = flat.strides[0]
                targets[key].kind = kind
        with nogil:
            for i in range(n):
                x = _bswap(w[i]) if swap else w[i]
                key = x >> 22
                p = targets[key].data + <Py_ssize_t>((x >> 1) & INDEX_MASK) * targets[key].stride
                if targets[key].kind == 0:
                    (<float*>p)[0] += -tf if x & 1 else tf
                elif targets[key].kind == 1:
                    (<double*>p)[0] += -t if x & 1 else t
                elif targets[key].kind == 2:
                    (<long double*>p)[0] += -tl if x & 1 else tl
    finally:
        free(targets)
    for a, flat in writeback:
        a[...] = flat.reshape(a.shape)
    if slow:  # float16 and byte-swapped float arrays: the NumPy path, per array, in order
        native = arr.byteswap() if swap else arr
        keys = native >> 22
        for key, a in slow:
            sel = keys == key
            _pure.apply_array(a, ((native[sel] >> 1) & INDEX_MASK).astype(np.int64),
                              (native[sel] & 1).astype(bool), t)


# --- compress -------------------------------------------------------------------------------


def _compress_chunk(object flat, Py_ssize_t start, Py_ssize_t stop, uint32_t base,
                    double tau, int kind):
    """Quantize ``flat[start:stop]`` (a 1-D array) in place, GIL released; its words."""
    cdef char* data = <char*>cnp.PyArray_DATA(flat)
    cdef Py_ssize_t stride = flat.strides[0]
    cdef int failed
    cdef y2_buf buf
    buf.p = NULL
    buf.n = 0
    buf.cap = 0
    with nogil:
        if kind == 0:
            failed = y2_compress_f32(data, stride, start, stop, <float>tau, base, &buf)
        elif kind == 1:
            failed = y2_compress_f64(data, stride, start, stop, tau, base, &buf)
        else:
            failed = y2_compress_f80(data, stride, start, stop, <long double>tau, base, &buf)
    try:
        if failed:
            raise MemoryError()
        out = np.empty(buf.n, dtype=_U32)
        if buf.n:
            memcpy(cnp.PyArray_DATA(out), buf.p, buf.n * sizeof(uint32_t))
        return out
    finally:
        free(buf.p)


#: Arrays are split into chunks of at least this many elements for the threaded path.
MIN_CHUNK = 1 << 18


def compress(residuals, tau, *, threads=1):
    """1-bit threshold quantization of a model's residuals, in place; the emitted words.

    ``threads > 1`` splits the arrays into chunks processed in that many threads (the GIL is
    released in each chunk); the output does not depend on ``threads``.
    """
    layers = _checks.model(residuals, "residuals")
    cdef double t = _checks.tau_value(tau)
    nthreads = _checks.threads_value(threads)
    _checks.check_compressible(layers, t)
    tasks = []
    writeback = []
    total = 0
    for k, (weights, biases) in enumerate(layers):
        for a, base in ((weights, (k << 23) | (1 << 22)), (biases, k << 23)):
            if a.size == 0:
                continue
            kind = _float_kind(a.dtype)
            if kind == 3:
                tasks.append((None, a, base, 0, 0, kind))
                continue
            flat, copied = _flat(a)
            if copied:
                writeback.append((a, flat))
            tasks.append((_compress_chunk, flat, base, 0, a.size, kind))
            total += a.size
    if nthreads > 1 and total > MIN_CHUNK:
        chunk = max(MIN_CHUNK, -(-total // (4 * nthreads)))
        split = []
        for fn, a, base, start, stop, kind in tasks:
            if fn is None:
                split.append((fn, a, base, start, stop, kind))
                continue
            for s in range(start, stop, chunk):
                split.append((fn, a, base, s, min(s + chunk, stop), kind))
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(nthreads) as pool:
            parts = list(pool.map(lambda task: _run(task, t), split))
    else:
        parts = [_run(task, t) for task in tasks]
    for a, flat in writeback:
        a[...] = flat.reshape(a.shape)
    if not parts:
        return np.zeros(0, dtype=_U32)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


cdef object _run(tuple task, double tau):
    fn, a, base, start, stop, kind = task
    if fn is None:
        return _pure.compress_array(a, base, tau)
    return fn(a, start, stop, base, tau, kind)
