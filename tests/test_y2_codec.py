"""y2 worker link: golden vectors, properties against the construct spec, errors, streaming,
the partition helper and the CLI."""

from __future__ import annotations

import io
import itertools
import json
import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import mutated, y2_messages
from twins import load_codec

from wirekit import cli, y2
from wirekit.errors import DecodeError, EncodeError
from wirekit.y2 import _pure, spec
from wirekit.y2.messages import to_jsonable

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "specs" / "vectors" / "y2"
GOLDEN = sorted(VECTORS.glob("*.bin"))
SAMPLE = ROOT / "samples" / "y2-worker-link.bin"


def _fast():
    return load_codec("y2", "fast")


def _outcome(codec, data):
    """("ok", message) or ("error", everything the DecodeError says)."""
    try:
        return ("ok", codec.decode(data))
    except DecodeError as exc:
        return ("error", (str(exc), exc.protocol, exc.field, exc.offset))


def _hs(kind, size):
    return struct.pack(">ii", kind, size)


# --- golden vectors -------------------------------------------------------------------------


def test_golden_vectors_exist():
    assert len(GOLDEN) >= 15
    assert any(p.stem.startswith("bad-") for p in GOLDEN)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_vector(y2_codec, path):
    data = path.read_bytes()
    expected = json.loads(path.with_suffix(".json").read_text())
    if "error" in expected:
        with pytest.raises(DecodeError) as info:
            y2_codec.decode(data)
        err = expected["error"]
        assert (info.value.protocol, info.value.field, info.value.offset) == (
            "y2",
            err["field"],
            err["offset"],
        )
        return
    msg = y2_codec.decode(data)
    assert to_jsonable(msg) == expected
    assert y2_codec.encode(msg) == data  # the vectors are canonical
    assert _pure.from_container(spec.MESSAGE.parse(data)) == msg


def test_word_vectors(y2_codec):
    table = json.loads((VECTORS / "words.json").read_text())
    words = np.array([int(v["word"], 16) for v in table], dtype=np.uint32)
    fields = [np.array([v[k] for v in table]) for k in ("layer", "weight", "index", "positive")]
    assert np.array_equal(y2_codec.pack(*fields), words)
    layer, weight, index, positive = y2_codec.unpack(words)
    assert layer.tolist() == fields[0].tolist() and weight.tolist() == fields[1].tolist()
    assert index.tolist() == fields[2].tolist() and positive.tolist() == fields[3].tolist()
    assert y2_codec.to_wire(words).hex() == "".join(v["wire"] for v in table)
    for v in table:
        # y2's trainer: (i << 22) | (element_index << 1) | s, s = 1 for +delta
        assert int(v["word"], 16) == (v["param"] << 22) | (v["index"] << 1) | v["positive"]
        assert (v["layer"], v["weight"]) == (v["param"] >> 1, v["param"] % 2 == 0)
        built = spec.WORD.build(dict(param=v["param"], index=v["index"], positive=v["positive"]))
        assert built.hex() == v["wire"]


# --- properties: both twins equal the construct reference ----------------------------------


@given(y2_messages)
def test_encode_equals_construct_build(y2_codec, msg):
    assert y2_codec.encode(msg) == spec.MESSAGE.build(_pure.to_container(msg))


@given(y2_messages)
def test_decode_equals_construct_parse_and_round_trips(y2_codec, msg):
    wire = spec.MESSAGE.build(_pure.to_container(msg))
    decoded = y2_codec.decode(wire)
    assert decoded == _pure.from_container(spec.MESSAGE.parse(wire))
    assert decoded == msg
    assert y2_codec.encode(decoded) == wire


@given(y2_messages, st.data())
def test_malformed_input_same_outcome_from_both_twins(msg, data):
    wire = data.draw(mutated(_pure.encode(msg)))
    assert _outcome(_fast(), wire) == _outcome(_pure, wire)


@given(st.binary(max_size=48))
def test_random_bytes_same_outcome_from_both_twins(data):
    assert _outcome(_fast(), data) == _outcome(_pure, data)


