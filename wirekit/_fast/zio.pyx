# cython: language_level=3, boundscheck=False, wraparound=False
"""Multipart ZeroMQ send/receive straight on libzmq: the Cython twin of ``wirekit.clipper._zio``.

pyzmq releases the GIL around every ``zmq_msg_send``/``zmq_msg_recv`` and builds a Frame object
per received part; for a Clipper message (one frame per input) that is most of a round trip's
CPU, and every GIL release may hand the interpreter to another thread.  This module calls the
very libzmq that pyzmq loaded, so the socket handles are the same objects, through function
pointers looked up with ``dlsym`` through pyzmq's own compiled backend module (``dlopen`` of it
with ``RTLD_NOLOAD``: the symbols of that module's libzmq, whatever file it is): a whole message moves with the GIL held, and the GIL
is released only to *wait* (a blocking receive with nothing queued, a send held back by the
high-water mark).  Same frames on the wire, same blocking and timeout behaviour (``RCVTIMEO``,
``SNDTIMEO``) as pyzmq's calls.

:func:`bind` must succeed before anything else is used; the pure twin is used otherwise
(``wirekit.clipper._zio`` says so with a ``FastPathMissing`` warning).

Why not link against libzmq at build time, with pyzmq's ``libzmq.pxd``: the pyzmq wheels ship
that ``.pxd`` but not ``zmq.h`` it includes (``zmq.get_includes()`` has no ``zmq.h``), and
their libzmq is a private copy (``pyzmq.libs/libzmq-<hash>.so``) whose file name changes with
every wheel: a build linked to it breaks when pyzmq is upgraded, and one linked to a system
libzmq would be a second libzmq beside pyzmq's, which must not be handed pyzmq's sockets.
Looking the functions up in the library pyzmq loaded serves every install of pyzmq.
"""

from cpython.buffer cimport (
    PyBUF_SIMPLE,
    PyBuffer_Release,
    PyObject_CheckBuffer,
    PyObject_GetBuffer,
)
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.errno cimport EAGAIN, EINTR
from libc.string cimport memcpy
from posix.dlfcn cimport RTLD_NOW, dlopen, dlsym

import zmq


cdef extern from "<dlfcn.h>":
    int RTLD_NOLOAD

cdef extern from "<sched.h>" nogil:
    int sched_yield()


cdef msg_init_f z_init = NULL
cdef msg_init_size_f z_init_size = NULL
cdef msg_io_f z_recv = NULL
cdef msg_io_f z_send = NULL
cdef msg_close_f z_close = NULL
cdef msg_move_f z_move = NULL
cdef msg_data_f z_data = NULL
cdef msg_size_f z_size = NULL
cdef msg_more_f z_more = NULL
cdef msg_get_f z_get = NULL
cdef errno_f z_errno = NULL

DEF ZMQ_DONTWAIT = 1
DEF ZMQ_SNDMORE = 2
DEF ZMQ_SRCFD = 2

cdef bint _bound = False
cdef ZmqCalls _calls


cdef void *_sym(void *lib, const char *name) except NULL:
    cdef void *found = dlsym(lib, name)
    if found == NULL:
        raise ImportError(f"libzmq has no {name.decode()}")
    return found


def bind(str path):
    """Bind to the libzmq of the shared object at ``path`` (pyzmq's compiled backend module,
    or libzmq itself), which must already be loaded and link the libzmq version pyzmq
    reports; ImportError otherwise (saying why)."""
    global z_init, z_init_size, z_recv, z_send, z_close, z_move, z_data, z_size, z_more
    global z_get, z_errno, _bound, _calls
    cdef bytes encoded = path.encode()
    cdef void *lib = dlopen(encoded, RTLD_NOW | RTLD_NOLOAD)
    if lib == NULL:
        raise ImportError(f"{path} is not loaded")
    cdef int major = 0, minor = 0, patch = 0
    (<version_f>_sym(lib, b"zmq_version"))(&major, &minor, &patch)
    if (major, minor, patch) != zmq.zmq_version_info():
        raise ImportError(f"{path} is libzmq {major}.{minor}.{patch}, pyzmq uses "
                          f"{zmq.zmq_version()}")
    z_init = <msg_init_f>_sym(lib, b"zmq_msg_init")
    z_init_size = <msg_init_size_f>_sym(lib, b"zmq_msg_init_size")
    z_recv = <msg_io_f>_sym(lib, b"zmq_msg_recv")
    z_send = <msg_io_f>_sym(lib, b"zmq_msg_send")
    z_close = <msg_close_f>_sym(lib, b"zmq_msg_close")
    z_move = <msg_move_f>_sym(lib, b"zmq_msg_move")
    z_data = <msg_data_f>_sym(lib, b"zmq_msg_data")
    z_size = <msg_size_f>_sym(lib, b"zmq_msg_size")
    z_more = <msg_more_f>_sym(lib, b"zmq_msg_more")
    z_get = <msg_get_f>_sym(lib, b"zmq_msg_get")
    z_errno = <errno_f>_sym(lib, b"zmq_errno")
    _calls = ZmqCalls(init=z_init, init_size=z_init_size, close=z_close, data=z_data,
                      size=z_size, more=z_more, get=z_get)
    _bound = True


