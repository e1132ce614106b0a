"""y2: delta words, threshold-compression kernels and worker-link messages.

>>> import numpy as np
>>> from wirekit import y2
>>> words = y2.pack([3], [1], [42], [1])       # layer 3, weight, index 42, +tau
>>> hex(words[0])                                # y2's parameter 6: (6 << 22) | (42 << 1) | 1
'0x1800055'
>>> y2.word_fields(words[0])
{'param': 6, 'layer': 3, 'weight': True, 'index': 42, 'positive': True}
>>> y2.encode(y2.Delta(words)).hex()
'000000010000000401800055'
>>> model = [(np.zeros(4, np.float32), np.zeros(2, np.float32))]
>>> residual = [(np.array([0.3, -0.1, -0.7, 0.0], np.float32), np.zeros(2, np.float32))]
>>> delta = y2.compress(residual, 0.25)
>>> [hex(w) for w in delta]                      # +tau at index 0, -tau at index 2
['0x1', '0x4']
>>> y2.apply(model, delta, 0.25)
>>> model[0][0].tolist()
[0.25, 0.0, -0.25, 0.0]

A model's parameter list in y2's order (``model.parameters()``) addresses words through
:func:`parameter_pairs`: word ``p`` updates ``params[p]``.

>>> params = [np.zeros(3), np.zeros(2), np.zeros(2)]   # e.g. a layer without bias first
>>> y2.apply(y2.parameter_pairs(params), [(2 << 22) | (1 << 1) | 1], 0.5)
>>> params[2].tolist()
[0.0, 0.5]

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
    MAX_PARAM,
    OLD_LAYOUT_FLIP,
    PROTOCOL,
    Delta,
    Finished,
    Message,
    MessageType,
    NodeIndex,
    Runtime,
    parameter_pairs,
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
    "MAX_PARAM",
    "OLD_LAYOUT_FLIP",
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
    "parameter_pairs",
    "partition",
    "scan_deltas",
    "to_wire",
    "unpack",
    "word_fields",
]