@given(st.sampled_from([-1, 0, 1, 2, 3, 4, 2**31 - 1]), st.integers(-(2**31), 2**31 - 1))
def test_check_handshake_same_outcome_from_both_twins(kind, size):
    def run(codec):
        try:
            return codec.check_handshake(_hs(kind, size))
        except DecodeError as exc:
            return str(exc), exc.field, exc.offset

    assert run(_fast()) == run(_pure)


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "offset"),
    [
        (b"", "handshake", 0),
        (_hs(1, 0)[:7], "handshake", 7),
        (_hs(4, 0), "type", 0),
        (_hs(-7, 0), "type", 0),
        (_hs(1, -1), "size", 4),
        (_hs(0, -8), "size", 4),
        (_hs(0, 12) + bytes(12), "size", 4),
        (_hs(2, 24) + bytes(24), "size", 4),
        (_hs(2, 0), "size", 4),
        (_hs(3, 1) + b"x", "size", 4),
        (_hs(1, 3) + b"abc", "size", 4),
        # a huge announced payload: nothing is allocated, the error is found at once
        (_hs(1, 2**31 - 4), "payload", 8),
        (_hs(0, 8) + struct.pack(">ii", 0, -3), "node_count", 12),
        (_hs(0, 8) + struct.pack(">ii", -1, 3), "node_id", 8),
        (_hs(3, 0) + _hs(3, 0), "message", 8),
    ],
)
def test_decode_errors_name_field_and_offset(y2_codec, data, field, offset):
    with pytest.raises(DecodeError) as info:
        y2_codec.decode(data)
    err = info.value
    assert (err.protocol, err.field, err.offset) == ("y2", field, offset)
    assert isinstance(err, ValueError)
    assert f"y2: {field} at byte {offset}: " in str(err)


def test_runtime_both_forms(y2_codec):
    short = y2_codec.encode(y2.Runtime(1, 2, 3, 4))
    assert short == _hs(2, 16) + struct.pack(">4i", 1, 2, 3, 4)
    long = y2_codec.encode(y2.Runtime(1, 2, 3, 4, -1500))
    assert long == _hs(2, 20) + struct.pack(">5i", 1, 2, 3, 4, -1500)
    assert y2_codec.decode(short).loss_milli is None
    assert y2_codec.decode(long).loss == -1.5


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        (y2.NodeIndex(0, 0), "node_count"),
        (y2.NodeIndex(3, 3), "node_id"),
        (y2.NodeIndex(-1, 3), "node_id"),
        (y2.NodeIndex(0, 2**31), "node_count"),
        (y2.Runtime(2**31, 0, 0, 0), "sample_count"),
        (y2.Runtime(0, 0, 0, 0, -(2**31) - 1), "loss_milli"),
        (y2.Runtime(0, 1.5, 0, 0), "decompression_ms"),
        (y2.Delta(np.array([2**32], dtype=np.int64)), "words[0]"),
        (y2.Delta(np.array([1, -1], dtype=np.int64)), "words[1]"),
        (y2.Delta(np.array([0.5])), "words"),
        ("not a message", "message"),
    ],
)
def test_encode_errors_same_from_both_twins(msg, field):
    texts = set()
    for codec in (_fast(), _pure):
        with pytest.raises(EncodeError) as info:
            codec.encode(msg)
        assert (info.value.protocol, info.value.field) == ("y2", field)
        texts.add(str(info.value))
    assert len(texts) == 1


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_decode_accepts_any_bytes_like(y2_codec, kind):
    msg = y2.Delta(np.array([1, 2, 0xFFFFFFFF], dtype=np.uint32))
    decoded = y2_codec.decode(kind(_pure.encode(msg)))
    assert decoded == msg
    assert decoded.words.dtype == np.uint32 and decoded.words.flags.writeable


