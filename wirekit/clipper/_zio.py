"""Lean multipart send/receive for the Clipper runtimes.

pyzmq's ``send_multipart``/``recv_multipart`` cost several microseconds per frame in Python
(argument checks, ``SNDMORE | flags`` through ``enum.Flag``, a ``getsockopt(RCVMORE)`` per
frame), and a v3 Clipper message has one frame per input: most of a round trip's CPU went
there.  Two twins with the same behaviour:

* the Cython twin (``wirekit._fast.zio``) calls the libzmq pyzmq loaded directly: a whole
  message moves with the GIL held (released only to wait), no Frame object per part;
* the pure twin (``WIREKIT_PURE=1``, or where pyzmq's libzmq cannot be reached: then with a
  ``FastPathMissing`` warning saying why) calls the backend
  socket's ``send``/``recv`` with plain int flags and reads ``Frame.more`` instead of
  ``RCVMORE``.

Same frames on the wire, same blocking and timeout behaviour.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from wirekit._impl import load_fast_bound

try:  # the backend class under pyzmq's sugar Socket (Cython or CFFI)
    from zmq.backend import Socket as _BackendSocket

    _send: Callable[..., Any] = _BackendSocket.send
    _recv: Callable[..., Any] = _BackendSocket.recv
except (ImportError, AttributeError):  # pragma: no cover - very old or unusual pyzmq
    _send = zmq.Socket.send
    _recv = zmq.Socket.recv

SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
_SRCFD = int(zmq.SRCFD)
#: While messages flow, the runtimes do blocking receives of at most this long on their main
#: socket (a zmq_poll over every socket costs several syscalls per message) and look at their
#: other sockets this often; once a receive waits this long, the full poll takes over.
FAST_WAIT = 0.02
#: FAST_WAIT as a ZeroMQ timeout (``timeout_ms(wait, FAST_WAIT)`` for any ``wait`` >= it).
FAST_WAIT_MS = int(FAST_WAIT * 1000)
zmq_poll = zmq.zmq_poll


def timeout_ms(wait: float, cap: float | None = None) -> int:
    """``wait`` seconds (until a deadline) as a ZeroMQ timeout in milliseconds, rounded up;
    -1 (forever) for an infinite wait; at most ``cap`` seconds when given."""
    if cap is not None and wait >= cap:
        return int(cap * 1000)
    if wait == float("inf"):
        return -1
    return max(0, int(wait * 1000) + 1)


def _check_buffer(index: int, frame: Any) -> None:
    """TypeError unless ``frame`` is bytes-like, ValueError unless it is C-contiguous."""
    try:
        view = memoryview(frame)
    except TypeError:
        raise TypeError(f"frame {index} is {type(frame).__name__}, not bytes-like") from None
    if not view.c_contiguous:
        raise ValueError(f"frame {index} is not a C-contiguous buffer")


def _send_frames(sock: zmq.Socket, frames: Sequence[Any], flags: int = 0) -> None:
    """Send ``frames`` (bytes-like) as one multipart message."""
    if not frames:
        raise ValueError("no frames to send")
    for i, frame in enumerate(frames):  # every part bytes-like: never leave half a message
        if type(frame) is not bytes:
            _check_buffer(i, frame)
    send = _send
    more = SNDMORE | flags
    last = len(frames) - 1
    for i in range(last):
        send(sock, frames[i], more)
    send(sock, frames[last], flags)


def _recv_frames(sock: zmq.Socket, flags: int = 0) -> list[bytes]:
    """Receive one multipart message as a list of ``bytes`` (``zmq.Again`` with NOBLOCK
    when none is waiting, or when ``RCVTIMEO`` passes)."""
    recv = _recv
    frame = recv(sock, flags, False)
    parts = [frame.bytes]
    while frame.more:
        frame = recv(sock, 0, False)
        parts.append(frame.bytes)
    return parts


def _recv_message(
    sock: zmq.Socket, block: bool = True, spin: float = 0.0
) -> tuple[list[bytes], int] | None:
    """``(frames, source fd)`` of one message (fd -1 when there is none, as on inproc), or
    None when none is waiting (``block`` false) or ``RCVTIMEO`` passed.  ``spin`` (s): when
    blocking, keep looking that long (yielding the CPU between looks) before sleeping."""
    recv = _recv
    frame = None
    if block and spin > 0:
        until = time.monotonic() + spin
        while frame is None:
            try:
                frame = recv(sock, NOBLOCK, False)
            except zmq.Again:
                if time.monotonic() >= until:
                    break
                os.sched_yield()
    try:
        if frame is None:
            frame = recv(sock, 0 if block else NOBLOCK, False)
    except zmq.Again:
        return None
    try:
        fd = frame.get(_SRCFD)
    except zmq.ZMQError:  # no source fd (inproc): as the Cython twin, -1
        fd = -1
    parts = [frame.bytes]
    while frame.more:
        frame = recv(sock, 0, False)
        parts.append(frame.bytes)
    return parts, fd


def _backend_file() -> str:
    """The file of pyzmq's compiled backend module, through which the Cython twin reaches
    the libzmq pyzmq loaded; ImportError (saying why) when there is none."""
    try:
        from zmq.backend.cython import _zmq
    except ImportError as exc:
        raise ImportError(
            f"pyzmq {zmq.__version__} has no Cython backend module here "
            f"({exc}), so its libzmq cannot be called from C"
        ) from None
    path = getattr(_zmq, "__file__", None)
    if not path:
        raise ImportError("pyzmq's Cython backend module has no file")
    return path


def _bind(fast: Any) -> None:
    fast.bind(_backend_file())


def _load_fast() -> Any:
    # Loud when the compiled twin is built but cannot reach pyzmq's libzmq (another pyzmq
    # backend, a platform without dlopen/dlsym): the runtimes are then several times slower.
    return load_fast_bound("zio", _bind)


_fast = _load_fast()
#: ``"fast"`` (Cython, straight on libzmq) or ``"pure"`` (pyzmq's backend calls).
IMPLEMENTATION = "pure" if _fast is None else "fast"
send_frames: Callable[..., None] = _send_frames if _fast is None else _fast.send_frames
recv_frames: Callable[..., list[bytes]] = _recv_frames if _fast is None else _fast.recv_frames
recv_message: Callable[..., tuple[list[bytes], int] | None] = (
    _recv_message if _fast is None else _fast.recv_message
)


__all__ = [
    "FAST_WAIT",
    "FAST_WAIT_MS",
    "IMPLEMENTATION",
    "NOBLOCK",
    "SNDMORE",
    "recv_frames",
    "recv_message",
    "send_frames",
    "timeout_ms",
    "zmq_poll",
]
