"""Clipper's model-container RPC (all three generations): messages and codec.

Clipper binds a ZeroMQ ROUTER; each model container connects a DEALER.  A message is a list
of frames; as the container sees it, the first frame is the empty delimiter.

>>> from wirekit import clipper
>>> frames = clipper.encode(clipper.HeartbeatReply(clipper.HeartbeatType.KEEPALIVE), "v3")
>>> [f.hex() for f in frames]
['', '03000000', '02000000', '00000000']
>>> clipper.decode(frames, "v3", "to_container")
HeartbeatReply(heartbeat_type=<HeartbeatType.KEEPALIVE: 0>)

``encode``/``decode`` come from the Cython twin unless ``WIREKIT_PURE=1`` or it is not built;
``IMPLEMENTATION`` tells which.  Every malformed message raises
:class:`~wirekit.errors.DecodeError` with ``protocol="clipper"``, the ``frame`` index, the
``field`` and the byte ``offset`` in that frame.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from wirekit._impl import lazy_codec
from wirekit.errors import DecodeError

from . import _pure
from .messages import (
    DTYPES,
    PROTOCOL,
    RPC_VERSION,
    Direction,
    Generation,
    Heartbeat,
    HeartbeatReply,
    HeartbeatType,
    InputType,
    Message,
    MessageType,
    NewContainer,
    PredictRequest,
    PredictResponse,
    RequestType,
    same_message,
    to_jsonable,
)

#: The codec functions, bound from the Cython twin (or the pure path) on first use.
_API = ("encode", "decode")
__getattr__ = lazy_codec(globals(), "clipper", _pure, _API)

encode: Callable[[Message, Generation | str], list[bytes]]
decode: Callable[[Sequence[Any], Generation | str, Direction | str], Message]
#: ``"fast"`` (Cython) or ``"pure"`` (construct): which codec the functions come from.
IMPLEMENTATION: str

#: The order :func:`candidates` tries the generations in.
_ORDER = (Generation.V3, Generation.G2017, Generation.G2016)


def candidates(frames: Sequence[Any], direction: Direction | str) -> list[Generation]:
    """Every generation in which ``frames`` decode as one valid message."""
    codec_decode = globals()["decode"] if "decode" in globals() else __getattr__("decode")
    out = []
    for gen in _ORDER:
        try:
            codec_decode(frames, gen, direction)
        except DecodeError:
            continue
        out.append(gen)
    return out


def detect(frames: Sequence[Any], direction: Direction | str) -> Generation | None:
    """Best-effort guess of the generation of one message's frames.

    The generation in which the frames decode, or None when they decode in none or in more
    than one (the 2017 and v3 heartbeat ``["", 2]`` are byte-identical, for instance): a
    caller following a connection keeps its earlier guess then.
    """
    found = candidates(frames, direction)
    return found[0] if len(found) == 1 else None


def to_router(identity: bytes, frames: Sequence[Any]) -> list[Any]:
    """The frames as Clipper's ROUTER sends/receives them: the routing identity in front."""
    return [identity, *frames]


def from_router(frames: Sequence[Any]) -> tuple[Any, list[Any]]:
    """Split a ROUTER-side message into ``(identity, frames as the container sees them)``."""
    frames = list(frames)
    if not frames:
        raise DecodeError(
            PROTOCOL, "identity", 0, "no frames (expected a routing identity)", frame=0
        )
    return frames[0], frames[1:]


__all__ = [
    "DTYPES",
    "IMPLEMENTATION",
    "PROTOCOL",
    "RPC_VERSION",
    "Direction",
    "Generation",
    "Heartbeat",
    "HeartbeatReply",
    "HeartbeatType",
    "InputType",
    "Message",
    "MessageType",
    "NewContainer",
    "PredictRequest",
    "PredictResponse",
    "RequestType",
    "candidates",
    "decode",
    "detect",
    "encode",
    "from_router",
    "same_message",
    "to_jsonable",
    "to_router",
]
