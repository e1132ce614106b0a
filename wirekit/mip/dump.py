"""``wirekit decode --proto mip``: one direction of a MIP connection, message by message.

Every MIP message announces its size in its 8-byte header, so a message that does not decode
(bad version, unknown kind, items that do not fit) is shown with its error and decoding goes
on after it.  A header announcing more than ``--max-message`` bytes means the framing is
lost: the stream is resynchronised on the next header that passes every header check.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from wirekit import mip
from wirekit._dumping import FramedStream, Record
from wirekit.errors import DecodeError
from wirekit.mip.messages import (
    HEADER_SIZE,
    PROTOCOL,
    ErrorCode,
    ErrorReply,
    Inference,
    ItemType,
    Kind,
    Ping,
)

_KINDS = {int(k): k.name.lower() for k in Kind}
_TYPE_NAMES = {int(t): t.name for t in ItemType}
_CODE_NAMES = {int(c): c.name for c in ErrorCode}
_TEXTUAL = (int(ItemType.TEXT), int(ItemType.JSON))
_json_str = json.encoder.encode_basestring  # type: ignore[attr-defined]
#: Item bytes shown per item by the human form.
PREVIEW = 16


def kind_of(msg: Any) -> str:
    if isinstance(msg, Inference):
        return "inference"
    return "ping" if isinstance(msg, Ping) else "error"


class Stream(FramedStream):
    """One direction of MIP: feed bytes, take :class:`~wirekit._dumping.Record` objects out."""

    HEADER = HEADER_SIZE
    PROTOCOL = PROTOCOL

    def frame_size(self, buf: bytes, pos: int) -> int | None:
        return HEADER_SIZE + int.from_bytes(buf[pos + 4 : pos + 8], "big")

    def plausible(self, buf: bytes, pos: int) -> bool:
        try:
            remaining = mip.check_header(buf, pos)[2]
        except DecodeError:
            return False
        return HEADER_SIZE + remaining <= self.max_message

    def describe(self, buf: bytes, pos: int) -> tuple[str, dict]:
        version, kind, subtype, reserved = buf[pos : pos + 4]
        info = {
            "version": version,
            "kind": kind,
            "subtype": subtype,
            "reserved": reserved,
            "remaining": int.from_bytes(buf[pos + 4 : pos + 8], "big"),
        }
        return _KINDS.get(kind, f"kind{kind}"), info

    def decode(self, buf: bytes, pos: int, end: int) -> Record:
        msg, stop = mip.decode_prefix(buf, pos)
        return Record(pos, stop - pos, kind_of(msg), msg)


def role(rec: Record) -> tuple[str, Any] | None:
    """Pairing: client messages are requests, server messages answer them in order."""
    if rec.kind == "note":
        return None
    if rec.side == 0:
        return "request", None
    return "response", None


def fields(rec: Record) -> dict[str, Any]:
    """Fields the filters look at."""
    msg = rec.msg
    out: dict[str, Any] = {"kind": rec.kind}
    if isinstance(msg, ErrorReply):
        out["error"] = _CODE_NAMES.get(int(msg.code), str(msg.code))
    return out


# --- output ------------------------------------------------------------------------------


def _preview(item_type: int, data: Any) -> str:
    size = len(data)
    if item_type in _TEXTUAL:
        head = bytes(data[:64])
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return repr(text) + ("..." if size > 64 else "")
    return bytes(data[:PREVIEW]).hex(" ") + (" ..." if size > PREVIEW else "")


def render(rec: Record) -> str:
    """The human form of one record (without its place in the stream)."""
    msg = rec.msg
    if isinstance(msg, Ping):
        return "ping response" if msg.response else "ping request"
    if isinstance(msg, ErrorReply):
        code = int(msg.code)
        return f"error {_CODE_NAMES.get(code, code)} ({code})"
    if rec.error is not None:
        i = rec.info
        head = (
            f"header version={i['version']} kind={i['kind']} subtype={i['subtype']} "
            f"reserved={i['reserved']} remaining={i['remaining']}"
            if i
            else f"{rec.size} bytes"
        )
        return f"{rec.kind} [Malformed] {head}  ({rec.size} bytes)"
    direction = "response" if msg.response else "request"
    width = msg.n_output if msg.response else msg.n_input
    lines = [
        f"inference {direction}  n_input={msg.n_input} n_output={msg.n_output} "
        f"batch_size={msg.batch_size}  ({rec.size} bytes)"
    ]
    append = lines.append
    types = _TYPE_NAMES
    for k, (item_type, data) in enumerate(msg.items):
        label = f"[{k // width}][{k % width}]" if width else f"[{k}]"
        name = types.get(item_type) or f"TYPE{item_type}"
        append(f"    {label:<9} {name:<6} {len(data):>7} B  {_preview(item_type, data)}")
    return "\n".join(lines)


def _item_json(item_type: int, data: Any) -> str:
    raw = bytes(data)
    name = _TYPE_NAMES.get(item_type) or f"TYPE{item_type}"
    text = ""
    if item_type in _TEXTUAL:
        try:
            decoded = raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            text = ',"text":' + _json_str(decoded)
    return (
        f'{{"type":{item_type},"type_name":"{name}","size":{len(raw)},'
        f'"data_hex":"{raw.hex()}"{text}}}'
    )


def json_body(rec: Record) -> str:
    """The protocol part of a record's JSON object: ``"kind": ...`` onwards, no braces."""
    msg = rec.msg
    if isinstance(msg, Ping):
        return f'"kind":"ping","response":{"true" if msg.response else "false"},"size":{rec.size}'
    if isinstance(msg, ErrorReply):
        code = int(msg.code)
        return f'"kind":"error","code":{code},"code_name":"{_CODE_NAMES.get(code, code)}","size":8'
    if rec.error is not None:
        return f'"kind":"{rec.kind}","header":{json.dumps(rec.info)},"size":{rec.size}'
    items = ",".join([_item_json(t, d) for t, d in msg.items])
    return (
        f'"kind":"inference","response":{"true" if msg.response else "false"},'
        f'"n_input":{msg.n_input},"n_output":{msg.n_output},"batch_size":{msg.batch_size},'
        f'"size":{rec.size},"items":[{items}]'
    )


