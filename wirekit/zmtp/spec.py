"""ZMTP 3.0/3.1 (RFC 23 and 37) declared with ``construct``: the reference and fuzz oracle.

One direction of a ZeroMQ TCP connection is a greeting, then frames::

     0     1..8      9     10     11     12 .. 31        32         33 .. 63
    +----+---------+----+-------+-------+---------------+----------+-----------+
    | FF | padding | 7F | major | minor | mechanism     | as-server| filler    |  greeting,
    +----+---------+----+-------+-------+---------------+----------+-----------+  64 bytes
                                         "NULL", NUL-padded

    +-------+------------------------------+------------------+
    | flags | size: u8, or u64 if LONG     | body (size bytes)|   one frame, repeated
    +-------+------------------------------+------------------+
    flags: bit0 MORE, bit1 LONG, bit2 COMMAND, bits 3..7 reserved (0).  Sizes are big-endian.

    command body:  name length u8 | name | command data
    READY data:    property*  =  name length u8 | name | value length u32 | value

``STREAM`` parses and builds a whole capture (greeting + frames).  The pure decoder walks the
same pieces (``GREETING``, ``FRAME_FLAGS``, ``SHORT_SIZE``/``LONG_SIZE``, ``COMMAND_NAME``,
``PROPERTY_NAME``, ``VALUE_SIZE``) one at a time to report the exact field and offset of a
problem; ``wirekit/_fast/zmtp.pyx`` does the same by hand.
"""

from __future__ import annotations

from construct import (
    Bytes,
    Const,
    GreedyBytes,
    GreedyRange,
    IfThenElse,
    Int8ub,
    Int32ub,
    Int64ub,
    PascalString,
    Prefixed,
    Struct,
    Terminated,
    this,
)

from .messages import FLAG_LONG

GREETING = Struct(
    "signature" / Const(b"\xff"),
    "padding" / Bytes(8),
    "signature_end" / Const(b"\x7f"),
    "major" / Int8ub,
    "minor" / Int8ub,
    "mechanism" / Bytes(20),
    "as_server" / Int8ub,
    "filler" / Bytes(31),
)

FRAME_FLAGS = Int8ub
SHORT_SIZE = Int8ub
LONG_SIZE = Int64ub

FRAME = Struct(
    "flags" / Int8ub,
    "size" / IfThenElse(this.flags & FLAG_LONG, Int64ub, Int8ub),
    "body" / Bytes(this.size),
)

COMMAND_NAME = PascalString(Int8ub, "latin-1")
COMMAND = Struct("name" / COMMAND_NAME, "data" / GreedyBytes)

PROPERTY_NAME = PascalString(Int8ub, "latin-1")
VALUE_SIZE = Int32ub
PROPERTY = Struct("name" / PROPERTY_NAME, "value" / Prefixed(Int32ub, GreedyBytes))
PROPERTIES = Struct("properties" / GreedyRange(PROPERTY), Terminated)

STREAM = Struct("greeting" / GREETING, "frames" / GreedyRange(FRAME), Terminated)
