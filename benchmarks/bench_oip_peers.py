"""``wirekit serve``'s inference doors side by side with real KServe and MLServer processes.

Every server answers an echo model (outputs = inputs: same name, datatype, shape and data):

* ``dispatcher``: the whole wirekit path -- ``wirekit serve`` (store on, cache off, so every
  request reaches the backend) forwarding to a ``wirekit mip serve`` echo backend; the CPU of
  both processes is counted.  Doors: OIP REST (JSON and the binary tensor extension), OIP
  gRPC, and today's ``POST /v1/models/NAME:predict`` (row ``v1-predict``, the baseline of
  "does not regress");
* ``kserve``: KServe 0.21.0, a ``kserve.Model`` echo (``tests/oip_models/kserve_server.py``)
  on its ``ModelServer`` (REST v2, binary extension, gRPC);
* ``mlserver``: MLServer 1.7.1, a custom ``MLModel`` echo
  (``tests/oip_models/mlserver_runtimes.py``),
  ``parallel_workers=0`` (inference in the server process); ``mlserver-defaults``: the same
  with MLServer's default settings (one inference worker process);
* ``kserve-quiet``, ``mlserver-quiet``: the same peers without the per-request logs they
  write by default (KServe's access and latency lines, MLServer's ``debug``), on request;
* ``dispatcher-LABEL`` (``--before LABEL=DIR``): another wirekit tree's path (its extensions
  built in place), e.g. main's, for "today's door does not regress".

Peers are installed from PyPI in their own virtualenvs (``tests/peer_venvs.py``) and started
by ``tests/oip_servers.py`` (the tests' harness), on free ports.  Every server and
the load generator run inside a network namespace of the benchmark's own with only loopback
up (``ip netns``; needs root), because KServe binds 0.0.0.0 whatever it is told: nothing
listens beyond loopback, and the namespace is deleted at the end.

The load generator is one process for all (``oip_load.py``): 32 requests in flight (32
keep-alive HTTP/1.1 connections, or 32 calls on one gRPC channel), a fixed number of requests
a round.  A server's cost is its CPU per request: user+sys of its whole process tree
(``/proc/PID/task/*/schedstat``, every thread of the server and its descendants, read before
and after a round; the load generator is not in the tree).  The request is a [1,16] FP32
tensor.

    python benchmarks/bench_oip_peers.py [--requests 4000] [--rounds 5] [--peers kserve,mlserver]

measures every contender in turn, round after round (a busy machine's drift hits them alike),
and prints each one's min and median CPU per request and the ratios wirekit / peer per
protocol (the median of the round-by-round ratios, and the ratio of the minima), with the
issue's targets.  The peers' virtualenvs are made on first use (``tests/peer_venvs.py``).
``benchmarks/test_bench_oip.py`` is its pytest entry.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# the real servers' harness and the peers' virtualenvs are the tests' (tests/oip_servers.py)
sys.path.insert(0, str(ROOT / "tests"))

import oip_servers  # noqa: E402
import peer_venvs  # noqa: E402
from oip_servers import (  # noqa: E402
    Namespace,
    Server,
    namespace_unavailable,
    open_namespace,
    read_first_line,
    spawn,
    tree_cpu_ns,
)

LOAD_SCRIPT = HERE / "oip_load.py"
#: bound on a server's start (KServe and MLServer import a lot) and on one load round
START_TIMEOUT = 120.0
ROUND_TIMEOUT = 600.0
IN_FLIGHT = 32
MODEL = "echo"
ECHO_HANDLER = "wirekit.mip.runtime:async_echo"
#: the request tensor: [1,16] FP32, values exact in FP32 and in JSON
INPUT_NAME = "input0"
SHAPE = (1, 16)
VALUES = [k / 4 for k in range(16)]
RAW = struct.pack(f"<{len(VALUES)}f", *VALUES)
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"

#: the protocols a row is measured over
REST_JSON, REST_BINARY, GRPC, V1_PREDICT = "rest-json", "rest-binary", "grpc", "v1-predict"
PROTOCOLS = (REST_JSON, REST_BINARY, GRPC, V1_PREDICT)
#: the issue's targets: wirekit's CPU per request over OIP REST at most this share of theirs
TARGETS = {"kserve": 0.25, "mlserver": 0.33}


# --- servers ----------------------------------------------------------------------------------


def _wirekit_env(tree: Path | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def _spawn_with_line(
    ns: Namespace | None, argv: list[str], env: dict[str, str], log: Path, cwd: Path | None
) -> tuple[subprocess.Popen, str]:
    """``argv`` started (in ``ns``), its stderr to ``log``; it and its first stdout line."""
    proc = spawn(argv, log, ns=ns, env=env, cwd=cwd, stdout_pipe=True)
    assert proc.stdout is not None
    line = read_first_line(proc.stdout, START_TIMEOUT).strip()
    if not line:
        proc.kill()
        proc.wait(15)
        raise RuntimeError(f"{argv[:4]} did not start: {log.read_text(errors='replace')[-2000:]}")
    return proc, line


def grpc_door_available(tree: Path | None = None) -> bool:
    """Whether the wirekit of ``tree`` (default: this one) has the OIP gRPC door
    (``listen.grpc_port``)."""
    check = (
        "import dataclasses, wirekit.serve.config as c; "
        "assert 'grpc_port' in {f.name for f in dataclasses.fields(c.Deployment)}"
    )
    return _wirekit_has(tree, check)


def rest_door_available(tree: Path | None = None) -> bool:
    """Whether the wirekit of ``tree`` has the OIP REST door (``doors/oiprest.py``)."""
    return _wirekit_has(tree, "import wirekit.serve.doors.oiprest")


@functools.lru_cache
def _wirekit_has(tree: Path | None, check: str) -> bool:
    env = _wirekit_env(tree)
    if tree is None:
        env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, cwd=tree or ROOT
    )
    return done.returncode == 0


def start_wirekit(
    ns: Namespace | None, workdir: Path, *, who: str = "dispatcher", tree: Path | None = None
) -> Server:
    """A ``wirekit mip serve`` echo backend and a ``wirekit serve`` dispatcher forwarding
    model ``echo`` to it (store and journal on, cache off), from the wirekit of ``tree``
    (default: the one this process imports); HTTP door, and the gRPC door where it exists."""
    env = _wirekit_env(tree or ROOT)
    cwd = tree or ROOT
    backend_log, dispatcher_log = workdir / f"{who}-backend.log", workdir / f"{who}.log"
    backend, line = _spawn_with_line(
        ns,
        [
            sys.executable,
            "-m",
            "wirekit.cli",
            "mip",
            "serve",
            "--handler",
            ECHO_HANDLER,
            "--listen",
            "tcp://127.0.0.1:0",
            "--log-level",
            "warning",
        ],
        env,
        backend_log,
        cwd,
    )
    try:
        port = int(line.split()[-1].rsplit(":", 1)[1])
        listen: dict[str, Any] = {"host": "127.0.0.1", "http_port": 0}
        if grpc_door_available(tree):
            listen["grpc_port"] = 0
        deploy = {
            "listen": listen,
            "store": {"path": str(workdir / f"{who}-requests.db")},
            "cache": {"max_entries": 0},
            "models": {MODEL: {"port": 0, "timeout": 30}},
            "nodes": [
                {"id": "n", "devices": ["CPU"], "models": [MODEL], "quotas": [1.0], "ports": [port]}
            ],
        }
        config = workdir / f"{who}-deploy.json"
        config.write_text(json.dumps(deploy))
        dispatcher, line = _spawn_with_line(
            ns,
            [sys.executable, "-m", "wirekit.cli", "serve", "--config", str(config)],
            env,
            dispatcher_log,
            cwd,
        )
    except BaseException:
        Server(who, [backend], {}).stop()
        raise
    ready = json.loads(line)
    ports = {"http": int(ready["http"])}
    if ready.get("grpc"):
        ports["grpc"] = int(ready["grpc"])
    return Server(who, [dispatcher, backend], ports, [dispatcher_log, backend_log])


def start_kserve(ns: Namespace, workdir: Path, *, quiet: bool = False) -> Server:
    """KServe's ``ModelServer`` with the echo model (REST and gRPC), from its virtualenv, in
    ``ns`` (``oip_servers.start_kserve``); ``quiet``: without its per-request logs (the access
    log and latency lines it writes by default)."""
    who = "kserve-quiet" if quiet else "kserve"
    return oip_servers.start_kserve(ns, workdir, models=(MODEL,), who=who, quiet=quiet)


def start_mlserver(
    ns: Namespace, workdir: Path, *, defaults: bool = False, quiet: bool = False
) -> Server:
    """MLServer with the echo runtime, ``parallel_workers=0`` (or its defaults: one
    inference worker process), from its virtualenv, in ``ns`` (``oip_servers.start_mlserver``:
    listening on 127.0.0.1).  ``quiet``: ``debug`` off (MLServer's default is on, which logs
    every request)."""
    who = "mlserver-defaults" if defaults else "mlserver-quiet" if quiet else "mlserver"
    return oip_servers.start_mlserver(
        workdir,
        models=(MODEL,),
        who=who,
        ns=ns,
        parallel_workers=None if defaults else 0,
        debug=not quiet,
    )


# --- the requests and their answers -------------------------------------------------------------


def http_request(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """One whole HTTP/1.1 request (keep-alive)."""
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def oip_json_body(values: list[float] = VALUES, shape: Sequence[int] = SHAPE) -> bytes:
    """The OIP REST inference request of the [1,16] FP32 tensor, as JSON."""
    tensor = {"name": INPUT_NAME, "shape": list(shape), "datatype": "FP32", "data": values}
    return json.dumps({"inputs": [tensor]}).encode()


def oip_binary_body(raw: bytes = RAW, shape: Sequence[int] = SHAPE) -> tuple[bytes, int]:
    """The OIP REST inference request with the tensor in the binary extension (and binary
    outputs asked for): the body and its JSON header's length."""
    tensor = {
        "name": INPUT_NAME,
        "shape": list(shape),
        "datatype": "FP32",
        "parameters": {"binary_data_size": len(raw)},
    }
    header = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
    return header + raw, len(header)


