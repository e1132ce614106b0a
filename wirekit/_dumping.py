"""What every ``wirekit decode`` protocol shares: the record, the framed stream, hex excerpts.

A protocol's ``dump`` module offers a ``Stream`` class: one direction of a connection, fed
bytes in order (``feed``), told of bytes missing from a capture (``gap``) and of the end
(``close``); each call returns the :class:`Record` objects it completes, in stream order.
A message that does not decode is a record too, with ``error`` set, and decoding goes on
after it wherever the framing says where the next message starts.
"""

from __future__ import annotations

from typing import Any

from wirekit.errors import DecodeError

#: Default cap on one message for resynchronisation: a header announcing more than this is
#: taken as lost framing, not as a message to wait for (``--max-message`` changes it).
DEFAULT_MAX_MESSAGE = 64 * 1024 * 1024

#: Bytes of a malformed message kept to show (hex) in the output.
MALFORMED_SHOWN = 4096


def hex_excerpt(data: bytes, offset: int, radius: int = 16, base: int = 0) -> str:
    """Hex of the bytes around ``offset`` with the byte at ``offset`` in brackets.

    ``data[0]`` is at stream offset ``base``; ``offset`` and the printed address are stream
    offsets.
    """
    at = offset - base
    start = max(0, at - radius)
    stop = min(len(data), at + radius)
    parts = [f"{b:02x}" for b in data[start:stop]]
    if 0 <= at < len(data):
        parts[at - start] = f"[{parts[at - start]}]"
    else:
        parts.append("[..end]")
    return f"  {base + start:08x}: " + " ".join(parts)


class Record:
    """One decoded (or malformed) message, or a note about the stream (``kind`` ``note``).

    A ``batch`` record stands for ``msg[1]`` well-formed messages already formatted as the
    text ``msg[0]`` (see ``FramedStream.format_run``).

    ``offset`` and ``size`` place it in its direction's byte stream.  ``msg`` is the decoded
    message, ``error`` the :class:`DecodeError` of a malformed one (offsets in the stream),
    ``raw`` the first bytes of a malformed message and ``excerpt`` the hex around the error.
    The analyser fills in ``conn``, ``side``, ``ts``, ``number``, ``reply_to``, ``latency``.
    ``info`` holds protocol fields known without a full decode (header fields of a
    malformed message, the ZMTP side, the Clipper generation ...).
    """

    __slots__ = (
        "conn",
        "error",
        "excerpt",
        "info",
        "kind",
        "latency",
        "msg",
        "note",
        "number",
        "offset",
        "raw",
        "reply_to",
        "side",
        "size",
        "ts",
    )  # fmt: skip

    def __init__(
        self,
        offset: int,
        size: int,
        kind: str,
        msg: Any = None,
        *,
        error: DecodeError | None = None,
        raw: bytes = b"",
        excerpt: str = "",
        note: str = "",
        info: dict[str, Any] | None = None,
    ) -> None:
        self.offset = offset
        self.size = size
        self.kind = kind
        self.msg = msg
        self.error = error
        self.raw = raw
        self.excerpt = excerpt
        self.note = note
        self.info = info or {}
        self.conn = 0
        self.side = 0
        self.ts: float | None = None
        self.number = 0
        self.reply_to = 0
        self.latency: float | None = None

    @property
    def malformed(self) -> bool:
        return self.error is not None

    def error_json(self) -> dict[str, Any] | None:
        e = self.error
        if e is None:
            return None
        return {"protocol": e.protocol, "field": e.field, "offset": e.offset, "reason": e.reason}


def malformed(
    buf: Any, pos: int, end: int, base: int, exc: DecodeError, kind: str, info: dict
) -> Record:
    """The record of a malformed message at ``buf[pos:end]`` (``buf[0]`` at stream ``base``).

    ``exc`` has offsets in ``buf``; the record's error has them in the stream.
    """
    err = DecodeError(exc.protocol, exc.field, exc.offset + base, exc.reason, code=exc.code)
    excerpt = hex_excerpt(
        bytes(buf[max(pos, exc.offset - 16) : exc.offset + 16]),
        err.offset,
        base=base + max(pos, exc.offset - 16),
    )
    raw = bytes(buf[pos : min(end, pos + MALFORMED_SHOWN)])
    return Record(base + pos, end - pos, kind, error=err, raw=raw, excerpt=excerpt, info=info)


