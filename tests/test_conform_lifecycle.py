"""``wirekit conform`` and targets that end, restart, never come, or are slow.

Every run is ``python -m wirekit conform ...`` in a subprocess against real peers on
loopback: KubeMo's server (``kubemo`` from PyPI), ``wirekit mip serve``, and a MIP server
that exits when a case asks its model to fail (``conform_lifecycle_peers.py``).

* a target that stops serving is a result: the MUST cases left fail ("the target stopped
  serving after case X"), exit status 1, a rerun line per failed case; with
  ``--target-cmd`` conform restarts the target and the cases left run;
* ``lifecycle.restart`` (stop, start on the same port) finds KubeMo's server, which binds
  without ``SO_REUSEADDR``; it is a SKIP without ``--target-cmd``;
* nothing connected to ``conform mip client``: one line, exit status 1, no case judged;
* the verdicts on KubeMo's server are the same on an idle machine and under CPU load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.ports import free_port

from wirekit import cli
from wirekit.conform import cli as conform_cli

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
PEERS = TESTS / "conform_lifecycle_peers.py"
#: every run's bound (a loaded machine included)
RUN_TIMEOUT = 300


def conform(*argv: str, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``python -m wirekit conform ARGV`` as a subprocess."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    return subprocess.run(
        [sys.executable, "-m", "wirekit", "conform", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=TESTS,
        env=env,
        check=False,
    )


def report(run: subprocess.CompletedProcess[str]) -> dict:
    assert run.returncode in (0, 1), run.stderr
    return json.loads(run.stdout)


def peer_command(name: str) -> str:
    """The --target-cmd of a target of ``conform_lifecycle_peers.py``."""
    return shlex.join([sys.executable, str(PEERS), name])


def by_id(doc: dict) -> dict[str, dict]:
    return {c["id"]: c for c in doc["cases"]}


@contextlib.contextmanager
def started(name: str, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """A target of ``conform_lifecycle_peers.py`` on ``port``, started by the test (not
    by conform), serving once this yields."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]),
        "WIREKIT_CONFORM_HOST": "127.0.0.1",
        "WIREKIT_CONFORM_PORT": str(port),
    }
    proc = subprocess.Popen(
        [sys.executable, str(PEERS), name],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=TESTS,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"listening"), "the target did not start"
        yield proc
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


# --------------------------------------------------------------------------- a target that ends

#: MUST cases of the MIP server suite that run after error.internal (declared after it)
AFTER_INTERNAL = ("stream.byte-by-byte", "connection.abandoned")


def test_a_server_a_case_ends_fails_every_must_case_left_with_a_rerun_line():
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    with started("dies_on_fail", port) as proc:
        run = conform("mip", "server", address, "--case-timeout", "2", "--max-batch", "64")
        assert proc.wait(10) == 3  # error.internal's conform:fail ended it
    assert run.returncode == 1, run.stdout
    out = run.stdout
    stopped = "the target stopped serving after case error.internal"
    for case_id in AFTER_INTERNAL:
        row = next(line for line in out.splitlines() if line.startswith(case_id + " "))
        assert row.split()[-1] == "FAIL", row
    words = " ".join(out.split())  # the details are wrapped to 100 columns
    assert words.count(f"got: {stopped}") >= len(AFTER_INTERNAL)
    # a non-MUST case left is a skip, with the same reason
    assert f"skipped: {stopped}" in words
    assert max(len(line) for line in out.splitlines()) <= 100
    # one rerun line per failed case
    for case_id in ("error.internal", *AFTER_INTERNAL):
        assert f"wirekit conform mip server {address} --case-timeout 2" in out
        assert f"--case {case_id}\n" in out


