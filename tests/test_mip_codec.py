"""MIP codec: golden vectors, properties against the construct spec, errors, streaming."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import mip_messages, mutated

from wirekit import mip
from wirekit._impl import twin
from wirekit.errors import DecodeError, EncodeError
from wirekit.mip import _pure, spec

VECTORS = Path(__file__).resolve().parent.parent / "specs" / "vectors" / "mip"
GOLDEN = sorted(VECTORS.glob("*.bin"))


def _outcome(codec, data):
    """What decoding ``data`` gives: ("ok", message) or ("error", the DecodeError's args)."""
    try:
        return ("ok", codec.decode(data))
    except DecodeError as exc:
        return ("error", (str(exc), exc.field, exc.offset, exc.code))


# --- golden vectors -------------------------------------------------------------------------


def test_golden_vectors_exist():
    assert len(GOLDEN) >= 8


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_vector(mip_codec, path):
    data = path.read_bytes()
    expected = json.loads(path.with_suffix(".json").read_text())
    if "error" in expected:
        with pytest.raises(DecodeError) as info:
            mip_codec.decode(data)
        err = expected["error"]
        assert (info.value.field, info.value.offset) == (err["field"], err["offset"])
        assert info.value.code == mip.ErrorCode[err["code"]]
        return
    msg = mip_codec.decode(data)
    assert mip.messages.to_jsonable(msg) == expected
    assert mip_codec.encode(msg) == data  # the vectors are canonical
    assert _pure.from_container(spec.MESSAGE.parse(data)) == msg


# --- properties: both twins equal the construct reference ----------------------------------


@given(mip_messages)
def test_encode_equals_construct_build(mip_codec, msg):
    assert mip_codec.encode(msg) == spec.MESSAGE.build(_pure.to_container(msg))


@given(mip_messages)
def test_decode_equals_construct_parse_and_round_trips(mip_codec, msg):
    wire = spec.MESSAGE.build(_pure.to_container(msg))
    decoded = mip_codec.decode(wire)
    assert decoded == _pure.from_container(spec.MESSAGE.parse(wire))
    assert decoded == msg
    assert mip_codec.encode(decoded) == wire


@given(mip_messages, st.data())
def test_malformed_input_same_outcome_from_both_twins(msg, data):
    wire = data.draw(mutated(mip.encode(msg)))
    fast, pure = _outcome(_fast(), wire), _outcome(_pure, wire)
    assert fast == pure


@given(st.binary(max_size=96))
def test_random_bytes_same_outcome_from_both_twins(data):
    assert _outcome(_fast(), data) == _outcome(_pure, data)


@given(st.binary(min_size=8, max_size=8))
def test_check_header_same_outcome_from_both_twins(header):
    def run(codec):
        try:
            return codec.check_header(header)
        except DecodeError as exc:
            return str(exc), exc.code

    assert run(_fast()) == run(_pure)


@given(
    st.binary(max_size=40),
    st.integers(-2, 42),
    st.one_of(st.none(), st.integers(0, 64)),
)
def test_frame_size_same_outcome_from_both_twins(data, pos, max_size):
    """``frame_size``: the one frame check; same size, None, or error (class, text, code)."""
    wire = data if len(data) % 2 else bytearray(data)  # bytes and other buffers

    def run(codec):
        try:
            return codec.frame_size(wire, pos, max_size)
        except DecodeError as exc:
            return "DecodeError", str(exc), exc.code
        except (IndexError, ValueError) as exc:
            return type(exc).__name__, str(exc)

    assert run(_fast()) == run(_pure)


def test_frame_size_checks_the_header_before_the_payload_is_here(mip_codec):
    wire = mip.encode(mip.Inference.request([[mip.Item.text("hello")]]))
    assert mip_codec.frame_size(wire) == len(wire)
    assert mip_codec.frame_size(b"xx" + wire, 2) == len(wire)
    assert mip_codec.frame_size(wire[:7]) is None  # no header yet
    assert mip_codec.frame_size(wire[:12]) is None  # a good header, payload to come
    with pytest.raises(DecodeError, match="kind at byte 1: unknown kind 9") as info:
        mip_codec.frame_size(bytes.fromhex("0009000000000000"))
    assert info.value.code == mip.ErrorCode.METHOD
    with pytest.raises(DecodeError, match="exceeds the limit of 16") as info:
        mip_codec.frame_size(wire[:8], 0, 16)
    assert (info.value.field, info.value.code) == ("remaining", mip.ErrorCode.MEMORY)


def _fast():
    return twin("mip", "fast")


# --- errors ---------------------------------------------------------------------------------


def _header(version=0, kind=2, subtype=0, reserved=0, remaining=0):
    return struct.pack(">BBBBI", version, kind, subtype, reserved, remaining)


@pytest.mark.parametrize(
    ("data", "field", "offset", "code"),
    [
        (b"\x00\x01", "header", 2, mip.ErrorCode.SHAPE),
        (_header(version=1), "version", 0, mip.ErrorCode.PROTOCOL),
        (_header(reserved=9), "reserved", 3, mip.ErrorCode.PROTOCOL),
        (_header(kind=7), "kind", 1, mip.ErrorCode.METHOD),
        (_header(kind=1, subtype=2), "subtype", 2, mip.ErrorCode.SUBTYPE),
        (_header(kind=0, subtype=6), "subtype", 2, mip.ErrorCode.SUBTYPE),
        (_header(kind=1, remaining=1) + b"x", "remaining", 4, mip.ErrorCode.SHAPE),
        (_header(remaining=2) + b"\x01\x00", "inference header", 8, mip.ErrorCode.SHAPE),
        (_header(remaining=100) + b"\x01\x00\x00\x01", "payload", 12, mip.ErrorCode.SHAPE),
        # one item announced, none present
        (_header(remaining=4) + b"\x01\x00\x00\x01", "items[0]", 12, mip.ErrorCode.SHAPE),
        # item size larger than what is left: must not read or allocate past the payload
        (
            _header(remaining=12) + b"\x01\x00\x00\x01" + struct.pack(">II", 1, 2**32 - 1),
            "items[0].data",
            20,
            mip.ErrorCode.SHAPE,
        ),
        # no items announced but bytes present
        (_header(remaining=6) + b"\x00\x00\x00\x05zz", "payload", 12, mip.ErrorCode.SHAPE),
        (mip.encode(mip.Ping()) + b"\x00", "message", 8, mip.ErrorCode.SHAPE),
    ],
)
def test_decode_errors_name_field_offset_and_reply_code(mip_codec, data, field, offset, code):
    with pytest.raises(DecodeError) as info:
        mip_codec.decode(data)
    err = info.value
    assert (err.protocol, err.field, err.offset, err.code) == ("mip", field, offset, code)
    assert isinstance(err, ValueError)
    assert f"mip: {field} at byte {offset}: " in str(err)


def test_huge_batch_header_allocates_nothing_before_checking(mip_codec):
    # 255 inputs × 65535 samples announced in a 4-byte payload: refused from the count (over
    # max_items), and with no item limit it fails at the first item.
    data = _header(remaining=4) + b"\xff\x00\xff\xff"
    with pytest.raises(DecodeError, match=r"batch_size at byte 10: 16711425 items exceed"):
        mip_codec.decode(data)
    with pytest.raises(DecodeError, match=r"items\[0\]"):
        mip_codec.decode(data, 1 << 30)


def _empty_items(n_input: int, batch: int, response: bool = False) -> bytes:
    count = n_input * batch
    head = bytes([n_input, n_input if response else 0]) + batch.to_bytes(2, "big")
    return (
        _header(kind=2, subtype=int(response), remaining=4 + 8 * count)
        + head
        + (b"\x00\x00\x00\x01\x00\x00\x00\x00" * count)
    )


@pytest.mark.parametrize("response", [False, True])
def test_max_items_refuses_with_memory_before_building_items(mip_codec, response):
    """Issue 13 defect 7: a message of many empty items decodes to ~12x its size in objects;
    more than max_items is refused, same error in both twins (field, offset, text, code)."""
    data = _empty_items(3, 5, response)  # 15 items
    assert len(mip_codec.decode(data, 15).items) == 15
    with pytest.raises(DecodeError) as info:
        mip_codec.decode(data, 14)
    err = info.value
    assert (err.field, err.offset, err.code) == ("batch_size", 10, mip.ErrorCode.MEMORY)
    assert str(err) == "mip: batch_size at byte 10: 15 items exceed the limit of 14 per message"
    with pytest.raises(DecodeError, match="15 items exceed the limit of 14") as info:
        mip_codec.decode_prefix(b"xx" + data, 2, 14)
    assert info.value.offset == 12


def test_max_items_default_is_the_documented_one(mip_codec):
    assert mip.DEFAULT_MAX_ITEMS == 65536
    data = _empty_items(2, 32769)  # 65538 items
    with pytest.raises(DecodeError, match="65538 items exceed the limit of 65536") as info:
        mip_codec.decode(data)
    assert info.value.code == mip.ErrorCode.MEMORY
    assert len(mip_codec.decode(_empty_items(2, 32768)).items) == 65536


def test_streaming_decoder_applies_max_items_and_stays_in_step():
    dec = mip.Decoder(max_items=4)
    ping = mip.encode(mip.Ping())
    dec.feed(_empty_items(1, 5) + ping)
    with pytest.raises(DecodeError, match="5 items exceed the limit of 4") as info:
        dec.next_message()
    assert info.value.code == mip.ErrorCode.MEMORY
    assert not dec.broken
    assert dec.next_message() == mip.Ping()


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        (mip.ErrorReply(9), "code"),
        (mip.Inference(False, 256, 0, 0, ()), "n_input"),
        (mip.Inference(True, 0, 1, 70000, ()), "batch_size"),
        (mip.Inference(False, 2, 0, 1, (mip.Item(1, b"a"),)), "items"),
        (mip.Inference(False, 1, 0, 1, (mip.Item(-1, b"a"),)), "items[0].type"),
        (mip.Inference(False, 1, 0, 1, (mip.Item(2**32, b"a"),)), "items[0].type"),
        (mip.Inference(False, 1, 0, 1, (mip.Item(1, "text"),)), "items[0].data"),
        (mip.Inference(False, 1, 0, 1, (mip.Item(1, memoryview(b"abcd")[::2]),)), "items[0].data"),
        ("not a message", "message"),
    ],
)
def test_encode_errors(mip_codec, msg, field):
    with pytest.raises(EncodeError) as info:
        mip_codec.encode(msg)
    assert (info.value.protocol, info.value.field) == ("mip", field)
    assert str(info.value).startswith(f"mip: cannot encode {field}: ")


