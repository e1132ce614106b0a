"""y2 declared with ``construct``: the readable reference and the test oracle.

Worker link: every message is an 8-byte handshake and ``size`` payload bytes; every integer
is 4 bytes, big-endian, signed::

     bytes 0..3        bytes 4..7
    +-----------------+-----------------+
    |  type (i32)     |  size (i32)     |   handshake
    +-----------------+-----------------+
    |  payload (size bytes) ...         |   0 NodeIndex: node_id, node_count (8 bytes)
    +-----------------------------------+   1 Delta: delta words (4 × n bytes)
                                            2 Runtime: 4 or 5 × i32 (16 or 20 bytes)
                                            3 Finished: nothing

A delta word (unsigned, most significant bit first), as y2's trainer builds it::

    31 ............... 22  21 ...................... 1   0
    +---------------------+--------------------------+---+
    |  param (10 bits)    |  index (21 bits)         | + |
    +---------------------+--------------------------+---+
    | layer (9 bits) | b  |

``WORD`` is y2's reading (``param``: the parameter's position in the model's parameter
list; ``positive``: 1 for +tau); ``LAYER_WORD`` the (weights, biases) view of the same bits
(``bias``: 1 for a bias, an odd ``param``).

``MESSAGE`` parses and builds a whole message.  The pure decoder checks ``HANDSHAKE`` first
and then parses the payload pieces, so that it can name the field and offset of a problem.
"""

from __future__ import annotations

from construct import (
    BitsInteger,
    BitStruct,
    Flag,
    GreedyRange,
    Int32sb,
    Optional,
    Prefixed,
    Struct,
    Switch,
    Terminated,
    this,
)

from .messages import MessageType

WORD = BitStruct(
    "param" / BitsInteger(10),
    "index" / BitsInteger(21),
    "positive" / Flag,
)

LAYER_WORD = BitStruct(
    "layer" / BitsInteger(9),
    "bias" / Flag,
    "index" / BitsInteger(21),
    "positive" / Flag,
)

HANDSHAKE = Struct(
    "type" / Int32sb,
    "size" / Int32sb,
)

NODE_INDEX = Struct(
    "node_id" / Int32sb,
    "node_count" / Int32sb,
)

RUNTIME = Struct(
    "sample_count" / Int32sb,
    "decompression_ms" / Int32sb,
    "training_ms" / Int32sb,
    "compression_ms" / Int32sb,
    "loss_milli" / Optional(Int32sb),
)

DELTA = Struct("words" / GreedyRange(WORD), Terminated)

MESSAGE = Struct(
    "type" / Int32sb,
    "payload"
    / Prefixed(
        Int32sb,
        Switch(
            this.type,
            {
                int(MessageType.NODE_INDEX): Struct(*NODE_INDEX.subcons, Terminated),
                int(MessageType.DELTA): DELTA,
                int(MessageType.RUNTIME): Struct(*RUNTIME.subcons, Terminated),
                int(MessageType.FINISHED): Struct(Terminated),
            },
        ),
    ),
)
