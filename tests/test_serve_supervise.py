"""``wirekit serve --with-backends`` supervises the backends it started (issue 38, item 9): a
backend that exits is logged once (WARNING, with its exit status or signal), reaped (no
zombie), started again on its port after a back-off that grows while it keeps dying, and
``/readyz`` says so meanwhile; a stop still stops everything, a pending restart included.

One real dispatcher with two backends (devices ``n/0`` and ``n/1`` of model ``m``) serves
the module; the handler beside its config holds its import while a ``hold-DEVICE`` file is
there, and exits at once while a ``die-DEVICE`` file is, so a test chooses what a restarted
backend does.  Every wait is bounded and event-driven (a log line, a state), never a
measured time's verdict."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from serve_support import DispatcherProcess, deployment
from support.ports import free_port

from wirekit.serve.backends.local import exit_text

T = TypeVar("T")
#: bound on one awaited event (a backend's start on a busy machine included)
TIMEOUT = 30.0

HANDLER = '''
"""Answers ROW:PID; held at import while hold-DEVICE is beside it, exits at once while
die-DEVICE is (tests/test_serve_supervise.py)."""
import os
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROW = os.environ.get("WIREKIT_ROW", "")
DEVICE = ROW.split("/")[1] if ROW.count("/") == 2 else "?"
_until = time.monotonic() + 60
while (HERE / f"hold-{DEVICE}").exists() and time.monotonic() < _until:
    time.sleep(0.02)
if (HERE / f"die-{DEVICE}").exists():
    os._exit(3)


def handler(batch):
    return [[f"{ROW}:{os.getpid()}"] for _ in batch]
'''


def eventually(what: str, check: Callable[[], T | None], timeout: float = TIMEOUT) -> T:
    """``check()``'s first true value, asked every 20 ms (AssertionError naming ``what``
    if none comes within ``timeout`` seconds)."""
    until = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > until:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, parent pid)`` of process ``pid``, or None when there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def processes() -> Iterator[tuple[int, str, int, str]]:
    """``(pid, state, parent pid, command line)`` of every process."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if stat is not None:
                    yield int(entry.name), stat[0], stat[1], cmdline


def zombies(parent: int) -> list[int]:
    """The children of ``parent`` that have exited and not been reaped."""
    return [pid for pid, state, ppid, _ in processes() if ppid == parent and state == "Z"]


def backend_pids(port: int) -> list[int]:
    """The live ``wirekit mip serve`` processes listening on ``port`` (by command line)."""
    address = f"tcp://127.0.0.1:{port} "
    return [
        pid
        for pid, state, _, cmdline in processes()
        if state != "Z" and " serve --listen " in cmdline and address in cmdline + " "
    ]


def post(http: str, text: str) -> str:
    """One inference through the dispatcher; its answer (``ROW:PID``)."""
    body = json.dumps({"inputs": [[text]]}).encode()
    request = urllib.request.Request(f"{http}/v1/models/m:predict", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        (answer,) = json.loads(response.read())["outputs"]
    return str(answer[0])


def readyz(http: str) -> dict[str, Any]:
    """The ``/readyz`` document (200 or 503)."""
    try:
        with urllib.request.urlopen(f"{http}/readyz", timeout=TIMEOUT) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        return dict(json.loads(exc.read()))


def device_state(http: str, device: str) -> str:
    return str(readyz(http)["models"]["m"]["devices"][device])


def listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 1.0):
            return True
    except OSError:
        return False


