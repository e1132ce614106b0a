"""The memory bound of a kernel: a plain C copy of the same traffic, for the benchmark tables.

A kernel that reads R bytes and writes W bytes cannot beat a loop that only moves those
bytes: ``copy_traffic(src, dst)`` copies ``min(R, W)`` bytes from ``src`` to ``dst``
(``memcpy``), then reads the rest of ``src`` (a streaming sum, vectorized) or fills the rest
of ``dst``.  ``read_once(arrays)`` is the streaming sum alone: the time one core needs to
read the arrays, the bound of a kernel that reads everything and writes almost nothing
(``compress``).

The C source below is compiled once per process with the C compiler Python was built with
(``-O3 -march=native``; the Cython twins need one too) and loaded with ctypes.  Not part of
wirekit: only the benchmarks use it.
"""

from __future__ import annotations

import ctypes
import shlex
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

_SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

/* Sum n bytes as 64-bit words (the tail byte by byte): every byte is read once, two cache
   lines per step into four vector accumulators, with a software prefetch a few KB ahead as
   wirekit's compress does (the hardware prefetcher alone leaves read bandwidth unused). */
static uint64_t sum_bytes(const unsigned char *p, size_t n) {
    size_t i = 0;
    uint64_t total = 0;
#ifdef __AVX2__
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    uint64_t lanes[4];
    for (; i + 128 <= n; i += 128) {
        _mm_prefetch((const char *)p + i + 6144, _MM_HINT_T0);
        _mm_prefetch((const char *)p + i + 6144 + 64, _MM_HINT_T0);
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    _mm256_storeu_si256((__m256i *)lanes,
                        _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    total = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#endif
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        total += w;
    }
    for (; i < n; i++) total += p[i];
    return total;
}

uint64_t copy_traffic(const unsigned char *src, size_t nread, unsigned char *dst,
                      size_t nwrite) {
    size_t both = nread < nwrite ? nread : nwrite;
    memcpy(dst, src, both);
    if (nwrite > both) memset(dst + both, 0x5a, nwrite - both);
    return sum_bytes(src + both, nread - both) + (both ? dst[both - 1] : 0);
}

uint64_t read_once(const unsigned char *src, size_t n) { return sum_bytes(src, n); }
"""

_lib: ctypes.CDLL | None = None


def _build() -> ctypes.CDLL:
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    out = Path(tempfile.mkdtemp(prefix="wirekit-membound-"))
    src = out / "membound.c"
    src.write_text(_SOURCE)
    lib = out / "membound.so"
    for flags in (["-O3", "-march=native"], ["-O3"]):
        proc = subprocess.run(
            [*cc, *flags, "-shared", "-fPIC", "-o", str(lib), str(src)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode == 0:
            break
    else:
        raise RuntimeError(f"membound: the C compiler failed: {proc.stderr.strip()}")
    dll = ctypes.CDLL(str(lib))
    dll.copy_traffic.restype = ctypes.c_uint64
    dll.copy_traffic.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
    dll.read_once.restype = ctypes.c_uint64
    dll.read_once.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return dll


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        _lib = _build()
    return _lib


def copy_traffic(src: np.ndarray, dst: np.ndarray) -> int:
    """Read all of ``src`` and write all of ``dst`` (contiguous arrays), as a copy would."""
    assert src.flags.c_contiguous and dst.flags.c_contiguous and dst.flags.writeable
    return int(_library().copy_traffic(src.ctypes.data, src.nbytes, dst.ctypes.data, dst.nbytes))


def read_once(arrays: Iterable[np.ndarray]) -> int:
    """Read every byte of the (contiguous) arrays once."""
    lib = _library()
    total = 0
    for a in arrays:
        assert a.flags.c_contiguous
        total += int(lib.read_once(a.ctypes.data, a.nbytes))
    return total