def v1_predict_body() -> bytes:
    """Today's door (``POST /v1/models/NAME:predict``): one sample, the row as one input."""
    return json.dumps({"instances": [VALUES]}).encode()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def grpc_infer_request(raw: bytes = RAW, shape: Sequence[int] = SHAPE) -> bytes:
    """``inference.ModelInferRequest`` (serialized by hand from the protocol's documented
    field numbers): model ``echo``, one FP32 input, its bytes in ``raw_input_contents`` (as
    tritonclient sends them)."""
    tensor = (
        _field(1, INPUT_NAME.encode())
        + _field(2, b"FP32")
        + _field(3, b"".join(_varint(d) for d in shape))
    )
    return _field(1, MODEL.encode()) + _field(5, tensor) + _field(7, raw)


def _proto_fields(data: bytes) -> dict[int, list[Any]]:
    """The fields of one serialized protobuf message: number -> values (ints for varints,
    bytes for length-delimited fields)."""
    fields: dict[int, list[Any]] = {}
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = value = 0
        while True:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while pos < len(data):
        key = varint()
        number, kind = key >> 3, key & 7
        if kind == 0:
            value: Any = varint()
        elif kind == 2:
            size = varint()
            value, pos = data[pos : pos + size], pos + size
        elif kind == 5:
            value, pos = data[pos : pos + 4], pos + 4
        elif kind == 1:
            value, pos = data[pos : pos + 8], pos + 8
        else:
            raise ValueError(f"protobuf wire type {kind} not expected")
        fields.setdefault(number, []).append(value)
    return fields


