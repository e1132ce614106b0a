"""The engine of ``wirekit decode``: inputs, connections, pairing, filters, statistics, output.

Inputs are a raw file (one direction, as sent), two raw files (``--client``/``--server``: both
directions of one connection) or a pcap/pcapng capture (any number of TCP connections,
reassembled by :mod:`wirekit.capture`).  Per connection the protocol is detected from the
first bytes (ZMTP greeting: Clipper; a valid MIP header; a valid y2 handshake) unless
``--proto`` says.  Each direction is decoded by its protocol's ``dump.Stream`` as bytes
arrive, so memory does not grow with the input.

Records are numbered in the order they complete (``#n``); a response is paired with its
request (MIP: in order per connection; Clipper: by message id) and, in a capture, given the
latency.  Exit status: 0, everything decoded; 1, some message was malformed or some bytes
could not be decoded (missing from the capture, skipped to resynchronise, a capture cut
short); 2, bad usage, an input that cannot be read, or one in which no protocol is found.

Input is read as it comes (a pipe's bytes as soon as they arrive, at most 1 MiB at a time):
``tcpdump -U -w - | wirekit decode -`` prints each message once its packets are in.  On a
terminal, a progress line on standard error tells how far a long input has got.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import stat
import sys
import time
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any, BinaryIO, NamedTuple, TextIO

from wirekit import capture
from wirekit._dumping import Record

EXIT_OK, EXIT_MALFORMED, EXIT_USAGE = 0, 1, 2

#: protocol name -> dump module
DUMPERS = {
    "clipper": "wirekit.clipper.dump",
    "mip": "wirekit.mip.dump",
    "y2": "wirekit.y2.dump",
}
#: bytes read from a raw file at a time
CHUNK = 1 << 20
#: bytes of a connection looked at to detect its protocol
DETECT_BYTES = 4096
ARROW = ("C>S", "S>C")


class StopDecoding(Exception):
    """``-c N`` reached."""


class Progress:
    """A progress line on a terminal's standard error for a long input.

    Drawn first after ``DELAY`` seconds (a short run shows nothing), then at most every
    ``EVERY`` seconds, and erased at the end; ``update`` is called once per chunk read.
    """

    DELAY = 0.5
    EVERY = 0.25

    def __init__(self, err: TextIO, total: int | None) -> None:
        self.err = err
        self.total = total or None
        self.start = time.monotonic()
        self.next = self.start + self.DELAY
        self.shown = False

    def update(self, done: int, messages: int) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + self.EVERY
        elapsed = now - self.start
        mb = done / 1e6
        if self.total:
            left = ""
            if done:
                left = f", about {elapsed * (self.total - done) / done:.0f} s left"
            where = f"{100 * done / self.total:.0f}% ({mb:.1f} of {self.total / 1e6:.1f} MB)"
            text = f"{where}, {messages} messages, {elapsed:.0f} s{left}"
        else:
            text = f"{mb:.1f} MB read, {messages} messages, {elapsed:.0f} s"
        self.err.write(f"\rwirekit decode: {text}\x1b[K")
        self.err.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self.shown = False


class Proto:
    """One protocol's dump module behind one interface."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.module = importlib.import_module(DUMPERS[name])
        self.args = args

    def stream(self, side: int | None, synced: bool, shared: dict) -> Any:
        max_message = self.args.max_message
        if self.name == "clipper":
            return self.module.Stream(
                side, max_message, synced, dialect=self.args.dialect, shared=shared
            )
        return self.module.Stream(side, max_message, synced)

    def render(self, rec: Record, shared: dict) -> str:
        if self.name == "clipper":
            return self.module.render(rec, shared)
        if self.name == "y2":
            return self.module.render(rec, self.args.y2_words)
        return self.module.render(rec)

    def fields(self, rec: Record, shared: dict) -> dict[str, Any]:
        if self.name == "clipper":
            return self.module.fields(rec, shared)
        return self.module.fields(rec)


