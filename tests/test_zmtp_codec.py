"""ZMTP reader: golden vectors, properties against the construct spec, errors, streaming."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import chunkings, zmtp_encode, zmtp_streams
from twins import load_codec

from wirekit import zmtp
from wirekit.errors import DecodeError, EncodeError
from wirekit.zmtp import _pure, spec
from wirekit.zmtp.messages import to_jsonable

VECTORS = Path(__file__).resolve().parent.parent / "specs" / "vectors" / "zmtp"
GOLDEN = sorted(VECTORS.glob("*.bin"))

GREETING = _pure.encode_greeting()
READY = _pure.encode_ready("DEALER")
HEAD = GREETING + READY  # a valid stream start: 64 + 43 bytes


def _fast():
    return load_codec("zmtp", "fast")


def _outcome(codec, data, **kw):
    """decode_events' result with the error as comparable args."""
    events, pos, phase, error = codec.decode_events(data, **kw)
    err = None if error is None else (str(error), error.field, error.offset)
    return events, pos, phase, err


def _expected_events(stream):
    """The events a ``zmtp_streams`` description must decode to (without offsets)."""
    greeting, socket_type, identity, items = stream
    events = [
        zmtp.Greeting(3, greeting["minor"], "NULL", greeting["as_server"]),
        zmtp.Ready(
            (("Socket-Type", socket_type.encode()), ("Identity", identity))
            if socket_type in ("DEALER", "ROUTER", "REQ") or identity
            else (("Socket-Type", socket_type.encode()),)
        ),
    ]
    for item in items:
        if item[0] == "message":
            events.append(zmtp.Message(tuple(item[1])))
        else:
            events.append(zmtp.Command(item[1], item[2]))
    return events


# --- golden vectors -------------------------------------------------------------------------


def test_golden_vectors_exist():
    assert len(GOLDEN) >= 10
    assert any(p.stem.startswith("real-") for p in GOLDEN)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_vector(zmtp_codec, path):
    data = path.read_bytes()
    expected = json.loads(path.with_suffix(".json").read_text())
    events, _pos, _phase, error = zmtp_codec.decode_events(data)
    assert [{"offset": o, **to_jsonable(e)} for o, e in events] == expected["events"]
    if "error" in expected:
        assert error is not None
        err = expected["error"]
        assert (error.field, error.offset, error.reason) == (
            err["field"],
            err["offset"],
            err["message"],
        )
        return
    assert error is None
    # Valid vectors also parse with the construct reference to the same events.
    assert _pure.events_from_container(spec.STREAM.parse(data)) == events


# --- properties: both twins equal the construct reference ----------------------------------


@given(zmtp_streams())
def test_encode_equals_construct_build_and_decodes_back(zmtp_codec, stream):
    wire = zmtp_encode(zmtp_codec, stream)
    assert wire == zmtp_encode(_pure, stream)  # _pure builds with construct
    events = zmtp_codec.decode_stream(wire)
    assert [e for _, e in events] == _expected_events(stream)
    assert events == _pure.events_from_container(spec.STREAM.parse(wire))
    assert spec.STREAM.build(spec.STREAM.parse(wire)) == wire


@given(zmtp_streams(), st.data())
def test_malformed_input_same_outcome_from_both_twins(stream, data):
    wire = bytearray(zmtp_encode(_pure, stream))
    mutation = data.draw(st.sampled_from(["truncate", "flip", "extend", "byte", "flags"]))
    if mutation == "truncate":
        del wire[data.draw(st.integers(0, len(wire))) :]
    elif mutation == "flip":
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] ^= 1 << data.draw(st.integers(0, 7))
    elif mutation == "extend":
        wire += data.draw(st.binary(min_size=1, max_size=16))
    elif mutation == "byte":
        wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    else:  # hit the frame region, where flags and sizes live
        wire[data.draw(st.integers(64, len(wire) - 1))] = data.draw(st.integers(0, 7))
    final = data.draw(st.booleans())
    kw = {
        "final": final,
        "max_frame_size": data.draw(st.sampled_from([None, 0, 100, 300])),
        "max_message_frames": data.draw(st.sampled_from([None, 0, 1, 2, 3])),
        "max_message_size": data.draw(st.sampled_from([None, 0, 24, 280, 600])),
    }
    assert _outcome(_fast(), bytes(wire), **kw) == _outcome(_pure, bytes(wire), **kw)


