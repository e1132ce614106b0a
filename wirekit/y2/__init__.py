"""y2: delta words, threshold-compression kernels and worker-link messages.

>>> import numpy as np
>>> from wirekit import y2
>>> words = y2.pack([3], [1], [42], [1])       # layer 3, weight, index 42, -tau
>>> hex(words[0])
'0x1c00055'
>>> y2.encode(y2.Delta(words)).hex()
'000000010000000401c00055'
>>> model = [(np.zeros(4, np.float32), np.zeros(2, np.float32))]
>>> residual = [(np.array([0.3, -0.1, -0.7, 0.0], np.float32), np.zeros(2, np.float32))]
>>> delta = y2.compress(residual, 0.25)
>>> y2.apply(model, delta, 0.25)
>>> model[0][0].tolist()
[0.25, 0.0, -0.25, 0.0]

The codec and kernel functions come from the Cython twin unless ``WIREKIT_PURE=1`` or it is
not built; ``IMPLEMENTATION`` tells which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from wirekit._impl import lazy_codec

from . import _pure
from .decoder import DEFAULT_MAX_MESSAGE_SIZE, Decoder
from .messages import (
    HANDSHAKE_SIZE,
    MAX_INDEX,
    MAX_LAYER,
    PROTOCOL,
    Delta,
    Finished,
    Message,
    MessageType,
    NodeIndex,
    Runtime,
    partition,
    word_fields,
)

#: The codec and kernel functions, bound from the Cython twin (or the pure path) on first use.
_API = (
    "encode",
    "decode",
    "decode_prefix",
    "check_handshake",
    "scan_deltas",
    "pack",
    "unpack",
    "to_wire",
    "from_wire",
    "apply",
    "compress",
)
__getattr__ = lazy_codec(globals(), "y2", _pure, _API)

encode: Callable[[Message], bytes]
decode: Callable[[Any], Message]
decode_prefix: Callable[..., tuple[Message, int]]
check_handshake: Callable[..., tuple[int, int]]
#: ``scan_deltas(buf, pos, end, max_bytes, max_message_size) -> (stop, count)``: the run of
#: whole Delta messages at ``buf[pos:end]`` (the y2 services batch and check with it).
scan_deltas: Callable[..., tuple[int, int]]
pack: Callable[..., np.ndarray]
unpack: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
to_wire: Callable[[Any], bytes]
from_wire: Callable[..., np.ndarray]
apply: Callable[[Any, Any, float], None]
compress: Callable[..., np.ndarray]
#: ``"fast"`` (Cython) or ``"pure"`` (construct + NumPy): which codec the functions come from.
IMPLEMENTATION: str

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "HANDSHAKE_SIZE",
    "IMPLEMENTATION",
    "MAX_INDEX",
    "MAX_LAYER",
    "PROTOCOL",
    "Decoder",
    "Delta",
    "Finished",
    "Message",
    "MessageType",
    "NodeIndex",
    "Runtime",
    "apply",
    "check_handshake",
    "compress",
    "decode",
    "decode_prefix",
    "encode",
    "from_wire",
    "pack",
    "partition",
    "scan_deltas",
    "to_wire",
    "unpack",
    "word_fields",
]
