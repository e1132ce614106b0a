"""``wirekit serve`` in front of a real OIP model server, against the same server asked directly.

The same requests, from the same load generator (``oip_load.py``), in the same run:

* ``direct``: straight to the model server's own REST or gRPC port;
* ``through``: to a ``wirekit serve`` process (store and journal on, cache off: every request
  reaches the server and is recorded) whose model ``echo`` has backend kind ``oip`` on that
  same server (``echo-grpc``: the same server model with ``grpc: true``);
* ``raw`` (REST JSON only, ``--raw``): a canned-answer HTTP server that only counts bytes --
  what the load generator and loopback manage at most on this machine.

Servers: MLServer 1.7.1 (``parallel_workers=0``: inference in the server process; ``debug``
off) and, with ``--servers mlserver,kserve``, KServe 0.21.0 (quiet).  The model is the echo
(``tests/oip_models/``), the request a [1,16] FP32 tensor.  Protocols: ``rest-json``,
``rest-binary`` (the client speaks the binary tensor extension; MLServer's REST API reads
JSON only, so its ``direct`` row is JSON and wirekit's backend speaks JSON to it: the row
measures what a binary client pays), ``grpc`` (wirekit's gRPC door to a ``grpc: true``
backend).  In flight: 1 and 32 (``--in-flight``).

Every round measures each (protocol, in flight) pair ``direct`` then ``through`` (the order
alternates round by round), so that a busy machine's drift hits both alike; the ratios
quoted are the medians of the round-by-round ratios:

* ``rate``: through / direct requests per second (the goal: at least 0.85 at 32 in flight);
* ``p50``: through / direct median latency;
* ``wk us``: the dispatcher's CPU per request (its process tree, ``/proc/*/task/*/schedstat``
  read before and after a round; the load generator is in neither tree), the median round's;
* ``srv us``: the model server's CPU per request, direct and through (a server asked through
  wirekit should cost what it costs asked directly).

At 1 in flight every process sleeps between requests, and a sleep and a wake-up cost CPU of
their own (on the 2-core VM this was written on, the OIP REST backend's client alone: about
120 us of CPU a request when the server answers at once, about 350 us when it answers after
0.7 ms): the CPU per request at 32 in flight is the one that says what the dispatcher's work
costs.

Every process runs inside a network namespace of the benchmark's own with only loopback up
where one can be made (root, ``ip``; KServe needs it, it binds 0.0.0.0), else on this
namespace's loopback (MLServer only).  On a small machine every process competes for the same
cores, and the throughput ratio is then about the ratio of CPU per request (the load
generator's and the server's, against those plus the dispatcher's); ``--pin`` gives the model
server CPU 0 of its own (wirekit and the load generator share the others), as a deployment
whose servers have their own machines or GPUs.

    python benchmarks/bench_oip_backend.py [--requests 2000] [--rounds 5] [--servers mlserver]
        [--in-flight 1,32] [--protocols rest-json,rest-binary,grpc] [--raw] [--pin]
        [--json FILE]

The machine's load (``os.getloadavg``) is printed before and after: on a loaded machine the
absolute figures drift, the paired ratios much less.  ``benchmarks/test_bench_oip_backend.py``
is its quick pytest form.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

import bench_oip_peers as peers  # noqa: E402
import oip_servers  # noqa: E402
import peer_venvs  # noqa: E402
from oip_servers import Namespace, Server, open_namespace  # noqa: E402

MODEL = peers.MODEL  # "echo": the server's model, and wirekit's REST model
GRPC_MODEL = "echo-grpc"  # wirekit's model with grpc: true, the server's "echo"
REST_JSON, REST_BINARY, GRPC = peers.REST_JSON, peers.REST_BINARY, peers.GRPC
PROTOCOLS = (REST_JSON, REST_BINARY, GRPC)
SERVERS = ("mlserver", "kserve")
#: the goal: through wirekit at least this share of the direct throughput at 32 in flight
GOAL = 0.85
#: which protocols each server speaks directly (MLServer: no binary extension over REST)
DIRECT_PROTOCOL = {
    "mlserver": {REST_JSON: REST_JSON, REST_BINARY: REST_JSON, GRPC: GRPC},
    "kserve": {REST_JSON: REST_JSON, REST_BINARY: REST_BINARY, GRPC: GRPC},
}


# --- the servers ------------------------------------------------------------------------------


def start_server(name: str, ns: Namespace | None, workdir: Path) -> Server:
    """The model server ``name`` (``mlserver``, ``kserve``) with the echo model, quiet."""
    if name == "mlserver":
        return oip_servers.start_mlserver(
            workdir, models=(MODEL,), who=name, ns=ns, parallel_workers=0, debug=False
        )
    if ns is None:
        raise SystemExit("bench_oip_backend.py: KServe needs a network namespace (root, ip)")
    return oip_servers.start_kserve(ns, workdir, models=(MODEL,), who=name, quiet=True)


def start_front(
    ns: Namespace | None, workdir: Path, backend: Server, *, tree: Path | None = None
) -> Server:
    """``wirekit serve`` (HTTP and gRPC doors; store on, cache off) whose ``echo`` is the
    ``backend`` server's echo over REST and ``echo-grpc`` the same over gRPC (backend kind
    ``oip``); its process only (the backend is not its child)."""
    who = f"wirekit-{backend.who}"
    models = {
        MODEL: {"backend": "oip", "timeout": 30},
        GRPC_MODEL: {"backend": "oip", "grpc": True, "server_model": MODEL, "timeout": 30},
    }
    deploy = {
        "listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0},
        "store": {"path": str(workdir / f"{who}-requests.db")},
        "cache": {"max_entries": 0},
        "models": {name: {"port": 0, **m} for name, m in models.items()},
        "nodes": [
            {
                "id": backend.who,
                "devices": ["CPU"],
                "models": list(models),
                "quotas": [0.5, 0.5],
                "ports": [backend.ports["http"], backend.ports["grpc"]],
            }
        ],
    }
    config = workdir / f"{who}-deploy.json"
    config.write_text(json.dumps(deploy))
    log = workdir / f"{who}.log"
    proc, line = peers._spawn_with_line(
        ns,
        [sys.executable, "-m", "wirekit.cli", "serve", "--config", str(config)],
        peers._wirekit_env(tree or ROOT),
        log,
        tree or ROOT,
    )
    ready = json.loads(line)
    return Server(who, [proc], {"http": int(ready["http"]), "grpc": int(ready["grpc"])}, [log], ns)


RAW_SERVER = r"""
import asyncio, sys
size, answer = int(sys.argv[1]), open(sys.argv[2], "rb").read()
class Echo(asyncio.Protocol):
    def connection_made(self, t): self.t, self.n = t, 0
    def data_received(self, data):
        self.n += len(data)
        while self.n >= size:
            self.n -= size
            self.t.write(answer)
