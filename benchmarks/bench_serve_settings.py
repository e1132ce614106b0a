"""Changing a model's timeout while it serves: the old way against ``PATCH``, one run.

    python benchmarks/bench_serve_settings.py [--clients 8] [--changes 20]

One ``wirekit serve`` service (in this process, SQLite store) serving model ``m`` from one
wirekit MIP backend, under a load of ``--clients`` HTTP clients each sending one request
after another.  The model's timeout is changed ``--changes`` times:

1. the way there was before ``PATCH /admin/models/{name}``: ``DELETE`` (drained) then
   ``POST`` again with the new timeout;
2. ``PATCH /admin/models/m`` with the new timeout.

For each: the requests not answered 200 while the changes were made (410 "removed", 404
between the removal and the add), the changes' wall time per change (milliseconds, median),
and the catalog changes each made (told to subscribers -- what a replica on a shared store
logs and every other replica applies).  Then, on PostgreSQL (a throwaway server from
tests/pg_server.py, or ``WIREKIT_PG_URL``; skipped without one): two replicas, a ``PATCH``
through one until the other's catalog has it, milliseconds, median and max of ``--changes``.

Prints the figures and their ratios (never thresholds).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import aiohttp  # noqa: E402
from pg_server import given_or_throwaway  # noqa: E402
from serve_support import deployment, start_backend, tagged  # noqa: E402

from wirekit.serve.config import parse_config  # noqa: E402
from wirekit.serve.service import Service  # noqa: E402


def service(tmp: Path, name: str, port: int, url: str | None = None) -> Service:
    store = {"path": str(tmp / f"{name}.db")}
    if url is not None:
        store.update(url=url, replica=name)
    doc = deployment(
        tmp / f"{name}.db",
        {"m": {"timeout": 5, "port": None}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [port]}],
        store=store,
        cache={"max_entries": 0},
    )
    return Service(parse_config(doc))


async def changes_under_load(tmp: Path, way: str, clients: int, changes: int) -> dict[str, float]:
    backend, port = await start_backend(tagged("A"))
    svc = service(tmp, way, port)
    await svc.start()
    told = []
    svc.catalog.subscribe(told.append)
    base = f"http://127.0.0.1:{svc.addresses()['http']}"
    stop = asyncio.Event()
    answered: dict[int, int] = {}

    async def client(http: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            async with http.post(f"{base}/v1/models/m:predict", json={"inputs": [["x"]]}) as r:
                await r.read()
                answered[r.status] = answered.get(r.status, 0) + 1

    add = {"name": "m", "model": {"port": None},
           "placements": [{"node": "n", "device": 0, "quota": 1, "port": port}]}  # fmt: skip
    times = []
    try:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30),
            headers={"Authorization": f"Bearer {svc.admin_token}"},
        ) as http:
            load = [asyncio.ensure_future(client(http)) for _ in range(clients)]
            await asyncio.sleep(0.5)
            for k in range(changes):
                timeout = 6.0 - (k % 2)  # 6, 5, 6, ...: each one a change
                start = time.perf_counter()
                if way == "remove+add":
                    async with http.delete(f"{base}/admin/models/m") as r:
                        assert r.status == 200, await r.text()
                    add["model"]["timeout"] = timeout
                    async with http.post(f"{base}/admin/models", json=add) as r:
                        assert r.status == 201, await r.text()
                else:
                    async with http.patch(f"{base}/admin/models/m", json={"timeout": timeout}) as r:
                        assert r.status == 200, await r.text()
                times.append((time.perf_counter() - start) * 1000)
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*load)
    finally:
        await svc.stop()
        await backend.shutdown()
    times.sort()
    return {
        "not answered": float(sum(n for s, n in answered.items() if s != 200)),
        "answered": float(answered.get(200, 0)),
        "ms per change (median)": times[len(times) // 2],
        "catalog changes per change": len(told) / changes,
    }


async def replica_latency(tmp: Path, url: str, changes: int) -> list[float]:
    backend, port = await start_backend(tagged("A"))
    a, b = service(tmp, "ra", port, url), service(tmp, "rb", port, url)
    out = []
    try:
        await a.start()
        await b.start()
        base = f"http://127.0.0.1:{a.addresses()['http']}"
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30),
            headers={"Authorization": f"Bearer {a.admin_token}"},
        ) as http:
            for k in range(changes):
                timeout = 5.0 + (k % 2) + 1
                start = time.perf_counter()
                async with http.patch(f"{base}/admin/models/m", json={"timeout": timeout}) as r:
                    assert r.status == 200
                while b.catalog.model("m").timeout != timeout:
                    await asyncio.sleep(0.0005)
                out.append((time.perf_counter() - start) * 1000)
    finally:
        await b.stop()
        await a.stop()
        await backend.shutdown()
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--changes", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        results = {
            way: asyncio.run(changes_under_load(tmp, way, args.clients, args.changes))
            for way in ("remove+add", "PATCH")
        }
        for way, figures in results.items():
            for name, value in figures.items():
                print(f"{way + ': ' + name:<44} {value:>10,.1f}")
        old, new = results["remove+add"], results["PATCH"]
        ratio = old["ms per change (median)"] / new["ms per change (median)"]
        print(f"{'time per change, remove+add / PATCH':<44} {ratio:>10.1f}")
        with given_or_throwaway() as url:
            if url is None:
                print("no PostgreSQL binaries: the replica figure is skipped", file=sys.stderr)
                return 0
            lat = asyncio.run(replica_latency(tmp, url, args.changes))
        print(f"{'PATCH on A -> in B catalog, median (ms)':<44} {lat[len(lat) // 2]:>10,.1f}")
        print(f"{'PATCH on A -> in B catalog, max (ms)':<44} {lat[-1]:>10,.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
