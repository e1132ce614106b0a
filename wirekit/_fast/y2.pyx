# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Cython twin of ``wirekit.y2._pure``: same functions, same results, same errors.

The kernels run on NumPy arrays with the GIL released.  Argument checks that do not scan
arrays (types, shapes, tau) and the texts of value errors come from ``wirekit.y2._checks``,
shared with the pure path, so both raise identical exceptions.
"""

import atexit
import sys

import numpy as np

cimport numpy as cnp
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.pycapsule cimport PyCapsule_Destructor, PyCapsule_GetPointer, PyCapsule_New
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdint cimport int8_t, int16_t
from libc.float cimport DBL_MAX, FLT_MAX
from libc.stdlib cimport calloc, free, malloc, realloc
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

    /* Quantize the element *q (flat index k): emit its word if |v| >= t; the element
       moves toward zero by t, then by r (the rest of the hook's tau; r = 0: exactly by t,
       x - (+0) and x + (+0) being x for every x that t can leave). */
    #define Y2_QUANT(T, q, k)                                                          \
        do {                                                                           \
            T v_ = *(q);                                                               \
            if (v_ >= t) {                                                             \
                *(q) = (v_ - t) - r;                                                   \
                if (y2_push(b, base | ((uint32_t)(k) << 1) | 1u)) return -1;           \
            } else if (v_ <= -t) {                                                     \
                *(q) = (v_ + t) + r;                                                   \
                if (y2_push(b, base | ((uint32_t)(k) << 1))) return -1;                \
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
                (p)[k_] = neg_ ? (v_ + t) + r : (v_ - t) - r;                          \
                b->p[b->n++] = base | ((uint32_t)k_ << 1) | (uint32_t)!neg_;           \
            }                                                                          \
        } while (0)

    #if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
    #include <emmintrin.h>
    #define Y2_SSE2 1
    #endif

    /* AVX2 (x86 with GCC or Clang, chosen at run time; other builds keep the SSE2 loops).
       A block of elements is scanned without a branch per hit: each 8-lane vector gives an
       8-bit hit mask, the 8 candidate words are left-packed by a lane shuffle from y2_lut
       and stored whole at the end of the buffer, which then advances by the popcount.  The
       block's hits are then subtracted by walking its words (the block is still in L1). */
    #if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    #include <immintrin.h>
    #define Y2_AVX2 1
    #define Y2_TARGET __attribute__((target("avx2,popcnt")))
    #endif

    static int y2_avx2 = 0;
    static uint8_t y2_lut[256][8];

    static int y2_init(void) {
        int m, j, n;
        for (m = 0; m < 256; m++) {
            for (j = 0, n = 0; j < 8; j++)
                if (m >> j & 1) y2_lut[m][n++] = (uint8_t)j;
            for (; n < 8; n++) y2_lut[m][n] = 0;
        }
    #ifdef Y2_AVX2
        __builtin_cpu_init();
        y2_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
    #endif
        return y2_avx2;
    }

    /* 1: use AVX2 where the CPU has it, 0: never (tests of the fallback); the old setting. */
    static int y2_set_avx2(int on) {
        int old = y2_avx2;
        y2_avx2 = 0;
    #ifdef Y2_AVX2
        y2_avx2 = on && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
    #endif
        return old;
    }

    #define Y2_BLOCK 2048
    /* Prefetch a few KB ahead of the scan, one line per 64 bytes: measured about 30 % faster
       than the hardware prefetcher alone on the 40 MB benchmark model (AMD Zen 3). */
    #define Y2_PREFETCH(q) _mm_prefetch((const char *)(q) + 6144, _MM_HINT_T0)

    #ifdef Y2_AVX2
    /* Left-pack the lanes of w selected by the 8-bit mask m to o; their count. */
    #define Y2_EMIT(o, w, m)                                                           \
        (_mm256_storeu_si256((__m256i *)(o), _mm256_permutevar8x32_epi32((w),         \
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)y2_lut[m])))),        \
         __builtin_popcount(m))

    /* Whole vectors of p[i:stop]; returns where it stopped (-1: out of memory). */
    Y2_TARGET static ptrdiff_t y2_avx2_f32(float *p, ptrdiff_t i, ptrdiff_t stop, float t,
                                           float r, uint32_t base, y2_buf *b) {
        const __m256 vt = _mm256_set1_ps(t);
        const __m256 mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        const __m256i step = _mm256_set1_epi32(32);
        const __m256i lanes = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
        const float tab[2] = {t, -t};  /* indexed by bit 0: 1 (+tau) moves the residual by -t */
        const float rtab[2] = {r, -r};  /* then by -r */
        ptrdiff_t end, n, j, j_;
        uint32_t *o, x;
        __m256 v0, v1;
        __m256i w0, w1;
        unsigned m0, m1;
        while (stop - i >= 16) {
            end = stop - i > Y2_BLOCK ? i + Y2_BLOCK : stop - ((stop - i) & 15);
            if (y2_reserve(b, end - i + 16)) return -1;
            o = b->p;
            n = b->n;
            w0 = _mm256_add_epi32(_mm256_set1_epi32((int)(base + ((uint32_t)i << 1) + 1u)), lanes);
            w1 = _mm256_add_epi32(w0, _mm256_set1_epi32(16));
            for (; i < end; i += 16) {
                Y2_PREFETCH(p + i);
                v0 = _mm256_loadu_ps(p + i);
                v1 = _mm256_loadu_ps(p + i + 8);
                m0 = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v0, mag), vt, _CMP_GE_OQ));
                m1 = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v1, mag), vt, _CMP_GE_OQ));
                n += Y2_EMIT(o + n, _mm256_xor_si256(w0, _mm256_srli_epi32(_mm256_castps_si256(v0), 31)), m0);
                n += Y2_EMIT(o + n, _mm256_xor_si256(w1, _mm256_srli_epi32(_mm256_castps_si256(v1), 31)), m1);
                w0 = _mm256_add_epi32(w0, step);
                w1 = _mm256_add_epi32(w1, step);
            }
            for (j = b->n; j < n; j++) {
                x = o[j];
                j_ = (x >> 1) & 0x1FFFFFu;
                p[j_] = (p[j_] + tab[x & 1u]) + rtab[x & 1u];
            }
            b->n = n;
        }
        return i;
    }

    /* The same for doubles: 8 elements (two vectors) per mask; signs from movemask. */
    Y2_TARGET static ptrdiff_t y2_avx2_f64(double *p, ptrdiff_t i, ptrdiff_t stop, double t,
                                           double r, uint32_t base, y2_buf *b) {
        const __m256d vt = _mm256_set1_pd(t);
        const __m256d mag = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
        const __m256i step = _mm256_set1_epi32(16);
        const __m256i shifts = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i one = _mm256_set1_epi32(1);
        const double tab[2] = {t, -t};  /* indexed by bit 0 */
        const double rtab[2] = {r, -r};
        ptrdiff_t end, n, j, j_;
        uint32_t *o, x;
        __m256d v0, v1;
        __m256i w;
        unsigned m, s;
        while (stop - i >= 8) {
            end = stop - i > Y2_BLOCK ? i + Y2_BLOCK : stop - ((stop - i) & 7);
            if (y2_reserve(b, end - i + 8)) return -1;
            o = b->p;
            n = b->n;
            w = _mm256_add_epi32(_mm256_set1_epi32((int)(base + ((uint32_t)i << 1))),
                                 _mm256_add_epi32(shifts, shifts));
            for (; i < end; i += 8) {
                Y2_PREFETCH(p + i);
                v0 = _mm256_loadu_pd(p + i);
                v1 = _mm256_loadu_pd(p + i + 4);
                m = (unsigned)_mm256_movemask_pd(_mm256_cmp_pd(_mm256_and_pd(v0, mag), vt, _CMP_GE_OQ))
                  | (unsigned)_mm256_movemask_pd(_mm256_cmp_pd(_mm256_and_pd(v1, mag), vt, _CMP_GE_OQ)) << 4;
                s = ~((unsigned)_mm256_movemask_pd(v0) | (unsigned)_mm256_movemask_pd(v1) << 4);
                n += Y2_EMIT(o + n, _mm256_or_si256(w, _mm256_and_si256(
                    _mm256_srlv_epi32(_mm256_set1_epi32((int)s), shifts), one)), m);
                w = _mm256_add_epi32(w, step);
            }
            for (j = b->n; j < n; j++) {
                x = o[j];
                j_ = (x >> 1) & 0x1FFFFFu;
                p[j_] = (p[j_] + tab[x & 1u]) + rtab[x & 1u];
            }
            b->n = n;
        }
        return i;
    }
    #endif

    /* Contiguous arrays: 16 elements at a time, a 16-bit mask of |v| >= t (SSE2 on x86-64;
       elsewhere the scalar loop below does all the work). */
    static int y2_compress_f32(char *data, ptrdiff_t stride, ptrdiff_t start, ptrdiff_t stop,
                               float t, float r, uint32_t base, y2_buf *b) {
        ptrdiff_t i = start;
    #ifdef Y2_AVX2
        if (y2_avx2 && stride == (ptrdiff_t)sizeof(float)) {
            i = y2_avx2_f32((float *)data, i, stop, t, r, base, b);
            if (i < 0) return -1;
        }
    #endif
    #ifdef Y2_SSE2
        if (stride == (ptrdiff_t)sizeof(float)) {
            float *p = (float *)data;
            const __m128 vt = _mm_set1_ps(t);
            const __m128 abs = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
            uint32_t m;
            for (; i + 16 <= stop; i += 16) {
                _mm_prefetch((const char *)(p + i) + 6144, _MM_HINT_T0);
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
                               double t, double r, uint32_t base, y2_buf *b) {
        ptrdiff_t i = start;
    #ifdef Y2_AVX2
        if (y2_avx2 && stride == (ptrdiff_t)sizeof(double)) {
            i = y2_avx2_f64((double *)data, i, stop, t, r, base, b);
            if (i < 0) return -1;
        }
    #endif
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
                               long double t, long double r, uint32_t base, y2_buf *b) {
        ptrdiff_t i;
        for (i = start; i < stop; i++) Y2_QUANT(long double, (long double *)(data + i * stride), i);
        return 0;
    }

    #if defined(_MSC_VER)
    #define Y2_RESTRICT __restrict
    #else
    #define Y2_RESTRICT restrict
    #endif

    #ifdef Y2_AVX2
    /* unpack, 32 words at a time; returns how many words it did.  Fields narrower than 32
       bits are narrowed with saturating packs (exact: the values fit), which work within
       128-bit lanes; a lane permutation puts the elements back in order. */
    Y2_TARGET static ptrdiff_t y2_unpack_avx2(const uint32_t *w, ptrdiff_t n, uint16_t *layer,
                                              uint8_t *is_weight, uint32_t *index,
                                              uint8_t *positive) {
        const __m256i one = _mm256_set1_epi32(1);
        const __m256i imask = _mm256_set1_epi32(0x1FFFFF);
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        __m256i x0, x1, x2, x3;
        ptrdiff_t i;
    #define Y2_BYTES(f0, f1, f2, f3) _mm256_permutevar8x32_epi32(_mm256_packus_epi16(     \
            _mm256_packus_epi32(f0, f1), _mm256_packus_epi32(f2, f3)), order)
        for (i = 0; i + 32 <= n; i += 32) {
            x0 = _mm256_loadu_si256((const __m256i *)(w + i));
            x1 = _mm256_loadu_si256((const __m256i *)(w + i + 8));
            x2 = _mm256_loadu_si256((const __m256i *)(w + i + 16));
            x3 = _mm256_loadu_si256((const __m256i *)(w + i + 24));
            _mm256_storeu_si256((__m256i *)(layer + i), _mm256_permute4x64_epi64(
                _mm256_packus_epi32(_mm256_srli_epi32(x0, 23), _mm256_srli_epi32(x1, 23)), 0xD8));
            _mm256_storeu_si256((__m256i *)(layer + i + 16), _mm256_permute4x64_epi64(
                _mm256_packus_epi32(_mm256_srli_epi32(x2, 23), _mm256_srli_epi32(x3, 23)), 0xD8));
            _mm256_storeu_si256((__m256i *)(index + i), _mm256_and_si256(_mm256_srli_epi32(x0, 1), imask));
            _mm256_storeu_si256((__m256i *)(index + i + 8), _mm256_and_si256(_mm256_srli_epi32(x1, 1), imask));
            _mm256_storeu_si256((__m256i *)(index + i + 16), _mm256_and_si256(_mm256_srli_epi32(x2, 1), imask));
            _mm256_storeu_si256((__m256i *)(index + i + 24), _mm256_and_si256(_mm256_srli_epi32(x3, 1), imask));
            _mm256_storeu_si256((__m256i *)(is_weight + i), Y2_BYTES(  /* bit 22 clear */
                _mm256_andnot_si256(_mm256_srli_epi32(x0, 22), one),
                _mm256_andnot_si256(_mm256_srli_epi32(x1, 22), one),
                _mm256_andnot_si256(_mm256_srli_epi32(x2, 22), one),
                _mm256_andnot_si256(_mm256_srli_epi32(x3, 22), one)));
            _mm256_storeu_si256((__m256i *)(positive + i), Y2_BYTES(
                _mm256_and_si256(x0, one), _mm256_and_si256(x1, one),
                _mm256_and_si256(x2, one), _mm256_and_si256(x3, one)));
        }
    #undef Y2_BYTES
        return i;
    }
    #endif

    /* unpack: contiguous native words into the four field arrays (vectorized). */
    static void y2_unpack(const uint32_t *Y2_RESTRICT w, ptrdiff_t n,
                          uint16_t *Y2_RESTRICT layer, uint8_t *Y2_RESTRICT is_weight,
                          uint32_t *Y2_RESTRICT index, uint8_t *Y2_RESTRICT positive) {
        ptrdiff_t i = 0;
        uint32_t x;
    #ifdef Y2_AVX2
        if (y2_avx2) i = y2_unpack_avx2(w, n, layer, is_weight, index, positive);
    #endif
        for (; i < n; i++) {
            x = w[i];
            layer[i] = (uint16_t)(x >> 23);
            is_weight[i] = (uint8_t)(((x >> 22) & 1u) ^ 1u);
            index[i] = (x >> 1) & 0x1FFFFFu;
            positive[i] = (uint8_t)(x & 1u);
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

    /* pack: write (first) or OR one field, XOR `flip`, into o[i0:i1]; nonzero if a value
       needs more than `bits` bits (negative values convert to huge unsigned ones). */
    #define Y2_FIELD(NAME, T, U)                                                       \
        static int NAME(const char *data, ptrdiff_t stride, ptrdiff_t i0, ptrdiff_t i1,  \
                        uint32_t *o, int shift, int bits, uint32_t flip, int first) {  \
            U acc = 0, v;                                                              \
            ptrdiff_t i;                                                               \
            if (stride == (ptrdiff_t)sizeof(T)) {                                      \
                const T *p = (const T *)data;                                          \
                if (first)                                                             \
                    for (i = i0; i < i1; i++) {                                        \
                        v = (U)p[i]; acc |= v >> bits;                                 \
                        o[i] = ((uint32_t)v ^ flip) << shift;                          \
                    }                                                                  \
                else                                                                   \
                    for (i = i0; i < i1; i++) {                                        \
                        v = (U)p[i]; acc |= v >> bits;                                 \
                        o[i] |= ((uint32_t)v ^ flip) << shift;                         \
                    }                                                                  \
            } else {                                                                   \
                for (i = i0; i < i1; i++) {                                            \
                    v = (U)*(const T *)(data + i * stride);                            \
                    acc |= v >> bits;                                                  \
                    if (first) o[i] = ((uint32_t)v ^ flip) << shift;                   \
                    else o[i] |= ((uint32_t)v ^ flip) << shift;                        \
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

    /* pack in one pass for the common input dtypes, contiguous: each word is written
       once, and every input read once (the per-field passes above read and write the
       output four times, in L1).  The OR of each field's values tells whether one is out
       of range.  Compiled twice: plain (SSE2) and for AVX2, chosen at run time. */
    #define Y2_PACK_FUSED(NAME, TL, TW, TI, TS, U, ATTR)                                \
        ATTR static int NAME(const TL *Y2_RESTRICT l, const TW *Y2_RESTRICT w,           \
                             const TI *Y2_RESTRICT x, const TS *Y2_RESTRICT s,           \
                             uint32_t *Y2_RESTRICT o, ptrdiff_t n) {                     \
            U al = 0, aw = 0, ai = 0, as = 0;                                            \
            ptrdiff_t i;                                                                 \
            for (i = 0; i < n; i++) {                                                    \
                al |= (U)l[i]; aw |= (U)w[i]; ai |= (U)x[i]; as |= (U)s[i];              \
                o[i] = ((uint32_t)l[i] << 23) | (((uint32_t)w[i] ^ 1u) << 22)            \
                     | ((uint32_t)x[i] << 1) | (uint32_t)s[i];                           \
            }                                                                            \
            return ((al >> 9) | (aw >> 1) | (ai >> 21) | (as >> 1)) != 0;                \
        }

    /* unpack's dtypes (uint16, bool, uint32, uint8), and int64 (NumPy's default) */
    Y2_PACK_FUSED(y2_pack_small, uint16_t, uint8_t, uint32_t, uint8_t, uint32_t, )
    Y2_PACK_FUSED(y2_pack_i64, int64_t, int64_t, int64_t, int64_t, uint64_t, )
    #ifdef Y2_AVX2
    Y2_PACK_FUSED(y2_pack_small_avx2, uint16_t, uint8_t, uint32_t, uint8_t, uint32_t, Y2_TARGET)
    Y2_PACK_FUSED(y2_pack_i64_avx2, int64_t, int64_t, int64_t, int64_t, uint64_t, Y2_TARGET)
    #endif

    /* kind 1: unpack's dtypes, 2: all int64; the four inputs start at element i0. */
    static int y2_pack_fused(int kind, const char *const *data, ptrdiff_t i0, ptrdiff_t i1,
                             uint32_t *o) {
        ptrdiff_t n = i1 - i0;
        if (kind == 1) {
            const uint16_t *l = (const uint16_t *)data[0] + i0;
            const uint8_t *w = (const uint8_t *)data[1] + i0, *s = (const uint8_t *)data[3] + i0;
            const uint32_t *x = (const uint32_t *)data[2] + i0;
    #ifdef Y2_AVX2
            if (y2_avx2) return y2_pack_small_avx2(l, w, x, s, o + i0, n);
    #endif
            return y2_pack_small(l, w, x, s, o + i0, n);
        } else {
            const int64_t *l = (const int64_t *)data[0] + i0, *w = (const int64_t *)data[1] + i0;
            const int64_t *x = (const int64_t *)data[2] + i0, *s = (const int64_t *)data[3] + i0;
    #ifdef Y2_AVX2
            if (y2_avx2) return y2_pack_i64_avx2(l, w, x, s, o + i0, n);
    #endif
            return y2_pack_i64(l, w, x, s, o + i0, n);
        }
    }

    static int y2_field(int code, const char *data, ptrdiff_t stride, ptrdiff_t i0,
                        ptrdiff_t i1, uint32_t *o, int shift, int bits, uint32_t flip,
                        int first) {
        switch (code) {
        case 0: return y2_field_i8(data, stride, i0, i1, o, shift, bits, flip, first);
        case 1: return y2_field_i16(data, stride, i0, i1, o, shift, bits, flip, first);
        case 2: return y2_field_i32(data, stride, i0, i1, o, shift, bits, flip, first);
        case 3: return y2_field_i64(data, stride, i0, i1, o, shift, bits, flip, first);
        case 4: return y2_field_u8(data, stride, i0, i1, o, shift, bits, flip, first);
        case 5: return y2_field_u16(data, stride, i0, i1, o, shift, bits, flip, first);
        case 6: return y2_field_u32(data, stride, i0, i1, o, shift, bits, flip, first);
        default: return y2_field_u64(data, stride, i0, i1, o, shift, bits, flip, first);
        }
    }

    /* --- the worker pool ------------------------------------------------------------------
       Runs fn(ctx, k) for k in 0..n-1 on the calling thread and up to `want - 1` pool
       threads.  Chunks are taken one at a time from a shared counter, so the caller starts
       at once and a worker that is slow to wake (its core asleep) simply takes fewer: a
       threaded call is never much slower than a one-thread call.  A worker that has just
       finished a job spins watching for the next one (pause instruction between looks),
       then naps, then sleeps on a condition variable (y2_spin_ns below).  The state word
       holds the job's generation (odd while the caller is writing the job) and the next
       chunk; a chunk is claimed by a compare-and-swap that also checks the generation, so
       a late worker can never run a chunk of a job that has ended.  Workers never touch
       Python objects.
       One job at a time: a second caller that finds the pool busy runs its chunks alone. */
    #if (defined(__GNUC__) || defined(__clang__)) && !defined(_WIN32)
    #define Y2_POOL 1
    #include <pthread.h>
    #include <signal.h>
    #include <sched.h>
    #include <time.h>
    #ifdef __linux__
    #include <sys/prctl.h>
    #endif
    #endif

    typedef void (*y2_task)(void *ctx, Py_ssize_t chunk);

    /* Set *p to 1 (several threads may do so at once). */
    static void y2_set_flag(int *p) {
    #if defined(__GNUC__) || defined(__clang__)
        __atomic_store_n(p, 1, __ATOMIC_RELAXED);
    #else
        *(volatile int *)p = 1;
    #endif
    }

    #define Y2_MAX_WORKERS 63
    /* An idle worker spins for y2_spin_ns after its last job, then naps in steps of
       y2_nap_step_ns until y2_nap_ns after it (a nap ends on the worker's own timer: waking
       it costs the caller nothing, while a condition-variable wake-up makes the caller's
       core send an interrupt, which on virtual machines can stall the caller), then sleeps
       until woken.  Measured on a 2-vCPU VM with 1 M-word unpacks 2 ms apart: naps of
       0.2 ms cost about 0.2 of a core while napping (0.05 ms: 0.4) for about as fast
       calls; 0.5 ms naps made them much slower. */
    static long long y2_spin_ns = 250000;
    static long long y2_nap_ns = 20000000;
    static long long y2_nap_step_ns = 200000;
    static int y2_cores = 1;                /* cores available to the process */

    static void y2_serial(y2_task fn, void *ctx, Py_ssize_t n) {
        Py_ssize_t k;
        for (k = 0; k < n; k++) fn(ctx, k);
    }

    #ifdef Y2_POOL
    #if defined(__x86_64__) || defined(__i386__)
    #define Y2_RELAX() __builtin_ia32_pause()
    #elif defined(__aarch64__)
    #define Y2_RELAX() __asm__ __volatile__("yield")
    #else
    #define Y2_RELAX() ((void)0)
    #endif

    static struct {
        pthread_mutex_t owner;   /* held by the caller whose job the pool runs */
        pthread_mutex_t lock;    /* guards sleeping workers' wait on `wake` */
        pthread_cond_t wake;
        uint64_t state;          /* generation << 32 | next chunk (atomic) */
        y2_task fn;              /* the job: written while the generation is odd */
        void *ctx;
        uint32_t n;
        int seats;               /* workers that may still join this job (atomic) */
        uint32_t done;           /* chunks finished (atomic) */
        int stop;                /* workers exit (atomic) */
        int sleeping;            /* workers waiting on `wake` (atomic; changed under lock) */
        unsigned pokes;          /* wake-ups without a job (under lock) */
        int workers;             /* threads started */
        pthread_t threads[Y2_MAX_WORKERS];
    } y2_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

    static long long y2_now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }

    static uint32_t y2_generation(void) {
        return (uint32_t)(__atomic_load_n(&y2_pool.state, __ATOMIC_ACQUIRE) >> 32);
    }

    /* Claim and run chunks of generation g until none is left. */
    static void y2_drain(uint32_t g, y2_task fn, void *ctx, uint32_t n) {
        uint64_t s = __atomic_load_n(&y2_pool.state, __ATOMIC_ACQUIRE);
        while ((uint32_t)(s >> 32) == g && (uint32_t)s < n) {
            if (__atomic_compare_exchange_n(&y2_pool.state, &s, s + 1, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                fn(ctx, (Py_ssize_t)(uint32_t)s);
                __atomic_add_fetch(&y2_pool.done, 1, __ATOMIC_RELEASE);
                s = __atomic_load_n(&y2_pool.state, __ATOMIC_ACQUIRE);
            }
        }
    }

    static void *y2_worker(void *arg) {
        uint32_t seen = (uint32_t)(uintptr_t)arg, g, n;
        unsigned pokes;
        long long idle_since = y2_now_ns();
        unsigned looks = 0;
        long long idle;
        struct timespec nap = {0, 0};
        int seats;
        y2_task fn;
        void *ctx;
    #ifdef __linux__
        prctl(PR_SET_TIMERSLACK, 5000UL, 0, 0, 0);  /* naps as long as asked, not +50 us */
    #endif
        for (;;) {
            if (__atomic_load_n(&y2_pool.stop, __ATOMIC_ACQUIRE)) return NULL;
            g = y2_generation();
            if (g != seen && !(g & 1u)) {
                fn = __atomic_load_n(&y2_pool.fn, __ATOMIC_RELAXED);
                ctx = __atomic_load_n(&y2_pool.ctx, __ATOMIC_RELAXED);
                n = __atomic_load_n(&y2_pool.n, __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_ACQUIRE);
                if (y2_generation() != g) continue;  /* rewritten meanwhile: look again */
                seen = g;
                seats = __atomic_load_n(&y2_pool.seats, __ATOMIC_ACQUIRE);
                while (seats > 0 && !__atomic_compare_exchange_n(
                           &y2_pool.seats, &seats, seats - 1, 0, __ATOMIC_ACQ_REL,
                           __ATOMIC_ACQUIRE)) {
                }
                if (seats > 0) {
                    if (y2_generation() == g) y2_drain(g, fn, ctx, n);
                    else __atomic_add_fetch(&y2_pool.seats, 1, __ATOMIC_RELEASE);  /* not ours */
                }
                idle_since = y2_now_ns();
                continue;
            }
            if (++looks & 63u) {
                Y2_RELAX();
                continue;
            }
            if (__atomic_load_n(&y2_pool.workers, __ATOMIC_RELAXED) < y2_cores) {
                /* (with more workers than spare cores, sleep at once) */
                idle = y2_now_ns() - idle_since;
                if (idle < __atomic_load_n(&y2_spin_ns, __ATOMIC_RELAXED)) continue;
                if (idle < __atomic_load_n(&y2_nap_ns, __ATOMIC_RELAXED)) {
                    nap.tv_nsec = (long)__atomic_load_n(&y2_nap_step_ns, __ATOMIC_RELAXED);
                    nanosleep(&nap, NULL);
                    continue;
                }
            }
            pthread_mutex_lock(&y2_pool.lock);
            pokes = y2_pool.pokes;
            __atomic_add_fetch(&y2_pool.sleeping, 1, __ATOMIC_SEQ_CST);
            while (!__atomic_load_n(&y2_pool.stop, __ATOMIC_SEQ_CST) && pokes == y2_pool.pokes
                   && ((g = y2_generation()) == seen || (g & 1u)))
                pthread_cond_wait(&y2_pool.wake, &y2_pool.lock);
            __atomic_sub_fetch(&y2_pool.sleeping, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&y2_pool.lock);
            idle_since = y2_now_ns();
        }
    }

    /* Start workers until there are `count` (or thread creation fails); owner held. */
    static void y2_grow(int count) {
        sigset_t all, old;
        if (count > Y2_MAX_WORKERS) count = Y2_MAX_WORKERS;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);  /* signals stay with the caller's threads */
        while (y2_pool.workers < count) {
            if (pthread_create(&y2_pool.threads[y2_pool.workers], NULL, y2_worker,
                               (void *)(uintptr_t)y2_generation()))
                break;
            __atomic_store_n(&y2_pool.workers, y2_pool.workers + 1, __ATOMIC_RELAXED);
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }

    static void y2_run(y2_task fn, void *ctx, Py_ssize_t n, int want) {
        uint32_t g;
        unsigned looks = 0;
        if (want > 1 && n > 1 && n < 0x7fffffff && !pthread_mutex_trylock(&y2_pool.owner)) {
            y2_grow(want - 1);
            if (y2_pool.workers > 0) {
                g = y2_generation() + 1;  /* odd: the job is being written */
                __atomic_store_n(&y2_pool.state, (uint64_t)g << 32, __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_RELEASE);  /* odd before any field changes */
                __atomic_store_n(&y2_pool.fn, fn, __ATOMIC_RELAXED);
                __atomic_store_n(&y2_pool.ctx, ctx, __ATOMIC_RELAXED);
                __atomic_store_n(&y2_pool.n, (uint32_t)n, __ATOMIC_RELAXED);
                __atomic_store_n(&y2_pool.seats, want - 1, __ATOMIC_RELAXED);
                __atomic_store_n(&y2_pool.done, 0, __ATOMIC_RELAXED);
                g++;
                __atomic_store_n(&y2_pool.state, (uint64_t)g << 32, __ATOMIC_SEQ_CST);
                if (__atomic_load_n(&y2_pool.sleeping, __ATOMIC_SEQ_CST)) {
                    pthread_mutex_lock(&y2_pool.lock);
                    pthread_cond_broadcast(&y2_pool.wake);
                    pthread_mutex_unlock(&y2_pool.lock);
                }
                y2_drain(g, fn, ctx, (uint32_t)n);
                /* chunks that workers took are running: wait for them (spinning, as they
                   are short; yielding the core if one takes long, e.g. preempted) */
                while (__atomic_load_n(&y2_pool.done, __ATOMIC_ACQUIRE) < (uint32_t)n) {
                    if (++looks < 2000) Y2_RELAX();
                    else sched_yield();
                }
                pthread_mutex_unlock(&y2_pool.owner);
                return;
            }
            pthread_mutex_unlock(&y2_pool.owner);
        }
        y2_serial(fn, ctx, n);
    }

    /* Wake sleeping workers ahead of a job (they then watch for it as after one). */
    static void y2_pool_poke(void) {
        if (!__atomic_load_n(&y2_pool.sleeping, __ATOMIC_SEQ_CST)) return;
        pthread_mutex_lock(&y2_pool.lock);
        y2_pool.pokes++;
        pthread_cond_broadcast(&y2_pool.wake);
        pthread_mutex_unlock(&y2_pool.lock);
    }

    /* Stop and join the workers (at interpreter exit, or to test a fresh pool). */
    static void y2_pool_stop(void) {
        int k;
        pthread_mutex_lock(&y2_pool.owner);
        __atomic_store_n(&y2_pool.stop, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&y2_pool.lock);
        pthread_cond_broadcast(&y2_pool.wake);
        pthread_mutex_unlock(&y2_pool.lock);
        for (k = 0; k < y2_pool.workers; k++) pthread_join(y2_pool.threads[k], NULL);
        y2_pool.workers = 0;
        __atomic_store_n(&y2_pool.stop, 0, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&y2_pool.owner);
    }

    /* In a forked child only the forking thread exists: start again with no workers. */
    static void y2_after_fork(void) {
        pthread_mutex_init(&y2_pool.owner, NULL);
        pthread_mutex_init(&y2_pool.lock, NULL);
        pthread_cond_init(&y2_pool.wake, NULL);
        y2_pool.workers = 0;
        y2_pool.stop = 0;
        y2_pool.state = 0;
        y2_pool.done = 0;
        y2_pool.sleeping = 0;
    }

    static int y2_pool_init(int cores) {
        y2_cores = cores;
        return pthread_atfork(NULL, NULL, y2_after_fork);
    }
    static int y2_pool_workers(void) { return y2_pool.workers; }
    #else
    static void y2_run(y2_task fn, void *ctx, Py_ssize_t n, int want) { y2_serial(fn, ctx, n); }
    static void y2_pool_stop(void) {}
    static void y2_pool_poke(void) {}
    static int y2_pool_init(int cores) { return 0; }
    static int y2_pool_workers(void) { return 0; }
    #endif
    """
    ctypedef struct y2_buf:
        uint32_t* p
        Py_ssize_t n
        Py_ssize_t cap
    int y2_reserve(y2_buf*, Py_ssize_t) noexcept nogil
    int y2_init() noexcept nogil
    int y2_set_avx2(int) noexcept nogil
    int y2_avx2
    int y2_compress_f32(char*, Py_ssize_t, Py_ssize_t, Py_ssize_t, float, float, uint32_t,
                        y2_buf*) noexcept nogil
    int y2_compress_f64(char*, Py_ssize_t, Py_ssize_t, Py_ssize_t, double, double, uint32_t,
                        y2_buf*) noexcept nogil
    int y2_compress_f80(char*, Py_ssize_t, Py_ssize_t, Py_ssize_t, long double, long double,
                        uint32_t, y2_buf*) noexcept nogil
    void y2_swap_copy(const char*, char*, Py_ssize_t) noexcept nogil
    void y2_unpack(const uint32_t*, Py_ssize_t, uint16_t*, uint8_t*, uint32_t*,
                   uint8_t*) noexcept nogil
    int y2_field(int, const char*, Py_ssize_t, Py_ssize_t, Py_ssize_t, uint32_t*, int, int,
                 uint32_t, int) noexcept nogil
    int y2_pack_fused(int, const char* const*, Py_ssize_t, Py_ssize_t, uint32_t*) noexcept nogil
    ctypedef void (*y2_task)(void*, Py_ssize_t) noexcept nogil
    void y2_run(y2_task, void*, Py_ssize_t, int) nogil
    void y2_pool_stop() nogil
    void y2_pool_poke() nogil
    int y2_pool_init(int) noexcept nogil
    int y2_pool_workers() noexcept nogil
    void y2_set_flag(int*) noexcept nogil
    long long y2_spin_ns
    long long y2_nap_ns
    long long y2_nap_step_ns