@given(st.binary(max_size=80), st.booleans())
def test_random_bytes_after_a_valid_head_same_outcome(tail, final):
    data = HEAD + tail
    assert _outcome(_fast(), data, final=final) == _outcome(_pure, data, final=final)


@given(st.binary(max_size=70))
def test_random_greetings_same_outcome(data):
    data = b"\xff" + data
    assert _outcome(_fast(), data) == _outcome(_pure, data)


@given(zmtp_streams(max_frames=12), st.data())
def test_stream_reader_same_events_for_every_chunking(impl, stream, data):
    codec = load_codec("zmtp", impl)
    wire = zmtp_encode(codec, stream)
    reader = zmtp.StreamReader(codec=codec)
    out, prev = [], 0
    for cut in data.draw(chunkings(len(wire))):
        reader.feed(wire[prev:cut])
        prev = cut
        out.extend(reader)
    reader.close()
    out.extend(reader)
    assert out == codec.decode_stream(wire)
    assert reader.buffered == 0 and not reader.broken
    assert reader.socket_type == stream[1]


@given(zmtp_streams(max_frames=8), st.data())
def test_stream_reader_reports_the_one_shot_error(impl, stream, data):
    """Chunked or not, a broken capture gives the same events and then the same error."""
    codec = load_codec("zmtp", impl)
    wire = bytearray(zmtp_encode(codec, stream))
    i = data.draw(st.integers(0, len(wire) - 1))
    wire[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del wire[data.draw(st.integers(0, len(wire))) :]
    wire = bytes(wire)
    limits = {
        "max_frame_size": 280,
        "max_message_frames": data.draw(st.sampled_from([None, 1, 2, 3])),
        "max_message_size": data.draw(st.sampled_from([None, 10, 300, 600])),
    }
    events, _pos, _phase, error = codec.decode_events(wire, **limits)
    reader = zmtp.StreamReader(codec=codec, **limits)
    out, prev, got = [], 0, None
    try:
        for cut in data.draw(chunkings(len(wire))):
            reader.feed(wire[prev:cut])
            prev = cut
            out.extend(reader)
        reader.close()
        out.extend(reader)
    except DecodeError as exc:
        got = exc
    assert out == events
    assert got == error
    assert reader.broken == (error is not None)


# --- errors ---------------------------------------------------------------------------------


def _greeting(**changes):
    raw = bytearray(GREETING)
    for offset, value in changes.items():
        raw[int(offset[1:])] = value
    return bytes(raw)


def _command(name: bytes, data: bytes, flags=0x04) -> bytes:
    body = bytes([len(name)]) + name + data
    return bytes([flags, len(body)]) + body


def _ready_with(data: bytes) -> bytes:
    return GREETING + _command(b"READY", data)


BAD = [
    # (data, field, offset, message fragment)
    (b"\x00", "signature", 0, "byte 0 is 0x00, expected 0xff"),
    (_greeting(b9=0x00), "signature", 9, "byte 9 is 0x00, expected 0x7f"),
    (_greeting(b10=2), "version", 10, "major version 2"),
    (_greeting(b10=4), "version", 10, "only 3 (ZMTP 3.0/3.1) is supported"),
    (
        GREETING[:12] + b"PLAIN".ljust(20, b"\x00") + GREETING[32:],
        "mechanism",
        12,
        "unsupported security mechanism 'PLAIN': only NULL is supported",
    ),
    (
        GREETING[:12] + b"CURVE".ljust(20, b"\x00") + GREETING[32:],
        "mechanism",
        12,
        "'CURVE'",
    ),
    (_greeting(b20=ord("x")), "mechanism", 20, "bytes after the name must be NUL"),
    (_greeting(b32=2), "as-server", 32, "must be 0 or 1, got 2"),
    (GREETING[:40], "greeting", 40, "truncated: need 64 bytes, have 40"),
    (b"", "greeting", 0, "have 0"),
    (GREETING + b"\x00\x01a", "flags", 64, "expected the READY command"),
    (
        GREETING + _command(b"PING", b""),
        "command",
        67,
        "expected READY (NULL mechanism), got 'PING'",
    ),
    (GREETING + b"\x05\x00", "flags", 64, "command frame with MORE set"),
    (GREETING + b"\x0c\x00", "flags", 64, "reserved bits set in flags 0x0c"),
    (HEAD + b"\x80\x00", "flags", 107, "reserved bits set in flags 0x80"),
    (HEAD + b"\x01\x00" + _command(b"PING", b""), "flags", 109, "inside a multipart message"),
    (HEAD + b"\x00", "frame", 108, "truncated: frame header needs 2 bytes, 1 present"),
    (HEAD + b"\x02\x00\x00", "frame", 110, "frame header needs 9 bytes, 3 present"),
    (HEAD + b"\x00\x05abc", "frame", 112, "truncated: size announces 5 bytes, 3 present"),
    (
        HEAD + b"\x02" + struct.pack(">Q", 2**64 - 1) + b"abc",
        "frame",
        119,
        f"size announces {2**64 - 1} bytes, 3 present",
    ),
    (HEAD + b"\x01\x00\x01\x01a", "message", 112, "frame 1 has MORE set"),
    (GREETING + b"\x04\x00", "command name", 66, "empty command: no name"),
    (GREETING + b"\x04\x03\x05REA", "command name", 66, "length 5 exceeds the 2 bytes left"),
    (_ready_with(b"\x0bSocket"), "properties[0].name", 72, "length 11 exceeds the 6 bytes"),
    (_ready_with(b"\x01a\x00\x00"), "properties[0].value", 74, "truncated length: need 4 bytes"),
    (
        _ready_with(b"\x01a\xff\xff\xff\xffxyz"),
        "properties[0].value",
        74,
        "length 4294967295 exceeds the 3 bytes left in the command",
    ),
    (
        _ready_with(b"\x01a\x00\x00\x00\x01b\x01c\x00\x00\x00\x09v"),
        "properties[1].value",
        81,
        "length 9 exceeds the 1 bytes left",
    ),
]


def _bad_id(case):
    return f"{case[1]}@{case[2]}"


@pytest.mark.parametrize(("data", "field", "offset", "text"), BAD, ids=[_bad_id(c) for c in BAD])
def test_decode_errors_name_field_and_offset(zmtp_codec, data, field, offset, text):
    with pytest.raises(DecodeError) as info:
        zmtp_codec.decode_stream(data)
    err = info.value
    assert (err.protocol, err.field, err.offset) == ("zmtp", field, offset)
    assert isinstance(err, ValueError)
    assert str(err).startswith(f"zmtp: {field} at byte {offset}: ")
    assert text in err.reason


@pytest.mark.parametrize(("data", "field", "offset", "text"), BAD, ids=[_bad_id(c) for c in BAD])
def test_decode_error_text_same_for_both_twins(data, field, offset, text):
    assert _outcome(_fast(), data) == _outcome(_pure, data)


def test_events_before_an_error_are_kept(zmtp_codec):
    data = HEAD + zmtp_codec.encode_message([b"a", b"b"]) + b"\x08\x00"
    events, pos, phase, error = zmtp_codec.decode_events(data)
    assert [e for _, e in events][2:] == [zmtp.Message((b"a", b"b"))]
    assert (pos, phase) == (len(data) - 2, 2)
    assert (error.field, error.offset) == ("flags", len(data) - 2)


def test_incomplete_tail_is_left_for_later_when_not_final(zmtp_codec):
    msg = zmtp_codec.encode_message([b"a", b"b" * 300])
    data = HEAD + msg
    for cut in range(len(HEAD), len(data)):
        events, pos, phase, error = zmtp_codec.decode_events(data[:cut], final=False)
        assert error is None and pos == len(HEAD) and phase == 2 and len(events) == 2
    events, pos, _phase, _error = zmtp_codec.decode_events(data, len(HEAD), 2)
    assert events == [(len(HEAD), zmtp.Message((b"a", b"b" * 300)))] and pos == len(data)


def test_partial_greeting_is_checked_as_it_arrives(zmtp_codec):
    events, pos, phase, error = zmtp_codec.decode_events(GREETING[:30], final=False)
    assert (events, pos, phase, error) == ([], 0, 0, None)
    bad = _greeting(b10=2)[:11]
    assert zmtp_codec.decode_events(bad, final=False)[3].field == "version"


def test_frame_limit_is_checked_from_the_size_field(zmtp_codec):
    big = HEAD + b"\x02" + struct.pack(">Q", 10_000)  # no body present at all
    error = zmtp_codec.decode_events(big, final=False, max_frame_size=9_999)[3]
    assert (error.field, error.offset) == ("size", 108)
    assert error.reason == "frame of 10000 bytes exceeds the limit of 9999"
    assert zmtp_codec.decode_events(big, final=False, max_frame_size=10_000)[3] is None


def test_command_size_counts_against_the_limit(zmtp_codec):
    data = HEAD + zmtp_codec.encode_command("PING", b"x" * 50)
    assert zmtp_codec.decode_events(data, max_frame_size=50)[3].field == "size"
    assert zmtp_codec.decode_events(data, max_frame_size=55)[3] is None


def test_long_form_for_a_small_frame_is_accepted(zmtp_codec):
    data = HEAD + b"\x02" + struct.pack(">Q", 3) + b"abc"
    assert zmtp_codec.decode_stream(data)[-1] == (107, zmtp.Message((b"abc",)))


def test_commands_after_ready_and_error_during_handshake(zmtp_codec):
    data = HEAD + zmtp_codec.encode_command("PING", b"\x00\x64ctx")
    assert zmtp_codec.decode_stream(data)[-1][1] == zmtp.Command("PING", b"\x00\x64ctx")
    refused = GREETING + zmtp_codec.encode_command("ERROR", b"\x06denied")
    assert zmtp_codec.decode_stream(refused)[-1][1] == zmtp.Command("ERROR", b"\x06denied")


def test_ready_properties_and_lookup(zmtp_codec):
    wire = GREETING + zmtp_codec.encode_ready(
        "ROUTER", b"id-1", [("Resource", b"/x"), ("X-Custom", b"")]
    )
    ready = zmtp_codec.decode_stream(wire)[1][1]
    assert ready.properties == (
        ("Socket-Type", b"ROUTER"),
        ("Identity", b"id-1"),
        ("Resource", b"/x"),
        ("X-Custom", b""),
    )
    assert ready.socket_type == "ROUTER" and ready.identity == b"id-1"
    assert ready.get("socket-type") == b"ROUTER" and ready.get("missing") is None
    pub = zmtp_codec.decode_stream(GREETING + zmtp_codec.encode_ready("PUB"))[1][1]
    assert pub.properties == (("Socket-Type", b"PUB"),) and pub.identity == b""


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_decode_accepts_any_bytes_like(zmtp_codec, kind):
    data = HEAD + zmtp_codec.encode_message([b"", b"q"])
    assert zmtp_codec.decode_stream(kind(data))[-1][1] == zmtp.Message((b"", b"q"))


def test_is_zmtp():
    assert zmtp.is_zmtp(GREETING) and zmtp.is_zmtp(GREETING[:11])
    assert not zmtp.is_zmtp(GREETING[:10])
    assert not zmtp.is_zmtp(_greeting(b10=2))
    assert not zmtp.is_zmtp(b"\x00\x02\x00\x00" * 4)  # a MIP header
    assert not zmtp.is_zmtp(b"")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c: c.encode_message([]), "frames"),
        (lambda c: c.encode_message([b"a", "text"]), "frames[1]"),
        (lambda c: c.encode_message([memoryview(b"abcd")[::2]]), "frames[0]"),
        (lambda c: c.encode_ready(7), "socket_type"),
        (lambda c: c.encode_ready("DEALER", "id"), "identity"),
        (lambda c: c.encode_ready("DEALER", b"", [("a",)]), "properties[0]"),
        (lambda c: c.encode_ready("DEALER", b"", [("a" * 256, b"")]), "properties[0].name"),
        (lambda c: c.encode_ready("DEALER", b"", [("ü€", b"")]), "properties[0].name"),
        (lambda c: c.encode_ready("DEALER", b"", [("a", 5)]), "properties[0].value"),
        (lambda c: c.encode_command("x" * 256), "name"),
        (lambda c: c.encode_command("PING", None), "data"),
        (lambda c: c.encode_greeting("A" * 21), "mechanism"),
        (lambda c: c.encode_greeting(minor=256), "minor"),
        (lambda c: c.encode_greeting(major="3"), "major"),
    ],
)
def test_encode_errors_same_for_both_twins(call, field):
    texts = set()
    for codec in (_fast(), _pure):
        with pytest.raises(EncodeError) as info:
            call(codec)
        assert (info.value.protocol, info.value.field) == ("zmtp", field)
        texts.add(str(info.value))
    assert len(texts) == 1


