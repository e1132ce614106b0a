"""Type stub of the Cython twin of ``wirekit.clipper._lane.PureLane`` (a Clipper container
session's per-message path)."""

from collections.abc import Callable
from typing import Any

import zmq
from typing_extensions import disjoint_base

IDLE: int
LOOK: int
DUE: int
END: int
STOP: int
FAST_WAIT: float
FAST_WAIT_MS: int

@disjoint_base
class Lane:
    """The per-message path of one container session."""

    #: The socket's receive timeout (ms) the lane waits with.
    rcvtimeo: int
    def __init__(
        self, container: Any, sock: zmq.Socket[Any], session: Any, send: Callable[[Any], None]
    ) -> None: ...
    def handle(self, frames: Any, now: float) -> bool: ...
    def run(self) -> int: ...
