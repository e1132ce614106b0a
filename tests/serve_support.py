"""Helpers for the ``wirekit serve`` tests: tagged model handlers, deployments on port 0,
the dispatcher as a real subprocess, HTTP calls with timeouts.

Every blocking call has a timeout; every server, subprocess and session is closed on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from wirekit.mip.server import Server

TIMEOUT = 10.0
ROOT = Path(__file__).resolve().parent.parent


def tagged(tag: str, *, gate: asyncio.Event | None = None, delay: float = 0.0):
    """A handler answering each sample ``"<tag>:<INPUT UPPERCASED>"`` (so a client can check
    both the answer and which device gave it).  ``gate``: hold every request until set."""

    async def handler(batch):
        if gate is not None:
            await gate.wait()
        if delay:
            await asyncio.sleep(delay)
        return [[f"{tag}:{sample[0].as_text().upper()}"] for sample in batch]

    return handler


def answer_of(text: str) -> tuple[str, str]:
    """``"tag:VALUE"`` -> ``(tag, "VALUE")``."""
    tag, _, value = text.partition(":")
    return tag, value


async def start_backend(handler, **options: Any) -> tuple[Server, int]:
    """A wirekit MIP server on 127.0.0.1, port 0, in the running loop."""
    server = Server(handler, **options)
    await server.start("tcp://127.0.0.1:0")
    return server, int(server.address.rsplit(":", 1)[1])


def deployment(
    store_path: Path,
    models: dict[str, dict[str, Any]],
    nodes: list[dict[str, Any]],
    **top: Any,
) -> dict[str, Any]:
    """A deployment document listening on port 0 everywhere (``top`` keys replace)."""
    doc: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "http_port": 0},
        "store": {"path": str(store_path)},
        "models": {name: {"port": 0, **m} for name, m in models.items()},
        "nodes": nodes,
    }
    doc.update(top)
    return doc


def admin_headers(service: Any) -> dict[str, str]:
    """The ``Authorization`` header of the admin API of an in-process ``Service`` (its
    configured token, or the one it generated)."""
    return {"Authorization": f"Bearer {service.admin_token}"}


def terminate(proc: subprocess.Popen) -> None:
    """SIGTERM ``proc`` if it still runs, SIGKILL it if it does not end in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(TIMEOUT * 3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT)