DEF HANDSHAKE_SIZE = 8
DEF INDEX_MASK = 0x1FFFFF
DEF I32_MAX = 0x7FFFFFFF
DEF MAX_LAYERS = 512
DEF MAX_ARRAY_SIZE = 0x200000

cdef bint _LITTLE = sys.byteorder == "little"
#: True when the compress and unpack kernels use their AVX2 loops (chosen at import, from
#: the running CPU; :func:`use_avx2` changes it).
AVX2 = bool(y2_init())


def use_avx2(bint on):
    """Use the AVX2 loops of compress and unpack if ``on`` and the CPU has AVX2; with
    ``on`` false, the portable loops (SSE2 on x86-64, plain C elsewhere) that a CPU without
    AVX2 runs.  Returns the old setting.  For tests and the fuzzer, which run both paths on
    one machine; results never depend on it.  Process-wide: not for use while another thread
    runs a kernel."""
    global AVX2
    cdef int old = y2_set_avx2(on)
    AVX2 = bool(y2_avx2)
    return bool(old)


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
    if pos < 0 or pos > size:
        raise _checks.position_error(pos, size)
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


cdef Py_ssize_t _position(object pos, Py_ssize_t size) except? -1:
    """``pos`` as a Py_ssize_t (an int too large for one is outside any buffer)."""
    try:
        return pos
    except OverflowError:
        raise _checks.position_error(pos, size) from None