async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def echo_json_answer() -> bytes:
    """The whole HTTP answer of an OIP echo of the request tensor, in JSON."""
    tensor = {"name": peers.INPUT_NAME, "datatype": "FP32", "shape": list(peers.SHAPE)}
    body = json.dumps({"model_name": MODEL, "outputs": [{**tensor, "data": peers.VALUES}]})
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    return (head + "\r\n\r\n" + body).encode()


def start_raw(ns: Namespace | None, workdir: Path) -> Server:
    """The canned-answer server (:data:`RAW_SERVER`): each request's bytes counted, the
    echo's answer written -- no parsing, the load generator's and loopback's limit."""
    answer = workdir / "raw.answer"
    answer.write_bytes(echo_json_answer())
    size = len(workload(REST_JSON, MODEL).request)
    log = workdir / "raw.log"
    proc, line = peers._spawn_with_line(
        ns, [sys.executable, "-c", RAW_SERVER, str(size), str(answer)], dict(os.environ), log, None
    )
    return Server("raw", [proc], {"http": int(line)}, [log], ns)


def pin_tree(server: Server, cpus: set[int]) -> None:
    """Every thread of ``server``'s processes and their descendants on ``cpus`` (threads
    made later inherit it)."""
    for pid in oip_servers.descendants(server.pids):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError):
                    os.sched_setaffinity(int(task.name), cpus)


# --- the requests -----------------------------------------------------------------------------


def workload(protocol: str, model: str) -> peers.Workload:
    """The [1,16] FP32 echo request over ``protocol`` to ``model``."""
    work = peers.Workload.for_server(protocol, "direct")
    if model == MODEL:
        return work
    if protocol == GRPC:
        named = peers._field(1, MODEL.encode())
        assert work.request.startswith(named)
        request = peers._field(1, model.encode()) + work.request[len(named) :]
    else:
        old, new = f"/v2/models/{MODEL}/infer".encode(), f"/v2/models/{model}/infer".encode()
        request = work.request.replace(old, new, 1)
    return peers.Workload(protocol, request, work.raw)


# --- the measurement --------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One measured line: server, protocol (as the client speaks it), in flight, path
    (``direct``, ``through``, ``raw``)."""

    server: str
    protocol: str
    in_flight: int
    path: str

    @property
    def key(self) -> str:
        return f"{self.server} {self.protocol} {self.in_flight} {self.path}"


def _view(who: str, target: Server, counted: Sequence[Server]) -> Server:
    """A server whose ports are ``target``'s and whose CPU is that of ``counted`` (in
    order: the load generator's ``cpu_us_by_process``)."""
    procs = [p for s in counted for p in s.procs]
    return Server(who, procs, target.ports, [log for s in counted for log in s.logs], target.ns)


