"""A server command in a subprocess, for a test: ``wirekit serve``, ``wirekit mip serve``, a
Python script -- anything that says on the first line of its standard output that it is
ready (and where it listens).

Every wait is bounded: the first line is read with a timeout, the stop is SIGTERM (or the
signal asked for) then SIGKILL, the threads and pipes are always cleaned up."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

#: bound on one step of a test's server (its start and its stop take three)
TIMEOUT = 10.0
TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent


def read_line(stream: IO[Any], timeout: float) -> str:
    """The next line a subprocess writes to ``stream`` (its stdout or stderr pipe, text or
    binary), with its newline; ``""`` if the pipe ends or ``timeout`` passes first.  Read a
    byte at a time without blocking past the timeout, so nothing past the line is taken
    from the pipe (the rest is the stream's to read)."""
    fd = stream.fileno()
    line = b""
    end = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            left = end - time.monotonic()
            if left <= 0 or not sel.select(left):
                break
            chunk = os.read(fd, 1)
            if not chunk:
                break
            line += chunk
    return line.decode(errors="replace")


def terminate(proc: subprocess.Popen, timeout: float = 3 * TIMEOUT) -> int:
    """SIGTERM ``proc`` if it still runs, SIGKILL it if it has not ended within ``timeout``
    seconds; its exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT)
    return proc.returncode


def close_pipes(proc: subprocess.Popen) -> None:
    """Close whatever pipes to ``proc`` are open."""
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(Exception):
                pipe.close()


def env_with(
    extra: dict[str, str] | None = None, pythonpath: Sequence[str | Path] = (TESTS, ROOT)
) -> dict[str, str]:
    """This process's environment, with ``PYTHONPATH`` the folders ``pythonpath`` (by
    default ``tests/`` and the checkout: its handlers and its wirekit) and then ``extra``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath))
    env.update(extra or {})
    return env


def listening_line(line: str) -> bool:
    """Whether ``line`` is the ``listening on ADDRESS`` of a wirekit server."""
    return line.startswith("listening on ")


class ServerProcess:
    """``argv`` in a subprocess (``with`` starts and stops it): stdout piped, its first line
    :attr:`first_line` (stripped), read within ``start_timeout`` seconds; standard error
    read all along by a thread (a chatty server never blocks) and kept: :attr:`log_lines`,
    :attr:`log`, :meth:`count`, :meth:`wait_for_log`.

    ``ready``: whether the first line says the server is ready; when it does not, the
    process is killed and the start fails with an AssertionError naming the line and the
    log (``None``: any line, even none, is left to the test to judge).  ``env``: variables
    added to :func:`env_with`'s; ``pythonpath``: its folders; ``cwd``: where it runs;
    ``max_fds``: its file descriptor limit (``ulimit -n``)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        ready: Callable[[str], bool] | None = bool,
        env: dict[str, str] | None = None,
        pythonpath: Sequence[str | Path] = (TESTS, ROOT),
        cwd: Path | None = None,
        max_fds: int | None = None,
        start_timeout: float = 3 * TIMEOUT,
        stop_timeout: float = 3 * TIMEOUT,
    ) -> None:
        self.argv = list(argv)
        self._is_ready = ready
        self.env = env_with(env, pythonpath)
        self.cwd = cwd
        self.max_fds = max_fds
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen | None = None
        #: the first line it wrote to stdout, stripped ("" if none came in time)
        self.first_line = ""
        #: its log lines (stderr) so far, without their newlines
        self.log_lines: list[str] = []
        self._drain: threading.Thread | None = None

    def _limit_fds(self) -> None:  # in the child, before exec
        import resource

        assert self.max_fds is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_fds, self.max_fds))

    def start(self) -> ServerProcess:
        """Start it and read its first line (see the class)."""
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=self.cwd,
            preexec_fn=self._limit_fds if self.max_fds is not None else None,
        )
        self._drain = threading.Thread(target=self._read_log, daemon=True)
        self._drain.start()
        assert self.proc.stdout is not None
        self.first_line = read_line(self.proc.stdout, self.start_timeout).strip()
        if self._is_ready is not None and not self._is_ready(self.first_line):
            self.proc.kill()
            self.close()
            raise AssertionError(f"{self.argv} did not start: {self.first_line!r} {self.log}")
        return self

    def __enter__(self) -> Any:
        return self.start()

    def _read_log(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with contextlib.suppress(ValueError, OSError):  # the pipe closed under it
            for line in self.proc.stderr:
                self.log_lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        """What it wrote to standard error so far (all of it once it has stopped)."""
        if self._drain is not None and self.proc is not None and self.proc.poll() is not None:
            self._drain.join(TIMEOUT)
        return "".join(line + "\n" for line in list(self.log_lines))

    def count(self, text: str) -> int:
        """How many log lines so far contain ``text``."""
        return sum(text in line for line in list(self.log_lines))

    def wait_for_log(self, text: str, timeout: float = TIMEOUT) -> list[str]:
        """The lines logged containing ``text``, once there is one (AssertionError if none
        comes within ``timeout`` seconds)."""
        until = time.monotonic() + timeout
        while True:
            found = [line for line in list(self.log_lines) if text in line]
            if found:
                return found
            if time.monotonic() > until:
                raise AssertionError(f"no log line with {text!r} in {timeout} s: {self.log_lines}")
            time.sleep(0.05)

    def kill9(self) -> None:
        """SIGKILL it (no goodbye) and reap it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(TIMEOUT)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """Send ``sig`` if it still runs, wait (``stop_timeout`` seconds, then SIGKILL);
        its exit status.  Its log is then complete."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(TIMEOUT)
        if self._drain is not None:
            self._drain.join(self.stop_timeout)  # its log ends when all its children have
        return self.proc.returncode

    def close(self) -> None:
        """Stop it if it runs, close its pipes."""
        if self.proc is not None:
            self.stop()
            close_pipes(self.proc)

    def __exit__(self, *exc: object) -> None:
        self.close()
