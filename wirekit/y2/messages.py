"""y2 message types and word layout, shared by the Cython twin and the pure path.

A y2 *delta word* is one unsigned 32-bit integer (most significant bit first), as y2's
trainer builds it (``(param << 22) | (index << 1) | positive``)::

    bit 31 ............. 22 | 21 ................ 1 | 0
        param (10 bits)     | index (21 bits)       | positive
        layer (9) | bias (1)|                       |

``param`` is the parameter's position in the model's parameter list (``model.parameters()``
in y2); ``positive`` is 1 for +tau, 0 for -tau.  wirekit's (weights, biases) pairs are a view
of ``param``: layer ``param >> 1``, a weight when ``param`` is even, a bias when odd.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

PROTOCOL = "y2"

#: Bytes of the worker-link handshake that precedes every payload: type (i32), size (i32).
HANDSHAKE_SIZE = 8
WORD_SIZE = 4

PARAM_BITS, LAYER_BITS, INDEX_BITS = 10, 9, 21
PARAM_SHIFT, LAYER_SHIFT, BIAS_SHIFT, INDEX_SHIFT = 22, 23, 22, 1
MAX_PARAM = (1 << PARAM_BITS) - 1  # 1023
MAX_LAYER = (1 << LAYER_BITS) - 1  # 511
MAX_INDEX = (1 << INDEX_BITS) - 1  # 2_097_151
MAX_LAYERS = MAX_LAYER + 1
MAX_ARRAY_SIZE = MAX_INDEX + 1
#: Earlier wirekit versions' words had bit 22 set for a weight and bit 0 set for -tau (the
#: reverse of y2's trainer): ``old ^ OLD_LAYOUT_FLIP`` is the same update in y2's layout,
#: and ``new ^ OLD_LAYOUT_FLIP`` the old word (for reading logs written before the change).
OLD_LAYOUT_FLIP = (1 << BIAS_SHIFT) | 1

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
U32_MAX = 2**32 - 1

NODE_INDEX_SIZE = 8
RUNTIME_SIZES = (16, 20)
#: Largest Delta a handshake can announce (its size is an i32).
MAX_DELTA_WORDS = I32_MAX // WORD_SIZE


class MessageType(IntEnum):
    """The ``type`` field of the handshake."""

    NODE_INDEX = 0
    DELTA = 1
    RUNTIME = 2
    FINISHED = 3


@dataclass(frozen=True, slots=True)
class NodeIndex:
    """Tells a worker which node it is and how many nodes train together."""

    node_id: int
    node_count: int

    def partition(self, n: int) -> range:
        """The sample indices of a training set of ``n`` samples this node trains on."""
        return range(*partition(self.node_id, self.node_count, n))


@dataclass(frozen=True, slots=True, eq=False)
class Delta:
    """A batch of delta words (a NumPy ``uint32`` array, or anything array-like of ints).

    Decoding gives a fresh native-order ``uint32`` array.  Two deltas are equal when their
    words are equal, whatever the array type holding them.
    """

    words: Any

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Delta):
            return NotImplemented
        a, b = np.asarray(self.words), np.asarray(other.words)
        return a.shape == b.shape and bool(np.array_equal(a, b))

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self.words)

    def __repr__(self) -> str:
        words = np.asarray(self.words)
        shown = ", ".join(f"0x{int(w):08x}" for w in words[:4])
        more = ", ..." if len(words) > 4 else ""
        return f"Delta({len(words)} words: [{shown}{more}])"


@dataclass(frozen=True, slots=True)
class Runtime:
    """A worker's timing report for one round.

    The first upstream version sends four fields (16 bytes); later ones append the epoch
    loss × 1000 (20 bytes).  ``loss_milli`` is None for the four-field form.
    """

    sample_count: int
    decompression_ms: int
    training_ms: int
    compression_ms: int
    loss_milli: int | None = None

    @property
    def loss(self) -> float | None:
        """The epoch loss (``loss_milli / 1000``), or None."""
        return None if self.loss_milli is None else self.loss_milli / 1000


@dataclass(frozen=True, slots=True)
class Finished:
    """The worker has finished training.  No payload."""


Message = NodeIndex | Delta | Runtime | Finished

_TYPE_NAMES = {
    MessageType.NODE_INDEX: "node_index",
    MessageType.DELTA: "delta",
    MessageType.RUNTIME: "runtime",
    MessageType.FINISHED: "finished",
}


def partition(node_id: int, node_count: int, n: int) -> tuple[int, int]:
    """``(start, stop)``: node ``node_id`` of ``node_count`` trains on samples start..stop-1.

    start = floor(node_id / node_count × n), stop = floor((node_id + 1) / node_count × n),
    computed with integers only (``node_id * n // node_count``), so it is exact for any size
    and the nodes' ranges tile ``0..n`` with no gap and no overlap.
    """
    for name, value in (("node_id", node_id), ("node_count", node_count), ("n", n)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if node_count < 1:
        raise ValueError(f"node_count must be >= 1, got {node_count}")
    if not 0 <= node_id < node_count:
        raise ValueError(f"node_id must be in 0..{node_count - 1}, got {node_id}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return node_id * n // node_count, (node_id + 1) * n // node_count


def word_fields(word: int) -> dict[str, int | bool]:
    """The fields of one delta word as a dict: y2's ``param`` (parameter index), its view
    ``layer`` and ``weight`` (even ``param``), ``index`` and ``positive`` (+tau)."""
    word = int(word)
    return {
        "param": word >> PARAM_SHIFT,
        "layer": word >> LAYER_SHIFT,
        "weight": not (word >> BIAS_SHIFT) & 1,
        "index": (word >> INDEX_SHIFT) & MAX_INDEX,
        "positive": bool(word & 1),
    }


def parameter_pairs(params: Any) -> list[tuple[Any, Any]]:
    """A model's parameter arrays, in y2's order (``model.parameters()``), as the (weights,
    biases) pairs that ``compress`` and ``apply`` take: ``[(p0, p1), (p2, p3), ...]``.

    A word's parameter index ``p`` then addresses ``params[p]`` whatever the arrays are (a
    layer without a bias shifts the following ones, as in y2).  With an odd count, the last
    pair's biases are an empty array of the last array's dtype.
    """
    arrays = list(params)
    if len(arrays) % 2:
        last = np.asarray(arrays[-1])
        arrays.append(np.zeros(0, last.dtype if last.dtype.kind == "f" else np.float32))
    return [(arrays[k], arrays[k + 1]) for k in range(0, len(arrays), 2)]


def type_name(msg: Message) -> str:
    """``node_index``, ``delta``, ``runtime`` or ``finished``."""
    return _TYPE_NAMES[message_type(msg)]


def message_type(msg: Message) -> MessageType:
    """The handshake type of ``msg``."""
    if isinstance(msg, NodeIndex):
        return MessageType.NODE_INDEX
    if isinstance(msg, Delta):
        return MessageType.DELTA
    if isinstance(msg, Runtime):
        return MessageType.RUNTIME
    if isinstance(msg, Finished):
        return MessageType.FINISHED
    from wirekit.errors import EncodeError

    raise EncodeError(PROTOCOL, "message", f"not a y2 message: {type(msg).__name__}")


def to_jsonable(msg: Message, *, max_words: int | None = None) -> dict[str, Any]:
    """A JSON-ready description of ``msg`` (``wirekit decode --json``, the golden vectors).

    A Delta lists its words decoded; ``max_words`` limits how many (None: all).
    """
    kind = type_name(msg)
    if isinstance(msg, NodeIndex):
        return {"kind": kind, "node_id": msg.node_id, "node_count": msg.node_count}
    if isinstance(msg, Runtime):
        out: dict[str, Any] = {
            "kind": kind,
            "sample_count": msg.sample_count,
            "decompression_ms": msg.decompression_ms,
            "training_ms": msg.training_ms,
            "compression_ms": msg.compression_ms,
        }
        if msg.loss_milli is not None:
            out["loss_milli"] = msg.loss_milli
        return out
    if isinstance(msg, Finished):
        return {"kind": kind}
    words = np.asarray(msg.words)
    shown = words if max_words is None else words[:max_words]
    return {
        "kind": kind,
        "word_count": len(words),
        "words": [{"word": f"0x{int(w):08x}", **word_fields(w)} for w in shown.tolist()],
    }
