"""Every shell block (```sh, ```bash, ```console) of README.md and specs/*.md runs, as written.

The blocks are found by tests/docblocks.py (shared with tests/test_docs.py, which runs the
Python blocks).  Each shell block needs a marker on the line just before its fence, so a new
block is a deliberate choice -- an unmarked one fails :func:`test_every_shell_block_is_marked`:

- ``<!-- not run: REASON -->`` for what truly cannot run here (an install into the
  environment, a cluster across hosts, ``kubectl``); skipped with the reason, and their
  number pinned by :func:`test_not_run_blocks`.
- ``<!-- run: in a copy of the checkout[, CLAUSE]... -->``: the block runs with
  ``bash -e -o pipefail`` (any failing command fails it, as a reader typing it would see), in
  a fresh copy of this checkout -- so ``samples/...`` paths work and files the block writes
  (``bench.json``, ``requests.db``) land in the copy -- with the ``wirekit`` of this
  environment.  The clauses:

  * ``with ... running (COMMAND)``: COMMAND is started first, in the background, and the
    block runs against it (``with the sample deployment running (wirekit serve --config
    samples/serve-deployment.json --with-backends)``);
  * ``line N in the background`` / ``lines N-M in the background``: those lines of the block
    are servers (a reader runs them in other terminals); they are started first, each
    waited for, and the rest of the block runs against them.

  A background command is ready when it prints its first line on standard output (every
  wirekit server prints its address once it listens); the test waits for that, in order,
  before the next one.  When the block is done each background command gets SIGINT (Ctrl-C)
  and must exit 0: the servers stop gracefully, as the README says they do.  Every step has
  a timeout, so a block that hangs fails instead of blocking the suite.  ``curl`` runs with
  ``fail-with-body`` (from a ``.curlrc`` of the test's): an HTTP error status fails a block.

The copy holds what the README's placeholders name, made by the test from real sessions:
``cap.pcapng`` (``wirekit record`` between ``wirekit mip ping/infer`` and a ``wirekit mip
serve`` on port 7000, the README's recipe) and ``cap.pcap`` (``tcpdump`` of the same traffic),
``capture.bin``/``up.bin``/``down.bin`` (the two directions of a MIP session, recorded by
``wirekit.zmtp.record.RecordingProxy``), ``capture.zmtp`` and ``worker-link.bin`` (the bundled
Clipper and y2 captures), ``cat.png`` (a real PNG) and ``pkg/mod.py`` (the README's Clipper
``predict``).

Where ``unshare`` can give the block a network namespace of its own (as root: CI), the block
and its servers run in one, on its own loopback: the README's fixed ports (8080, 9001, 7000,
...) never meet another process of this machine, and whatever a block leaves running ends
with it.  Elsewhere they run on the machine's loopback.  The environment is inherited, so the
blocks run on the compiled twins and again with ``WIREKIT_PURE=1`` when the suite does.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from capture_tools import need
from docblocks import DOCS, ROOT, SHELL, Block, code_blocks, find_block

BLOCK_TIMEOUT = 240.0  # seconds for a block's foreground commands (a loaded 2-core machine)
READY_TIMEOUT = 120.0  # for a background command's first line (5 pure-Python backends...)
STOP_TIMEOUT = 30.0  # for a background command to exit after SIGINT
RUNNER_TIMEOUT = BLOCK_TIMEOUT + 3 * READY_TIMEOUT + 3 * STOP_TIMEOUT  # the whole runner

BLOCKS = [block for path in DOCS for block in code_blocks(path, SHELL)]
NOT_RUN = [block for block in BLOCKS if block.not_run]
RUN = [block for block in BLOCKS if block.run]
# README: the quick start's install and suite, the live tcpdump pipe (runs until stopped), a
# y2 cluster across hosts, conform's target commands, the benchmarks' install and full run;
# specs: conform against targets (3: one waits for a client, OIP servers, KubeMo started by
# conform), the controller's cgroup example, k8s.md (4), the y2 cluster across hosts, y2's own
# Python 3.7 worker and the shaped-network benchmark (2: root, 8 ranks for minutes).
EXPECTED_NOT_RUN = 19

_COPY = "in a copy of the checkout"
_WITH = re.compile(r"^with .+ running \((?P<command>[^()]+)\)$")
_LINES = re.compile(r"^lines? (?P<first>\d+)(?:-(?P<last>\d+))? in the background$")


@dataclass
class Plan:
    """How a ``run:`` block runs: commands started first, then the block's other lines."""

    background: list[str] = field(default_factory=list)
    script: str = ""


