"""A sans-IO streaming decoder for the y2 worker link: bytes in, complete messages out.

No sockets here.  The size limit is enforced from the 8-byte handshake alone, before any
payload is buffered.  The buffer bookkeeping is :class:`wirekit._framing.FramedStream`,
shared with MIP.
"""

from __future__ import annotations

from types import ModuleType

from wirekit._framing import FramedStream

from .messages import PROTOCOL, Message

DEFAULT_MAX_MESSAGE_SIZE = 64 * 1024 * 1024


class Decoder(FramedStream):
    """Incremental decoder for one direction of a y2 worker link.

    ``feed(data)`` buffers bytes; ``next_message()`` returns the next complete message, or
    None when more bytes are needed; iterating yields every complete message;
    ``next_frame()`` hands out a message's raw bytes instead.

    A bad handshake (unknown type, negative or impossible size) or a message larger than
    ``max_message_size`` breaks the stream: ``broken`` becomes True and every later call
    raises the same :class:`~wirekit.errors.DecodeError`.  A well-framed message whose
    payload is invalid (a NodeIndex with node_id >= node_count) raises once and is skipped.
    """

    protocol = PROTOCOL
    size_field = "size"

    def __init__(
        self,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        *,
        codec: ModuleType | None = None,
    ) -> None:
        if codec is None:
            from wirekit import y2 as active

            codec = active  # the active implementation
        self._codec = codec
        super().__init__(max_message_size, codec.check_handshake)

    def decode(self, raw: bytes) -> Message:
        """One complete message's bytes -> the message (Delta words are copied out)."""
        return self._codec.decode(raw)

    def next_message(self) -> Message | None:
        """The next complete message, or None if more bytes are needed."""
        return super().next_message()
