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
as they run so that none blocks on a full pipe.

From then on the backends are supervised: one that exits (killed, crashed, its handler
failed) is reaped at once, logged once at WARNING with how it ended (``exited (signal 9,
SIGKILL); restarting in 0.5 s``), and started again on the same address after a back-off --
:data:`RESTART_DELAY`, doubled at each exit of a backend that ran less than
:data:`RESTART_STABLE` seconds, up to :data:`RESTART_DELAY_MAX` -- so one that keeps dying
costs a start every 30 s at most.  :meth:`LocalBackends.problem` says meanwhile why the rows
of that backend are not served (``/readyz`` shows it).

:meth:`LocalBackends.stop` stops the restarts, then sends SIGTERM (the backends finish their
requests in flight) and, past ``grace``, SIGKILL.  The backends run in their own session, so
Ctrl-C in a terminal reaches the dispatcher alone, which stops its front doors first and its
backends after; on Linux each backend also gets SIGTERM when the dispatcher's process dies,
however it dies: no backend outlives it.
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
from ..logs import serve_logger

#: seconds one backend may take to print that it listens
DEFAULT_START_TIMEOUT = 30.0
#: seconds the backends get to finish on SIGTERM before SIGKILL
DEFAULT_GRACE = 10.0
#: bytes of a backend's unfinished output line held between reads at most (plus one read,
#: 64 KiB); a longer line is passed on in pieces
MAX_LINE = 64 * 1024
#: seconds before a backend that exited is started again; doubled at each exit of a backend
#: that ran less than :data:`RESTART_STABLE` seconds, up to :data:`RESTART_DELAY_MAX`
RESTART_DELAY = 0.5
RESTART_DELAY_MAX = 30.0
RESTART_STABLE = 10.0
#: seconds between two looks at a backend's process where no pidfd says when it exits
POLL_INTERVAL = 0.5

log = serve_logger()


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


def exit_text(status: int) -> str:
    """How a process ended, from its :attr:`~subprocess.Popen.returncode`: ``status 3``, or
    ``signal 9, SIGKILL`` for one a signal killed."""
    if status >= 0:
        return f"status {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        return f"signal {-status}"
    return f"signal {-status}, {name}"