def plan(block: Block) -> Plan:
    """Read a block's ``run:`` marker (an AssertionError names what it cannot read)."""
    assert block.run is not None
    clauses = [c.strip() for c in block.run.split(", ")]
    assert clauses[0] == _COPY, f"{block.name}: a run: marker starts with {_COPY!r}"
    lines = block.code.splitlines()
    result = Plan()
    in_background: set[int] = set()
    for clause in clauses[1:]:
        if m := _WITH.match(clause):
            result.background.append(m.group("command"))
        elif m := _LINES.match(clause):
            first = int(m.group("first"))
            last = int(m.group("last") or first)
            assert 1 <= first <= last <= len(lines), f"{block.name}: no lines {first}-{last}"
            for number in range(first, last + 1):
                assert not lines[number - 1].rstrip().endswith("\\"), (
                    f"{block.name}: background line {number} continues on the next"
                )
                result.background.append(lines[number - 1])
                in_background.add(number)
        else:
            raise AssertionError(f"{block.name}: a run: clause this test cannot read: {clause!r}")
    # The other lines keep their numbers (bash's errors name the README's line).
    result.script = "\n".join(
        ":" if number in in_background else line for number, line in enumerate(lines, 1)
    )
    return result


def test_blocks_found():
    # README: the quick start, the command line, MIP, Clipper, y2, the sample deployment, the
    # models API, the benchmarks; a parser that finds nothing fails here.
    assert len(BLOCKS) >= 15
    assert {b.path.name for b in BLOCKS} >= {"README.md", "k8s.md"}


def test_every_shell_block_is_marked():
    unmarked = [b.name for b in BLOCKS if not b.run and not b.not_run]
    assert not unmarked, (
        "shell blocks without a <!-- run: ... --> or <!-- not run: REASON --> marker "
        f"(tests/test_readme_shell.py says which): {unmarked}"
    )


def test_not_run_blocks():
    listing = "\n".join(f"{b.name}: {b.not_run}" for b in NOT_RUN)
    print(f"{len(NOT_RUN)} of {len(BLOCKS)} shell blocks not run:\n{listing}")
    assert len(NOT_RUN) == EXPECTED_NOT_RUN, listing
    assert all(len(b.not_run or "") > 10 for b in NOT_RUN), listing


@pytest.mark.parametrize("block", RUN, ids=[b.name for b in RUN])
def test_run_markers_are_read(block: Block):
    steps = plan(block)
    assert steps.script.strip(": \n") or steps.background


# ---------------------------------------------------------------- the prepared environment


def _netns_prefix() -> list[str]:
    """``unshare`` into a network namespace with its loopback up, where that works."""
    if not (shutil.which("unshare") and shutil.which("ip")):
        return []
    prefix = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return prefix if probe.returncode == 0 else []


_NOT_COPIED = {".venv", ".fuzz-venv", ".git", "build", ".benchmarks", ".hypothesis"}


def _ignore(directory: str, names: list[str]) -> set[str]:
    """Virtualenvs, caches, and what earlier runs left at the top (stores, benchmark JSON)."""
    ignored = {n for n in names if n in _NOT_COPIED or n.endswith("_cache") or n == "__pycache__"}
    if Path(directory) == ROOT:
        ignored |= {n for n in names if n.startswith("requests.db") or n.endswith(".json")}
    return ignored


def _copy_checkout(dest: Path) -> None:
    shutil.copytree(ROOT, dest, ignore=_ignore, symlinks=True)


