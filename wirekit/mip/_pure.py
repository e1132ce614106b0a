"""The pure-Python MIP codec: the construct spec plus the validation both twins share.

``wirekit/_fast/mip.pyx`` is its Cython twin: same functions, same results, same errors
(field, offset and text) for the same input.  Keep the checks here and there in one order.
"""

from __future__ import annotations

import gc
from typing import Any

from construct import Container

from wirekit._encoding import checked_int, contiguous_bytes
from wirekit.errors import DecodeError, EncodeError

from . import spec
from .messages import (
    DEFAULT_MAX_ITEMS,
    HEADER_SIZE,
    INFERENCE_HEADER_SIZE,
    ITEM_HEADER_SIZE,
    PROTOCOL,
    VERSION,
    ErrorCode,
    ErrorReply,
    Inference,
    Item,
    Kind,
    Message,
    Ping,
)

_U32_MAX = 0xFFFFFFFF

#: Decoded item data shorter than this is copied into ``bytes`` (cheaper than a view and it
#: does not pin the whole buffer); longer data is a zero-copy ``memoryview`` slice.
COPY_BELOW = 256


def _fail(field: str, offset: int, text: str, code: ErrorCode) -> DecodeError:
    return DecodeError(PROTOCOL, field, offset, text, code=int(code))


def check_header(buf: Any, pos: int = 0) -> tuple[int, int, int]:
    """Validate the fixed header at ``pos``; return ``(kind, subtype, remaining)``.

    Only the 8 header bytes are looked at, so a streaming reader can answer a bad header
    before any payload arrives.
    """
    view = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
    have = len(view) - pos
    if have < HEADER_SIZE:
        raise _fail(
            "header",
            len(view),
            f"truncated: need {HEADER_SIZE} bytes, have {have}",
            ErrorCode.SHAPE,
        )
    h = spec.HEADER.parse(bytes(view[pos : pos + HEADER_SIZE]))
    if h.version != VERSION:
        raise _fail(
            "version",
            pos,
            f"unsupported version {h.version} (expected {VERSION})",
            ErrorCode.PROTOCOL,
        )
    if h.reserved != 0:
        raise _fail("reserved", pos + 3, f"must be 0, got {h.reserved}", ErrorCode.PROTOCOL)
    if h.kind > Kind.INFERENCE:
        raise _fail("kind", pos + 1, f"unknown kind {h.kind}", ErrorCode.METHOD)
    if h.kind == Kind.ERROR:
        if h.subtype > ErrorCode.INTERNAL:
            raise _fail("subtype", pos + 2, f"unknown error code {h.subtype}", ErrorCode.SUBTYPE)
    elif h.subtype > 1:
        raise _fail(
            "subtype",
            pos + 2,
            f"unknown subtype {h.subtype} (0 request, 1 response)",
            ErrorCode.SUBTYPE,
        )
    if h.kind != Kind.INFERENCE and h.remaining != 0:
        raise _fail(
            "remaining",
            pos + 4,
            f"{Kind(h.kind).name.lower()} message has no payload, header announces "
            f"{h.remaining} bytes",
            ErrorCode.SHAPE,
        )
    return h.kind, h.subtype, h.remaining


def frame_size(buf: Any, pos: int = 0, max_size: int | None = None) -> int | None:
    """The size of the complete message at ``buf[pos:]``, or None while it is incomplete.

    The one frame check: its header is validated as soon as its 8 bytes are here (the error
    :func:`check_header` raises), and a header announcing a message of more than
    ``max_size`` bytes (None: no limit) is refused with MEMORY (field ``remaining``) before
    any payload arrives.  The payload itself is not looked at.
    """
    view = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
    n = len(view)
    if max_size is not None and max_size < 0:
        raise ValueError(f"max_size must be >= 0 or None, got {max_size!r}")
    if pos < 0 or pos > n:
        raise IndexError(f"position {pos} outside a buffer of {n} bytes")
    if n - pos < HEADER_SIZE:
        return None
    remaining = check_header(view, pos)[2]
    size = HEADER_SIZE + remaining
    if max_size is not None and size > max_size:
        raise _fail(
            "remaining",
            pos + 4,
            f"message of {size} bytes exceeds the limit of {max_size}",
            ErrorCode.MEMORY,
        )
    return size if n - pos >= size else None


