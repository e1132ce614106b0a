"""Real OIP model servers for tests and benchmarks: MLServer 1.7.1 and KServe 0.21.0 processes.

Each runs from its own cached virtualenv (``peer_venvs.py``: pinned, from PyPI), with the
models of ``tests/oip_models/``:

* ``echo``: outputs = inputs (name, datatype, shape, data);
* ``iris``: a scikit-learn ``LogisticRegression`` trained at test time on the iris data
  scikit-learn ships (:func:`train_iris`, inside the peer's virtualenv), saved with joblib;
  input ``[N, 4]`` (FP32 or FP64), output ``predict`` INT64, the classes (MLServer through
  its ``mlserver-sklearn`` runtime: shape ``[N, 1]``; KServe through a small
  ``kserve.Model``: shape ``[N]``; its TF Serving REST ``:predict`` answers
  ``{"predictions": [class, ...]}``);
* ``broken``: its load fails with :data:`BROKEN_MESSAGE`;
* ``slow``: the echo, whose load takes :data:`SLOW_LOAD_SECONDS` and each answer
  :data:`SLOW_PREDICT_SECONDS` (a server caught mid-load, requests in flight when killed).

:func:`start_mlserver` listens on 127.0.0.1 (free ports); its models live in a model folder,
loadable and unloadable through the repository extension (``load_at_startup=False``: none
loaded at start).  :func:`start_kserve` runs inside a :class:`Namespace` (KServe binds 0.0.0.0
whatever it is told: a network namespace of the test's own with only ``lo`` up keeps it off
every other interface), its ``ModelServer`` given a repository whose ``load`` really loads a
model folder.  The test process talks to a server in a namespace through
:meth:`Namespace.run` (a thread that entered the namespace: the sockets it makes are the
namespace's), :meth:`Namespace.forward` (a port on this namespace's loopback relayed into
it: any client, gRPC's included) or a process started there (:meth:`Namespace.command`).

Everything is bounded (:data:`START_TIMEOUT`) and cleaned up: :meth:`Server.stop` (SIGTERM,
then SIGKILL of the whole process tree), :meth:`Server.kill` (SIGKILL at once), the namespace
deleted on exit; started from the main thread, a server dies with the test process even
when that is killed (``PR_SET_PDEATHSIG``), and a namespace left by a killed run is deleted by
the next one.  :func:`running_mlserver` / :func:`running_kserve` are context managers;
``oip_fixtures.py`` has module-scoped pytest fixtures of them.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import http.client
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import peer_venvs

TESTS = Path(__file__).resolve().parent
MODELS_CODE = TESTS / "oip_models"
#: the iris model's trainer: the MLServer sample's own (samples/mlserver/)
IRIS_TRAINER = TESTS.parent / "samples" / "mlserver" / "train_iris.py"
#: bound on a server's start (KServe and MLServer import a lot on 2 busy cores)
START_TIMEOUT = 180.0
#: bound on a stop's SIGTERM before SIGKILL
STOP_TIMEOUT = 15.0
#: the models the servers know
MODEL_KINDS = ("echo", "iris", "broken", "slow")
#: the ``slow`` echo: how long its load takes, and each of its answers
SLOW_LOAD_SECONDS = 2.0
SLOW_PREDICT_SECONDS = 0.3
#: what the ``broken`` model's load fails with (both servers put it in their answer)
BROKEN_MESSAGE = "broken model: its load fails on purpose (tests/oip_models)"
#: a few iris rows (sepal length, sepal width, petal length, petal width) and their classes
IRIS_ROWS = [[5.1, 3.5, 1.4, 0.2], [7.0, 3.2, 4.7, 1.4], [6.3, 3.3, 6.0, 2.5], [4.9, 3.0, 1.4, 0.2]]
IRIS_CLASSES = [0, 1, 2, 0]

T = TypeVar("T")


# --- ports, logs, environments ------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (in the calling thread's network namespace)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free TCP ports on ``host`` (held together while chosen)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def peer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without what points Python at wirekit's tree or venv, with the
    models' code (``tests/oip_models``) on ``PYTHONPATH``, unbuffered, then ``extra``."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "WIREKIT_REQUIRE_FAST"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PYTHONPATH=str(MODELS_CODE), PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def spawn(
    argv: Sequence[str],
    log: Path,
    *,
    ns: Namespace | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdout_pipe: bool = False,
    stdin_pipe: bool = False,
) -> subprocess.Popen:
    """``argv`` started (inside ``ns`` when given) in a session of its own (so that its whole
    process group can be killed), stderr -- and stdout unless ``stdout_pipe`` -- to ``log``
    (text pipes; stdin from ``/dev/null`` unless ``stdin_pipe``).  Started from the main
    thread, it is SIGKILLed by the kernel if this process dies first (``PR_SET_PDEATHSIG``:
    a test run killed leaves no server behind)."""
    main = threading.current_thread() is threading.main_thread()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return subprocess.Popen(
            ns.command(argv) if ns else list(argv),
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else fd,
            stderr=fd,
            env=env,
            cwd=cwd,
            start_new_session=True,
            text=True,
            preexec_fn=_die_with_parent if main and _PRCTL is not None else None,
        )
    finally:
        os.close(fd)


def _libc_prctl() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).prctl
    return None


#: prctl(2), resolved here: the child of a fork only calls it
_PRCTL: Any = _libc_prctl() if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """(In a forked child, before exec.)  Be SIGKILLed when the thread that forked ends."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