def test_target_cmd_restarts_a_server_a_case_ended_and_the_cases_left_run():
    port = free_port()
    run = conform(
        "mip", "server", f"tcp://127.0.0.1:{port}", "--json", "--case-timeout", "2",
        "--max-batch", "64", "--target-cmd", peer_command("dies_on_fail"),
    )  # fmt: skip
    doc = report(run)
    failed = {c["id"]: c["got"] for c in doc["cases"] if c["status"] != "pass"}
    # only the case that ended it: the server was restarted and served every other case,
    # the lifecycle case included (socket.create_server sets SO_REUSEADDR)
    assert set(failed) == {"error.internal"}, failed
    assert run.returncode == 1
    assert by_id(doc)["error.internal"]["rerun"].endswith("--case error.internal")


# --------------------------------------------------------------------------- lifecycle.restart


def test_lifecycle_restart_finds_kubemo_cannot_rebind_its_port():
    port = free_port()
    run = conform(
        "mip", "server", f"tcp://127.0.0.1:{port}", "--json", "--case", "lifecycle",
        "--target-cmd", peer_command("kubemo"),
    )  # fmt: skip
    cases = by_id(report(run))
    assert cases["lifecycle.restart"]["status"] == "fail"
    assert "Address already in use" in cases["lifecycle.restart"]["got"]
    assert run.returncode == 0  # wirekit's choice: reported, not a MUST failure


def test_lifecycle_restart_passes_wirekit_mip_serve():
    port = free_port()
    serve = shlex.join([sys.executable, "-m", "wirekit", "mip", "serve",
                        "--handler", "wirekit.conform.models:mip_model"])  # fmt: skip
    command = f"exec {serve} --listen tcp://$WIREKIT_CONFORM_HOST:$WIREKIT_CONFORM_PORT"
    run = conform(
        "mip", "server", f"tcp://127.0.0.1:{port}", "--json", "--case", "lifecycle",
        "--target-cmd", command,
    )  # fmt: skip
    assert {c["id"]: c["status"] for c in report(run)["cases"]} == {"lifecycle.restart": "pass"}
    assert run.returncode == 0


def test_lifecycle_restart_without_a_target_command_is_a_skip_that_says_why():
    port = free_port()
    with started("dies_on_fail", port):
        run = conform("mip", "server", f"tcp://127.0.0.1:{port}", "--json", "--case", "lifecycle")
    case = by_id(report(run))["lifecycle.restart"]
    assert case["status"] == "skip"
    assert case["reason"].startswith("needs --target-cmd")


# --------------------------------------------------------------------------- nothing connected


def test_nothing_connected_to_mip_client_is_one_line_and_exit_1():
    start = time.monotonic()
    run = conform("mip", "client", "--listen", "tcp://127.0.0.1:0", "--connect-timeout", "1")
    assert run.returncode == 1
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert lines[0].startswith("wirekit conform: listening on tcp://127.0.0.1:")
    assert len(lines) == 2, lines
    assert "nothing connected to tcp://127.0.0.1:" in lines[1]
    assert "within 1 s (--connect-timeout)" in lines[1]
    assert time.monotonic() - start < 60


