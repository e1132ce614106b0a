"""``wirekit decode --proto mip``: walk a file of concatenated MIP messages."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from wirekit import mip
from wirekit.mip.messages import to_jsonable


def walk(data: bytes, args: argparse.Namespace) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(offset, record)`` for every message; raise DecodeError where the data goes bad."""
    pos = 0
    while pos < len(data):
        msg, end = mip.decode_prefix(data, pos)
        # JSON lines carry every byte (hex); the human form shows a preview.
        record = to_jsonable(msg, full_data=bool(getattr(args, "json", False)))
        record["size"] = end - pos
        yield pos, record
        pos = end


def _preview(hexdata: str, type_name: str, size: int) -> str:
    raw = bytes.fromhex(hexdata)
    more = "..." if size > len(raw) else ""
    if type_name in ("TEXT", "JSON"):
        try:
            return repr(raw.decode("utf-8")) + more
        except UnicodeDecodeError:
            pass
    return raw[:16].hex(" ") + (" ..." if size > 16 else "")


def render(record: dict[str, Any]) -> str:
    """The human form of one record."""
    kind = record["kind"]
    if kind == "ping":
        return f"ping {'response' if record['response'] else 'request'}"
    if kind == "error":
        return f"error {record['code_name']} ({record['code']})"
    direction = "response" if record["response"] else "request"
    lines = [
        f"inference {direction}  n_input={record['n_input']} n_output={record['n_output']} "
        f"batch_size={record['batch_size']}  ({record['size']} bytes)"
    ]
    width = record["n_output"] if record["response"] else record["n_input"]
    for k, item in enumerate(record["items"]):
        label = f"[{k // width}.{k % width}]" if width else f"[{k}]"
        lines.append(
            f"    {label:<9} {item['type_name']:<6} {item['size']:>7} B  "
            f"{_preview(item.get('preview_hex', ''), item['type_name'], item['size'])}"
        )
    return "\n".join(lines)
