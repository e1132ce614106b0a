"""A sans-IO incremental ZMTP reader: feed it bytes of one direction, take events out.

No sockets here.  Frame sizes are checked against ``max_frame_size`` as soon as a frame's size
field has arrived, before its body is buffered; a multipart message is bounded by
``max_message_frames`` frames and ``max_message_size`` body bytes, checked the same way.

Decoding is linear in the bytes fed, however they are cut: the complete frames of an
unfinished multipart message are kept (in a :class:`~wirekit.zmtp.messages.Pending`) and never
read again, and the codec is not called again until enough bytes have arrived to get past the
header it last stopped at.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from types import ModuleType

from wirekit.errors import DecodeError

from .messages import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_FRAMES,
    DEFAULT_MAX_MESSAGE_SIZE,
    PHASE_GREETING,
    Event,
    Pending,
    Ready,
)


class StreamReader:
    """Incremental reader for one direction of a ZMTP 3.x connection (NULL mechanism).

    ``feed(data)`` decodes what it can at once and queues complete events; iterating (or
    ``next_event()``) takes them out, each as an ``(offset, event)`` pair whose offset counts
    from the first byte ever fed.  ``close()`` says the stream ended: a partial tail is then an
    error.  A :class:`~wirekit.errors.DecodeError` breaks the reader (ZMTP cannot resync):
    ``broken`` becomes True at once, the events decoded before the bad bytes are still handed
    out, then ``next_event`` (and any later ``feed``) raises the error.

    Limits (None: none), each a ``size``/``message`` DecodeError as soon as the flags or size
    field that breaks it arrives, before any body is buffered: ``max_frame_size`` bytes in one
    frame; ``max_message_frames`` frames and ``max_message_size`` body bytes (all frames
    together) in one multipart message.  A negative limit is a ValueError.
    """

    def __init__(
        self,
        max_frame_size: int | None = DEFAULT_MAX_FRAME_SIZE,
        *,
        max_message_frames: int | None = DEFAULT_MAX_MESSAGE_FRAMES,
        max_message_size: int | None = DEFAULT_MAX_MESSAGE_SIZE,
        codec: ModuleType | None = None,
    ) -> None:
        if codec is None:
            from wirekit import zmtp as active

            codec = active  # the active implementation
        self._codec = codec
        self.max_frame_size = max_frame_size
        self.max_message_frames = max_message_frames
        self.max_message_size = max_message_size
        # the codec checks the limits (ValueError for a negative one) before it decodes
        codec.decode_events(
            b"",
            0,
            PHASE_GREETING,
            False,
            max_frame_size,
            max_message_frames=max_message_frames,
            max_message_size=max_message_size,
        )
        self._buf = bytearray()
        self._consumed = 0  # stream offset of _buf[0]
        self._phase = PHASE_GREETING
        self._pending = Pending()  # the unfinished multipart message, if any
        self._events: deque[tuple[int, Event]] = deque()
        self._error: DecodeError | None = None
        self.ready: Ready | None = None

    @property
    def broken(self) -> bool:
        """True once the stream can no longer be decoded."""
        return self._error is not None

    @property
    def buffered(self) -> int:
        """Bytes received that are not yet part of a complete event."""
        pending = self._pending
        # the kept frames of an unfinished message count too: from its start on
        return len(self._buf) - pending.start if pending.frames else len(self._buf)

    @property
    def socket_type(self) -> str | None:
        """The peer's Socket-Type from its READY command, once that has arrived."""
        return None if self.ready is None else self.ready.socket_type

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the peer and decode every event they complete.

        Raises only when the reader was already broken (nothing is buffered then); an error
        found in these bytes comes out of ``next_event`` after the events before it.
        """
        if self._error is not None:
            raise self._error
        self._buf += memoryview(data).cast("B")
        self._run(final=False)

    def close(self) -> None:
        """The stream has ended: a partial tail becomes an error (from ``next_event``)."""
        if self._error is None:
            self._run(final=True)

    def next_event(self) -> tuple[int, Event] | None:
        """The next complete ``(offset, event)``, or None when more bytes are needed."""
        if self._events:
            return self._events.popleft()
        if self._error is not None:
            raise self._error
        return None

    def __iter__(self) -> Iterator[tuple[int, Event]]:
        while (item := self.next_event()) is not None:
            yield item

    def _run(self, final: bool) -> None:
        pending = self._pending
        if not final and len(self._buf) < pending.need:
            return  # the codec would stop at the same header again
        events, pos, phase, error = self._codec.decode_events(
            self._buf,
            0,
            self._phase,
            final,
            self.max_frame_size,
            max_message_frames=self.max_message_frames,
            max_message_size=self.max_message_size,
            pending=pending,
        )
        self._phase = phase
        for offset, event in events:
            if self.ready is None and isinstance(event, Ready):
                self.ready = event
            self._events.append((offset + self._consumed, event))
        if error is not None:
            self._error = DecodeError(
                error.protocol, error.field, error.offset + self._consumed, error.reason
            )
            # the stream cannot be resynchronised: hold nothing more
            self._buf.clear()
            self._pending = Pending()
            return
        if pos:
            del self._buf[:pos]  # O(1): a bytearray drops its head by moving its start
            self._consumed += pos
            pending.dropped(pos)