def check_handshake(buf, pos=0):
    """Validate the handshake at ``pos``; return ``(type, size)``."""
    cdef Py_buffer view
    cdef int kind = 0
    cdef int32_t n
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        n = _check_handshake(<const uint8_t*>view.buf, view.len, _position(pos, view.len),
                             &kind)
    finally:
        PyBuffer_Release(&view)
    return kind, n


def scan_deltas(buf, pos, end, max_bytes, max_message_size):
    """The run of whole Delta messages at ``buf[pos:end]``: ``(stop, count)`` (see the pure
    twin for the rules)."""
    cdef Py_buffer view
    cdef Py_ssize_t p, e, start, stop, cap, limit, count = 0
    cdef int32_t kind, n
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        e = _position(end, view.len)
        if e < 0 or e > view.len:
            raise _checks.position_error(end, view.len)
        p = _position(pos, e)
        if p < 0 or p > e:
            raise _checks.position_error(pos, e)
        cap = max_bytes
        limit = max_message_size
        start = p
        with nogil:
            while e - p >= HANDSHAKE_SIZE:
                kind = _bei32(<const uint8_t*>view.buf + p)
                n = _bei32(<const uint8_t*>view.buf + p + 4)
                if kind != 1 or n < 0 or n % 4 or HANDSHAKE_SIZE + <Py_ssize_t>n > limit:
                    break
                stop = p + HANDSHAKE_SIZE + n
                if stop > e or (count and stop - start > cap):
                    break
                p = stop
                count += 1
    finally:
        PyBuffer_Release(&view)
    return p, count


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
    n = _check_handshake(base, size, pos, &kind)  # IndexError for a pos outside the buffer
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