def test_encode_error_text_same_for_both_twins():
    bad = mip.Inference(False, 2, 0, 1, (mip.Item(1, b"a"),))
    messages = set()
    for codec in (_fast(), _pure):
        with pytest.raises(EncodeError) as info:
            codec.encode(bad)
        messages.add(str(info.value))
    assert len(messages) == 1


# --- buffers and zero copy ------------------------------------------------------------------


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_decode_accepts_any_bytes_like(mip_codec, kind):
    msg = mip.Inference.request([[mip.Item.text("abc"), mip.Item.image(b"\x89PNG")]])
    assert mip_codec.decode(kind(mip.encode(msg))) == msg


def test_large_item_data_views_the_input_without_copying(mip_codec):
    payload = bytes(range(256)) * 2
    buf = bytearray(mip.encode(mip.Inference.request([[mip.Item.image(payload)]])))
    msg = mip_codec.decode(buf)
    data = msg.items[0].data
    assert isinstance(data, memoryview) and bytes(data) == payload
    buf[-1] = 0  # the view sees the caller's buffer
    assert data[-1] == 0


def test_small_item_data_is_copied_into_bytes(mip_codec):
    buf = bytearray(mip.encode(mip.Inference.request([[mip.Item.text("abc")]])))
    data = mip_codec.decode(buf).items[0].data
    assert type(data) is bytes and data == b"abc"
    buf[-1] = 0
    assert data == b"abc"


