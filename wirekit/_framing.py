"""Buffer bookkeeping shared by the sans-IO stream decoders of MIP and the y2 worker link.

Both protocols frame a message as an 8-byte header whose last four bytes (big-endian) count
the payload bytes that follow.  :class:`FramedStream` does everything that does not depend on
what the header means: buffering fed bytes (keeping a ``bytes`` chunk as is when nothing else
is buffered), cutting complete frames out, enforcing the size limit from the header alone,
skipping a well-framed bad message, and the ``broken`` state after an error that leaves the
stream out of step.  A subclass says what its header means: the codec's check function, which
header errors break the stream, and how the over-limit error is worded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from wirekit.errors import DecodeError

HEADER_SIZE = 8


class FramedStream:
    """One direction of a stream of ``header (8 bytes, size in bytes 4..8) + payload`` frames.

    Subclasses set ``protocol`` and ``size_field`` (the name the over-limit error gives the
    size), optionally ``oversize_code`` (the reply code of that error) and override
    ``fatal_header_error``; they pass ``check_header(buf, pos) -> (..., payload_size)``, which
    raises DecodeError (offsets relative to the buffer) for a bad header.
    """

    protocol = ""
    size_field = "size"
    oversize_code: int | None = None

    def __init__(self, max_message_size: int, check_header: Callable[..., tuple[Any, ...]]):
        self.max_message_size = max_message_size
        self._check_header = check_header
        self._buf = bytearray()
        self._pos = 0  # start of unconsumed data in _buf
        self._consumed = 0  # stream offset of _buf[0]
        self._skip = 0  # bytes of a rejected message still to drop
        self._error: DecodeError | None = None
        # Zero-copy path: a ``bytes`` chunk fed while nothing else is buffered is kept as is
        # (not copied into _buf), and complete frames are sliced out of it -- the whole chunk
        # itself when it holds exactly one.  Invariant: while _chunk is set, _buf holds no
        # unconsumed bytes and _consumed is the stream offset of _chunk[0].
        self._chunk: bytes | None = None
        self._cpos = 0

    def fatal_header_error(self, err: DecodeError) -> bool:
        """True if ``err`` (from the header check) leaves the stream out of step."""
        return True

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

    def fail(self, err: DecodeError) -> None:
        """Give up on the stream (its reader refused it): drop every byte buffered or still
        to skip; ``broken`` becomes True and every later call raises ``err``."""
        self._consumed = self.offset
        self._chunk = None
        self._cpos = 0
        self._buf = bytearray()
        self._pos = 0
        self._skip = 0
        self._error = err

    @property
    def idle(self) -> bool:
        """True when nothing is buffered, skipped or broken: bytes the caller frames itself
        (then :meth:`taken`) need not go through :meth:`feed`."""
        return (
            self._chunk is None
            and self._pos == len(self._buf)
            and not self._skip
            and self._error is None
        )

    def taken(self, n: int) -> None:
        """Account ``n`` bytes framed by the caller while :attr:`idle` (stream offsets stay
        right)."""
        self._consumed += self._pos + n
        if self._pos:
            self._buf.clear()
            self._pos = 0

    def take_whole(self, data: bytes) -> bytes | None:
        """``data`` itself if nothing is buffered and it is exactly one complete frame with a
        valid header within the size limit (accounted as fed and taken: one call instead of
        ``feed`` + ``next_frame`` for the common one-message read); else None and nothing
        changes (then ``feed`` it as usual)."""
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
            size = self._check_header(data)[-1]
        except DecodeError:
            return None
        if HEADER_SIZE + size != n:
            return None
        self.taken(n)
        return data

    def take_frames(self, take: Callable[..., int], *args: Any) -> int:
        """Let ``take(buf, pos, end, *args)`` consume whole frames at the head of the bytes
        not yet taken (``buf[pos:end]``; a runtime's lane that frames with the codec's own
        check); it returns where the first frame it left starts.  Nothing while a message is
        being skipped or the stream is broken.  Returns the bytes taken."""
        if self._error is not None or self._skip:
            return 0
        chunk = self._chunk
        if chunk is not None:
            cpos = self._cpos
            n = len(chunk)
            new = _position(take(chunk, cpos, n, *args), cpos, n)
            if new == n:
                self._chunk = None
                self._consumed += n
            else:
                self._cpos = new
            return new - cpos
        start = self._pos
        if start == len(self._buf):
            return 0
        new = _position(take(self._buf, start, len(self._buf), *args), start, len(self._buf))
        if new != start:
            self._drop(new - start)
        return new - start

    def next_frame(self) -> bytes | None:
        """The raw bytes of the next complete message (header checked, not decoded), or None.

        For runtimes that want the message bytes themselves (to forward or to decode their
        own way); ``next_message`` is ``decode(next_frame())``.
        """
        chunk = self._chunk
        if chunk is not None:
            # The common case: whole frames in the chunk, sliced out without a copy of the
            # buffer.  Anything else (a partial frame, a bad header, over the limit) takes the
            # buffered path below, which reports it.
            cpos = self._cpos
            n = len(chunk)
            if n - cpos >= HEADER_SIZE:
                try:
                    size = self._check_header(chunk, cpos)[-1]
                except DecodeError:
                    size = -1
                end = cpos + HEADER_SIZE + size
                if size >= 0 and end <= n and end - cpos <= self.max_message_size:
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
        at = self.offset  # stream offset of this frame
        header = bytes(self._buf[start : start + HEADER_SIZE])
        try:
            size = HEADER_SIZE + self._check_header(header)[-1]
        except DecodeError as exc:
            err = shifted(exc, at)
            if self.fatal_header_error(err):
                self._error = err
            else:
                # Well framed: drop this message's bytes and keep going.
                self._drop(HEADER_SIZE + int.from_bytes(header[4:], "big"))
            raise err from None
        if size > self.max_message_size:
            self._error = DecodeError(
                self.protocol,
                self.size_field,
                at + 4,
                f"message of {size} bytes exceeds the limit of {self.max_message_size}",
                code=self.oversize_code,
            )
            raise self._error
        if avail < size:
            return None
        with memoryview(self._buf) as view:  # one copy, not a bytearray slice and then bytes
            raw = bytes(view[start : start + size])
        self._drop(size)
        return raw

    def next_message(self) -> Any:
        """The next complete message, decoded; None if more bytes are needed."""
        at = self.offset
        raw = self.next_frame()
        if raw is None:
            return None
        try:
            return self.decode(raw)
        except DecodeError as exc:
            raise shifted(exc, at) from None

    def decode(self, raw: bytes) -> Any:
        """One complete frame -> its message (offsets relative to the frame)."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        while (msg := self.next_message()) is not None:
            yield msg

    def _spill(self) -> None:
        """Move the unconsumed rest of the kept chunk into the buffer."""
        chunk, cpos = self._chunk, self._cpos
        if chunk is None:
            return
        self._chunk = None
        self._consumed += cpos
        if cpos:
            self._buf += memoryview(chunk)[cpos:]
        else:
            self._buf += chunk

    def _drop(self, n: int) -> None:
        avail = len(self._buf) - self._pos
        take = min(n, avail)
        self._pos += take
        self._skip = n - take
        if self._pos >= 65536 and self._pos * 2 >= len(self._buf):
            del self._buf[: self._pos]
            self._consumed += self._pos
            self._pos = 0


def _position(got: Any, pos: int, end: int) -> int:
    """What a ``take`` of :meth:`FramedStream.take_frames` returned: a position in
    ``pos..end`` (a runtime's bug otherwise: ValueError, nothing taken)."""
    if type(got) is not int or not pos <= got <= end:
        raise ValueError(f"take() returned {got!r}, not a position in {pos}..{end}")
    return got


def shifted(exc: DecodeError, delta: int) -> DecodeError:
    """The same error with its offset moved by ``delta`` (frame offset to stream offset)."""
    return DecodeError(
        exc.protocol, exc.field, exc.offset + delta, exc.reason, code=exc.code, frame=exc.frame
    )