def check_echo(protocol: str, ready: dict[str, Any], body: bytes, raw: bytes = RAW) -> None:
    """Raise ``AssertionError`` unless the load generator's first answer (``ready``: its
    status and headers; ``body``) is the echo of the request (``raw``: the tensor's bytes)."""
    assert ready["status"] == (0 if protocol == GRPC else 200), (ready["status"], body[:300])
    count = len(raw) // 4
    floats = list(struct.unpack(f"<{count}f", raw))
    if protocol == GRPC:
        reply = _proto_fields(body)
        output = _proto_fields(reply[5][0])
        assert (output[1][0], output[2][0]) == (INPUT_NAME.encode(), b"FP32"), output
        if 6 in reply:
            assert reply[6][0] == raw
        else:  # typed contents: fp32_contents, packed
            contents = _proto_fields(output[5][0])
            assert list(struct.unpack(f"<{count}f", contents[6][0])) == floats
        return
    if protocol == REST_BINARY:
        length = int(ready["headers"]["inference-header-content-length"])
        doc = json.loads(body[:length])
        assert body[length:] == raw, "binary output differs"
        assert doc["outputs"][0]["name"] == INPUT_NAME
        return
    doc = json.loads(body)
    if protocol == V1_PREDICT:
        answer = doc.get("outputs", doc.get("predictions"))
        assert json.dumps(answer).replace(" ", "").count(str(floats[1])) >= 1, doc
        return
    (output,) = doc["outputs"]
    assert (output["name"], output["datatype"]) == (INPUT_NAME, "FP32"), output
    assert list(output["shape"]) == list(SHAPE) and output["data"] == floats, output


