# What the Clipper codec's Cython twin shares with the runtimes' lanes
# (wirekit._fast.clippercontainer, wirekit._fast.clipperfront).

from libc.stdint cimport uint32_t

cdef object _new_request(uint32_t msg_id, int itype, object inputs)
cdef bint _fast_array(object x, int nd, int itype)