def detect(head: bytes, mid_stream: bool = False) -> str | None:
    """The protocol whose messages ``head`` starts with (scans ahead when ``mid_stream``)."""
    from wirekit import mip, y2, zmtp
    from wirekit.errors import DecodeError

    if zmtp.is_zmtp(head):
        return "clipper"
    for pos in range(len(head) - 7 if mid_stream else min(1, len(head) - 7)):
        for name, check in (("mip", mip.check_header), ("y2", y2.check_handshake)):
            try:
                check(head, pos)
            except DecodeError:
                continue
            return name
    return None


#: Requests a connection may hold waiting for their responses; past this the oldest is
#: forgotten (its response is then shown unpaired).  Each is three numbers, not the message.
MAX_WAITING = 65536


class Waiting(NamedTuple):
    """What pairing keeps of a request: its number, time and kind (not the message)."""

    number: int
    ts: float | None
    kind: str


class Pairer:
    """Requests waiting for their response: a FIFO (key None) or by key (message id)."""

    def __init__(self, limit: int = MAX_WAITING) -> None:
        self.limit = limit
        self.fifo: deque[Waiting] = deque()
        self.keyed: dict[Any, Waiting] = {}

    def request(self, rec: Record, key: Any) -> None:
        waiting = Waiting(rec.number, rec.ts, rec.kind)
        if key is None:
            if len(self.fifo) >= self.limit:
                self.fifo.popleft()
            self.fifo.append(waiting)
        else:
            if len(self.keyed) >= self.limit:
                del self.keyed[next(iter(self.keyed))]
            self.keyed[key] = waiting

    def response(self, key: Any) -> Waiting | None:
        if key is None:
            return self.fifo.popleft() if self.fifo else None
        return self.keyed.pop(key, None)

    def waiting(self, key: Any) -> bool:
        return bool(self.fifo) if key is None else key in self.keyed


class Connection:
    """Both directions of one connection (or the one direction of a raw file)."""

    def __init__(self, number: int, client: Any = None, server: Any = None,
                 mid_stream: bool = False) -> None:  # fmt: skip
        self.number = number
        self.client = client
        self.server = server
        self.mid_stream = mid_stream
        self.proto: Proto | None = None
        self.streams: list[Any] = [None, None]
        self.shared: dict[str, Any] = {}
        self.pairer = Pairer()
        self.waiting: list[tuple[int, float | None, bytes]] = []  # chunks before detection
        self.head = [b"", b""]
        self.undetected = False
        self.bytes = [0, 0]
        #: the ``== connection N`` line, held until a message of it is shown (filters)
        self.header: str | None = None