class DispatcherProcess:
    """``wirekit serve --config FILE`` in a subprocess; ``addresses`` from its ready line.

    ``env``: more environment variables (``WIREKIT_LOOP``...); ``max_fds``: its file
    descriptor limit (``ulimit -n``); ``args``: more command-line flags.  Its log (standard
    error) is kept: :attr:`log_lines`, :meth:`wait_for_log`."""

    def __init__(
        self,
        config: Path,
        *,
        env: dict[str, str] | None = None,
        max_fds: int | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.config = config
        self.args = args
        self.env = env or {}
        self.max_fds = max_fds
        self.proc: subprocess.Popen | None = None
        self.addresses: dict[str, Any] = {}
        #: its log lines (stderr), as they are read (from the ready line on)
        self.log_lines: list[str] = []

    @classmethod
    def of(cls, doc: dict[str, Any], directory: Path, **options: Any) -> DispatcherProcess:
        """For the deployment ``doc``, written to ``directory/deployment.json``."""
        config = directory / "deployment.json"
        config.write_text(json.dumps(doc))
        return cls(config, **options)

    def _limit_fds(self) -> None:  # in the child, before exec
        import resource

        assert self.max_fds is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_fds, self.max_fds))

    def __enter__(self) -> DispatcherProcess:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
        env.update(self.env)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "wirekit.cli",
                "serve",
                "--config",
                str(self.config),
                *self.args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=self._limit_fds if self.max_fds is not None else None,
        )
        line = _readline(self.proc, TIMEOUT * 3)
        try:
            ready = json.loads(line)
        except ValueError:
            ready = {}
        if ready.get("event") != "ready":
            self.proc.kill()
            _out, err = self.proc.communicate(timeout=TIMEOUT)
            raise AssertionError(f"wirekit serve did not start: {line!r} {err}")
        self.addresses = ready
        # Drain stderr so a chatty log can never block the dispatcher (kept: its log lines).
        self._drain = threading.Thread(target=self._read_log, daemon=True)
        self._drain.start()
        return self

    def _read_log(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log_lines.append(line.rstrip("\n"))

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

    @property
    def log(self) -> str:
        """What the dispatcher wrote to standard error (complete once it has stopped)."""
        self._drain.join(TIMEOUT)
        return "\n".join(self.log_lines)

    def mip_address(self, model: str) -> str:
        return f"tcp://127.0.0.1:{self.addresses['mip'][model]}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.addresses['http']}"

    @property
    def admin_token(self) -> str:
        """The admin token the dispatcher generated (read from the file its ready line
        names; a config with ``admin.token`` has none)."""
        return Path(self.addresses["admin_token_file"]).read_text().strip()

    @property
    def admin_headers(self) -> dict[str, str]:
        """The headers of an admin API request: its generated token, a JSON body."""
        return {"Authorization": f"Bearer {self.admin_token}", "Content-Type": "application/json"}

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(TIMEOUT)

    def stop(self) -> int:
        assert self.proc is not None
        terminate(self.proc)
        return self.proc.returncode

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.stop()
            self._drain.join(TIMEOUT)
            for pipe in (self.proc.stdout, self.proc.stderr):
                with contextlib.suppress(Exception):
                    pipe.close()


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return result[0].strip() if result else ""


class BackendProcess:
    """``wirekit mip serve --handler HANDLER [--cgroup PATH]`` on port 0 in a subprocess."""

    def __init__(self, handler: str, *, cgroup: Path | None = None) -> None:
        self.argv = [sys.executable, "-m", "wirekit.cli", "mip", "serve", "--handler", handler]
        self.argv += ["--listen", "tcp://127.0.0.1:0", "--log-level", "warning"]
        if cgroup is not None:
            self.argv += ["--cgroup", str(cgroup)]
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def __enter__(self) -> BackendProcess:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        line = _readline(self.proc, TIMEOUT * 3)
        if not line.startswith("listening on "):
            self.proc.kill()
            _out, err = self.proc.communicate(timeout=TIMEOUT)
            raise AssertionError(f"wirekit mip serve did not start: {line!r} {err}")
        self.port = int(line.rsplit(":", 1)[1])
        self._drain = threading.Thread(target=self.proc.stderr.read, daemon=True)
        self._drain.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        terminate(self.proc)
        self._drain.join(TIMEOUT)
        for pipe in (self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(Exception):
                pipe.close()


def cgroup_root() -> Path:
    """A directory where the tests may create CPU cgroups (the v1 ``cpu`` controller's
    hierarchy or the v2 root).  Skips the test saying why there is none -- or fails it when
    ``WIREKIT_REQUIRE_CGROUPS=1`` (CI, which runs as root with a writable controller)."""
    import uuid

    import pytest

    reason = "no cgroup CPU controller is mounted at /sys/fs/cgroup"
    for root in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")):
        if (root / "cpu.cfs_quota_us").exists() or (root / "cgroup.subtree_control").exists():
            probe = root / f"wirekit-probe-{uuid.uuid4().hex[:8]}"
            try:
                probe.mkdir()
                probe.rmdir()
            except OSError as exc:
                reason = f"cgroups at {root} cannot be written: {exc.strerror or exc}"
                break
            return root
    if os.environ.get("WIREKIT_REQUIRE_CGROUPS") == "1":
        pytest.fail(f"WIREKIT_REQUIRE_CGROUPS=1 but {reason}")
    pytest.skip(reason)


def remove_cgroup(path: Path) -> None:
    """Remove a test's cgroup once its processes are gone (retried briefly: the kernel
    takes a moment to let go of exited tasks)."""
    import time

    for _ in range(100):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    path.rmdir()


def run(coro, timeout: float = 60.0):
    """Run a test coroutine with an overall time bound."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
