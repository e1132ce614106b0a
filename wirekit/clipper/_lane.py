"""The model container's per-message path: request frames in, response frames out.

:class:`Lane` serves the messages of one socket's session while they flow: receive, decode,
run the model (handing the socket to the standby thread meanwhile), check the outputs,
encode and send the answer.  Everything rarer (heartbeat replies, malformed frames, a model
that failed, a standby that took the socket over) goes back to the
:class:`~wirekit.clipper.container.ModelContainer` and its
:class:`~wirekit.clipper.session.ContainerSession`, which stay the reference behaviour.
Two twins with the same behaviour:

* the Cython twin (``wirekit._fast.clippercontainer``) keeps the whole loop in C: messages
  move straight on libzmq (``wirekit._fast.zio``), no action objects, no ``time.monotonic``
  call, no Python frame per message;
* this pure twin (``WIREKIT_PURE=1``, or where the Cython ``zio`` twin is not in use) does
  the same steps in Python.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq

from wirekit._impl import load_fast
from wirekit.errors import DecodeError

from . import _zio, decode
from ._zio import FAST_WAIT, FAST_WAIT_MS, recv_message, timeout_ms
from .messages import Direction, PredictRequest

#: What :meth:`Lane.run` returns: a receive waited without a message (poll everything),
#: time to look at the other sockets, the session's deadline passed (tick), the session
#: ended (already logged), the container is stopping.
IDLE, LOOK, DUE, END, STOP = range(5)

_TO_CONTAINER = Direction.TO_CONTAINER


class PureLane:
    """The per-message path of one container session (pure twin of the Cython ``Lane``).

    ``container`` is the :class:`~wirekit.clipper.container.ModelContainer` (its predict
    function, counters, socket lock and fallbacks), ``sock`` the session's DEALER, ``send``
    a function sending frames on it.
    """

    def __init__(self, container: Any, sock: zmq.Socket, session: Any,
                 send: Callable[[Any], None]) -> None:
        self.container = container
        self.sock = sock
        self.session = session
        self.send = send
        self.rcvtimeo = -1

    def handle(self, frames: Any, now: float) -> bool:
        """Handle one message received at ``now``; False when the session is over."""
        session = self.session
        try:
            msg = decode(frames, session.generation, _TO_CONTAINER)
        except DecodeError:
            msg = None
        if type(msg) is not PredictRequest or session.state == "closed":
            # Not a request (or not decodable): the session logs, answers or raises.
            return self.container._handle_actions(session.receive(frames, now), session,
                                                  self.send)
        session.last_received = now
        if session.state != "registered":
            session.state = "registered"
        session.requests += 1
        return self.container._serve_request(msg, session, self.send)

    def run(self) -> int:
        """Serve messages while each comes within ``FAST_WAIT`` of the last; return why it
        stopped (:data:`IDLE`, :data:`LOOK`, :data:`DUE`, :data:`END`, :data:`STOP`)."""
        container, session, sock = self.container, self.session, self.sock
        now = time.monotonic()
        look_at = now + FAST_WAIT
        while not container._stopping:
            wait = session.deadline() - now
            if wait <= 0:
                return DUE
            ms = FAST_WAIT_MS if wait >= FAST_WAIT else timeout_ms(wait)
            if ms != self.rcvtimeo:
                sock.setsockopt(zmq.RCVTIMEO, ms)
                self.rcvtimeo = ms
            message = recv_message(sock)
            if message is None:
                return IDLE
            received = time.monotonic()
            if not self.handle(message[0], received):
                return END
            if received >= look_at:
                return LOOK
            now = time.monotonic()
        return STOP


def _load_fast() -> Any:
    if _zio.IMPLEMENTATION != "fast":  # the Cython lane moves frames with the Cython zio
        return None
    return load_fast("clippercontainer")


_fast = _load_fast()
#: ``"fast"`` (Cython) or ``"pure"``.
IMPLEMENTATION = "pure" if _fast is None else "fast"
Lane: type = PureLane if _fast is None else _fast.Lane

__all__ = ["DUE", "END", "IDLE", "IMPLEMENTATION", "LOOK", "STOP", "Lane", "PureLane"]
