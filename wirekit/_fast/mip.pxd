# What the MIP codec's Cython twin shares with the runtimes' compiled lanes
# (wirekit._fast.mipnet, wirekit._fast.servelane): the one frame check.

from libc.stdint cimport uint8_t

cdef Py_ssize_t _frame_ok(const uint8_t* base, Py_ssize_t size, Py_ssize_t pos,
                          Py_ssize_t max_size) noexcept nogil