# --- streaming reader -----------------------------------------------------------------------


def test_reader_rejects_an_oversize_frame_before_its_body_arrives(zmtp_codec):
    reader = zmtp.StreamReader(max_frame_size=1024, codec=zmtp_codec)
    reader.feed(HEAD + zmtp_codec.encode_message([b"ok"]) + b"\x02" + struct.pack(">Q", 2**40))
    events = [reader.next_event() for _ in range(3)]
    assert [type(e) for _, e in events] == [zmtp.Greeting, zmtp.Ready, zmtp.Message]
    with pytest.raises(DecodeError) as info:
        reader.next_event()
    assert (info.value.field, info.value.offset) == ("size", len(HEAD) + 5)
    assert reader.broken and reader.buffered == 0
    with pytest.raises(DecodeError):
        reader.feed(b"x" * 100)  # nothing more is buffered
    assert reader.buffered == 0


def test_reader_offsets_count_from_the_first_byte(zmtp_codec):
    reader = zmtp.StreamReader(codec=zmtp_codec)
    msg = zmtp_codec.encode_message([b"m"])
    reader.feed(HEAD)
    assert [o for o, _ in reader] == [0, 64]
    for k in range(3):
        reader.feed(msg)
        assert list(reader) == [(len(HEAD) + k * len(msg), zmtp.Message((b"m",)))]
    reader.feed(b"\x08\x00")
    with pytest.raises(DecodeError) as info:
        list(reader)
    assert info.value.offset == len(HEAD) + 3 * len(msg)