cdef object _decode(object buf, object pos, bint whole):
    cdef Py_buffer view
    cdef Py_ssize_t end = 0, size
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        size = view.len
        msg = _decode_at(buf, <const uint8_t*>view.buf, size, _position(pos, size), &end)
    finally:
        PyBuffer_Release(&view)
    if whole:
        if end != size:
            raise _fail("message", end, f"{size - end} bytes after the end of the message")
        return msg
    return msg, end


def decode_prefix(buf, pos=0):
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


# --- the worker pool ------------------------------------------------------------------------


y2_pool_init(_checks.affinity_cores())
atexit.register(lambda: _pool_stop())  # join the workers before the interpreter goes


cdef void _wake_workers():
    """Wake sleeping workers ahead of a job, so that their wake-up overlaps its setup."""
    with nogil:
        y2_pool_poke()


def _pool_stop():
    """Stop and join the pool's worker threads (the next threaded call starts new ones)."""
    with nogil:
        y2_pool_stop()


def _pool_workers():
    """How many worker threads the pool has started (in this process)."""
    return y2_pool_workers()


def _pool_idle(double spin, double nap, double step=-1):
    """Set how long an idle worker spins watching for the next job, until when (from the
    last job) it then naps, and how long each nap is (under 1 s); the old
    ``(spin, nap, step)``."""
    global y2_spin_ns, y2_nap_ns, y2_nap_step_ns
    old = (y2_spin_ns / 1e9, y2_nap_ns / 1e9, y2_nap_step_ns / 1e9)
    y2_spin_ns = <long long>(spin * 1e9)
    y2_nap_ns = <long long>(nap * 1e9)
    if step >= 0:
        y2_nap_step_ns = <long long>(min(step, 0.999) * 1e9)
    return old


cdef int _thread_count(object nthreads, Py_ssize_t size, Py_ssize_t auto_size,
                       Py_ssize_t chunks) except -1:
    """Threads to use: ``threads=None`` gives the idle cores (``_checks.default_threads``:
    those of the process's affinity that the load average leaves free) once ``size`` reaches
    ``auto_size``, one thread below it; never more than there are chunks."""
    cdef Py_ssize_t want
    if nthreads is None:
        want = _checks.default_threads() if size >= auto_size else 1
    else:
        want = min(nthreads, chunks)  # (a Python int, however large)
    return <int>max(1, min(want, chunks))


# --- pack / unpack / wire -------------------------------------------------------------------


cdef struct Field:
    const char* data
    Py_ssize_t stride  # bytes
    int code  # dtype: 0..3 int8..int64, 4..7 uint8..uint64
    int shift
    int bits
    uint32_t flip  # XORed into the value before the shift: 1 for is_weight (bit 22 = bias)


cdef dict _INT_CODES = {
    (kind, size): code
    for code, (kind, size) in enumerate(
        [("i", 1), ("i", 2), ("i", 4), ("i", 8), ("u", 1), ("u", 2), ("u", 4), ("u", 8)]
    )
}

DEF PACK_BLOCK = 2048

DEF WORDS_PER_CHUNK = 32768
#: pack and unpack split their words into chunks of this many, taken in turn by the threads
#: (a chunk's four outputs stay whole cache lines: it is a multiple of 64).
WORD_CHUNK = WORDS_PER_CHUNK
#: ``threads=None`` uses the available cores from this many words (one thread below).
AUTO_WORDS = 1 << 17


cdef struct PackJob:
    Field fields[4]
    const char* data[4]  # the fields' data, for the one-pass kernels
    int fused  # 0: field by field; 1: unpack's dtypes, 2: int64, all contiguous
    uint32_t* out
    Py_ssize_t n
    int bad  # set (atomically) by a chunk holding an out-of-range value


#: pack's one-pass kernels: the fields' dtype codes (``_INT_CODES``) each takes.
cdef dict _FUSED = {(5, 4, 6, 4): 1, (3, 3, 3, 3): 2}


cdef void _pack_chunk(void* ctx, Py_ssize_t chunk) noexcept nogil:
    cdef PackJob* job = <PackJob*>ctx
    cdef Py_ssize_t i0 = chunk * WORDS_PER_CHUNK, end = min(i0 + WORDS_PER_CHUNK, job.n), i1
    cdef int k, bad = 0
    if job.fused:
        if y2_pack_fused(job.fused, job.data, i0, end, job.out):
            y2_set_flag(&job.bad)
        return
    # block by block, so that the block of output stays in L1 for all four fields
    while i0 < end:
        i1 = min(i0 + PACK_BLOCK, end)
        for k in range(4):
            bad |= y2_field(job.fields[k].code, job.fields[k].data, job.fields[k].stride, i0,
                            i1, job.out, job.fields[k].shift, job.fields[k].bits,
                            job.fields[k].flip, k == 0)
        i0 = i1
    if bad:
        y2_set_flag(&job.bad)


def pack(layer, is_weight, index, positive, *, threads=None):
    """Four equal-length integer arrays -> native uint32 delta words (y2's parameter ``2 ×
    layer`` for a weight, ``2 × layer + 1`` for a bias; ``positive`` 1: +tau).

    ``threads``: as for :func:`unpack`; the result does not depend on it.
    """
    arrays = _checks.pack_arrays(layer, is_weight, index, positive)
    nthreads = _checks.threads_value(threads)
    cdef Py_ssize_t n = len(arrays[0])
    cdef Py_ssize_t chunks = (n + WORDS_PER_CHUNK - 1) // WORDS_PER_CHUNK
    cdef int want = _thread_count(nthreads, n, AUTO_WORDS, chunks)
    if want > 1:
        _wake_workers()
    cdef cnp.ndarray out = np.empty(n, dtype=_U32)
    if n == 0:
        return out
    cdef PackJob job
    cdef int k
    for k in range(4):
        a = arrays[k]
        job.fields[k].data = <const char*>cnp.PyArray_DATA(a)
        job.fields[k].stride = a.strides[0]
        job.fields[k].code = _INT_CODES[a.dtype.kind, a.itemsize]
        job.fields[k].shift = (23, 22, 1, 0)[k]
        job.fields[k].bits = (9, 1, 21, 1)[k]
        job.fields[k].flip = k == 1
        job.data[k] = job.fields[k].data
    codes = tuple(job.fields[k].code for k in range(4))
    job.fused = _FUSED.get(codes, 0) if all(
        job.fields[k].stride == a.itemsize for k, a in enumerate(arrays)
    ) else 0
    job.out = <uint32_t*>cnp.PyArray_DATA(out)
    job.n = n
    job.bad = 0
    with nogil:
        y2_run(_pack_chunk, &job, chunks, want)
    if job.bad:
        _checks.check_pack_values(arrays)  # finds the first bad position and raises
    return out


cdef void _unpack_range(const char* src, Py_ssize_t stride, bint swap, Py_ssize_t i0,
                        Py_ssize_t i1, uint16_t* lp, uint8_t* wp, uint32_t* ip,
                        uint8_t* sp) noexcept nogil:
    cdef Py_ssize_t i
    cdef uint32_t x
    if stride == 4 and not swap:
        y2_unpack(<const uint32_t*>src + i0, i1 - i0, lp + i0, wp + i0, ip + i0, sp + i0)
        return
    for i in range(i0, i1):
        x = (<const uint32_t*>(src + i * stride))[0]
        if swap:
            x = _bswap(x)
        lp[i] = x >> 23
        wp[i] = ((x >> 22) & 1) ^ 1
        ip[i] = (x >> 1) & INDEX_MASK
        sp[i] = x & 1


cdef struct UnpackJob:
    const char* src
    Py_ssize_t stride
    bint swap
    Py_ssize_t n
    uint16_t* lp
    uint8_t* wp
    uint32_t* ip
    uint8_t* sp


cdef void _unpack_chunk(void* ctx, Py_ssize_t chunk) noexcept nogil:
    cdef UnpackJob* job = <UnpackJob*>ctx
    cdef Py_ssize_t i0 = chunk * WORDS_PER_CHUNK
    _unpack_range(job.src, job.stride, job.swap, i0, min(i0 + WORDS_PER_CHUNK, job.n), job.lp,
                  job.wp, job.ip, job.sp)


cdef bint _disjoint_outputs(object out, object raw, Py_ssize_t n):
    """Quick acceptance of unpack's ``out``: four plain arrays of the right dtypes and length,
    contiguous, writeable, whose byte ranges and the words' are pairwise disjoint.  False
    sends the case to ``_checks.unpack_out``, which decides exactly (and names the fault)."""
    cdef int[4] codes = [cnp.NPY_UINT16, cnp.NPY_BOOL, cnp.NPY_UINT32, cnp.NPY_UINT8]
    cdef Py_ssize_t[5] lo, hi
    cdef Py_ssize_t k, j, step
    cdef cnp.ndarray a
    if type(out) is not tuple and type(out) is not list or len(out) != 4:
        return False
    for k in range(4):
        if type(out[k]) is not np.ndarray:
            return False
        a = out[k]
        if (cnp.PyArray_NDIM(a) != 1 or cnp.PyArray_DIM(a, 0) != n
                or cnp.PyArray_TYPE(a) != codes[k] or not cnp.PyArray_ISNOTSWAPPED(a)
                or not cnp.PyArray_ISCARRAY(a)):
            return False
        lo[k] = <Py_ssize_t>cnp.PyArray_DATA(a)
        hi[k] = lo[k] + cnp.PyArray_NBYTES(a)
    a = raw
    step = cnp.PyArray_STRIDE(a, 0)
    lo[4] = hi[4] = <Py_ssize_t>cnp.PyArray_DATA(a)
    if step < 0:
        lo[4] += step * (n - 1)
    else:
        hi[4] += step * (n - 1)
    hi[4] += 4
    for k in range(5):
        for j in range(k + 1, 5):
            if lo[k] < hi[j] and lo[j] < hi[k]:
                return False
    return True


def unpack(words, *, out=None, threads=None):
    """Delta words -> ``(layer uint16, is_weight bool, index uint32, positive uint8)``.

    ``out``: four arrays to write into (and return) instead of new ones; each 1-D,
    contiguous, writeable, of the words' length and exactly those dtypes, sharing no memory
    with the words or with one another.  ``threads``: how many threads may share the work
    (``None``: the available cores from ``AUTO_WORDS`` words); the result does not depend
    on it.
    """
    raw = _checks.word_array(words)
    nthreads = _checks.threads_value(threads)
    cdef Py_ssize_t n = len(raw)
    cdef Py_ssize_t chunks = (n + WORDS_PER_CHUNK - 1) // WORDS_PER_CHUNK
    cdef int want = _thread_count(nthreads, n, AUTO_WORDS, chunks)
    if want > 1:
        _wake_workers()
    if out is None:
        layer = np.empty(n, dtype=np.uint16)
        is_weight = np.empty(n, dtype=np.bool_)
        index = np.empty(n, dtype=np.uint32)
        positive = np.empty(n, dtype=np.uint8)
    elif n and _disjoint_outputs(out, raw, n):
        layer, is_weight, index, positive = out
    else:
        layer, is_weight, index, positive = _checks.unpack_out(out, raw)
    if n == 0:
        return layer, is_weight, index, positive
    cdef UnpackJob job
    job.src = <const char*>cnp.PyArray_DATA(raw)
    job.stride = raw.strides[0]
    job.swap = not raw.dtype.isnative
    job.n = n
    job.lp = <uint16_t*>cnp.PyArray_DATA(layer)
    job.wp = <uint8_t*>cnp.PyArray_DATA(is_weight)
    job.ip = <uint32_t*>cnp.PyArray_DATA(index)
    job.sp = <uint8_t*>cnp.PyArray_DATA(positive)
    with nogil:
        y2_run(_unpack_chunk, &job, chunks, want)
    return layer, is_weight, index, positive


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


DEF KEYS = 2 * MAX_LAYERS  # a word's key, y2's parameter index: its top 10 bits, 0..1023


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