def decode_prefix(
    buf: Any, pos: int = 0, max_items: int = DEFAULT_MAX_ITEMS
) -> tuple[Message, int]:
    """Decode the message that starts at ``pos``; return it and the offset just past it.

    Offsets in errors are positions in ``buf``.  Item data of ``COPY_BELOW`` bytes or more are
    memoryview slices of ``buf`` (no copy); shorter ones are ``bytes``.  An inference message
    announcing more than ``max_items`` items is refused (MEMORY, field ``batch_size``) before
    any item is built.
    """
    view = memoryview(buf).cast("B")
    kind, subtype, remaining = check_header(view, pos)
    start = pos + HEADER_SIZE
    end = start + remaining
    if end > len(view):
        raise _fail(
            "payload",
            len(view),
            f"truncated: header announces {remaining} bytes, {len(view) - start} present",
            ErrorCode.SHAPE,
        )
    if kind == Kind.ERROR:
        return ErrorReply(ErrorCode(subtype)), end
    if kind == Kind.PING:
        return Ping(subtype == 1), end
    if remaining < INFERENCE_HEADER_SIZE:
        raise _fail(
            "inference header",
            start,
            f"truncated: need {INFERENCE_HEADER_SIZE} bytes, payload has {remaining}",
            ErrorCode.SHAPE,
        )
    head = spec.INFERENCE_HEAD.parse(bytes(view[start : start + INFERENCE_HEADER_SIZE]))
    count = head.batch_size * (head.n_output if subtype == 1 else head.n_input)
    if count > max_items:
        raise _fail(
            "batch_size",
            start + 2,
            f"{count} items exceed the limit of {max_items} per message",
            ErrorCode.MEMORY,
        )
    p = start + INFERENCE_HEADER_SIZE
    items = []
    for i in range(count):
        if end - p < ITEM_HEADER_SIZE:
            raise _fail(
                f"items[{i}]",
                p,
                f"truncated item header: need {ITEM_HEADER_SIZE} bytes, "
                f"{end - p} left in the payload",
                ErrorCode.SHAPE,
            )
        tl = spec.ITEM_HEAD.parse(bytes(view[p : p + ITEM_HEADER_SIZE]))
        p += ITEM_HEADER_SIZE
        if tl.size > end - p:
            raise _fail(
                f"items[{i}].data",
                p,
                f"size {tl.size} exceeds the {end - p} bytes left in the payload",
                ErrorCode.SHAPE,
            )
        data = view[p : p + tl.size]
        items.append(Item(tl.type, bytes(data) if tl.size < COPY_BELOW else data))
        p += tl.size
    if p != end:
        raise _fail(
            "payload", p, f"{end - p} bytes after the last of {count} items", ErrorCode.SHAPE
        )
    msg = Inference(subtype == 1, head.n_input, head.n_output, head.batch_size, tuple(items))
    return msg, end


def decode(buf: Any, max_items: int = DEFAULT_MAX_ITEMS) -> Message:
    """Decode exactly one complete message; trailing bytes are an error."""
    msg, end = decode_prefix(buf, 0, max_items)
    size = memoryview(buf).nbytes
    if end != size:
        raise _fail(
            "message", end, f"{size - end} bytes after the end of the message", ErrorCode.SHAPE
        )
    return msg


def _int_in(value: Any, field: str, top: int) -> int:
    return checked_int(PROTOCOL, value, field, top)


def to_container(msg: Message) -> dict[str, Any]:
    """Validate ``msg`` and map it onto ``spec.MESSAGE``'s fields (used by encode and tests)."""
    if isinstance(msg, Ping):
        return dict(
            version=VERSION, kind=Kind.PING, subtype=int(bool(msg.response)), reserved=0, payload={}
        )
    if isinstance(msg, ErrorReply):
        code = _int_in(msg.code, "code", int(ErrorCode.INTERNAL))
        return dict(version=VERSION, kind=Kind.ERROR, subtype=code, reserved=0, payload={})
    if not isinstance(msg, Inference):
        raise EncodeError(PROTOCOL, "message", f"not a MIP message: {type(msg).__name__}")
    n_input = _int_in(msg.n_input, "n_input", 0xFF)
    n_output = _int_in(msg.n_output, "n_output", 0xFF)
    batch = _int_in(msg.batch_size, "batch_size", 0xFFFF)
    width = n_output if msg.response else n_input
    if len(msg.items) != batch * width:
        raise EncodeError(
            PROTOCOL,
            "items",
            f"{len(msg.items)} items, but batch_size {batch} × "
            f"{'n_output' if msg.response else 'n_input'} {width} = {batch * width}",
        )
    total = INFERENCE_HEADER_SIZE
    items = []
    for i, item in enumerate(msg.items):
        pair = tuple(item)
        if len(pair) != 2:
            raise EncodeError(PROTOCOL, f"items[{i}]", "expected a (type, data) pair")
        kind = _int_in(pair[0], f"items[{i}].type", _U32_MAX)
        data = contiguous_bytes(PROTOCOL, pair[1], f"items[{i}].data")
        if data.nbytes > _U32_MAX:
            raise EncodeError(PROTOCOL, f"items[{i}].data", "longer than 4 GiB - 1")
        total += ITEM_HEADER_SIZE + data.nbytes
        items.append(dict(type=kind, data=data.tobytes()))
    if total > _U32_MAX:
        raise EncodeError(PROTOCOL, "payload", f"{total} bytes does not fit a u32 length")
    payload = dict(n_input=n_input, n_output=n_output, batch_size=batch, items=items)
    return dict(
        version=VERSION,
        kind=Kind.INFERENCE,
        subtype=int(bool(msg.response)),
        reserved=0,
        payload=payload,
    )


def from_container(c: Container) -> Message:
    """Map a container parsed by ``spec.MESSAGE`` back to a message (test oracle)."""
    if c.kind == Kind.ERROR:
        return ErrorReply(ErrorCode(c.subtype))
    if c.kind == Kind.PING:
        return Ping(c.subtype == 1)
    p = c.payload
    items = tuple(Item(it.type, it.data) for it in p["items"])
    return Inference(c.subtype == 1, p.n_input, p.n_output, p.batch_size, items)


#: After encoding a message this big, the young objects are collected (:func:`encode`).
COLLECT_AT = 1 << 20


def encode(msg: Message) -> bytes:
    """Encode one message to bytes."""
    wire = spec.MESSAGE.build(to_container(msg))
    if len(wire) >= COLLECT_AT:
        # construct's build context refers to itself (``_root``) and keeps its streams and
        # the values built: a cycle holding about twice the message, which only the cycle
        # collector frees.  A collection of the young generations (well under a millisecond,
        # next to tens of milliseconds for the build) frees it now rather than whenever.
        gc.collect(1)
    return wire