def test_reader_close_reports_a_truncated_tail(zmtp_codec):
    reader = zmtp.StreamReader(codec=zmtp_codec)
    reader.feed(HEAD + b"\x01\x01a")
    assert len(list(reader)) == 2
    assert reader.buffered == 3
    reader.close()
    with pytest.raises(DecodeError) as info:
        reader.next_event()
    assert (info.value.field, info.value.offset) == ("message", len(HEAD) + 3)


def test_reader_default_limit_and_socket_type(zmtp_codec):
    reader = zmtp.StreamReader(codec=zmtp_codec)
    assert reader.max_frame_size == zmtp.DEFAULT_MAX_FRAME_SIZE
    assert reader.socket_type is None
    reader.feed(GREETING + zmtp_codec.encode_ready("ROUTER"))
    assert reader.socket_type is None or reader.socket_type == "ROUTER"
    list(reader)
    assert reader.socket_type == "ROUTER"


def _pending_with_a_frame() -> zmtp.Pending:
    pending = zmtp.Pending()
    pending.frames.append(b"")
    return pending


@pytest.mark.parametrize(
    ("kw", "exc"),
    [
        ({"pos": -1}, IndexError),
        ({"pos": 500}, IndexError),
        ({"max_frame_size": -1}, ValueError),
        ({"max_message_frames": -1}, ValueError),
        ({"max_message_size": -1}, ValueError),
        ({"pending": _pending_with_a_frame()}, ValueError),  # a message before the greeting
    ],
)
def test_api_misuse_is_not_a_decode_error(zmtp_codec, kw, exc):
    texts = set()
    for codec in (zmtp_codec, _pure):
        with pytest.raises(exc) as info:
            codec.decode_events(HEAD, **kw)
        assert not isinstance(info.value, DecodeError)
        texts.add(str(info.value))
    assert len(texts) == 1  # the same words from both twins


