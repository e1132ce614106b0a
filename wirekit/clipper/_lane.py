"""The model container's socket loop while requests flow: request frames in, answers out.

:class:`Lane` serves the messages of one socket's session while they flow, with blocking
receives on the DEALER, and hands back to the
:class:`~wirekit.clipper.container.ModelContainer` when they stop (or it is time to look at
its other sockets, or the session's deadline passed).  Two twins with the same behaviour:

* the Cython twin (``wirekit._fast.clippercontainer``) keeps the whole loop in C: the common
  v3 request and the common 2017/v3 answer move straight on libzmq
  (``wirekit._fast.zio``), with the session's and the container's own public methods
  (``ContainerSession.request_received``/``response_sent``, ``ModelContainer.run_model``
  ...) keeping their state;
* this pure twin (``WIREKIT_PURE=1``, or where the Cython ``zio`` twin is not in use) is just
  the reference path in a loop: every message goes to ``ContainerSession.receive`` and its
  actions to ``ModelContainer.handle_actions``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq

from wirekit._impl import fallback, load_fast, pure_requested

from . import _zio
from ._zio import FAST_WAIT, FAST_WAIT_MS, recv_message, timeout_ms

#: What :meth:`Lane.run` returns: a receive waited without a message (poll everything),
#: time to look at the other sockets, the session's deadline passed (tick), the session
#: ended (already logged), the container is stopping.
IDLE, LOOK, DUE, END, STOP = range(5)


class PureLane:
    """The socket loop of one container session while requests flow (pure twin of the
    Cython ``Lane``).

    ``container`` is the :class:`~wirekit.clipper.container.ModelContainer`, ``sock`` the
    session's DEALER, ``session`` its :class:`~wirekit.clipper.session.ContainerSession`,
    ``send`` a function sending frames on it.
    """

    def __init__(
        self, container: Any, sock: zmq.Socket, session: Any, send: Callable[[Any], None]
    ) -> None:
        self.container = container
        self.sock = sock
        self.session = session
        self.send = send
        self.rcvtimeo = -1

    def handle(self, frames: Any, now: float) -> bool:
        """Handle one message received at ``now``; False when the session is over."""
        return self.container.handle_actions(
            self.session.receive(frames, now), self.session, self.send
        )

    def run(self) -> int:
        """Serve messages while each comes within ``FAST_WAIT`` of the last; return why it
        stopped (:data:`IDLE`, :data:`LOOK`, :data:`DUE`, :data:`END`, :data:`STOP`)."""
        container, session, sock = self.container, self.session, self.sock
        now = time.monotonic()
        look_at = now + FAST_WAIT
        while not container.stopping:
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
        if not pure_requested():
            fallback("clippercontainer", "the compiled zio is not in use")
        return None
    return load_fast("clippercontainer")


_fast = _load_fast()
#: ``"fast"`` (Cython) or ``"pure"``.
IMPLEMENTATION = "pure" if _fast is None else "fast"
Lane: type = PureLane if _fast is None else _fast.Lane

__all__ = ["DUE", "END", "IDLE", "IMPLEMENTATION", "LOOK", "STOP", "Lane", "PureLane"]
