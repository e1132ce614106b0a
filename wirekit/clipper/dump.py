"""``wirekit decode --proto clipper``: one direction of a Clipper connection (ZMTP on TCP).

The stream is one direction of the TCP connection between Clipper (ZeroMQ ROUTER) and a
model container (DEALER).  The READY command's Socket-Type says which side sent it; the
Clipper generation is detected from the messages (or given with ``--generation``) and shared by
both directions of a connection.  A ZMTP message whose frames are not a valid Clipper message
is shown with its error and decoding goes on with the next ZMTP message; a ZMTP framing error
ends the direction (ZMTP has no marker to resynchronise on).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, cast

from wirekit import clipper, zmtp
from wirekit._dumping import MALFORMED_SHOWN, Record, hex_excerpt
from wirekit._vocabulary import add_deprecated_alias
from wirekit.clipper.messages import to_jsonable
from wirekit.errors import DecodeError

PROTOCOL = "clipper"
#: Socket-Type -> (side that sent the capture, direction of its messages)
SIDES = {
    "DEALER": ("container", clipper.Direction.TO_CLIPPER),
    "ROUTER": ("clipper", clipper.Direction.TO_CONTAINER),
}
ARROWS = {"container": "container → Clipper", "clipper": "Clipper → container"}
PREVIEW = 8
#: Messages held while the generation is not yet known (then each is reported undecidable).
MAX_HELD = 256
#: Bytes of the stream kept to show the place of an error.
_WINDOW = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    generation = parser.add_argument(
        "--generation",
        dest="dialect",
        choices=[g.value for g in clipper.Generation],
        help="clipper: the Clipper RPC generation, as in wirekit clipper (default: detected "
        "from the messages)",
    )
    add_deprecated_alias(parser, "--dialect", of=generation)


def _frame_offsets(data: bytes, start: int, count: int) -> list[int] | None:
    """Offsets in ``data`` of the bodies of the ``count`` frames of the message at ``start``."""
    offsets, pos = [], start
    for _ in range(count):
        if pos + 2 > len(data):
            return None
        if data[pos] & zmtp.FLAG_LONG:
            size, head = int.from_bytes(data[pos + 1 : pos + 9], "big"), 9
        else:
            size, head = data[pos + 1], 2
        offsets.append(pos + head)
        pos += head + size
    return offsets


class Stream:
    """One direction of a Clipper connection: feed bytes, take records out.

    ``shared`` is one dict for both directions of a connection (the generation, the model).
    """

    def __init__(
        self,
        side: int | None = None,
        max_message: int | None = None,
        synced: bool = True,
        *,
        dialect: str | None = None,
        shared: dict | None = None,
    ) -> None:
        self.reader = zmtp.StreamReader() if max_message is None else zmtp.StreamReader(max_message)
        self.shared = shared if shared is not None else {}
        if dialect:
            self.shared["generation"] = clipper.Generation(dialect)
        self.peer: str | None = None  # "container" or "clipper", from READY
        self.direction: clipper.Direction | None = None
        # Records (READY) and (offset, size, frames) waiting
        self._held: list[Record | tuple[int, int, list[bytes]]] = []
        self._window = bytearray()
        self._window_base = 0
        self._fed = 0
        self._done = False
        self._head = bytearray()
        self._mid_stream = not synced

    def _remember(self, data: bytes) -> None:
        self._window += data
        self._fed += len(data)
        extra = len(self._window) - _WINDOW
        if extra > 0:
            del self._window[:extra]
            self._window_base += extra

    def _excerpt(self, offset: int) -> str:
        return hex_excerpt(bytes(self._window), offset, base=self._window_base)

    def feed(self, data: bytes, final: bool = False) -> list[Record]:
        if self._done:
            return []
        if self._fed == 0:  # hold the first bytes until the greeting's signature is in
            self._head += data
            if len(self._head) < 11 and not final:
                return []
            data, self._head = bytes(self._head), bytearray()
            if not data:  # nothing at all (an empty file): no messages, as for MIP and y2
                self._done = True
                return []
            if not zmtp.is_zmtp(data[:11]):
                self._done = True
                if self._mid_stream:
                    return [Record(0, len(data), "note", note="the capture starts after the "
                                   "ZMTP greeting; a ZMTP stream cannot be resynchronised: "
                                   "this direction is skipped")]  # fmt: skip
                exc = DecodeError(
                    PROTOCOL, "capture", 0,
                    "not a ZMTP capture: a capture of one direction of a ZeroMQ TCP connection "
                    "starts with the ZMTP 3 greeting (0xff ... 0x7f 0x03)",
                )  # fmt: skip
                return [Record(0, len(data), "unknown", error=exc, raw=bytes(data[:64]),
                               excerpt=hex_excerpt(bytes(data[:32]), 0))]  # fmt: skip
        out: list[Record] = []
        self._remember(data)
        self.reader.feed(data)
        self._drain(out)
        return out

    def gap(self, size: int) -> list[Record]:
        if self._done:
            return []
        self._done = True
        return [
            Record(
                self._fed,
                size,
                "note",
                note=f"{size} bytes missing from the capture; "
                "ZMTP cannot be resynchronised: the rest of this direction is skipped",
            )
        ]

    def close(self) -> list[Record]:
        out: list[Record] = []
        if self._fed == 0 and not self._done:
            return self.feed(b"", final=True) + self.close()
        if not self._done:
            self.reader.close()
            self._drain(out)
        out.extend(self._release(self.shared.get("generation")))
        return out

    def _drain(self, out: list[Record]) -> None:
        try:
            for offset, event in self.reader:
                out.extend(self._event(offset, event))
        except DecodeError as exc:
            self._done = True
            rec = Record(exc.offset, 0, "zmtp_frame", error=exc, excerpt=self._excerpt(exc.offset))
            rec.note = "ZMTP framing broken: the rest of this direction cannot be decoded"
            out.append(rec)

    def _event(self, offset: int, event: Any) -> list[Record]:
        if isinstance(event, zmtp.Greeting):
            msg: dict[str, Any] = {
                "kind": "zmtp_greeting",
                "version": f"{event.major}.{event.minor}",
                "mechanism": event.mechanism,
            }
            return [Record(offset, zmtp.GREETING_SIZE, "zmtp_greeting", msg)]
        if isinstance(event, zmtp.Ready):
            socket_type = event.socket_type
            if socket_type not in SIDES:
                exc = DecodeError(
                    PROTOCOL, "Socket-Type", offset,
                    f"socket type {socket_type!r} is not a side of a Clipper connection "
                    "(DEALER: container, ROUTER: Clipper)",
                )  # fmt: skip
                self._done = True
                return [Record(offset, 0, "zmtp_ready", error=exc, excerpt=self._excerpt(offset))]
            self.peer, self.direction = SIDES[socket_type]
            msg = {"kind": "zmtp_ready", "socket_type": socket_type, "side": self.peer,
                   "identity_hex": event.identity.hex(), "generation": None}  # fmt: skip
            rec = Record(offset, 0, "zmtp_ready", msg)
            if self.shared.get("generation") is None:
                self._held.append(rec)  # shown once the generation is known
                return []
            msg["generation"] = self.shared["generation"].value
            return [rec]
        if isinstance(event, zmtp.Command):
            msg = {"kind": "zmtp_command", "name": event.name, "data_hex": event.data.hex()}
            return [Record(offset, 0, "zmtp_command", msg)]
        frames = list(event.frames)
        size = sum(len(f) for f in frames)
        gen = self.shared.get("generation")
        if gen is None and self.direction is not None:
            found = clipper.detect(frames, self.direction)
            if found is not None:
                gen = self.shared["generation"] = clipper.Generation(found)
        if gen is None:
            if len(self._held) < MAX_HELD:
                self._held.append((offset, size, frames))
                return []
            return [self._undecidable(offset, size)]
        out = self._release(gen)
        out.append(self._message(offset, size, frames, gen))
        return out

    def _release(self, gen: Any) -> list[Record]:
        out = []
        held, self._held = self._held, []
        for item in held:
            if isinstance(item, Record):
                item.msg["generation"] = None if gen is None else gen.value
                out.append(item)
            elif gen is None:
                out.append(self._undecidable(item[0], item[1]))
            else:
                out.append(self._message(*item, gen))
        return out

    def _undecidable(self, offset: int, size: int) -> Record:
        exc = DecodeError(
            PROTOCOL, "generation", offset,
            "cannot tell the Clipper generation from this capture; give --generation",
        )  # fmt: skip
        return Record(offset, size, "unknown", error=exc, excerpt=self._excerpt(offset),
                      info={"side": self.peer})  # fmt: skip

    def _message(self, offset: int, size: int, frames: list, gen: Any) -> Record:
        info = {"side": self.peer, "generation": gen.value, "frames": len(frames)}
        try:
            # messages come after the READY, which set the direction
            msg = clipper.decode(frames, gen, cast(clipper.Direction, self.direction))
        except DecodeError as exc:
            k = exc.frame if exc.frame is not None and exc.frame < len(frames) else None
            at = offset
            if k is not None:
                window = bytes(self._window)
                offs = _frame_offsets(window, offset - self._window_base, k + 1)
                if offs is not None and offset >= self._window_base:
                    at = offs[k] + self._window_base + exc.offset
            where = f"frame {k} of " if k is not None else ""
            err = DecodeError(
                PROTOCOL, exc.field, at,
                f"{exc.reason} ({where}the {gen.value} message at byte {offset})",
            )  # fmt: skip
            raw = b"".join(bytes(f) for f in frames)[:MALFORMED_SHOWN]
            return Record(offset, size, "unknown", error=err, raw=raw,
                          excerpt=self._excerpt(at), info=info)  # fmt: skip
        if isinstance(msg, clipper.NewContainer):
            self.shared["model"] = msg.model_name
        rec = Record(offset, size, to_jsonable(msg, full_data=False)["kind"], msg, info=info)
        return rec


def role(rec: Record) -> tuple[str, Any] | None:
    """Pairing: a predict_response answers the predict_request with its msg_id."""
    if rec.kind == "predict_request":
        return "request", rec.msg.msg_id
    if rec.kind == "predict_response":
        return "response", rec.msg.msg_id
    return None


def fields(rec: Record, shared: dict | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": rec.kind}
    msg_id = getattr(rec.msg, "msg_id", None)
    if msg_id is not None:
        out["msg_id"] = msg_id
    if shared and "model" in shared:
        out["model"] = shared["model"]
    return out


def jsonable(rec: Record, full: bool = True) -> dict[str, Any]:
    if isinstance(rec.msg, dict):  # ZMTP handshake records
        return dict(rec.msg)
    if rec.msg is None:
        return {"kind": rec.kind, **{k: v for k, v in rec.info.items() if v is not None}}
    return {**rec.info, **to_jsonable(rec.msg, full_data=full)}


def _values(values: list, size: int) -> str:
    shown = " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values[:PREVIEW])
    return shown + (" ..." if size > min(len(values), PREVIEW) else "")


def render(rec: Record, shared: dict | None = None) -> str:
    """The human form of one record."""
    record = jsonable(rec, full=False)
    kind = record["kind"]
    if rec.error is not None:
        side = record.get("side")
        where = f"[{ARROWS[side]}] " if side in ARROWS else ""
        return f"{where}{kind} [Malformed] ({rec.size} bytes)"
    if kind == "zmtp_greeting":
        return f"ZMTP {record['version']} greeting, mechanism {record['mechanism']}"
    if kind == "zmtp_ready":
        gen = record["generation"] or "unknown"
        ident = f" identity={record['identity_hex']}" if record["identity_hex"] else ""
        return (
            f"READY Socket-Type={record['socket_type']}{ident}: {record['side']} side "
            f"({ARROWS[record['side']]}), Clipper generation {gen}"
        )
    if kind == "zmtp_command":
        return f"ZMTP command {record['name']} data={record['data_hex'] or '-'}"
    head = f"[{ARROWS[record['side']]}, {record['generation']}] {kind}"
    if kind == "new_container":
        rpc = f" rpc_version={record['rpc_version']}" if record["rpc_version"] is not None else ""
        return (
            f"{head} model={record['model_name']!r} version={record['model_version']!r} "
            f"input_type={record['input_type_name']}{rpc}"
        )
    if kind == "heartbeat":
        return head
    if kind == "heartbeat_reply":
        return f"{head} {record['heartbeat_type_name']}"
    if kind == "predict_response":
        outs = record["outputs"]
        shown = ", ".join(repr(o) if isinstance(o, str) else f"{o:g}" for o in outs[:PREVIEW])
        more = ", ..." if len(rec.msg.outputs) > PREVIEW else ""
        return f"{head} msg_id={record['msg_id']} {len(rec.msg.outputs)} output(s): [{shown}{more}]"
    # predict_request
    n = record["num_inputs"]
    lines = [
        f"{head} msg_id={record['msg_id']} request_type={record['request_type']} "
        f"{record['input_type_name']} × {n}"
    ]
    if record["input_type_name"] == "STRINGS":
        for k, s in enumerate(record["inputs"][:PREVIEW]):
            lines.append(f"    [{k}] str {s!r}")
    else:
        shape = record.get("shape")
        lines[0] += f" dtype={record['dtype']}" + (f" shape={tuple(shape)}" if shape else "")
        for k, item in enumerate(record["inputs"][:PREVIEW]):
            preview = _values(item["values"], item["size"])
            lines.append(f"    [{k}] {record['dtype']}[{item['size']}] {preview}")
    if n > PREVIEW:
        lines.append(f"    ... {n - PREVIEW} more input(s)")
    return "\n".join(lines)


def json_body(rec: Record) -> str:
    return json.dumps(jsonable(rec), separators=(",", ":"))[1:-1]
