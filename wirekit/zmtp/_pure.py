"""The pure-Python ZMTP reader and encoders: the construct spec plus the shared validation.

``wirekit/_fast/zmtp.pyx`` is its Cython twin: same functions, same results, same errors
(field, offset and text) for the same input.  Keep the checks here and there in one order.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from wirekit._encoding import checked_int, contiguous_bytes
from wirekit.errors import DecodeError, EncodeError

from . import spec
from .messages import (
    FLAG_COMMAND,
    FLAG_LONG,
    FLAG_MORE,
    FLAGS_RESERVED,
    GREETING_SIZE,
    IDENTITY_SOCKETS,
    MAJOR_VERSION,
    PHASE_GREETING,
    PHASE_HANDSHAKE,
    PHASE_TRAFFIC,
    PROTOCOL,
    SIGNATURE_PADDING,
    Command,
    Event,
    Greeting,
    Message,
    Pending,
    Ready,
)

_U32_MAX = 0xFFFFFFFF


def _fail(field: str, offset: int, text: str) -> DecodeError:
    return DecodeError(PROTOCOL, field, offset, text)


def _check_greeting(head: bytes, pos: int, final: bool) -> Greeting | None:
    """Validate the greeting bytes present (``head``, up to 64, starting at buffer offset
    ``pos``); the Greeting once all 64 are there."""
    have = len(head)
    if have >= 1 and head[0] != 0xFF:
        raise _fail(
            "signature", pos, f"not a ZMTP greeting: byte 0 is 0x{head[0]:02x}, expected 0xff"
        )
    if have >= 10 and head[9] != 0x7F:
        raise _fail(
            "signature",
            pos + 9,
            f"not a ZMTP 3 greeting: byte 9 is 0x{head[9]:02x}, expected 0x7f",
        )
    if have >= 11 and head[10] != MAJOR_VERSION:
        raise _fail(
            "version",
            pos + 10,
            f"unsupported ZMTP major version {head[10]}: only 3 (ZMTP 3.0/3.1) is supported",
        )
    if have >= 32:
        mech = head[12:32]
        name = mech.split(b"\x00", 1)[0]
        if name != b"NULL":
            raise _fail(
                "mechanism",
                pos + 12,
                f"unsupported security mechanism {name.decode('latin-1')!r}: "
                "only NULL is supported",
            )
        for k in range(4, 20):
            if mech[k] != 0:
                raise _fail("mechanism", pos + 12 + k, "bytes after the name must be NUL")
    if have >= 33 and head[32] > 1:
        raise _fail("as-server", pos + 32, f"must be 0 or 1, got {head[32]}")
    if have < GREETING_SIZE:
        if final:
            raise _fail(
                "greeting", pos + have, f"truncated: need {GREETING_SIZE} bytes, have {have}"
            )
        return None
    g = spec.GREETING.parse(head)
    return Greeting(g.major, g.minor, "NULL", g.as_server == 1)


def _command(body: bytes, at: int, phase: int) -> Event:
    """Decode a command body that starts at stream offset ``at``."""
    size = len(body)
    if size == 0:
        raise _fail("command name", at, "empty command: no name")
    if body[0] > size - 1:
        raise _fail(
            "command name",
            at,
            f"length {body[0]} exceeds the {size - 1} bytes left in the command",
        )
    name = spec.COMMAND_NAME.parse(body)
    q = 1 + body[0]
    if phase == PHASE_HANDSHAKE and name not in ("READY", "ERROR"):
        raise _fail("command", at + 1, f"expected READY (NULL mechanism), got {name!r}")
    if name != "READY":
        return Command(name, body[q:])
    props = []
    i = 0
    while q < size:
        if body[q] > size - q - 1:
            raise _fail(
                f"properties[{i}].name",
                at + q,
                f"length {body[q]} exceeds the {size - q - 1} bytes left in the command",
            )
        key = spec.PROPERTY_NAME.parse(body[q:])
        q += 1 + body[q]
        if size - q < 4:
            raise _fail(
                f"properties[{i}].value",
                at + q,
                f"truncated length: need 4 bytes, {size - q} left in the command",
            )
        vlen = spec.VALUE_SIZE.parse(body[q : q + 4])
        if vlen > size - q - 4:
            raise _fail(
                f"properties[{i}].value",
                at + q,
                f"length {vlen} exceeds the {size - q - 4} bytes left in the command",
            )
        q += 4
        props.append((key, body[q : q + vlen]))
        q += vlen
        i += 1
    return Ready(tuple(props))


def _check_limit(name: str, value: int | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"{name} must be >= 0")


def _byte_view(buf: Any) -> bytes | memoryview:
    """``buf`` itself if it is ``bytes``, else a flat memoryview of its bytes (copied only if
    it is not contiguous).  Never a copy of a whole bytearray: a reader's buffer may hold a
    large unfinished frame, and copying it on every call would be quadratic."""
    if type(buf) is bytes:
        return buf
    view = memoryview(buf)
    if not view.c_contiguous:
        return memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def decode_events(
    buf: Any,
    pos: int = 0,
    phase: int = PHASE_GREETING,
    final: bool = True,
    max_frame_size: int | None = None,
    *,
    max_message_frames: int | None = None,
    max_message_size: int | None = None,
    pending: Pending | None = None,
) -> tuple[list[tuple[int, Event]], int, int, DecodeError | None]:
    """Decode every complete event in ``buf`` from ``pos``: ``(events, pos, phase, error)``.

    ``events`` are ``(offset, event)`` pairs; the returned ``pos`` is just past the last
    complete event and ``phase`` where the stream stands there (0 greeting, 1 handshake,
    2 traffic).  With ``final`` False an incomplete tail is left for later; with ``final``
    True it is an error.  A frame larger than ``max_frame_size``, a multipart message of more
    than ``max_message_frames`` frames or of more than ``max_message_size`` body bytes is an
    error as soon as the flags or size field that shows it is read (None: no limit).  Bad
    input does not raise: decoding stops and ``error`` is the
    :class:`~wirekit.errors.DecodeError`, with the events before it still returned.

    With a :class:`Pending` as ``pending``, the complete frames of an unfinished multipart
    message are kept there and the returned ``pos`` is just past them instead of at the
    message's start; pass the same ``Pending`` to the next call to resume (see its doc).
    """
    _check_limit("max_frame_size", max_frame_size)
    _check_limit("max_message_frames", max_message_frames)
    _check_limit("max_message_size", max_message_size)
    if pos < 0:
        raise IndexError(f"position {pos} is negative")
    view = _byte_view(buf)
    try:
        size = len(view)
        if pos > size:
            raise IndexError(f"position {pos} outside a buffer of {size} bytes")
        if pending is not None and pending.frames and phase != PHASE_TRAFFIC:
            raise ValueError("a pending multipart message needs phase 2 (traffic)")
        events: list[tuple[int, Event]] = []
        state = [pos, phase]
        limits = (max_frame_size, max_message_frames, max_message_size)
        try:
            need = _decode_into(events, state, view, final, limits, pending)
        except DecodeError as exc:
            return events, state[0], state[1], exc
        if pending is not None:
            pending.need = need
        return events, state[0], state[1], None
    finally:
        if isinstance(view, memoryview):
            view.release()  # a bytearray being decoded can grow again at once


def _decode_into(
    events: list[tuple[int, Event]],
    state: list[int],
    view: bytes | memoryview,
    final: bool,
    limits: tuple[int | None, int | None, int | None],
    pending: Pending | None,
) -> int:
    """Append complete events to ``events``; ``state`` = [pos, phase] after the last one (or
    after the last frame kept in ``pending``).  Returns how many bytes from that position the
    next call needs to get further."""
    max_frame_size, max_frames, max_total = limits
    pos, phase = state
    n = len(view)
    if phase == PHASE_GREETING:
        greeting = _check_greeting(bytes(view[pos : pos + GREETING_SIZE]), pos, final)
        if greeting is None:
            return n - pos + 1
        events.append((pos, greeting))
        pos += GREETING_SIZE
        phase = PHASE_HANDSHAKE
        state[:] = pos, phase
    frames: list[bytes] = [] if pending is None else pending.frames
    # (frames is empty without pending: the second test only tells the type checker so)
    msg = pending.start if frames and pending is not None else pos  # the message's offset
    total = pending.size if frames and pending is not None else 0  # its body bytes so far
    p = pos
    while True:
        if p >= n:
            if frames and final:  # the previous frame had MORE set
                raise _fail(
                    "message",
                    n,
                    f"stream ends inside a multipart message: frame {len(frames) - 1} has MORE set",
                )
            return p - state[0] + 1
        flags = spec.FRAME_FLAGS.parse(bytes(view[p : p + 1]))
        if flags & FLAGS_RESERVED:
            raise _fail("flags", p, f"reserved bits set in flags 0x{flags:02x}")
        command = flags & FLAG_COMMAND
        if command:
            if flags & FLAG_MORE:
                raise _fail("flags", p, "command frame with MORE set")
            if frames:
                raise _fail("flags", p, "command frame inside a multipart message")
        elif phase == PHASE_HANDSHAKE:
            raise _fail("flags", p, "expected the READY command, got a message frame")
        elif max_frames is not None and len(frames) >= max_frames:
            raise _fail(
                "message", p, f"multipart message of more than {max_frames} frames (the limit)"
            )
        head = 9 if flags & FLAG_LONG else 2
        if n - p < head:
            if final:
                raise _fail(
                    "frame", n, f"truncated: frame header needs {head} bytes, {n - p} present"
                )
            return p - state[0] + head
        size_spec = spec.LONG_SIZE if flags & FLAG_LONG else spec.SHORT_SIZE
        size = size_spec.parse(bytes(view[p + 1 : p + head]))
        if max_frame_size is not None and size > max_frame_size:
            raise _fail(
                "size", p + 1, f"frame of {size} bytes exceeds the limit of {max_frame_size}"
            )
        if not command and max_total is not None and total + size > max_total:
            raise _fail(
                "size",
                p + 1,
                f"multipart message of {total + size} bytes exceeds the limit of {max_total}",
            )
        start = p + head
        if size > n - start:
            if final:
                raise _fail(
                    "frame", n, f"truncated: size announces {size} bytes, {n - start} present"
                )
            return min(p - state[0] + head + size, sys.maxsize)
        body = bytes(view[start : start + size])
        if command:
            events.append((p, _command(body, start, phase)))
            p = start + size
            phase = PHASE_TRAFFIC
            msg = p
            state[:] = p, phase
            continue
        p = start + size
        if not flags & FLAG_MORE:
            frames.append(body)
            events.append((msg, Message(tuple(frames))))
            frames.clear()
            total = 0
            msg = p
            state[0] = p
            continue
        frames.append(body)
        total += size
        if pending is not None:  # keep the frame: the next call resumes after it
            pending.start = msg
            pending.size = total
            state[0] = p


def decode_stream(buf: Any, max_frame_size: int | None = None) -> list[tuple[int, Event]]:
    """Decode a whole capture (greeting first); return its ``(offset, event)`` pairs.

    Raises the first :class:`~wirekit.errors.DecodeError` (use ``decode_events`` to keep the
    events decoded before it).
    """
    events, _pos, _phase, error = decode_events(buf, 0, PHASE_GREETING, True, max_frame_size)
    if error is not None:
        raise error
    return events


def events_from_container(c: Any) -> list[tuple[int, Event]]:
    """The events of a capture parsed by ``spec.STREAM`` (the test and benchmark oracle)."""
    g = c.greeting
    mech = g.mechanism.rstrip(b"\x00").decode("latin-1")
    events: list[tuple[int, Event]] = [(0, Greeting(g.major, g.minor, mech, g.as_server == 1))]
    pos = GREETING_SIZE
    start = pos
    frames: list[bytes] = []
    for f in c.frames:
        size = (9 if f.flags & FLAG_LONG else 2) + len(f.body)
        if f.flags & FLAG_COMMAND:
            cmd = spec.COMMAND.parse(f.body)
            if cmd.name == "READY":
                props = spec.PROPERTIES.parse(cmd.data).properties
                event: Event = Ready(tuple((p.name, p.value) for p in props))
            else:
                event = Command(cmd.name, cmd.data)
            events.append((pos, event))
            start = pos + size
        else:
            frames.append(f.body)
            if not f.flags & FLAG_MORE:
                events.append((start, Message(tuple(frames))))
                frames = []
                start = pos + size
        pos += size
    return events


# --- encoding -------------------------------------------------------------------------------


def _int_in(value: Any, field: str, top: int) -> int:
    return checked_int(PROTOCOL, value, field, top)


def _bytes(data: Any, field: str) -> bytes:
    return contiguous_bytes(PROTOCOL, data, field).tobytes()


def _short_text(value: Any, field: str, top: int) -> str:
    if not isinstance(value, str):
        raise EncodeError(PROTOCOL, field, f"expected a str, got {type(value).__name__}")
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        raise EncodeError(PROTOCOL, field, "must be Latin-1 text") from None
    if len(raw) > top:
        raise EncodeError(PROTOCOL, field, f"{len(raw)} bytes is longer than {top}")
    return value


def encode_greeting(
    mechanism: str = "NULL", as_server: bool = False, major: int = 3, minor: int = 1
) -> bytes:
    """The 64-byte greeting (padding as libzmq writes it)."""
    mech = _short_text(mechanism, "mechanism", 20).encode("latin-1")
    return spec.GREETING.build(
        dict(
            padding=SIGNATURE_PADDING,
            major=_int_in(major, "major", 255),
            minor=_int_in(minor, "minor", 255),
            mechanism=mech.ljust(20, b"\x00"),
            as_server=1 if as_server else 0,
            filler=bytes(31),
        )
    )


def _frame(flags: int, body: bytes) -> bytes:
    if len(body) > 255:
        flags |= FLAG_LONG
    return spec.FRAME.build(dict(flags=flags, size=len(body), body=body))


def encode_command(name: str, data: Any = b"") -> bytes:
    """One command frame: ``name`` (Latin-1, up to 255 bytes) and its raw ``data``."""
    body = spec.COMMAND.build(dict(name=_short_text(name, "name", 255), data=_bytes(data, "data")))
    return _frame(FLAG_COMMAND, body)


def encode_ready(
    socket_type: str, identity: Any = b"", properties: Iterable[tuple[str, Any]] = ()
) -> bytes:
    """The NULL mechanism's READY command frame.

    ``Socket-Type`` comes first; ``Identity`` follows for REQ/DEALER/ROUTER sockets (as libzmq
    sends it, empty or not) or whenever ``identity`` is not empty; then ``properties``.
    """
    _short_text(socket_type, "socket_type", _U32_MAX)
    ident = _bytes(identity, "identity")
    props = [dict(name="Socket-Type", value=socket_type.encode("latin-1"))]
    if socket_type in IDENTITY_SOCKETS or ident:
        props.append(dict(name="Identity", value=ident))
    for i, pair in enumerate(properties):
        pair = tuple(pair)
        if len(pair) != 2:
            raise EncodeError(PROTOCOL, f"properties[{i}]", "expected a (name, value) pair")
        name = _short_text(pair[0], f"properties[{i}].name", 255)
        value = _bytes(pair[1], f"properties[{i}].value")
        if len(value) > _U32_MAX:
            raise EncodeError(PROTOCOL, f"properties[{i}].value", "longer than 4 GiB - 1")
        props.append(dict(name=name, value=value))
    data = b"".join(spec.PROPERTY.build(p) for p in props)
    return _frame(FLAG_COMMAND, spec.COMMAND.build(dict(name="READY", data=data)))


def encode_message(frames: Iterable[Any]) -> bytes:
    """One multipart message: MORE on every frame but the last, LONG above 255 bytes."""
    bodies = [_bytes(f, f"frames[{i}]") for i, f in enumerate(frames)]
    if not bodies:
        raise EncodeError(PROTOCOL, "frames", "a message has at least one frame")
    last = len(bodies) - 1
    return b"".join(_frame(0 if i == last else FLAG_MORE, b) for i, b in enumerate(bodies))
