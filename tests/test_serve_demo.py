"""``wirekit serve --config FILE --with-backends``: the sample deployment with one command
(issue 21): its backends started, answered over HTTP and MIP, and everything stopped by one
SIGINT (as Ctrl-C) -- or by the dispatcher's death -- with no process left behind."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.ports import free_port, port_is_free
from support.process import ServerProcess

from wirekit import mip
from wirekit.mip.client import Client
from wirekit.serve.backends.local import LocalBackends, is_local, plan
from wirekit.serve.config import DEFAULT_HANDLER, ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "serve-deployment.json"
TIMEOUT = 30.0


def sample_config(tmp_path: Path) -> Path:
    """A copy of the sample in ``tmp_path`` (its store goes beside it, not into the
    checkout), the handler module beside it; where one of its ports is taken on this
    machine, with other ports."""
    doc = json.loads(SAMPLE.read_text())
    ports = [doc["listen"]["http_port"], *(m["port"] for m in doc["models"].values())]
    ports += [p for node in doc["nodes"] for p in node["ports"] if p]
    moved = {p: p if port_is_free(p) else free_port() for p in ports}
    doc["listen"]["http_port"] = moved[doc["listen"]["http_port"]]
    for m in doc["models"].values():
        m["port"] = moved[m["port"]]
    for node in doc["nodes"]:
        node["ports"] = [moved[p] if p else p for p in node["ports"]]
    copy = tmp_path / "sample" / SAMPLE.name
    copy.parent.mkdir()
    copy.write_text(json.dumps(doc))
    shutil.copy(ROOT / "samples" / "tiny_model.py", copy.parent)
    return copy


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] != "Z":
                    found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has stopped; only its exit status is left to collect


class Demo(ServerProcess):
    """The one command, in a subprocess; ``ready`` is its ready line."""

    def __init__(self, config: Path, cwd: Path, wirekit: list[str] | None = None) -> None:
        super().__init__(
            [*(wirekit or [sys.executable, "-m", "wirekit"]), "serve", "--config", str(config),
             "--with-backends", "--log-level", "info"],
            ready=None, pythonpath=[ROOT], cwd=cwd, start_timeout=TIMEOUT * 2,
            stop_timeout=TIMEOUT,
        )  # fmt: skip
        self.start()
        self.ready = json.loads(self.first_line) if self.first_line else {}

    def stop(self, sig: signal.Signals = signal.SIGINT) -> int:
        return super().stop(sig)


def post(url: str, doc: object) -> object:
    request = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        return json.loads(response.read())


def test_the_sample_runs_whole_with_one_command_and_one_ctrl_c_stops_it(tmp_path):
    config = sample_config(tmp_path)
    doc = json.loads(config.read_text())
    demo = Demo(config, cwd=tmp_path)
    try:
        assert demo.ready.get("event") == "ready", demo.log
        rows = {r.key for r in load_config(config).rows if r.quota > 0}
        assert set(demo.ready["backends"]) == rows  # five backends, one per device in use
        backends = children(demo.proc.pid)
        assert len(backends) == 5
        http = f"http://127.0.0.1:{demo.ready['http']}"
        m1 = post(f"{http}/v1/models/m1:predict", {"inputs": [["a fine day"], ["so bad"]]})
        assert [out[0]["words"] for out in m1["outputs"]] == [3, 2]
        assert {out[0]["row"] for out in m1["outputs"]} <= {"n1/0/m1", "n1/1/m1", "n2/0/m1"}
        m2 = post(f"{http}/v1/models/m2:predict", {"inputs": [["what a great day"]]})
        assert m2["outputs"][0][0]["label"] == "positive"
        clipper = post(f"{http}/sentiment/predict", {"input": "I love it"})
        assert clipper["output"]["label"] == "positive"
        assert clipper["default"] is False
        mip_m1 = f"tcp://127.0.0.1:{doc['models']['m1']['port']}"
        mip_m2 = f"tcp://127.0.0.1:{doc['models']['m2']['port']}"
        with Client(mip_m1, timeout=TIMEOUT) as client:
            assert client.ping() >= 0
        with Client(mip_m2, timeout=TIMEOUT) as client:
            (answer,) = client.infer_one(mip.Item.text("a bad day"))
        assert answer.as_json()["label"] == "negative"
        assert answer.as_json()["row"] in {"n1/0/m2", "n1/2/m2"}
        assert demo.stop(signal.SIGINT) == 0
        log = demo.log
        assert "SIGINT received" in log
        assert log.index("wirekit serve: stopped") < log.index("backends stopped")
        assert not [pid for pid in backends if alive(pid)]
        for address in demo.ready["backends"].values():
            host, port = address.removeprefix("tcp://").rsplit(":", 1)
            with pytest.raises(OSError), socket.create_connection((host, int(port)), 5):
                pass
        assert (config.parent / "requests.db").is_file()  # the store is beside the config
    finally:
        demo.close()


def test_backends_run_on_the_dispatchers_wirekit_not_a_source_tree_beside_them(tmp_path):
    # `pip install .` then `wirekit serve --with-backends` from the checkout: the backends
    # were `python -m wirekit` in the checkout, which imports its uncompiled ./wirekit tree
    # (the pure path, a FastPathMissing warning each) instead of the installed package.
    # Here the folder the command runs in has a wirekit tree that must not be imported.
    shadow = tmp_path / "wirekit"
    shadow.mkdir()
    (shadow / "__init__.py").write_text(
        "raise SystemExit('the wirekit tree of the working directory was imported')\n"
    )
    config = sample_config(tmp_path)
    console_script = Path(sys.executable).with_name("wirekit")  # as a user runs it
    demo = Demo(config, cwd=tmp_path, wirekit=[str(console_script)])
    try:
        assert demo.ready.get("event") == "ready", demo.log
        http = f"http://127.0.0.1:{demo.ready['http']}"
        m1 = post(f"{http}/v1/models/m1:predict", {"inputs": [["one two"]]})
        assert m1["outputs"][0][0]["words"] == 2  # tiny_model, found beside the config
        assert demo.stop(signal.SIGINT) == 0
        assert "working directory was imported" not in demo.log
    finally:
        demo.close()


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_no_backend_outlives_a_killed_dispatcher(tmp_path):
    config = tmp_path / "d.json"
    ports = [free_port(), free_port()]
    config.write_text(json.dumps({
        "listen": {"http_port": 0},
        "store": {"path": str(tmp_path / "r.db")},
        "models": {"m": {"port": 0}},
        "nodes": [{"id": "n", "devices": ["CPU", "CPU"], "models": ["m"],
                   "quotas": [0.5, 0.5], "ports": ports}],
    }))  # fmt: skip
    demo = Demo(config, cwd=tmp_path)
    try:
        assert demo.ready.get("event") == "ready", demo.log
        backends = children(demo.proc.pid)
        assert len(backends) == 2
        demo.stop(signal.SIGKILL)  # no chance to stop anything itself
        deadline = time.monotonic() + TIMEOUT
        while any(alive(pid) for pid in backends) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in backends if alive(pid)]
    finally:
        demo.close()


def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30
    )
    return done.returncode == 0


@pytest.mark.skipif(sys.platform != "linux", reason="PID namespaces are Linux's")
def test_the_dispatcher_as_pid_1_of_a_container(tmp_path):
    # In a container the dispatcher is PID 1: its backends' parent is then PID 1 from the
    # start, which the parent-death check took for "the parent has died" (they stopped
    # themselves before listening).
    if not _can_unshare():
        pytest.skip("cannot create a PID namespace here (unshare)")
    config = tmp_path / "d.json"
    config.write_text(json.dumps({
        "listen": {"http_port": 0},
        "store": {"path": str(tmp_path / "r.db")},
        "models": {"m": {"port": 0}},
        "nodes": [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1],
                   "ports": [free_port()]}],
    }))  # fmt: skip
    command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM",
               sys.executable, "-m", "wirekit", "serve", "--config", str(config),
               "--with-backends"]  # fmt: skip
    with ServerProcess(
        command, ready=None, pythonpath=[ROOT], cwd=tmp_path, start_timeout=TIMEOUT * 2,
        stop_timeout=TIMEOUT,
    ) as proc:  # fmt: skip
        ready = json.loads(proc.first_line) if proc.first_line else {}
        if ready.get("event") != "ready":
            proc.stop(signal.SIGKILL)
            pytest.fail(f"not ready: {proc.log}")
        http = f"http://127.0.0.1:{ready['http']}"
        assert post(f"{http}/v1/models/m:predict", {"inputs": [["pid 1"]]}) == {
            "outputs": [["pid 1"]],
        }  # fmt: skip
        # unshare ignores SIGTERM while it waits; when it dies, --kill-child sends SIGTERM to
        # the dispatcher, which stops its backends (its stderr ends when it has exited)
        proc.stop(signal.SIGKILL)
        err = proc.log
        assert "SIGTERM received" in err
        assert "backends stopped" in err


def test_a_backend_that_cannot_listen_stops_the_command_and_the_others(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    free = free_port()
    config = tmp_path / "d.json"
    config.write_text(json.dumps({
        "listen": {"http_port": 0},
        "store": {"path": str(tmp_path / "r.db")},
        "models": {"m": {"port": 0}},
        "nodes": [{"id": "n", "devices": ["CPU", "CPU"], "models": ["m"], "quotas": [0.5, 0.5],
                   "ports": [free, taken.getsockname()[1]]}],
    }))  # fmt: skip
    try:
        demo = Demo(config, cwd=tmp_path)
        try:
            assert demo.proc.wait(TIMEOUT) == 1
            log = demo.log
            port = taken.getsockname()[1]
            said = f"wirekit serve: backend tcp://127.0.0.1:{port} (n/1/m) exited with status"
            assert said in log
            assert demo.ready == {}
            assert port_is_free(free)  # the one that had started was stopped
        finally:
            demo.close()
    finally:
        taken.close()


CHATTY = """
def handler(batch):
    print("chatty: " + "x" * 100_000)  # more than a pipe holds, at every request
    print("chatty: no newline at the end", end="")
    return batch
