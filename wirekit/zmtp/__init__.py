"""ZMTP 3.x (ZeroMQ's TCP wire protocol): read captures of one direction of a connection.

>>> from wirekit import zmtp
>>> wire = (zmtp.encode_greeting() + zmtp.encode_ready("DEALER")
...         + zmtp.encode_message([b"", b"hello"]))
>>> [type(e).__name__ for _, e in zmtp.decode_stream(wire)]
['Greeting', 'Ready', 'Message']
>>> zmtp.decode_stream(wire)[1][1].socket_type
'DEALER'
>>> zmtp.decode_stream(wire)[2]
(107, Message(frames=(b'', b'hello')))

Only the NULL security mechanism is supported.  ``decode_events``/``decode_stream`` and the
``encode_*`` functions come from the Cython twin unless ``WIREKIT_PURE=1`` or it is not
built; ``IMPLEMENTATION`` tells which.  :class:`StreamReader` is the incremental form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wirekit._impl import lazy_codec

from . import _pure
from .messages import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_FRAMES,
    DEFAULT_MAX_MESSAGE_SIZE,
    FLAG_COMMAND,
    FLAG_LONG,
    FLAG_MORE,
    GREETING_SIZE,
    PROTOCOL,
    Command,
    Event,
    Greeting,
    Message,
    Pending,
    Ready,
)
from .reader import StreamReader

#: The codec functions, bound from the Cython twin (or the pure path) on first use.
_API = (
    "decode_events",
    "decode_stream",
    "encode_greeting",
    "encode_command",
    "encode_ready",
    "encode_message",
)
__getattr__ = lazy_codec(globals(), "zmtp", _pure, _API)

decode_events: Callable[..., tuple[list[tuple[int, Event]], int, int, Any]]
decode_stream: Callable[..., list[tuple[int, Event]]]
encode_greeting: Callable[..., bytes]
encode_command: Callable[..., bytes]
encode_ready: Callable[..., bytes]
encode_message: Callable[..., bytes]
#: ``"fast"`` (Cython) or ``"pure"`` (construct): which codec the functions come from.
IMPLEMENTATION: str


def is_zmtp(data: bytes | bytearray | memoryview) -> bool:
    """True when ``data`` starts with a ZMTP 3.x greeting signature (0xFF, 8 bytes, 0x7F, 3).

    Needs the first 11 bytes; the rest of the greeting is not looked at.
    """
    head = bytes(memoryview(data)[:11])
    return len(head) == 11 and head[0] == 0xFF and head[9] == 0x7F and head[10] == 3


__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_MESSAGE_FRAMES",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "FLAG_COMMAND",
    "FLAG_LONG",
    "FLAG_MORE",
    "GREETING_SIZE",
    "IMPLEMENTATION",
    "PROTOCOL",
    "Command",
    "Event",
    "Greeting",
    "Message",
    "Pending",
    "Ready",
    "StreamReader",
    "decode_events",
    "decode_stream",
    "encode_command",
    "encode_greeting",
    "encode_message",
    "encode_ready",
    "is_zmtp",
]
