# Little-endian integer reads and writes on raw bytes, shared by the Cython twins that cimport
# them (wirekit._fast.clipper, wirekit._fast.clippercontainer).

from libc.stdint cimport uint8_t, uint32_t, uint64_t


cdef inline uint32_t _rd32(const uint8_t* p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint64_t _rd64(const uint8_t* p) noexcept nogil:
    return <uint64_t>_rd32(p) | (<uint64_t>_rd32(p + 4) << 32)


cdef inline void _put32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = v >> 24


cdef inline void _put64(uint8_t* p, uint64_t v) noexcept nogil:
    _put32(p, <uint32_t>v)
    _put32(p + 4, <uint32_t>(v >> 32))
