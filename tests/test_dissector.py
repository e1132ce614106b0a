"""``wirekit dissector``: the generated Lua dissector, run by Debian's tshark, agrees with
``wirekit decode --json`` field by field.  Under CI (``CI=true``) a missing tshark fails."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from collections import defaultdict

import pytest

from wirekit import capture, mip, y2
from wirekit.cli import main
from wirekit.mip.client import Client
from wirekit.mip.server import ServerThread
from wirekit.zmtp.record import RecordingProxy

IN_CI = os.environ.get("CI", "").lower() == "true"
WAIT = 30


def _tshark() -> str:
    path = shutil.which("tshark")
    if path is None:
        if IN_CI:
            pytest.fail("tshark is needed under CI: scripts/test.sh installs it")
        pytest.skip("tshark is not installed")
    return path


def _lua(tmp_path, proto, *ports):
    path = tmp_path / f"{proto}.lua"
    args = ["dissector", "--proto", proto, "-o", str(path)]
    for p in ports:
        args += ["--port", str(p)]
    assert main(args, out=io.StringIO(), err=io.StringIO()) == 0
    return path


def _fields(tshark, lua, cap, proto, names):
    proc = subprocess.run(
        [tshark, "-X", f"lua_script:{lua}", "-r", str(cap), "-Y", proto, "-T", "fields",
         "-e", "tcp.srcport", *[a for n in names for a in ("-e", f"{proto}.{n}")],
         "-E", "occurrence=a", "-E", "aggregator=|", "-E", "separator=\t"],
        capture_output=True, text=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Lua: Error" not in proc.stderr, proc.stderr
    rows = []
    for line in proc.stdout.splitlines():
        cols = line.split("\t")
        rows.append((int(cols[0]), [c.split("|") if c else [] for c in cols[1:]]))
    return rows


def _decoded(cap):
    out = io.StringIO()
    main(["decode", "--json", str(cap)], out=out, err=io.StringIO())
    return [json.loads(line) for line in out.getvalue().splitlines()]


def echo(batch):
    return [list(sample) for sample in batch]


def test_mip_dissector_fields_match_decode_json(tmp_path):
    tshark = _tshark()
    cap = tmp_path / "mip.pcapng"
    with ServerThread(echo, "tcp://127.0.0.1:0") as running:
        port = int(running.address.rsplit(":", 1)[1])
        with open(cap, "wb") as fh, RecordingProxy(("127.0.0.1", port), max_connections=1,
                                                    pcapng=fh) as proxy:  # fmt: skip
            with Client(f"tcp://127.0.0.1:{proxy.port}") as client:
                client.ping()
                client.infer(
                    [
                        [mip.Item.text("héllo"), mip.Item.json({"a": [1, 2]})],
                        [mip.Item.image(bytes(range(256)) * 300), mip.Item.text("x")],
                    ]
                )
            assert proxy.wait(WAIT)
    lua = _lua(tmp_path, "mip", port)
    names = ["kind", "subtype", "remaining", "item.type", "item.size", "item.text"]
    rows = _fields(tshark, lua, cap, "kubemo", names)
    seen = defaultdict(lambda: defaultdict(list))
    for src, cols in rows:
        side = "S>C" if src == port else "C>S"
        for name, values in zip(names, cols, strict=True):
            seen[side][name] += values
    want = defaultdict(lambda: defaultdict(list))
    for r in _decoded(cap):
        w = want[r["dir"]]
        w["kind"].append(str({"error": 0, "ping": 1, "inference": 2}[r["kind"]]))
        w["subtype"].append(str(int(r.get("response", r.get("code", 0)))))
        w["remaining"].append(str(r["size"] - 8))
        for item in r.get("items", []):
            w["item.type"].append(str(item["type"]))
            w["item.size"].append(str(item["size"]))
            if "text" in item:
                w["item.text"].append(item["text"])
    assert want["C>S"]["kind"] == ["1", "2"] and want["S>C"]["item.size"][2] == "76800"
    for side in ("C>S", "S>C"):
        for name in names:
            assert seen[side][name] == want[side][name], (side, name)


def test_mip_dissector_marks_malformed_and_goes_on(tmp_path):
    tshark = _tshark()
    cap = tmp_path / "bad.pcapng"
    with open(cap, "wb") as fh:
        conv = capture.TcpConversation(capture.PcapngWriter(fh), ("127.0.0.1", 41000),
                                       ("127.0.0.1", 7000))  # fmt: skip
        conv.open(1.0)
        conv.send(0, 1.1, b"\x07\x01\x00\x00\x00\x00\x00\x00" + mip.encode(mip.Ping()))
        conv.close(1.2)
    lua = _lua(tmp_path, "mip", 7000)
    proc = subprocess.run(
        [tshark, "-X", f"lua_script:{lua}", "-r", str(cap), "-Y", "kubemo"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert "[Malformed], ping request" in proc.stdout, proc.stdout + proc.stderr


def test_y2_dissector_fields_match_decode_json(tmp_path):
    tshark = _tshark()
    cap = tmp_path / "y2.pcapng"
    msgs = [
        y2.NodeIndex(1, 4),
        y2.Runtime(6000, 12, 3400, 25, -1500),
        y2.Runtime(1, 2, 3, 4),
        y2.Delta(y2.pack([3, 1], [True, False], [42, 7], [True, False])),
        y2.Finished(),
    ]
    with open(cap, "wb") as fh:
        conv = capture.TcpConversation(capture.PcapngWriter(fh), ("127.0.0.1", 41000),
                                       ("127.0.0.1", 7100))  # fmt: skip
        conv.open(1.0)
        wire = b"".join(y2.encode(m) for m in msgs)
        conv.send(0, 1.1, wire[:13])  # split inside a message: reassembled by tshark
        conv.send(0, 1.2, wire[13:])
        conv.close(1.3)
    lua = _lua(tmp_path, "y2", 7100)
    names = [
        "type",
        "size",
        "node_id",
        "node_count",
        "sample_count",
        "loss_milli",
        "word.param",
        "word.layer",
        "word.bias",
        "word.index",
        "word.positive",
    ]
    rows = _fields(tshark, lua, cap, "y2", names)
    seen = defaultdict(list)
    for _src, cols in rows:
        for name, values in zip(names, cols, strict=True):
            seen[name] += values
    recs = _decoded(cap)
    types = {"node_index": 0, "delta": 1, "runtime": 2, "finished": 3}
    assert seen["type"] == [str(types[r["kind"]]) for r in recs]
    assert seen["size"] == [str(r["size"] - 8) for r in recs]
    assert seen["node_id"] == ["1"] and seen["node_count"] == ["4"]
    assert seen["sample_count"] == [str(r["sample_count"]) for r in recs if "sample_count" in r]
    assert seen["loss_milli"] == [str(r["loss_milli"]) for r in recs if "loss_milli" in r]
    words = [w for r in recs for w in r.get("words", [])]
    assert seen["word.param"] == [str(w["param"]) for w in words] == ["6", "3"]
    assert seen["word.layer"] == [str(w["layer"]) for w in words]
    assert seen["word.index"] == [str(w["index"]) for w in words]
    assert seen["word.bias"] == [str(int(not w["weight"])) for w in words] == ["0", "1"]
    assert seen["word.positive"] == [str(int(w["positive"])) for w in words] == ["1", "0"]


# --- Clipper over ZMTP -----------------------------------------------------------------------


def _clipper_session(generation: str) -> tuple[bytes, bytes]:
    """(container -> Clipper, Clipper -> container) bytes of one session of a generation."""
    from wirekit import clipper, zmtp

    up = [clipper.NewContainer("sum-model", "7", clipper.InputType.DOUBLES)]
    down = [clipper.PredictRequest(5, clipper.InputType.DOUBLES, [[1.0, 2.0], [3.0, 4.0]])]
    if generation == "2016":
        up.append(clipper.PredictResponse(5, [3.0, 7.0]))
    else:
        up += [clipper.Heartbeat(), clipper.PredictResponse(5, ["3.0", "7.0"])]
        down.insert(0, clipper.HeartbeatReply(clipper.HeartbeatType.KEEPALIVE))
        down.append(clipper.PredictRequest(6, clipper.InputType.STRINGS, ["héllo", "x"]))
        up.append(clipper.PredictResponse(6, ["5", "1"]))
    wire = []
    for socket_type, msgs in (("DEALER", up), ("ROUTER", down)):
        data = zmtp.encode_greeting() + zmtp.encode_ready(socket_type)
        data += b"".join(zmtp.encode_message(clipper.encode(m, generation)) for m in msgs)
        wire.append(data)
    return wire[0], wire[1]


def test_clipper_dissector_fields_match_decode_json(tmp_path):
    """Real libzmq bytes (the bundled v3 samples, cut into small TCP segments that tshark
    reassembles) and a 2017 and a 2016 session: every message's fields as wirekit decodes."""
    tshark = _tshark()
    samples = os.path.join(os.path.dirname(__file__), "..", "samples")
    with open(os.path.join(samples, "clipper-v3-container.bin"), "rb") as fh:
        v3_up = fh.read()
    with open(os.path.join(samples, "clipper-v3-clipper.bin"), "rb") as fh:
        v3_down = fh.read()
    sessions = [(v3_up, v3_down, 7), (*_clipper_session("2017"), None),
                (*_clipper_session("2016"), None)]  # fmt: skip
    cap = tmp_path / "clipper.pcapng"
    with open(cap, "wb") as fh:
        writer = capture.PcapngWriter(fh)
        for k, (up, down, cut) in enumerate(sessions):
            conv = capture.TcpConversation(writer, ("127.0.0.1", 41000 + k),
                                           ("127.0.0.1", 7300 + k))  # fmt: skip
            conv.open(1.0 + k)
            step = cut or max(len(up), len(down))
            for at in range(0, max(len(up), len(down)), step):
                if up[at : at + step]:
                    conv.send(0, 1.1 + k, up[at : at + step])
                if down[at : at + step]:
                    conv.send(1, 1.2 + k, down[at : at + step])
            conv.close(1.5 + k)
    lua = _lua(tmp_path, "clipper", 7300)  # the others: found by the heuristic
    names = ["kind", "generation", "side", "msg_id", "model_name", "input_type", "num_inputs",
             "outputs", "outputs_f32", "heartbeat_type", "input_text", "zmtp.socket_type",
             "zmtp.major"]  # fmt: skip
    rows = _fields(tshark, lua, cap, "clipper", names)
    seen = defaultdict(lambda: defaultdict(list))
    for src, cols in rows:
        for name, values in zip(names, cols, strict=True):
            seen[src][name] += values
    want = defaultdict(lambda: defaultdict(list))
    for r in _decoded(cap):
        src = (41000 if r["dir"] == "C>S" else 7300) + r["conn"] - 1
        w = want[src]
        if r["kind"] == "zmtp_greeting":
            w["zmtp.major"].append(r["version"].split(".")[0])
            continue
        if r["kind"] == "zmtp_ready":
            w["zmtp.socket_type"].append(r["socket_type"])
            continue
        w["kind"].append(r["kind"])
        w["generation"].append(r["generation"])
        w["side"].append(r["side"])
        for name in ("msg_id", "model_name", "input_type", "num_inputs", "heartbeat_type"):
            if name in r:
                w[name].append(str(r[name]))
        for out in r.get("outputs", []):
            w["outputs_f32" if isinstance(out, float) else "outputs"].append(str(out))
        if r.get("input_type_name") == "STRINGS" and r["generation"] == "v3":
            w["input_text"] += r["inputs"]
    assert len(want) == 6 and want[7300]["kind"][-1] == "predict_request"
    assert "2016" in want[7302]["generation"] and "2017" in want[7301]["generation"]
    for src in want:
        for name in names:
            got, expected = seen[src][name], want[src][name]
            if name == "outputs_f32":  # tshark prints 3.0 as "3"
                got, expected = [float(v) for v in got], [float(v) for v in expected]
            assert got == expected, (src, name)