def test_no_y2_service_registering_is_one_line_exit_1_and_a_junit_error(tmp_path):
    """A y2 service that never registers with conform's client: one line, exit 1, no case
    judged (before: every case a SKIP, exit 0); ``--junit`` holds one <error>, so a CI that
    reads it fails too (before: an empty file)."""
    junit = tmp_path / "report.xml"
    run = conform(
        "y2", "service", "tcp://127.0.0.1:9", "--listen", "tcp://127.0.0.1:0",
        "--connect-timeout", "1", "--junit", str(junit),
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 2, lines
    assert "no y2 service registered at tcp://127.0.0.1:" in lines[1]
    assert "(--connect-timeout 1 s and the case's time): no case was run" in lines[1]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("1", "1", "0")
    error = suite.find("testcase/error")
    assert error is not None and "no y2 service registered" in (error.get("message") or "")


def test_nothing_connected_with_junit_writes_an_error_not_an_empty_file(tmp_path):
    junit = tmp_path / "report.xml"
    run = conform(
        "mip", "client", "--listen", "tcp://127.0.0.1:0", "--connect-timeout", "1",
        "--junit", str(junit),
    )  # fmt: skip
    assert run.returncode == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1"
    error = suite.find("testcase/error")
    assert error is not None and "nothing connected to tcp://" in (error.get("message") or "")


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (("mip", "server", "tcp://127.0.0.1:{port}"), "tcp://127.0.0.1:{port}"),
        (("oip", "server", "127.0.0.1:{port}", "--model", "m"), "http://127.0.0.1:{port}"),
        (
            ("oip", "server", "127.0.0.1:{port}", "--grpc", "--model", "m"),
            "grpc://127.0.0.1:{port}",
        ),
    ],
    ids=["mip", "oip-rest", "oip-grpc"],
)
def test_a_server_target_that_is_not_there_is_one_line_and_exit_1(argv, shown):
    """Nothing listens at the target's port: one line naming it and the OS's reason, exit 1,
    no case judged (before: every case a FAIL, and the OIP suite's rerun lines)."""
    port = free_port()  # free: nothing listens there
    run = conform(*(a.format(port=port) for a in argv))
    assert run.returncode == 1, run.stdout
    assert run.stdout == ""
    where = shown.format(port=port)
    assert run.stderr.splitlines()[-1].endswith(
        f"nothing takes a connection at {where} (Connection refused): no case was run"
    ), run.stderr


def test_the_rerun_line_gives_the_oip_target_as_typed():
    """The OIP suite parses TARGET into (host, port): its rerun line says HOST:PORT again,
    not the tuple's repr."""
    argv = ["conform", "oip", "server", "http://[::1]:8000", "--grpc", "--model", "m"]
    parser = cli.build_parser(cli.command_of(argv))
    args = parser.parse_args(argv)
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    line = conform_cli.rerun_line(subcommands.choices["conform"], args, "infer.basic")
    assert line == "wirekit conform oip server '[::1]:8000' --grpc --model m --case infer.basic"


def test_connect_timeout_default_is_what_the_help_says():
    parser = cli.build_parser(cli.command_of(["conform"]))
    args = parser.parse_args(["conform", "mip", "client", "--listen", "tcp://127.0.0.1:0"])
    assert args.connect_timeout == 30.0
    run = conform("--help")
    assert "(default 30)" in " ".join(run.stdout.split()).split("--connect-timeout SECONDS")[1]