cdef tuple _span(cnp.ndarray a):
    """The bytes ``[lo, hi)`` that the elements of ``a`` (not empty) lie in."""
    cdef Py_ssize_t lo, hi, k, n, st
    lo = hi = <Py_ssize_t>cnp.PyArray_DATA(a)
    for k in range(cnp.PyArray_NDIM(a)):
        n = cnp.PyArray_DIM(a, k)
        st = cnp.PyArray_STRIDE(a, k)
        if st < 0:
            lo += st * (n - 1)
        else:
            hi += st * (n - 1)
    return lo, hi + cnp.PyArray_ITEMSIZE(a)


cdef list _spans(list arrays):
    """The sorted spans of the arrays that hold elements."""
    return sorted([_span(a) for a in arrays if cnp.PyArray_SIZE(a)])


cdef bint _overlapping(list arrays):
    """Do any two of the arrays share memory (bounds test: tied weights, views)?"""
    cdef list spans = _spans(arrays)
    cdef Py_ssize_t k
    for k in range(1, len(spans)):
        if spans[k][0] < spans[k - 1][1]:
            return True
    return False


cdef bint _overlaps_any(cnp.ndarray a, list arrays):
    """Does ``a`` (not empty) share memory with any of the arrays (bounds test)?"""
    lo, hi = _span(a)
    for other_lo, other_hi in _spans(arrays):
        if lo < other_hi and other_lo < hi:
            return True
    return False


cdef Py_ssize_t _first_bad_word(const uint32_t[:] w, bint swap,
                                const int64_t* sizes) noexcept nogil:
    """The first word whose index is not below ``sizes[key]`` (``sizes``: KEYS entries)."""
    cdef Py_ssize_t i, n = w.shape[0]
    cdef uint32_t x
    if swap:  # two loops: each stays tight, whatever the compiler makes of the caller
        for i in range(n):
            x = _bswap(w[i])
            if <int64_t>((x >> 1) & INDEX_MASK) >= sizes[x >> 22]:
                return i
        return n
    for i in range(n):
        x = w[i]
        if <int64_t>((x >> 1) & INDEX_MASK) >= sizes[x >> 22]:
            return i
    return n


cdef object _point(Target* tg, object a, int64_t size):
    """Point ``tg`` (kind 4) at the ``size`` elements of ``a``, as its words were checked
    against (kind 3: left to the NumPy path); the copy to write back into ``a``, or None."""
    cdef cnp.ndarray flat
    cdef int kind = _float_kind(a.dtype)
    if kind == 3:
        tg.kind = 3
        return None
    flat, copied = _pure.flat_target(a)
    if (cnp.PyArray_NDIM(flat) != 1 or cnp.PyArray_DIM(flat, 0) != size
            or _float_kind(flat.dtype) != kind):
        raise RuntimeError(f"y2: apply cannot address {size} elements of {type(a).__name__}")
    tg.data = <char*>cnp.PyArray_DATA(flat)
    tg.stride = cnp.PyArray_STRIDE(flat, 0)
    tg.kind = kind
    return flat if copied else None


cdef void _add_words(const uint32_t[:] w, bint swap, const Target* targets,
                     double t) noexcept nogil:
    """``+= ±tau`` at each word's element, in order: words of kind 0..2 targets (checked to
    be in range); other words are skipped (their targets' data is NULL, stride 0)."""
    cdef Py_ssize_t i
    cdef uint32_t x
    cdef int key
    cdef char* p
    cdef float tf = <float>t
    cdef long double tl = <long double>t
    for i in range(w.shape[0]):
        x = w[i]
        if swap:
            x = _bswap(x)
        key = x >> 22
        p = targets[key].data + <Py_ssize_t>((x >> 1) & INDEX_MASK) * targets[key].stride
        if targets[key].kind == 0:
            (<float*>p)[0] += tf if x & 1 else -tf
        elif targets[key].kind == 1:
            (<double*>p)[0] += t if x & 1 else -t
        elif targets[key].kind == 2:
            (<long double*>p)[0] += tl if x & 1 else -tl


cdef class _Targets:
    """The per-key table of ``apply``: KEYS entries, all kind 4 (no array) at first."""
    cdef Target* t

    def __cinit__(self):
        cdef Py_ssize_t key
        self.t = <Target*>calloc(KEYS, sizeof(Target))
        if self.t == NULL:
            raise MemoryError()
        for key in range(KEYS):
            self.t[key].kind = 4

    def __dealloc__(self):
        free(self.t)


def apply(params, words, tau):
    """Add +tau or -tau to the parameter each word addresses, in place (all checked first).

    Arrays sharing memory are updated one after another in key order, each written back
    before the next is read, as the reference does.
    """
    cdef bint swap
    layers = _checks.model(params, "params")
    cdef double t = _checks.tau_value(tau)
    _checks.check_tau_fits(layers, t, "params")
    arr, swap = _words(words)
    cdef const uint32_t[:] w = arr
    cdef Py_ssize_t n = w.shape[0], bad
    if n == 0:
        return
    cdef cnp.ndarray table = _checks.size_table(layers)
    if (cnp.PyArray_TYPE(table) != cnp.NPY_INT64 or cnp.PyArray_NDIM(table) != 1
            or cnp.PyArray_DIM(table, 0) != KEYS or not cnp.PyArray_ISCARRAY_RO(table)):
        raise RuntimeError(f"y2: the size table must be {KEYS} contiguous int64 entries")
    cdef const int64_t* sizes = <const int64_t*>cnp.PyArray_DATA(table)
    with nogil:
        bad = _first_bad_word(w, swap, sizes)
    if bad < n:
        raise _checks.bad_word(bad, _bswap(w[bad]) if swap else w[bad], layers)
    # (key, array) for every array a word can address, in key order (weights 2k, biases
    # 2k + 1): layers past MAX_LAYERS cannot be
    keyed = [(2 * k + j, pair[j]) for k, pair in enumerate(layers[:MAX_LAYERS]) for j in (0, 1)]
    arrays = [a for _key, a in keyed]
    if _overlaps_any(arr, arrays):  # the words are in a parameter: read them as they were
        arr = arr.copy()
        w = arr
    cdef _Targets targets = _Targets()
    if _overlapping(arrays):
        _apply_by_key(targets.t, keyed, arr.byteswap() if swap else arr, t, sizes)
        return
    writeback = []
    slow = []
    for key, a in keyed:
        copy = _point(&targets.t[key], a, sizes[key])
        if copy is not None:
            writeback.append((a, copy))
        elif targets.t[key].kind == 3:
            slow.append((key, a))
    with nogil:
        _add_words(w, swap, targets.t, t)
    for a, flat in writeback:
        a[...] = flat.reshape(a.shape)
    if slow:  # float16 and byte-swapped float arrays: the NumPy path, per array, in order
        native = arr.byteswap() if swap else arr
        keys = native >> 22
        for key, a in slow:
            _apply_numpy(a, native[keys == key], t)


cdef void _apply_numpy(object a, object words, double t) except *:
    """The NumPy path: ``words`` (native) all address ``a``."""
    _pure.apply_array(a, ((words >> 1) & INDEX_MASK).astype(np.int64),
                      (words & 1).astype(bool), t)


cdef void _apply_by_key(Target* targets, list keyed, object native, double t,
                        const int64_t* sizes) except *:
    """Array by array in key order (as the reference), each written back before the next is
    read: for arrays that share memory.  ``native``: the words in native byte order."""
    cdef const uint32_t[:] group
    keys = native >> 22
    present = set(np.unique(keys).tolist())
    for key, a in keyed:
        if key not in present:
            continue
        words = native[keys == key]
        copy = _point(&targets[key], a, sizes[key])
        if targets[key].kind == 3:
            _apply_numpy(a, words, t)
        else:
            group = words
            with nogil:
                _add_words(group, False, targets, t)
            if copy is not None:
                a[...] = copy.reshape(a.shape)
        targets[key].kind = 4


# --- compress -------------------------------------------------------------------------------


cdef struct Seg:
    char* data
    Py_ssize_t stride  # bytes
    Py_ssize_t start
    Py_ssize_t stop
    uint32_t base
    int kind  # 0 float, 1 double, 2 long double, 5 words already computed (data, stop of them)


cdef int _run_seg(const Seg* seg, double tau, double rest, y2_buf* buf) noexcept nogil:
    """Quantize one segment, appending its words to ``buf`` (each quantized element moved by
    tau, then by ``rest``: 0 for ``compress``); -1: out of memory."""
    cdef Py_ssize_t n
    cdef int failed
    if seg.kind == 0:
        return y2_compress_f32(seg.data, seg.stride, seg.start, seg.stop, <float>tau,
                               <float>rest, seg.base, buf)
    if seg.kind == 1:
        return y2_compress_f64(seg.data, seg.stride, seg.start, seg.stop, tau, rest, seg.base,
                               buf)
    if seg.kind == 2:
        return y2_compress_f80(seg.data, seg.stride, seg.start, seg.stop, <long double>tau,
                               <long double>rest, seg.base, buf)
    n = seg.stop
    failed = y2_reserve(buf, n)
    if not failed and n:
        memcpy(buf.p + buf.n, seg.data, n * sizeof(uint32_t))
        buf.n += n
    return failed


cdef struct CompressJob:
    Seg* segs
    y2_buf* bufs  # one per segment
    int* failed  # one per segment
    Py_ssize_t* offsets  # one per segment (where its words go in the output)
    double tau
    double rest


cdef void _compress_chunk(void* ctx, Py_ssize_t k) noexcept nogil:
    cdef CompressJob* job = <CompressJob*>ctx
    job.failed[k] = _run_seg(&job.segs[k], job.tau, job.rest, &job.bufs[k])


cdef struct GatherJob:
    y2_buf* bufs
    Py_ssize_t* offsets  # where each buffer's words go in out
    uint32_t* out


cdef void _gather_chunk(void* ctx, Py_ssize_t k) noexcept nogil:
    cdef GatherJob* job = <GatherJob*>ctx
    if job.bufs[k].n:
        memcpy(job.out + job.offsets[k], job.bufs[k].p, job.bufs[k].n * sizeof(uint32_t))


cdef class _Segments:
    """The segments of a compress call, each with its own word buffer (freed with it)."""
    cdef CompressJob job
    cdef Py_ssize_t count, capacity
    cdef list keep  # the arrays the segments point into

    def __cinit__(self, Py_ssize_t capacity, double tau, double rest=0.0):
        capacity = max(capacity, 1)
        self.job.segs = <Seg*>malloc(capacity * sizeof(Seg))
        self.job.bufs = <y2_buf*>calloc(capacity, sizeof(y2_buf))
        self.job.failed = <int*>calloc(capacity, sizeof(int))
        self.job.offsets = <Py_ssize_t*>calloc(capacity, sizeof(Py_ssize_t))
        if (self.job.segs == NULL or self.job.bufs == NULL or self.job.failed == NULL
                or self.job.offsets == NULL):
            raise MemoryError()
        self.job.tau = tau
        self.job.rest = rest
        self.count = 0
        self.capacity = capacity
        self.keep = []

    def __dealloc__(self):
        cdef Py_ssize_t k
        if self.job.bufs != NULL:
            for k in range(self.capacity):
                free(self.job.bufs[k].p)
        free(self.job.bufs)
        free(self.job.segs)
        free(self.job.failed)
        free(self.job.offsets)

    cdef Seg* add(self, cnp.ndarray arr, int kind, uint32_t base, Py_ssize_t chunk) except NULL:
        """Segments of at most ``chunk`` elements (0: one segment) over the 1-D ``arr`` of
        the dtype ``kind`` says (kind 5: native uint32 words, contiguous); the first one.
        Both, and room for the segments, are checked before any is written."""
        cdef Seg* first
        cdef Seg* seg
        cdef Py_ssize_t start = 0, size, need
        cdef int dtype = (cnp.NPY_FLOAT32, cnp.NPY_FLOAT64, cnp.NPY_LONGDOUBLE, -1, -1,
                          cnp.NPY_UINT32)[kind]
        if (cnp.PyArray_NDIM(arr) != 1 or cnp.PyArray_TYPE(arr) != dtype
                or not cnp.PyArray_ISNOTSWAPPED(arr)
                or (kind == 5 and not cnp.PyArray_ISCARRAY_RO(arr))):
            raise RuntimeError(f"y2: compress cannot take a {arr.dtype} array as kind {kind}")
        size = cnp.PyArray_DIM(arr, 0)
        need = 1 if chunk <= 0 or size == 0 else (size + chunk - 1) // chunk
        if need > self.capacity - self.count:
            raise RuntimeError(
                f"y2: {need} more segments, {self.capacity - self.count} of {self.capacity} free"
            )
        first = &self.job.segs[self.count]
        self.keep.append(arr)
        while True:
            seg = &self.job.segs[self.count]
            seg.data = <char*>cnp.PyArray_DATA(arr)
            seg.stride = cnp.PyArray_STRIDE(arr, 0) if kind != 5 else 4
            seg.kind = kind
            seg.base = base
            seg.start = start
            seg.stop = size if chunk <= 0 else min(start + chunk, size)
            self.count += 1
            start = seg.stop
            if start >= size:
                return first


