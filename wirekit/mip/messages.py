"""MIP message types, shared by the Cython twin and the pure path.

Decoding with either implementation gives objects of these classes that compare equal.
"""

from __future__ import annotations

import json as _json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

PROTOCOL = "mip"
VERSION = 0
HEADER_SIZE = 8
INFERENCE_HEADER_SIZE = 4
ITEM_HEADER_SIZE = 8
#: Items one decoded message may hold (``batch_size`` × ``n_input``, or × ``n_output`` for a
#: response).  Each decoded item costs about 100 bytes of Python objects whatever its size,
#: so the limit bounds the memory a decode adds beyond the message bytes (about 6.5 MB);
#: a message over it is refused with a MEMORY error before any item is built.
DEFAULT_MAX_ITEMS = 65536


class Kind(IntEnum):
    """The ``kind`` byte of the fixed header."""

    ERROR = 0
    PING = 1
    INFERENCE = 2


class Subtype(IntEnum):
    """The ``subtype`` byte for ping and inference (for errors it holds the error code)."""

    REQUEST = 0
    RESPONSE = 1


class ErrorCode(IntEnum):
    """The six error kinds a MIP peer can answer with."""

    PROTOCOL = 0  #: unsupported protocol version
    SUBTYPE = 1  #: subtype is not a request
    METHOD = 2  #: kind not implemented
    MEMORY = 3  #: message larger than the peer accepts
    SHAPE = 4  #: payload does not match its header (or outputs do not match the batch)
    INTERNAL = 5  #: the model failed


class ItemType(IntEnum):
    """KubeMo's item types.  Other numbers are legal on the wire and pass through as ints."""

    TEXT = 1
    JSON = 2
    IMAGE = 3


Buffer = bytes | bytearray | memoryview


class Item(NamedTuple):
    """One TLV item of an inference message: a type number and its data.

    Decoded data of 256 bytes or more is a ``memoryview`` into the buffer that was decoded
    (no copy; keep that buffer unchanged while you use it); shorter data is ``bytes``.  Use
    ``as_bytes``/``as_text``/``as_json`` to not care.  Items you build may hold any
    contiguous bytes-like object.
    """

    type: int
    data: Buffer

    @classmethod
    def text(cls, value: str) -> Item:
        """A TEXT item holding ``value`` encoded as UTF-8."""
        return cls(ItemType.TEXT, value.encode("utf-8"))

    @classmethod
    def json(cls, value: Any) -> Item:
        """A JSON item holding ``value`` serialised as compact UTF-8 JSON text."""
        return cls(ItemType.JSON, _json.dumps(value, separators=(",", ":")).encode("utf-8"))

    @classmethod
    def image(cls, encoded: Buffer) -> Item:
        """An IMAGE item holding an encoded image file (PNG, JPEG, ...) as is."""
        return cls(ItemType.IMAGE, encoded)

    def __repr__(self) -> str:
        data = bytes(self.data)
        shown = repr(data[:48]) + ("..." if len(data) > 48 else "")
        return f"Item(type={self.type_name}, data={shown})"

    @property
    def type_name(self) -> str:
        """``TEXT``/``JSON``/``IMAGE`` for KubeMo's types, ``TYPE<n>`` for any other."""
        try:
            return ItemType(self.type).name
        except ValueError:
            return f"TYPE{self.type}"

    def as_bytes(self) -> bytes:
        """The data as an independent ``bytes`` object."""
        return bytes(self.data)

    def as_text(self) -> str:
        """The data decoded as UTF-8 (for TEXT and JSON items)."""
        return bytes(self.data).decode("utf-8")

    def as_json(self) -> Any:
        """The data parsed as JSON."""
        return _json.loads(bytes(self.data))


@dataclass(frozen=True, slots=True)
class Ping:
    """A ping request, or (``response=True``) its reply.  No payload."""

    response: bool = False


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An error reply (kind 0): the error code travels in the subtype byte.  No payload."""

    code: int


@dataclass(frozen=True, slots=True)
class Inference:
    """An inference request or response: a batch of samples, each a fixed number of items.

    ``items`` is sample-major: all items of sample 0, then sample 1, ...  A request holds
    ``batch_size * n_input`` items, a response ``batch_size * n_output`` items.
    """

    response: bool
    n_input: int
    n_output: int
    batch_size: int
    items: tuple[Item, ...]

    @classmethod
    def request(cls, samples: Iterable[Sequence[Item]]) -> Inference:
        """A request from per-sample item lists, which must all have the same length."""
        rows = [tuple(sample) for sample in samples]
        width = _common_width(rows, "n_input")
        return cls(False, width, 0, len(rows), tuple(i for row in rows for i in row))

    @classmethod
    def reply(cls, samples: Iterable[Sequence[Item]], n_input: int = 0) -> Inference:
        """A response from per-sample output lists (``n_input`` echoes the request's)."""
        rows = [tuple(sample) for sample in samples]
        width = _common_width(rows, "n_output")
        return cls(True, n_input, width, len(rows), tuple(i for row in rows for i in row))

    @property
    def width(self) -> int:
        """Items per sample: ``n_output`` for a response, ``n_input`` for a request."""
        return self.n_output if self.response else self.n_input

    @property
    def samples(self) -> tuple[tuple[Item, ...], ...]:
        """The items grouped per sample."""
        w = self.width
        return tuple(self.items[k * w : (k + 1) * w] for k in range(self.batch_size))


Message = Ping | ErrorReply | Inference


def to_jsonable(msg: Message, *, full_data: bool = True) -> dict[str, Any]:
    """A JSON-ready description of ``msg`` (the CLI's ``--json`` form and the golden vectors')."""
    if isinstance(msg, Ping):
        return {"kind": "ping", "response": msg.response}
    if isinstance(msg, ErrorReply):
        return {"kind": "error", "code": int(msg.code), "code_name": ErrorCode(msg.code).name}
    items = []
    for item in msg.items:
        data = bytes(item.data)
        entry: dict[str, Any] = {
            "type": int(item.type),
            "type_name": item.type_name,
            "size": len(data),
        }
        entry["data_hex" if full_data else "preview_hex"] = (
            data.hex() if full_data else data[:32].hex()
        )
        items.append(entry)
    return {
        "kind": "inference",
        "response": msg.response,
        "n_input": msg.n_input,
        "n_output": msg.n_output,
        "batch_size": msg.batch_size,
        "items": items,
    }


def _common_width(rows: list[tuple[Item, ...]], what: str) -> int:
    from wirekit.errors import EncodeError

    if not rows:
        return 0
    width = len(rows[0])
    for k, row in enumerate(rows):
        if len(row) != width:
            raise EncodeError(
                PROTOCOL, what, f"sample {k} has {len(row)} items, sample 0 has {width}"
            )
    return width