@pytest.mark.parametrize("kw", [{"max_message_frames": -1}, {"max_message_size": -1}])
def test_reader_rejects_a_negative_limit_at_once(zmtp_codec, kw):
    with pytest.raises(ValueError, match="must be >= 0"):
        zmtp.StreamReader(codec=zmtp_codec, **kw)


# --- incremental decoding: linear work, Pending, multipart message limits --------------------


def _many_frames(codec, count: int, body: bytes = b"") -> bytes:
    """A stream start plus one message of ``count`` frames (defect 6's worst case)."""
    return HEAD + codec.encode_message([body] * count)


class _CountingCodec(SimpleNamespace):
    """Wraps a codec for ``StreamReader(codec=...)`` and counts its ``decode_events`` calls
    and the bytes each call is handed (from ``pos`` to the end of the buffer): a bound on what
    one call can examine, since both twins walk the buffer once, forward."""

    def __init__(self, codec):
        super().__init__(calls=0, handed=0)
        self._codec = codec

    def decode_events(self, buf, pos=0, *args, **kw):
        self.calls += 1
        self.handed += len(buf) - pos
        return self._codec.decode_events(buf, pos, *args, **kw)


def _feed_counted(codec, wire: bytes, step: int) -> _CountingCodec:
    counter = _CountingCodec(codec)
    reader = zmtp.StreamReader(codec=counter)
    for k in range(0, len(wire), step):
        reader.feed(wire[k : k + step])
    reader.close()
    assert [type(e) for _, e in reader] == [zmtp.Greeting, zmtp.Ready, zmtp.Message]
    assert not reader.broken and reader.buffered == 0
    return counter


