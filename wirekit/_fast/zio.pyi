"""Type stub of the Cython twin of ``wirekit.clipper._zio`` (multipart messages moved on the
libzmq that pyzmq loaded)."""

from collections.abc import Sequence
from typing import Any

import zmq
from typing_extensions import disjoint_base

def bind(path: str) -> None: ...

@disjoint_base
class Received:
    """One multipart message read in place (its parts are read from Cython, through
    ``zio.pxd``)."""

def recv_frames(sock: zmq.Socket[Any], flags: int = 0) -> list[bytes]: ...
def recv_message(
    sock: zmq.Socket[Any], block: bool = True, spin: float = 0.0
) -> tuple[list[bytes], int] | None: ...
def send_frames(sock: zmq.Socket[Any], frames: Sequence[Any], flags: int = 0) -> None: ...