cdef void _free_words(object capsule) noexcept:
    free(PyCapsule_GetPointer(capsule, NULL))


cdef object _take_words(y2_buf* buf):
    """A uint32 array that takes over ``buf``'s memory (no copy); ``buf`` is left empty."""
    cdef cnp.npy_intp n = buf.n
    cdef uint32_t* p
    if n == 0:
        return np.zeros(0, dtype=_U32)
    p = <uint32_t*>realloc(buf.p, n * sizeof(uint32_t))  # give back the unused capacity
    if p == NULL:
        p = buf.p
    buf.p = NULL
    buf.n = buf.cap = 0
    try:
        capsule = PyCapsule_New(p, NULL, <PyCapsule_Destructor>_free_words)
    except BaseException:
        free(p)
        raise
    arr = cnp.PyArray_SimpleNewFromData(1, &n, cnp.NPY_UINT32, p)
    cnp.set_array_base(arr, capsule)
    return arr


DEF ELEMENTS_PER_CHUNK = 131072
#: compress splits each array into segments of at most this many elements, taken in turn by
#: the threads ...
ELEMENT_CHUNK = ELEMENTS_PER_CHUNK
#: ... and with ``threads=None`` uses the available cores from this many elements.
AUTO_ELEMENTS = 1 << 20


cdef list _plain_items(object residuals, Py_ssize_t* total, Py_ssize_t* chunks,
                       bint* has_f32):
    """The ``(kind, array, base)`` items of a common model, checked in C: a list or tuple of
    at most MAX_LAYERS (weights, biases) tuples or lists of plain, writeable, native float32
    or float64 arrays, each addressable by a word.  None for anything else: then the shared
    checks decide (and name the fault).  Adds up the elements and segments."""
    cdef list items = []
    cdef cnp.ndarray a
    cdef Py_ssize_t k, j, size
    cdef int kind
    if type(residuals) is not list and type(residuals) is not tuple:
        return None
    if len(residuals) > MAX_LAYERS:
        return None
    for k in range(len(residuals)):
        pair = residuals[k]
        if (type(pair) is not tuple and type(pair) is not list) or len(pair) != 2:
            return None
        for j in range(2):  # weights (an even parameter index) first
            if type(pair[j]) is not np.ndarray:
                return None
            a = pair[j]
            kind = cnp.PyArray_TYPE(a)
            if kind != cnp.NPY_FLOAT32 and kind != cnp.NPY_FLOAT64:
                return None
            if not cnp.PyArray_ISNOTSWAPPED(a) or not cnp.PyArray_ISWRITEABLE(a):
                return None
            size = cnp.PyArray_SIZE(a)
            if size > MAX_ARRAY_SIZE:
                return None
            if size == 0:
                continue
            has_f32[0] |= kind == cnp.NPY_FLOAT32
            items.append((0 if kind == cnp.NPY_FLOAT32 else 1, a, (2 * k + j) << 22))
            total[0] += size
            chunks[0] += (size + ELEMENTS_PER_CHUNK - 1) // ELEMENTS_PER_CHUNK
    return items


def compress(residuals, tau, *, threads=None):
    """1-bit threshold quantization of a model's residuals, in place; the emitted words.

    ``threads=N`` lets up to N threads quantize segments of ``ELEMENT_CHUNK`` elements in
    parallel (the GIL is released); ``threads=None`` (the default) uses the available cores
    for models of at least ``AUTO_ELEMENTS`` elements.  The output does not depend on
    ``threads``; arrays sharing memory are always done in one thread, in order.
    """
    return _compress(residuals, tau, None, threads)


def compress_with_rest(residuals, threshold, rest, *, threads=None):
    """``compress`` at ``threshold`` with each quantized element then moved toward zero by
    ``rest`` too (rounded to its dtype), in the same pass: the residuals and words of
    ``compress(residuals, threshold)`` followed by ``apply(residuals, words ^ 1, rest)``.
    """
    return _compress(residuals, threshold, rest, threads)


cdef bint _plain_rest(object rest, bint has_f32, double* r):
    """A float ``rest`` that needs no shared check (>= 0, finite in every plain dtype)."""
    if type(rest) is not float:
        return False
    r[0] = rest
    return r[0] >= 0 and (r[0] <= FLT_MAX if has_f32 else r[0] <= DBL_MAX)


cdef object _compress(object residuals, object tau, object rest, object threads):
    """``compress`` (``rest`` None) and ``compress_with_rest``."""
    cdef double t, r = 0.0
    cdef Py_ssize_t total = 0, chunks = 0
    cdef bint has_f32 = False
    items = _plain_items(residuals, &total, &chunks, &has_f32)
    if items is not None:  # checked here; only tau (and the rest) are left
        t = _checks.tau_value(tau)
        nthreads = _checks.threads_value(threads)
        if has_f32 and not (t <= FLT_MAX and <float>t > 0):
            items = None  # the shared checks name the fault
        elif rest is not None and not _plain_rest(rest, has_f32, &r):
            items = None
    if items is None:
        layers = _checks.model(residuals, "residuals")
        t = _checks.tau_value(tau)
        nthreads = _checks.threads_value(threads)
        _checks.check_compressible(layers, t)
        if rest is not None:
            r = _checks.rest_value(rest, layers)
        items = []  # (kind, array, base) in output order
        total = chunks = 0
        for k, (weights, biases) in enumerate(layers):
            for a, base in ((weights, (2 * k) << 22), (biases, (2 * k + 1) << 22)):
                if a.size == 0:
                    continue
                kind = _float_kind(a.dtype)
                items.append((kind, a, base))
                if kind != 3:
                    total += a.size
                    chunks += (a.size + ELEMENT_CHUNK - 1) // ELEMENT_CHUNK
    cdef int want = _thread_count(nthreads, total, AUTO_ELEMENTS, chunks)
    if want > 1 and _overlapping([a for _kind, a, _base in items]):
        want = 1
    if want > 1:
        _wake_workers()  # they wake while the segments are set up
        return _compress_parallel(items, t, r, want, chunks + len(items))
    return _compress_serial(items, t, r)


cdef object _compress_serial(list items, double t, double r):
    """Item by item, in order, each written back before the next is read (arrays may share
    memory, as the reference allows)."""
    cdef _Segments segs = _Segments(1, t, r)
    cdef y2_buf* buf = &segs.job.bufs[0]
    cdef Seg* seg
    cdef int failed
    for kind, a, base in items:
        segs.count = 0
        segs.keep.clear()
        copied = False
        if kind == 3:
            words = _pure.compress_array(a, base, t, r)
            seg = segs.add(words, 5, 0, 0)
        else:
            flat, copied = _pure.flat_target(a)
            seg = segs.add(flat, kind, base, 0)
        with nogil:
            failed = _run_seg(seg, t, r, buf)
        if failed:
            raise MemoryError()
        if copied:
            a[...] = flat.reshape(a.shape)
    return _take_words(buf)


cdef object _compress_parallel(list items, double t, double r, int want,
                               Py_ssize_t capacity):
    """Segments of at most ``ELEMENT_CHUNK`` elements, quantized by up to ``want`` threads
    (no array shares memory with another: the order of the in-place updates does not
    matter) and their words joined in order."""
    cdef _Segments segs = _Segments(capacity, t, r)
    cdef Py_ssize_t k, count = 0
    writeback = []
    for kind, a, base in items:
        if kind == 3:  # float16 or byte-swapped: the NumPy path, here and now
            words = _pure.compress_array(a, base, t, r)
            segs.add(words, 5, 0, 0)
            continue
        flat, copied = _pure.flat_target(a)
        if copied:
            writeback.append((a, flat))
        segs.add(flat, kind, base, ELEMENTS_PER_CHUNK)
    with nogil:
        y2_run(_compress_chunk, &segs.job, segs.count, want)
    for a, flat in writeback:
        a[...] = flat.reshape(a.shape)
    # the segments' words, in order, copied by the same threads
    cdef GatherJob gather
    gather.offsets = segs.job.offsets
    for k in range(segs.count):
        if segs.job.failed[k]:
            raise MemoryError()
        gather.offsets[k] = count
        count += segs.job.bufs[k].n
    out = np.empty(count, dtype=_U32)
    gather.bufs = segs.job.bufs
    gather.out = <uint32_t*>cnp.PyArray_DATA(out)
    with nogil:
        y2_run(_gather_chunk, &gather, segs.count, want)
    return out


# --- the DDP hook's first pass: gradient (and momentum) into the residual, tau sample -----

cdef extern from *:
    """
    /* r += g (with momentum correction: u = u * m, then u += g and r += u), CHUNK elements
       at a time, and |r| of every `every`-th element (from the first) taken while its chunk
       is in cache: one pass over the arrays instead of NumPy's add, then a strided gather
       over the whole residual.  The product u * m is stored by a loop of its own, so that
       no compiler contracts it with the add (NumPy rounds it first).  Returns the samples
       written to out. */
    #if defined(__clang__)
    #pragma STDC FP_CONTRACT OFF
    #endif
    #if defined(_MSC_VER)
    #define Y2A_RESTRICT __restrict
    #else
    #define Y2A_RESTRICT restrict
    #endif
    #if defined(__GNUC__) || defined(__clang__)
    #define Y2A_NOINLINE __attribute__((noinline))  /* its own function: restrict holds */
    #else
    #define Y2A_NOINLINE
    #endif
    #include <math.h>
    #define Y2A_CHUNK 2048
    #define Y2A_ACCUMULATE(NAME, T, ABS, ATTR)                                             \\
        ATTR Y2A_NOINLINE static ptrdiff_t NAME(T *Y2A_RESTRICT r, const T *Y2A_RESTRICT g,\\
                              T *Y2A_RESTRICT u, T m, ptrdiff_t n, ptrdiff_t every,        \\
                              T *Y2A_RESTRICT out) {                                       \\
            ptrdiff_t i0, i1, k, next = 0, count = 0;                                      \\
            for (i0 = 0; i0 < n; i0 = i1) {                                                \\
                i1 = n - i0 > Y2A_CHUNK ? i0 + Y2A_CHUNK : n;                              \\
                if (u) {                                                                   \\
                    for (k = i0; k < i1; k++) u[k] = u[k] * m;                             \\
                    for (k = i0; k < i1; k++) {                                            \\
                        u[k] = u[k] + g[k];                                                \\
                        r[k] = r[k] + u[k];                                                \\
                    }                                                                      \\
                } else {                                                                   \\
                    for (k = i0; k < i1; k++) r[k] = r[k] + g[k];                          \\
                }                                                                          \\
                if (every)                                                                 \\
                    for (; next < i1; next += every) out[count++] = ABS(r[next]);          \\
            }                                                                              \\
            return count;                                                                  \\
        }
    Y2A_ACCUMULATE(y2_accumulate_f32_any, float, fabsf, )
    Y2A_ACCUMULATE(y2_accumulate_f64_any, double, fabs, )
    /* AVX2 (no FMA: nothing to contract) where the compress loops use it */
    #ifdef Y2_AVX2
    Y2A_ACCUMULATE(y2_accumulate_f32_avx2, float, fabsf, Y2_TARGET)
    Y2A_ACCUMULATE(y2_accumulate_f64_avx2, double, fabs, Y2_TARGET)
    #define Y2A_PICK(NAME) (y2_avx2 ? NAME##_avx2 : NAME##_any)
    #else
    #define Y2A_PICK(NAME) NAME##_any
    #endif
    static ptrdiff_t y2_accumulate_f32(float *r, const float *g, float *u, float m, ptrdiff_t n,
                                       ptrdiff_t every, float *out) {
        return Y2A_PICK(y2_accumulate_f32)(r, g, u, m, n, every, out);
    }
    static ptrdiff_t y2_accumulate_f64(double *r, const double *g, double *u, double m,
                                       ptrdiff_t n, ptrdiff_t every, double *out) {
        return Y2A_PICK(y2_accumulate_f64)(r, g, u, m, n, every, out);
    }
    """
    Py_ssize_t y2_accumulate_f32(float*, const float*, float*, float, Py_ssize_t, Py_ssize_t,
                                 float*) noexcept nogil
    Py_ssize_t y2_accumulate_f64(double*, const double*, double*, double, Py_ssize_t,
                                 Py_ssize_t, double*) noexcept nogil


