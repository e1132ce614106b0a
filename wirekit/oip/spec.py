"""The binary forms of the OIP mapping declared with ``construct``: the readable reference
and the property tests' and fuzz target's oracle (specs/oip.md).

``TENSOR_ITEM`` is the data of a TENSOR item (MIP item type 0x4F495002)::

    +----------+---------+-------------------+-------------------------------+
    | datatype |  ndim   | name_length (u16) |  parameters_length (u32)      |  8-byte head
    +----------+---------+-------------------+-------------------------------+
    | name (name_length bytes, UTF-8)                                        |
    | shape: ndim dimensions, each an i64 (big-endian)                       |
    | parameters (parameters_length bytes: a JSON object; 0 bytes = none)    |
    | data: the rest of the item, the tensor's raw bytes (little-endian)     |
    +------------------------------------------------------------------------+

``JSON_ITEM`` is the data of a REQUEST (0x4F495001) or PARAMETERS (0x4F495003) item, and
``ERROR_ITEM`` of an ERROR item (0x4F495004): UTF-8 text.  ``BYTES_ELEMENTS`` is a BYTES
tensor's raw bytes, and ``BINARY_BODY`` the framing of the REST binary tensor data extension:
the JSON document (``header_length`` bytes) then each binary tensor's bytes in order and
nothing after (parse with ``header_length=`` and ``sizes=``, the ``binary_data_size`` of each
binary tensor in document order).

``request_wire`` and ``reply_items`` build, with these declarations and MIP's own
(:mod:`wirekit.mip.spec`), what the twins' ``request_to_mip`` and
:func:`wirekit.oip.reply_to_mip` must give.
"""

from __future__ import annotations

import json
from typing import Any

from construct import (
    Array,
    Bytes,
    GreedyBytes,
    GreedyRange,
    GreedyString,
    Int8ub,
    Int16ub,
    Int32ub,
    Int32ul,
    Int64sb,
    Prefixed,
    Rebuild,
    Struct,
    Terminated,
    len_,
    this,
)

from wirekit.mip import spec as mip_spec

from .items import TRANSPORT, OipItem, split_rows
from .messages import BY_CODE, DATATYPES, InferRequest, Tensor

TENSOR_ITEM = Struct(
    "datatype" / Int8ub,
    "ndim" / Rebuild(Int8ub, len_(this.shape)),
    "name_length" / Rebuild(Int16ub, len_(this.name)),
    "parameters_length" / Rebuild(Int32ub, len_(this.parameters)),
    "name" / Bytes(this.name_length),
    "shape" / Array(this.ndim, Int64sb),
    "parameters" / Bytes(this.parameters_length),
    "data" / GreedyBytes,
)

JSON_ITEM = GreedyString("utf8")
ERROR_ITEM = GreedyString("utf8")

BYTES_ELEMENTS = GreedyRange(Prefixed(Int32ul, GreedyBytes))

BINARY_BODY = Struct(
    "document" / Bytes(this._params.header_length),
    "tensors" / Array(len_(this._params.sizes), Bytes(lambda ctx: ctx._params.sizes[ctx._index])),
    Terminated,
)


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def _kept(parameters: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in parameters.items() if k not in TRANSPORT}


def tensor_item(t: Tensor) -> bytes:
    """A TENSOR item's data, built by ``TENSOR_ITEM``."""
    kept = _kept(t.parameters)
    return TENSOR_ITEM.build(
        dict(
            datatype=DATATYPES[t.datatype].code,
            name=t.name.encode("utf-8", "surrogatepass"),
            shape=list(t.shape),
            parameters=_json(kept) if kept else b"",
            data=bytes(t.data),
        )
    )


def parse_tensor_item(data: bytes) -> Tensor:
    """The tensor ``TENSOR_ITEM`` parses from a TENSOR item's data (no checks beyond the
    declaration's own)."""
    c = TENSOR_ITEM.parse(data)
    return Tensor(
        c.name.decode("utf-8", "surrogatepass"),
        BY_CODE[c.datatype].name,
        tuple(c.shape),
        c.data,
        json.loads(c.parameters) if c.parameters else {},
    )


def request_item(req: InferRequest) -> bytes:
    """A REQUEST item's data, built by ``JSON_ITEM``."""
    document: dict[str, Any] = {}
    if _kept(req.parameters):
        document["parameters"] = _kept(req.parameters)
    if req.outputs:
        document["outputs"] = [
            {"name": o.name, **({"parameters": _kept(o.parameters)} if _kept(o.parameters) else {})}
            for o in req.outputs
        ]
    return JSON_ITEM.build(json.dumps(document, separators=(",", ":")))


def request_wire(req: InferRequest, rows: bool = False) -> bytes:
    """The MIP request wire carrying ``req``, built by the construct declarations (the
    oracle of both twins' ``request_to_mip``)."""
    per_sample = split_rows(req.inputs, "inputs")[1] if rows else [req.inputs]
    request = request_item(req)
    items = []
    for tensors in per_sample:
        items.append(dict(type=int(OipItem.REQUEST), data=request))
        items.extend(dict(type=int(OipItem.TENSOR), data=tensor_item(t)) for t in tensors)
    payload = dict(n_input=1 + len(req.inputs), n_output=0, batch_size=len(per_sample), items=items)
    return mip_spec.MESSAGE.build(dict(version=0, kind=2, subtype=0, reserved=0, payload=payload))


def reply_items(outputs: list[Tensor], parameters: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One reply sample's items (``type``, ``data``), built by the construct declarations."""
    items = [dict(type=int(OipItem.TENSOR), data=tensor_item(t)) for t in outputs]
    if parameters:
        items.append(dict(type=int(OipItem.PARAMETERS), data=_json(parameters)))
    return items


def bytes_elements(raw: bytes) -> list[bytes]:
    """A BYTES tensor's elements, parsed by ``BYTES_ELEMENTS``."""
    return list(BYTES_ELEMENTS.parse(raw))


__all__ = [
    "BINARY_BODY",
    "BYTES_ELEMENTS",
    "ERROR_ITEM",
    "JSON_ITEM",
    "TENSOR_ITEM",
    "bytes_elements",
    "parse_tensor_item",
    "reply_items",
    "request_item",
    "request_wire",
    "tensor_item",
]
