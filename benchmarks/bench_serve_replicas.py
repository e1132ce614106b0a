"""Replicas on one PostgreSQL store against one replica on SQLite (issue 17), one run.

    python benchmarks/bench_serve_replicas.py [--seconds 5] [--clients 4] [--rows 200000]

Starts a throwaway PostgreSQL server (tests/pg_server.py; or uses ``WIREKIT_PG_URL``) and
one ``wirekit mip serve`` backend (a constant-time handler), then, with the same backend and
the same load (``--clients`` pipelined MIP connections, 32 requests in flight each, for
``--seconds``):

1. one ``wirekit serve`` replica on a SQLite store: answered requests per second;
2. two replicas on one PostgreSQL store, the connections split between them: the same;
3. the store writers alone: requests per second whose rows :class:`RequestStore` commits on
   SQLite and on PostgreSQL (arrival + completion of ``--rows`` requests, as the dispatcher
   hands them over -- a request that arrives and finishes within one hand-over is one
   INSERT --, timed from the first hand-over to the last commit).

4. a change of the models metadata logged by one replica (:class:`ChangeLog`) until the
   other's follower has it: milliseconds, median and max of 50;
5. the controller's lead: a leader process killed (``kill -9``) until another
   :class:`LeaderLock` (lease 1 s, polling every 0.25 s) leads: the lease and a poll (the
   lead is a lease since issue 38, not a session).

Prints the figures and their ratios (never thresholds).  On a machine with few cores the
replicas, the clients, the backend and PostgreSQL share them: the ratio of (2) to (1) then
says what sharing the store costs, not what a second machine would add.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from mip_net import CliServer  # noqa: E402
from pg_server import given_or_throwaway  # noqa: E402
from serve_support import DispatcherProcess, deployment  # noqa: E402

from wirekit.mip.client import AsyncClient  # noqa: E402
from wirekit.serve.record.store import RequestStore  # noqa: E402


def config(tmp: Path, name: str, port: int, url: str | None) -> Path:
    store = {"path": str(tmp / f"{name}.db")}
    if url:
        store["url"] = url
    path = tmp / f"{name}.json"
    doc = deployment(
        tmp / f"{name}.db",
        {"m": {"timeout": 10}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [port]}],
        store=store,
        cache={"max_entries": 0},
    )
    path.write_text(json.dumps(doc))
    return path


async def load(addresses: list[str], clients: int, seconds: float, depth: int = 32) -> float:
    """Answered requests per second over ``clients`` connections spread over ``addresses``."""
    answered = 0
    stop_at = 0.0

    async def one(address: str) -> None:
        nonlocal answered
        async with AsyncClient(address, timeout=30) as c:

            async def lane() -> None:
                nonlocal answered
                while time.perf_counter() < stop_at:
                    await c.infer_one("x")
                    answered += 1

            await asyncio.gather(*(lane() for _ in range(depth)))

    # warm up, then measure
    stop_at = time.perf_counter() + 0.5
    await asyncio.gather(*(one(addresses[k % len(addresses)]) for k in range(clients)))
    answered = 0
    start = time.perf_counter()
    stop_at = start + seconds
    await asyncio.gather(*(one(addresses[k % len(addresses)]) for k in range(clients)))
    return answered / (time.perf_counter() - start)


async def writer_rate(path: Path, url: str | None, rows: int) -> float:
    """Requests per second whose rows the store's writer commits (arrivals and completions
    of ``rows`` requests, handed over as under load)."""
    store = RequestStore(path, url=url, replica=f"bench-{os.getpid()}", batch_max=1024)
    store.open()
    try:
        start = time.perf_counter()
        t = time.time()
        for k in range(rows):
            rid = f"w{k}"
            store.arrival(rid, "m", "c", t, 20)
            store.complete(rid, "m", "c", "n/0/m", t, t + 0.001, "ok", 20, 1, None, True)
            if k % 256 == 255:
                store.write_journal()
                await asyncio.sleep(0)  # let the flush timer run, as the loop would
        store.write_journal()
        await store.flush()
        elapsed = time.perf_counter() - start
    finally:
        store.close()
    return rows / elapsed


def change_latency(url: str, n: int = 50) -> list[float]:
    """Milliseconds from :meth:`ChangeLog.append` on one replica to the other's follower."""
    import threading

    from wirekit.serve.record.pgsync import ChangeLog
    from wirekit.serve.record.storedb import open_db

    db = open_db(url)
    db.migrate()
    db.close()
    got = threading.Event()
    a, b = ChangeLog(url, "a"), ChangeLog(url, "b")
    b.follow(lambda _changes: got.set(), after=b.last()).ready.wait(30)
    out = []
    try:
        for k in range(n):
            got.clear()
            start = time.perf_counter()
            a.append("quota", {"k": k})
            got.wait(10)
            out.append((time.perf_counter() - start) * 1000)
    finally:
        a.close()
        b.close()
    return sorted(out)


