"""A sans-IO streaming MIP decoder: feed it bytes as they arrive, take complete messages out.

No sockets here.  The size limit is enforced from the 8-byte header alone, before any payload
is buffered, and the decoder reports which error a server should answer with.
"""

from __future__ import annotations

from types import ModuleType

from wirekit.errors import DecodeError

from .messages import HEADER_SIZE, PROTOCOL, ErrorCode, Message

DEFAULT_MAX_MESSAGE_SIZE = 64 * 1024 * 1024


class Decoder:
    """Incremental decoder for one direction of a MIP byte stream.

    ``feed(data)`` buffers bytes; ``next_message()`` returns the next complete message, or None
    when more bytes are needed; iterating yields every complete message.  A bad message raises
    :class:`~wirekit.errors.DecodeError` whose ``code`` is the :class:`ErrorCode` to answer with.

    After a payload error (SHAPE), or an unknown kind or subtype, the stream is still in step:
    the bad message's bytes are skipped as they arrive and decoding goes on.  After a bad
    version or reserved byte, or a message over ``max_message_size`` (MEMORY), the stream
    cannot be trusted: ``broken`` becomes True and every later call raises the same error.
    """

    def __init__(
        self,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        *,
        codec: ModuleType | None = None,
    ) -> None:
        if codec is None:
            from wirekit import mip as codec  # the active implementation
        self._codec = codec
        self.max_message_size = max_message_size
        self._buf = bytearray()
        self._pos = 0  # start of unconsumed data in _buf
        self._consumed = 0  # stream offset of _buf[0]
        self._skip = 0  # bytes of a rejected message still to drop
        self._error: DecodeError | None = None
        # Zero-copy path: a ``bytes`` chunk fed while nothing else is buffered is kept as is
        # (not copied into _buf), and complete messages are sliced out of it -- the whole
        # chunk itself when it holds exactly one.  Invariant: while _chunk is set, _buf holds
        # no unconsumed bytes and _consumed is the stream offset of _chunk[0].
        self._chunk: bytes | None = None
        self._cpos = 0

    @property
    def broken(self) -> bool:
        """True once the stream can no longer be decoded."""
        return self._error is not None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a message."""
        if self._chunk is not None:
            return len(self._chunk) - self._cpos
        return len(self._buf) - self._pos

    @property
    def offset(self) -> int:
        """Stream offset of the next byte to decode."""
        return self._consumed + (self._cpos if self._chunk is not None else self._pos)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the peer."""
        if self._error is not None:
            raise self._error
        if self._chunk is not None:
            self._spill()
        if not self._skip and type(data) is bytes and self._pos == len(self._buf) and data:
            # Nothing buffered: keep the chunk itself, no copy.
            if self._pos:
                self._consumed += self._pos
                self._buf.clear()
                self._pos = 0
            self._chunk = data
            self._cpos = 0
            return
        view = memoryview(data).cast("B")
        if self._skip:
            dropped = min(self._skip, len(view))
            self._skip -= dropped
            self._consumed += dropped
            view = view[dropped:]
        if self._pos and self._pos == len(self._buf):
            self._consumed += self._pos
            self._buf.clear()
            self._pos = 0
        self._buf += view

    def take_whole(self, data: bytes) -> bytes | None:
        """``data`` itself if nothing is buffered and it is exactly one complete message
        with a valid header within the size limit (accounted as fed and taken: one call
        instead of ``feed`` + ``next_frame`` for the common one-message read); else None
        and nothing changes (then ``feed`` it as usual)."""
        if (
            type(data) is not bytes
            or self._chunk is not None
            or self._pos != len(self._buf)
            or self._skip
            or self._error is not None
        ):
            return None
        n = len(data)
        if n < HEADER_SIZE or n > self.max_message_size:
            return None
        try:
            remaining = self._codec.check_header(data)[2]
        except DecodeError:
            return None
        if HEADER_SIZE + remaining != n:
            return None
        self._consumed += self._pos + n
        if self._pos:
            self._buf.clear()
            self._pos = 0
        return data

    def _spill(self) -> None:
        """Move the unconsumed rest of the kept chunk into the buffer."""
        chunk, cpos = self._chunk, self._cpos
        self._chunk = None
        self._consumed += cpos
        if cpos:
            self._buf += memoryview(chunk)[cpos:]  # type: ignore[index]
        else:
            self._buf += chunk  # type: ignore[operator]

    def next_frame(self) -> bytes | None:
        """The raw bytes of the next complete message (header checked, not decoded), or None.

        For runtimes that want the message bytes themselves (to forward or to decode their
        own way); ``next_message`` is ``decode(next_frame())``.  Header errors, MEMORY and
        the ``broken`` state are the same as for ``next_message``.
        """
        chunk = self._chunk
        if chunk is not None:
            # The common case: whole messages in the chunk, sliced out without a copy of
            # the buffer.  Anything else (a partial message, a bad header, over the limit)
            # takes the buffered path below, which reports it.
            cpos = self._cpos
            n = len(chunk)
            if n - cpos >= HEADER_SIZE:
                try:
                    remaining = self._codec.check_header(chunk, cpos)[2]
                except DecodeError:
                    remaining = -1
                end = cpos + HEADER_SIZE + remaining
                if remaining >= 0 and end <= n and end - cpos <= self.max_message_size:
                    if end == n:
                        self._chunk = None
                        self._consumed += n
                        return chunk if cpos == 0 else chunk[cpos:]
                    self._cpos = end
                    return chunk[cpos:end]
            self._spill()
        if self._error is not None:
            raise self._error
        if self._skip:
            return None
        avail = len(self._buf) - self._pos
        if avail < HEADER_SIZE:
            return None
        start = self._pos
        at = self.offset  # stream offset of this message
        header = bytes(self._buf[start : start + HEADER_SIZE])
        try:
            _kind, _subtype, remaining = self._codec.check_header(header)
        except DecodeError as exc:
            err = _shifted(exc, at)
            if err.field in ("version", "reserved"):
                self._error = err
            else:
                # Well framed: drop this message's bytes and keep going.
                self._drop(HEADER_SIZE + int.from_bytes(header[4:], "big"))
            raise err from None
        size = HEADER_SIZE + remaining
        if size > self.max_message_size:
            self._error = DecodeError(
                PROTOCOL,
                "remaining",
                at + 4,
                f"message of {size} bytes exceeds the limit of {self.max_message_size}",
                code=int(ErrorCode.MEMORY),
            )
            raise self._error
        if avail < size:
            return None
        raw = bytes(self._buf[start : start + size])
        self._drop(size)
        return raw

    def next_message(self) -> Message | None:
        """The next complete message, or None if more bytes are needed."""
        at = self.offset
        raw = self.next_frame()
        if raw is None:
            return None
        try:
            return self._codec.decode(raw)
        except DecodeError as exc:
            raise _shifted(exc, at) from None

    def __iter__(self):
        while (msg := self.next_message()) is not None:
            yield msg

    def _drop(self, n: int) -> None:
        avail = len(self._buf) - self._pos
        take = min(n, avail)
        self._pos += take
        self._skip = n - take
        if self._pos >= 65536 and self._pos * 2 >= len(self._buf):
            del self._buf[: self._pos]
            self._consumed += self._pos
            self._pos = 0


def _shifted(exc: DecodeError, delta: int) -> DecodeError:
    """The same error with its offset moved by ``delta`` (buffer offset to stream offset)."""
    return DecodeError(
        exc.protocol, exc.field, exc.offset + delta, exc.reason, code=exc.code, frame=exc.frame
    )