def requests_for(requests: int, in_flight: int) -> int:
    """Requests a round: fewer at 1 in flight (each waits for the last)."""
    return requests if in_flight > 1 else max(50, requests // 4)


@contextlib.contextmanager
def loads(
    ns: Namespace | None,
    workdir: Path,
    servers: Sequence[str],
    protocols: Sequence[str],
    in_flights: Sequence[int],
    raw: bool,
    out: IO[str],
    pin: bool = False,
) -> Iterator[dict[Row, peers.LoadGenerator]]:
    """The servers and their wirekit fronts started, one load generator per :class:`Row`;
    all stopped at the end.  ``pin``: each model server on CPU 0, everything else this
    process starts (wirekit, the load generators) on the other CPUs."""
    with contextlib.ExitStack() as stack:
        generators: dict[Row, peers.LoadGenerator] = {}
        if pin:
            mine = os.sched_getaffinity(0)
            if len(mine) < 2 or 0 not in mine:
                raise SystemExit("bench_oip_backend.py: --pin needs CPU 0 and another one")
            stack.callback(os.sched_setaffinity, 0, mine)
            os.sched_setaffinity(0, mine - {0})
        for name in servers:
            backend = start_server(name, ns, workdir)
            stack.callback(backend.stop)
            if pin:
                pin_tree(backend, {0})
            front = start_front(ns, workdir, backend)
            stack.callback(front.stop)
            counted = (front, backend)  # cpu_us_by_process: [dispatcher, server]
            for protocol in protocols:
                direct_protocol = DIRECT_PROTOCOL[name][protocol]
                for n in in_flights:
                    for path, target, model, spoken in (
                        ("direct", backend, MODEL, direct_protocol),
                        ("through", front, GRPC_MODEL if protocol == GRPC else MODEL, protocol),
                    ):
                        row = Row(name, protocol, n, path)
                        view = _view(f"{name}-{path}", target, counted)
                        work = workload(spoken, model)
                        load = peers.LoadGenerator(ns, workdir, view, work, in_flight=n)
                        stack.callback(load.close)
                        generators[row] = load
        if raw:
            raw_server = start_raw(ns, workdir)
            stack.callback(raw_server.stop)
            for n in in_flights:
                load = peers.LoadGenerator(
                    ns, workdir, raw_server, workload(REST_JSON, MODEL), in_flight=n
                )
                stack.callback(load.close)
                generators[Row("raw", REST_JSON, n, "raw")] = load
        if ns is not None:
            print(f"listening in the namespace: {' '.join(ns.listening())}", file=out)
        yield generators


def compare(
    requests: int,
    rounds: int,
    servers: Sequence[str] = ("mlserver",),
    protocols: Sequence[str] = PROTOCOLS,
    in_flights: Sequence[int] = (1, 32),
    raw: bool = True,
    out: IO[str] = sys.stdout,
    pin: bool = False,
    ns: Namespace | None = None,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """Every row ``rounds`` times, direct and through paired; the raw report: per row key,
    each round's ``rate`` (req/s), ``p50_us``, ``p99_us``, ``cpu_us_by_process``
    (dispatcher, server).  ``ns``/``workdir``: given, or made here."""
    for name in servers:
        print(f"virtualenv: {peer_venvs.ensure_venv(peer_venvs.PEERS[name])}", file=out)
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wk-oipb-")))
        if ns is None:
            ns, reason = open_namespace(stack)
            if reason:
                print(f"no network namespace ({reason}): on this loopback", file=out)
        generators = stack.enter_context(
            loads(ns, workdir, servers, protocols, in_flights, raw, out, pin)
        )
        results: dict[str, list[dict[str, Any]]] = {row.key: [] for row in generators}
        for k in range(rounds):
            pairs: dict[tuple[str, str, int], list[Row]] = {}
            for row in generators:
                pairs.setdefault((row.server, row.protocol, row.in_flight), []).append(row)
            for rows in pairs.values():
                for row in rows if k % 2 == 0 else reversed(rows):
                    count = requests_for(requests, row.in_flight)
                    result = generators[row].round(count)
                    results[row.key].append(
                        {
                            "rate": count / result["elapsed_s"],
                            "p50_us": result["p50_us"],
                            "p99_us": result["p99_us"],
                            "cpu_us_by_process": result["cpu_us_by_process"],
                        }
                    )
            print(f"round {k + 1}/{rounds} done", file=out, flush=True)
    return {
        "requests": requests,
        "rounds": rounds,
        "results": results,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "pinned": pin,
    }


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def ratios(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (server, protocol, in flight): through/direct paired medians and the CPU per
    request of the dispatcher and of the server (each path's median)."""
    results = report["results"]
    out = []
    for key, direct in results.items():
        server, protocol, n, path = key.split()
        if path != "direct":
            continue
        through = results[f"{server} {protocol} {n} through"]
        pairs = list(zip(through, direct, strict=True))
        out.append(
            {
                "server": server,
                "protocol": protocol,
                "in_flight": int(n),
                "rate_direct": _median([d["rate"] for d in direct]),
                "rate_through": _median([t["rate"] for t in through]),
                "rate_ratio": _median([t["rate"] / d["rate"] for t, d in pairs]),
                "p50_direct_us": _median([d["p50_us"] for d in direct]),
                "p50_through_us": _median([t["p50_us"] for t in through]),
                "p50_ratio": _median([t["p50_us"] / d["p50_us"] for t, d in pairs]),
                "p99_ratio": _median([t["p99_us"] / d["p99_us"] for t, d in pairs]),
                "dispatcher_cpu_us": _median([t["cpu_us_by_process"][0] for t in through]),
                "server_cpu_us_direct": _median([d["cpu_us_by_process"][1] for d in direct]),
                "server_cpu_us_through": _median([t["cpu_us_by_process"][1] for t in through]),
            }
        )
    return out


def report_table(report: dict[str, Any]) -> str:
    """The ratios as text, with the raw-socket limit and the machine's load."""
    lines = [
        f"through wirekit serve / direct, paired rounds ({report['rounds']} x "
        f"{report['requests']} requests at 32 in flight), medians; load average "
        f"{report['loadavg_before'][0]:.2f} before, {report['loadavg_after'][0]:.2f} after, "
        f"{report['cpus']} CPUs"
        + (
            ", the model server pinned to CPU 0, the rest to the others" if report["pinned"] else ""
        ),
        f"{'server':<9} {'protocol':<12} {'n':>3} {'direct/s':>9} {'through/s':>9} "
        f"{'rate':>6} {'p50':>6} {'p99':>6} {'wk us':>7} {'srv us d':>9} {'srv us t':>9}",
    ]
    for r in ratios(report):
        flag = " <goal" if r["in_flight"] >= 32 and r["rate_ratio"] < GOAL else ""
        lines.append(
            f"{r['server']:<9} {r['protocol']:<12} {r['in_flight']:>3} {r['rate_direct']:>9.0f} "
            f"{r['rate_through']:>9.0f} {r['rate_ratio']:>5.2f}x {r['p50_ratio']:>5.2f}x "
            f"{r['p99_ratio']:>5.2f}x {r['dispatcher_cpu_us']:>7.0f} "
            f"{r['server_cpu_us_direct']:>9.0f} {r['server_cpu_us_through']:>9.0f}{flag}"
        )
    for key, values in report["results"].items():
        if key.endswith(" raw"):
            _, protocol, n, _ = key.split()
            lines.append(
                f"raw-socket limit ({protocol}, {n} in flight): "
                f"{_median([v['rate'] for v in values]):.0f} req/s, "
                f"p50 {_median([v['p50_us'] for v in values]):.0f} us"
            )
    lines.append(
        "rate, p50, p99: through/direct; wk us: the dispatcher's CPU per request; srv us: the"
        " server's, direct (d) and through (t); rest-binary to MLServer: direct in JSON"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--requests", type=int, default=2000, help="requests a round (32 in flight)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="paired rounds")
    parser.add_argument("--servers", default="mlserver", help="mlserver, kserve (comma-separated)")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--in-flight", default="1,32", help="requests in flight (comma-separated)")
    parser.add_argument("--raw", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the model server on CPU 0, wirekit and the load generator on the others",
    )
    parser.add_argument("--json", type=Path, help="write the raw report here too")
    args = parser.parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    protocols = [p for p in args.protocols.split(",") if p]
    for name in servers:
        if name not in SERVERS:
            parser.error(f"unknown server {name!r}")
    for protocol in protocols:
        if protocol not in PROTOCOLS:
            parser.error(f"unknown protocol {protocol!r}")
    in_flights = [int(n) for n in args.in_flight.split(",") if n]
    started = time.monotonic()
    report = compare(
        args.requests, args.rounds, servers, protocols, in_flights, args.raw, pin=args.pin
    )
    report["ratios"] = ratios(report)
    print(report_table(report))
    print(f"({time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
