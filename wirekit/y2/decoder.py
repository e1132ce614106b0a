"""A sans-IO streaming decoder for the y2 worker link: bytes in, complete messages out.

No sockets here.  The size limit is enforced from the 8-byte handshake alone, before any
payload is buffered.
"""

from __future__ import annotations

from types import ModuleType

from wirekit.errors import DecodeError

from .messages import HANDSHAKE_SIZE, PROTOCOL, Message

DEFAULT_MAX_MESSAGE_SIZE = 64 * 1024 * 1024


class Decoder:
    """Incremental decoder for one direction of a y2 worker link.

    ``feed(data)`` buffers bytes; ``next_message()`` returns the next complete message, or
    None when more bytes are needed; iterating yields every complete message.

    A bad handshake (unknown type, negative or impossible size) or a message larger than
    ``max_message_size`` breaks the stream: ``broken`` becomes True and every later call
    raises the same :class:`~wirekit.errors.DecodeError`.  A well-framed message whose
    payload is invalid (a NodeIndex with node_id >= node_count) raises once and is skipped.
    """

    def __init__(
        self,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        *,
        codec: ModuleType | None = None,
    ) -> None:
        if codec is None:
            from wirekit import y2 as codec  # the active implementation
        self._codec = codec
        self.max_message_size = max_message_size
        self._buf = bytearray()
        self._pos = 0  # start of unconsumed data in _buf
        self._consumed = 0  # stream offset of _buf[0]
        self._error: DecodeError | None = None

    @property
    def broken(self) -> bool:
        """True once the stream can no longer be decoded."""
        return self._error is not None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a message."""
        return len(self._buf) - self._pos

    @property
    def offset(self) -> int:
        """Stream offset of the next byte to decode."""
        return self._consumed + self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the peer."""
        if self._error is not None:
            raise self._error
        if self._pos and self._pos == len(self._buf):
            self._consumed += self._pos
            self._buf.clear()
            self._pos = 0
        self._buf += memoryview(data).cast("B")

    def next_message(self) -> Message | None:
        """The next complete message, or None if more bytes are needed."""
        if self._error is not None:
            raise self._error
        avail = len(self._buf) - self._pos
        if avail < HANDSHAKE_SIZE:
            return None
        start = self._pos
        at = self.offset  # stream offset of this message
        try:
            _kind, size = self._codec.check_handshake(
                bytes(self._buf[start : start + HANDSHAKE_SIZE])
            )
        except DecodeError as exc:
            self._error = _shifted(exc, at)
            raise self._error from None
        total = HANDSHAKE_SIZE + size
        if total > self.max_message_size:
            self._error = DecodeError(
                PROTOCOL,
                "size",
                at + 4,
                f"message of {total} bytes exceeds the limit of {self.max_message_size}",
            )
            raise self._error
        if avail < total:
            return None
        raw = memoryview(self._buf)[start : start + total]
        try:
            return self._codec.decode(raw)  # Delta words are copied out of the buffer
        except DecodeError as exc:
            raise _shifted(exc, at) from None
        finally:
            raw.release()
            self._drop(total)

    def __iter__(self):
        while (msg := self.next_message()) is not None:
            yield msg

    def _drop(self, n: int) -> None:
        self._pos += n
        if self._pos >= 65536 and self._pos * 2 >= len(self._buf):
            del self._buf[: self._pos]
            self._consumed += self._pos
            self._pos = 0


def _shifted(exc: DecodeError, delta: int) -> DecodeError:
    """The same error with its offset moved by ``delta`` (buffer offset to stream offset)."""
    return DecodeError(
        exc.protocol, exc.field, exc.offset + delta, exc.reason, code=exc.code, frame=exc.frame
    )
