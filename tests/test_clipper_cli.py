"""``wirekit decode --proto clipper``: ZMTP captures of Clipper connections, all generations."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from wirekit import clipper, zmtp
from wirekit.cli import main
from wirekit.clipper.messages import HeartbeatType, InputType

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_CLIPPER = ROOT / "samples" / "clipper-v3-clipper.bin"
SAMPLE_CONTAINER = ROOT / "samples" / "clipper-v3-container.bin"


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(["decode", "--proto", "clipper", *map(str, argv)], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def capture(socket_type: str, messages, generation) -> bytes:
    """A capture of one side: greeting, READY, then each message's frames (as libzmq writes)."""
    parts = [zmtp.encode_greeting(), zmtp.encode_ready(socket_type)]
    parts += [zmtp.encode_message(clipper.encode(m, generation)) for m in messages]
    return b"".join(parts)


def write(tmp_path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _sample_script():
    spec = importlib.util.spec_from_file_location(
        "capture_clipper", ROOT / "samples" / "capture_clipper.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the bundled real samples ---------------------------------------------------------------


def test_sample_clipper_side_human_output():
    code, out, err = run(SAMPLE_CLIPPER)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "@0 ZMTP 3.1 greeting, mechanism NULL"
    assert (
        "Socket-Type=ROUTER: clipper side (Clipper → container), Clipper generation v3" in lines[1]
    )
    assert "[Clipper → container, v3] heartbeat_reply KEEPALIVE" in lines[2]
    assert "predict_request msg_id=0 request_type=0 DOUBLES × 2 dtype=float64 shape=(2, 3)" in out
    assert "    [1] float64[3] 4 5 6" in lines
    assert "    [1] str 'wörld'" in lines
    assert lines[-1] == f"5 message(s), {SAMPLE_CLIPPER.stat().st_size} bytes"


def test_sample_container_side_json_lines():
    code, out, _ = run("--json", SAMPLE_CONTAINER)
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["kind"] for r in records] == [
        "zmtp_greeting",
        "zmtp_ready",
        "new_container",
        "heartbeat",
        "predict_response",
        "predict_response",
    ]
    assert records[1]["socket_type"] == "DEALER" and records[1]["side"] == "container"
    assert all(r["generation"] == "v3" for r in records[2:])
    assert records[2]["model_name"] == "sum-model" and records[2]["rpc_version"] == 3
    assert records[4]["outputs"] == ["6.0", "15.0"] and records[4]["msg_id"] == 0
    offsets = [r["offset"] for r in records]
    assert offsets[:3] == [0, 64, 107] and offsets == sorted(offsets)


def test_sample_is_what_real_sockets_send_today():
    """Re-record the exchange through real pyzmq sockets: the bytes match the bundled sample."""
    up, down = _sample_script().record(timeout_ms=5000)
    assert up == SAMPLE_CONTAINER.read_bytes()
    assert down == SAMPLE_CLIPPER.read_bytes()


def test_sample_requests_decode_to_what_was_sent():
    script = _sample_script()
    code, out, _ = run("--json", SAMPLE_CLIPPER)
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()][2:]
    sent = script.CLIPPER
    assert records[1]["inputs"] == [
        {"size": 3, "values": list(row)} for row in np.asarray(sent[1].inputs).tolist()
    ]
    assert records[2]["inputs"] == sent[2].inputs


# --- every generation, both sides -----------------------------------------------------------

DOUBLES = np.arange(6, dtype="<f8").reshape(2, 3)
CASES = {
    "2016": (
        [clipper.NewContainer("m", "7", InputType.FLOATS), clipper.PredictResponse(5, [0.5, 2.0])],
        [clipper.PredictRequest(5, InputType.DOUBLES, DOUBLES)],
    ),
    "2017": (
        [
            clipper.NewContainer("m", "v7", InputType.INTS),
            clipper.Heartbeat(),
            clipper.PredictResponse(5, ["a", "b"]),
        ],
        [
            clipper.HeartbeatReply(HeartbeatType.REQUEST_CONTAINER_METADATA),
            clipper.PredictRequest(5, InputType.INTS, [[1, 2, 3], [4]]),
        ],
    ),
    "v3": (
        [clipper.NewContainer("m", "v7", InputType.STRINGS, 3), clipper.PredictResponse(9, ["x"])],
        [clipper.PredictRequest(9, InputType.BYTES, [b"\x00\x01\x02"] * 12)],
    ),
}


@pytest.mark.parametrize("generation", sorted(CASES))
def test_every_generation_is_detected_on_both_sides(tmp_path, generation):
    to_clipper, to_container = CASES[generation]
    for socket_type, msgs, side in (
        ("DEALER", to_clipper, "container"),
        ("ROUTER", to_container, "clipper"),
    ):
        path = write(tmp_path, f"{socket_type}.bin", capture(socket_type, msgs, generation))
        code, out, err = run("--json", path)
        assert code == 0, err
        records = [json.loads(line) for line in out.splitlines()]
        assert records[1]["generation"] == generation and records[1]["side"] == side
        assert len(records) == 2 + len(msgs)
        for record in records[2:]:
            assert (record["side"], record["generation"]) == (side, generation)
        human = run(path)[1]
        assert f"Clipper generation {generation}" in human


