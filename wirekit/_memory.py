"""Memory hygiene of the long-running servers (``wirekit mip serve``, ``wirekit serve``):
memory their connections gave back goes back to the system.

Two things keep it otherwise, both measured with clients that send tens of MiB and close:

* glibc's ``malloc`` maps a big allocation on its own and unmaps it when freed, but after
  the first such free it raises its threshold to that size (up to 32 MiB), so the next
  buffers of that size come from the heap and stay there after use: the process's RSS stays
  at its peak.  :func:`return_freed_buffers` fixes the threshold at :data:`MMAP_THRESHOLD`.
* Smaller buffers (a read, a 512 KiB request of empty items) and small objects come from
  the heap, which glibc gives back only from its top: freed pages in the middle stay.
  :class:`MemoryReturn` runs ``malloc_trim`` once connections that held
  :data:`RETURN_AFTER` bytes or more in total have ended.

(The pure MIP codec frees the reference cycles construct leaves after a big message itself:
``wirekit.mip._pure.encode``.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

#: Allocations of at least this many bytes get a mapping of their own (unmapped when freed).
MMAP_THRESHOLD = 1 << 20
#: Memory goes back to the system once connections that held this many bytes have ended.
RETURN_AFTER = 32 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):  # not glibc (musl has neither)
        return None
    return libc


def return_freed_buffers() -> bool:
    """Make freed big buffers go back to the system at once (glibc: fix ``malloc``'s mmap
    threshold at :data:`MMAP_THRESHOLD`).  Returns whether it could (False elsewhere)."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


class MemoryReturn:
    """Gives memory back to the system (glibc's ``malloc_trim``) once connections that held
    :data:`RETURN_AFTER` bytes have ended."""

    __slots__ = ("freed", "libc")

    def __init__(self) -> None:
        self.libc = _glibc()
        self.freed = 0

    def released(self, held: int) -> None:
        """A connection that held ``held`` bytes ended."""
        if held <= 0:
            return
        self.freed += held
        if self.freed >= RETURN_AFTER:
            self.freed = 0
            if self.libc is not None:
                self.libc.malloc_trim(0)


__all__ = ["MMAP_THRESHOLD", "RETURN_AFTER", "MemoryReturn", "return_freed_buffers"]
