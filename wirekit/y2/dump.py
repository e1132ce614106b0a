"""``wirekit decode --proto y2``: walk a file holding one direction of a y2 worker link."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from wirekit import y2
from wirekit.y2.messages import to_jsonable

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


def walk(data: bytes, args: argparse.Namespace) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(offset, record)`` for every message; raise DecodeError where the data goes bad."""
    as_json = bool(getattr(args, "json", False))
    shown = None if as_json else max(0, getattr(args, "y2_words", DEFAULT_SHOWN))
    pos = 0
    while pos < len(data):
        msg, end = y2.decode_prefix(data, pos)
        record = to_jsonable(msg, max_words=shown)
        record["size"] = end - pos
        yield pos, record
        pos = end


def _word(w: dict[str, Any]) -> str:
    return (
        f"L{w['layer']} {'w' if w['weight'] else 'b'}[{w['index']}] {'-' if w['sign'] else '+'}tau"
    )


def render(record: dict[str, Any]) -> str:
    """The human form of one record."""
    kind = record["type"]
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