class Setup:
    """The module's dispatcher, its backends' ports and the handler's folder."""

    def __init__(self, directory: Path, dispatcher: DispatcherProcess, ports: list[int]):
        self.directory = directory
        self.dispatcher = dispatcher
        self.ports = ports
        self.http = dispatcher.http

    def mark(self, kind: str, device: int) -> Path:
        return self.directory / f"{kind}-{device}"

    def warnings(self, row: str) -> list[str]:
        """The WARNING lines saying the backend of ``row`` exited."""
        return [
            line
            for line in list(self.dispatcher.log_lines)
            if " WARNING " in line and f"({row}) exited (" in line
        ]

    def answered_by(self, row: str, pid: int, tries: int = 200) -> bool:
        """Whether requests through the dispatcher reach ``row``'s backend ``pid`` (one in
        ``tries`` at most; the router may back a failed device off for a while)."""
        for i in range(tries):
            if post(self.http, f"try {i}") == f"{row}:{pid}":
                return True
            time.sleep(0.05)
        return False


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[Setup]:
    directory = tmp_path_factory.mktemp("supervise")
    (directory / "flaky.py").write_text(HANDLER)
    ports = [free_port(), free_port()]
    doc = deployment(
        directory / "requests.db",
        {"m": {"handler": "flaky:handler", "timeout": 5.0}},
        [{"id": "n", "devices": ["CPU", "CPU"], "models": ["m"], "quotas": [0.5, 0.5],
          "ports": ports}],
    )  # fmt: skip
    dispatcher = DispatcherProcess.of(
        doc, directory, args=("--with-backends", "--log-level", "info")
    ).start()
    try:
        yield Setup(directory, dispatcher, ports)
    finally:
        dispatcher.close()


def test_a_killed_backend_is_logged_reaped_restarted_and_readyz_says_so(setup):
    http, dispatcher = setup.http, setup.dispatcher
    assert dispatcher.proc is not None
    (old,) = backend_pids(setup.ports[0])
    assert post(http, "before") in {f"n/0/m:{old}", f"n/1/m:{backend_pids(setup.ports[1])[0]}"}
    hold = setup.mark("hold", 0)
    hold.touch()  # the restarted backend waits at its import until the test lets it go
    try:
        os.kill(old, signal.SIGKILL)
        (line,) = eventually("a WARNING for n/0/m", lambda: setup.warnings("n/0/m"))
        assert "exited (signal 9, SIGKILL); restarting in 0.5 s" in line, line
        assert f"tcp://127.0.0.1:{setup.ports[0]} (n/0/m)" in line
        # reaped: no zombie left under the dispatcher (it reaps before it logs)
        assert proc_stat(old) is None
        assert zombies(dispatcher.proc.pid) == []
        # /readyz: this device is down and why; the model is still served by the other
        state = eventually(
            "readyz saying n/0 restarts",
            lambda: (
                (s := device_state(http, "n/0")).startswith("unreachable: backend process") and s
            ),
        )
        assert "exited (signal 9, SIGKILL)" in state, state
        assert "restart" in state, state
        doc = readyz(http)
        assert doc["models"]["m"]["ready"] is True
        assert doc["ready"] is True, doc
        new = eventually("a new backend on the port", lambda: backend_pids(setup.ports[0]))
        assert new != [old]
        # held at its import: restarted, not listening yet -- and /readyz says that
        held = (
            "unreachable: backend process exited (signal 9, SIGKILL), restarted, not listening yet"
        )
        eventually("readyz: restarted, not listening", lambda: device_state(http, "n/0") == held)
        assert not listens(setup.ports[0])
        # meanwhile the other device answers every request
        assert {post(http, f"meanwhile {i}").split(":")[0] for i in range(4)} == {"n/1/m"}
    finally:
        hold.unlink()
    eventually("the backend listening again", lambda: listens(setup.ports[0]))
    dispatcher.wait_for_log(
        f"backend tcp://127.0.0.1:{setup.ports[0]} (n/0/m) restarted: listening again", TIMEOUT
    )
    (pid,) = backend_pids(setup.ports[0])
    assert pid == new[0]
    assert setup.answered_by("n/0/m", pid)
    assert eventually("/readyz: n/0 reachable", lambda: device_state(http, "n/0") == "reachable")
    assert readyz(http)["ready"] is True
    assert len(setup.warnings("n/0/m")) == 1  # logged once
    assert zombies(dispatcher.proc.pid) == []


RESTARTING = re.compile(r"exited \(([^)]*)\); restarting in ([0-9.]+) s")