@pytest.mark.parametrize("step", [1, 3])
def test_reader_work_is_linear_in_the_bytes_fed(zmtp_codec, step):
    """Defect 6: byte by byte, a multipart message of N empty frames cost O(N^2), because
    every feed re-parsed the unfinished message from its first frame.  Now what the codec is
    handed per byte fed is bounded, so 4x the frames is 4x the work (it was 16x)."""
    small, large = (_many_frames(zmtp_codec, n) for n in (1_000, 4_000))
    work_small = _feed_counted(zmtp_codec, small, step).handed
    work_large = _feed_counted(zmtp_codec, large, step).handed
    assert work_large / work_small < 4.5  # the work grows as the bytes do: ~4, not 16 ...
    assert work_large <= 3 * len(large)  # ... a bounded number of looks at each byte


def test_reader_does_not_call_the_codec_while_a_body_is_missing(zmtp_codec):
    """A large frame fed byte by byte: the codec is called again only once the body is
    complete (its header read at most once per call), not once per byte."""
    body = bytes(range(256)) * 40  # 10,240 bytes: LONG form
    wire = HEAD + zmtp_codec.encode_message([body])
    counter = _feed_counted(zmtp_codec, wire, 1)
    assert counter.calls <= 64 + 43 + 9 + 1  # greeting and READY bytes, 9 header bytes, body
    assert counter.handed <= 2 * len(wire)


