"""The backends of a deployment, started on this machine (``wirekit serve --with-backends``).

For every MIP/KubeMo device of the config with a quota > 0, one ``wirekit mip serve`` process
(on the dispatcher's own wirekit package: :func:`wirekit_command`) listens on the device's
``endpoint:port`` and serves its model's ``handler`` (the built-in echo when the config
names none); the config file's directory is put on the processes'
``PYTHONPATH``, so a handler module beside the config is found.  Each process learns its
row from ``WIREKIT_ROW`` (``node/device/model``; several, comma-separated, when rows share
one backend).

:meth:`LocalBackends.start` returns once every backend prints that it listens (or stops
the ones it started and raises :class:`BackendStartError`); what else the backends print
(a handler's ``print``) is passed on to ``output`` (the dispatcher's stderr), read for as long
as they run so that none blocks on a full pipe.  :meth:`LocalBackends.stop` sends
SIGTERM (the backends finish their requests in flight) and, past ``grace``, SIGKILL.  The
backends run in their own session, so Ctrl-C in a terminal reaches the dispatcher alone,
which stops its front doors first and its backends after; on Linux each backend also gets
SIGTERM when the dispatcher's process dies, however it dies: no backend outlives it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..config import SERVER_KINDS, ConfigError, Deployment

#: seconds one backend may take to print that it listens
DEFAULT_START_TIMEOUT = 30.0
#: seconds the backends get to finish on SIGTERM before SIGKILL
DEFAULT_GRACE = 10.0
#: bytes of a backend's unfinished output line held between reads at most (plus one read,
#: 64 KiB); a longer line is passed on in pieces
MAX_LINE = 64 * 1024


def wirekit_command(*args: str) -> list[str]:
    """The argv of a child process that runs ``wirekit ARGS`` on this process's own wirekit
    package.  (``python -m wirekit`` would import the ``wirekit`` folder of its working
    directory first: in a source checkout with an installed wirekit, an uncompiled tree,
    the pure-Python path.)  The child imports the package from where this process did,
    then puts its path back as Python set it, so a handler module is looked up as before."""
    import wirekit

    home = str(Path(wirekit.__file__).resolve().parent.parent)
    launch = (
        f"import sys; sys.path.insert(0, {home!r}); import wirekit; del sys.path[0]; "
        "import runpy; runpy.run_module('wirekit', run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-c", launch, *args]


class BackendStartError(RuntimeError):
    """A backend did not come up: it exited, or did not listen in time."""


@dataclass(frozen=True, slots=True)
class LocalBackend:
    """One backend process to run: where it listens and what it serves."""

    rows: tuple[str, ...]  #: the ``node/device/model`` keys it serves
    host: str
    port: int
    handler: str

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


def is_local(host: str) -> bool:
    """Whether ``host`` names this machine (``localhost`` or a loopback/unspecified IP)."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def plan(dep: Deployment) -> list[LocalBackend]:
    """The backend processes ``dep`` needs on this machine; :class:`ConfigError` for a
    device this command cannot start (a Clipper model, a remote endpoint)."""
    backends: dict[tuple[str, int], LocalBackend] = {}
    for row in dep.rows:
        if row.quota == 0:
            continue
        where = row.key
        if row.backend == "clipper":
            raise ConfigError(
                where,
                "--with-backends starts MIP backends; Clipper containers connect to the "
                "dispatcher on their own (wirekit clipper container)",
            )
        if row.backend in SERVER_KINDS:
            raise ConfigError(
                where,
                f"--with-backends starts MIP backends; a {row.backend} device is a model"
                " server of your own (MLServer, KServe, TF Serving), started apart",
            )
        if not is_local(row.endpoint):
            raise ConfigError(
                where,
                f"--with-backends starts backends on this machine, and {row.endpoint!r} "
                "is not a loopback address",
            )
        assert row.port is not None  # MIP rows with a quota have a port (config.py)
        handler = dep.models[row.model].handler
        key = (row.endpoint, row.port)
        same = backends.get(key)
        if same is None:
            backends[key] = LocalBackend((row.key,), row.endpoint, row.port, handler)
        elif same.handler != handler:
            raise ConfigError(
                where,
                f"port {row.port} is also {same.rows[0]}, whose model has another handler",
            )
        else:
            backends[key] = LocalBackend((*same.rows, row.key), row.endpoint, row.port, handler)
    return list(backends.values())


