"""Every shell block (```sh, ```bash, ```console) of README.md, docs/*.md and specs/*.md runs,
as written.

The blocks are found by tests/docblocks.py (shared with tests/test_docs.py, which runs the
Python blocks).  Each shell block needs a marker on the line just before its fence, so a new
block is a deliberate choice -- an unmarked one fails :func:`test_every_shell_block_is_marked`:

- ``<!-- not run: REASON -->`` for what truly cannot run here (an install into the
  environment, a cluster across hosts, ``kubectl``); skipped with the reason, and their
  number pinned by :func:`test_not_run_blocks`.
- ``<!-- run: in a copy of the checkout[, CLAUSE]... -->``: the block runs with
  ``bash -e -o pipefail`` (any failing command fails it, as a reader typing it would see), in
  a fresh copy of this checkout -- so ``samples/...`` paths work and files the block writes
  (``bench.json``, ``samples/requests.db``) land in the copy -- with the ``wirekit`` of this
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

The copy holds nothing a reader's checkout does not: every file a block reads is in the
checkout (tests/test_docs_files.py holds every block to that), and files a block writes land
in the copy.

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
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from docblocks import DOCS, ROOT, SHELL, Block, code_blocks, find_block

BLOCK_TIMEOUT = 240.0  # seconds for a block's foreground commands (a loaded 2-core machine)
READY_TIMEOUT = 120.0  # for a background command's first line (5 pure-Python backends...)
STOP_TIMEOUT = 30.0  # for a background command to exit after SIGINT
RUNNER_TIMEOUT = BLOCK_TIMEOUT + 3 * READY_TIMEOUT + 3 * STOP_TIMEOUT  # the whole runner

BLOCKS = [block for path in DOCS for block in code_blocks(path, SHELL)]
NOT_RUN = [block for block in BLOCKS if block.not_run]
RUN = [block for block in BLOCKS if block.run]
# README: the quick start's install and suite; docs/: the quick start again (getting-started),
# the live tcpdump pipe (runs until stopped), a y2 cluster across hosts, conform's target
# commands (2), the benchmarks' install and full run, the MLServer sample, install.md's
# wheel install, wheel build, registry-based docker build and image script (4); specs: conform
# against targets (3: one waits for a client, OIP servers, KubeMo started by conform), the
# controller's cgroup example, k8s.md (4), the y2 cluster across hosts, y2's own Python 3.7
# worker and the shaped-network benchmark (2: root, 8 ranks for minutes).
EXPECTED_NOT_RUN = 24

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
    """Virtualenvs, caches, what earlier runs left at the top (stores, benchmark JSON, the
    built site), and the fuzz corpus."""
    ignored = {n for n in names if n in _NOT_COPIED or n.endswith("_cache") or n == "__pycache__"}
    if Path(directory) == ROOT:
        ignored |= {n for n in names if n.startswith("requests.db") or n.endswith(".json")}
        ignored |= {n for n in names if n == "site"}  # a local `mkdocs build`'s output
    if Path(directory) == ROOT / "samples":  # the sample deployment's store (its store.path)
        ignored |= {n for n in names if n.startswith("requests.db")}
    if Path(directory) == ROOT / "fuzz":
        # the fuzz corpus: four in five of the checkout's files, and no block reads it;
        # copying it made each block's start slower
        ignored |= {n for n in names if n == "corpus"}
    return ignored


def _copy_checkout(dest: Path) -> None:
    shutil.copytree(ROOT, dest, ignore=_ignore, symlinks=True)


@pytest.fixture(scope="module")
def netns() -> list[str]:
    return _netns_prefix()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout, as a reader has it: nothing made up beside it."""
    template = tmp_path_factory.mktemp("readme") / "checkout"
    _copy_checkout(template)
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


if __name__ == "__main__":
    sys.exit(run_block(Path(sys.argv[2]).resolve(), int(sys.argv[3]), Path(sys.argv[4])))
