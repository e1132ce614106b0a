"""``wirekit decode`` on pcap/pcapng: reassembly, detection, malformed, pairing, filters."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import mip_messages, mutated

from wirekit import capture, clipper, mip, y2, zmtp
from wirekit.cli import main
from wirekit.mip import dump as mip_dump

C, S = ("127.0.0.1", 40000), ("127.0.0.1", 7000)


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(["decode", *map(str, argv)], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def jrun(*argv):
    code, out, err = run("--json", *argv)
    return code, [json.loads(line) for line in out.splitlines()], err


def pcapng(path, conversations):
    """conversations: [(client, server, [(side, ts, bytes), ...], open?)]"""
    with open(path, "wb") as fh:
        w = capture.PcapngWriter(fh)
        for client, server, sends, with_syn in conversations:
            conv = capture.TcpConversation(w, client, server)
            if with_syn:
                conv.open(sends[0][1] - 0.001)
            for side, ts, data in sends:
                conv.send(side, ts, data)
            conv.close(sends[-1][1] + 0.001)
    return path


# The KubeMo session of the issue: a bad version, an unknown kind and a mis-typed ping, each
# answered by the server with an error reply; good pings around them.
BAD_VERSION = b"\x07\x01\x00\x00\x00\x00\x00\x00"
UNKNOWN_KIND = b"\x00\x09\x00\x00\x00\x00\x00\x00"
PING_WITH_PAYLOAD = b"\x00\x01\x00\x00\x00\x00\x00\x04abcd"


def kubemo_session():
    sends = [(0, 1.0, mip.encode(mip.Ping())), (1, 1.0005, mip.encode(mip.Ping(True)))]
    t = 1.001
    for bad, code in ((BAD_VERSION, 0), (UNKNOWN_KIND, 2), (PING_WITH_PAYLOAD, 4)):
        sends += [(0, t, bad), (1, t + 0.002, mip.encode(mip.ErrorReply(code)))]
        t += 0.01
    req = mip.Inference.request([[mip.Item.text("hi"), mip.Item.json({"a": 1})]])
    sends += [
        (0, t, mip.encode(req)),
        (1, t + 0.003, mip.encode(mip.Inference.reply([[mip.Item.text("HI")]], 2))),
    ]
    return sends


def test_malformed_messages_are_shown_and_decoding_goes_on(tmp_path):
    path = pcapng(tmp_path / "k.pcapng", [(C, S, kubemo_session(), True)])
    code, out, err = run(path)
    assert code == 1  # something was malformed
    assert out.count("[Malformed]") == 3
    assert "mip: version at byte 8: unsupported version 7" in out
    assert "mip: kind at byte 17: unknown kind 9" in out
    assert "mip: remaining at byte 28: ping message has no payload" in out
    assert out.count("error ") == 3 and "inference response" in out  # all 10 shown
    assert "10 message(s)" in out and "3 malformed" in out
    assert "3 malformed message(s)" in err


def test_json_pairs_responses_with_latency(tmp_path):
    path = pcapng(tmp_path / "k.pcapng", [(C, S, kubemo_session(), True)])
    code, recs, _ = jrun(path)
    assert code == 1 and len(recs) == 10
    by_number = {r["number"]: r for r in recs}
    for r in recs:
        if r["dir"] == "S>C":
            req = by_number[r["reply_to"]]
            assert req["dir"] == "C>S" and r["latency_ms"] > 0
    bad = [r for r in recs if "malformed" in r]
    assert [b["malformed"]["field"] for b in bad] == ["version", "kind", "remaining"]
    assert bytes.fromhex(bad[0]["data_hex"]) == BAD_VERSION
    (inference,) = [r for r in recs if r["kind"] == "inference" and not r["response"]]
    assert [i["text"] for i in inference["items"]] == ["hi", '{"a":1}']  # decoded, not only hex
    assert abs(recs[-1]["latency_ms"] - 3.0) < 0.01


def test_filters_count_and_stats(tmp_path):
    path = pcapng(tmp_path / "k.pcapng", [(C, S, kubemo_session(), True)])
    _, recs, _ = jrun(path, "--error")  # a bare --error takes no NAME after FILE
    assert len(recs) == 6  # 3 malformed requests, 3 error replies
    _, recs, _ = jrun("--error=METHOD", path)
    assert [r["code_name"] for r in recs] == ["METHOD"]
    _, recs, _ = jrun("--kind", "inference", path)
    assert [r["kind"] for r in recs] == ["inference", "inference"]
    _, recs, _ = jrun("-c", "3", path)
    assert len(recs) == 3
    _, out, _ = run("--stats", "-q", path)
    assert "ping" in out and "malformed mip.version" in out and "error SHAPE" in out
    assert "latency (ms)" in out and "#1" not in out
    _, recs, _ = jrun("--stats", "-q", path)
    stats = recs[-1]["stats"]
    assert stats["kinds"]["error"] == 3 and stats["batch_sizes"] == {"1": 2}
    assert stats["latency_ms"]["inference"]["count"] == 1


def _segments(data: bytes, cut: int):
    return [(k, data[k : k + cut]) for k in range(0, len(data), cut)]


def _raw_capture(path, packets, with_syn=True, client_fin_at=None):
    """packets: [(side, offset, bytes)] written in the given order (client seq 1001 + offset).

    ``client_fin_at``: the offset of a client FIN written last.
    """
    import dpkt

    with open(path, "wb") as fh:
        w = capture.PcapngWriter(fh)
        if with_syn:
            w.packet(0.5, C, S, 1000, 0, dpkt.tcp.TH_SYN)
            w.packet(0.5, S, C, 5000, 1001, dpkt.tcp.TH_SYN | dpkt.tcp.TH_ACK)
        for k, (side, offset, data) in enumerate(packets):
            src, dst, isn = (C, S, 1001) if side == 0 else (S, C, 5001)
            w.packet(1.0 + k / 1000, src, dst, isn + offset, 0, dpkt.tcp.TH_ACK, data)
        if client_fin_at is not None:
            w.packet(2.0, C, S, 1001 + client_fin_at, 0, dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK)
    return path


def _stream(n=20):
    msgs = [mip.Inference.request([[mip.Item.text(f"message {k}" * 3)]]) for k in range(n)]
    return msgs, b"".join(mip.encode(m) for m in msgs)


def test_reassembly_reordered_and_duplicated_segments(tmp_path):
    _msgs, data = _stream()
    segs = [(0, off, part) for off, part in _segments(data, 7)]
    shuffled = segs[1::2] + segs[::2] + segs[3:9]  # out of order, then retransmissions
    code, recs, _ = jrun(_raw_capture(tmp_path / "r.pcapng", shuffled))
    assert code == 0
    assert [r["items"][0]["text"] for r in recs] == [f"message {k}" * 3 for k in range(20)]


def test_reassembly_missing_segment_is_a_gap_then_resync(tmp_path):
    _msgs, data = _stream()
    segs = [(0, off, part) for off, part in _segments(data, 10)]
    del segs[12]  # bytes 120..129 never captured
    code, out, _ = run(_raw_capture(tmp_path / "g.pcapng", segs))
    assert code == 1
    assert "10 bytes missing from the capture" in out
    assert "resynchronised on a plausible header" in out
    shown = out.count("inference request")
    assert 16 <= shown < 20  # the message with the hole (and its neighbour) is lost, not more
    assert "message 19" in out


def test_capture_starting_mid_stream_resynchronises(tmp_path):
    _msgs, data = _stream(5)
    start = 13  # inside the first message
    segs = [(0, start + off, part) for off, part in _segments(data[start:], 50)]
    code, out, _ = run(_raw_capture(tmp_path / "m.pcapng", segs, with_syn=False))
    assert "capture starts mid-stream" in out
    assert "resynchronised" in out and "message 4" in out
    assert code == 1


def test_ipv6_and_several_connections_each_detected(tmp_path):
    y2_wire = b"".join(y2.encode(m) for m in (y2.NodeIndex(0, 2), y2.Finished()))
    zmtp_wire = zmtp.encode_greeting() + zmtp.encode_ready("DEALER")
    nc = clipper.NewContainer("m", "1", clipper.InputType.DOUBLES, 3)
    zmtp_wire += zmtp.encode_message(clipper.encode(nc, "v3"))
    convs = [
        (("::1", 41000), ("::1", 7000), [(0, 1.0, mip.encode(mip.Ping()))], True),
        (("127.0.0.1", 42000), ("127.0.0.1", 7100), [(0, 1.1, y2_wire)], True),
        (("127.0.0.1", 43000), ("127.0.0.1", 7200), [(0, 1.2, zmtp_wire)], True),
    ]
    code, out, err = run(pcapng(tmp_path / "six.pcapng", convs))
    assert code == 0, out + err
    assert "[::1]:41000 -> [::1]:7000 (mip)" in out
    assert "(y2)" in out and "(clipper)" in out
    assert "node_index" in out and "new_container model='m'" in out
    _, recs, _ = jrun("--conn", "2", tmp_path / "six.pcapng")
    assert {r["conn"] for r in recs} == {2}


def test_a_client_port_reused_after_a_close_is_a_new_connection(tmp_path):
    # The kernel hands a client the same port again once its connection has closed (wirekit
    # record's capture of `mip infer` run twice had it): the second SYN opens connection 2,
    # whose bytes are its own, not a retransmission of the first's (same sequence numbers).
    first = mip.Inference.request([[mip.Item.text("hello")]])
    second = mip.Inference.request([[mip.Item.json({"k": 1})]])
    convs = [
        (C, S, [(0, 1.0, mip.encode(first)), (1, 1.001, mip.encode(first))], True),
        (C, S, [(0, 2.0, mip.encode(second)), (1, 2.001, mip.encode(second))], True),
    ]
    code, out, err = run(pcapng(tmp_path / "reuse.pcapng", convs))
    assert code == 0, out + err
    assert out.count("127.0.0.1:40000 -> 127.0.0.1:7000 (mip)") == 2
    assert "== connection 2:" in out and "'hello'" in out and '{"k":1}' in out
    assert "4 message(s)" in out and "2 connection(s)" in out


def test_client_server_raw_files_on_one_timeline(tmp_path):
    sends = kubemo_session()
    for side, name in ((0, "c.bin"), (1, "s.bin")):
        (tmp_path / name).write_bytes(b"".join(d for s, _, d in sends if s == side))
    code, recs, _ = jrun("--client", tmp_path / "c.bin", "--server", tmp_path / "s.bin")
    assert code == 1
    assert [r["dir"] for r in recs] == ["C>S", "S>C"] * 5
    assert all(r["reply_to"] == r["number"] - 1 for r in recs if r["dir"] == "S>C")


def test_not_a_capture_nor_a_protocol(tmp_path):
    """A file in no known protocol is a usage error (exit 2) saying so, not "0 malformed"."""
    path = tmp_path / "junk.bin"
    path.write_bytes(b"hello world, this is not a capture" * 10)
    code, out, err = run(path)
    assert code == 2 and out == ""
    assert f"{path}: no protocol detected" in err and "give --proto clipper|mip|y2" in err
    assert "malformed" not in err
    (tmp_path / "other.bin").write_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    code, _, err = run("--client", path, "--server", tmp_path / "other.bin")
    assert code == 2 and "no protocol detected" in err
    http = pcapng(tmp_path / "http.pcapng", [(C, S, [(0, 1.0, b"GET / HTTP/1.1\r\n" * 4)], True)])
    code, out, err = run(http)
    assert code == 2 and "no protocol detected" in err and "any TCP connection" in err
    assert "connection 1 (127.0.0.1:40000 -> 127.0.0.1:7000): no MIP, ZMTP or y2" in out
    path.write_bytes(b"\x0a\x0d\x0d\x0a" + b"\0" * 10)
    code, _, err = run(path)
    assert code == 2 and "pcapng" in err


@pytest.mark.parametrize("size", [0, 1, 100])
def test_reassembler_counts_every_byte_once(size):
    """Overlapping retransmissions of different sizes deliver each byte exactly once."""
    data = bytes(range(256)) * 4 + bytes(size)
    r = capture.Reassembler()
    got = bytearray()
    segs = [(0, data[:300]), (100, data[100:700]), (650, data[650:]), (0, data[:50])]
    for off, part in segs:
        seg = capture.Segment(1.0, C, S, 7 + off, False, True, False, False, part)
        for ev in r.feed(seg):
            if isinstance(ev, capture.Chunk):
                got += ev.data
    assert bytes(got) == data and r.stats.retransmitted == 3


# --- the formatted runs: Cython twin against the pure one -----------------------------------


def _fast_format_run():
    from wirekit._impl import load_fast, pure_requested

    if pure_requested():
        pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
    return load_fast("mipdump").format_run


@settings(max_examples=150, deadline=None)
@given(st.lists(mip_messages, max_size=6), st.booleans(), st.data())
def test_format_run_twins_write_the_same_text(msgs, as_json, data):
    fast = _fast_format_run()
    wire = b"".join(mip.encode(m) for m in msgs)
    if wire and data.draw(st.booleans()):
        wire = data.draw(mutated(wire))  # a malformed message somewhere: both stop there
    base = data.draw(st.integers(0, 10**9))
    assert fast(wire, 0, len(wire), base, as_json) == mip_dump.format_run_pure(
        wire, 0, len(wire), base, as_json
    )


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        "it's",
        'say "hi"',
        "both ' and \"",
        "tab\there\n",
        "ctl\x01\x7f",
        "back\\slash",
        "héllo wörld",
        "x" * 70,
    ],
)
def test_format_run_text_items_match_repr_and_json(text):
    fast = _fast_format_run()
    wire = mip.encode(mip.Inference.request([[mip.Item.text(text), mip.Item.json(text)]]))
    for as_json in (False, True):
        out = fast(wire, 0, len(wire), 0, as_json)
        assert out == mip_dump.format_run_pure(wire, 0, len(wire), 0, as_json)
    record = json.loads(fast(wire, 0, len(wire), 0, True)[0])
    assert record["items"][0]["text"] == text


def test_plain_output_is_the_same_with_and_without_runs(tmp_path):
    """The formatted runs (plain output) and per-message records (filters) agree."""
    path = tmp_path / "k.bin"
    path.write_bytes(b"".join(d for s, _, d in kubemo_session() if s == 0))
    for form in ((), ("--json",)):
        _, plain, _ = run(*form, path)
        _, filtered, _ = run(
            *form,
            "--kind",
            "inference",
            "--kind",
            "ping",
            "--kind",
            "malformed",
            "--kind",
            "kind9",
            path,
        )
        strip = [ln for ln in plain.splitlines() if "message(s)" not in ln]
        assert strip == [ln for ln in filtered.splitlines() if "message(s)" not in ln]


def test_streams_hold_at_most_one_message_whatever_the_input_size():
    """Memory does not grow with the input: a stream keeps one partial message at most."""
    big = mip.encode(mip.Inference.request([[mip.Item.image(bytes(300_000))]]))
    small = mip.encode(mip.Ping())
    wire = (small * 1000 + big) * 20
    stream = mip_dump.Stream()
    most, count = 0, 0
    for k in range(0, len(wire), 65536):
        count += len(stream.feed(wire[k : k + 65536]))
        most = max(most, stream.buffered)
    count += len(stream.close())
    assert count == 20 * 1001
    assert most <= len(big) + 65536 and stream.buffered == 0


def test_pairing_keeps_a_bounded_number_of_waiting_requests():
    from wirekit._dumping import Record
    from wirekit.analyse import Pairer

    pairer = Pairer(limit=3)
    for n in range(1, 11):
        rec = Record(0, 8, "ping")
        rec.number = n
        pairer.request(rec, None)
        pairer.request(rec, n)
    assert len(pairer.fifo) == 3 and len(pairer.keyed) == 3
    assert pairer.response(None).number == 8 and pairer.response(10).number == 10
    assert pairer.response(1) is None


def test_a_lost_tail_is_reported_from_the_fin(tmp_path):
    """tcpdump -i any can drop a packet: the FIN's sequence number shows the bytes lost."""
    _msgs, data = _stream(3)
    cut = len(mip.encode(mip.Inference.request([[mip.Item.text("message 0" * 3)]])))
    path = _raw_capture(tmp_path / "t.pcapng", [(0, 0, data[:cut])], client_fin_at=len(data))
    code, out, _ = run(path)
    assert code == 1
    assert f"{len(data) - cut} bytes missing from the capture" in out
    assert out.count("inference request") == 1