# --- runs of well-formed messages, formatted in one go -------------------------------------


def format_run_pure(
    buf: bytes, pos: int, stop: int, base: int, as_json: bool
) -> tuple[bytes, int, int]:
    """Format the well-formed messages of ``buf[pos:stop]`` one after another.

    Returns ``(text, pos, count)``: the lines of ``count`` messages (``@offset`` human form,
    or JSON objects with ``"offset"``, offsets counted from ``base``) joined by newlines as
    UTF-8 (written to a binary output as they are), and
    the position of the first message not formatted — incomplete, or not well-formed (the
    caller decodes that one the slow way and shows its error).  The Cython twin
    (``wirekit._fast.mipdump``) gives the same text.
    """
    lines = []
    while stop - pos >= HEADER_SIZE:
        end = pos + HEADER_SIZE + int.from_bytes(buf[pos + 4 : pos + 8], "big")
        if end > stop:
            break
        try:
            msg, end = mip.decode_prefix(buf, pos)
        except DecodeError:
            break
        rec = Record(base + pos, end - pos, kind_of(msg), msg)
        if as_json:
            lines.append(f'{{"offset":{base + pos},{json_body(rec)}}}')
        else:
            lines.append(f"@{base + pos} {render(rec)}")
        pos = end
    return "\n".join(lines).encode("utf-8"), pos, len(lines)


def _pick_format_run() -> Callable[[bytes, int, int, int, bool], tuple[bytes, int, int]]:
    from wirekit._impl import load_fast

    fast = load_fast("mipdump")
    return format_run_pure if fast is None else fast.format_run


#: ``format_run`` of the active implementation (Cython unless ``WIREKIT_PURE=1``).
format_run = _pick_format_run()
Stream.format_run = staticmethod(format_run)  # type: ignore[assignment]