class FramedStream:
    """One direction of a protocol whose messages announce their size in a fixed header.

    Subclasses give ``HEADER`` (header bytes), ``frame_size(buf, pos)`` (the whole message's
    size from the header, or None when the header cannot be trusted for framing),
    ``plausible(buf, pos)`` (a header a resynchronisation may stop at) and
    ``decode(buf, pos, end)`` (a Record, raising DecodeError for a bad message).  The rest —
    buffering without copying big messages more than once, malformed messages, gaps and
    resynchronisation — is here, once.
    """

    HEADER = 8
    PROTOCOL = ""
    #: ``format_run(buf, pos, stop, base, as_json) -> (text, pos, count)`` when the protocol
    #: can format runs of well-formed messages in one go (see ``wirekit.mip.dump``); used
    #: when ``fast`` is set ("human" or "json"): the records then come as one "batch"
    #: record holding ``(text, count)``.
    format_run = None
    fast: str | None = None

    def __init__(
        self, side: int | None = None, max_message: int = DEFAULT_MAX_MESSAGE, synced: bool = True
    ) -> None:
        #: which direction this stream is (0 client to server, 1 back), when known
        self.side = side
        self.max_message = max_message
        self._buf = b""
        self._parts: list[bytes] = []
        self._have = 0
        self._need = 0
        self._base = 0  # stream offset of _buf[0]
        self.synced = synced
        self._skipped = 0
        self._skip_from = 0

    # -- to override ----------------------------------------------------------------------
    def frame_size(self, buf: bytes, pos: int) -> int | None:
        raise NotImplementedError

    def plausible(self, buf: bytes, pos: int) -> bool:
        raise NotImplementedError

    def decode(self, buf: bytes, pos: int, end: int) -> Record:
        raise NotImplementedError

    def describe(self, buf: bytes, pos: int) -> tuple[str, dict]:
        """``(kind, info)`` of a message from its header alone (for a malformed one)."""
        return "unknown", {}

    # -- the machinery --------------------------------------------------------------------
    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a message (at most one message, or a header)."""
        return len(self._buf) + self._have if self._parts else len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Record]:
        """Bytes of the stream, in order; returns the records they complete."""
        if type(data) is not bytes:
            data = bytes(data)
        if self._parts:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            data = b"".join(self._parts)
            self._parts = []
        elif self._buf:
            data = self._buf + data
        self._buf = b""
        out: list[Record] = []
        pos = self._run(data, out, final=False)
        self._keep(data, pos)
        return out

    def _keep(self, data: bytes, pos: int) -> None:
        self._base += pos
        rest = data[pos:]
        if self._need > len(rest) and len(rest) >= self.HEADER:
            self._parts = [rest]
            self._have = len(rest)
        else:
            self._buf = rest

    def _run(self, buf: bytes, out: list[Record], final: bool) -> int:
        pos, n, head = 0, len(buf), self.HEADER
        base = self._base
        self._need = 0
        run = self.format_run if self.fast is not None else None
        while n - pos >= head:
            if run is not None and self.synced:
                text, stop, count = run(buf, pos, n, base, self.fast == "json")
                if count:
                    out.append(Record(base + pos, stop - pos, "batch", (text, count)))
                    pos = stop
                    if n - pos < head:
                        break
            if not self.synced:
                start = pos
                while n - pos >= head and not self.plausible(buf, pos):
                    pos += 1
                self._skipped += pos - start
                if n - pos < head:
                    break
                self._resynced(base + pos, out)
            size = self.frame_size(buf, pos)
            if size is None or size > self.max_message:
                kind, info = self.describe(buf, pos)
                if size is not None:
                    exc = DecodeError(
                        self.PROTOCOL, "size", pos,
                        f"announces a {size}-byte message, more than the "
                        f"{self.max_message}-byte limit (--max-message)",
                    )  # fmt: skip
                else:
                    try:
                        self.decode(buf, pos, pos + head)
                        exc = DecodeError(self.PROTOCOL, "header", pos, "implausible header")
                    except DecodeError as e:
                        exc = e
                rec = malformed(buf, pos, pos + head, base, exc, kind, info)
                rec.note = "framing lost: resynchronising on the next plausible header"
                out.append(rec)
                self.synced = False
                self._skip_from = base + pos + head
                pos += head
                continue
            end = pos + size
            if end > n:
                self._need = size
                break
            try:
                rec = self.decode(buf, pos, end)
            except DecodeError as exc:
                kind, info = self.describe(buf, pos)
                rec = malformed(buf, pos, end, base, exc, kind, info)
            else:
                rec.offset += base
            out.append(rec)
            pos = end
        if final and pos < n:
            if not self.synced:
                self._skipped += n - pos
                self._resynced(base + n, out, at_end=True)
            else:
                try:
                    self.decode(buf, pos, n)
                    error = DecodeError(self.PROTOCOL, "message", n, "truncated")
                except DecodeError as e:
                    error = e
                kind, info = self.describe(buf, pos) if n - pos >= head else ("unknown", {})
                out.append(malformed(buf, pos, n, base, error, kind, info))
            pos = n
        elif final and not self.synced and self._skipped:
            self._resynced(base + pos, out, at_end=True)
        return pos

    def _resynced(self, at: int, out: list[Record], at_end: bool = False) -> None:
        if self._skipped or at_end:
            what = "end of the stream" if at_end else f"a plausible header at byte {at}"
            out.append(
                Record(
                    self._skip_from, self._skipped, "note",
                    note=f"skipped {self._skipped} bytes that do not start a message, "
                    f"resynchronised on {what}",
                )
            )  # fmt: skip
        self._skipped = 0
        self.synced = True

    def gap(self, size: int) -> list[Record]:
        """``size`` bytes are missing here: drop the partial message, resynchronise after."""
        out: list[Record] = []
        data = b"".join(self._parts) if self._parts else self._buf
        self._parts, self._buf, self._need = [], b"", 0
        at = self._base
        self._base += len(data) + size
        note = f"{size} bytes missing from the capture"
        if data:
            note += f" (a message of which {len(data)} bytes were seen at byte {at} is lost)"
        out.append(Record(at, len(data) + size, "note", note=note))
        self.synced = False
        self._skip_from = self._base
        return out

    def close(self) -> list[Record]:
        """End of the stream: a partial message left over is malformed (truncated)."""
        data = b"".join(self._parts) if self._parts else self._buf
        self._parts, self._buf = [], b""
        out: list[Record] = []
        pos = self._run(data, out, final=True)
        self._base += pos
        return out