def test_delta_accepts_big_endian_and_lists(y2_codec):
    native = np.array([5, 0xABCDEF01], dtype=np.uint32)
    wire = y2_codec.encode(y2.Delta(native))
    assert y2_codec.encode(y2.Delta(native.astype(">u4"))) == wire
    assert y2_codec.encode(y2.Delta([5, 0xABCDEF01])) == wire


def test_decode_prefix_walks_a_concatenation(y2_codec):
    data = SAMPLE.read_bytes()
    pos, kinds = 0, []
    while pos < len(data):
        msg, pos = y2_codec.decode_prefix(data, pos)
        kinds.append(type(msg).__name__)
    assert kinds == ["NodeIndex", "Delta", "Runtime", "Delta", "Runtime", "Finished"]


# --- partition ------------------------------------------------------------------------------


@given(st.integers(1, 64), st.integers(0, 10**6))
def test_partition_tiles_the_training_set(count, n):
    ranges = [y2.partition(k, count, n) for k in range(count)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [stop - start for start, stop in ranges]
    assert max(sizes) - min(sizes) <= 1


@given(st.integers(1, 2**31 - 1), st.integers(0, 10**30), st.data())
def test_partition_is_exact_floor(count, n, data):
    node = data.draw(st.integers(0, count - 1))
    start, stop = y2.partition(node, count, n)
    # floor(id / count * N) computed with exact rationals
    assert start == (Fraction(node, count) * n).__floor__()
    assert stop == (Fraction(node + 1, count) * n).__floor__()
    assert y2.NodeIndex(node, count).partition(n) == range(start, stop)


def test_partition_where_floats_would_round_wrong():
    # 1/3 * 3 is 1.0 in floats, but e.g. 49/49*N style products drift for big N
    n = 10**17 + 3
    assert y2.partition(1, 3, n) == (n // 3, 2 * n // 3)
    assert int(1 / 3 * n) != n // 3  # the float formula is off here
    with pytest.raises(ValueError):
        y2.partition(3, 3, 10)
    with pytest.raises(ValueError):
        y2.partition(0, 0, 10)
    with pytest.raises(TypeError):
        y2.partition(0, 2, 10.0)


# --- streaming decoder ----------------------------------------------------------------------


@given(st.lists(y2_messages, max_size=6), st.data())
def test_stream_decoder_gives_same_messages_for_every_chunking(impl, msgs, data):
    wire = b"".join(_pure.encode(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    decoder = y2.Decoder(codec=load_codec("y2", impl))
    out, prev = [], 0
    for cut in [*cuts, len(wire)]:
        decoder.feed(wire[prev:cut])
        prev = cut
        out.extend(decoder)
    assert out == msgs
    assert decoder.buffered == 0 and decoder.offset == len(wire)


def test_stream_decoder_rejects_oversize_from_the_handshake_alone(y2_codec):
    decoder = y2.Decoder(max_message_size=1024, codec=y2_codec)
    decoder.feed(_pure.encode(y2.Finished()) + _hs(1, 4000))
    assert next(iter(decoder)) == y2.Finished()
    with pytest.raises(DecodeError) as info:
        decoder.next_message()
    assert (info.value.field, info.value.offset) == ("size", 12)
    assert decoder.broken and decoder.buffered == 8  # the payload was never buffered
    with pytest.raises(DecodeError):
        decoder.feed(b"x")


def test_stream_decoder_bad_handshake_breaks_the_stream(y2_codec):
    decoder = y2.Decoder(codec=y2_codec)
    decoder.feed(_pure.encode(y2.NodeIndex(0, 2)) + _hs(9, 0))
    assert decoder.next_message() == y2.NodeIndex(0, 2)
    with pytest.raises(DecodeError) as info:
        decoder.next_message()
    assert (info.value.field, info.value.offset) == ("type", 16)
    assert decoder.broken
    with pytest.raises(DecodeError):
        decoder.next_message()


def test_stream_decoder_skips_a_bad_node_index_and_continues(y2_codec):
    decoder = y2.Decoder(codec=y2_codec)
    decoder.feed(_hs(0, 8) + struct.pack(">ii", 5, 2) + _pure.encode(y2.Finished()))
    with pytest.raises(DecodeError) as info:
        decoder.next_message()
    assert (info.value.field, info.value.offset) == ("node_id", 8)
    assert decoder.next_message() == y2.Finished()
    assert not decoder.broken


def test_stream_decoder_delta_does_not_alias_its_buffer(y2_codec):
    words = np.arange(100, dtype=np.uint32)
    decoder = y2.Decoder(codec=y2_codec)
    decoder.feed(_pure.encode(y2.Delta(words)))
    msg = decoder.next_message()
    decoder.feed(_pure.encode(y2.Delta(words[::-1].copy())))  # reuses the buffer
    assert np.array_equal(msg.words, words)
    assert np.array_equal(decoder.next_message().words, words[::-1])


def test_stream_decoder_hands_out_raw_frames(y2_codec):
    first, second = _pure.encode(y2.NodeIndex(1, 3)), _pure.encode(y2.Finished())
    decoder = y2.Decoder(codec=y2_codec)
    assert decoder.take_whole(first) is first  # exactly one message: no copy, no buffering
    assert decoder.offset == len(first) and decoder.take_whole(first[:5]) is None
    decoder.feed(bytearray(second + first[:3]))  # the buffered path
    assert decoder.next_frame() == second
    assert decoder.next_frame() is None and decoder.buffered == 3
    decoder.feed(first[3:])
    assert decoder.next_message() == y2.NodeIndex(1, 3)
    assert decoder.offset == 2 * len(first) + len(second)


# --- CLI ------------------------------------------------------------------------------------


def _run(*argv):
    out, err = io.StringIO(), io.StringIO()
    return cli.main(list(argv), out, err), out.getvalue(), err.getvalue()


def test_cli_human_output_of_the_sample():
    status, out, _ = _run("decode", "--proto", "y2", "--y2-words", "2", str(SAMPLE))
    assert status == 0
    assert "@0 node_index  node 2 of 4" in out
    assert "delta  821 words" in out and "... 819 more" in out
    assert "[0] 0x00000024  p0 L0 w[18] -tau" in out
    assert "loss=1.873" in out and "finished" in out
    assert out.rstrip().endswith(f"6 message(s), {SAMPLE.stat().st_size} bytes")


def test_cli_json_lists_every_word():
    status, out, _ = _run("decode", "--proto", "y2", "--json", str(SAMPLE))
    assert status == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["kind"] for r in records] == [
        "node_index",
        "delta",
        "runtime",
        "delta",
        "runtime",
        "finished",
    ]
    delta = records[1]
    assert delta["word_count"] == len(delta["words"]) == 821
    msg = _pure.decode_prefix(SAMPLE.read_bytes(), 16)[0]
    assert [int(w["word"], 16) for w in delta["words"]] == msg.words.tolist()
    assert delta["words"][0] == {
        "word": "0x00000024",
        "param": 0,
        "layer": 0,
        "weight": True,
        "index": 18,
        "positive": False,
    }


def test_cli_reports_bad_input_with_offset(tmp_path):
    path = tmp_path / "bad.bin"
    path.write_bytes(_pure.encode(y2.Finished()) + _hs(1, 6) + b"abcdef")
    status, out, err = _run("decode", "--proto", "y2", str(path))
    assert status == 1
    assert "@0 finished" in out
    assert "y2: size at byte 12" in err
    assert "@8 delta [Malformed]" in out  # shown, and the framing (size 6) carried on
    finished = _pure.encode(y2.Finished())
    path.write_bytes(finished + _hs(1, 6) + b"abcdef" + finished)
    status, out, err = _run("decode", "--proto", "y2", str(path))
    assert status == 1 and "@22 finished" in out and "3 message(s)" in out


def test_facade_doctest_runs():
    import doctest

    result = doctest.testmod(y2)
    assert result.attempted >= 8 and result.failed == 0
