"""Shared set-ups of the Clipper runtime tests (``test_clipper_runtime``, ``_hostile``,
``_lane``, ``test_record``): a ZeroMQ context, bare sockets, runtimes stopped at the end,
``wirekit clipper`` processes on ports they chose themselves, an allocation peak, the log
lines of dropped messages.

The fixtures are a pytest plugin (``pytest_plugins`` in ``tests/conftest.py``).  Every
socket has a receive timeout and is closed with linger 0; every runtime and process is
stopped, every pipe closed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from support.process import read_line

WAIT = 10.0  # bound on any one step; never a threshold
MS = int(WAIT * 1000)
GENS = ["2016", "2017", "v3"]
TESTS = Path(__file__).resolve().parent


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def started(ctx) -> Iterator[list[Any]]:
    """Frontends and containers (anything with ``stop()``) to stop at the end, last first
    (before their context is destroyed)."""
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        thing.stop()


@pytest.fixture
def raw(ctx) -> Iterator[Callable[..., tuple[zmq.Socket, str]]]:
    """A bare socket: ``raw(kind)`` bound on a random loopback port, ``raw(kind, address)``
    connected to ``address``; returns ``(socket, address)``."""
    opened: list[zmq.Socket] = []

    def make(kind: int, address: str | None = None) -> tuple[zmq.Socket, str]:
        sock = ctx.socket(kind)
        opened.append(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, MS)
        if address is None:
            port = sock.bind_to_random_port("tcp://127.0.0.1")
            return sock, f"tcp://127.0.0.1:{port}"
        sock.connect(address)
        return sock, address

    yield make
    for sock in opened:
        sock.close(0)


@pytest.fixture
def clipper_side(raw) -> tuple[zmq.Socket, str]:
    """A bare ROUTER on loopback playing (a hostile) Clipper: ``(socket, address)``."""
    return raw(zmq.ROUTER)


# --- allocations and logs ------------------------------------------------------------------


class Peak:
    bytes = 0  #: the most bytes traced at once inside the block, above those at its start


@contextlib.contextmanager
def allocation_peak() -> Iterator[Peak]:
    """Trace the allocations of the block; ``.bytes`` of what it yields is their peak."""
    peak = Peak()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        yield peak
        peak.bytes = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def dropped(records: list[Any], who: str) -> list[str]:
    """The log lines of the messages the ``who`` runtime ("container", "frontend")
    dropped as malformed."""
    start = f"clipper {who}: dropped a malformed message"
    return [r.getMessage() for r in records if r.getMessage().startswith(start)]


# --- `wirekit clipper` processes ------------------------------------------------------------


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a ``wirekit`` process: this one's, tests/ importable (the models
    of ``clipper_models``), and ``extra``."""
    path = f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    return dict(os.environ, PYTHONPATH=path, **extra)


def clipper_process(*args: str, env: dict[str, str] | None = None, **popen: Any):
    """``python -m wirekit.cli clipper ARGS...`` (stdout and stderr piped unless given)."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(
        [sys.executable, "-m", "wirekit.cli", "clipper", *args],
        env=cli_env() if env is None else env,
        **popen,
    )


_BANNER = re.compile(r" frontend on (\S+?)(?:, queries on (\S+))?\n")


def frontend_process(*args: str, env: dict[str, str] | None = None):
    """``wirekit clipper frontend ARGS...`` listening on ports the kernel gives it (port 0,
    so no other process can take them between choosing and binding): ``(process, the
    containers' address, the query address)``, read from the line it prints once bound
    (waited for at most WAIT seconds)."""
    proc = clipper_process(
        "frontend", "--listen", "tcp://127.0.0.1:0", "--query", "tcp://127.0.0.1:0", *args,
        env=env, stderr=subprocess.PIPE,
    )  # fmt: skip
    line = read_line(proc.stdout, WAIT)
    found = _BANNER.search(line)
    if found is None:
        stop_processes(proc)
        raise AssertionError(f"the frontend did not start: {line!r} {proc.stderr.read()!r}")
    return proc, found[1], found[2]


def stop_processes(*procs: subprocess.Popen) -> None:
    """SIGTERM every process still running, wait (WAIT seconds, then SIGKILL), close its
    pipes."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(WAIT)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(WAIT)
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