def _parent_death_signal() -> Callable[[], None] | None:
    """Linux: what the child runs between fork and exec so that it gets SIGTERM when the
    process that started it dies (``PR_SET_PDEATHSIG``); elsewhere None."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the child
    parent = os.getpid()

    def in_child() -> None:  # pragma: no cover - runs in the child
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


class LocalBackends:
    """The backend processes of a deployment; a context manager (start, then stop)."""

    def __init__(
        self,
        dep: Deployment,
        *,
        path: str | Path | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        grace: float = DEFAULT_GRACE,
        output: TextIO | None = None,
        log_format: str = "text",
    ) -> None:
        self.backends = plan(dep)
        #: the backends' ``--log-format`` (their log shares the dispatcher's standard error)
        self.log_format = log_format
        self.output = output if output is not None else sys.stderr  #: their other output
        self.path = None if path is None else str(path)
        self.start_timeout = start_timeout
        self.grace = grace
        self.processes: list[subprocess.Popen[bytes]] = []
        self._relay: threading.Thread | None = None
        self._changed = threading.Condition()
        self._ready: set[int] = set()  # indices of the backends that listen
        self._ended: set[int] = set()  # indices of those whose output ended

    def addresses(self) -> dict[str, str]:
        """Row key -> the address of its backend."""
        return {key: b.address for b in self.backends for key in b.rows}

    def _command(self, backend: LocalBackend) -> list[str]:
        return wirekit_command(
            "mip", "serve", "--listen", backend.address, "--handler", backend.handler,
            "--log-level", "warning", "--log-format", self.log_format,
        )  # fmt: skip

    def _env(self, backend: LocalBackend) -> dict[str, str]:
        env = dict(os.environ, WIREKIT_ROW=",".join(backend.rows))
        if self.path is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (self.path, env.get("PYTHONPATH")) if p)
        return env

    def start(self) -> None:
        """Start every backend and wait until each listens (all in parallel)."""
        in_child = _parent_death_signal()
        try:
            for backend in self.backends:
                self.processes.append(
                    subprocess.Popen(
                        self._command(backend),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        env=self._env(backend),
                        start_new_session=True,
                        preexec_fn=in_child,
                    )
                )
            self._relay = threading.Thread(
                target=self._relay_output, name="wirekit-backends-output", daemon=True
            )
            self._relay.start()
            self._wait_listening()
        except BaseException:
            self.stop()
            raise

    def _relay_output(self) -> None:
        """Read the backends' standard output for as long as they run: the first
        ``listening on`` line of each says it is ready, any other line goes to ``output``
        (so a handler that prints never blocks on a full pipe)."""
        pipes: dict[int, int] = {}  # fd -> index of its backend
        for i, proc in enumerate(self.processes):
            assert proc.stdout is not None
            pipes[proc.stdout.fileno()] = i
        pending = dict.fromkeys(pipes, b"")
        with selectors.DefaultSelector() as sel:
            for fd in pipes:
                sel.register(fd, selectors.EVENT_READ)
            while pipes:
                for key, _ in sel.select():
                    fd = key.fd
                    try:
                        data = os.read(fd, 65536)
                    except OSError:
                        data = b""
                    lines = (pending[fd] + data).split(b"\n")
                    pending[fd] = lines.pop() if data else b""
                    if len(pending[fd]) >= MAX_LINE:  # a long line goes on in pieces
                        lines.append(pending[fd])
                        pending[fd] = b""
                    for line in lines:
                        if pipes[fd] not in self._ready and line.startswith(b"listening on"):
                            with self._changed:
                                self._ready.add(pipes[fd])
                                self._changed.notify_all()
                        elif line:
                            self._print(line)
                    if not data:  # the backend ended (or closed its output)
                        sel.unregister(fd)
                        with self._changed:
                            self._ended.add(pipes.pop(fd))
                            self._changed.notify_all()

    def _print(self, line: bytes) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed output: lines are dropped
            self.output.write(line.decode("utf-8", "replace") + "\n")
            self.output.flush()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        with self._changed:
            while len(self._ready) < len(self.processes):
                for i, (backend, proc) in enumerate(
                    zip(self.backends, self.processes, strict=True)
                ):
                    if i not in self._ready and (i in self._ended or proc.poll() is not None):
                        raise BackendStartError(
                            f"backend {backend.address} ({', '.join(backend.rows)}) exited "
                            f"with status {proc.wait()} before listening (its error is above)"
                        )
                left = deadline - time.monotonic()
                if left <= 0:
                    i = min(set(range(len(self.processes))) - self._ready)
                    backend = self.backends[i]
                    raise BackendStartError(
                        f"backend {backend.address} ({', '.join(backend.rows)}) did not "
                        f"listen within {self.start_timeout:g} s"
                    )
                self._changed.wait(min(left, 0.1))

    def stop(self) -> None:
        """SIGTERM every backend, SIGKILL those still running after ``grace``; reap all."""
        for proc in self.processes:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for proc in self.processes:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._relay is not None:
            # their output ends with them (unless a process they started holds it open)
            self._relay.join(self.grace)
            self._relay = None
        for proc in self.processes:
            if proc.stdout is not None:
                proc.stdout.close()
        self.processes.clear()

    def __enter__(self) -> LocalBackends:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