# --- process trees ------------------------------------------------------------------------------


def descendants(roots: Sequence[int]) -> set[int]:
    """``roots`` and every live process below them (from ``/proc/*/stat``'s parent ids;
    zombies are not live)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            if state != "Z":  # a zombie has ended (its parent has yet to reap it)
                parents[int(entry.name)] = int(ppid)
    tree = {pid for pid in roots if pid in parents}
    grew = True
    while grew:
        below = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        grew = bool(below)
        tree |= below
    return tree


def tree_cpu_ns(roots: Sequence[int]) -> int:
    """The CPU time (user+sys, in ns) of every thread of ``roots`` and their descendants."""
    total = 0
    for pid in descendants(roots):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    total += int((task / "schedstat").read_text().split()[0])
    return total


def kill_tree(proc: subprocess.Popen, tree: set[int] | None = None) -> None:
    """SIGKILL ``proc``, its process group and every descendant (MLServer's workers), and
    reap it; ``tree``: its descendants as found before (a worker its parent's exit has
    orphaned is no longer one), else found now."""
    if tree is None:
        tree = descendants([proc.pid])
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in tree:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_TIMEOUT)


# --- the network namespace ----------------------------------------------------------------------

_CLONE_NEWNET = 0x40000000
_names = itertools.count()


def namespace_unavailable() -> str | None:
    """Why no network namespace can be made here (``None``: it can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "creating a network namespace (ip netns add) needs root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    return None


def open_namespace(stack: contextlib.ExitStack) -> tuple[Namespace | None, str | None]:
    """A namespace entered on ``stack`` and ``None``, or ``None`` and why none can be made
    here (not root, no ``ip``, or ``ip netns add`` refused: a container without the right)."""
    reason = namespace_unavailable()
    if reason is not None:
        return None, reason
    try:
        return stack.enter_context(Namespace()), None
    except subprocess.CalledProcessError as exc:
        stderr = exc.stderr.decode(errors="replace").strip() if exc.stderr else ""
        return None, f"{' '.join(exc.cmd)} failed: {stderr or exc.returncode}"


class Namespace:
    """A network namespace of the test's own with only loopback up (``with`` creates it and,
    at the end, stops its relays and threads and deletes it).

    Processes run in it through :meth:`command` (``ip netns exec``: same pid); this process
    reaches into it through :meth:`run` / :meth:`submit` (threads that entered it with
    ``setns(2)``: sockets they create belong to it, and stay usable from any thread) and
    :meth:`forward` (a port on this process's own loopback relayed to a port in it)."""

    def __init__(self, name: str | None = None, *, threads: int = 8) -> None:
        self.name = name or f"wirekit-test-{os.getpid()}-{next(_names)}"
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._relays: list[_Relay] = []

    def __enter__(self) -> Namespace:
        _delete_stale_namespaces()
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True)
        try:
            self.check(["ip", "link", "set", "lo", "up"])
        except BaseException:
            self.delete()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def path(self) -> Path:
        """The namespace's handle (``ip netns`` mounts it here)."""
        return Path("/run/netns") / self.name

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def check(self, argv: Sequence[str], timeout: float = 30.0) -> str:
        """Run ``argv`` in the namespace to its end (bounded); its stdout; raise if it fails."""
        return subprocess.run(
            self.command(argv), check=True, capture_output=True, text=True, timeout=timeout
        ).stdout

    def listening(self) -> list[str]:
        """The listening TCP sockets in the namespace (``ss -Htln``'s local addresses)."""
        out = self.check(["ss", "-Htln"])
        return [line.split()[3] for line in out.splitlines() if line.strip()]

    def _enter(self) -> None:
        """Move the calling thread into the namespace (``setns(2)``: this thread only)."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into {self.name}: {os.strerror(err)}")
        finally:
            os.close(fd)

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """``fn(*args, **kwargs)`` on one of the namespace's threads (a pool of ``threads``,
        each of which entered the namespace once)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self._threads, thread_name_prefix=f"netns-{self.name}", initializer=self._enter
            )
        return self._pool.submit(fn, *args, **kwargs)

    def run(self, fn: Callable[..., T], *args: Any, timeout: float = 60.0, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` run inside the namespace; its result (its exception
        raised here), within ``timeout`` seconds (``TimeoutError`` else)."""
        return self.submit(fn, *args, **kwargs).result(timeout)

    def socket(self, host: str, port: int, timeout: float = 10.0) -> socket.socket:
        """A TCP connection to ``host:port`` inside the namespace (usable from any thread)."""
        return self.run(socket.create_connection, (host, port), timeout, timeout=timeout + 5)

    def forward(self, port: int, host: str = "127.0.0.1") -> int:
        """A port on this process's loopback (127.0.0.1, in the namespace the caller is in)
        whose connections are relayed to ``host:port`` inside this namespace; stops with the
        namespace.  Lets any client (a gRPC channel, a ``wirekit serve`` backend) reach a
        server that must stay inside it.  Where nothing listens inside, a connection is
        accepted then closed at once (not refused)."""
        relay = _Relay(self, host, port)
        self._relays.append(relay)
        return relay.port

    def close(self) -> None:
        """Stop the relays and threads, delete the namespace (its processes must be gone)."""
        for relay in self._relays:
            relay.close()
        self._relays.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self.delete()

    def delete(self) -> None:
        """Delete the namespace (``ip netns delete``)."""
        subprocess.run(
            ["ip", "netns", "delete", self.name], check=False, capture_output=True, timeout=30
        )


def _delete_stale_namespaces() -> None:
    """Delete the namespaces of test processes that died without deleting theirs
    (``wirekit-test-PID-N`` whose PID no longer runs)."""
    listed = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.strip() else ""
        parts = name.split("-")
        ours = name.startswith("wirekit-test-") and len(parts) == 4 and parts[2].isdigit()
        if ours and not Path(f"/proc/{parts[2]}").exists():
            subprocess.run(
                ["ip", "netns", "delete", name], capture_output=True, timeout=30, check=False
            )


class _Relay:
    """A listener on 127.0.0.1 here whose every connection is relayed, both ways, to a TCP
    connection made inside a namespace (daemon threads; :meth:`close` ends them)."""

    def __init__(self, ns: Namespace, host: str, port: int) -> None:
        self.ns, self.target = ns, (host, port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = int(self.listener.getsockname()[1])
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{port}").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = self.ns.socket(*self.target)
            except Exception:
                client.close()
                continue
            with self.lock:
                self.open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def _discard(self, sock: socket.socket) -> None:
        with self.lock:
            self.open.discard(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        with self.lock:
            open_now, self.open = list(self.open), set()
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


# --- servers ------------------------------------------------------------------------------------


@dataclass
class Response:
    """An HTTP answer: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


def http_call(
    host: str,
    port: int,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Response:
    """One HTTP/1.1 request (a fresh connection); ``body``: bytes, or JSON-encoded."""
    data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
    sent = dict(headers or {})
    if data is not None and not isinstance(body, bytes):
        sent.setdefault("Content-Type", "application/json")
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=data, headers=sent)
        answer = conn.getresponse()
        return Response(
            answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
        )
    finally:
        conn.close()


@dataclass
class Server:
    """A running model server: its processes, ports (``http``, ``grpc``, and MLServer's
    ``metrics``), logs, and the namespace it runs in (``None``: this one's)."""

    who: str
    procs: list[subprocess.Popen]
    ports: dict[str, int]
    logs: list[Path] = field(default_factory=list)
    ns: Namespace | None = None
    host: str = "127.0.0.1"
    #: the folder of its model folders
    models_dir: Path | None = None
    _outside: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def pids(self) -> list[int]:
        """The roots of its process trees."""
        return [p.pid for p in self.procs]

    @property
    def rest_url(self) -> str:
        """``http://host:port`` of its REST port (inside its namespace, if any)."""
        return f"http://{self.host}:{self.ports['http']}"

    def local_port(self, kind: str = "http") -> int:
        """A port on 127.0.0.1 of the caller's own namespace where its ``kind`` port
        (``http``, ``grpc``) answers: the port itself, or for a server inside a namespace a
        relay into it (:meth:`Namespace.forward`, made once) -- what a client that cannot
        enter the namespace (a gRPC channel, a ``wirekit serve`` backend) connects to."""
        if self.ns is None:
            return self.ports[kind]
        if kind not in self._outside:
            self._outside[kind] = self.ns.forward(self.ports[kind], self.host)
        return self._outside[kind]

    def address(self, kind: str = "http") -> str:
        """``127.0.0.1:PORT`` of :meth:`local_port`."""
        return f"127.0.0.1:{self.local_port(kind)}"

    def cpu_ns(self) -> int:
        """Its CPU time so far (every process tree), in ns."""
        return tree_cpu_ns(self.pids)

    def alive(self) -> bool:
        """Whether all its processes still run."""
        return all(p.poll() is None for p in self.procs)

    def check_alive(self) -> None:
        """Raise ``RuntimeError`` (with its log's tail) if a process of it has ended."""
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{self.who}: process {proc.args!r} ended ({proc.returncode}): "
                    f"{self.log_tail()}"
                )

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of its logs."""
        tails = []
        for log in self.logs:
            with contextlib.suppress(OSError):
                tails.append("\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(tails)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Response:
        """One HTTP request to its REST port (from inside its namespace when it has one)."""
        args = (self.host, self.ports["http"], method, path, body, headers, timeout)
        if self.ns is None:
            return http_call(*args)
        return self.ns.run(http_call, *args, timeout=timeout + 5)

    def infer(self, model: str, inputs: list[dict[str, Any]], **extra: Any) -> Response:
        """``POST /v2/models/MODEL/infer`` with these OIP JSON inputs."""
        return self.request("POST", f"/v2/models/{model}/infer", {"inputs": inputs, **extra})

    def load(self, model: str, timeout: float = 60.0) -> Response:
        """``POST /v2/repository/models/MODEL/load`` (the repository extension)."""
        return self.request("POST", f"/v2/repository/models/{model}/load", {}, timeout=timeout)

    def unload(self, model: str, timeout: float = 60.0) -> Response:
        """``POST /v2/repository/models/MODEL/unload``."""
        return self.request("POST", f"/v2/repository/models/{model}/unload", {}, timeout=timeout)

    def model_ready(self, model: str) -> bool:
        """Whether ``GET /v2/models/MODEL/ready`` says 200."""
        try:
            return self.request("GET", f"/v2/models/{model}/ready", timeout=5).status == 200
        except OSError:
            return False

    def wait_ready(self, models: Sequence[str] = (), timeout: float = START_TIMEOUT) -> Server:
        """Wait (at most ``timeout`` s) until ``/v2/health/ready`` and each of ``models``'
        ``/v2/models/NAME/ready`` answer 200; raise ``RuntimeError`` with its log's tail if
        it ends or the time runs out first."""
        end = time.monotonic() + timeout
        pending = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)]
        last = ""
        while pending:
            self.check_alive()
            try:
                answer = self.request("GET", pending[0], timeout=5)
                if answer.status == 200:
                    pending.pop(0)
                    continue
                last = f"{pending[0]}: {answer.status}"
            except (OSError, TimeoutError) as exc:
                last = f"{pending[0]}: {exc!r}"
            if time.monotonic() > end:
                raise RuntimeError(
                    f"{self.who} not ready within {timeout:.0f} s ({last}): {self.log_tail()}"
                )
            time.sleep(0.2)
        return self

    def kill(self) -> None:
        """SIGKILL every process of it (whole trees: MLServer's workers too) at once."""
        for proc in self.procs:
            kill_tree(proc)
        self._close_pipes()

    def stop(self) -> None:
        """SIGTERM, then (after :data:`STOP_TIMEOUT`) SIGKILL every process and its tree."""
        for proc in self.procs:
            tree = descendants([proc.pid])
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(STOP_TIMEOUT)
            kill_tree(proc, tree)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for proc in self.procs:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(Exception):
                        pipe.close()


# --- the models ---------------------------------------------------------------------------------


def train_iris(python: Path, out: Path | None = None) -> Path:
    """The iris classifier trained by ``python`` (a peer's virtualenv: its scikit-learn) and
    saved with joblib; where: ``out``, else a file of this process's own (trained once per
    virtualenv and test run, removed at exit), which it returns."""
    if out is None:
        if python not in _TRAINED:
            _TRAINED[python] = train_iris(python, Path(_trained_dir()) / f"iris-{len(_TRAINED)}")
        return _TRAINED[python]
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    done = subprocess.run(
        [str(python), str(IRIS_TRAINER), str(partial)],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        env=peer_env(),
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"training the iris model failed: {done.stderr[-2000:]}")
    partial.rename(out)
    return out


_TRAINED: dict[Path, Path] = {}


@functools.cache
def _trained_dir() -> str:
    folder = tempfile.mkdtemp(prefix="wirekit-iris-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _check_kinds(models: Sequence[str]) -> None:
    unknown = [m for m in models if m not in MODEL_KINDS]
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r} (known: {', '.join(MODEL_KINDS)})")


def _slow_spec() -> dict[str, float]:
    return {"load_seconds": SLOW_LOAD_SECONDS, "predict_seconds": SLOW_PREDICT_SECONDS}


def write_mlserver_model(models_dir: Path, name: str, iris: Path | None = None) -> Path:
    """MLServer's folder of model ``name`` (of :data:`MODEL_KINDS`) in ``models_dir``
    (``iris``: the trained file to copy into it)."""
    folder = models_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = {"name": name}
    if name == "echo":
        settings["implementation"] = "mlserver_runtimes.EchoRuntime"
    elif name == "slow":
        settings["implementation"] = "mlserver_runtimes.SlowEchoRuntime"
        settings["parameters"] = {"extra": _slow_spec()}
    elif name == "broken":
        settings["implementation"] = "mlserver_runtimes.BrokenRuntime"
        settings["parameters"] = {"extra": {"message": BROKEN_MESSAGE}}
    else:
        assert iris is not None
        shutil.copy(iris, folder / "model.joblib")
        settings["implementation"] = "mlserver_sklearn.SKLearnModel"
        settings["parameters"] = {"uri": "./model.joblib"}
    (folder / "model-settings.json").write_text(json.dumps(settings))
    return folder


def write_kserve_model(models_dir: Path, name: str, iris: Path | None = None) -> Path:
    """The KServe server's folder of model ``name`` in ``models_dir`` (``oip_models/
    kserve_server.py`` reads its ``model.json``)."""
    folder = models_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    spec: dict[str, Any] = {"kind": name}
    if name == "broken":
        spec["message"] = BROKEN_MESSAGE
    if name == "slow":
        spec.update(_slow_spec())
    if name == "iris":
        assert iris is not None
        shutil.copy(iris, folder / "model.joblib")
    (folder / "model.json").write_text(json.dumps(spec))
    return folder


# --- starting them ------------------------------------------------------------------------------


#: the models not loaded at a server's start unless asked (``loaded``)
NOT_AT_START = ("broken", "slow")


def _at_start(models: Sequence[str], loaded: Sequence[str] | None) -> list[str]:
    if loaded is None:
        return [m for m in models if m not in NOT_AT_START]
    _check_kinds(loaded)
    strays = [m for m in loaded if m not in models]
    if strays:
        raise ValueError(f"model {strays[0]!r} loaded at start but not among the models")
    return list(loaded)


def start_mlserver(
    workdir: Path,
    models: Sequence[str] = ("echo", "iris"),
    *,
    who: str = "mlserver",
    load_at_startup: bool = True,
    loaded: Sequence[str] | None = None,
    parallel_workers: int | None = 0,
    debug: bool = False,
    ns: Namespace | None = None,
    settings: dict[str, Any] | None = None,
    wait: bool = True,
) -> Server:
    """MLServer 1.7.1 serving ``models`` (of :data:`MODEL_KINDS`) from a model folder under
    ``workdir/who``, on 127.0.0.1, free ports (``http``, ``grpc``, ``metrics``), from its
    virtualenv (made on first use).  ``load_at_startup``: MLServer's
    ``load_models_at_startup`` (False: none loaded until ``POST
    /v2/repository/models/NAME/load``); when True, ``loaded`` are the models loaded at
    start (default: all but :data:`NOT_AT_START`), the others put in the folder only once
    the server is ready (MLServer loads every model of its folder at startup, and stops if
    one fails), loadable then.  ``parallel_workers``
    0: inference in the server process (``None``: MLServer's default, one worker process);
    ``settings``: more of ``settings.json``.  ``wait``: return once ready (models loaded at
    startup included)."""
    _check_kinds(models)
    python = peer_venvs.ensure_venv(peer_venvs.MLSERVER)
    folder = workdir / who
    models_dir = folder / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    iris = train_iris(python) if "iris" in models else None
    at_start = _at_start(models, loaded) if load_at_startup else []
    later = [m for m in models if m not in at_start] if load_at_startup else []
    for name in models:
        if name not in later:
            write_mlserver_model(models_dir, name, iris)
    if ns is None:
        http, grpc, metrics = free_ports(3)
    else:
        http, grpc, metrics = ns.run(free_ports, 3)
    config: dict[str, Any] = {
        "host": "127.0.0.1",
        "http_port": http,
        "grpc_port": grpc,
        "metrics_port": metrics,
        "load_models_at_startup": load_at_startup,
        "debug": debug,
    }
    if parallel_workers is not None:
        config["parallel_workers"] = parallel_workers
    config.update(settings or {})
    (folder / "settings.json").write_text(json.dumps(config))
    log = workdir / f"{who}.log"
    proc = spawn(
        [str(python.parent / "mlserver"), "start", str(folder)],
        log,
        ns=ns,
        env=peer_env(),
        cwd=folder,
    )
    server = Server(
        who,
        [proc],
        {"http": http, "grpc": grpc, "metrics": metrics},
        [log],
        ns,
        models_dir=models_dir,
    )
    try:
        if wait or later:
            server.wait_ready(at_start)
        for name in later:
            write_mlserver_model(models_dir, name, iris)
    except BaseException:
        server.stop()
        raise
    return server


def start_kserve(
    ns: Namespace,
    workdir: Path,
    models: Sequence[str] = ("echo", "iris"),
    *,
    who: str = "kserve",
    loaded: Sequence[str] | None = None,
    repository: bool = True,
    quiet: bool = False,
    wait: bool = True,
) -> Server:
    """KServe 0.21.0's ``ModelServer`` inside ``ns`` (it binds 0.0.0.0), on free ports
    (``http``, ``grpc``), from its virtualenv, with ``models`` (of :data:`MODEL_KINDS`) in a
    folder under ``workdir/who`` that its repository loads from
    (``oip_models/kserve_server.py``).  ``loaded``: the ones loaded at start (default: all
    but :data:`NOT_AT_START`); ``repository`` False: a folder with only the models loaded at
    start (the others cannot be loaded).  ``quiet``: without its per-request logs.  ``wait``: return
    once ready (the models loaded at start included)."""
    _check_kinds(models)
    python = peer_venvs.ensure_venv(peer_venvs.KSERVE)
    at_start = _at_start(models, loaded)
    folder = workdir / who
    models_dir = folder / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    iris = train_iris(python) if "iris" in models else None
    for name in models if repository else at_start:
        write_kserve_model(models_dir, name, iris)
    http, grpc = ns.run(free_ports, 2)
    argv = [
        str(python),
        str(MODELS_CODE / "kserve_server.py"),
        "--http_port",
        str(http),
        "--grpc_port",
        str(grpc),
    ]
    if quiet:
        argv += ["--configure_logging", "false", "--enable_latency_logging", "false"]
    env = peer_env(
        {"WIREKIT_KSERVE_MODELS": str(models_dir), "WIREKIT_KSERVE_START": ",".join(at_start)}
    )
    log = workdir / f"{who}.log"
    proc = spawn(argv, log, ns=ns, env=env, cwd=folder)
    server = Server(who, [proc], {"http": http, "grpc": grpc}, [log], ns, models_dir=models_dir)
    if wait:
        try:
            server.wait_ready(at_start)
        except BaseException:
            server.stop()
            raise
    return server


# --- pytest fixtures ----------------------------------------------------------------------------


def peers_unavailable(kserve: bool = False) -> str | None:
    """Why the real peers cannot run here (``None``: they can): Linux, and for KServe a
    network namespace (root, ``ip``)."""
    if not sys.platform.startswith("linux"):
        return "the real model servers' tests run on Linux"
    return namespace_unavailable() if kserve else None


@contextlib.contextmanager
def running_mlserver(tmp: Path | None = None, **kwargs: Any) -> Iterator[Server]:
    """:func:`start_mlserver` (in a temporary work directory unless ``tmp``), stopped at the
    end."""
    with contextlib.ExitStack() as stack:
        if tmp is None:
            tmp = Path(stack.enter_context(_tempdir("wirekit-mlserver-")))
        server = start_mlserver(tmp, **kwargs)
        stack.callback(server.stop)
        yield server


@contextlib.contextmanager
def running_kserve(tmp: Path | None = None, **kwargs: Any) -> Iterator[Server]:
    """:func:`start_kserve` in a namespace of its own (``server.ns``), all cleaned up at the
    end."""
    with contextlib.ExitStack() as stack:
        if tmp is None:
            tmp = Path(stack.enter_context(_tempdir("wirekit-kserve-")))
        ns = stack.enter_context(Namespace())
        server = start_kserve(ns, tmp, **kwargs)
        stack.callback(server.stop)
        yield server


def _tempdir(prefix: str) -> contextlib.AbstractContextManager[str]:
    return tempfile.TemporaryDirectory(prefix=prefix)


def read_first_line(stream: IO[str], timeout: float) -> str:
    """The first line a subprocess writes on ``stream`` (bounded; ``""`` if none came)."""
    from support.process import read_line

    return read_line(stream, timeout)
