"""``wirekit serve``: one MIP request (batch 1) through the dispatcher vs straight to the backend.

All contenders run in the same session against the same backend process (``wirekit mip
serve`` with the echo handler); the dispatcher is ``wirekit serve`` in its own process, with
its store on (SQLite plus the journal each completion is written to before the answer) and
the cache off, so every request really goes to the backend.  Results are checked; timings are
never asserted.

* ``direct``: the client talks to the backend.
* ``dispatcher``: through ``wirekit serve``, every request sent to the backend on its own.
* ``dispatcher-batching``: the same dispatcher process, a second model on the same backend
  with adaptive batching on (``max_batch`` 32: requests to one device in one loop pass go out
  as one MIP batch, the reply split back per request).
* ``dispatcher-window``: a second ``wirekit serve`` process, the same models, with a
  controller configured (``log`` actuator, no targets: it never decides), so
  the metrics window per model and per device is kept on the request path -- against
  ``dispatcher``, the cost of the controller's window.
* ``dispatcher-nojournal``: a third ``wirekit serve`` process, the same code and models with
  ``store.journal`` off (no journal at all: neither arrivals nor completions) -- against
  ``dispatcher``, what the journal costs.
* ``dispatcher-before`` / ``dispatcher-batching-before``: only when ``WIREKIT_BENCH_BEFORE``
  names the directory of another wirekit tree (an older commit, its extensions built in
  place): the same as ``dispatcher`` / ``dispatcher-batching`` with that tree's code, in the
  same session -- a change's cost on the request path, measured before/after in one run.
  Several trees: ``WIREKIT_BENCH_BEFORE=main=/tmp/a,prearrivals=/tmp/b`` gives the rows
  ``dispatcher-main``, ``dispatcher-batching-main``, ``dispatcher-prearrivals``... (and
  ``http-main``... for the HTTP door).
* ``relay``: through a raw asyncio byte relay (bytes in from the client, out to the backend,
  and back; no parsing, no store): the floor of *any* process between client and backend.

``test_http_request_latency`` and ``test_http_request_throughput``: the same dispatcher
through its HTTP front door (``POST /v1/models/echo:predict``, one sample; keep-alive
connections), the cost of the HTTP door's parsing and limits on top of the dispatch.
``test_http_request_paired``: the HTTP door's contenders in turn, round after round (this
tree's dispatcher, each ``WIREKIT_BENCH_BEFORE`` tree's, and this tree's without the
journal), with the dispatcher's CPU per request and its round-by-round ratio: a change to the
HTTP door measured before/after in one run.

Two loads.  ``test_request_latency``: the blocking client, one request at a time -- through a
middle process a request makes two round trips instead of one, so about 50% of direct is the
physical bound there (see ``relay``).  ``test_request_throughput``: 32 requests in flight on
one pipelined connection, where the middle process's work per request is what counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from mip_net import cpu_ns
from support.process import read_line, terminate

from wirekit.mip.client import Client

TIMEOUT = 30.0
ECHO = "wirekit.mip.runtime:async_echo"


def _before_trees(spec: str) -> dict[str, str]:
    """``WIREKIT_BENCH_BEFORE``: a directory (label ``before``), or ``label=directory``
    entries separated by commas."""
    trees = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        label, sep, path = entry.partition("=")
        trees[label if sep else "before"] = path if sep else entry
    return trees


#: other wirekit trees to measure against (``dispatcher-<label>``), by label
BEFORE = _before_trees(os.environ.get("WIREKIT_BENCH_BEFORE", ""))
#: the contenders the other trees add to the MIP rows
BEFORE_MIP = [f"dispatcher-{label}" for label in BEFORE]
BEFORE_BATCHING = [f"dispatcher-batching-{label}" for label in BEFORE]
BEFORE_HTTP = [f"http-{label}" for label in BEFORE]


def _spawn(args: list[str], pythonpath: str | None = None) -> tuple[subprocess.Popen, str]:
    return _spawn_python(["-m", "wirekit.cli", *args], pythonpath)


def _spawn_python(args: list[str], pythonpath: str | None = None) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=pythonpath,  # -m puts the working directory first on the path
    )
    line = read_line(proc.stdout, TIMEOUT).strip()
    if not line:
        proc.kill()
        proc.wait(TIMEOUT)
        raise RuntimeError(f"{args[:2]} did not start")
    return proc, line


def _stop(proc: subprocess.Popen) -> None:
    terminate(proc, TIMEOUT)
    proc.stdout.close()


RELAY = """
import asyncio, sys