def test_pure_reader_reads_each_frame_header_a_bounded_number_of_times(monkeypatch):
    """The pure twin parses with construct: count the flag-byte parses directly."""
    parses = {"count": 0}
    flags_spec = spec.FRAME_FLAGS

    class CountingFlags:
        def parse(self, data):
            parses["count"] += 1
            return flags_spec.parse(data)

    monkeypatch.setattr(spec, "FRAME_FLAGS", CountingFlags())
    for frames in (1_000, 4_000):
        parses["count"] = 0
        _feed_counted(_pure, _many_frames(_pure, frames), 1)
        # each empty frame: once when its flags byte arrives, once with its size byte;
        # READY once more, when its body is complete (it was 16x from 1,000 to 4,000 frames)
        assert parses["count"] == 2 * frames + 3


@given(zmtp_streams(max_frames=8), st.data())
def test_reader_breaks_on_the_feed_that_brings_the_bad_byte(impl, stream, data):
    """Skipping codec calls while a body is incomplete delays no error: after every feed the
    reader is broken exactly when decoding everything fed so far in one go finds an error."""
    codec = load_codec("zmtp", impl)
    wire = bytearray(zmtp_encode(codec, stream))
    wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    limits = {
        "max_frame_size": data.draw(st.sampled_from([None, 280])),
        "max_message_frames": data.draw(st.sampled_from([None, 2])),
        "max_message_size": data.draw(st.sampled_from([None, 30])),
    }
    reader = zmtp.StreamReader(codec=codec, **limits)
    prev = 0
    for cut in data.draw(chunkings(len(wire))):
        reader.feed(bytes(wire[prev:cut]))
        prev = cut
        error = codec.decode_events(bytes(wire[:cut]), final=False, **limits)[3]
        assert reader.broken == (error is not None)
        if error is not None:
            break


def test_reader_keeps_parsed_frames_and_counts_them_as_buffered(zmtp_codec):
    reader = zmtp.StreamReader(codec=zmtp_codec)
    reader.feed(HEAD + b"\x01\x01a\x01\x02bc")  # two frames of an unfinished message
    assert len(list(reader)) == 2
    assert reader.buffered == 7
    reader.feed(b"\x00")  # half of the last frame's header
    assert reader.buffered == 8 and list(reader) == []
    reader.feed(b"\x01d")
    assert list(reader) == [(len(HEAD), zmtp.Message((b"a", b"bc", b"d")))]
    assert reader.buffered == 0


@given(zmtp_streams(max_frames=8), st.data())
def test_pending_decoding_same_for_both_twins(stream, data):
    """Driving decode_events with a Pending by hand: both twins give the same events,
    positions, errors and Pending contents after every chunk."""
    wire = bytearray(zmtp_encode(_pure, stream))
    if data.draw(st.booleans()):
        wire[data.draw(st.integers(64, len(wire) - 1))] = data.draw(st.integers(0, 7))
    limits = {
        "max_frame_size": data.draw(st.sampled_from([None, 280])),
        "max_message_frames": data.draw(st.sampled_from([None, 2, 5])),
        "max_message_size": data.draw(st.sampled_from([None, 30, 600])),
    }
    cuts = data.draw(chunkings(len(wire)))
    runs = []
    for codec in (_fast(), _pure):
        pending, buf, phase, prev, seen = zmtp.Pending(), bytearray(), 0, 0, []
        for cut in cuts:
            buf += wire[prev:cut]
            prev = cut
            events, pos, phase, error = codec.decode_events(
                buf, 0, phase, cut == len(wire), pending=pending, **limits
            )
            err = None if error is None else (str(error), error.field, error.offset)
            kept = (list(pending.frames), pending.start, pending.size) if pending.frames else ()
            seen.append((events, pos, phase, err, kept, pending.need))
            if error is not None:
                break
            del buf[:pos]
            pending.dropped(pos)
        runs.append(seen)
    assert runs[0] == runs[1]