class Stats:
    """``--stats``: counts, sizes, batch sizes, errors and latency percentiles."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.sizes: dict[str, list[int]] = {}  # kind -> [count, total, min, max]
        self.batches: Counter[int] = Counter()
        self.latency: dict[str, list[float]] = {}

    def add(self, rec: Record, fields: dict[str, Any], request: Waiting | None) -> None:
        kind = rec.kind
        self.kinds[kind] += 1
        if rec.error is not None:
            self.errors[f"malformed {rec.error.protocol}.{rec.error.field}"] += 1
        elif "error" in fields:
            self.errors[f"{kind} {fields['error']}"] += 1
        s = self.sizes.setdefault(kind, [0, 0, rec.size, rec.size])
        s[0] += 1
        s[1] += rec.size
        s[2] = min(s[2], rec.size)
        s[3] = max(s[3], rec.size)
        batch = getattr(rec.msg, "batch_size", None)
        if batch is None and kind == "predict_request":
            batch = len(rec.msg.inputs)
        if batch is not None and rec.error is None:
            self.batches[batch] += 1
        if rec.latency is not None and request is not None:
            key = request.kind
            if "model" in fields:
                key += f" model={fields['model']}"
            self.latency.setdefault(key, []).append(rec.latency)

    @staticmethod
    def _pct(values: list[float], p: float) -> float:
        values = sorted(values)
        k = max(0, math.ceil(p / 100 * len(values)) - 1)
        return values[k]

    def as_json(self) -> dict[str, Any]:
        return {
            "kinds": dict(self.kinds),
            "errors": dict(self.errors),
            "sizes": {
                k: {"count": c, "mean": t / c, "min": lo, "max": hi}
                for k, (c, t, lo, hi) in self.sizes.items()
            },
            "batch_sizes": {str(k): v for k, v in sorted(self.batches.items())},
            "latency_ms": {
                k: {
                    "count": len(v),
                    **{f"p{p}": self._pct(v, p) * 1000 for p in (50, 90, 99)},
                    "max": max(v) * 1000,
                }
                for k, v in self.latency.items()
            },
        }

    def text(self) -> str:
        j = self.as_json()
        lines = ["== statistics", "messages per kind:"]
        for k, n in sorted(j["kinds"].items()):
            z = j["sizes"][k]
            lines.append(
                f"  {k:<20} {n:>8}   size min {z['min']} mean {z['mean']:.1f} max {z['max']}"
            )
        if j["errors"]:
            lines.append("errors:")
            lines += [f"  {k:<40} {n:>8}" for k, n in sorted(j["errors"].items())]
        if j["batch_sizes"]:
            lines.append("batch sizes: " + ", ".join(
                f"{k}×{n}" for k, n in j["batch_sizes"].items()))  # fmt: skip
        if j["latency_ms"]:
            lines.append("latency (ms)              count      p50      p90      p99      max")
            for k, v in sorted(j["latency_ms"].items()):
                lines.append(
                    f"  {k:<22} {v['count']:>7} {v['p50']:>8.3f} {v['p90']:>8.3f} "
                    f"{v['p99']:>8.3f} {v['max']:>8.3f}"
                )
        return "\n".join(lines)


class Analyser:
    """Takes records from connections; numbers, pairs, filters, counts and prints them."""

    def __init__(self, args: argparse.Namespace, out: TextIO, err: TextIO, multi: bool) -> None:
        self.args = args
        self.out = out
        self.err = err
        self.multi = multi  # output carries connection, direction, number
        self.json = args.json
        self.quiet = args.quiet
        self.number = 0
        self.shown = 0
        self.decoded = 0
        self.malformed = 0
        self.troubles = 0  # malformed + notes about lost bytes
        self.t0: float | None = None
        self.stats = Stats() if args.stats else None
        self.kinds = set(args.kind or ())
        self.filtering = bool(
            self.kinds or args.error is not None or args.model or args.msg_id is not None
        )
        # One direction, every message shown as it is: runs of well-formed messages may be
        # formatted in one go by the protocol (no per-message records).
        self.plain = not (multi or self.filtering or self.stats or args.count or self.quiet)
        self.protos: dict[str, Proto] = {}
        self.conns: dict[int, Connection] = {}
        self._lines: list[str] = []
        self._pending = 0
        self._binary = getattr(out, "buffer", None)
        self.source = ""  #: the input's name, for messages
        self.detected = 0  #: connections whose protocol is known
        self.undetected = 0  #: connections with data in no known protocol
        self.ending: str | None = None  #: how a capture cut short ends
        self.progress: Progress | None = None
        self._out_tty = _isatty(out)

    # -- protocols and connections --------------------------------------------------------
    def proto(self, name: str) -> Proto:
        if name not in self.protos:
            self.protos[name] = Proto(name, self.args)
        return self.protos[name]

    def open(self, conn: Connection) -> None:
        self.conns[conn.number] = conn
        if self.args.proto:
            self._start(conn, self.args.proto)

    def _start(self, conn: Connection, name: str) -> None:
        conn.proto = self.proto(name)
        self.detected += 1
        synced = not conn.mid_stream
        side = None if conn.client is None and not self.multi else 0
        conn.streams = [
            conn.proto.stream(side, synced, conn.shared),
            conn.proto.stream(None if side is None else 1, synced, conn.shared),
        ]
        if self.plain and getattr(conn.streams[0], "format_run", None) is not None:
            conn.streams[0].fast = "json" if self.json else "human"
        if self.multi and conn.client is not None and not self.json and not self.quiet:
            header = (
                f"== connection {conn.number}: {_ep(conn.client)} -> {_ep(conn.server)} "
                f"({name}{', capture starts mid-stream' if conn.mid_stream else ''})"
            )
            if self.filtering:  # shown with the first message that passes the filters
                conn.header = header
            else:
                self._write(header)
        waiting, conn.waiting = conn.waiting, []
        for side_, ts, data in waiting:
            self.data(conn, side_, ts, data)

    def data(self, conn: Connection, side: int, ts: float | None, data: bytes) -> None:
        if self.t0 is None and ts is not None:
            self.t0 = ts
        conn.bytes[side] += len(data)
        if conn.proto is None:
            if conn.undetected:
                return
            conn.waiting.append((side, ts, data))
            if len(conn.head[side]) < DETECT_BYTES:
                conn.head[side] += data[: DETECT_BYTES - len(conn.head[side])]
            self._detect(conn, final=False)
            return
        self.emit(conn, side, ts, conn.streams[side].feed(data))

    def _detect(self, conn: Connection, final: bool) -> None:
        for side in (0, 1):
            head = conn.head[side]
            if len(head) >= 8 or (final and head):
                name = detect(head, conn.mid_stream)
                if name is not None:
                    self._start(conn, name)
                    return
        held = sum(len(d) for _, _, d in conn.waiting)
        if (
            final
            or held >= 2 * DETECT_BYTES
            or (not conn.mid_stream and all(len(h) >= 11 for h in conn.head))
        ):
            conn.undetected = True
            conn.waiting = []
            self.troubles += 1
            self.undetected += 1
            if self.multi and not self.json and not self.quiet:
                where = (f"connection {conn.number} ({_ep(conn.client)} -> {_ep(conn.server)})"
                         if conn.client is not None else "the input")  # fmt: skip
                self._write(f"== {where}: no MIP, ZMTP or y2 message found; give --proto")

    def gap(self, conn: Connection, side: int, ts: float | None, size: int) -> None:
        if conn.proto is None:
            conn.waiting.append((side, ts, b""))
            self.troubles += 1
            return
        # In-order pairing cannot be trusted across lost bytes: start it afresh.
        conn.pairer.fifo.clear()
        self.emit(conn, side, ts, conn.streams[side].gap(size))

    def close(self, conn: Connection) -> None:
        if conn.proto is None and not any(conn.bytes):
            return  # a connection that carried no data: nothing to decode, nothing wrong
        if conn.proto is None and not conn.undetected:
            self._detect(conn, final=True)
        if conn.proto is None:
            return
        for side in (0, 1):
            if conn.bytes[side] or (side == 0 and not self.multi):
                self.emit(conn, side, None, conn.streams[side].close())

    # -- records --------------------------------------------------------------------------
    def emit(self, conn: Connection, side: int, ts: float | None, recs: list[Record]) -> None:
        proto = conn.proto
        assert proto is not None
        module = proto.module
        for rec in recs:
            rec.conn = conn.number
            rec.side = side
            rec.ts = ts
            if rec.kind == "batch":  # formatted in one go: plain output only (see _start)
                text, count = rec.msg
                self.number += count
                self.decoded += count
                self.shown += count
                if not self.quiet:
                    self._write(text)
                continue
            if rec.kind == "note":
                self.troubles += 1
                if not self.filtering and not self.quiet:
                    self._note(conn, rec)
                continue
            self.number += 1
            rec.number = self.number
            if rec.error is not None:
                self.malformed += 1
                self.troubles += 1
                where = f"#{rec.number} " if self.multi else ""
                self._error(f"wirekit decode: {where}{rec.error}\n")
            else:
                self.decoded += 1
            request = None
            if self.multi:
                r = module.role(rec)
                if r is not None:
                    if r[0] == "request":
                        conn.pairer.request(rec, r[1])
                    else:
                        request = conn.pairer.response(r[1])
                        if request is not None:
                            rec.reply_to = request.number
                            if ts is not None and request.ts is not None:
                                rec.latency = ts - request.ts
            fields = None
            if self.filtering or self.stats is not None:
                fields = proto.fields(rec, conn.shared)
                if self.filtering and not self._match(rec, fields):
                    continue
            if self.stats is not None:
                self.stats.add(rec, fields or {}, request)
            self.shown += 1
            if not self.quiet:
                self._show(conn, rec)
            if self.args.count and self.shown >= self.args.count:
                raise StopDecoding

    def _match(self, rec: Record, fields: dict[str, Any]) -> bool:
        a = self.args
        if (
            self.kinds
            and rec.kind not in self.kinds
            and not ("malformed" in self.kinds and rec.error is not None)
        ):
            return False
        if a.error is not None:
            if rec.error is not None:
                names = {rec.error.field.lower(), "malformed"}
            elif "error" in fields:
                names = {str(fields["error"]).lower()}
            else:
                return False
            if a.error and a.error.lower() not in names:
                return False
        if a.model and fields.get("model") != a.model:
            return False
        return a.msg_id is None or fields.get("msg_id") == a.msg_id

    def _prefix(self, rec: Record) -> str:
        if not self.multi:
            return f"@{rec.offset}"
        when = "" if rec.ts is None or self.t0 is None else f" {rec.ts - self.t0:.6f}"
        return f"#{rec.number}{when} {rec.conn} {ARROW[rec.side]} @{rec.offset}"

    def _show(self, conn: Connection, rec: Record) -> None:
        proto = conn.proto
        assert proto is not None
        if conn.header is not None:
            self._write(conn.header)
            conn.header = None
        if self.json:
            head = [f'"offset":{rec.offset}']
            if self.multi:
                head = [f'"number":{rec.number}', f'"conn":{rec.conn}',
                        f'"dir":"{ARROW[rec.side]}"', *head]  # fmt: skip
                if rec.ts is not None:
                    head.append(f'"ts":{rec.ts!r}')
            tail = ""
            if rec.reply_to:
                tail = f',"reply_to":{rec.reply_to}'
                if rec.latency is not None:
                    tail += f',"latency_ms":{rec.latency * 1000:.6f}'
            if rec.error is not None:
                tail += ',"malformed":' + json.dumps(rec.error_json())
                if rec.raw:
                    tail += f',"data_hex":"{rec.raw.hex()}"'
                if rec.note:
                    tail += ',"note":' + json.dumps(rec.note)
            self._write("{" + ",".join(head) + "," + proto.module.json_body(rec) + tail + "}")
            return
        line = f"{self._prefix(rec)} {proto.render(rec, conn.shared)}"
        if rec.reply_to:
            lat = "" if rec.latency is None else f", {rec.latency * 1000:.3f} ms"
            line += f"  [reply to #{rec.reply_to}{lat}]"
        if rec.error is not None:
            line += f"\n    ! {rec.error}"
            if rec.note:
                line += f"\n    ! {rec.note}"
            if rec.excerpt:
                line += f"\n  {rec.excerpt}"
        self._write(line)

    def _note(self, conn: Connection, rec: Record) -> None:
        if self.json:
            body = {"kind": "note", "offset": rec.offset, "size": rec.size, "note": rec.note}
            if self.multi:
                body = {"conn": rec.conn, "dir": ARROW[rec.side], **body}
            self._write(json.dumps(body))
            return
        where = f"{rec.conn} {ARROW[rec.side]} @{rec.offset}" if self.multi else f"@{rec.offset}"
        self._write(f"{where} -- {rec.note}")

    def _write(self, text: str | bytes) -> None:
        """Queue one line (or a run of lines); written out in blocks of about 256 KiB.

        UTF-8 ``bytes`` (runs formatted by a protocol) go straight to the binary stream under
        ``out`` when it has one.
        """
        if isinstance(text, bytes):
            if self._binary is not None:
                self.flush()
                self.out.flush()
                self._binary.write(text + b"\n")
                return
            text = text.decode("utf-8")
        self._lines.append(text)
        self._pending += len(text)
        if self._pending >= 1 << 18:
            self.flush()

    def flush(self) -> None:
        if self._lines:
            if self.progress is not None and self._out_tty:
                self.progress.clear()
            self._lines.append("")
            self.out.write("\n".join(self._lines))
            self._lines = []
            self._pending = 0

    def flush_out(self) -> None:
        """Everything decoded so far out to the reader (before waiting for more input)."""
        self.flush()
        self.out.flush()

    def _error(self, text: str) -> None:
        if self.progress is not None:
            self.progress.clear()
        self.err.write(text)

    def capture_end(self, ending: str) -> None:
        """The capture file ends inside a record (cut short) or is damaged: say so, last."""
        self.ending = f"the capture is {ending}"
        if self.json:
            self._write(json.dumps({"kind": "capture_end", "note": self.ending}))
        elif not self.quiet:
            self._write(f"== {self.ending}")

    def no_protocol(self) -> bool:
        """True when the input had data but no connection of it is in a known protocol."""
        return self.undetected > 0 and self.detected == 0

    def finish(self, total_bytes: int) -> int:
        if self.progress is not None:
            self.progress.clear()
        if self.no_protocol():
            self.flush()
            what = "any TCP connection of the capture" if self.multi else "the input"
            self.err.write(
                f"wirekit decode: {self.source}: no protocol detected: no MIP header, ZMTP "
                f"greeting or y2 handshake in {what}; give --proto "
                f"{'|'.join(sorted(DUMPERS))} to decode it as one\n"
            )
            return EXIT_USAGE
        if self.stats is not None:
            if self.json:
                self._write(json.dumps({"stats": self.stats.as_json()}))
            else:
                self._write(self.stats.text())
        if not self.json:
            shown = f"{self.shown} of {self.number}" if self.filtering else f"{self.number}"
            summary = f"{shown} message(s), {total_bytes} bytes"
            if self.multi:
                summary += f", {len(self.conns)} connection(s)"
            if self.malformed:
                summary += f", {self.malformed} malformed"
            self._write(summary)
        self.flush()
        if self.troubles or self.ending:
            problems = [f"{self.malformed} malformed message(s)"] if self.malformed else []
            if self.troubles > self.malformed:
                problems.append("bytes missing or skipped")
            if self.ending:
                problems.append(self.ending)
            self.err.write(f"wirekit decode: {'; '.join(problems)} (exit status 1)\n")
            return EXIT_MALFORMED
        return EXIT_OK


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _ep(ep: Any) -> str:
    if ep is None:
        return "?"
    host, port = ep
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- inputs ------------------------------------------------------------------------------


class Input:
    """One input file, read as its bytes come.

    ``chunks()`` yields what is there, at most ``CHUNK`` bytes at a time, without waiting for
    a full chunk: from a pipe, the bytes written so far.  Before each read that may wait (a
    pipe, a terminal; never a regular file) it calls ``waiting()``, so that what is decoded
    so far is out before the decoder sleeps on its input.  ``done`` counts the bytes read;
    ``size`` is the file's size when it is a regular file.
    """

    def __init__(self, fh: BinaryIO, waiting: Any = None) -> None:
        self.fh = fh
        self.waiting = waiting
        self.done = 0
        self.size: int | None = None
        self.live = False
        try:
            mode = os.fstat(fh.fileno()).st_mode
        except (AttributeError, OSError, ValueError):
            return  # an in-memory file
        if stat.S_ISREG(mode):
            self.size = os.fstat(fh.fileno()).st_size
        else:
            self.live = True

    def chunks(self, progress: Progress | None = None, count: Any = None) -> Iterator[bytes]:
        read = getattr(self.fh, "read1", self.fh.read)
        while True:
            if self.live and self.waiting is not None:
                self.waiting()
            chunk = read(CHUNK)
            if not chunk:
                return
            self.done += len(chunk)
            if progress is not None:
                progress.update(self.done, count() if count is not None else 0)
            yield chunk


def _chunks(fh: BinaryIO) -> Iterator[bytes]:
    return Input(fh).chunks()


def _open(path: str) -> BinaryIO:
    if path == "-":
        return sys.stdin.buffer
    return open(path, "rb")


def _peek(fh: BinaryIO) -> tuple[bytes, BinaryIO]:
    """The first 4 bytes and a file that still yields them."""
    import io

    if fh.seekable():
        head = fh.read(4)
        fh.seek(0)
        return head, fh
    buffered = fh if isinstance(fh, io.BufferedReader) else io.BufferedReader(fh)  # type: ignore[type-var]
    return buffered.peek(4)[:4], buffered


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``wirekit decode``: returns the exit status."""
    if (args.client is None) != (args.server is None):
        err.write("wirekit decode: --client and --server go together\n")
        return EXIT_USAGE
    if args.client is not None and args.file is not None:
        err.write("wirekit decode: give either FILE or --client/--server\n")
        return EXIT_USAGE
    if args.client is None and args.file is None:
        err.write("wirekit decode: give a FILE to decode (or --client and --server)\n")
        return EXIT_USAGE
    paths = [args.client, args.server] if args.client is not None else [args.file]
    try:
        files = [_open(p) for p in paths]
    except OSError as exc:
        err.write(f"wirekit decode: cannot read {exc.filename}: {exc.strerror or exc}\n")
        return EXIT_USAGE
    try:
        if len(files) == 2:
            return _run_pair(args, out, err, files)
        head, fh = _peek(files[0])
        an = Analyser(args, out, err, multi=capture.capture_format(head) is not None)
        an.source = "standard input" if paths[0] == "-" else paths[0]
        inp = Input(fh, an.flush_out)
        if not args.quiet and _isatty(err):
            an.progress = Progress(err, inp.size)
        if an.multi:
            return _guarded(an, lambda: _capture_body(an, inp))
        return _guarded(an, lambda: _raw_body(an, inp))
    finally:
        for fh in files:
            if fh is not sys.stdin.buffer:
                fh.close()


