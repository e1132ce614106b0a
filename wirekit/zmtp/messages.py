"""ZMTP 3.x stream events, shared by the Cython twin and the pure path.

Decoding a capture of one direction of a ZeroMQ TCP connection yields, in order, one
:class:`Greeting`, the mechanism's handshake command (:class:`Ready` for NULL, or a
:class:`Command` named ``ERROR``), then :class:`Message` and :class:`Command` events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROTOCOL = "zmtp"
GREETING_SIZE = 64
SIGNATURE_PADDING = b"\x00" * 7 + b"\x01"  # what libzmq sends; any 8 bytes are accepted
MECHANISM_SIZE = 20
FILLER_SIZE = 31
MAJOR_VERSION = 3

FLAG_MORE = 0x01
FLAG_LONG = 0x02
FLAG_COMMAND = 0x04
FLAGS_RESERVED = 0xF8

#: phases of a stream (the third value of ``decode_events``' result)
PHASE_GREETING, PHASE_HANDSHAKE, PHASE_TRAFFIC = 0, 1, 2

#: default ``max_frame_size`` of :class:`~wirekit.zmtp.StreamReader`
DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024
#: default ``max_message_frames`` of :class:`~wirekit.zmtp.StreamReader`: frames in one
#: multipart message.  Clipper sends one frame per input and wirekit batches up to 65535
#: inputs; a million frames hold at most ~50 MB of Python objects, less than one largest frame.
DEFAULT_MAX_MESSAGE_FRAMES = 1 << 20
#: default ``max_message_size`` of :class:`~wirekit.zmtp.StreamReader`: body bytes of all
#: the frames of one multipart message (four frames of the largest size).
DEFAULT_MAX_MESSAGE_SIZE = 256 * 1024 * 1024

#: socket types whose READY carries an Identity property (what libzmq does)
IDENTITY_SOCKETS = frozenset({"REQ", "DEALER", "ROUTER"})


@dataclass(frozen=True, slots=True)
class Greeting:
    """The 64-byte greeting: version, security mechanism and the as-server flag."""

    major: int = 3
    minor: int = 1
    mechanism: str = "NULL"
    as_server: bool = False


@dataclass(frozen=True, slots=True)
class Ready:
    """The NULL mechanism's READY command: metadata properties in wire order."""

    properties: tuple[tuple[str, bytes], ...] = ()

    def get(self, name: str, default: bytes | None = None) -> bytes | None:
        """The value of property ``name`` (names are case-insensitive)."""
        folded = name.lower()
        for key, value in self.properties:
            if key.lower() == folded:
                return value
        return default

    @property
    def socket_type(self) -> str | None:
        """The ``Socket-Type`` property as text (``"DEALER"``, ``"ROUTER"``, ...), or None."""
        value = self.get("Socket-Type")
        return None if value is None else value.decode("latin-1")

    @property
    def identity(self) -> bytes:
        """The ``Identity`` property (empty when absent)."""
        return self.get("Identity") or b""


@dataclass(frozen=True, slots=True)
class Command:
    """Any other command frame (PING, PONG, SUBSCRIBE, CANCEL, ERROR, ...): name and data."""

    name: str
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class Message:
    """A multipart message: the frames up to and including the first one without MORE."""

    frames: tuple[bytes, ...]


Event = Greeting | Ready | Command | Message


class Pending:
    """What ``decode_events(..., pending=p)`` left unfinished at the end of its buffer.

    Without ``pending``, a multipart message whose last frame has not arrived is left whole
    for the next call, which reads it again from its first frame.  With it, the complete
    frames of that message are kept here and the returned position is just past them, so the
    next call (on a buffer that starts at that position, or goes on from it) resumes at the
    next frame: every byte is decoded once however the stream is cut.

    ``frames``: the complete frames of the unfinished message (empty: none is unfinished).
    ``start``: buffer offset of that message's first frame, the offset its event will get;
    negative once the caller has dropped those bytes (call :meth:`dropped`).
    ``size``: body bytes in ``frames``, counted against ``max_message_size``.
    ``need``: the next call can get further only when the buffer holds at least this many
    bytes from the returned position (until then it would only read the same header again).
    After a decode error the content is meaningless: start over with a new ``Pending``.
    """

    __slots__ = ("frames", "need", "size", "start")

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.start = 0
        self.size = 0
        self.need = 1

    def dropped(self, count: int) -> None:
        """The caller removed ``count`` bytes from the front of the buffer."""
        self.start -= count

    def __repr__(self) -> str:
        return (
            f"Pending(frames={len(self.frames)}, start={self.start}, size={self.size}, "
            f"need={self.need})"
        )


def to_jsonable(event: Event) -> dict[str, Any]:
    """A JSON-ready description of ``event`` (the golden vectors' form); bytes as hex."""
    if isinstance(event, Greeting):
        return {
            "kind": "greeting",
            "version": f"{event.major}.{event.minor}",
            "mechanism": event.mechanism,
            "as_server": event.as_server,
        }
    if isinstance(event, Ready):
        return {
            "kind": "ready",
            "socket_type": event.socket_type,
            "properties": [{"name": k, "value_hex": v.hex()} for k, v in event.properties],
        }
    if isinstance(event, Command):
        return {"kind": "command", "name": event.name, "data_hex": event.data.hex()}
    return {"kind": "message", "frames_hex": [bytes(f).hex() for f in event.frames]}
