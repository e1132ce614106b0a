"""Clipper codec: golden vectors, properties against the construct spec, errors, zero copy."""

from __future__ import annotations

import array
import json
import struct
from pathlib import Path

import construct
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import clipper_direction, clipper_generation_and_message

from wirekit import clipper
from wirekit._impl import pure_requested, twin
from wirekit.clipper import _pure, spec
from wirekit.clipper.messages import to_jsonable
from wirekit.errors import DecodeError, EncodeError

VECTORS = Path(__file__).resolve().parent.parent / "specs" / "vectors" / "clipper"
GOLDEN = sorted(VECTORS.glob("*.json"))
G16, G17, V3 = clipper.Generation.G2016, clipper.Generation.G2017, clipper.Generation.V3
OUT, IN = clipper.Direction.TO_CLIPPER, clipper.Direction.TO_CONTAINER


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def f8(*v: float) -> bytes:
    return struct.pack(f"<{len(v)}d", *v)


def _fast():
    """The Cython twin (skipped only under an explicit WIREKIT_PURE=1)."""
    if pure_requested():
        pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
    return twin("clipper", "fast")


def _outcome(codec, frames, generation, direction):
    """("ok", message) or ("error", everything a DecodeError says)."""
    try:
        return ("ok", codec.decode(frames, generation, direction))
    except DecodeError as exc:
        return ("error", (str(exc), exc.field, exc.frame, exc.offset))


def _oracle(frames, generation, direction):
    return _pure.from_container(spec.parse(frames, generation, direction), generation)


# --- golden vectors -------------------------------------------------------------------------


def test_golden_vectors_exist():
    assert len(GOLDEN) >= 20
    gens = {json.loads(p.read_text())["generation"] for p in GOLDEN}
    assert gens == {"2016", "2017", "v3"}


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_vector(clipper_codec, path):
    v = json.loads(path.read_text())
    frames = [bytes.fromhex(h) for h in v["frames_hex"]]
    gen, direction = v["generation"], v["direction"]
    if "error" in v:
        with pytest.raises(DecodeError) as info:
            clipper_codec.decode(frames, gen, direction)
        err = v["error"]
        assert (info.value.field, info.value.frame, info.value.offset) == (
            err["field"],
            err["frame"],
            err["offset"],
        )
        assert str(info.value) == err["message"]
        return
    msg = clipper_codec.decode(frames, gen, direction)
    assert to_jsonable(msg) == v["message"]
    assert _oracle(frames, clipper.Generation(gen), clipper.Direction(direction)) == msg
    again = clipper_codec.encode(msg, gen)
    if v["canonical"]:
        assert again == frames
    else:  # accepted variants re-encode to the canonical form, which decodes the same
        assert again != frames
        assert clipper_codec.decode(again, gen, direction) == msg


# --- properties: both twins equal the construct reference ----------------------------------


@given(clipper_generation_and_message())
def test_encode_equals_construct_build(clipper_codec, gm):
    gen, msg = gm
    container, direction = _pure.to_container(msg, gen)
    assert direction is clipper_direction(msg)
    assert clipper_codec.encode(msg, gen) == spec.build(container, gen, direction)


#: float32 values a C double cannot carry: a signaling NaN (converted, it comes out quiet)
#: with a payload, and a plain quiet NaN and a number for company
SIGNALING = np.frombuffer(
    b"\xff\xff\xb5\xff" + b"\x01\x00\x80\x7f" + b"\x00\x00\xc0\x7f" + f8(1.5)[:4], "<f4"
)


@pytest.mark.parametrize("gen", [G16, G17, V3])
def test_float32_values_are_sent_bit_for_bit(clipper_codec, gen):
    # fuzz/regressions/codec_encode/clipper-2016-signaling-nan-output: the pure twin built
    # float32 through Python floats and sent a signaling NaN quieted (0xffb5ffff as 0xfff5ffff)
    messages = [clipper.PredictRequest(9, clipper.InputType.FLOATS, [SIGNALING, SIGNALING[:2]])]
    if gen is G16:
        messages.append(clipper.PredictResponse(9, SIGNALING.copy()))
    for msg in messages:
        frames = clipper_codec.encode(msg, gen)
        sent = b"".join(bytes(f) for f in frames)
        assert SIGNALING.tobytes() in sent
        got = clipper_codec.decode(frames, gen, clipper_direction(msg))
        values = got.outputs if type(msg) is clipper.PredictResponse else got.inputs[0]
        assert np.asarray(values, "<f4").tobytes() == SIGNALING.tobytes()


