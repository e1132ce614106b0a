"""``wirekit decode --proto clipper``: decode a ZMTP capture of one side of a Clipper connection.

The capture is one direction of the TCP connection between Clipper (ZeroMQ ROUTER) and a
model container (DEALER).  The READY command's Socket-Type says which side sent it; the
Clipper generation is detected from the messages (or given with ``--dialect``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from wirekit import clipper, zmtp
from wirekit.clipper.messages import to_jsonable
from wirekit.errors import DecodeError

#: Socket-Type -> (side that sent the capture, direction of its messages)
SIDES = {
    "DEALER": ("container", clipper.Direction.TO_CLIPPER),
    "ROUTER": ("clipper", clipper.Direction.TO_CONTAINER),
}
ARROWS = {"container": "container → Clipper", "clipper": "Clipper → container"}
PREVIEW = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dialect",
        choices=[g.value for g in clipper.Generation],
        help="clipper: the Clipper generation (default: detected from the messages)",
    )


def _frame_offsets(data: bytes, start: int, count: int) -> list[int]:
    """Capture offsets of the bodies of the ``count`` frames of the message at ``start``."""
    offsets, pos = [], start
    for _ in range(count):
        if data[pos] & zmtp.FLAG_LONG:
            size, head = int.from_bytes(data[pos + 1 : pos + 9], "big"), 9
        else:
            size, head = data[pos + 1], 2
        offsets.append(pos + head)
        pos += head + size
    return offsets


def _generation(messages: list[tuple[int, zmtp.Message]], direction, dialect) -> Any:
    if dialect:
        return clipper.Generation(dialect)
    for _offset, msg in messages:
        found = clipper.detect(list(msg.frames), direction)
        if found is not None:
            return clipper.Generation(found)
    return None


def walk(data: bytes, args: argparse.Namespace) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(offset, record)`` for the handshake and every Clipper message.

    Raises DecodeError where the capture goes bad (ZMTP framing or a Clipper message).
    """
    if not zmtp.is_zmtp(data):
        raise DecodeError(
            "clipper",
            "capture",
            0,
            "not a ZMTP capture: a capture of one direction of a ZeroMQ TCP connection starts "
            "with the ZMTP 3 greeting (0xff ... 0x7f 0x03)",
        )
    events, _pos, _phase, error = zmtp.decode_events(data)
    full = bool(getattr(args, "json", False))
    side = direction = generation = None
    messages = [(o, e) for o, e in events if isinstance(e, zmtp.Message)]
    for offset, event in events:
        if isinstance(event, zmtp.Greeting):
            yield (
                offset,
                {
                    "kind": "zmtp_greeting",
                    "version": f"{event.major}.{event.minor}",
                    "mechanism": event.mechanism,
                },
            )
        elif isinstance(event, zmtp.Ready):
            socket_type = event.socket_type
            if socket_type not in SIDES:
                raise DecodeError(
                    "clipper",
                    "Socket-Type",
                    offset,
                    f"socket type {socket_type!r} is not a side of a Clipper connection "
                    "(DEALER: container, ROUTER: Clipper)",
                )
            side, direction = SIDES[socket_type]
            generation = _generation(messages, direction, getattr(args, "dialect", None))
            yield (
                offset,
                {
                    "kind": "zmtp_ready",
                    "socket_type": socket_type,
                    "side": side,
                    "identity_hex": event.identity.hex(),
                    "generation": None if generation is None else generation.value,
                },
            )
        elif isinstance(event, zmtp.Command):
            yield offset, {"kind": "zmtp_command", "name": event.name, "data_hex": event.data.hex()}
        else:
            frames = list(event.frames)
            if generation is None:
                raise DecodeError(
                    "clipper",
                    "generation",
                    offset,
                    "cannot tell the Clipper generation from this capture; give --dialect",
                )
            try:
                msg = clipper.decode(frames, generation, direction)
            except DecodeError as exc:
                k = exc.frame if exc.frame is not None and exc.frame < len(frames) else None
                at = offset if k is None else _frame_offsets(data, offset, k + 1)[k] + exc.offset
                where = f"frame {k} of " if k is not None else ""
                raise DecodeError(
                    "clipper",
                    exc.field,
                    at,
                    f"{exc.reason} ({where}the {generation.value} message at byte {offset})",
                ) from None
            record = to_jsonable(msg, full_data=full)
            yield (
                offset,
                {
                    "side": side,
                    "generation": generation.value,
                    "frames": len(frames),
                    **record,
                },
            )
    if error is not None:
        raise error


def _values(values: list, size: int) -> str:
    shown = " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values[:PREVIEW])
    return shown + (" ..." if size > min(len(values), PREVIEW) else "")


def render(record: dict[str, Any]) -> str:
    """The human form of one record."""
    kind = record["kind"]
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
        more = ", ..." if len(outs) > PREVIEW else ""
        return f"{head} msg_id={record['msg_id']} {len(outs)} output(s): [{shown}{more}]"
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
