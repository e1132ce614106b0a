"""``wirekit decode --proto y2``: one direction of a y2 worker link, message by message.

Every message announces its payload size in its 8-byte handshake, so a message with a bad
type, a size its type does not allow or bad NodeIndex values is shown with its error and
decoding goes on after it.  A negative size, or one over ``--max-message``, means the framing
is lost: the stream is resynchronised on the next handshake that passes every check.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from wirekit import y2
from wirekit._dumping import FramedStream, Record
from wirekit.errors import DecodeError
from wirekit.y2.messages import to_jsonable, type_name

PROTOCOL = "y2"
HANDSHAKE = 8
_TYPES = {0: "node_index", 1: "delta", 2: "runtime", 3: "finished"}

#: Words of a Delta shown by the human form unless ``--y2-words`` says otherwise.
DEFAULT_SHOWN = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--y2-words",
        type=int,
        default=DEFAULT_SHOWN,
        metavar="N",
        help=f"y2: delta words to show per message in the human form (default {DEFAULT_SHOWN})",
    )


class Stream(FramedStream):
    """One direction of the worker link: feed bytes, take records out."""

    HEADER = HANDSHAKE
    PROTOCOL = PROTOCOL

    def frame_size(self, buf: bytes, pos: int) -> int | None:
        size = int.from_bytes(buf[pos + 4 : pos + 8], "big", signed=True)
        return None if size < 0 else HANDSHAKE + size

    def plausible(self, buf: bytes, pos: int) -> bool:
        try:
            size = y2.check_handshake(buf, pos)[1]
        except DecodeError:
            return False
        return HANDSHAKE + size <= self.max_message

    def describe(self, buf: bytes, pos: int) -> tuple[str, dict]:
        kind = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
        size = int.from_bytes(buf[pos + 4 : pos + 8], "big", signed=True)
        return _TYPES.get(kind, f"type{kind}"), {"type": kind, "size": size}

    def decode(self, buf: bytes, pos: int, end: int) -> Record:
        msg, stop = y2.decode_prefix(buf, pos)
        return Record(pos, stop - pos, type_name(msg), msg)


def role(rec: Record) -> tuple[str, Any] | None:
    """The worker link has no requests and responses."""
    return None


def fields(rec: Record) -> dict[str, Any]:
    return {"kind": rec.kind}


def jsonable(rec: Record, max_words: int | None = None) -> dict[str, Any]:
    if rec.error is not None:
        return {"kind": rec.kind, "handshake": rec.info, "size": rec.size}
    record = to_jsonable(rec.msg, max_words=max_words)
    record["size"] = rec.size
    return record


def _word(w: dict[str, Any]) -> str:
    """``p7 L3 b[42] +tau``: y2's parameter index, then its layer view (w weights, b biases)."""
    kind = "w" if w["weight"] else "b"
    sign = "+" if w["positive"] else "-"
    return f"p{w['param']} L{w['layer']} {kind}[{w['index']}] {sign}tau"


def render(rec: Record, shown: int = DEFAULT_SHOWN) -> str:
    """The human form of one record."""
    if rec.error is not None:
        i = rec.info
        return f"{rec.kind} [Malformed] handshake type={i.get('type')} size={i.get('size')}"
    record = jsonable(rec, max(0, shown))
    kind = record["kind"]
    if kind == "node_index":
        return f"node_index  node {record['node_id']} of {record['node_count']}"
    if kind == "finished":
        return "finished"
    if kind == "runtime":
        loss = f"  loss={record['loss_milli'] / 1000:g}" if "loss_milli" in record else ""
        return (
            f"runtime  samples={record['sample_count']} "
            f"decompression={record['decompression_ms']}ms training={record['training_ms']}ms "
            f"compression={record['compression_ms']}ms{loss}"
        )
    count = record["word_count"]
    lines = [f"delta  {count} word{'s' if count != 1 else ''}  ({record['size']} bytes)"]
    for k, w in enumerate(record["words"]):
        lines.append(f"    [{k}] {w['word']}  {_word(w)}")
    if count > len(record["words"]):
        lines.append(f"    ... {count - len(record['words'])} more")
    return "\n".join(lines)


def json_body(rec: Record) -> str:
    return json.dumps(jsonable(rec), separators=(",", ":"))[1:-1]