def test_message_frame_limit_is_checked_from_the_flags_byte(zmtp_codec):
    data = HEAD + b"\x01\x00" * 3 + b"\x01"  # the 4th frame: only its flags byte is here
    error = zmtp_codec.decode_events(data, final=False, max_message_frames=3)[3]
    assert (error.field, error.offset) == ("message", len(HEAD) + 6)
    assert error.reason == "multipart message of more than 3 frames (the limit)"
    assert zmtp_codec.decode_events(data, final=False, max_message_frames=4)[3] is None
    # the frames of one message are counted, not those of the stream
    two = HEAD + zmtp_codec.encode_message([b"a", b"b"]) * 3
    assert len(zmtp_codec.decode_stream(two)) == 5
    assert zmtp_codec.decode_events(two, max_message_frames=2)[3] is None


def test_message_size_limit_is_checked_from_the_size_field(zmtp_codec):
    data = HEAD + zmtp_codec.encode_message([b"x" * 100, b""])[:-2]  # 100 bytes, MORE
    data += b"\x02" + struct.pack(">Q", 10_000)  # and a frame with no body present at all
    error = zmtp_codec.decode_events(data, final=False, max_message_size=10_099)[3]
    assert (error.field, error.offset) == ("size", len(HEAD) + 103)
    assert error.reason == "multipart message of 10100 bytes exceeds the limit of 10099"
    assert zmtp_codec.decode_events(data, final=False, max_message_size=10_100)[3] is None
    # bodies are counted, headers are not; commands are not messages
    ping = zmtp_codec.encode_command("PING", b"x" * 50)
    assert zmtp_codec.decode_events(HEAD + ping, max_message_size=0)[3] is None
    data = HEAD + zmtp_codec.encode_message([b"ab", b"cd"])
    assert zmtp_codec.decode_events(data, max_message_size=4)[3] is None
    assert zmtp_codec.decode_events(data, max_message_size=3)[3].offset == len(HEAD) + 5


def test_reader_bounds_one_unfinished_message(zmtp_codec):
    """A peer that sends MORE frames forever gets a DecodeError, not an ever longer list."""
    reader = zmtp.StreamReader(max_message_frames=100, codec=zmtp_codec)
    assert (reader.max_message_frames, reader.max_message_size) == (
        100,
        zmtp.DEFAULT_MAX_MESSAGE_SIZE,
    )
    reader.feed(HEAD)
    for _ in range(100):
        reader.feed(b"\x01\x00")
    assert reader.buffered == 200 and len(list(reader)) == 2 and not reader.broken
    reader.feed(b"\x01")
    assert reader.broken and reader.buffered == 0
    with pytest.raises(DecodeError) as info:
        reader.next_event()
    assert (info.value.protocol, info.value.field, info.value.offset) == (
        "zmtp",
        "message",
        len(HEAD) + 200,
    )
    assert str(info.value) == (
        f"zmtp: message at byte {len(HEAD) + 200}: "
        "multipart message of more than 100 frames (the limit)"
    )


def test_reader_default_message_limits(zmtp_codec):
    reader = zmtp.StreamReader(codec=zmtp_codec)
    assert reader.max_message_frames == zmtp.DEFAULT_MAX_MESSAGE_FRAMES == 1 << 20
    assert reader.max_message_size == zmtp.DEFAULT_MAX_MESSAGE_SIZE == 256 << 20
    unlimited = zmtp.StreamReader(None, max_message_frames=None, max_message_size=None)
    unlimited.feed(HEAD + b"\x01\x00" * 10 + b"\x00\x00")
    assert len(list(unlimited)[-1][1].frames) == 11


def test_decode_events_lets_go_of_a_bytearray(zmtp_codec):
    """The reader grows its bytearray right after a call, even one that found an error (a
    buffer export kept alive by the error's traceback would make that a BufferError)."""
    buf = bytearray(HEAD + b"\x01\x00")
    result = zmtp_codec.decode_events(buf, final=False, pending=zmtp.Pending())
    buf += b"\x08\x00"
    result = zmtp_codec.decode_events(buf, 0, 2, pending=zmtp.Pending())
    assert result[3].field == "flags"
    buf += b"more"
    del buf[:4]
    assert bytes(buf[-4:]) == b"more"
