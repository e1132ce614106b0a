# The socket-handle level of wirekit._fast.zio, for other Cython twins (the Clipper container
# lane) that move messages without a Python call per message.  bind() must have succeeded
# (_handle and _zmq_calls raise otherwise).

from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


cdef inline double _now() noexcept nogil:
    """The clock ``time.monotonic`` reads, in seconds."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


ctypedef struct zmq_msg_t:
    void *_[8]  # libzmq's zmq_msg_t: 64 opaque bytes, pointer-aligned

ctypedef int (*msg_init_f)(zmq_msg_t *) noexcept nogil
ctypedef int (*msg_init_size_f)(zmq_msg_t *, size_t) noexcept nogil
ctypedef int (*msg_io_f)(zmq_msg_t *, void *, int) noexcept nogil
ctypedef int (*msg_close_f)(zmq_msg_t *) noexcept nogil
ctypedef int (*msg_move_f)(zmq_msg_t *, zmq_msg_t *) noexcept nogil
ctypedef void *(*msg_data_f)(zmq_msg_t *) noexcept nogil
ctypedef size_t (*msg_size_f)(const zmq_msg_t *) noexcept nogil
ctypedef int (*msg_more_f)(const zmq_msg_t *) noexcept nogil
ctypedef int (*msg_get_f)(const zmq_msg_t *, int) noexcept nogil
ctypedef int (*errno_f)() noexcept nogil
ctypedef void (*version_f)(int *, int *, int *) noexcept nogil

ctypedef struct ZmqCalls:
    msg_init_f init
    msg_init_size_f init_size
    msg_close_f close
    msg_data_f data
    msg_size_f size
    msg_more_f more
    msg_get_f get

cdef void *_handle(sock) except NULL
cdef const ZmqCalls *_zmq_calls() except NULL
cdef int _recv_part(zmq_msg_t *msg, void *handle, bint block, double spin=*) except -2
cdef object _recv_on(void *handle, bint block, bint with_fd, double spin)
cdef int _send_on(void *handle, object frames, int flags) except -1
cdef int _send_msg(void *handle, zmq_msg_t *msg, int part_flags, bint block) except -1


cdef class Received:
    # One multipart message as libzmq received it: ``count`` parts, kept as libzmq's (no
    # ``bytes`` made) until ``close`` or the next ``read``.
    cdef zmq_msg_t *parts
    cdef Py_ssize_t count, cap
    cdef const ZmqCalls *z
    cdef int read(self, void *handle, bint block, double spin) except -2
    cdef void close(self) noexcept
    cdef list frames(self)
    cdef int source_fd(self) noexcept


cdef inline const unsigned char *part_data(Received m, Py_ssize_t i) noexcept:
    """Where part ``i`` of ``m`` starts (valid until ``m`` is closed)."""
    return <const unsigned char *>m.z.data(&m.parts[i])


cdef inline size_t part_size(Received m, Py_ssize_t i) noexcept:
    return m.z.size(&m.parts[i])


cdef unsigned char *_new_part(zmq_msg_t *msg, size_t size) except NULL