def test_capture_from_a_pipe(tmp_path):
    import subprocess
    import sys

    path = pcapng(tmp_path / "k.pcapng", [(C, S, kubemo_session(), True)])
    proc = subprocess.run(
        [sys.executable, "-m", "wirekit.cli", "decode", "--json", "-"],
        input=path.read_bytes(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stdout.decode().splitlines()) == 10


def test_a_connection_without_data_is_not_an_error(tmp_path):
    import dpkt

    path = tmp_path / "empty.pcapng"
    with open(path, "wb") as fh:
        w = capture.PcapngWriter(fh)
        w.packet(1.0, C, S, 1000, 0, dpkt.tcp.TH_SYN)
        w.packet(1.1, C, S, 1001, 0, dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK)
    code, out, err = run(path)
    assert code == 0, err
    assert out.strip() == "0 message(s), 0 bytes, 1 connection(s)"


def test_in_order_pairing_restarts_after_lost_bytes(tmp_path):
    """A lost request must not shift every later MIP response onto the wrong request."""
    ping, pong = mip.encode(mip.Ping()), mip.encode(mip.Ping(True))
    client = [(0, k * 8, ping) for k in range(4)]
    del client[1]  # the second request never captured
    server = [(1, k * 8, pong) for k in range(4)]
    packets = [client[0], server[0], server[1], client[1], server[2], client[2], server[3]]
    code, recs, _ = jrun(_raw_capture(tmp_path / "p.pcapng", packets))
    assert code == 1
    assert any(r["kind"] == "note" and "8 bytes missing" in r["note"] for r in recs)
    recs = [r for r in recs if r["kind"] != "note"]
    replies = [(r["number"], r.get("reply_to")) for r in recs if r["dir"] == "S>C"]
    requests = [r["number"] for r in recs if r["dir"] == "C>S"]
    assert replies[0][1] == requests[0]
    for number, reply_to in replies[1:]:  # after the hole: never paired with a wrong one
        assert reply_to is None or (reply_to in requests[1:] and reply_to < number)


def test_client_server_clipper_files_interleave_request_then_answer():
    """The bundled Clipper samples (real libzmq bytes): each answer right after its request.

    Clipper (the server side) sends the requests and the container (the client) answers:
    the old merge printed every server record, then every client record.
    """
    code, recs, err = jrun("--client", "samples/clipper-v3-container.bin",
                           "--server", "samples/clipper-v3-clipper.bin")  # fmt: skip
    assert code == 0, err
    order = [(r["dir"], r["kind"]) for r in recs]
    assert order == [
        ("C>S", "zmtp_greeting"),
        ("C>S", "zmtp_ready"),
        ("C>S", "new_container"),
        ("C>S", "heartbeat"),
        ("S>C", "zmtp_greeting"),
        ("S>C", "zmtp_ready"),
        ("S>C", "heartbeat_reply"),
        ("S>C", "predict_request"),
        ("C>S", "predict_response"),
        ("S>C", "predict_request"),
        ("C>S", "predict_response"),
    ]
    assert all(r["reply_to"] == r["number"] - 1 for r in recs if r["kind"] == "predict_response")


def test_client_server_files_put_each_answer_after_its_request(tmp_path):
    """Pipelined MIP requests (all sent before any answer) still read request, answer."""
    reqs = [mip.Inference.request([[mip.Item.text(f"q{k}")]]) for k in range(3)]
    (tmp_path / "c.bin").write_bytes(b"".join(mip.encode(m) for m in reqs))
    answers = [mip.Inference.reply([[mip.Item.text(f"a{k}")]], 1) for k in range(3)]
    (tmp_path / "s.bin").write_bytes(b"".join(mip.encode(m) for m in answers))
    _, out, _ = run("--client", tmp_path / "c.bin", "--server", tmp_path / "s.bin")
    texts = [ln.split("'")[1] for ln in out.splitlines() if "TEXT" in ln]
    assert texts == ["q0", "a0", "q1", "a1", "q2", "a2"]


def _clipper_wire(model: str, msg_id: int) -> tuple[bytes, bytes]:
    container = zmtp.encode_greeting() + zmtp.encode_ready("DEALER")
    container += zmtp.encode_message(clipper.encode(
        clipper.NewContainer(model, "1", clipper.InputType.STRINGS, 3), "v3"))  # fmt: skip
    container += zmtp.encode_message(clipper.encode(clipper.PredictResponse(msg_id, ["x"]), "v3"))
    router = zmtp.encode_greeting() + zmtp.encode_ready("ROUTER")
    router += zmtp.encode_message(
        clipper.encode(clipper.PredictRequest(msg_id, clipper.InputType.STRINGS, ["in"]), "v3")
    )
    return container, router


def test_with_filters_only_connections_with_a_shown_message_get_a_header(tmp_path):
    a_up, a_down = _clipper_wire("model-a", 1)
    b_up, b_down = _clipper_wire("model-b", 2)
    convs = [
        (("127.0.0.1", 41000), S, [(0, 1.0, mip.encode(mip.Ping()))], True),
        (("127.0.0.1", 42000), ("127.0.0.1", 7200), [(0, 1.1, a_up), (1, 1.2, a_down)], True),
        (("127.0.0.1", 43000), ("127.0.0.1", 7201), [(0, 1.3, b_up), (1, 1.4, b_down)], True),
    ]
    path = pcapng(tmp_path / "three.pcapng", convs)
    code, out, _ = run(path)
    assert code == 0 and out.count("== connection") == 3  # no filter: every connection
    _, out, _ = run("--model", "model-b", path)
    headers = [ln for ln in out.splitlines() if ln.startswith("== connection")]
    assert headers == ["== connection 3: 127.0.0.1:43000 -> 127.0.0.1:7201 (clipper)"]
    assert out.splitlines()[0] == headers[0]  # the header comes before its messages
    _, out, _ = run("--kind", "ping", path)
    assert [ln for ln in out.splitlines() if ln.startswith("==")] == [
        "== connection 1: 127.0.0.1:41000 -> 127.0.0.1:7000 (mip)"
    ]
