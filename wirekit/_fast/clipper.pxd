# What the Clipper codec's Cython twin shares with the container lane
# (wirekit._fast.clippercontainer).

from libc.stdint cimport uint32_t

cdef object _new_request(uint32_t msg_id, int itype, object inputs)
