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

/* Sum n bytes as 64-bit words (the tail byte by byte): every byte is read once. */
static uint64_t sum_bytes(const unsigned char *p, size_t n) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, w[4];
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        memcpy(w, p + i, 32);
        a0 += w[0]; a1 += w[1]; a2 += w[2]; a3 += w[3];
    }
    for (; i < n; i++) a0 += p[i];
    return a0 + a1 + a2 + a3;
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