def test_unequal_inputs_and_many_inputs_are_previewed(tmp_path):
    msgs = CASES["2017"][1] + CASES["v3"][1]
    path = write(tmp_path, "r.bin", capture("ROUTER", CASES["2017"][1], "2017"))
    code, out, _ = run(path)
    assert code == 0
    assert "INTS × 2 dtype=int32" in out and "    [1] int32[1] 4" in out
    assert "shape=" not in out.split("INTS × 2")[1].splitlines()[0]
    path = write(tmp_path, "v3.bin", capture("ROUTER", msgs[2:], "v3"))
    code, out, _ = run(path)
    assert "BYTES × 12 dtype=uint8 shape=(12, 3)" in out and "... 4 more input(s)" in out


# --- detection and --dialect ----------------------------------------------------------------


def test_undecidable_generation_asks_for_dialect(tmp_path):
    # ["", 2] is a heartbeat in both 2017 and v3: nothing tells them apart.
    path = write(tmp_path, "hb.bin", capture("DEALER", [clipper.Heartbeat()], "2017"))
    code, out, err = run(path)
    assert code == 1
    assert "clipper: generation at byte 107: cannot tell the Clipper generation" in err
    assert "give --generation" in err
    assert "@107 [container → Clipper] unknown [Malformed]" in out  # shown, marked
    code, out, _ = run("--generation", "2017", path)
    assert code == 0 and "[container → Clipper, 2017] heartbeat" in out
    assert run("--dialect", "2017", path)[:2] == (code, out)  # the old name still works


def test_dialect_override_that_does_not_fit_fails_with_offset(tmp_path):
    code, out, err = run("--dialect", "2016", SAMPLE_CLIPPER)
    assert code == 1
    assert "Clipper generation 2016" in out  # the override is reported
    assert "@107 [Clipper → container] unknown [Malformed]" in out  # shown, marked
    assert "wirekit decode: clipper: " in err and "at byte " in err
    assert "the 2016 message at byte 107" in err
    assert out.rstrip().endswith("malformed")


def test_bad_clipper_message_error_points_into_the_capture(tmp_path):
    good = capture("ROUTER", CASES["v3"][1], "v3")
    frames = clipper.encode(CASES["v3"][1][0], "v3")
    bad_frames = [frames[0], (7).to_bytes(4, "little"), *frames[2:]]  # wrong version frame
    data = good + zmtp.encode_message(bad_frames)
    path = write(tmp_path, "bad.bin", data)
    code, out, err = run("--dialect", "v3", path)
    assert code == 1
    assert out.count("[Malformed]") == 1 and "4 message(s)" in out  # then decoding went on
    at = int(err.split(" at byte ")[1].split(":")[0])
    assert data[at : at + 4] == (7).to_bytes(4, "little")  # the offset is in the capture
    assert "(frame 1 of the v3 message at byte" in err
    assert "[07]" in out  # hex excerpt with the bad byte in brackets


# --- errors ---------------------------------------------------------------------------------


def test_not_a_zmtp_file(tmp_path):
    code, out, err = run(ROOT / "samples" / "mip-session.bin")
    assert code == 1 and out.startswith("@0 unknown [Malformed]")
    assert "not a ZMTP capture" in err and "capture at byte 0" in err


def test_empty_file_has_no_messages_as_for_every_protocol(tmp_path):
    # issue 21: an empty file exited 1 for clipper and 0 for mip and y2
    empty = write(tmp_path, "empty.bin", b"")
    for proto in ("clipper", "mip", "y2"):
        out, err = io.StringIO(), io.StringIO()
        assert main(["decode", "--proto", proto, str(empty)], out, err) == 0, err.getvalue()
        assert out.getvalue() == "0 message(s), 0 bytes\n"
    code, _, err = run(write(tmp_path, "two.bin", b"xx"))
    assert code == 1 and "not a ZMTP capture" in err


def test_truncated_capture_prints_what_decoded_then_the_zmtp_error(tmp_path):
    data = SAMPLE_CONTAINER.read_bytes()[:-5]
    code, out, err = run(write(tmp_path, "cut.bin", data))
    assert code == 1
    assert out.count("predict_response") == 1
    assert f"zmtp: frame at byte {len(data)}: truncated" in err
    assert "[..end]" in out
    assert "6 message(s), " in out and out.count("[Malformed]") == 1  # 5 good, 1 cut


def test_non_clipper_socket_type(tmp_path):
    data = zmtp.encode_greeting() + zmtp.encode_ready("PUB") + zmtp.encode_message([b"x"])
    code, _, err = run(write(tmp_path, "pub.bin", data))
    assert code == 1
    assert "socket type 'PUB' is not a side of a Clipper connection" in err


@pytest.mark.parametrize("argv", [["--dialect", "2019", "x.bin"], ["/nonexistent/capture.bin"], []])
def test_usage_errors_exit_2(argv, capsys):
    assert run(*argv)[0] == 2


def test_wirekit_entry_point_subprocess():
    scripts = Path(sysconfig.get_path("scripts"))
    exe = scripts / "wirekit"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "wirekit.cli"]
    proc = subprocess.run(
        [*cmd, "decode", "--proto", "clipper", str(SAMPLE_CLIPPER)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "predict_request msg_id=1 request_type=0 STRINGS × 2" in proc.stdout
    bad = subprocess.run(
        [*cmd, "decode", "--proto", "clipper", str(ROOT / "samples" / "mip-session.bin")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1 and "not a ZMTP capture" in bad.stderr
