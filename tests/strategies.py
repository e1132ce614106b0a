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


# --- y2 -------------------------------------------------------------------------------------

import numpy as np  # noqa: E402

from wirekit import y2  # noqa: E402

i32 = st.integers(-(2**31), 2**31 - 1)
#: Delta words, edge values (layer 511, index 2**21-1, both signs) well represented.
y2_words = st.one_of(
    st.integers(0, 2**32 - 1),
    st.sampled_from([0, 1, 2**32 - 1, 0xFF800000, 0x00400000, 0x003FFFFE, 0xFFFFFFFE]),
)


@st.composite
def y2_node_index(draw):
    count = draw(st.integers(1, 2**31 - 1))
    return y2.NodeIndex(draw(st.integers(0, count - 1)), count)


y2_messages = st.one_of(
    y2_node_index(),
    st.builds(
        lambda ws: y2.Delta(np.array(ws, dtype=np.uint32)), st.lists(y2_words, max_size=40)
    ),
    st.builds(y2.Runtime, i32, i32, i32, i32, st.one_of(st.none(), i32)),
    st.just(y2.Finished()),
)