HOST, PORT = sys.argv[1], int(sys.argv[2])


class Backend(asyncio.Protocol):
    def __init__(self, client):
        self.client = client

    def data_received(self, data):
        self.client.write(data)

    def connection_lost(self, exc):
        self.client.close()


class Client(asyncio.Protocol):
    backend = None

    def connection_made(self, transport):
        self.transport = transport
        transport.pause_reading()  # until the backend connection is open
        asyncio.ensure_future(self.open())

    async def open(self):
        loop = asyncio.get_running_loop()
        self.backend, _ = await loop.create_connection(
            lambda: Backend(self.transport), HOST, PORT
        )
        self.transport.resume_reading()

    def data_received(self, data):
        self.backend.write(data)

    def connection_lost(self, exc):
        if self.backend is not None:
            self.backend.close()


async def main():
    server = await asyncio.get_running_loop().create_server(Client, "127.0.0.1", 0)
    print(f"listening on tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


asyncio.run(main())
"""


# The dispatcher with the pure ``PyConnection`` at its MIP front doors (the reference the
# compiled Connection is measured against): the same config, another store.
PURE_CONNECTION = """
import sys
from wirekit import cli
from wirekit.mip import connection
from wirekit.serve.doors import mipfront

mipfront.Connection = connection.PyConnection
sys.exit(cli.main(["serve", "--config", sys.argv[1]]))
"""


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory):
    """``{"direct": address, "dispatcher": address}`` for one backend and one dispatcher."""
    tmp = tmp_path_factory.mktemp("serve-bench")
    backend, line = _spawn(
        [
            "mip",
            "serve",
            "--handler",
            ECHO,
            "--listen",
            "tcp://127.0.0.1:0",
            "--log-level",
            "warning",
        ]
    )
    try:
        direct = line.split()[-1]
        port = int(direct.rsplit(":", 1)[1])
        config = tmp / "deploy.json"
        deploy = {
            "listen": {"host": "127.0.0.1", "http_port": 0},
            "store": {"path": str(tmp / "requests.db")},
            "cache": {"max_entries": 0},
            "models": {
                "echo": {"port": 0, "timeout": 10},
                "echo-batching": {"port": 0, "timeout": 10, "max_batch": 32},
            },
            "nodes": [
                {
                    "id": "n",
                    "devices": ["CPU"],
                    "models": ["echo", "echo-batching"],
                    "quotas": [0.5, 0.5],
                    "ports": [port, port],
                }
            ],
        }
        config.write_text(json.dumps(deploy))
        windowed = tmp / "deploy-window.json"
        deploy = {
            **deploy,
            "store": {"path": str(tmp / "requests-window.db")},
            "controller": {"period": 30, "window": 30, "actuator": {"kind": "log"}},
        }
        windowed.write_text(json.dumps(deploy))
        pure_config = tmp / "deploy-pure.json"
        pure_config.write_text(json.dumps({**deploy, "store": {"path": str(tmp / "p.db")}}))
        dispatcher, line = _spawn(["serve", "--config", str(config)])
        window_proc = pure_proc = nojournal_proc = None
        before: dict[str, Any] = {}
        before_procs: dict[str, subprocess.Popen] = {}
        try:
            base_doc = json.loads(config.read_text())
            for label, tree in BEFORE.items():
                before_config = tmp / f"deploy-{label}.json"
                store_path = str(tmp / f"{label}.db")
                before_config.write_text(json.dumps({**base_doc, "store": {"path": store_path}}))
                proc, before_line = _spawn(["serve", "--config", str(before_config)], tree)
                before_procs[label] = proc
                ready_before = json.loads(before_line)
                mip = ready_before["mip"]
                before[f"dispatcher-{label}"] = f"tcp://127.0.0.1:{mip['echo']}"
                before[f"dispatcher-batching-{label}"] = f"tcp://127.0.0.1:{mip['echo-batching']}"
                before[f"http-{label}"] = ("127.0.0.1", ready_before["http"])
            nojournal = tmp / "deploy-nojournal.json"
            nojournal.write_text(
                json.dumps({**base_doc, "store": {"path": str(tmp / "nj.db"), "journal": False}})
            )
            nojournal_proc, nojournal_line = _spawn(["serve", "--config", str(nojournal)])
            window_proc, window_line = _spawn(["serve", "--config", str(windowed)])
            pure_proc, pure_line = _spawn_python(["-c", PURE_CONNECTION, str(pure_config)])
            relay, relay_line = _spawn_python(["-c", RELAY, "127.0.0.1", str(port)])
            try:
                ready = json.loads(line)
                yield {
                    "direct": direct,
                    "dispatcher": f"tcp://127.0.0.1:{ready['mip']['echo']}",
                    "dispatcher-batching": f"tcp://127.0.0.1:{ready['mip']['echo-batching']}",
                    "dispatcher-window": "tcp://127.0.0.1:"
                    f"{json.loads(window_line)['mip']['echo']}",
                    "dispatcher-pure-connection": "tcp://127.0.0.1:"
                    f"{json.loads(pure_line)['mip']['echo']}",
                    "dispatcher-nojournal": "tcp://127.0.0.1:"
                    f"{json.loads(nojournal_line)['mip']['echo']}",
                    "http-nojournal": ("127.0.0.1", json.loads(nojournal_line)["http"]),
                    "relay": relay_line.split()[-1],
                    **before,
                    # the same dispatcher's HTTP front door (test_http_request_*)
                    "http": ("127.0.0.1", ready["http"]),
                    "http-dispatcher": ("127.0.0.1", ready["http"]),
                    # the processes whose CPU a round costs (test_request_throughput)
                    "pids": {
                        "direct": backend.pid,
                        "dispatcher": dispatcher.pid,
                        "dispatcher-batching": dispatcher.pid,
                        "dispatcher-window": window_proc.pid,
                        "dispatcher-pure-connection": pure_proc.pid,
                        "dispatcher-nojournal": nojournal_proc.pid,
                        "http-dispatcher": dispatcher.pid,
                        "http-nojournal": nojournal_proc.pid,
                        "relay": relay.pid,
                        **{
                            f"{kind}-{label}": proc.pid
                            for label, proc in before_procs.items()
                            for kind in ("dispatcher", "dispatcher-batching", "http")
                        },
                    },
                }
            finally:
                _stop(relay)
        finally:
            _stop(dispatcher)
            for proc in (window_proc, pure_proc, nojournal_proc, *before_procs.values()):
                if proc is not None:
                    _stop(proc)
    finally:
        _stop(backend)


@pytest.mark.benchmark(group="serve mip batch 1")
@pytest.mark.parametrize(
    "who",
    ["dispatcher", "dispatcher-window", "dispatcher-nojournal", *BEFORE_MIP, "relay", "direct"],
)
def test_request_latency(benchmark, endpoints, who):
    with Client(endpoints[who], timeout=TIMEOUT) as client:
        client.infer_one("warm-up")
        counter = iter(range(10**9))

        def one():
            text = f"q{next(counter)}"
            return text, client.infer_one(text)

        text, (item,) = benchmark(one)
        assert item.as_text() == text
        median = benchmark.stats.stats.median
        benchmark.extra_info["requests_per_s"] = round(1.0 / median, 1) if median else None


IN_FLIGHT = 32
ROUND = 256


@pytest.mark.benchmark(group="serve mip batch 1, 32 in flight (per 256 requests)")
@pytest.mark.parametrize(
    "who",
    [
        "dispatcher",
        "dispatcher-window",
        "dispatcher-batching",
        "dispatcher-pure-connection",
        "dispatcher-nojournal",
        *BEFORE_MIP,
        *BEFORE_BATCHING,
        "relay",
        "direct",
    ],
)
def test_request_throughput(benchmark, endpoints, who):
    """256 requests, 32 in flight on one pipelined connection: the round's time / 256 is the
    cost of one request under load (its inverse the requests per second)."""
    import asyncio

    from wirekit.mip.client import AsyncClient

    loop = asyncio.new_event_loop()
    client = AsyncClient(endpoints[who], timeout=TIMEOUT, max_in_flight=IN_FLIGHT)
    counter = iter(range(10**9))

    async def burst():
        base = next(counter) * ROUND
        outs = await asyncio.gather(*(client.infer_one(f"t{base + k}") for k in range(ROUND)))
        return base, outs

    try:
        # the CPU of the process in the middle (the backend's own for direct), per request
        base, outs = _rounds_with_server_cpu(benchmark, loop, burst, endpoints["pids"][who])
        assert [o[0].as_text() for o in outs] == [f"t{base + k}" for k in range(ROUND)]
    finally:
        loop.run_until_complete(client.close())
        loop.close()


def _rounds_with_server_cpu(benchmark, loop, burst, pid: int):
    """Time rounds of ``burst()`` (``ROUND`` requests) after one to connect and warm up;
    records requests/s and the median CPU of process ``pid`` per request; returns the last
    round's result."""
    cpu: list[int] = []

    def one_round():
        before = cpu_ns(pid)
        out = loop.run_until_complete(burst())
        cpu.append(cpu_ns(pid) - before)
        return out

    loop.run_until_complete(burst())  # connect and warm up
    result = benchmark(one_round)
    median = benchmark.stats.stats.median
    benchmark.extra_info["requests_per_s"] = round(ROUND / median, 1) if median else None
    cpu.sort()
    benchmark.extra_info["server_cpu_us"] = cpu[len(cpu) // 2] / ROUND / 1e3
    return result


def _predict_body(text: str) -> bytes:
    return json.dumps({"inputs": [[text]]}).encode()


#: the HTTP door's contenders: this tree's dispatcher, without the journal, other trees
HTTP_WHO = ["dispatcher", "nojournal", *(w.removeprefix("http-") for w in BEFORE_HTTP)]


@pytest.mark.benchmark(group="serve http batch 1")
@pytest.mark.parametrize("who", HTTP_WHO)
def test_http_request_latency(benchmark, endpoints, who):
    """One request at a time on one keep-alive connection (stdlib ``http.client``)."""
    import http.client

    host, port = endpoints[f"http-{who}"]
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    headers = {"Content-Type": "application/json"}
    counter = iter(range(10**9))

    def one():
        text = f"q{next(counter)}"
        conn.request("POST", "/v1/models/echo:predict", _predict_body(text), headers)
        resp = conn.getresponse()
        return text, resp.status, json.loads(resp.read())

    try:
        one()  # connect and warm up
        text, status, doc = benchmark(one)
        assert (status, doc["outputs"]) == (200, [[text]])
        median = benchmark.stats.stats.median
        benchmark.extra_info["requests_per_s"] = round(1.0 / median, 1) if median else None
    finally:
        conn.close()


@pytest.mark.benchmark(group="serve http batch 1, 32 in flight (per 256 requests)")
@pytest.mark.parametrize("who", HTTP_WHO)
def test_http_request_throughput(benchmark, endpoints, who):
    """256 requests, 32 at a time over 32 keep-alive connections (aiohttp's client): the
    round's time / 256 is the cost of one request under load; ``server_cpu_us`` the
    dispatcher's CPU per request."""
    import asyncio

    import aiohttp

    host, port = endpoints[f"http-{who}"]
    url = f"http://{host}:{port}/v1/models/echo:predict"
    loop = asyncio.new_event_loop()
    counter = iter(range(10**9))
    headers = {"Content-Type": "application/json"}

    async def open_session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=IN_FLIGHT)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(TIMEOUT))

    session = loop.run_until_complete(open_session())

    async def ask(text: str) -> str:
        async with session.post(url, data=_predict_body(text), headers=headers) as r:
            return (await r.json())["outputs"][0][0]

    async def burst():
        base = next(counter) * ROUND
        outs = await asyncio.gather(*(ask(f"t{base + k}") for k in range(ROUND)))
        return base, outs

    try:
        pid = endpoints["pids"][f"http-{who}"]
        base, outs = _rounds_with_server_cpu(benchmark, loop, burst, pid)
        assert outs == [f"t{base + k}" for k in range(ROUND)]
    finally:
        loop.run_until_complete(session.close())
        loop.close()