cdef bint _plain_vector(cnp.ndarray a, int dtype):
    """A 1-D, contiguous, native array of ``dtype`` (the C loops' arrays)."""
    return (cnp.PyArray_NDIM(a) == 1 and cnp.PyArray_TYPE(a) == dtype
            and cnp.PyArray_ISNOTSWAPPED(a)
            and (cnp.PyArray_DIM(a, 0) < 2 or cnp.PyArray_STRIDE(a, 0) == cnp.PyArray_ITEMSIZE(a)))


def accumulate(residuals, gradients, every, velocity=None, momentum=0.0):
    """A step's gradients (with ``velocity``: through the momentum correction's velocity)
    into the residuals, in place, and ``|r|`` of every ``every``-th element of each array
    (the tau sample), in one pass; see ``wirekit.y2._pure.accumulate``.  Models whose
    arrays are not all 1-D, contiguous, native float32 (or all float64) arrays that share
    no memory take the NumPy path."""
    layers, grads, speeds, step, rate = _checks.accumulation(
        residuals, gradients, every, velocity, momentum
    )
    res = [a for pair in layers for a in pair]
    grd = [a for pair in grads for a in pair]
    spd = [a for pair in speeds for a in pair] if speeds is not None else []
    if not res:
        return _pure.accumulate(residuals, gradients, every, velocity, momentum)
    cdef int dtype = cnp.PyArray_TYPE(<cnp.ndarray>res[0])
    cdef cnp.ndarray a
    for a in res + grd + spd:
        if not _plain_vector(a, dtype) or (dtype != cnp.NPY_FLOAT32 and dtype != cnp.NPY_FLOAT64):
            return _pure.accumulate(residuals, gradients, every, velocity, momentum)
    if _overlapping(res + grd + spd):
        return _pure.accumulate(residuals, gradients, every, velocity, momentum)
    cdef Py_ssize_t total = 0, at = 0, n, k, every_ = step
    cdef double m = rate
    for a in res:
        n = cnp.PyArray_DIM(a, 0)
        if step and n:
            total += (n + step - 1) // step
    out = np.empty(total, dtype=res[0].dtype)
    cdef char* o = <char*>cnp.PyArray_DATA(out)
    cdef char* r
    cdef char* g
    cdef char* u
    for k in range(len(res)):
        n = cnp.PyArray_DIM(<cnp.ndarray>res[k], 0)
        if n == 0:
            continue
        r = <char*>cnp.PyArray_DATA(<cnp.ndarray>res[k])
        g = <char*>cnp.PyArray_DATA(<cnp.ndarray>grd[k])
        u = <char*>cnp.PyArray_DATA(<cnp.ndarray>spd[k]) if spd else NULL
        with nogil:
            if dtype == cnp.NPY_FLOAT32:
                at += y2_accumulate_f32(<float*>r, <const float*>g, <float*>u, <float>m, n,
                                        every_, <float*>o + at)
            else:
                at += y2_accumulate_f64(<double*>r, <const double*>g, <double*>u, m, n,
                                        every_, <double*>o + at)
    return out