# --- the load generator ---------------------------------------------------------------------------


@dataclass
class Workload:
    """What a load generator sends: the protocol and the request for one server."""

    protocol: str
    request: bytes  # the whole HTTP request, or the serialized gRPC message
    raw: bytes = RAW

    @classmethod
    def for_server(
        cls, protocol: str, who: str, raw: bytes = RAW, shape: Sequence[int] = SHAPE
    ) -> Workload:
        """The request of ``protocol`` to contender ``who``'s echo model."""
        if protocol == GRPC:
            return cls(protocol, grpc_infer_request(raw, shape), raw)
        if protocol == V1_PREDICT:
            body, headers = v1_predict_body(), {"Content-Type": "application/json"}
            return cls(protocol, http_request(f"/v1/models/{MODEL}:predict", body, headers), raw)
        path = f"/v2/models/{MODEL}/infer"
        if protocol == REST_BINARY:
            body, length = oip_binary_body(raw, shape)
            headers = {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(length),
            }
            return cls(protocol, http_request(path, body, headers), raw)
        floats = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        body = oip_json_body(floats, shape)
        return cls(protocol, http_request(path, body, {"Content-Type": "application/json"}), raw)


class LoadGenerator:
    """``oip_load.py`` in its own process (in the namespace), aimed at one server's door;
    :meth:`round` sends a number of requests and returns what it measured."""

    def __init__(
        self,
        ns: Namespace | None,
        workdir: Path,
        server: Server,
        work: Workload,
        *,
        warmup: int = 64,
        in_flight: int = IN_FLIGHT,
    ) -> None:
        kind = "grpc" if work.protocol == GRPC else "http"
        port = server.ports[kind]
        request_file = workdir / f"{server.who}-{work.protocol}.req"
        request_file.write_bytes(work.request)
        answer_file = workdir / f"{server.who}-{work.protocol}.answer"
        spec = {
            "kind": kind,
            "host": "127.0.0.1",
            "port": port,
            "in_flight": in_flight,
            "warmup": warmup,
            "ready_timeout": START_TIMEOUT,
            "request_file": str(request_file),
            "answer_file": str(answer_file),
            "method": GRPC_INFER,
        }
        spec_file = workdir / f"{server.who}-{work.protocol}.json"
        spec_file.write_text(json.dumps(spec))
        argv = [sys.executable, str(LOAD_SCRIPT), str(spec_file)]
        self.server = server
        self.log = workdir / f"{server.who}-{work.protocol}-load.log"
        self.proc = spawn(argv, self.log, ns=ns, stdout_pipe=True, stdin_pipe=True)
        line = self._answer(START_TIMEOUT)
        self.ready: dict[str, Any] = json.loads(line)
        check_echo(work.protocol, self.ready, answer_file.read_bytes(), work.raw)

    def _answer(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        line = read_first_line(self.proc.stdout, timeout)
        if not line:
            self.server.check_alive()
            raise RuntimeError(
                f"the load generator on {self.server.who} gave no answer: "
                f"{self.log.read_text(errors='replace')[-2000:]}\n{self.server.log_tail()}"
            )
        return line

    def round(self, requests: int) -> dict[str, Any]:
        """Send ``requests`` requests; the round's measures plus ``cpu_us`` (the server's CPU
        per request over the round)."""
        assert self.proc.stdin is not None
        before = [tree_cpu_ns([pid]) for pid in self.server.pids]
        self.proc.stdin.write(f"run {requests}\n")
        self.proc.stdin.flush()
        result: dict[str, Any] = json.loads(self._answer(ROUND_TIMEOUT))
        spent = [tree_cpu_ns([pid]) - b for pid, b in zip(self.server.pids, before, strict=True)]
        result["cpu_us"] = sum(spent) / requests / 1e3
        #: per process tree (wirekit: the dispatcher's, then the backend's)
        result["cpu_us_by_process"] = [ns / requests / 1e3 for ns in spent]
        if result["failed"]:
            raise RuntimeError(
                f"{self.server.who}: {result['failed']} requests failed: {result['first_failure']}"
            )
        return result

    def close(self) -> None:
        """End the load generator."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# --- the whole comparison -------------------------------------------------------------------------

#: which protocols each contender speaks (MLServer has no binary tensor extension over REST)
SPOKEN = {
    "dispatcher": (REST_JSON, REST_BINARY, GRPC, V1_PREDICT),
    "kserve": (REST_JSON, REST_BINARY, GRPC),
    "mlserver": (REST_JSON, GRPC),
    "mlserver-defaults": (REST_JSON, GRPC),
    "kserve-quiet": (REST_JSON, REST_BINARY, GRPC),
    "mlserver-quiet": (REST_JSON, GRPC),
}


def door_missing(protocol: str, server: Server, tree: Path | None = None) -> str | None:
    """Why wirekit ``server`` (from ``tree``, default this one) cannot be measured over
    ``protocol`` (``None``: it can)."""
    if protocol == GRPC and "grpc" not in server.ports:
        return "the OIP gRPC door (listen.grpc_port) is not in this wirekit yet"
    if protocol in (REST_JSON, REST_BINARY) and not rest_door_available(tree):
        return "the OIP REST door (/v2/models/NAME/infer) is not in this wirekit yet"
    return None


@contextlib.contextmanager
def contenders(
    names: Sequence[str], workdir: Path, ns: Namespace | None
) -> Iterator[dict[str, Server]]:
    """The servers ``names`` started (peers need ``ns``), stopped at the end."""
    starters: dict[str, Callable[[], Server]] = {"dispatcher": lambda: start_wirekit(ns, workdir)}
    if ns is not None:
        starters |= {
            "kserve": lambda: start_kserve(ns, workdir),
            "mlserver": lambda: start_mlserver(ns, workdir),
            "mlserver-defaults": lambda: start_mlserver(ns, workdir, defaults=True),
            "kserve-quiet": lambda: start_kserve(ns, workdir, quiet=True),
            "mlserver-quiet": lambda: start_mlserver(ns, workdir, quiet=True),
        }
    servers: dict[str, Server] = {}
    try:
        for name in names:
            servers[name] = starters[name]()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def speaks(who: str) -> tuple[str, ...]:
    """The protocols contender ``who`` is measured over (``dispatcher-LABEL``: another
    wirekit tree's dispatcher, as ``dispatcher``)."""
    return SPOKEN["dispatcher" if who.startswith("dispatcher") else who]


def compare(
    requests: int,
    rounds: int,
    peers: Sequence[str],
    out: IO[str],
    before: dict[str, Path] | None = None,
) -> dict[str, Any]:
    """Every contender over every protocol it speaks, in turn, ``rounds`` times; the
    report (per protocol, per contender: the CPU per request of every round).  ``before``:
    other wirekit trees by label, each measured as ``dispatcher-LABEL``."""
    before = before or {}
    unavailable = namespace_unavailable()
    if peers and unavailable:
        raise SystemExit(f"bench_oip_peers.py: peers need a network namespace: {unavailable}")
    for peer in {"kserve": peer_venvs.KSERVE, "mlserver": peer_venvs.MLSERVER}.items():
        if any(p.startswith(peer[0]) for p in peers):
            print(f"virtualenv: {peer_venvs.ensure_venv(peer[1])}", file=out, flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="wirekit-oip-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        workdir = Path(tmp)
        ns, reason = open_namespace(stack)
        if reason and peers:
            raise SystemExit(f"bench_oip_peers.py: peers need a network namespace: {reason}")
        servers = stack.enter_context(contenders(["dispatcher", *peers], workdir, ns))
        for label, other_tree in before.items():
            who = f"dispatcher-{label}"
            servers[who] = start_wirekit(ns, workdir, who=who, tree=other_tree)
            stack.callback(servers[who].stop)
        loads: dict[tuple[str, str], LoadGenerator] = {}
        skipped: dict[str, str] = {}
        try:
            for who, server in servers.items():
                tree = before.get(who.removeprefix("dispatcher-")) if who != "dispatcher" else None
                for protocol in speaks(who):
                    mine = who.startswith("dispatcher")
                    missing = door_missing(protocol, server, tree) if mine else None
                    if missing:
                        skipped[f"{protocol} {who}"] = missing
                        continue
                    loads[protocol, who] = LoadGenerator(
                        ns, workdir, server, Workload.for_server(protocol, who)
                    )
            if ns is not None:
                print(f"listening in the namespace: {' '.join(ns.listening())}", file=out)
            cpu: dict[tuple[str, str], list[float]] = {key: [] for key in loads}
            rate: dict[tuple[str, str], list[float]] = {key: [] for key in loads}
            for k in range(rounds):
                for key, load in loads.items():
                    result = load.round(requests)
                    cpu[key].append(result["cpu_us"])
                    rate[key].append(requests / result["elapsed_s"])
                print(f"round {k + 1}/{rounds} done", file=out, flush=True)
        finally:
            for load in loads.values():
                load.close()
    return {"cpu": cpu, "rate": rate, "skipped": skipped, "requests": requests}


def report_table(report: dict[str, Any]) -> str:
    """The comparison as text: each contender's CPU per request (min / median of the
    rounds), requests/s, and wirekit's ratio to each peer per protocol -- the median of the
    round-by-round ratios (each round of wirekit against the same round of the peer: the
    machine's drift hits both alike) and the ratio of the two minima."""
    cpu, rate = report["cpu"], report["rate"]
    lines = [
        f"server CPU per request, 32 in flight, {report['requests']} requests a round",
        f"{'protocol':<12} {'contender':<18} {'min':>9} {'median':>9} {'req/s':>7}"
        f" {'wirekit/it: paired':>19} {'of mins':>8} {'target':>7}",
    ]
    for protocol in PROTOCOLS:
        ours = cpu.get((protocol, "dispatcher"))
        for (proto, who), values in sorted(cpu.items(), key=lambda kv: _median(kv[1])):
            if proto != protocol:
                continue
            paired = of_mins = target = ""
            if ours and who != "dispatcher":
                paired = f"{_median([o / t for o, t in zip(ours, values, strict=True)]):.2f}x"
                of_mins = f"{min(ours) / min(values):.2f}x"
                limit = TARGETS.get(who.removesuffix("-quiet")) if protocol == REST_JSON else None
                target = f"<={limit}" if limit else ""
            lines.append(
                f"{protocol:<12} {who:<18} {min(values):>6.1f} us {_median(values):>6.1f} us "
                f"{_median(rate[proto, who]):>7.0f} {paired:>19} {of_mins:>8} {target:>7}"
            )
        for key, reason in report["skipped"].items():
            if key.split()[0] == protocol:
                lines.append(f"{protocol:<12} {key.split()[1]:<18} skipped: {reason}")
    legacy = cpu.get((V1_PREDICT, "dispatcher"))
    for who in ("kserve", "mlserver"):
        theirs = cpu.get((REST_JSON, who))
        if legacy and theirs:
            ratio = _median([o / t for o, t in zip(legacy, theirs, strict=True)])
            lines.append(f"today's door (v1-predict) / {who} REST v2, paired: {ratio:.2f}x")
    return "\n".join(lines)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000, help="requests a round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every contender")
    parser.add_argument(
        "--peers",
        default="kserve,mlserver,mlserver-defaults",
        help="comma-separated peers (kserve, mlserver, mlserver-defaults, and kserve-quiet,"
        " mlserver-quiet: without their per-request logs)",
    )
    parser.add_argument("--json", type=Path, help="write the raw report here too")
    parser.add_argument(
        "--before",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="also measure the wirekit tree DIR (extensions built in place) as dispatcher-LABEL",
    )
    args = parser.parse_args(argv)
    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - set(SPOKEN) - {"dispatcher"}
    if unknown:
        parser.error(f"unknown peer {sorted(unknown)[0]!r}")
    started = time.monotonic()
    before = {}
    for entry in args.before:
        label, sep, path = entry.partition("=")
        before[label if sep else "before"] = Path(path if sep else entry)
    report = compare(args.requests, args.rounds, peers, sys.stdout, before)
    print(report_table(report))
    print(f"({time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {**report, "cpu": _keyed(report["cpu"]), "rate": _keyed(report["rate"])}, indent=1
            )
        )
    return 0


def _keyed(table: dict[tuple[str, str], list[float]]) -> dict[str, list[float]]:
    return {f"{protocol} {who}": values for (protocol, who), values in table.items()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
