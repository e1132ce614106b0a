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


# --- ZMTP ---------------------------------------------------------------------------------

#: frames short and long (> 255 bytes takes the 8-byte LONG size form), empty included
zmtp_frames = st.one_of(st.binary(max_size=24), st.binary(min_size=250, max_size=300))
zmtp_socket_types = st.sampled_from(["DEALER", "ROUTER", "REQ", "REP", "PUB", "SUB", "PAIR"])
zmtp_items = st.one_of(
    st.tuples(st.just("message"), st.lists(zmtp_frames, min_size=1, max_size=4)),
    st.tuples(
        st.just("command"),
        st.sampled_from(["PING", "PONG", "SUBSCRIBE", "CANCEL"]),
        st.one_of(st.binary(max_size=12), st.binary(min_size=260, max_size=270)),
    ),
)


@st.composite
def zmtp_streams(draw):
    """A capture description: (greeting kwargs, socket type, identity, items)."""
    greeting = {"minor": draw(st.integers(0, 1)), "as_server": draw(st.booleans())}
    socket_type = draw(zmtp_socket_types)
    identity = draw(st.one_of(st.just(b""), st.binary(min_size=1, max_size=8)))
    items = draw(st.lists(zmtp_items, max_size=6))
    return greeting, socket_type, identity, items


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
