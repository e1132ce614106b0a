# The socket-handle level of wirekit._fast.zio, for other Cython twins (the Clipper container
# lane) that move messages without a Python call per message.  bind() must have succeeded.

cdef void *_handle(sock) except NULL
cdef object _recv_on(void *handle, bint block, bint with_fd, double spin)
cdef int _send_on(void *handle, object frames, int flags) except -1