# --------------------------------------------------------------------------- machine load


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """``processes`` busy loops (as ``stress --cpu``), ended when the block ends."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for proc in loops:
            proc.kill()
            proc.wait(10)


def kubemo_verdicts() -> tuple[dict[str, str], float]:
    """The verdicts of a full MIP server run against KubeMo's server (conform runs it), and
    the time batch.max took.  Its batch is the header's largest (the default): KubeMo
    builds its response by repeated bytes concatenation, ~20 s on a busy 2-core machine,
    past batch.max's 20 s budget under load -- the case that moved with the load (and made
    the cases after it fail while KubeMo was still busy)."""
    port = free_port()
    run = conform(
        "mip", "server", f"tcp://127.0.0.1:{port}", "--json", "--case-timeout", "1.5",
        "--target-cmd", peer_command("kubemo"),
    )  # fmt: skip
    doc = report(run)
    return {c["id"]: c["status"] for c in doc["cases"]}, by_id(doc)["batch.max"]["elapsed"]


# Two whole KubeMo runs (about 160 s): what it shows -- the runner's second try and a stop
# check patient enough for a busy peer -- is the runner's, the same on both twins, so the
# compiled run of the suite has it and the pure one (WIREKIT_PURE=1) spares CI the time.
@pytest.mark.skipif(
    os.environ.get("WIREKIT_PURE") == "1", reason="the runner's timing: the compiled run has it"
)
def test_kubemo_server_verdicts_are_the_same_idle_and_under_cpu_load():
    idle, _ = kubemo_verdicts()
    with cpu_load(2 * (os.cpu_count() or 1)):  # two busy loops per core
        loaded, batch_max_seconds = kubemo_verdicts()
    assert loaded == idle
    assert idle["batch.max"] == "pass" and idle["lifecycle.restart"] == "fail"
    print(f"batch.max under load: {batch_max_seconds:.1f} s")


# --------------------------------------------------------------------------- --target-cmd


def test_a_target_command_that_ends_before_serving_is_one_line_and_exit_1():
    port = free_port()
    run = conform("mip", "server", f"tcp://127.0.0.1:{port}", "--target-cmd", "echo boom; exit 4")
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.splitlines() == [
        "wirekit conform: MIP server: the target (--target-cmd) ended before it served "
        "(it exited 4: boom)"
    ]


def test_target_cmd_runs_a_clipper_container_that_connects_to_the_kit():
    container = shlex.join([
        sys.executable, "-m", "wirekit", "clipper", "container",
        "--model", "wirekit.conform.models:clipper_model", "--name", "conform",
        "--model-version", "1", "--input-type", "doubles", "--generation", "v3",
        "--poll-interval", "0.5",
    ])  # fmt: skip
    port = free_port()
    run = conform(
        "clipper", "container", "--gen", "v3", "--listen", f"tcp://127.0.0.1:{port}",
        "--json", "--target-cmd", f'exec {container} --address "$WIREKIT_CONFORM_ADDRESS"',
    )  # fmt: skip
    doc = report(run)
    ids = [c["id"] for c in doc["cases"]]
    # the cases that may end the container ran last
    assert ids[-4:] == ["restart", "restart.legacy", "feedback", "predict.wrong-type"], ids
    assert {c["id"] for c in doc["cases"] if c["status"] == "fail"} == set()
    assert run.returncode == 0


# --------------------------------------------------------------------------- a container that dies


def fragile_run(*extra: str, port: int) -> subprocess.CompletedProcess[str]:
    listen = f"tcp://127.0.0.1:{port}"
    return conform("clipper", "container", "--gen", "v3", "--listen", listen, "--json",
                   "--case-timeout", "2", *extra)  # fmt: skip


def test_a_container_a_case_kills_fails_the_must_cases_left():
    # as Clipper's rpc.py 2017/v3: feedback ends it, so predict.wrong-type cannot run
    port = free_port()
    env = {**os.environ, "WIREKIT_CONFORM_ADDRESS": f"tcp://127.0.0.1:{port}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}  # fmt: skip
    container = subprocess.Popen([sys.executable, str(PEERS), "fragile_container"], env=env)
    try:
        run = fragile_run(port=port)
    finally:
        container.kill()
        container.wait(10)
    cases = by_id(report(run))
    assert cases["feedback"]["status"] == "fail"
    wrong_type = cases["predict.wrong-type"]
    assert wrong_type["status"] == "fail"
    assert wrong_type["got"] == "the target stopped serving after case feedback"
    assert wrong_type["rerun"].endswith(f"--listen tcp://127.0.0.1:{port} --gen v3 --case "
                                        "predict.wrong-type")  # fmt: skip
    assert run.returncode == 1


def test_target_cmd_restarts_a_container_a_case_killed_and_finds_the_next_failure():
    port = free_port()
    run = fragile_run("--target-cmd", peer_command("fragile_container"), port=port)
    doc = report(run)
    failed = {c["id"]: c["got"] for c in doc["cases"] if c["status"] == "fail"}
    assert set(failed) == {"feedback", "predict.wrong-type"}
    # it ran, on the restarted container, and failed on its own
    assert "(the container stopped serving)" in failed["predict.wrong-type"]
    assert "after case" not in failed["predict.wrong-type"]
    assert run.returncode == 1
