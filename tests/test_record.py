"""Captures made on loopback between real peers, then decoded: ``wirekit record`` and tcpdump.

``wirekit record`` runs as a real process between KubeMo's client and server, between a raw
socket sending malformed MIP and wirekit's MIP server, and between wirekit's Clipper container
and frontend.  tcpdump is used where it can run (root); under CI (``CI=true``) a missing
tcpdump is a failure, not a skip.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import kubemo
from capture_tools import tcpdump
from clipper_support import cli_env, clipper_process, frontend_process, stop_processes
from mip_net import KubemoServer, kubemo_echo

from wirekit import mip
from wirekit.cli import main
from wirekit.mip.client import Client
from wirekit.mip.server import ServerThread

TESTS = Path(__file__).resolve().parent
WAIT = 20.0


def decode_json(path, *extra):
    out, err = io.StringIO(), io.StringIO()
    code = main(["decode", "--json", *extra, str(path)], out=out, err=err)
    return code, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


@contextlib.contextmanager
def recorder(target: tuple[str, int], path: Path, *extra: str):
    """``wirekit record`` as a process; yields the port it listens on; stops it with SIGTERM."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wirekit.cli", "record", "--listen", "127.0.0.1:0",
         "--target", f"{target[0]}:{target[1]}", "-w", str(path), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("recording 127.0.0.1:"), line + proc.stderr.read()
        yield int(line.split()[1].rsplit(":", 1)[1])
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(3)  # with --connections it stops by itself once they have closed
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert "connection(s) recorded" in out


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_record_kubemo_client_and_server(tmp_path):
    cap = tmp_path / "kubemo.pcapng"
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(KubemoServer(kubemo_echo))
        target = ("127.0.0.1", _port(server.address))
        port = stack.enter_context(recorder(target, cap, "--connections", "2"))
        address = f"tcp://127.0.0.1:{port}"
        assert kubemo.Client().ping(address) > 0
        batch = tuple(
            (kubemo.Text(f"sample {k}"), kubemo.Json(io.BytesIO(b'{"k": %d}' % k)))
            for k in range(2)
        )
        outputs = kubemo.Client().inference(address, batch)
        assert outputs[1][0].decode() == "sample 1"
    code, recs, err = decode_json(cap)
    assert code == 0, err
    kinds = [(r["conn"], r["dir"], r["kind"]) for r in recs]
    assert kinds == [(1, "C>S", "ping"), (1, "S>C", "ping"),
                     (2, "C>S", "inference"), (2, "S>C", "inference")]  # fmt: skip
    request, response = recs[2], recs[3]
    assert [i["text"] for i in request["items"]] == ["sample 0", '{"k": 0}', "sample 1",
                                                     '{"k": 1}']  # fmt: skip
    assert response["reply_to"] == request["number"] and response["latency_ms"] > 0
    assert recs[1]["reply_to"] == recs[0]["number"]


def echo(batch):
    return [list(sample) for sample in batch]


def test_record_malformed_requests_to_wirekit_server(tmp_path):
    """The issue's session: bad version, unknown kind, mis-typed ping; each answered."""
    cap = tmp_path / "bad.pcapng"
    bad = [b"\x07\x01\x00\x00\x00\x00\x00\x00", b"\x00\x09\x00\x00\x00\x00\x00\x00",
           b"\x00\x01\x00\x00\x00\x00\x00\x04abcd"]  # fmt: skip
    with contextlib.ExitStack() as stack:
        running = stack.enter_context(ServerThread(echo, "tcp://127.0.0.1:0"))
        target = ("127.0.0.1", _port(running.address))
        port = stack.enter_context(recorder(target, cap, "--connections", "4"))
        for wire in bad:
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
                sock.sendall(mip.encode(mip.Ping()) + wire)
                got = b""
                while len(got) < 16:
                    chunk = sock.recv(64)
                    if not chunk:
                        break
                    got += chunk
                assert len(got) >= 16
        with Client(f"tcp://127.0.0.1:{port}") as client:
            client.infer([[mip.Item.text("ok")]])
    code, recs, _ = decode_json(cap)
    assert code == 1  # malformed messages in the capture
    malformed = [r for r in recs if "malformed" in r]
    assert [m["malformed"]["field"] for m in malformed] == ["version", "kind", "remaining"]
    replies = {r["reply_to"]: r for r in recs if r["dir"] == "S>C"}
    assert [replies[m["number"]]["code_name"] for m in malformed] == [
        "PROTOCOL", "METHOD", "SHAPE"]  # fmt: skip
    assert recs[-1]["kind"] == "inference" and recs[-1]["items"][0]["text"] == "ok"


