"""Type stub of the Cython twin of ``wirekit.zmtp._pure`` (the ZMTP codec)."""

from collections.abc import Iterable
from typing import Any

from wirekit.errors import DecodeError
from wirekit.zmtp.messages import Event, Pending

IDENTITY_SOCKETS: frozenset[str]

def decode_events(
    buf: Any,
    pos: int = 0,
    phase: int = 0,
    final: bool = True,
    max_frame_size: int | None = None,
    *,
    max_message_frames: int | None = None,
    max_message_size: int | None = None,
    pending: Pending | None = None,
) -> tuple[list[tuple[int, Event]], int, int, DecodeError | None]: ...
def decode_stream(buf: Any, max_frame_size: int | None = None) -> list[tuple[int, Event]]: ...
def encode_greeting(
    mechanism: str = "NULL", as_server: bool = False, major: int = 3, minor: int = 1
) -> bytes: ...
def encode_command(name: str, data: Any = b"") -> bytes: ...
def encode_ready(
    socket_type: str, identity: Any = b"", properties: Iterable[tuple[str, Any]] = ()
) -> bytes: ...
def encode_message(frames: Iterable[Any]) -> bytes: ...