def test_encode_accepts_bytes_like_item_data(mip_codec):
    import array

    a = array.array("I", [1, 2])
    msg = mip.Inference.request([[mip.Item(7, a), mip.Item(1, bytearray(b"x"))]])
    decoded = mip_codec.decode(mip_codec.encode(msg))
    assert bytes(decoded.items[0].data) == a.tobytes()


def test_unknown_item_types_pass_through(mip_codec):
    msg = mip.Inference.reply([[mip.Item(0xDEADBEEF, b"raw")]], n_input=1)
    assert mip_codec.decode(mip_codec.encode(msg)).items[0].type == 0xDEADBEEF


def test_decode_prefix_walks_a_concatenation(mip_codec):
    msgs = [mip.Ping(), mip.Inference.request([[mip.Item.json({"a": [1, 2]})]]), mip.Ping(True)]
    wire = b"".join(mip.encode(m) for m in msgs)
    pos, out = 0, []
    while pos < len(wire):
        msg, pos = mip_codec.decode_prefix(wire, pos)
        out.append(msg)
    assert out == msgs


def test_item_helpers():
    item = mip.Item.json({"k": "v"})
    assert item.type == mip.ItemType.JSON and item.as_json() == {"k": "v"}
    assert mip.Item.text("é").as_text() == "é"
    assert mip.Item(99, b"").type_name == "TYPE99"
    with pytest.raises(EncodeError, match="sample 1 has 2 items"):
        mip.Inference.request([[item], [item, item]])


# --- streaming decoder ----------------------------------------------------------------------


