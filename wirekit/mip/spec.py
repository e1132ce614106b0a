"""MIP declared with ``construct``: the readable reference and the fuzz oracle.

Every MIP message is an 8-byte header followed by ``remaining`` payload bytes; all integers
are big-endian::

     byte 0     byte 1    byte 2     byte 3     bytes 4..7
    +---------+---------+---------+----------+---------------------+
    | version |  kind   | subtype | reserved |  remaining (u32)    |   fixed header
    +---------+---------+---------+----------+---------------------+
    | n_input | n_output|  batch_size (u16)  |                         inference only
    +---------+---------+--------------------+---------------------+
    |  type (u32)                            |  size (u32)         |   one TLV item,
    +----------------------------------------+---------------------+   repeated batch_size ×
    |  data (size bytes) ...                                       |   n_input (request) or
    +--------------------------------------------------------------+   n_output (response)

``MESSAGE`` parses and builds a whole message.  The pure decoder walks the same pieces
(``HEADER``, ``INFERENCE_HEAD``, ``ITEM_HEAD``) one at a time so that it can report the exact
field and offset of a problem; the Cython twin in ``wirekit/_fast/mip.pyx`` does the same by
hand.
"""

from __future__ import annotations

from typing import Any

from construct import (
    Array,
    GreedyBytes,
    Int8ub,
    Int16ub,
    Int32ub,
    Prefixed,
    Struct,
    Switch,
    Terminated,
    this,
)

from .messages import Kind

HEADER = Struct(
    "version" / Int8ub,
    "kind" / Int8ub,
    "subtype" / Int8ub,
    "reserved" / Int8ub,
    "remaining" / Int32ub,
)

INFERENCE_HEAD = Struct(
    "n_input" / Int8ub,
    "n_output" / Int8ub,
    "batch_size" / Int16ub,
)

ITEM_HEAD = Struct(
    "type" / Int32ub,
    "size" / Int32ub,
)

ITEM = Struct(
    "type" / Int32ub,
    "data" / Prefixed(Int32ub, GreedyBytes),
)


def _item_count(ctx: Any) -> int:
    width = ctx.n_output if ctx._.subtype == 1 else ctx.n_input
    return ctx.batch_size * width


INFERENCE_PAYLOAD = Struct(
    "n_input" / Int8ub,
    "n_output" / Int8ub,
    "batch_size" / Int16ub,
    "items" / Array(_item_count, ITEM),
    Terminated,
)

EMPTY_PAYLOAD = Struct(Terminated)

MESSAGE = Struct(
    "version" / Int8ub,
    "kind" / Int8ub,
    "subtype" / Int8ub,
    "reserved" / Int8ub,
    "payload"
    / Prefixed(
        Int32ub,
        Switch(this.kind, {int(Kind.INFERENCE): INFERENCE_PAYLOAD}, default=EMPTY_PAYLOAD),
    ),
)