@given(clipper_generation_and_message())
def test_decode_equals_construct_parse_and_round_trips(clipper_codec, gm):
    gen, msg = gm
    direction = clipper_direction(msg)
    frames = spec.build(_pure.to_container(msg, gen)[0], gen, direction)
    decoded = clipper_codec.decode(frames, gen, direction)
    assert decoded == _oracle(frames, gen, direction)
    assert decoded == msg
    assert clipper_codec.encode(decoded, gen) == frames
    assert clipper.detect(frames, direction) in (gen, None)
    assert gen in clipper.candidates(frames, direction)


def _mutate(frames: list[bytes], data) -> list[bytes]:
    frames = [bytearray(f) for f in frames]
    what = data.draw(st.sampled_from(["drop", "extra", "truncate", "flip", "extend", "byte"]))
    if what == "drop":
        del frames[data.draw(st.integers(0, len(frames) - 1))]
    elif what == "extra":
        frames.insert(
            data.draw(st.integers(0, len(frames))), bytearray(data.draw(st.binary(max_size=9)))
        )
    else:
        nonempty = [i for i, f in enumerate(frames) if f]
        if not nonempty:
            return [bytes(f) for f in frames] + [b"x"]
        f = frames[data.draw(st.sampled_from(nonempty))]
        if what == "truncate":
            del f[data.draw(st.integers(0, len(f) - 1)) :]
        elif what == "flip":
            f[data.draw(st.integers(0, len(f) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        elif what == "extend":
            f += data.draw(st.binary(min_size=1, max_size=9))
        else:
            f[data.draw(st.integers(0, len(f) - 1))] = data.draw(st.integers(0, 255))
    return [bytes(f) for f in frames]


@given(clipper_generation_and_message(), st.data())
def test_malformed_frames_same_outcome_from_both_twins(gm, data):
    gen, msg = gm
    direction = clipper_direction(msg)
    frames = _mutate(_pure.encode(msg, gen), data)
    fast, pure = _outcome(_fast(), frames, gen, direction), _outcome(_pure, frames, gen, direction)
    assert fast == pure
    if fast[0] == "error":
        assert fast[1][0].startswith("clipper: ")


@given(
    st.sampled_from(list(clipper.Generation)),
    st.sampled_from(list(clipper.Direction)),
    st.lists(
        st.one_of(
            st.binary(max_size=12),
            st.sampled_from([u32(0), u32(1), u32(2), u32(3), u64(8), u64(16), u64(1)]),
        ),
        max_size=9,
    ),
)
def test_random_frames_same_outcome_from_both_twins(gen, direction, body):
    frames = [b"", *body]
    assert _outcome(_fast(), frames, gen, direction) == _outcome(_pure, frames, gen, direction)


# --- decode errors --------------------------------------------------------------------------

REQ17 = [b"", u32(1), u32(7), u32(0), u64(12), u32(3) + u32(2) + u32(2), u64(24), f8(1, 2, 3)]
REQ3 = [
    b"",
    u32(3),
    u32(1),
    u32(7),
    u32(0),
    u64(32),
    u64(3) + u64(2) + u64(16) + u64(8),
    f8(1, 2),
    f8(3),
]
REQ16 = [b"", u32(7), u32(0), u32(3) + u32(2) + u32(2), f8(1, 2, 3)]


def _with(frames, index, value):
    frames = list(frames)
    frames[index] = value
    return frames


@pytest.mark.parametrize(
    ("gen", "direction", "frames", "field", "frame", "offset"),
    [
        (G17, IN, [], "delimiter", 0, 0),
        (G17, IN, [b"id", b"", u32(2), u32(0)], "delimiter", 0, 0),
        (G17, IN, [b"", u32(2)], "frames", 2, 0),
        (G17, IN, [b"", u32(2), u32(0), b""], "frames", 3, 0),
        (G17, IN, [b"", u32(2), u32(5)], "heartbeat_type", 2, 0),
        (G17, IN, [b"", u32(9), u32(0)], "msg_type", 1, 0),
        (G17, IN, [b"", u32(0), u32(0)], "msg_type", 1, 0),
        (G17, IN, [b"", b"\x02\x00", u32(0)], "msg_type", 1, 2),
        (G17, IN, REQ17[:-1], "frames", 7, 0),
        (G17, IN, [*REQ17, b""], "frames", 8, 0),
        (G17, IN, _with(REQ17, 3, u32(1)), "request_type", 3, 0),
        (G17, IN, _with(REQ17, 3, u32(2)), "request_type", 3, 0),
        (G17, IN, _with(REQ17, 4, u64(16)), "header_size", 4, 0),
        (G17, IN, _with(REQ17, 4, b"\x0c\x00"), "header_size", 4, 2),
        (G17, IN, _with(REQ17, 6, u32(23)), "content_size", 6, 0),
        (G17, IN, _with(_with(REQ17, 6, u64(23)), 7, f8(1, 2, 3)[:-1]), "content", 7, 16),
        (G17, IN, _with(REQ17, 5, u32(7) + u32(2) + u32(2)), "input_type", 5, 0),
        (G17, IN, _with(REQ17, 5, u32(3) + u32(3) + u32(2)), "num_inputs", 5, 4),
        (G17, IN, _with(REQ17, 5, u32(3) + u32(0) + u32(2)), "num_inputs", 5, 4),
        (G16, IN, _with(REQ16, 3, u32(3) + u32(3) + u32(2) + u32(1)), "offsets[1]", 3, 12),
        (G16, IN, _with(REQ16, 3, u32(3) + u32(2) + u32(4)), "offsets[0]", 3, 8),
        (G16, IN, _with(REQ16, 3, u32(3) + u32(2)), "num_inputs", 3, 4),
        (G16, IN, _with(REQ16, 3, b"\x03\x00\x00"), "header", 3, 0),
        (G16, IN, _with(REQ16, 3, u32(4) + u32(2) + u32(2)), "offsets[0]", 3, 8),
        (G16, IN, _with(_with(REQ16, 3, u32(4) + u32(2) + u32(1)), 4, b"ab\0c"), "content", 4, 3),
        (G16, IN, _with(_with(REQ16, 3, u32(4) + u32(2) + u32(1)), 4, b"a\0b\0c"), "content", 4, 4),
        (
            G16,
            IN,
            _with(_with(REQ16, 3, u32(4) + u32(2) + u32(1)), 4, b"a\0\xff\0"),
            "inputs[1]",
            4,
            2,
        ),
        (G16, IN, REQ16[:4], "frames", 4, 0),
        (V3, IN, _with(REQ3, 1, u32(2)), "rpc_version", 1, 0),
        (V3, IN, REQ3[:-1], "frames", 8, 0),
        (V3, IN, REQ3[:6], "frames", 6, 0),
        (V3, IN, _with(REQ3, 5, u64(40)), "header_size", 5, 0),
        (V3, IN, _with(REQ3, 5, u32(32)), "header_size", 5, 4),
        (V3, IN, _with(REQ3, 6, u64(3) + u64(2) + u64(16) + u64(7)), "sizes[1]", 6, 24),
        (V3, IN, _with(REQ3, 6, u64(3) + u64(3) + u64(16) + u64(8)), "num_inputs", 6, 8),
        (V3, IN, _with(REQ3, 6, u64(9) + u64(2) + u64(16) + u64(8)), "input_type", 6, 0),
        (V3, IN, _with(REQ3, 6, u64(2**63) + u64(2**63) + u64(16) + u64(8)), "input_type", 6, 0),
        (
            V3,
            IN,
            _with(_with(REQ3, 6, u64(3) + u64(2) + u64(16) + u64(7)), 8, b"1234567"),
            "inputs[1]",
            8,
            0,
        ),
        (V3, IN, [b"", u32(3), u32(2), u32(2)], "heartbeat_type", 3, 0),
        (V3, OUT, [b"", u32(0), b"m", b"1", b"3"], "frames", 5, 0),
        (V3, OUT, [b"", u32(0), b"m", b"1", b"3", u32(2)], "rpc_version", 5, 0),
        (V3, OUT, [b"", u32(0), b"m", b"1", b"7", u32(3)], "input_type", 4, 0),
        (V3, OUT, [b"", u32(0), b"m", b"1", b" x", u32(3)], "input_type", 4, 1),
        (V3, OUT, [b"", u32(0), b"\xc3", b"1", b"3", u32(3)], "model_name", 2, 0),
        (V3, OUT, [b"", u32(1), u32(7), u64(8), u64(0)], "header", 4, 0),
        (V3, OUT, [b"", u32(1), u32(7), u64(16), u64(1) + u64(2), b"abc"], "lengths[0]", 4, 8),
        (V3, OUT, [b"", u32(1), u32(7), u64(16), u64(1) + u64(2), b"ab", b""], "frames", 6, 0),
        (V3, OUT, [b"", u32(1), u32(7), u64(24), u64(1) + u64(2), b"ab"], "header_size", 3, 0),
        (V3, OUT, [b"", u32(2), b""], "frames", 2, 0),
        (V3, OUT, [b"", u32(5)], "msg_type", 1, 0),
        (G17, OUT, [b"", u32(1), u32(7), u32(1) + u32(2)], "payload", 3, 8),
        (G17, OUT, [b"", u32(1), u32(7), u32(3) + u32(0)], "payload", 3, 4),
        (G17, OUT, [b"", u32(1), u32(7), u32(0)], "payload", 3, 0),
        (G17, OUT, [b"", u32(1), u32(7), b"ACK"], "payload", 3, 3),
        (G17, OUT, [b"", u32(1), u64(2**32), u32(1) + u32(0)], "msg_id", 2, 4),
        (G17, OUT, [b"", u32(1), b"\x07\x00", u32(1) + u32(0)], "msg_id", 2, 2),
        (G16, OUT, [b"", b"m", b"v1", b"3"], "model_version", 2, 0),
        (G16, OUT, [b"", u32(7), b"\x00\x00\x80"], "outputs", 2, 0),
        (G16, OUT, [b"", u32(7), b""], "outputs", 2, 0),
        (G16, OUT, [b"", u32(7)], "frames", 2, 0),
        (G16, OUT, [b"", b"m", b"1", b"3", b""], "frames", 4, 0),
    ],
)
def test_decode_errors_name_field_frame_and_offset(
    clipper_codec, gen, direction, frames, field, frame, offset
):
    with pytest.raises(DecodeError) as info:
        clipper_codec.decode(frames, gen, direction)
    err = info.value
    assert (err.protocol, err.field, err.frame, err.offset) == ("clipper", field, frame, offset)
    assert isinstance(err, ValueError)
    assert str(err).startswith(f"clipper: {field} at frame {frame}, byte {offset}: ")
    if not pure_requested():
        assert _outcome(_pure, frames, gen, direction) == _outcome(_fast(), frames, gen, direction)


def test_feedback_request_error_says_why(clipper_codec):
    with pytest.raises(DecodeError, match=r"feedback request \(type 1\): Clipper defines no body"):
        clipper_codec.decode(_with(REQ3, 4, u32(1)), V3, IN)


def test_huge_announced_counts_allocate_nothing(clipper_codec):
    # 2**32-1 inputs / outputs announced in tiny frames: rejected from the frame sizes alone.
    with pytest.raises(DecodeError, match="num_inputs"):
        clipper_codec.decode(_with(REQ16, 3, u32(3) + u32(2**32 - 1)), G16, IN)
    with pytest.raises(DecodeError, match="payload"):
        clipper_codec.decode([b"", u32(1), u32(7), u32(2**32 - 1)], G17, OUT)
    with pytest.raises(DecodeError, match="num_inputs"):
        clipper_codec.decode(_with(_with(REQ3, 5, u64(16)), 6, u64(3) + u64(2**64 - 1)), V3, IN)


def test_non_buffer_frames_are_a_type_error(clipper_codec):
    with pytest.raises(TypeError, match="frame 1: expected a bytes-like object, got str"):
        clipper_codec.decode([b"", "x"], G17, OUT)
    with pytest.raises(TypeError, match="frame 1: not a contiguous buffer"):
        clipper_codec.decode([b"", memoryview(b"abcdefgh")[::2]], G17, OUT)


def test_unknown_generation_or_direction(clipper_codec):
    with pytest.raises(ValueError, match="unknown Clipper generation"):
        clipper_codec.decode([b""], "2018", OUT)
    with pytest.raises(ValueError, match="unknown direction"):
        clipper_codec.decode([b""], V3, "sideways")
    with pytest.raises(ValueError, match="unknown Clipper generation"):
        clipper_codec.encode(clipper.Heartbeat(), 3)


# --- what real peers send -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [(b"3", 3), (b" 2", 2), (b"+1", 1), (b"-0", 0), (b"004", 4), (b"1abc", 1), (b"3\0\x07", 3)],
)
def test_input_type_is_read_like_stoi(clipper_codec, text, expected):
    msg = clipper_codec.decode([b"", u32(0), b"m", b"1", text], G17, OUT)
    assert msg.input_type == expected and type(msg.input_type) is clipper.InputType


@pytest.mark.parametrize("text", [b"", b"x", b"-1", b"5", b"99999999999999999999999"])
def test_bad_input_types(clipper_codec, text):
    with pytest.raises(DecodeError) as info:
        clipper_codec.decode([b"", u32(0), b"m", b"1", text], G17, OUT)
    assert info.value.field == "input_type"


# Wirekit issue 13: the pure twin read the input type with int(), which refuses more than
# 4300 digits (ValueError, not DecodeError: one registration stopped the frontend's loop).
@pytest.mark.parametrize(
    ("text", "expected"),
    [(b"0" * 4301 + b"1", 1), (b" -" + b"0" * 5000, 0), (b"0" * (1 << 20) + b"4x", 4)],
    ids=["4301-zeros-then-1", "minus-5000-zeros", "1MiB-of-zeros-then-4"],
)
def test_input_type_of_thousands_of_digits_is_read_like_stoi(clipper_codec, text, expected):
    msg = clipper_codec.decode([b"", u32(0), b"m", b"1", text, u32(3)], V3, OUT)
    assert msg.input_type == expected


@pytest.mark.parametrize(
    ("text", "start"),
    [
        (b"0" * 4301 + b"7", 0),
        (b"9" * 5000, 0),
        (b"\t-" + b"0" * 4400 + b"1", 1),
        (b"1" * (1 << 20), 0),
    ],
    ids=["4301-zeros-then-7", "5000-nines", "minus-4400-zeros-then-1", "1MiB-of-ones"],
)
def test_input_type_of_thousands_of_digits_fails_alike_in_both_twins(text, start):
    frames = [b"", u32(0), b"m", b"1", text, u32(3)]
    pure = _outcome(_pure, frames, V3, OUT)
    assert pure == _outcome(_fast(), frames, V3, OUT)
    shown = text[start : start + 20].decode()
    assert pure == (
        "error",
        (
            f"clipper: input_type at frame 4, byte {start}: unknown input type {shown}... (0..4)",
            "input_type",
            4,
            start,
        ),
    )


def test_the_spec_reads_thousands_of_digits_without_int_of_them():
    assert spec.ASCII_INT.parse(b" 00" + b"0" * 5000 + b"3junk").value == 3
    with pytest.raises(construct.ConstructError, match="5001-digit integer is out of range"):
        spec.ASCII_INT.parse(b"-" + b"0" * 5000 + b"1" * 5001)


def test_2017_size_frames_of_4_or_8_bytes(clipper_codec):
    short = _with(_with(REQ17, 4, u32(12)), 6, u32(24))
    assert clipper_codec.decode(short, G17, IN) == clipper_codec.decode(REQ17, G17, IN)


def test_2016_versions_must_start_with_an_integer(clipper_codec):
    assert clipper_codec.decode([b"", b"m", b" 12rc", b"1"], G16, OUT).model_version == " 12rc"
    with pytest.raises(EncodeError, match="std::stoi"):
        clipper_codec.encode(clipper.NewContainer("m", "v1", 1), G16)


# --- zero copy and buffers ------------------------------------------------------------------


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_decode_accepts_any_bytes_like_frames(clipper_codec, kind):
    msg = clipper_codec.decode([kind(f) for f in REQ17], G17, IN)
    assert msg == clipper.PredictRequest(7, clipper.InputType.DOUBLES, [[1, 2], [3]])


def test_numeric_inputs_view_the_content_frame(clipper_codec):
    frames = _with(REQ17, 5, u32(3) + u32(3) + u32(1) + u32(2))
    frames = _with(_with(frames, 4, u64(16)), 7, bytearray(f8(1, 2, 3)))
    msg = clipper_codec.decode(frames, G17, IN)
    assert isinstance(msg.inputs, np.ndarray) and msg.inputs.shape == (3, 1)
    assert msg.inputs.dtype == np.float64
    frames[7][:8] = f8(42)  # the array sees the caller's buffer: no copy was made
    assert msg.inputs[0, 0] == 42
    ragged = clipper_codec.decode(REQ16, G16, IN).inputs
    assert [x.tolist() for x in ragged] == [[1, 2], [3]]
    assert all(np.shares_memory(x, np.frombuffer(REQ16[4], np.float64)) for x in ragged)
    assert not ragged[0].flags.writeable  # views of immutable bytes stay read-only


def test_v3_inputs_view_frames_unless_a_2d_batch_is_needed(clipper_codec):
    frames = list(REQ3)
    frames[7] = bytearray(frames[7])
    ragged = clipper_codec.decode(frames, V3, IN).inputs
    frames[7][:8] = f8(-1)
    assert ragged[0][0] == -1
    equal = _with(_with(REQ3, 6, u64(3) + u64(2) + u64(8) + u64(8)), 7, f8(1))
    batch = clipper_codec.decode(equal, V3, IN).inputs
    assert isinstance(batch, np.ndarray) and batch.tolist() == [[1.0], [3.0]]


def test_other_buffer_types_and_multidimensional_frames(clipper_codec):
    content = np.array([[1.0, 2.0], [3.0, 4.0]])
    frames = _with(_with(REQ17, 6, u64(32)), 7, memoryview(content))
    frames[5] = array.array("I", [3, 2, 2])
    assert clipper_codec.decode(frames, G17, IN).inputs.tolist() == [[1, 2], [3, 4]]


def test_bytes_inputs_are_uint8_and_response_outputs_float32(clipper_codec):
    frames = clipper_codec.encode(clipper.PredictRequest(1, 0, [b"\x00\xff", b"\x01"]), G17)
    inputs = clipper_codec.decode(frames, G17, IN).inputs
    assert [x.dtype for x in inputs] == [np.uint8] * 2 and inputs[0].tolist() == [0, 255]
    out = clipper_codec.decode(
        clipper_codec.encode(clipper.PredictResponse(1, [0.5]), G16), G16, OUT
    ).outputs
    assert out.dtype == np.float32 and out.tolist() == [0.5]


# --- encode ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("msg", "gen", "field"),
    [
        (clipper.Heartbeat(), G16, "message"),
        (clipper.HeartbeatReply(2), G17, "heartbeat_type"),
        (clipper.NewContainer("m", "1", 5), G17, "input_type"),
        (clipper.NewContainer(b"m", "1", 1), G17, "model_name"),
        (clipper.NewContainer("m", "1", 1, 3), G17, "rpc_version"),
        (clipper.NewContainer("m", "1", 1, 2), V3, "rpc_version"),
        (clipper.PredictRequest(-1, 3, [[1.0]]), V3, "msg_id"),
        (clipper.PredictRequest(2**32, 3, [[1.0]]), V3, "msg_id"),
        (clipper.PredictRequest(True, 3, [[1.0]]), V3, "msg_id"),
        (clipper.PredictRequest(1, 3, [[1.0]], request_type=1), V3, "request_type"),
        (clipper.PredictRequest(1, 3, []), G17, "inputs"),
        (clipper.PredictRequest(1, 3, np.zeros((0, 3))), G17, "inputs"),
        (clipper.PredictRequest(1, 3, np.zeros(3)), G17, "inputs"),
        (clipper.PredictRequest(1, 3, [[1.0], "x"]), G17, "inputs[1]"),
        (clipper.PredictRequest(1, 3, [[1.0], [[2.0]]]), G17, "inputs[1]"),
        (clipper.PredictRequest(1, 1, [[1.5]]), G17, "inputs[0]"),
        (clipper.PredictRequest(1, 1, [[2**31]]), G17, "inputs[0]"),
        (clipper.PredictRequest(1, 0, [[256]]), G17, "inputs[0]"),
        (clipper.PredictRequest(1, 2, [[1e300]]), G17, "inputs[0]"),
        (clipper.PredictRequest(1, 2, np.array([[1e300]])), V3, "inputs"),
        (clipper.PredictResponse(1, [1e300]), G16, "outputs"),
        (clipper.PredictRequest(1, 4, ["a", 1]), G17, "inputs[1]"),
        (clipper.PredictRequest(1, 4, "ab"), G17, "inputs"),
        (clipper.PredictRequest(1, 4, ["a\0b"]), G16, "inputs[0]"),
        (clipper.PredictRequest(1, 4, ["\ud800"]), V3, "inputs[0]"),
        (clipper.PredictResponse(1, []), V3, "outputs"),
        (clipper.PredictResponse(1, ["a", b"b"]), G17, "outputs[1]"),
        (clipper.PredictResponse(1, ["\udc00"]), G17, "outputs[0]"),
        (clipper.PredictResponse(1, [[1.0]]), G16, "outputs"),
        (clipper.PredictResponse(1, ["x"]), G16, "outputs"),
        ("not a message", V3, "message"),
    ],
)
def test_encode_errors_same_from_both_twins(msg, gen, field):
    texts = set()
    for codec in (_pure,) if pure_requested() else (_fast(), _pure):
        with pytest.raises(EncodeError) as info:
            codec.encode(msg, gen)
        assert (info.value.protocol, info.value.field) == ("clipper", field)
        texts.add(str(info.value))
    assert len(texts) == 1


def test_embedded_nul_is_fine_in_v3_strings(clipper_codec):
    msg = clipper.PredictRequest(1, 4, ["a\0b", ""])
    assert clipper_codec.decode(clipper_codec.encode(msg, V3), V3, IN) == msg


def test_encode_accepts_lists_arrays_and_casts_safely(clipper_codec):
    rows = clipper.PredictRequest(5, clipper.InputType.FLOATS, [[1, 2], [3, 4]])
    arr = clipper.PredictRequest(5, 2, np.array([[1, 2], [3, 4]], np.float32))
    fortran = clipper.PredictRequest(5, 2, np.asfortranarray(np.array([[1, 2], [3, 4]], "<f4")))
    big_endian = clipper.PredictRequest(5, 2, np.array([[1, 2], [3, 4]], ">f8"))
    for gen in clipper.Generation:
        frames = clipper_codec.encode(rows, gen)
        for other in (arr, fortran, big_endian):
            assert clipper_codec.encode(other, gen) == frames


def test_encode_frames_are_bytes(clipper_codec):
    for gen in clipper.Generation:
        frames = clipper_codec.encode(
            clipper.PredictResponse(3, ["é"]) if gen != G16 else clipper.PredictResponse(3, [1.0]),
            gen,
        )
        assert frames[0] == b"" and all(type(f) is bytes for f in frames)


# --- message equality, facade helpers -------------------------------------------------------


def test_equality_is_wire_equality():
    a = clipper.PredictRequest(1, clipper.InputType.INTS, np.array([[1, 2], [3, 4]], np.int32))
    assert a == clipper.PredictRequest(1, 1, [[1, 2], [3, 4]])
    assert a == clipper.PredictRequest(1, 1, [np.array([1, 2]), [3, 4]])
    assert a != clipper.PredictRequest(1, 1, [[1, 2], [3, 5]])
    assert a != clipper.PredictRequest(2, 1, [[1, 2], [3, 4]])
    assert a != clipper.PredictRequest(1, 1, [[1, 2, 3], [4]])  # same bytes, other split
    assert a != clipper.PredictRequest(1, 1, [["x"], [3, 4]])  # unencodable: equal to nothing
    assert clipper.PredictResponse(1, np.array([0.5], np.float32)) == clipper.PredictResponse(
        1, [0.5]
    )
    assert clipper.PredictResponse(1, ["a"]) != clipper.PredictResponse(1, ["b"])
    assert clipper.same_message(clipper.Heartbeat(), clipper.Heartbeat())
    with pytest.raises(TypeError):
        hash(a)


def test_router_view_and_detect():
    frames = clipper.encode(clipper.HeartbeatReply(1), V3)
    routed = clipper.to_router(b"\x00k\x8bEg", frames)
    identity, inner = clipper.from_router(routed)
    assert identity == b"\x00k\x8bEg" and inner == frames
    with pytest.raises(DecodeError, match="strip the identity with from_router"):
        clipper.decode(routed, V3, IN)
    with pytest.raises(DecodeError) as info:
        clipper.from_router([])
    assert info.value.field == "identity"
    assert clipper.detect(frames, IN) is V3
    assert clipper.detect(clipper.encode(clipper.Heartbeat(), G17), OUT) is None  # same in v3
    assert clipper.candidates([b"", u32(2)], OUT) == [V3, G17]
    assert clipper.detect([b"x"], OUT) is None
    for gen in clipper.Generation:
        req = clipper.encode(clipper.PredictRequest(9, 3, [[1.0]]), gen)
        assert clipper.detect(req, IN) is gen


def test_facade_uses_the_compiled_twin():
    assert ("pure" if pure_requested() else "fast") == clipper.IMPLEMENTATION


# --- real ZeroMQ sockets: zmq.Frame buffers, both views -------------------------------------


def test_over_a_real_router_dealer_pair(clipper_codec):
    """Clipper's socket pattern on loopback TCP: a ROUTER binds, a DEALER connects; the
    frames each side receives (zero-copy ``zmq.Frame`` objects) decode as sent."""
    import zmq  # a test dependency (the test extra); the codec itself never imports it

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    try:
        for s in (router, dealer):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, 5000)
            s.setsockopt(zmq.SNDTIMEO, 5000)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        # container -> Clipper: the ROUTER sees the identity in front
        dealer.send_multipart(clipper_codec.encode(clipper.NewContainer("m", "1", 3, 3), V3))
        identity, frames = clipper.from_router(router.recv_multipart(copy=False))
        assert isinstance(frames[1], zmq.Frame)
        assert clipper_codec.decode(frames, V3, OUT) == clipper.NewContainer("m", "1", 3, 3)
        # Clipper -> container: a request whose inputs view the received frames
        big = np.arange(4096, dtype=np.float64).reshape(2, 2048)
        request = clipper.PredictRequest(11, clipper.InputType.DOUBLES, big)
        router.send_multipart(clipper.to_router(identity.bytes, clipper_codec.encode(request, G17)))
        got = clipper_codec.decode(dealer.recv_multipart(copy=False), G17, IN)
        assert got == request and got.inputs.shape == (2, 2048)
        reply = clipper.PredictResponse(got.msg_id, ["a", "bé"])
        dealer.send_multipart(clipper_codec.encode(reply, G17))
        _, frames = clipper.from_router(router.recv_multipart())
        assert clipper_codec.decode(frames, G17, OUT) == reply
    finally:
        dealer.close(0)
        router.close(0)
        ctx.term()
