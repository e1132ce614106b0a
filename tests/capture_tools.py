"""Real capture tools for the decode tests: tcpdump (and editcap) on loopback, as root.

Under CI (``CI=true``) a missing tool is a failure, not a skip: scripts/test.sh installs them.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
WAIT = 20.0


def need(tool: str, root: bool = True) -> str:
    """The path of ``tool``; skips (fails under CI) when it is missing or we are not root."""
    path = shutil.which(tool)
    if path is None or (root and hasattr(os, "geteuid") and os.geteuid() != 0):
        if IN_CI:
            pytest.fail(f"{tool} (as root) is needed under CI: scripts/test.sh installs it")
        pytest.skip(f"{tool} is not installed or not root")
    return path


@contextlib.contextmanager
def tcpdump(port: int, path: Path) -> Iterator[subprocess.Popen]:
    """``tcpdump -i lo -U -w PATH tcp port PORT``, once it is writing packets; stopped with
    SIGINT at the end (the file is then complete)."""
    proc = subprocess.Popen(
        [need("tcpdump"), "-i", "lo", "-U", "--immediate-mode", "-s", "0", "-w", str(path),
         f"tcp port {port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT
        while "listening on" not in (proc.stderr.readline() or "listening on"):
            assert time.monotonic() < deadline
        # "listening on" can come before packets are seen: knock until one is written.
        while not path.exists() or path.stat().st_size <= 24:  # 24: the pcap file header
            assert time.monotonic() < deadline, "tcpdump wrote no packet"
            socket.create_connection(("127.0.0.1", port), timeout=WAIT).close()
            time.sleep(0.05)
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(WAIT)
        proc.stderr.close()


class Lines:
    """The lines a process writes to a pipe, read by a thread: ``wait_for`` one that
    contains a text, with a bound in time, while the process goes on."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._stream = stream
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = WAIT) -> str | None:
        """The first line (from now on) containing ``text``, or None at EOF or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                self._queue.put(None)
                return None
            self.seen.append(line)
            if text in line:
                return line

    def rest(self) -> list[str]:
        """Every line up to EOF (call once the process has ended); closes the pipe."""
        self._thread.join(WAIT)
        self._stream.close()
        while True:
            line = self._queue.get_nowait() if not self._queue.empty() else None
            if line is None:
                return self.seen
            self.seen.append(line)
