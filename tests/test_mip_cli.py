"""``wirekit mip serve|ping|infer``: in-process for the clients, a subprocess for serve."""

from __future__ import annotations

import io
import json

import pytest
from mip_net import CliServer, png_bytes

from wirekit.cli import main
from wirekit.mip import Item
from wirekit.mip.client import Client
from wirekit.mip.server import ServerThread


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out, err)
    return status, out.getvalue(), err.getvalue()


def test_ping_and_infer_commands(tmp_path):
    image = tmp_path / "dot.png"
    image.write_bytes(png_bytes())
    with ServerThread(lambda batch: batch) as running:
        status, out, _ = run("mip", "ping", running.address, "--count", "2")
        assert status == 0 and out.count(f"pong from {running.address}") == 2
        status, out, err = run(
            "mip", "infer", running.address,
            "--text", "héllo", "--json-item", '{"k": [1, 2]}', "--image", str(image),
            "--item", "9:0a0b",
        )  # fmt: skip
        assert status == 0, err
        lines = out.splitlines()
        assert lines[:2] == ["[0][0] TEXT héllo", '[0][1] JSON {"k": [1, 2]}']
        assert lines[2].startswith(f"[0][2] IMAGE {image.stat().st_size} bytes 89504e47")
        assert lines[3] == "[0][3] TYPE9 2 bytes 0a0b"
        status, out, _ = run(
            "mip", "infer", running.address, "--json-item", "[1]", "--batch", "2", "--json"
        )
        assert status == 0
        assert json.loads(out) == [[{"type": 2, "type_name": "JSON", "json": [1]}]] * 2
        # the old name of --json still works; --json no longer takes an input (exit 2, loud)
        old = run("mip", "infer", running.address, "--json-item", "[1]", "--print-json")
        assert old[0] == 0
        assert json.loads(old[1]) == [[{"type": 2, "type_name": "JSON", "json": [1]}]]
        assert run("mip", "infer", running.address, "--json", '{"k": 1}')[0] == 2


def test_infer_and_decode_label_items_alike(tmp_path):
    # one vocabulary: [sample][item] in `mip infer` and in `decode`
    with ServerThread(lambda batch: batch) as running:
        status, out, _ = run("mip", "infer", running.address, "--text", "a", "--text", "b",
                             "--batch", "2")  # fmt: skip
    assert status == 0
    infer_labels = [line.split()[0] for line in out.splitlines()]
    assert infer_labels == ["[0][0]", "[0][1]", "[1][0]", "[1][1]"]
    from wirekit.mip import Inference, Item, encode

    wire = encode(Inference.request([[Item.text("a"), Item.text("b")]] * 2))
    (tmp_path / "m.bin").write_bytes(wire)
    status, out, _ = run("decode", "--proto", "mip", str(tmp_path / "m.bin"))
    assert status == 0
    assert [ln.split()[0] for ln in out.splitlines() if ln.startswith("    [")] == infer_labels


def test_client_command_failures():
    assert run("mip", "infer", "tcp://127.0.0.1:1")[0] == 2  # no inputs
    assert run("mip", "infer", "tcp://127.0.0.1:1", "--json-item", "{nope")[0] == 2
    status, _, err = run("mip", "ping", "tcp://127.0.0.1:1", "--timeout", "2")
    assert status == 1 and "cannot connect" in err
    status, _, err = run("mip", "ping", "ftp://x")  # a bad address: usage, as everywhere
    assert status == 2 and "scheme" in err
    with ServerThread(lambda batch: 1 / 0) as running:
        status, _, err = run("mip", "infer", running.address, "--text", "x")
    assert status == 1 and "INTERNAL" in err


def test_serve_command_serves_tcp_and_unix_and_stops_on_sigterm(tmp_path):
    sock = tmp_path / "mip.sock"
    with CliServer(
        "--listen", "tcp://127.0.0.1:0", "--listen", f"unix://{sock}",
        handler="mip_handlers:reverse_sync",
    ) as server:  # fmt: skip
        with Client(server.address) as client:
            assert client.infer([["abc"]]) == [(Item.text("cba"),)]
        with Client(f"unix://{sock}") as client:
            assert client.ping() > 0
        status, log = server.stop(), server.log
    assert status == 0
    assert f"listening on unix://{sock}" in log and "stopped" in log
    assert not sock.exists()


def test_serve_command_reports_a_bad_handler():
    status, _, err = run("mip", "serve", "--handler", "no_such_module_xyz:fn")
    assert status == 2 and "no_such_module_xyz" in err
    status, _, err = run("mip", "serve", "--handler", "nocolon")
    assert status == 2 and "package.module:function" in err


def test_a_handler_module_in_the_current_directory_is_found(tmp_path):
    # As uvicorn and gunicorn do: `--handler mymod:fn` finds ./mymod.py with no PYTHONPATH.
    # The console script (not `python -m`, which would put the directory on the path itself).
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "shout_handler.py").write_text(
        "def shout(batch):\n    return [[i.as_text().upper() for i in s] for s in batch]\n"
    )
    script = Path(sys.executable).with_name("wirekit")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [str(script), "mip", "serve", "--handler", "shout_handler:shout",
         "--listen", "tcp://127.0.0.1:0"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), (line, proc.stderr.read() if proc.poll() else "")
        with Client(line.split()[-1], timeout=10) as client:
            assert client.infer([["hi"]])[0][0].as_text() == "HI"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_log_level_takes_either_case_in_both_servers():
    from wirekit.cli import build_parser

    parser = build_parser()
    for argv in (["mip", "serve", "--handler", "m:f"], ["serve"]):
        for level in ("INFO", "info", "Info"):
            assert parser.parse_args([*argv, "--log-level", level]).log_level == "info"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["serve", "--log-level", "loud"])
    assert exc.value.code == 2


def test_ping_ends_with_a_summary_and_counts_lost_pings():
    import re
    import socket

    with ServerThread(lambda batch: batch) as running:
        status, out, _ = run("mip", "ping", running.address, "--count", "3")
    assert status == 0
    lines = out.splitlines()
    assert lines[-2] == f"--- {running.address} ping statistics ---"
    assert re.fullmatch(
        r"3 sent, 3 received, 0% loss, rtt min/avg/max = [\d.]+/[\d.]+/[\d.]+ ms", lines[-1]
    ), lines[-1]
    # A listener that accepts and never answers: every ping is lost, exit 1.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        status, out, err = run("mip", "ping", address, "--count", "2", "--timeout", "0.2")
    assert status == 1
    assert out.splitlines()[-1] == "2 sent, 0 received, 100% loss"
    assert err.count("no pong") == 2


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("def broken(:\n", "syntax error at"),
        ("raise RuntimeError('needs a GPU')\n", "RuntimeError: needs a GPU"),
        ("x = 1\n", "has no handle"),
    ],
)
def test_a_handler_that_cannot_load_is_one_line_and_exit_2(tmp_path, source, said):
    """A handler file with a syntax error, one whose import raises, or without the function:
    one line naming the module (and the file and line of a syntax error), exit 2 -- as for a
    missing module -- in ``mip serve`` and ``clipper container`` alike (it was an import
    traceback, exit 1)."""
    import subprocess
    import sys

    (tmp_path / "user_model.py").write_text(source)
    for argv in (
        ["mip", "serve", "--handler", "user_model:handle", "--listen", "tcp://127.0.0.1:0"],
        ["clipper", "container", "--model", "user_model:handle", "--name", "m"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "wirekit", *argv],
            cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert said in proc.stderr and "user_model" in proc.stderr
        if "syntax" in said:
            assert "user_model.py:1" in proc.stderr