def _guarded(analyser: Analyser, body) -> int:
    """Run ``body``, then print the summary; whatever stops it, what was decoded is out."""
    total = 0
    interrupted = False
    try:
        total = body()
    except StopDecoding:
        total = -1
    except capture.CaptureError as exc:
        if analyser.progress is not None:
            analyser.progress.clear()
        analyser.flush()
        analyser.err.write(f"wirekit decode: {analyser.source}: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C on a live capture: what came so far, summed up
        interrupted = True
    code = analyser.finish(max(total, 0))
    return 130 if interrupted else code


def _raw_body(an: Analyser, inp: Input) -> int:
    conn = Connection(1)
    an.open(conn)
    for chunk in inp.chunks(an.progress, lambda: an.number):
        an.data(conn, 0, None, chunk)
        if conn.undetected:
            break  # no protocol at its start: the rest is not read
    an.close(conn)
    return inp.done


def _capture_body(an: Analyser, inp: Input) -> int:
    reasm = capture.Reassembler(an.args.max_pending)
    reader = capture.CaptureReader()
    wanted = an.args.conn
    total = 0

    def handle(events) -> None:
        for ev in events:
            if isinstance(ev, capture.Opened):
                if wanted is None or ev.conn == wanted:
                    an.open(Connection(ev.conn, ev.client, ev.server, ev.mid_stream))
                continue
            conn = an.conns.get(ev.conn)
            if conn is None:
                continue
            if isinstance(ev, capture.Chunk):
                an.data(conn, ev.side, ev.ts, ev.data)
            else:
                an.gap(conn, ev.side, ev.ts, ev.size)

    segment_of = capture.segment_of
    for chunk in inp.chunks(an.progress, lambda: an.number):
        for record in reader.feed(chunk):
            seg = segment_of(*record)
            if seg is not None:
                total += len(seg.payload)
                handle(reasm.feed(seg))
    ending = reader.end()  # raises CaptureError for a file that is no capture at all
    handle(reasm.finish())
    for conn in an.conns.values():
        an.close(conn)
    if ending is not None:
        an.capture_end(ending)
    return total


def _run_pair(args, out, err, files) -> int:
    """Two raw files, one per direction, merged on one timeline (see ``next_side``)."""
    an = Analyser(args, out, err, multi=True)
    an.source = f"{args.client} and {args.server}"
    conn = Connection(1)
    an.open(conn)
    if conn.proto is None:  # detect from the first bytes of each file
        heads = [f.read(DETECT_BYTES) for f in files]
        for head in heads:
            name = detect(head)
            if name is not None:
                an._start(conn, name)
                break
        else:
            err.write(f"wirekit decode: {an.source}: no protocol detected: no MIP header, ZMTP "
                      "greeting or y2 handshake at the start of either file; give --proto "
                      f"{'|'.join(sorted(DUMPERS))} to decode them as one\n")  # fmt: skip
            return EXIT_USAGE
        pending = [conn.streams[s].feed(heads[s]) for s in (0, 1)]
        totals = [len(h) for h in heads]
    else:
        pending, totals = [[], []], [0, 0]
    assert conn.proto is not None  # given, or detected above (else the usage error)
    module = conn.proto.module
    queues: list[deque[Record]] = [deque(pending[0]), deque(pending[1])]
    feeders = [_chunks(files[0]), _chunks(files[1])]
    ended = [False, False]

    def fill(side: int) -> bool:
        """Refill one side's queue; False once it has nothing more."""
        while not queues[side]:
            if ended[side]:
                return False
            chunk = next(feeders[side], None)
            if chunk is None:
                ended[side] = True
                queues[side].extend(conn.streams[side].close())
            else:
                totals[side] += len(chunk)
                queues[side].extend(conn.streams[side].feed(chunk))
        return True

    def body() -> int:
        while True:
            heads = [queues[s][0] if fill(s) else None for s in (0, 1)]
            if heads[0] is None and heads[1] is None:
                break
            take = next_side(heads, module.role, conn.pairer)
            an.emit(conn, take, None, [queues[take].popleft()])
        return sum(totals)

    return _guarded(an, body)


def next_side(heads: list[Record | None], role: Any, pairer: Pairer) -> int:
    """Which of two raw directions' next records comes first on their timeline.

    Raw files carry no timestamps: the order is the one pairing can prove.  A response whose
    request has been shown comes next (right after its request, or after the other
    responses before it); otherwise the client's next record, unless it is a response whose
    request has not been shown yet (then the server's, which may hold that request); a
    direction whose records are all out lets the other's come as they are.
    """
    waiting_for = [False, False]
    for side, rec in enumerate(heads):
        if rec is None:
            continue
        r = role(_sided(rec, side))
        if r is not None and r[0] == "response":
            if pairer.waiting(r[1]):
                return side
            waiting_for[side] = True
    if heads[1] is None:
        return 0
    if heads[0] is None:
        return 1
    return 1 if waiting_for[0] and not waiting_for[1] else 0


def _sided(rec: Record, side: int) -> Record:
    rec.side = side
    return rec
