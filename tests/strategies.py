"""Hypothesis strategies for valid messages of every protocol."""

from __future__ import annotations

from hypothesis import strategies as st

from wirekit import mip

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


# --- Clipper ---------------------------------------------------------------------------------

import numpy as np  # noqa: E402

from wirekit import clipper  # noqa: E402

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
