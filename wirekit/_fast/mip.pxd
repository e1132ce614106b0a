# What the MIP codec's Cython twin shares with the runtimes' compiled parts
# (wirekit._fast.mipnet, wirekit._fast.servelane, wirekit._fast.mipconn): the one frame check,
# the one header rule with its errors, and the one decoder.

from libc.stdint cimport uint8_t

cdef Py_ssize_t _frame_ok(const uint8_t* base, Py_ssize_t size, Py_ssize_t pos,
                          Py_ssize_t max_size) noexcept nogil
cdef int _header_fault(const uint8_t* h) noexcept nogil
cdef object _header_error(const uint8_t* h, Py_ssize_t pos, int fault)
cdef object _decode(object buf, Py_ssize_t pos, Py_ssize_t max_items, bint whole)