def test_record_clipper_container_and_frontend(tmp_path):
    cap = tmp_path / "clipper.pcapng"
    fe, rpc, query = frontend_process("--activity-timeout", "5")
    procs = [fe]
    try:
        host, fe_port = rpc.removeprefix("tcp://").rsplit(":", 1)
        with recorder((host, int(fe_port)), cap, "--connections", "1") as port:
            env = cli_env(
                CLIPPER_MODEL_NAME="m",
                CLIPPER_MODEL_VERSION="7",
                CLIPPER_INPUT_TYPE="doubles",
                CLIPPER_PORT=str(port),
            )
            con = clipper_process(
                "container", "--model", "clipper_models:describe", "--poll-interval", "0.1",
                env=env, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            procs.append(con)
            deadline = time.monotonic() + WAIT
            while True:
                out, err = io.StringIO(), io.StringIO()
                code = main(["clipper", "predict", "--model", "m", "--frontend", query,
                             "--doubles", "1,2", "--timeout", "2"], out=out, err=err)  # fmt: skip
                if code == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert code == 0, err.getvalue()
            con.send_signal(signal.SIGTERM)
            con.wait(WAIT)
    finally:
        stop_processes(*procs)
    code, recs, err = decode_json(cap)
    assert code == 0, err
    kinds = [r["kind"] for r in recs]
    assert "new_container" in kinds and "predict_request" in kinds
    (request,) = [r for r in recs if r["kind"] == "predict_request"]
    (response,) = [r for r in recs if r["kind"] == "predict_response"]
    assert request["dir"] == "S>C" and response["dir"] == "C>S"  # Clipper asks the container
    assert response["reply_to"] == request["number"] and response["latency_ms"] > 0
    assert request["inputs"][0]["values"] == [1.0, 2.0]
    assert recs[0]["kind"] == "zmtp_greeting"


# --- tcpdump ---------------------------------------------------------------------------------


def test_tcpdump_capture_of_mip_traffic(tmp_path):
    cap = tmp_path / "dump.pcap"
    with ServerThread(echo, "tcp://127.0.0.1:0") as running, tcpdump(_port(running.address), cap):
        with Client(running.address) as client:
            client.ping()
            client.infer([[mip.Item.text("via tcpdump")]])
        # tcpdump writes each packet once it sees it (-U): until the reply is in the file
        deadline = time.monotonic() + WAIT
        while not any(r["kind"] == "inference" and r["dir"] == "S>C" for r in
                      decode_json(cap)[1]):  # fmt: skip
            assert time.monotonic() < deadline, "tcpdump did not write the reply"
            time.sleep(0.05)
    code, recs, err = decode_json(cap)
    assert code == 0, err
    last = max(r["conn"] for r in recs)  # the knocks before are connections without data
    recs = [r for r in recs if r["conn"] == last]
    assert [(r["dir"], r["kind"]) for r in recs] == [
        ("C>S", "ping"),
        ("S>C", "ping"),
        ("C>S", "inference"),
        ("S>C", "inference"),
    ]
    assert recs[2]["items"][0]["text"] == "via tcpdump"
    assert recs[3]["reply_to"] == recs[2]["number"]


def test_record_without_a_limit_stops_on_sigterm_with_a_complete_file(tmp_path):
    cap = tmp_path / "open.pcapng"
    with contextlib.ExitStack() as stack:
        running = stack.enter_context(ServerThread(echo, "tcp://127.0.0.1:0"))
        port = stack.enter_context(recorder(("127.0.0.1", _port(running.address)), cap))
        with Client(f"tcp://127.0.0.1:{port}") as client:
            client.ping()
    code, recs, _ = decode_json(cap)
    assert code == 0 and [r["kind"] for r in recs] == ["ping", "ping"]
