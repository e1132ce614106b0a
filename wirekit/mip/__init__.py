"""MIP, the Model Invocation Protocol of KubeMo: messages, codec and streaming decoder.

>>> from wirekit import mip
>>> wire = mip.encode(mip.Inference.request([[mip.Item.text("hello")]]))
>>> wire.hex(" ")
'00 02 00 00 00 00 00 11 01 00 00 01 00 00 00 01 00 00 00 05 68 65 6c 6c 6f'
>>> mip.decode(wire).items[0].as_text()
'hello'

``encode``/``decode``/``decode_prefix``/``check_header``/``frame_size`` come from the Cython
twin unless ``WIREKIT_PURE=1`` or it is not built; ``IMPLEMENTATION`` tells which.
"""

from __future__ import annotations

from collections.abc import Callable

from wirekit._impl import lazy_codec

from . import _pure
from .decoder import DEFAULT_MAX_MESSAGE_SIZE, Decoder
from .messages import (
    DEFAULT_MAX_ITEMS,
    HEADER_SIZE,
    PROTOCOL,
    VERSION,
    Buffer,
    ErrorCode,
    ErrorReply,
    Inference,
    Item,
    ItemType,
    Kind,
    Message,
    Ping,
    Subtype,
)

#: The codec functions, bound from the Cython twin (or the pure path) on first use.
_API = ("encode", "decode", "decode_prefix", "check_header", "frame_size")
__getattr__ = lazy_codec(globals(), "mip", _pure, _API)

encode: Callable[[Message], bytes]
decode: Callable[..., Message]  #: ``decode(buf, max_items=DEFAULT_MAX_ITEMS)``
decode_prefix: Callable[..., tuple[Message, int]]
check_header: Callable[..., tuple[int, int, int]]
#: ``frame_size(buf, pos=0, max_size=None)``: the complete message's size, None if incomplete
frame_size: Callable[..., int | None]
#: ``"fast"`` (Cython) or ``"pure"`` (construct): which codec the functions come from.
IMPLEMENTATION: str

__all__ = [
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "HEADER_SIZE",
    "IMPLEMENTATION",
    "PROTOCOL",
    "VERSION",
    "Buffer",
    "Decoder",
    "ErrorCode",
    "ErrorReply",
    "Inference",
    "Item",
    "ItemType",
    "Kind",
    "Message",
    "Ping",
    "Subtype",
    "check_header",
    "decode",
    "decode_prefix",
    "encode",
    "frame_size",
]
