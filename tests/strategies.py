"""Hypothesis strategies for valid messages of every protocol."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from wirekit import clipper, mip, y2

item_types = st.one_of(st.sampled_from([1, 2, 3]), st.integers(0, 2**32 - 1))


@st.composite
def mip_items(draw, count: int):
    return tuple(mip.Item(draw(item_types), draw(st.binary(max_size=64))) for _ in range(count))


@st.composite
def mip_inference(draw):
    response = draw(st.booleans())
    n_input = draw(st.integers(0, 255))
    n_output = draw(st.integers(0, 255))
    width = n_output if response else n_input
    batch = draw(st.integers(0, 65535 if width == 0 else max(0, 12 // max(width, 1))))
    if width > 12:
        batch = draw(st.integers(0, 1))
    items = draw(mip_items(batch * width))
    return mip.Inference(response, n_input, n_output, batch, items)


mip_messages = st.one_of(
    st.builds(mip.Ping, st.booleans()),
    st.builds(mip.ErrorReply, st.sampled_from(list(mip.ErrorCode))),
    mip_inference(),
)


# --- ZMTP ---------------------------------------------------------------------------------

#: frames short and long (> 255 bytes takes the 8-byte LONG size form), empty included
zmtp_frames = st.one_of(st.binary(max_size=24), st.binary(min_size=250, max_size=300))
zmtp_socket_types = st.sampled_from(["DEALER", "ROUTER", "REQ", "REP", "PUB", "SUB", "PAIR"])


def zmtp_items(max_frames: int = 4):
    """A message of 1..``max_frames`` frames, or a command."""
    return st.one_of(
        st.tuples(st.just("message"), st.lists(zmtp_frames, min_size=1, max_size=max_frames)),
        st.tuples(
            st.just("command"),
            st.sampled_from(["PING", "PONG", "SUBSCRIBE", "CANCEL"]),
            st.one_of(st.binary(max_size=12), st.binary(min_size=260, max_size=270)),
        ),
    )


@st.composite
def zmtp_streams(draw, max_frames: int = 4):
    """A capture description: (greeting kwargs, socket type, identity, items)."""
    greeting = {"minor": draw(st.integers(0, 1)), "as_server": draw(st.booleans())}
    socket_type = draw(zmtp_socket_types)
    identity = draw(st.one_of(st.just(b""), st.binary(min_size=1, max_size=8)))
    items = draw(st.lists(zmtp_items(max_frames), max_size=6))
    return greeting, socket_type, identity, items


@st.composite
def chunkings(draw, size: int):
    """Cut points (sorted, ending at ``size``) for feeding ``size`` bytes: random cuts, or
    every ``k`` bytes (1: byte by byte)."""
    if draw(st.booleans()):
        step = draw(st.integers(1, 9))
        return [*range(step, size, step), size]
    return [*sorted(draw(st.lists(st.integers(0, size), max_size=12))), size]


def zmtp_encode(codec, stream) -> bytes:
    """The capture bytes of a ``zmtp_streams`` description, built with ``codec``."""
    greeting, socket_type, identity, items = stream
    parts = [codec.encode_greeting(**greeting), codec.encode_ready(socket_type, identity)]
    for item in items:
        if item[0] == "message":
            parts.append(codec.encode_message(item[1]))
        else:
            parts.append(codec.encode_command(item[1], item[2]))
    return b"".join(parts)


# --- Clipper ---------------------------------------------------------------------------------


clipper_generations = st.sampled_from(list(clipper.Generation))
_u32s = st.integers(0, 2**32 - 1)
_CLIPPER_ELEMENTS = {
    clipper.InputType.BYTES: st.integers(0, 255),
    clipper.InputType.INTS: st.integers(-(2**31), 2**31 - 1),
    clipper.InputType.FLOATS: st.floats(width=32, allow_nan=False),
    clipper.InputType.DOUBLES: st.floats(allow_nan=False),
}


@st.composite
def clipper_inputs(draw, itype: clipper.InputType, generation: clipper.Generation):
    n = draw(st.integers(1, 5))
    if itype == clipper.InputType.STRINGS:
        alphabet = st.characters(exclude_characters="\0", exclude_categories=("Cs",))
        text = st.text(alphabet, max_size=8) if generation != "v3" else st.text(max_size=8)
        return draw(st.lists(text, min_size=n, max_size=n))
    elements = _CLIPPER_ELEMENTS[itype]
    dtype = clipper.DTYPES[itype]
    if draw(st.booleans()):  # equal lengths, maybe as one 2-D array
        width = draw(st.integers(0, 6))
        rows = [draw(st.lists(elements, min_size=width, max_size=width)) for _ in range(n)]
        if draw(st.booleans()):
            return np.array(rows, dtype).reshape(n, width)
        return rows
    return [np.array(draw(st.lists(elements, max_size=6)), dtype) for _ in range(n)]


@st.composite
def clipper_messages(draw, generation: clipper.Generation):
    """A valid message of ``generation`` (either direction)."""
    kinds = ["new_container", "request", "response"]
    if generation != clipper.Generation.G2016:
        kinds += ["heartbeat", "heartbeat_reply"]
    kind = draw(st.sampled_from(kinds))
    itype = draw(st.sampled_from(list(clipper.InputType)))
    if kind == "new_container":
        if generation == clipper.Generation.G2016:
            version = str(draw(st.integers(0, 10**6)))
        else:
            version = draw(st.text(max_size=8))
        rpc = clipper.RPC_VERSION if generation == clipper.Generation.V3 else None
        return clipper.NewContainer(draw(st.text(max_size=12)), version, itype, rpc)
    if kind == "heartbeat":
        return clipper.Heartbeat()
    if kind == "heartbeat_reply":
        return clipper.HeartbeatReply(draw(st.sampled_from(list(clipper.HeartbeatType))))
    msg_id = draw(_u32s)
    if kind == "request":
        return clipper.PredictRequest(msg_id, itype, draw(clipper_inputs(itype, generation)))
    if generation == clipper.Generation.G2016:
        values = draw(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=5))
        return clipper.PredictResponse(msg_id, np.array(values, np.float32))
    return clipper.PredictResponse(
        msg_id, draw(st.lists(st.text(max_size=8), min_size=1, max_size=5))
    )


@st.composite
def clipper_generation_and_message(draw):
    generation = draw(clipper_generations)
    return generation, draw(clipper_messages(generation))


def clipper_direction(msg) -> clipper.Direction:
    """The direction ``msg`` travels in."""
    if isinstance(msg, clipper.PredictRequest | clipper.HeartbeatReply):
        return clipper.Direction.TO_CONTAINER
    return clipper.Direction.TO_CLIPPER


# --- y2 -------------------------------------------------------------------------------------


i32 = st.integers(-(2**31), 2**31 - 1)
#: Delta words, edge values (layer 511, index 2**21-1, both signs) well represented.
y2_words = st.one_of(
    st.integers(0, 2**32 - 1),
    st.sampled_from([0, 1, 2**32 - 1, 0xFF800000, 0x00400000, 0x003FFFFE, 0xFFFFFFFE]),
)


def y2_word(layer: int, is_weight: int, index: int, positive: int) -> int:
    """The delta word of layer ``layer``'s weights (``is_weight``) or biases, element
    ``index``, +tau if ``positive``: y2's parameter ``2 * layer`` (weights) or ``2 * layer +
    1`` (biases) in the top 10 bits, as y2's trainer builds it."""
    return ((2 * layer + (0 if is_weight else 1)) << 22) | (index << 1) | positive


