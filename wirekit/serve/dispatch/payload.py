"""What travels through the dispatcher: a MIP message held as wire bytes, decoded, or both.

The MIP encoding is the canonical form of a request and of its answer: a MIP front door and
a MIP backend pass the bytes through untouched, HTTP and Clipper decode or encode only when
they need to, and the cache digests the request's bytes.  JSON conversion for the HTTP front
door lives here too (:func:`to_item`, :func:`item_value`), and the one JSON reader and writer
of the HTTP door (:func:`loads`, :func:`dumps`): RFC 8259 JSON both ways -- ``NaN`` and
``Infinity`` are refused on the way in, and never written on the way out.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

from wirekit import mip
from wirekit.mip import Inference, Item, ItemType, Message


class Payload:
    """A MIP message; ``wire`` and ``message`` are each computed once, on first use."""

    __slots__ = ("_message", "_wire")

    def __init__(self, wire: bytes | None = None, message: Message | None = None) -> None:
        if wire is None and message is None:
            raise ValueError("a payload needs its wire bytes or its message")
        self._wire = wire
        self._message = message

    @property
    def wire(self) -> bytes:
        wire = self._wire
        if wire is None:
            assert self._message is not None  # one of the two is given
            wire = self._wire = mip.encode(self._message)
        return wire

    @property
    def message(self) -> Message:
        if self._message is None:
            self._message = mip.decode(self._wire)
        return self._message

    def __len__(self) -> int:
        return len(self.wire)

    def __repr__(self) -> str:
        return f"Payload({self.message!r})"


def to_item(value: Any) -> Item:
    """A JSON value as one MIP item: a string is TEXT, ``{"b64": ..., "type": n}`` is raw
    bytes of item type n (default IMAGE), anything else is a JSON item (ValueError for a
    value that is not JSON: NaN, an infinity)."""
    if isinstance(value, str):
        return Item.text(value)
    if isinstance(value, dict) and "b64" in value and set(value) <= {"b64", "type"}:
        kind = value.get("type", int(ItemType.IMAGE))
        if isinstance(kind, bool) or not isinstance(kind, int) or not 0 <= kind < 1 << 32:
            raise ValueError(f"item type must be an integer 0..2**32-1, got {kind!r}")
        try:
            data = base64.b64decode(value["b64"], validate=True)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"b64 is not valid base64: {exc}") from None
        return Item(kind, data)
    try:  # as Item.json, but a number too large for a float (read as infinity) is refused
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise ValueError("a number is out of range (too large for a float)") from None
    return Item(ItemType.JSON, text.encode("utf-8"))


def item_value(item: Item) -> Any:
    """The JSON form of a MIP item (the inverse of :func:`to_item`).  An item that cannot be
    shown as what its type says -- TEXT that is not UTF-8, JSON that is not strict JSON (a
    backend's ``NaN`` or ``Infinity`` included) -- is shown as its bytes,
    ``{"type": n, "b64": ...}``: the answer stays valid JSON and loses nothing.  (A number
    in a JSON item too large for a float reads as infinity: :func:`dumps` writes it as
    ``null``.)"""
    if item.type == ItemType.TEXT:
        try:
            return item.as_text()
        except UnicodeDecodeError:
            pass
    elif item.type == ItemType.JSON:
        try:  # strict: a JSON item whose text holds NaN or Infinity is not JSON
            return loads(item.as_bytes())
        except (ValueError, RecursionError):
            pass
    return {"type": int(item.type), "b64": base64.b64encode(item.as_bytes()).decode("ascii")}


def request_from_json(samples: list[Any], *, multi: bool) -> Inference:
    """A MIP request from JSON samples: each sample one value (``multi=False``) or a list
    of values, one per model input (``multi=True``)."""
    rows: list[list[Item]] = []
    for sample in samples:
        if multi:
            if not isinstance(sample, list):
                raise ValueError("each entry of inputs must be a list of values (one per input)")
            if rows and len(sample) != len(rows[0]):
                raise ValueError(
                    f"every entry of inputs must have as many values as the first: entry "
                    f"{len(rows)} has {len(sample)}, entry 0 has {len(rows[0])}"
                )
            rows.append([to_item(v) for v in sample])
        else:
            rows.append([to_item(sample)])
    return Inference.request(rows)


def outputs_json(msg: Inference) -> list[list[Any]]:
    """The outputs of a MIP response as JSON: one list of values per sample."""
    return [[item_value(i) for i in sample] for sample in msg.samples]


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


_STRICT = json.JSONDecoder(parse_constant=_not_json)


def loads(raw: bytes | bytearray | str) -> Any:
    """Parse JSON as RFC 8259 has it: as :func:`json.loads`, but ``NaN``, ``Infinity`` and
    ``-Infinity`` -- which Python's parser takes -- raise :class:`ValueError`.  What every
    body the HTTP door reads goes through.  (A number too large for a float, ``1e999``,
    still reads as infinity -- checking each float as it is parsed would cost a third more
    on every body -- and is refused where it is used: by :func:`to_item` for an input, by
    the config's validation for a setting; :func:`dumps` never writes it.)"""
    if isinstance(raw, bytes | bytearray):
        raw = raw.decode(json.detect_encoding(raw), "surrogatepass")
    return _STRICT.decode(raw)


def _finite(doc: Any) -> Any:
    """``doc`` with every non-finite float (NaN, infinity) replaced by None."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_finite(v) for v in doc]
    return doc


def dumps(doc: Any) -> str:
    """The JSON text of an answer of the HTTP door: always valid JSON.  A non-finite float
    (NaN, infinity: a figure with no value yet, a plugin's option) is written as ``null``,
    never as the ``NaN`` that Python's :func:`json.dumps` writes by default."""
    try:
        return json.dumps(doc, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere: written as null
        return json.dumps(_finite(doc), separators=(",", ":"), allow_nan=False)
