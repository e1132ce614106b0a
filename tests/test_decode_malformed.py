"""Every malformed-message vector of ``specs/vectors`` is shown by ``wirekit decode``, marked
with its field, and decoding goes on with the next message wherever the framing allows."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from wirekit import clipper, mip, y2, zmtp
from wirekit.cli import main

VECTORS = Path(__file__).resolve().parent.parent / "specs" / "vectors"


def decode(data: bytes, tmp_path, *extra):
    path = tmp_path / "in.bin"
    path.write_bytes(data)
    out, err = io.StringIO(), io.StringIO()
    code = main(["decode", "--json", *extra, str(path)], out=out, err=err)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def _bad(proto):
    return sorted(p.stem for p in (VECTORS / proto).glob("bad-*.json"))


@pytest.mark.parametrize("name", _bad("mip"))
def test_mip_bad_vector_is_shown_then_decoding_goes_on(name, tmp_path):
    bad = (VECTORS / "mip" / f"{name}.bin").read_bytes()
    field = json.loads((VECTORS / "mip" / f"{name}.json").read_text())["error"]["field"]
    ping = mip.encode(mip.Ping())
    truncated = field == "payload"  # the header announces more than the vector holds
    data = ping + bad if truncated else ping + bad + ping
    code, recs = decode(data, tmp_path, "--proto", "mip")
    assert code == 1
    assert [r.get("malformed", {}).get("field") for r in recs] == (
        [None, field] if truncated else [None, field, None]
    )
    assert recs[1]["offset"] == 8 and recs[1]["malformed"]["offset"] == 8 + json.loads(
        (VECTORS / "mip" / f"{name}.json").read_text())["error"]["offset"]  # fmt: skip
    assert bytes.fromhex(recs[1]["data_hex"]) == bad


@pytest.mark.parametrize("name", _bad("y2"))
def test_y2_bad_vector_is_shown_then_decoding_goes_on(name, tmp_path):
    if name == "bad-trailing":
        pytest.skip("bytes after a message are the next message in a stream (decode() only)")
    bad = (VECTORS / "y2" / f"{name}.bin").read_bytes()
    error = json.loads((VECTORS / "y2" / f"{name}.json").read_text())["error"]
    fin = y2.encode(y2.Finished())
    truncated = error["field"] in ("payload", "handshake")
    data = fin + bad if truncated else fin + bad + fin
    code, recs = decode(data, tmp_path, "--proto", "y2")
    assert code == 1
    shown = [r for r in recs if r.get("kind") != "note"]
    assert shown[0]["kind"] == "finished"
    assert shown[1]["malformed"]["field"] == error["field"]
    assert shown[1]["malformed"]["offset"] == 8 + error["offset"]
    if not truncated:
        assert shown[-1]["kind"] == "finished" and shown[-1]["offset"] == 8 + len(bad)
    if name == "bad-negative-size":  # no size to skip by: framing lost, then resynchronised
        assert "framing lost" in shown[1]["note"]


def _clipper_capture(vector: dict, good: dict) -> bytes:
    socket_type = "DEALER" if vector["direction"] == "to_clipper" else "ROUTER"
    frames = [bytes.fromhex(f) for f in vector["frames_hex"]]
    good_frames = [bytes.fromhex(f) for f in good["frames_hex"]]
    return (zmtp.encode_greeting() + zmtp.encode_ready(socket_type)
            + zmtp.encode_message(frames) + zmtp.encode_message(good_frames))  # fmt: skip


@pytest.mark.parametrize("name", _bad("clipper"))
def test_clipper_bad_vector_is_shown_then_decoding_goes_on(name, tmp_path):
    vector = json.loads((VECTORS / "clipper" / f"{name}.json").read_text())
    good = next(
        v for v in (json.loads(p.read_text()) for p in sorted((VECTORS / "clipper").glob("*.json"))
                    if not p.name.startswith("bad-"))
        if v["generation"] == vector["generation"] and v["direction"] == vector["direction"]
    )  # fmt: skip
    data = _clipper_capture(vector, good)
    code, recs = decode(data, tmp_path, "--proto", "clipper", "--dialect", vector["generation"])
    assert code == 1
    assert [r["kind"] for r in recs[:2]] == ["zmtp_greeting", "zmtp_ready"]
    assert recs[2]["malformed"]["field"] == vector["error"]["field"]
    assert recs[3]["kind"] == good["message"]["kind"] and "malformed" not in recs[3]


@pytest.mark.parametrize("name", _bad("zmtp"))
def test_zmtp_bad_vector_is_shown_with_the_events_before_it(name, tmp_path):
    """ZMTP framing has nothing to resynchronise on: the error ends that direction, shown."""
    vector = json.loads((VECTORS / "zmtp" / f"{name}.json").read_text())
    data = (VECTORS / "zmtp" / f"{name}.bin").read_bytes()
    code, recs = decode(data, tmp_path, "--proto", "clipper", "--dialect", "v3")
    assert code == 1
    bad = [r for r in recs if "malformed" in r]
    if name in ("bad-signature", "bad-version-2"):  # not a ZMTP 3 capture at all
        assert [b["malformed"]["field"] for b in bad] == ["capture"]
        return
    bad = [b for b in bad if b["malformed"]["protocol"] == "zmtp"]  # ("ok" is no Clipper msg)
    assert len(bad) == 1
    assert bad[0]["malformed"]["field"] == vector["error"]["field"]
    assert bad[0]["malformed"]["offset"] == vector["error"]["offset"]
    handshake = [r for r in recs if r["kind"] in ("zmtp_greeting", "zmtp_ready")]
    expected = [e for e in vector.get("events", []) if e["kind"] in ("greeting", "ready")]
    assert len(handshake) == len(expected)


def test_exit_status_zero_when_nothing_is_malformed(tmp_path):
    code, recs = decode(mip.encode(mip.Ping()) * 3, tmp_path)
    assert code == 0 and len(recs) == 3


def test_clipper_generation_is_detected_across_streaming_chunks(tmp_path):
    """Messages before the one that tells the generation are held, then decoded."""
    hb, reg = (json.loads((VECTORS / "clipper" / f"v3-{n}.json").read_text())
               for n in ("heartbeat", "registration"))  # fmt: skip
    assert clipper.detect([bytes.fromhex(f) for f in hb["frames_hex"]], "to_clipper") is None
    data = zmtp.encode_greeting() + zmtp.encode_ready("DEALER")
    for v in (hb, reg):
        data += zmtp.encode_message([bytes.fromhex(f) for f in v["frames_hex"]])
    code, recs = decode(data, tmp_path, "--proto", "clipper")
    assert code == 0
    assert [r["kind"] for r in recs] == ["zmtp_greeting", "zmtp_ready", "heartbeat",
                                         "new_container"]  # fmt: skip
    assert recs[1]["generation"] == "v3"