def takeover_ms(url: str) -> float:
    """Milliseconds from ``kill -9`` of the leader's process until another leads."""
    import subprocess

    from wirekit.serve.record.pgsync import LeaderLock

    code = (
        "import sys, time\nfrom wirekit.serve.record.pgsync import LeaderLock\n"
        "lock = LeaderLock(sys.argv[1], lease=1.0); assert lock.poll()\n"
        "print('leading', flush=True)\n"
        "time.sleep(600)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, url], stdout=subprocess.PIPE, text=True, env=env
    )
    other = LeaderLock(url, lease=1.0, retry=0.25)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "leading"
        assert not other.poll()
        start = time.perf_counter()
        proc.kill()
        while not other.poll():
            time.sleep(other.retry)
        return (time.perf_counter() - start) * 1000
    finally:
        other.close()
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rows", type=int, default=200_000)
    args = ap.parse_args()

    results: dict[str, float] = {}
    with given_or_throwaway() as url:
        if url is None:
            print("no PostgreSQL binaries (apt-get install postgresql)", file=sys.stderr)
            return 2
        with (
            tempfile.TemporaryDirectory() as tmpdir,
            CliServer(handler="serve_handlers:tag_fast") as backend,
        ):
            tmp = Path(tmpdir)
            port = int(backend.address.rsplit(":", 1)[1])
            with DispatcherProcess(config(tmp, "solo", port, None)) as solo:
                results["1 replica, SQLite (req/s)"] = asyncio.run(
                    load([solo.mip_address("m")], args.clients, args.seconds)
                )
            with (
                DispatcherProcess(config(tmp, "a", port, url)) as a,
                DispatcherProcess(config(tmp, "b", port, url)) as b,
            ):
                results["2 replicas, PostgreSQL (req/s)"] = asyncio.run(
                    load([a.mip_address("m"), b.mip_address("m")], args.clients, args.seconds)
                )
            results["SQLite writer (requests/s)"] = asyncio.run(
                writer_rate(tmp / "w.db", None, args.rows)
            )
            results["PostgreSQL writer (requests/s)"] = asyncio.run(
                writer_rate(tmp / "wpg.db", url, args.rows)
            )
            lat = change_latency(url)
            results["catalog change, median (ms)"] = lat[len(lat) // 2]
            results["catalog change, max (ms)"] = lat[-1]
            results["leader killed -> new leader (ms)"] = takeover_ms(url)
    for name, value in results.items():
        print(f"{name:<34} {value:>12,.1f}" if value < 100 else f"{name:<34} {value:>12,.0f}")
    two, one = results["2 replicas, PostgreSQL (req/s)"], results["1 replica, SQLite (req/s)"]
    pg_w, lite_w = results["PostgreSQL writer (requests/s)"], results["SQLite writer (requests/s)"]
    print(f"{'2 replicas on PG / 1 on SQLite':<34} {two / one:>12.2f}")
    print(f"{'PG writer / SQLite writer':<34} {pg_w / lite_w:>12.2f}")
    # one replica's writer against what each of the two replicas served: the headroom
    print(f"{'PG writer / req/s of one replica':<34} {pg_w / (two / 2):>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