cdef unsigned char *_new_part(zmq_msg_t *msg, size_t size) except NULL:
    """``msg`` initialised with room for ``size`` bytes; where to write them."""
    if z_init_size(msg, size) < 0:
        raise MemoryError()
    return <unsigned char *>z_data(msg) if size else <unsigned char *>msg


cdef class Received:
    """One multipart message read in place, for the Cython twins that decode the common
    messages straight from libzmq's parts (read them with ``part_data``/``part_size`` from ``zio.pxd``)."""

    def __cinit__(self):
        if not _bound:
            raise RuntimeError("wirekit._fast.zio is not bound to libzmq")
        self.z = &_calls
        self.count = 0
        self.cap = 16
        self.parts = <zmq_msg_t *>PyMem_Malloc(self.cap * sizeof(zmq_msg_t))
        if self.parts == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self.parts != NULL:
            self.close()
            PyMem_Free(self.parts)

    cdef void close(self) noexcept:
        """Give the parts back to libzmq."""
        cdef Py_ssize_t i
        for i in range(self.count):
            z_close(&self.parts[i])
        self.count = 0

    cdef int read(self, void *handle, bint block, double spin) except -2:
        """Read the next message on the socket ``handle``: 0, or -1 when none came (nothing
        waiting without ``block``, or RCVTIMEO passed; ``spin`` as in :func:`recv_message`)."""
        cdef zmq_msg_t *grown
        cdef Py_ssize_t i
        self.close()
        z_init(&self.parts[0])
        self.count = 1
        if _recv_part(&self.parts[0], handle, block, spin) < 0:
            self.close()
            return -1
        while z_more(&self.parts[self.count - 1]):
            if self.count == self.cap:
                # Parts move to a bigger array with zmq_msg_move (libzmq's own way), never
                # by copying the opaque structs.
                grown = <zmq_msg_t *>PyMem_Malloc(2 * self.cap * sizeof(zmq_msg_t))
                if grown == NULL:
                    raise MemoryError()
                for i in range(self.count):
                    z_init(&grown[i])
                    z_move(&grown[i], &self.parts[i])
                    z_close(&self.parts[i])
                PyMem_Free(self.parts)
                self.parts = grown
                self.cap *= 2
            z_init(&self.parts[self.count])
            self.count += 1
            _recv_part(&self.parts[self.count - 1], handle, True)  # queued with its head
        return 0

    cdef list frames(self):
        """The parts as ``bytes`` frames."""
        cdef Py_ssize_t i
        return [PyBytes_FromStringAndSize(<char *>z_data(&self.parts[i]), z_size(&self.parts[i]))
                for i in range(self.count)]

    cdef int source_fd(self) noexcept:
        """The file descriptor the message came in on (-1 when there is none)."""
        return z_get(&self.parts[0], ZMQ_SRCFD) if self.count else -1


cdef const ZmqCalls *_zmq_calls() except NULL:
    if not _bound:
        raise RuntimeError("wirekit._fast.zio is not bound to libzmq")
    return &_calls


cdef void *_handle(sock) except NULL:
    if not _bound:
        raise RuntimeError("wirekit._fast.zio is not bound to libzmq")
    if sock.closed:
        raise zmq.ZMQError(zmq.ENOTSOCK)
    return <void *><size_t>sock.underlying


cdef int _raise(int err) except -1:
    zmq.error._check_rc(-1, err)
    return -1


cdef int _recv_part(zmq_msg_t *msg, void *handle, bint block, double spin=0.0) except -2:
    """Receive one part into ``msg``: 0, or -1 when nothing came (EAGAIN: nothing queued
    without ``block``, RCVTIMEO passed with it).  With ``block`` and ``spin`` > 0, look again
    for up to ``spin`` s (GIL released, the CPU yielded between looks) before sleeping."""
    cdef int rc = z_recv(msg, handle, ZMQ_DONTWAIT)
    cdef int err, flags = 0 if block else ZMQ_DONTWAIT
    cdef double until
    if rc >= 0:
        return 0
    err = z_errno()
    if err == EAGAIN and block and spin > 0:
        with nogil:
            until = _now() + spin
            while True:
                sched_yield()
                rc = z_recv(msg, handle, ZMQ_DONTWAIT)
                if rc >= 0:
                    break
                err = z_errno()
                if err != EAGAIN or _now() >= until:
                    break
        if rc >= 0:
            return 0
    while err == EAGAIN and block or err == EINTR:
        if err == EINTR:
            PyErr_CheckSignals()
        with nogil:
            rc = z_recv(msg, handle, flags)
            err = z_errno() if rc < 0 else 0
        if rc >= 0:
            return 0
        if err == EAGAIN:
            return -1
    if err == EAGAIN:
        return -1
    _raise(err)
    return -2