@pytest.fixture(scope="module")
def netns() -> list[str]:
    return _netns_prefix()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, netns: list[str]) -> Path:
    """A copy of the checkout with the README's placeholder files made from real sessions."""
    need("tcpdump")  # cap.pcap: as root (a skip elsewhere, a failure under CI)
    template = tmp_path_factory.mktemp("readme") / "checkout"
    _copy_checkout(template)
    proc = subprocess.run(
        [*netns, sys.executable, __file__, "prepare", str(template)],
        capture_output=True,
        text=True,
        timeout=RUNNER_TIMEOUT,
    )
    assert proc.returncode == 0, f"preparing the fixtures failed:\n{proc.stdout}\n{proc.stderr}"
    return template


@pytest.mark.parametrize("block", RUN, ids=[b.name for b in RUN])
def test_block_runs(block: Block, prepared: Path, netns: list[str], tmp_path: Path):
    workdir = tmp_path / "checkout"
    shutil.copytree(prepared, workdir, symlinks=True)
    proc = subprocess.run(
        [*netns, sys.executable, __file__, "run", str(block.path), str(block.line), str(workdir)],
        capture_output=True,
        text=True,
        timeout=RUNNER_TIMEOUT,
    )
    print(proc.stdout, proc.stderr)  # what the block printed (pytest -rP shows it)
    assert proc.returncode == 0, f"{block.name} failed:\n{proc.stdout}\n{proc.stderr}"


# ------------------------------------------------------- the runner (in its own process)


class Background:
    """A command started in the background in its own process group, as in a terminal."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.command = command
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stdout_started = False
        self.proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _pump(self, stream, is_stdout: bool) -> None:
        with stream:
            for line in stream:
                self.output.append(line)
                if is_stdout:
                    self._lines.put(line)
        if is_stdout:
            self._lines.put(None)

    def wait_ready(self) -> None:
        """Until the command prints its first line on standard output."""
        try:
            line = self._lines.get(timeout=READY_TIMEOUT)
        except queue.Empty:
            raise AssertionError(
                f"not ready after {READY_TIMEOUT:.0f} s (no line on standard output): "
                f"{self.command}"
            ) from None
        if line is None:
            self.proc.wait(STOP_TIMEOUT)
            raise AssertionError(
                f"exited {self.proc.returncode} before it was ready: {self.command}"
            )

    def stop(self) -> int:
        """SIGINT (Ctrl-C) to its process group; its exit status (SIGKILL after a timeout)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            status = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            status = -signal.SIGKILL
        with contextlib.suppress(ProcessLookupError):  # none of its processes outlives it
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for thread in self._threads:
            thread.join(STOP_TIMEOUT)
        return status


def _environment(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    runtime = workdir.parent / "xdg-runtime"  # the admin token file, per block
    runtime.mkdir(mode=0o700, exist_ok=True)
    env["XDG_RUNTIME_DIR"] = str(runtime)
    # curl exits 0 on an HTTP error status unless told: a 404 from a README block is a failure.
    curl_home = workdir.parent / "curl-home"
    curl_home.mkdir(exist_ok=True)
    (curl_home / ".curlrc").write_text("fail-with-body\n")
    env["CURL_HOME"] = str(curl_home)
    env.pop("PYTHONPATH", None)
    return env


def run_block(path: Path, line: int, workdir: Path) -> int:
    """Run one ``run:`` block in ``workdir`` (the runner's side); print what happened."""
    block = find_block(path, line, SHELL)
    steps = plan(block)
    env = _environment(workdir)
    started: list[Background] = []
    failures: list[str] = []
    try:
        for command in steps.background:
            print(f"$ {command} &", flush=True)
            started.append(Background(command, workdir, env))
            started[-1].wait_ready()
        script = workdir.parent / "block.sh"
        script.write_text(steps.script + "\n")
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-x", str(script)],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
        )
        print(proc.stdout, proc.stderr, sep="\n", flush=True)
        if proc.returncode:
            failures.append(f"the block exited {proc.returncode}")
    except (AssertionError, subprocess.TimeoutExpired) as exc:
        failures.append(str(exc))
    finally:
        for background in reversed(started):
            status = background.stop()
            print(f"--- {background.command} (exit {status} on SIGINT):", flush=True)
            print("".join(background.output), flush=True)
            if status != 0:
                failures.append(f"exited {status} on SIGINT, not 0: {background.command}")
    for failure in failures:
        print(f"FAILED: {block.name}: {failure}", flush=True)
    return 1 if failures else 0


