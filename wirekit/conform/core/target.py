"""The implementation under test as a process conform runs and restarts (``--target-cmd``),
or restarts with a command of the user's (``--restart-cmd``).

As Autobahn's fuzzing client does with a server under test: a case that ends the target
(what some implementations die of, a restart of the peer) is then a result, not the end of
the run.  The command runs in a shell of its own process group, with the address it is
tested at in its environment:

* ``WIREKIT_CONFORM_ADDRESS``: ``tcp://HOST:PORT`` (TARGET, or where wirekit listens);
* ``WIREKIT_CONFORM_HOST`` and ``WIREKIT_CONFORM_PORT``: its two parts (tcp only).

Its standard output and error go to a temporary file; the last lines are shown when it does
not serve (a restart that fails because the port is still taken says so there).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from types import TracebackType
from typing import IO

#: seconds a stopped target gets between SIGTERM and SIGKILL
STOP_GRACE = 5.0
#: the lines of the target's output shown when it does not serve
TAIL_LINES = 3


def address_environment(address: str) -> dict[str, str]:
    """The variables that tell a target command where it is tested."""
    env = {"WIREKIT_CONFORM_ADDRESS": address}
    if address.startswith("tcp://"):
        host, _, port = address[len("tcp://") :].rpartition(":")
        env.update(WIREKIT_CONFORM_HOST=host.strip("[]"), WIREKIT_CONFORM_PORT=port)
    return env


class TargetLifecycle:
    """Start, stop and restart the implementation under test.

    ``command`` (``--target-cmd``) is the target itself: :meth:`start` runs it,
    :meth:`stop` ends its process group, :meth:`restart` does both.  ``restart_command``
    (``--restart-cmd``) restarts a target conform did not start: :meth:`restart` runs it to
    its end.  ``start_timeout`` bounds how long a (re)started target may take to serve (the
    runner waits for it) and how long ``restart_command`` may run.
    """

    def __init__(
        self,
        command: str | None,
        restart_command: str | None,
        address: str,
        start_timeout: float,
    ) -> None:
        if not command and not restart_command:
            raise ValueError("a target lifecycle needs a command or a restart command")
        self.command = command
        self.restart_command = restart_command
        self.address = address
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0  #: how many times the target was started or restarted
        self._log: IO[bytes] = tempfile.TemporaryFile(prefix="wirekit-conform-target-")  # noqa: SIM115

    def __enter__(self) -> TargetLifecycle:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _environment(self) -> dict[str, str]:
        return {**os.environ, **address_environment(self.address)}

    @property
    def owns_process(self) -> bool:
        """Whether conform runs the target itself (``--target-cmd``)."""
        return bool(self.command)

    def start(self) -> None:
        """Run ``command`` (a target conform owns); it must then come to serve."""
        assert self.command, "start() needs --target-cmd"
        self.process = subprocess.Popen(
            self.command,
            shell=True,
            env=self._environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.starts += 1

    def running(self) -> bool:
        """False once a target conform started has exited (True when conform does not own
        the process: whether it serves is the runner's question to the target)."""
        if self.process is None:
            return not self.owns_process
        return self.process.poll() is None

    def stop(self) -> None:
        """End the target's process group: SIGTERM, then SIGKILL after :data:`STOP_GRACE`."""
        proc, self.process = self.process, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, STOP_GRACE)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def restart(self) -> str | None:
        """Restart the target; None when done, else what went wrong (the restart command
        failed or ran past ``start_timeout``).  Whether it serves again is for the runner
        to wait for."""
        if self.command:
            self.stop()
            self.start()
            return None
        assert self.restart_command
        try:
            done = subprocess.run(
                self.restart_command,
                shell=True,
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                timeout=self.start_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"--restart-cmd ran past {self.start_timeout:g} s"
        self.starts += 1
        if done.returncode != 0:
            return f"--restart-cmd exited {done.returncode}{self.describe_output()}"
        return None

    def describe_exit(self) -> str:
        """How the target ended, for a report: ``exited 1: OSError: ...``; "" if running."""
        if self.process is None or self.process.poll() is None:
            return ""
        return f" (it exited {self.process.returncode}{self.describe_output()})"

    def describe_output(self) -> str:
        """``: LAST LINES`` of the target's output (joined with `` | ``), or ""."""
        lines = self.output_tail()
        return f": {' | '.join(lines)}" if lines else ""

    def output_tail(self, lines: int = TAIL_LINES) -> list[str]:
        """The last non-blank lines the target (or the restart command) wrote."""
        with contextlib.suppress(OSError):
            self._log.flush()
            size = self._log.seek(0, os.SEEK_END)
            self._log.seek(max(0, size - 4096))
            text = self._log.read().decode("utf-8", "replace")
            self._log.seek(0, os.SEEK_END)
            return [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return []

    def close(self) -> None:
        """Stop the target (if conform runs it) and drop its output."""
        self.stop()
        self._log.close()