@given(st.lists(mip_messages, max_size=6), st.data())
def test_stream_decoder_gives_same_messages_for_every_chunking(mip_codec, msgs, data):
    wire = b"".join(mip.encode(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    decoder = mip.Decoder(codec=mip_codec)
    out = []
    prev = 0
    for cut in [*cuts, len(wire)]:
        decoder.feed(wire[prev:cut])
        prev = cut
        out.extend(decoder)
    assert out == msgs
    assert decoder.buffered == 0


@given(st.lists(mip_messages, min_size=1, max_size=5), st.data())
def test_stream_decoder_frames_offsets_and_buffered_for_any_feed_type(mip_codec, msgs, data):
    # bytes chunks take the zero-copy path, bytearray/memoryview the buffered one: mixing
    # them must not change the frames, the stream offset or the count of buffered bytes.
    wires = [mip.encode(m) for m in msgs]
    wire = b"".join(wires)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    kinds = data.draw(
        st.lists(
            st.sampled_from([bytes, bytearray, memoryview]),
            min_size=len(cuts) + 1,
            max_size=len(cuts) + 1,
        )
    )
    decoder = mip.Decoder(codec=mip_codec)
    frames = []
    prev = 0
    for cut, kind in zip([*cuts, len(wire)], kinds, strict=True):
        decoder.feed(kind(wire[prev:cut]))
        prev = cut
        while (frame := decoder.next_frame()) is not None:
            frames.append(bytes(frame))
        assert decoder.offset == sum(map(len, frames))
        assert decoder.buffered == prev - decoder.offset
    assert frames == wires


@given(st.lists(mip_messages, min_size=1, max_size=4), st.integers(0, 3), st.data())
def test_take_whole_is_feed_plus_next_frame_for_exactly_one_message(mip_codec, msgs, lead, data):
    # take_whole(data) either takes exactly one whole message (what feed + next_frame would
    # give, offsets advanced the same) or changes nothing.
    wires = [mip.encode(m) for m in msgs]
    a, b = mip.Decoder(codec=mip_codec), mip.Decoder(codec=mip_codec)
    for w in wires[:lead]:  # some history, so offsets are not 0
        for d in (a, b):
            d.feed(w)
            assert d.next_frame() == w
    chunk = data.draw(
        st.sampled_from(
            [wires[-1], wires[-1][:-1], b"".join(wires), wires[-1] + b"\x00", b"\x07" * 8]
        )
    )
    taken = a.take_whole(chunk)
    if taken is None:
        assert (a.offset, a.buffered) == (b.offset, b.buffered)
        a.feed(chunk)
    else:
        assert taken == chunk and taken == wires[-1]
    b.feed(chunk)
    try:
        expect = b.next_frame()
    except DecodeError:
        expect = "error"
    if taken is not None:
        assert expect == taken and a.offset == b.offset and a.buffered == b.buffered == 0


def test_stream_decoder_rejects_oversize_from_the_header_alone(mip_codec):
    decoder = mip.Decoder(max_message_size=1024, codec=mip_codec)
    decoder.feed(mip.encode(mip.Ping()) + _header(remaining=2000))
    assert next(iter(decoder)) == mip.Ping()
    with pytest.raises(DecodeError) as info:
        decoder.next_message()
    assert info.value.code == mip.ErrorCode.MEMORY and info.value.offset == 12
    assert decoder.broken and decoder.buffered == 8  # the payload was never buffered
    with pytest.raises(DecodeError):
        decoder.feed(b"x")


def test_stream_decoder_skips_a_bad_payload_and_continues(mip_codec):
    bad = _header(remaining=6) + b"\x00\x00\x00\x05zz"
    decoder = mip.Decoder(codec=mip_codec)
    decoder.feed(bad[:5])
    assert decoder.next_message() is None
    decoder.feed(bad[5:] + mip.encode(mip.Ping(True)))
    with pytest.raises(DecodeError) as info:
        decoder.next_message()
    assert (info.value.field, info.value.offset, info.value.code) == ("payload", 12, 4)
    assert decoder.next_message() == mip.Ping(True)
    assert not decoder.broken


def test_stream_decoder_skips_unknown_kind_without_buffering_its_payload(mip_codec):
    decoder = mip.Decoder(codec=mip_codec)
    decoder.feed(_header(kind=9, remaining=5) + b"ab")
    with pytest.raises(DecodeError) as info:
        decoder.next_message()
    assert info.value.code == mip.ErrorCode.METHOD
    decoder.feed(b"cde" + mip.encode(mip.Ping()))
    assert list(decoder) == [mip.Ping()]
    assert decoder.offset == 13 + 8


def test_stream_decoder_bad_version_breaks_the_stream(mip_codec):
    decoder = mip.Decoder(codec=mip_codec)
    decoder.feed(b"\x05" + b"\x00" * 7)
    with pytest.raises(DecodeError) as info:
        decoder.next_message()
    assert info.value.code == mip.ErrorCode.PROTOCOL and decoder.broken
    with pytest.raises(DecodeError):
        decoder.next_message()