# The README's Clipper model, for ``--model pkg.mod:predict``.
_PKG_MOD = '''"""The README's Clipper model: one output per input, the sum of its numbers."""


def predict(inputs):
    return [str(x.sum()) for x in inputs]
'''


def _png(width: int = 2, height: int = 2) -> bytes:
    """A real PNG (grey pixels) for ``--image cat.png``."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(pixels))
        + chunk(b"IEND", b"")
    )


def _cli(workdir: Path, env: dict[str, str], *args: str) -> None:
    subprocess.run(
        ["wirekit", *args], cwd=workdir, env=env, check=True, timeout=60, stdin=subprocess.DEVNULL
    )


def prepare(workdir: Path) -> int:
    """Make the README's placeholder files in ``workdir`` from real sessions on port 7000."""
    from wirekit.mip.client import Client
    from wirekit.zmtp.record import RecordingProxy

    env = _environment(workdir)
    (workdir / "pkg").mkdir()
    (workdir / "pkg" / "mod.py").write_text(_PKG_MOD)
    (workdir / "cat.png").write_bytes(_png())
    shutil.copy(workdir / "samples" / "clipper-v3-clipper.bin", workdir / "capture.zmtp")
    shutil.copy(workdir / "samples" / "y2-worker-link.bin", workdir / "worker-link.bin")
    server = Background(
        "wirekit mip serve --listen tcp://127.0.0.1:7000 --handler wirekit.mip.runtime:echo",
        workdir,
        env,
    )
    sniffer: Background | None = None
    recorder: Background | None = None
    try:
        server.wait_ready()
        # The README's capture recipe: tcpdump on port 7000, and wirekit record in front of it.
        # --immediate-mode: each packet goes to tcpdump as it comes; without it, the kernel
        # holds them in a block for up to a second, and the Ctrl-C below (sent as soon as the
        # sessions end) stops tcpdump before it has read them ("0 packets captured").
        sniffer = Background(
            "tcpdump -i lo --immediate-mode -U -w cap.pcap port 7000 2>&1", workdir, env
        )
        sniffer.wait_ready()  # "listening on lo, ..."
        recorder = Background(
            "wirekit record --listen 127.0.0.1:7001 --target 127.0.0.1:7000 -w cap.pcapng "
            "--connections 3",
            workdir,
            env,
        )
        recorder.wait_ready()
        _cli(workdir, env, "mip", "ping", "tcp://127.0.0.1:7001", "--count", "3")
        _cli(workdir, env, "mip", "infer", "tcp://127.0.0.1:7001", "--text", "hello")
        _cli(workdir, env, "mip", "infer", "tcp://127.0.0.1:7001", "--json-item", '{"k": 1}')
        assert recorder.proc.wait(60) == 0, "".join(recorder.output)
        # Both directions of one MIP session as raw files.
        with RecordingProxy(("127.0.0.1", 7000)) as proxy:
            with Client(f"tcp://127.0.0.1:{proxy.port}") as client:
                client.ping()
                client.infer_one("hello")
            assert proxy.wait(30), "the recording proxy did not finish"
        (workdir / "up.bin").write_bytes(proxy.upstream)
        (workdir / "down.bin").write_bytes(proxy.downstream)
        (workdir / "capture.bin").write_bytes(proxy.upstream)
    finally:
        for background in (recorder, sniffer, server):
            if background is not None:
                background.stop()
    made = ["cap.pcapng", "cap.pcap", "up.bin", "down.bin", "capture.bin"]
    for name in made:
        size = (workdir / name).stat().st_size
        print(f"{name}: {size} bytes")
        assert size > 24, f"{name} is empty"
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        sys.exit(prepare(Path(sys.argv[2])))
    sys.exit(run_block(Path(sys.argv[2]).resolve(), int(sys.argv[3]), Path(sys.argv[4])))