# --- the DDP hook's sum blocks (wirekit.y2.sums): bitmap and packed codes ----------------

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define Y2S_CTZ(m) __builtin_ctz(m)
    #define Y2S_POPCOUNT(m) __builtin_popcount(m)
    #else
    static int y2s_ctz(unsigned int m) { int n = 0; while (!(m & 1u)) { m >>= 1; n++; } return n; }
    static int y2s_popcount(unsigned int m) { int n = 0; while (m) { m &= m - 1; n++; } return n; }
    #define Y2S_CTZ(m) y2s_ctz(m)
    #define Y2S_POPCOUNT(m) y2s_popcount(m)
    #endif
    """
    int Y2S_CTZ(unsigned int) noexcept nogil
    int Y2S_POPCOUNT(unsigned int) noexcept nogil


def bitmap_positions(bitmap, Py_ssize_t size):
    """The positions (int64, ascending) of the set bits among the first ``size`` bits of
    ``bitmap`` (uint8, least significant bit of each byte first; at least
    ``ceil(size / 8)`` bytes)."""
    cdef const uint8_t[::1] bits = np.ascontiguousarray(bitmap, dtype=np.uint8)
    cdef Py_ssize_t nbytes = (size + 7) // 8, i, total = 0, k = 0
    cdef unsigned int b, last = 0xFF
    if bits.shape[0] < nbytes:
        raise ValueError(f"{bits.shape[0]} bytes hold fewer than {size} bits")
    if size % 8:
        last = (1u << (size % 8)) - 1
    with nogil:
        for i in range(nbytes):
            b = bits[i] & (last if i == nbytes - 1 else 0xFF)
            total += Y2S_POPCOUNT(b)
    out = np.empty(total, np.int64)
    cdef int64_t[::1] o = out
    with nogil:
        for i in range(nbytes):
            b = bits[i] & (last if i == nbytes - 1 else 0xFF)
            while b:
                o[k] = (i << 3) + Y2S_CTZ(b)
                k += 1
                b &= b - 1
    return out


def read_fields(data, Py_ssize_t lead, Py_ssize_t count, int width):
    """``count`` unsigned fields of ``width`` bits (1 to 56) from bit ``lead`` of ``data``
    on (uint8, least significant bit of each byte first), as int64."""
    cdef const uint8_t[::1] d = np.ascontiguousarray(data, dtype=np.uint8)
    cdef Py_ssize_t i, j, off, first, stop
    cdef uint64_t v, mask
    if not 1 <= width <= 56:
        raise ValueError(f"fields of {width} bits: 1 to 56 only")
    if lead < 0 or count < 0 or (lead + count * width + 7) // 8 > d.shape[0]:
        raise ValueError(f"{count} fields of {width} bits from bit {lead} beyond the data")
    out = np.empty(count, np.int64)
    cdef int64_t[::1] o = out
    mask = (<uint64_t>1 << width) - 1
    with nogil:
        for i in range(count):
            off = lead + i * width
            first = off >> 3
            stop = (off + width + 7) >> 3
            v = 0
            for j in range(first, stop):
                v |= (<uint64_t>d[j]) << (8 * (j - first))
            o[i] = <int64_t>((v >> (off & 7)) & mask)
    return out


# --- the DDP hook's owner of a range: words summed and coded; a sums block into the update --

cdef extern from *:
    """
    /* The width-bit field (at most 56) at bit off of d (limit bytes), least significant bit
       first: one 8-byte load where 8 bytes are there. */
    #if defined(__GNUC__) || defined(__clang__)
    #define Y2S_INLINE static inline __attribute__((always_inline))
    #else
    #define Y2S_INLINE static inline
    #endif
    Y2S_INLINE uint64_t y2s_field(const uint8_t *d, ptrdiff_t limit, ptrdiff_t off,
                                  ptrdiff_t width, uint64_t mask) {
        ptrdiff_t first = off >> 3, stop = (off + width + 7) >> 3, j;
        uint64_t v = 0;
        if (first + 8 <= limit) {
            memcpy(&v, d + first, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            v = __builtin_bswap64(v);
    #endif
        } else {
            for (j = first; j < stop; j++) v |= (uint64_t)d[j] << (8 * (j - first));
        }
        return (v >> (off & 7)) & mask;
    }
    /* 8 bytes of a bitmap as one word, its bit i the bitmap's bit i. */
    Y2S_INLINE uint64_t y2s_load64(const uint8_t *d) {
        uint64_t v;
        memcpy(&v, d, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        return v;
    }
    #if defined(__GNUC__) || defined(__clang__)
    #define Y2S_CTZ64(m) __builtin_ctzll(m)
    #define Y2S_POPCOUNT64(m) __builtin_popcountll(m)
    #else
    static int y2s_ctz64(unsigned long long m) { int n = 0; while (!(m & 1ull)) { m >>= 1; n++; } return n; }
    #define Y2S_CTZ64(m) y2s_ctz64(m)
    static int y2s_popcount64(unsigned long long m) { int n = 0; while (m) { m &= m - 1; n++; } return n; }
    #define Y2S_POPCOUNT64(m) y2s_popcount64(m)
    #endif
    """
    uint64_t _field "y2s_field" (const uint8_t*, Py_ssize_t, Py_ssize_t, Py_ssize_t,
                                 uint64_t) noexcept nogil
    uint64_t _load64 "y2s_load64" (const uint8_t*) noexcept nogil
    int Y2S_CTZ64(unsigned long long) noexcept nogil
    int Y2S_POPCOUNT64(unsigned long long) noexcept nogil

DEF SUMS_HEADER = 4
DEF SUM_CHUNK = 8192  # elements summed at a time by sum_range (a 64 KB accumulator)


cdef inline int64_t _nearest(const double* table, Py_ssize_t levels, double size) noexcept nogil:
    """``wirekit.y2.sums.quantize`` of one magnitude ``size``: the index (0 to ``levels``)
    of the nearest magnitude, computed as NumPy computes it there."""
    # np.searchsorted(table, size), branch-free: ``a`` with table[a - 1] < size <= table[a]
    cdef const double* base = table
    cdef Py_ssize_t n = levels, half, a
    cdef double lower, upper
    while n > 1:
        half = n >> 1
        base = base + half if base[half - 1] < size else base
        n -= half
    a = (base - table) + (base[0] < size)
    lower = table[a - 1] if a > 0 else 0.0
    upper = table[a] if a < levels else table[levels - 1]
    if size - lower <= upper - size:
        return a
    return a + 1 if a + 1 <= levels else levels


def word_positions(words, slot_start, slot_size, str field):
    """Where in a bucket's buffer each word's element is (int64): ``slot_start[p] + index``
    for a word of parameter ``p`` (its top 10 bits), when ``index < slot_size[p]``.

    :class:`DecodeError` (``field[i]``, byte ``4 i``) for the first word that addresses no
    element of the bucket.
    """
    cdef const uint32_t[::1] w = np.ascontiguousarray(words, dtype=np.uint32)
    cdef const int64_t[::1] starts = np.ascontiguousarray(slot_start, dtype=np.int64)
    cdef const int64_t[::1] sizes = np.ascontiguousarray(slot_size, dtype=np.int64)
    cdef Py_ssize_t n = w.shape[0], nslots = sizes.shape[0], i, bad = -1
    cdef uint32_t x, s, index
    if starts.shape[0] != nslots:
        raise ValueError(f"y2: {starts.shape[0]} slot starts for {nslots} slot sizes")
    out = np.empty(n, np.int64)
    cdef int64_t[::1] o = out
    with nogil:
        for i in range(n):
            x = w[i]
            s = x >> 22
            index = (x >> 1) & INDEX_MASK
            if s >= nslots or index >= sizes[s]:
                bad = i
                break
            o[i] = starts[s] + index
    if bad >= 0:
        raise _checks.unaddressed_word(field, bad, w[bad])
    return out


def sum_range(received, weights, slot_start, slot_size, Py_ssize_t lo, Py_ssize_t hi, table,
              double unit, Py_ssize_t most=-1, scratch=None):
    """The owner of the buffer's range ``lo:hi`` sums every rank's words there and codes
    the sums: ``(block, left_at, left, wanted)`` (``wirekit.y2._pure.sum_range``).

    One pass over each rank's words (checked, rank by rank, as the pure twin checks them),
    one pass adding them into an accumulator, a few thousand elements at a time and rank
    after rank there (each element's words added in rank order), while marking the
    elements in a bitmap, one walk of that bitmap (each nonzero sum, in element order,
    rounded to the nearest magnitude of ``table``, its accumulator element zeroed again),
    one pass over the nonzero sums
    (the residual's part, the bitmap and the codes written into the block): nothing runs
    over the whole range but the bitmaps.  Only the cap of ``most`` codes, when a step
    wants more, sorts with NumPy.  ``scratch``: float64 zeros, at least ``min(hi - lo,
    8192)`` of them, used as the accumulator and left zeros (a caller that calls again
    keeps one; None: a new one).
    """
    cdef list ranks = list(received)
    cdef const double[::1] wt = np.ascontiguousarray(weights, dtype=np.float64)
    cdef const int64_t[::1] starts = np.ascontiguousarray(slot_start, dtype=np.int64)
    cdef const int64_t[::1] sizes = np.ascontiguousarray(slot_size, dtype=np.int64)
    cdef const double[::1] tab = np.ascontiguousarray(table, dtype=np.float64)
    _checks.sum_range_args(len(ranks), wt.shape[0], starts.shape[0], sizes.shape[0], lo, hi)
    _checks.table_args(tab.shape[0])
    cdef Py_ssize_t levels = tab.shape[0], width = _checks.code_bits(levels)
    cdef Py_ssize_t world = len(ranks), nslots = sizes.shape[0], nwords = 0, r, i, n, at
    cdef Py_ssize_t bad_address, bad_order
    cdef int64_t p, prev, bad_position
    cdef uint32_t x, s, index
    cdef double weight
    cdef list arrays = []
    for rank_words in ranks:
        words = np.ascontiguousarray(rank_words, dtype=np.uint32)
        arrays.append(words)
        nwords += words.shape[0]
    # every rank's words as buffer positions and signed weights, one run per rank
    all_positions = np.empty(nwords + 1, np.int64)  # and a sentinel for the merge
    all_values = np.empty(nwords + 1, np.float64)
    ends = np.empty(world + 1, np.int64)
    cdef int64_t[::1] ap = all_positions
    cdef double[::1] av = all_values
    cdef int64_t[::1] run_end = ends
    cdef const uint32_t[::1] w
    at = 0
    run_end[0] = 0
    for r in range(world):
        w = arrays[r]
        n = w.shape[0]
        weight = wt[r]
        bad_address = bad_order = -1
        bad_position = 0
        prev = 0
        with nogil:
            for i in range(n):
                x = w[i]
                s = x >> 22
                index = (x >> 1) & INDEX_MASK
                if s >= nslots or index >= sizes[s]:
                    bad_address = i  # a rank's unaddressed word comes before its order
                    break
                p = starts[s] + index
                if bad_order < 0 and (p < lo or p >= hi or (i > 0 and p <= prev)):
                    bad_order, bad_position = i, p
                ap[at + i] = p
                av[at + i] = weight if x & 1 else -weight
                prev = p
        if bad_address >= 0:
            raise _checks.unaddressed_word(f"rank[{r}].words", bad_address, w[bad_address])
        if bad_order >= 0:
            raise _checks.word_out_of_order(r, bad_order, bad_position, lo, hi)
        at += n
        run_end[r + 1] = at
    ap[nwords], av[nwords] = -1, 0.0
    cdef Py_ssize_t room = min(hi - lo, SUM_CHUNK)
    if scratch is None:
        scratch = np.zeros(room, np.float64)
    if not (isinstance(scratch, np.ndarray) and scratch.dtype == _F64 and scratch.ndim == 1
            and scratch.flags.c_contiguous and scratch.flags.writeable
            and scratch.shape[0] >= room):
        raise ValueError(f"y2: scratch must be {room} or more contiguous float64 zeros")
    return _code_sums(ap, av, run_end, world, hi - lo, nwords, lo, tab, levels, width, unit,
                      most, scratch)


cdef tuple _code_sums(const int64_t[::1] ap, const double[::1] av, const int64_t[::1] run_end,
                      Py_ssize_t world, Py_ssize_t m, Py_ssize_t nwords, Py_ssize_t lo,
                      const double[::1] tab, Py_ssize_t levels, Py_ssize_t width, double unit,
                      Py_ssize_t most, object scratch):
    """:func:`sum_range` after the words' checks: the ranks' runs of ascending positions
    ``ap`` (values ``av``) added into ``scratch`` (zeros, left zeros) rank after rank, the
    range's nonzero sums read back in element order, rounded, capped and coded into a
    block; the residual's part."""
    positions = np.empty(nwords, np.int64)
    sums = np.empty(nwords, np.float64)
    codes = np.empty(nwords, np.int64)
    touched_array = np.zeros(SUM_CHUNK // 64, np.uint64)
    heads_array = np.array(run_end[:world], np.int64)
    cdef int64_t[::1] heads = heads_array
    cdef uint64_t[::1] touched = touched_array
    cdef double[::1] acc = scratch
    cdef int64_t[::1] pos = positions
    cdef double[::1] sm = sums
    cdef int64_t[::1] cd = codes
    cdef Py_ssize_t k = 0, marked = 0, i, q, nl = 0, kept, off, j, nb, r, h, end, first, last
    cdef uint64_t v, word
    cdef int64_t c, p
    cdef double total, value, rest, size
    cdef uint64_t bits
    cdef uint64_t memo_key[256]
    cdef int64_t memo_code[256]
    for i in range(256):
        memo_key[i] = 0  # the bits of +0.0: a magnitude never looked up
    with nogil:
        # SUM_CHUNK elements at a time (their accumulator stays in cache): each rank's words
        # there added in rank order from 0.0 (each rank's positions ascend), the sum the
        # pure twin makes (never -0.0: its + 0.0 are no-ops); then the chunk's marked
        # elements read back in element order and their accumulator zeroed again
        for first in range(0, m, SUM_CHUNK):
            last = min(first + SUM_CHUNK, m)
            for r in range(world):
                h = heads[r]
                end = run_end[r + 1]
                while h < end and ap[h] - lo < last:
                    q = ap[h] - lo - first
                    acc[q] += av[h]
                    touched[q >> 6] |= (<uint64_t>1) << (q & 63)
                    h += 1
                heads[r] = h
            for i in range((last - first + 63) >> 6):
                word = touched[i]
                touched[i] = 0
                while word:
                    q = (i << 6) + Y2S_CTZ64(word)
                    word &= word - 1
                    total = acc[q]
                    acc[q] = 0.0
                    if total != 0.0:
                        # the sums are few values (sums of the ranks' ± weights): each
                        # magnitude's code is looked up once, then remembered
                        size = total if total > 0 else -total
                        memcpy(&bits, &size, 8)
                        slot = <Py_ssize_t>((bits * <uint64_t>0x9E3779B97F4A7C15) >> 56)
                        if memo_key[slot] == bits:
                            c = memo_code[slot]
                        else:
                            c = _nearest(&tab[0], levels, size)
                            memo_key[slot], memo_code[slot] = bits, c
                        pos[k], sm[k] = first + q, total
                        cd[k] = c if total > 0 else -c
                        marked += c != 0
                        k += 1
    if 0 <= most < marked:  # beyond the block: the smallest wait (ties in element order)
        chosen = np.flatnonzero(codes[:k])
        smallest = np.argsort(np.abs(sums[chosen]), kind="stable")[: marked - most]
        codes[chosen[smallest]] = 0
    kept = min(marked, most) if most >= 0 else marked
    left_at = np.empty(k, np.int64)
    left = np.empty(k, np.float64)
    block = np.zeros(SUMS_HEADER + (m + kept * width + 7) // 8, np.uint8)
    cdef int64_t[::1] la = left_at
    cdef double[::1] lv = left
    cdef uint8_t[::1] out = block
    cdef uint8_t* bitmap = &out[0] + SUMS_HEADER
    out[0], out[1], out[2], out[3] = kept & 0xFF, (kept >> 8) & 0xFF, (kept >> 16) & 0xFF, kept >> 24
    j = 0
    with nogil:
        for i in range(k):
            c = cd[i]
            value = 0.0
            if c > 0:
                value = tab[c - 1]
            elif c < 0:
                value = -tab[-c - 1]
            rest = sm[i] - value
            if rest != 0.0:
                la[nl], lv[nl] = lo + pos[i], rest * unit
                nl += 1
            if c == 0:
                continue
            q = pos[i]
            bitmap[q >> 3] |= <uint8_t>(1 << (q & 7))
            v = <uint64_t>(c + levels if c < 0 else c + levels - 1)
            off = m + j * width
            v <<= off & 7
            for nb in range((off >> 3), (off + width + 7) >> 3):
                bitmap[nb] |= <uint8_t>(v & 0xFF)
                v >>= 8
            j += 1
    return block, left_at[:nl], left[:nl], marked


def sums_into(out, Py_ssize_t start, block, Py_ssize_t size, Py_ssize_t count, table,
              double scale, str field, bint zero_rest=False):
    """Write the sums of a block of ``size`` elements into ``out[start:start + size]``
    (``wirekit.y2._pure.sums_into``): the bitmap's bits counted and every code checked
    before one pass writes the values (float32 and float64 updates; others by NumPy),
    each from a table of the ``2 levels`` values a code can stand for; with ``zero_rest``
    the range's other elements are set to 0 in the same pass, 64 elements at a time."""
    cdef const double[::1] tab = np.ascontiguousarray(table, dtype=np.float64)
    cdef Py_ssize_t levels = tab.shape[0]
    _checks.table_args(levels)
    _checks.update_span(start, size, out.shape[0])
    cdef Py_ssize_t width = _checks.code_bits(levels)
    if not (isinstance(out, np.ndarray) and out.ndim == 1 and out.flags.c_contiguous
            and out.flags.writeable and out.dtype in (_F32, _F64)):
        return _pure.sums_into(out, start, block, size, count, table, scale, field, zero_rest)
    cdef const uint8_t[::1] data = np.ascontiguousarray(block, dtype=np.uint8)
    if count < 0 or data.shape[0] < SUMS_HEADER + (size + count * width + 7) // 8:
        raise ValueError(f"y2: {data.shape[0]} bytes hold no block of {count} sums")
    cdef const uint8_t* bitmap = &data[0] + SUMS_HEADER
    cdef Py_ssize_t limit = data.shape[0] - SUMS_HEADER
    cdef Py_ssize_t nbytes = (size + 7) // 8, i, j, marked = 0, bad = -1, q, base, e, stop
    cdef unsigned int b, last = 0xFF
    cdef uint64_t v, word, mask = ((<uint64_t>1) << width) - 1, top = 2 * levels
    cdef int64_t c
    if size % 8:
        last = (1u << (size % 8)) - 1
    with nogil:
        for i in range(size >> 6):
            marked += Y2S_POPCOUNT64(_load64(bitmap + 8 * i))
        for i in range((size >> 6) * 8, nbytes):
            marked += Y2S_POPCOUNT(bitmap[i] & (last if i == nbytes - 1 else 0xFF))
        if marked == count and <uint64_t>top < ((<uint64_t>1) << width):  # else none is
            for i in range(count):
                v = _field(bitmap, limit, size + i * width, width, mask)
                if v >= top:
                    bad = i
                    break
    if marked != count:
        raise _checks.bitmap_count_error(field, marked, count)
    if bad >= 0:
        v = _field(bitmap, limit, size + bad * width, width, mask)
        raise _checks.code_beyond_error(field, SUMS_HEADER + (size + bad * width) // 8, v, levels)
    # what each code stands for: code c - levels for c < levels, c - levels + 1 after
    values_array = np.empty(2 * levels, np.float64)
    cdef double[::1] vals = values_array
    for i in range(levels):
        vals[i] = -tab[levels - 1 - i] * scale
        vals[levels + i] = tab[i] * scale
    cdef float[::1] o32
    cdef double[::1] o64
    cdef bint single = out.dtype == _F32
    if single:
        o32 = out
    else:
        o64 = out
    j = 0
    with nogil:
        for i in range((size + 63) >> 6):  # 64 elements of the range (the bitmap's bits) a time
            base = i << 6
            if base + 64 <= size:
                word = _load64(bitmap + 8 * i)
            else:  # the bitmap's last bytes
                word = 0
                for e in range(nbytes - (base >> 3)):
                    word |= (<uint64_t>bitmap[(base >> 3) + e]) << (8 * e)
                word &= ((<uint64_t>1) << (size - base)) - 1
            if zero_rest:
                stop = min(base + 64, size)
                if single:
                    for e in range(start + base, start + stop):
                        o32[e] = 0.0
                else:
                    for e in range(start + base, start + stop):
                        o64[e] = 0.0
            while word:
                q = start + base + Y2S_CTZ64(word)
                word &= word - 1
                c = <int64_t>_field(bitmap, limit, size + j * width, width, mask)
                j += 1
                if single:
                    o32[q] = <float>vals[c]
                else:
                    o64[q] = vals[c]