#: the contenders of the paired rounds: ours first, then what it is measured against
PAIRED = ["dispatcher", "dispatcher-nojournal", *BEFORE_MIP, "relay", "direct"]
PAIRED_ROUNDS = 41


@pytest.mark.benchmark(group="serve mip batch 1, paired rounds")
@pytest.mark.parametrize("load", ["32 in flight", "1 in flight"])
def test_request_paired(benchmark, endpoints, load):
    """The contenders of :data:`PAIRED` in turn, round after round (a round: 256 requests
    with 32 in flight on one pipelined connection, or 32 requests one at a time), so that a
    busy machine's drift hits them alike; ``extra_info["paired"]``: each contender's median
    round, requests/s, CPU per request of the process in the middle, and the median of its
    round-by-round ratio to ``dispatcher`` (``ratios.py`` prints them)."""
    import asyncio
    import time

    from wirekit.mip.client import AsyncClient

    loop = asyncio.new_event_loop()
    width, count = (IN_FLIGHT, ROUND) if load == "32 in flight" else (1, IN_FLIGHT)
    clients = {
        who: AsyncClient(endpoints[who], timeout=TIMEOUT, max_in_flight=width) for who in PAIRED
    }
    counter = iter(range(10**9))
    times: dict[str, list[float]] = {who: [] for who in PAIRED}
    cpus: dict[str, list[float]] = {who: [] for who in PAIRED}

    async def burst(client: AsyncClient) -> None:
        base = next(counter) * count
        texts = [f"p{base + k}" for k in range(count)]
        if width == 1:
            outs = [await client.infer_one(t) for t in texts]
        else:
            outs = await asyncio.gather(*(client.infer_one(t) for t in texts))
        assert [o[0].as_text() for o in outs] == texts

    def one_round_each() -> None:
        for who, client in clients.items():
            pid = endpoints["pids"][who]
            cpu = cpu_ns(pid)
            start = time.perf_counter()
            loop.run_until_complete(burst(client))
            times[who].append(time.perf_counter() - start)
            cpus[who].append((cpu_ns(pid) - cpu) / count / 1e3)

    try:
        one_round_each()  # connect and warm up
        for who in PAIRED:
            times[who].clear()
            cpus[who].clear()
        benchmark.pedantic(one_round_each, rounds=PAIRED_ROUNDS, iterations=1)
        ours = times["dispatcher"]
        paired = {}
        for who in PAIRED:
            ratio = sorted(t / o for t, o in zip(times[who], ours, strict=True))
            median = sorted(times[who])[len(ours) // 2]
            paired[who] = {
                "round_s": median,
                "requests_per_s": round(count / median, 1),
                "cpu_us": round(sorted(cpus[who])[len(ours) // 2], 2),
                "time_vs_dispatcher": round(ratio[len(ratio) // 2], 3),
            }
        benchmark.extra_info["paired"] = paired
        benchmark.extra_info["load"] = f"{load}, {count} requests a round"
    finally:
        for client in clients.values():
            loop.run_until_complete(client.close())
        loop.close()


#: the HTTP door's contenders of the paired rounds: ours first, then other trees' and ours
#: without the journal
HTTP_PAIRED = ["dispatcher", *(w.removeprefix("http-") for w in BEFORE_HTTP), "nojournal"]


@pytest.mark.benchmark(group="serve http batch 1, paired rounds")
def test_http_request_paired(benchmark, endpoints):
    """The HTTP door's contenders of :data:`HTTP_PAIRED` in turn, round after round (a round:
    256 ``POST /v1/models/echo:predict`` with 32 in flight over 32 keep-alive connections),
    so that a busy machine's drift hits them alike: with ``WIREKIT_BENCH_BEFORE`` the HTTP
    door's CPU per request before and after a change, in one run.  ``extra_info["paired"]``:
    each contender's median round, requests/s, median CPU per request of the dispatcher
    process, and the medians of its round-by-round time and CPU ratios to ``dispatcher``
    (``ratios.py`` prints them)."""
    import asyncio
    import time

    import aiohttp

    loop = asyncio.new_event_loop()
    headers = {"Content-Type": "application/json"}
    counter = iter(range(10**9))
    times: dict[str, list[float]] = {who: [] for who in HTTP_PAIRED}
    cpus: dict[str, list[float]] = {who: [] for who in HTTP_PAIRED}

    async def open_sessions() -> dict[str, aiohttp.ClientSession]:
        return {
            who: aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=IN_FLIGHT),
                timeout=aiohttp.ClientTimeout(TIMEOUT),
            )
            for who in HTTP_PAIRED
        }

    sessions = loop.run_until_complete(open_sessions())

    async def ask(session: aiohttp.ClientSession, url: str, text: str) -> str:
        async with session.post(url, data=_predict_body(text), headers=headers) as r:
            return (await r.json())["outputs"][0][0]

    async def burst(who: str) -> None:
        host, port = endpoints[f"http-{who}"]
        url = f"http://{host}:{port}/v1/models/echo:predict"
        base = next(counter) * ROUND
        texts = [f"h{base + k}" for k in range(ROUND)]
        outs = await asyncio.gather(*(ask(sessions[who], url, t) for t in texts))
        assert outs == texts

    def one_round_each() -> None:
        for who in HTTP_PAIRED:
            pid = endpoints["pids"][f"http-{who}"]
            cpu = cpu_ns(pid)
            start = time.perf_counter()
            loop.run_until_complete(burst(who))
            times[who].append(time.perf_counter() - start)
            cpus[who].append((cpu_ns(pid) - cpu) / ROUND / 1e3)

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    try:
        one_round_each()  # connect and warm up
        for who in HTTP_PAIRED:
            times[who].clear()
            cpus[who].clear()
        benchmark.pedantic(one_round_each, rounds=PAIRED_ROUNDS, iterations=1)
        ours_t, ours_c = times["dispatcher"], cpus["dispatcher"]
        paired = {}
        for who in HTTP_PAIRED:
            round_s = median(times[who])
            paired[who] = {
                "round_s": round_s,
                "requests_per_s": round(ROUND / round_s, 1),
                "cpu_us": round(median(cpus[who]), 2),
                "time_vs_dispatcher": round(
                    median([t / o for t, o in zip(times[who], ours_t, strict=True)]), 3
                ),
                "cpu_vs_dispatcher": round(
                    median([c / o for c, o in zip(cpus[who], ours_c, strict=True)]), 3
                ),
            }
        benchmark.extra_info["paired"] = paired
        benchmark.extra_info["load"] = f"http, {IN_FLIGHT} in flight, {ROUND} requests a round"
    finally:
        for session in sessions.values():
            loop.run_until_complete(session.close())
        loop.close()
