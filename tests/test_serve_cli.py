"""``wirekit serve check`` and ``wirekit serve stats`` (the run itself: test_serve_faults)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

from serve_support import ROOT

from wirekit.cli import main
from wirekit.serve.record.store import RequestStore, connect


def call(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def test_check_prints_rows_and_probabilities():
    code, out, err = call("serve", "check", "--config", str(ROOT / "samples/serve-deployment.json"))
    assert code == 0, err
    assert "n1/1/m1" in out and "P=0.400" in out and "disabled" in out
    # --config before the subcommand means the same (issue 21)
    sample = str(ROOT / "samples/serve-deployment.json")
    assert call("serve", "--config", sample, "check") == (code, out, err)
    code, _, err = call("serve", "check")
    assert code == 2 and err == "wirekit serve check: give --config FILE\n"


def test_bad_config_exits_1_naming_the_value(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "nodes": [
                    {"id": "n", "devices": ["GPU"], "models": ["m"], "quotas": [0.5], "ports": [1]}
                ]
            }
        )
    )
    for argv in (("serve", "check", "--config", str(bad)), ("serve", "--config", str(bad))):
        code, _out, err = call(*argv)
        assert code == 1
        assert "bad.json: nodes[0].quotas[0]: a GPU is given 0 or 1 of itself, got 0.5" in err
    assert call("serve")[0] == 2


def test_journal_keeps_exact_times_and_odd_names(tmp_path):
    """Journal records round-trip exactly: any float time, names needing JSON escapes,
    deferred records written by write_journal()."""
    import asyncio

    path = tmp_path / "k.db"
    store = RequestStore(path, flush_interval=60)
    t_in, t_out = 1763789012.1234567, 1763789012.1234567 + (0.1 + 0.2)
    model, client, device = 'm "quoted"\\ é', "mip:127.0.0.1:5\n", "n/0/m é"

    async def crash_before_handoff():
        store.open()
        store.arrival("r1", model, client, t_in, 3)
        store.completion(
            "r1",
            device,
            t_out,
            "ok",
            2,
            model=model,
            client=client,
            time_in=t_in,
            size=3,
            defer=True,
        )
        store.write_journal()

    asyncio.run(crash_before_handoff())
    again = RequestStore(path)
    again.open()
    assert again.replayed_at_open == 1
    again.close()
    conn = connect(path)
    rows = conn.execute(
        "SELECT id, model, client, device, time_in, time_out, status, attempts FROM requests"
    ).fetchall()
    conn.close()
    assert rows == [("r1", model, client, device, t_in, t_out, "ok", 2)]


_WITHOUT_EXTRA = """
import sys
sys.modules["aiohttp"] = None  # as after `pip install .` without the serve extra
from wirekit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def without_serve_extra(*argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRA, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    return done.returncode, done.stdout, done.stderr


def test_serve_without_the_serve_extra_names_it_in_one_line_and_exits_2(tmp_path):
    """Issue 14 defect 3: the quick start's install died with a ModuleNotFoundError
    traceback; now one line names the extra to install."""
    config = str(ROOT / "samples/serve-deployment.json")
    code, out, err = without_serve_extra("serve", "--config", config)
    assert code == 2
    assert err == (
        "wirekit serve: needs the 'serve' extra (aiohttp is not installed): "
        "pip install 'wirekit[serve]'\n"
    )
    assert out == ""
    code, out, err = without_serve_extra("serve", "check", "--config", config)  # still works
    assert code == 0, err
    assert "n1/1/m1" in out
    store = tmp_path / "s.db"
    opened = RequestStore(store)
    opened.open()
    opened.close()
    code, out, err = without_serve_extra("serve", "stats", "--store", str(store))
    assert code == 0, err


def test_serve_logs_its_shutdown(tmp_path):
    # issue 21: the dispatcher says why it stops and that it stopped
    import signal

    from serve_support import deployment

    config = tmp_path / "d.json"
    config.write_text(json.dumps(deployment(
        tmp_path / "r.db", {"m": {}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [9]}],
    )))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "wirekit.cli", "serve", "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert json.loads(proc.stdout.readline())["event"] == "ready"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    # nothing listens on port 9 here: said at start
    assert "wirekit serve: backend of n/0/m cannot be reached now" in err
    assert "wirekit serve: SIGTERM received; stopping" in err
    assert err.rstrip().endswith("wirekit serve: stopped")


def test_check_probe_tries_every_backend(tmp_path):
    import socket

    from serve_support import deployment

    with socket.create_server(("127.0.0.1", 0)) as listening:
        free = socket.create_server(("127.0.0.1", 0))
        closed_port = free.getsockname()[1]
        free.close()  # nothing listens there any more
        config = tmp_path / "d.json"
        config.write_text(json.dumps(deployment(
            tmp_path / "r.db", {"m": {}},
            [{"id": "n", "devices": ["CPU", "CPU"], "models": ["m"], "quotas": [0.5, 0.5],
              "ports": [listening.getsockname()[1], closed_port]}],
        )))  # fmt: skip
        code, out, err = call("serve", "check", "--config", str(config), "--probe")
    assert code == 1, err
    assert "probe n/0/m: reachable" in out
    assert "probe n/1/m: UNREACHABLE: " in out
    code, out, _ = call("serve", "check", "--config", str(config))
    assert code == 0 and "probe" not in out


def test_a_store_in_a_missing_directory_is_one_line_naming_it(tmp_path):
    """``store.path`` in a directory that does not exist: one line naming the directory, not
    sqlite3's "unable to open database file" traceback."""
    missing = tmp_path / "no" / "such" / "dir"
    config = tmp_path / "d.json"
    config.write_text(
        json.dumps(
            {
                "listen": {"host": "127.0.0.1", "http_port": 0},
                "store": {"path": str(missing / "requests.db")},
                "models": {"m": {"port": 0}},
                "nodes": [
                    {
                        "id": "n",
                        "endpoint": "127.0.0.1",
                        "devices": ["CPU"],
                        "models": ["m"],
                        "quotas": [1],
                        "ports": [1],
                    }
                ],
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "wirekit", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert f"{missing}' does not exist" in proc.stderr