"""


def test_a_handler_that_prints_beside_the_config_keeps_answering(tmp_path):
    # A backend's standard output is read for as long as it runs (and passed on to the
    # dispatcher's stderr): a handler printing more than a pipe holds does not block.
    (tmp_path / "chatty.py").write_text(CHATTY)  # found: the config's directory is on the path
    config = tmp_path / "d.json"
    config.write_text(json.dumps({
        "listen": {"http_port": 0},
        "store": {"path": str(tmp_path / "r.db")},
        "models": {"m": {"port": 0, "handler": "chatty:handler"}},
        "nodes": [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1],
                   "ports": [free_port()]}],
    }))  # fmt: skip
    demo = Demo(config, cwd=ROOT)
    try:
        assert demo.ready.get("event") == "ready", demo.log
        http = f"http://127.0.0.1:{demo.ready['http']}"
        for i in range(3):
            answer = post(f"{http}/v1/models/m:predict", {"inputs": [[f"hello {i}"]]})
            assert answer["outputs"] == [[f"hello {i}"]]
        assert demo.stop() == 0
        log = demo.log
        # all of it (a line longer than MAX_LINE may come in pieces)
        assert sum(len(run) for run in re.findall("x{1000,}", log)) == 3 * 100_000
        assert "chatty: no newline at the end" in log
    finally:
        demo.close()


def _doc(**node) -> dict:
    base = {"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [9101]}
    return {"models": {"m": {}}, "nodes": [{**base, **node}]}


def test_what_with_backends_starts():
    dep = parse_config(_doc(devices=["CPU", "CPU", "GPU"], quotas=[0.5, 0, 1],
                            ports=[9101, None, 9101]))  # fmt: skip
    (backend,) = plan(dep)  # two rows on one port share one backend; quota 0 has none
    assert backend.rows == ("n/0/m", "n/2/m")
    assert backend.address == "tcp://127.0.0.1:9101"
    assert backend.handler == DEFAULT_HANDLER
    assert LocalBackends(dep).addresses() == {
        "n/0/m": "tcp://127.0.0.1:9101",
        "n/2/m": "tcp://127.0.0.1:9101",
    }
    with pytest.raises(ConfigError, match=r"n/0/m: .*'10\.1\.2\.3' is not a loopback address"):
        plan(parse_config(_doc(endpoint="10.1.2.3")))
    clipper = _doc(ports=[None])
    clipper["models"]["m"] = {"backend": "clipper"}
    with pytest.raises(ConfigError, match="Clipper containers connect to the dispatcher"):
        plan(parse_config(clipper))
    assert all(is_local(h) for h in ("localhost", "127.0.0.1", "127.8.0.1", "::1", "0.0.0.0"))
    assert not any(is_local(h) for h in ("10.0.0.1", "example.org", "::ffff:10.0.0.1"))


def test_a_handler_in_the_config_is_module_colon_function():
    doc = _doc()
    doc["models"]["m"] = {"handler": "pkg.mod:fn"}
    assert parse_config(doc).models["m"].handler == "pkg.mod:fn"
    doc["models"]["m"] = {"handler": "pkg.mod"}
    with pytest.raises(ConfigError, match=r"models\.m\.handler: expected module:function"):
        parse_config(doc)
    doc["models"]["m"] = {"handler": 3}
    with pytest.raises(ConfigError, match=r"models\.m\.handler: expected a non-empty string"):
        parse_config(doc)
