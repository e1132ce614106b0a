"""A sans-IO streaming MIP decoder: feed it bytes as they arrive, take complete messages out.

No sockets here.  The size limit is enforced from the 8-byte header alone, before any payload
is buffered, and the decoder reports which error a server should answer with.  The buffer
bookkeeping is :class:`wirekit._framing.FramedStream`, shared with the y2 worker link.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from wirekit._framing import FramedStream
from wirekit.errors import DecodeError

from .messages import DEFAULT_MAX_ITEMS, PROTOCOL, ErrorCode, Message

DEFAULT_MAX_MESSAGE_SIZE = 64 * 1024 * 1024


class Decoder(FramedStream):
    """Incremental decoder for one direction of a MIP byte stream.

    ``feed(data)`` buffers bytes; ``next_message()`` returns the next complete message, or None
    when more bytes are needed; iterating yields every complete message; ``next_frame()`` and
    ``take_whole(data)`` hand out a message's raw bytes instead.  A bad message raises
    :class:`~wirekit.errors.DecodeError` whose ``code`` is the :class:`ErrorCode` to answer with.

    After a payload error (SHAPE), or an unknown kind or subtype, the stream is still in step:
    the bad message's bytes are skipped as they arrive and decoding goes on.  After a bad
    version or reserved byte, or a message over ``max_message_size`` (MEMORY), the stream
    cannot be trusted: ``broken`` becomes True and every later call raises the same error.
    A message of more than ``max_items`` items is refused (MEMORY) when it is decoded; the
    stream stays in step.
    """

    protocol = PROTOCOL
    size_field = "remaining"
    oversize_code = int(ErrorCode.MEMORY)

    def __init__(
        self,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        *,
        max_items: int = DEFAULT_MAX_ITEMS,
        codec: ModuleType | None = None,
    ) -> None:
        if codec is None:
            from wirekit import mip  # the active implementation

            codec = mip
        self._codec: Any = codec
        self.max_items = max_items
        super().__init__(max_message_size, codec.check_header)

    def fatal_header_error(self, err: DecodeError) -> bool:
        """A bad version or reserved byte: nothing after it can be trusted."""
        return err.field in ("version", "reserved")

    def decode(self, raw: bytes) -> Message:
        """One complete message's bytes -> the message."""
        return self._codec.decode(raw, self.max_items)

    def next_message(self) -> Message | None:
        """The next complete message, or None if more bytes are needed."""
        return super().next_message()