def test_a_backend_that_keeps_dying_is_restarted_ever_later(setup):
    dispatcher = setup.dispatcher
    assert dispatcher.proc is not None
    (old,) = backend_pids(setup.ports[1])
    die = setup.mark("die", 1)
    die.touch()  # every restarted backend exits at once (status 3)
    try:
        os.kill(old, signal.SIGKILL)
        seen = eventually(
            "three exits of n/1/m", lambda: (w := setup.warnings("n/1/m")) and len(w) >= 3 and w
        )
    finally:
        die.unlink()  # the next start succeeds
    found = [RESTARTING.search(line) for line in seen[:3]]
    assert all(found), seen
    exits = [m.group(1) for m in found if m]
    delays = [float(m.group(2)) for m in found if m]
    assert exits == ["signal 9, SIGKILL", "status 3", "status 3"]
    assert delays == [0.5, 1.0, 2.0]  # doubled at each quick death
    # each restart waited at least its delay: the next exit was logged later still (the
    # times the dispatcher logged them, to the millisecond)
    logged = [datetime.fromisoformat(line.split(" ", 1)[0]).timestamp() for line in seen]
    for before, after, delay in zip(logged, logged[1:], delays, strict=False):
        assert after - before >= delay - 0.002, (seen, delays)
    dispatcher.wait_for_log(
        f"backend tcp://127.0.0.1:{setup.ports[1]} (n/1/m) restarted: listening again", TIMEOUT
    )
    (pid,) = backend_pids(setup.ports[1])
    assert setup.answered_by("n/1/m", pid)
    assert zombies(dispatcher.proc.pid) == []
    # every exit was reaped and logged once: no more than the restarts the delays allow
    assert len(setup.warnings("n/1/m")) <= 4


def test_a_stop_during_a_pending_restart_leaves_no_backend(setup):
    dispatcher = setup.dispatcher
    assert dispatcher.proc is not None
    (old,) = backend_pids(setup.ports[0])
    before = len(setup.warnings("n/0/m"))
    os.kill(old, signal.SIGKILL)
    eventually("a WARNING for n/0/m", lambda: len(setup.warnings("n/0/m")) > before)
    assert dispatcher.stop(signal.SIGINT) == 0  # within the restart's 0.5 s, or just after
    log = dispatcher.log
    assert "backends stopped" in log
    time.sleep(1.0)  # past the restart's delay: nothing may start now
    for port in setup.ports:
        assert backend_pids(port) == [], log
        assert not listens(port)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_restarted_backend_does_not_outlive_a_killed_dispatcher(tmp_path):
    # The restarted backend was started by the supervisor's thread (a parent-death signal
    # follows the thread that started the process): the dispatcher's death still ends it.
    (tmp_path / "flaky.py").write_text(HANDLER)
    port = free_port()
    doc = deployment(
        tmp_path / "requests.db",
        {"m": {"handler": "flaky:handler"}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [port]}],
    )
    dispatcher = DispatcherProcess.of(doc, tmp_path, args=("--with-backends",)).start()
    try:
        (old,) = backend_pids(port)
        os.kill(old, signal.SIGKILL)
        # the killed one can still show for a moment (killed, not yet gone): wait for the
        # new one alone
        new = eventually(
            "the backend listening again",
            lambda: listens(port) and [pid for pid in backend_pids(port) if pid != old],
        )
        assert old not in backend_pids(port)
        assert post(dispatcher.http, "again") == f"n/0/m:{new[0]}"
        dispatcher.stop(signal.SIGKILL)  # no chance to stop anything itself
        eventually("no backend left", lambda: backend_pids(port) == [])
    finally:
        dispatcher.close()


def test_how_a_process_ended_is_said():
    assert exit_text(0) == "status 0"
    assert exit_text(3) == "status 3"
    assert exit_text(-9) == "signal 9, SIGKILL"
    assert exit_text(-15) == "signal 15, SIGTERM"
    assert exit_text(-200) == "signal 200"