cdef object _recv(sock, bint block, bint with_fd, double spin=0.0):
    """The parts of one message as a list of bytes (and the first part's source fd), or
    None when nothing came."""
    return _recv_on(_handle(sock), block, with_fd, spin)


cdef object _recv_on(void *handle, bint block, bint with_fd, double spin):
    """:func:`_recv` on a socket handle already checked by :func:`_handle`."""
    cdef zmq_msg_t msg
    cdef list parts
    cdef int fd = -1
    z_init(&msg)
    try:
        if _recv_part(&msg, handle, block, spin) < 0:
            return None
        if with_fd:
            fd = z_get(&msg, ZMQ_SRCFD)
        parts = [PyBytes_FromStringAndSize(<char *>z_data(&msg), z_size(&msg))]
        while z_more(&msg):
            _recv_part(&msg, handle, True)  # the rest of a message is queued with its head
            parts.append(PyBytes_FromStringAndSize(<char *>z_data(&msg), z_size(&msg)))
    finally:
        z_close(&msg)
    if with_fd:
        return parts, fd
    return parts


def recv_frames(sock, int flags=0):
    """Receive one multipart message as a list of ``bytes`` (``zmq.Again`` with NOBLOCK when
    none is waiting, or when ``RCVTIMEO`` passes)."""
    parts = _recv(sock, not (flags & ZMQ_DONTWAIT), False)
    if parts is None:
        raise zmq.Again(EAGAIN)
    return parts


def recv_message(sock, bint block=True, double spin=0.0):
    """``(frames, source fd)`` of one message (fd -1 when there is none, as on inproc), or
    None when none is waiting (``block`` false) or ``RCVTIMEO`` passed: no exception on the
    common empty outcome.  ``spin`` (s): when blocking, keep looking that long (GIL released,
    yielding the CPU between looks) before going to sleep: an answer due within microseconds
    then costs no wake-up of a sleeping thread."""
    return _recv(sock, block, True, spin)


def send_frames(sock, frames, int flags=0):
    """Send ``frames`` (bytes-like) as one multipart message."""
    _send_on(_handle(sock), frames, flags)


cdef int _send_on(void *handle, object frames, int flags) except -1:
    """:func:`send_frames` on a socket handle already checked by :func:`_handle`."""
    cdef Py_ssize_t n = len(frames), i
    cdef Py_buffer view
    cdef zmq_msg_t msg
    cdef int rc, err, part_flags
    cdef bint block = not (flags & ZMQ_DONTWAIT)
    if n == 0:
        raise ValueError("no frames to send")
    for i in range(n):  # every part must be bytes-like: never leave half a message queued
        frame = frames[i]
        if type(frame) is bytes:
            continue
        if not PyObject_CheckBuffer(frame):
            raise TypeError(f"frame {i} is {type(frame).__name__}, not bytes-like")
        try:
            PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
        except (BufferError, ValueError):
            raise ValueError(f"frame {i} is not a C-contiguous buffer") from None
        PyBuffer_Release(&view)
    for i in range(n):
        PyObject_GetBuffer(frames[i], &view, PyBUF_SIMPLE)
        try:
            if z_init_size(&msg, <size_t>view.len) < 0:
                _raise(z_errno())
            memcpy(z_data(&msg), view.buf, <size_t>view.len)
        finally:
            PyBuffer_Release(&view)
        part_flags = ZMQ_SNDMORE if i < n - 1 else 0
        _send_msg(handle, &msg, part_flags, block or i > 0)
    return 0


cdef int _send_msg(void *handle, zmq_msg_t *msg, int part_flags, bint block) except -1:
    """Send ``msg`` (a part; ``part_flags`` 0 or ZMQ_SNDMORE), which libzmq then owns.
    With ``block``, wait (GIL released) while the high-water mark holds it back; a message's
    later parts must always be sent with ``block`` (only its first part can meet the mark).
    On an error ``msg`` is closed and the error raised."""
    cdef int rc = z_send(msg, handle, part_flags | ZMQ_DONTWAIT)
    cdef int err
    if rc >= 0:
        return 0
    err = z_errno()
    while rc < 0 and (err == EAGAIN and block or err == EINTR):
        if err == EINTR:
            try:
                PyErr_CheckSignals()
            except BaseException:
                z_close(msg)
                raise
        with nogil:
            rc = z_send(msg, handle, part_flags)
            err = z_errno() if rc < 0 else 0
        if rc < 0 and err == EAGAIN:
            break
    if rc < 0:
        z_close(msg)
        _raise(err)
    return 0