@st.composite
def y2_node_index(draw):
    count = draw(st.integers(1, 2**31 - 1))
    return y2.NodeIndex(draw(st.integers(0, count - 1)), count)


y2_messages = st.one_of(
    y2_node_index(),
    st.builds(lambda ws: y2.Delta(np.array(ws, dtype=np.uint32)), st.lists(y2_words, max_size=40)),
    st.builds(y2.Runtime, i32, i32, i32, i32, st.one_of(st.none(), i32)),
    st.just(y2.Finished()),
)


# --- malformed input --------------------------------------------------------------------------


@st.composite
def mutated(draw, wire: bytes) -> bytes:
    """``wire`` truncated, with a bit flipped, extended, or with one byte replaced."""
    out = bytearray(wire)
    mutation = draw(st.sampled_from(["truncate", "flip", "extend", "byte"]))
    if mutation == "truncate":
        del out[draw(st.integers(0, len(out))) :]
    elif mutation == "extend" or not out:
        out += draw(st.binary(min_size=1, max_size=16))
    elif mutation == "flip":
        out[draw(st.integers(0, len(out) - 1))] ^= 1 << draw(st.integers(0, 7))
    else:
        out[draw(st.integers(0, len(out) - 1))] = draw(st.integers(0, 255))
    return bytes(out)
