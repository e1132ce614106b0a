"""Lean multipart send/receive for the Clipper runtimes.

pyzmq's ``send_multipart``/``recv_multipart`` cost several microseconds per frame in Python
(argument checks, ``SNDMORE | flags`` through ``enum.Flag``, a ``getsockopt(RCVMORE)`` per
frame), and a v3 Clipper message has one frame per input: most of a round trip's CPU went
there.  These helpers call the backend socket's ``send``/``recv`` directly with plain int
flags and read ``Frame.more`` instead of ``RCVMORE``: the same frames on the wire, same
blocking behaviour, a fraction of the per-frame cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import zmq

try:  # the backend class under pyzmq's sugar Socket (Cython or CFFI)
    from zmq.backend import Socket as _BackendSocket

    _send: Callable[..., Any] = _BackendSocket.send
    _recv: Callable[..., Any] = _BackendSocket.recv
except (ImportError, AttributeError):  # pragma: no cover - very old or unusual pyzmq
    _send = zmq.Socket.send
    _recv = zmq.Socket.recv

SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
#: While messages flow, the runtimes do blocking receives of at most this long on their main
#: socket (a zmq_poll over every socket costs several syscalls per message) and look at their
#: other sockets this often; once a receive waits this long, the full poll takes over.
FAST_WAIT = 0.02
zmq_poll = zmq.zmq_poll


def timeout_ms(wait: float, cap: float | None = None) -> int:
    """``wait`` seconds (until a deadline) as a ZeroMQ timeout in milliseconds, rounded up;
    -1 (forever) for an infinite wait; at most ``cap`` seconds when given."""
    if cap is not None and wait >= cap:
        return int(cap * 1000)
    if wait == float("inf"):
        return -1
    return max(0, int(wait * 1000) + 1)


def send_frames(sock: zmq.Socket, frames: Sequence[Any], flags: int = 0) -> None:
    """Send ``frames`` (bytes-like) as one multipart message."""
    send = _send
    more = SNDMORE | flags
    last = len(frames) - 1
    for i in range(last):
        send(sock, frames[i], more)
    send(sock, frames[last], flags)


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[bytes]:
    """Receive one multipart message as a list of ``bytes`` (``zmq.Again`` with NOBLOCK
    when none is waiting)."""
    recv = _recv
    frame = recv(sock, flags, False)
    parts = [frame.bytes]
    while frame.more:
        frame = recv(sock, 0, False)
        parts.append(frame.bytes)
    return parts


__all__ = [
    "FAST_WAIT", "NOBLOCK", "SNDMORE", "recv_frames", "send_frames", "timeout_ms", "zmq_poll",
]
