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