def _pidfd(proc: subprocess.Popen[bytes]) -> int | None:
    """A file descriptor that becomes readable when ``proc`` exits (Linux's ``pidfd_open``),
    or None where there is none (then the supervisor polls)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(proc.pid))
    except OSError:  # an old kernel; or it has already been reaped
        return None


@dataclass(slots=True)
class _Slot:
    """What the supervisor knows of one backend: its process now, and its restarts."""

    proc: subprocess.Popen[bytes]
    started: float  #: monotonic time its process was started
    pidfd: int | None
    delay: float = 0.0  #: seconds before its next restart, when it exits
    reaped: bool = False  #: its process has exited, and been reaped
    #: how the backend's last process ended (:func:`exit_text`), until a new one listens
    exited: str | None = None
    restart_at: float | None = None  #: monotonic time it is to be started again


class LocalBackends:
    """The backend processes of a deployment; a context manager (start, then stop).

    Once :meth:`start` has returned, one thread (``wirekit-backends``) supervises them: it
    passes their output on, and when one exits it reaps it, logs one WARNING with how it
    ended, and starts it again on the same address after a back-off (:data:`RESTART_DELAY`,
    doubled at each exit of a backend that ran less than :data:`RESTART_STABLE` seconds, up
    to :data:`RESTART_DELAY_MAX`).  :meth:`problem` says why a row's backend is not serving
    meanwhile (``/readyz`` shows it)."""

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
        #: the process of each backend now (by index of :attr:`backends`; a restart
        #: replaces it)
        self.processes: list[subprocess.Popen[bytes]] = []
        self._slots: list[_Slot] = []
        self._thread: threading.Thread | None = None
        # guards what the supervisor and stop() share: the slots, _stopping, _supervising
        self._changed = threading.Condition()
        self._ready: set[int] = set()  # indices of the backends that listen
        self._ended: set[int] = set()  # indices of those whose (first) process has exited
        self._supervising = False  # start() has returned: an exit is restarted
        self._stopping = False  # stop() has begun: nothing is started any more
        self._wake_r, self._wake_w = -1, -1  # a pipe that wakes the supervisor up
        self._in_child: Callable[[], None] | None = None  # what a new process runs first
        #: row key -> why its backend is not serving (replaced whole: read lock-free)
        self._problems: dict[str, str] = {}

    def addresses(self) -> dict[str, str]:
        """Row key -> the address of its backend."""
        return {key: b.address for b in self.backends for key in b.rows}

    def problem(self, row: str) -> str | None:
        """Why the backend of row ``row`` is not serving now -- its process exited and is
        being restarted (``backend process exited (signal 9, SIGKILL), restarting in 0.5
        s``) -- or None.  Safe from any thread."""
        return self._problems.get(row)

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

    def _spawn(self, backend: LocalBackend, in_child: Callable[[], None] | None) -> _Slot:
        proc = subprocess.Popen(
            self._command(backend),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=self._env(backend),
            start_new_session=True,
            preexec_fn=in_child,
        )
        return _Slot(proc, time.monotonic(), _pidfd(proc), RESTART_DELAY)

    def start(self) -> None:
        """Start every backend and wait until each listens (all in parallel); then
        supervise them."""
        self._in_child = _parent_death_signal()
        try:
            self._wake_r, self._wake_w = os.pipe()
            for backend in self.backends:
                self._slots.append(self._spawn(backend, self._in_child))
                self.processes.append(self._slots[-1].proc)
            self._thread = threading.Thread(
                target=self._supervise, name="wirekit-backends", daemon=True
            )
            self._thread.start()
            self._wait_listening()
        except BaseException:
            self.stop()
            raise

    def _supervise(self) -> None:
        """The supervisor (its own thread, which lives until :meth:`stop`: a process's
        parent-death signal follows the thread that started it).  Reads the backends'
        standard output for as long as they run: the first ``listening on`` line of each
        process says it is ready, any other line goes to ``output`` (so a handler that
        prints never blocks on a full pipe); reaps each process that exits, and starts it
        again when its back-off has passed."""
        pipes: dict[int, tuple[int, subprocess.Popen[bytes]]] = {}  # fd -> backend, process
        pending: dict[int, bytes] = {}
        exits: dict[int, int] = {}  # pidfd -> backend
        with selectors.DefaultSelector() as sel:

            def watch(i: int) -> None:
                slot = self._slots[i]
                assert slot.proc.stdout is not None
                fd = slot.proc.stdout.fileno()
                pipes[fd], pending[fd] = (i, slot.proc), b""
                sel.register(fd, selectors.EVENT_READ)
                if slot.pidfd is not None:
                    exits[slot.pidfd] = i
                    sel.register(slot.pidfd, selectors.EVENT_READ)

            sel.register(self._wake_r, selectors.EVENT_READ)
            with self._changed:
                for i in range(len(self._slots)):
                    watch(i)
            while True:
                with self._changed:
                    if self._stopping and not pipes:
                        break
                    due = [s.restart_at for s in self._slots if s.restart_at is not None]
                    polled = any(s.pidfd is None and not s.reaped for s in self._slots)
                timeout = None if not due else max(0.0, min(due) - time.monotonic())
                if polled:  # no pidfd to say when it exits: look now and then
                    timeout = POLL_INTERVAL if timeout is None else min(timeout, POLL_INTERVAL)
                for key, _ in sel.select(timeout):
                    fd = key.fd
                    if fd == self._wake_r:
                        with contextlib.suppress(OSError):
                            os.read(fd, 512)
                    elif fd in exits:
                        sel.unregister(fd)
                        self._reap(exits.pop(fd))
                    elif fd in pipes:
                        self._relay(fd, pipes, pending, sel)
                for i, slot in enumerate(self._slots):
                    if slot.pidfd is None and not slot.reaped and slot.proc.poll() is not None:
                        self._reap(i)
                now = time.monotonic()
                for i, slot in enumerate(self._slots):
                    due_now = slot.restart_at is not None and slot.restart_at <= now
                    if due_now and self._restart(i):
                        watch(i)
        for fd in exits:  # stop() has reaped them
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.close(self._wake_r)

    def _relay(
        self,
        fd: int,
        pipes: dict[int, tuple[int, subprocess.Popen[bytes]]],
        pending: dict[int, bytes],
        sel: selectors.BaseSelector,
    ) -> None:
        """Pass on what the process of pipe ``fd`` wrote (see :meth:`_supervise`)."""
        i, proc = pipes[fd]
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
            if i not in self._ready and line.startswith(b"listening on"):
                if proc is self._slots[i].proc:
                    self._listening(i)
            elif line:
                self._print(line)
        if not data:  # the process ended (or closed its output)
            sel.unregister(fd)
            del pipes[fd], pending[fd]
            if proc.stdout is not None:
                proc.stdout.close()

    def _listening(self, i: int) -> None:
        with self._changed:
            self._ready.add(i)
            slot = self._slots[i]
            if slot.exited is not None:  # a restarted one
                slot.exited = None
                self._said(i, None)
                backend = self.backends[i]
                log.info(
                    "wirekit serve: backend %s (%s) restarted: listening again",
                    backend.address,
                    ", ".join(backend.rows),
                )
            self._changed.notify_all()

    def _reap(self, i: int) -> None:
        """Backend ``i``'s process has exited: reap it; once supervising, log how it ended
        and set when it starts again."""
        slot = self._slots[i]
        status = slot.proc.wait()
        if slot.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(slot.pidfd)
        with self._changed:
            slot.reaped = True
            slot.exited = exit_text(status)
            self._ended.add(i)
            self._ready.discard(i)
            self._changed.notify_all()
            if not self._supervising or self._stopping:
                return
            now = time.monotonic()
            if now - slot.started >= RESTART_STABLE:  # it had run well: start again soon
                slot.delay = RESTART_DELAY
            delay, slot.delay = slot.delay, min(slot.delay * 2, RESTART_DELAY_MAX)
            slot.restart_at = now + delay
            self._said(i, f"backend process exited ({slot.exited}), restarting in {delay:g} s")
        backend = self.backends[i]
        log.warning(
            "wirekit serve: backend %s (%s) exited (%s); restarting in %g s",
            backend.address,
            ", ".join(backend.rows),
            slot.exited,
            delay,
        )

    def _restart(self, i: int) -> bool:
        """Start backend ``i`` again (not once :meth:`stop` has begun); whether it was."""
        old = self._slots[i]
        old.restart_at = None
        backend = self.backends[i]
        with self._changed:
            if self._stopping:
                return False
            try:
                slot = self._spawn(backend, self._in_child)
            except OSError as exc:  # no process could be made: try again later
                delay, old.delay = old.delay, min(old.delay * 2, RESTART_DELAY_MAX)
                old.restart_at = time.monotonic() + delay
                log.warning(
                    "wirekit serve: backend %s (%s) cannot be started (%s); trying again in %g s",
                    backend.address,
                    ", ".join(backend.rows),
                    exc.strerror or exc,
                    delay,
                )
                return False
            slot.delay, slot.exited = old.delay, old.exited
            self._slots[i] = slot
            self.processes[i] = slot.proc
            self._said(i, f"backend process exited ({old.exited}), restarted, not listening yet")
        return True

    def _said(self, i: int, problem: str | None) -> None:
        """Set what :meth:`problem` says of backend ``i``'s rows."""
        problems = dict(self._problems)
        for row in self.backends[i].rows:
            if problem is None:
                problems.pop(row, None)
            else:
                problems[row] = problem
        self._problems = problems

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
            self._supervising = True

    def stop(self) -> None:
        """Stop supervising (nothing is restarted any more); SIGTERM every backend, SIGKILL
        those still running after ``grace``; reap all."""
        with self._changed:
            self._stopping = True
            self._problems = {}
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
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
        started = self._thread is not None
        if self._thread is not None:
            # their output ends with them (unless a process they started holds it open)
            self._thread.join(self.grace)
            self._thread = None
        for proc in self.processes:
            if proc.stdout is not None:
                proc.stdout.close()
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.close(self._wake_w)
                if not started:  # no supervisor: no one else closes its end
                    os.close(self._wake_r)
            self._wake_r = self._wake_w = -1
        self.processes.clear()

    def __enter__(self) -> LocalBackends:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
