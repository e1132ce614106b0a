"""Several ``wirekit serve`` replicas on one PostgreSQL store (issue 17), as real processes.

* requests through both replicas: the store's per-model figures in ``/stats`` equal on
  both, and equal to SQL over the store; each replica's ``/metrics`` has its own requests
  only, and the two add up to the store's (counters and histograms alike);
* ``kill -9`` of one replica mid-load: the other keeps serving; after the killed one
  restarts, every request either answered is in the store, once.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import aiohttp
from mip_net import CliServer
from serve_support import TIMEOUT, DispatcherProcess, deployment
from support.rows import rows_by_text

from wirekit.mip.client import Client
from wirekit.mip.runtime import ConnectionLost
from wirekit.serve.control.metrics import stats_from_store
from wirekit.serve.record.storedb import open_db


def replica_config(tmp_path, name: str, url: str, port: int, **store) -> object:
    """The config of replica ``name``: its own journal, the shared store."""
    config = tmp_path / f"{name}.json"
    config.write_text(
        json.dumps(
            deployment(
                tmp_path / f"{name}.db",
                {"m": {"timeout": 5}, "k": {"timeout": 5}},
                [
                    {
                        "id": "n",
                        "devices": ["CPU"],
                        "models": ["m", "k"],
                        "quotas": [0.5, 0.5],
                        "ports": [port, port],
                    }
                ],
                store={"path": str(tmp_path / f"{name}.db"), "url": url, **store},
                cache={"max_entries": 0},
            )
        )
    )
    return config


def model_a_config(
    tmp_path, name: str, url: str, port: int, *, lease: float | None = None, **top
) -> object:
    """The config of replica ``name`` serving model ``a`` on one CPU (quota 0.5) of ``port``:
    its own journal, the shared store (``store.lease`` when given); ``top`` keys are added
    (a controller table)."""
    store = {"path": str(tmp_path / f"{name}.db"), "url": url, "replica": name}
    if lease is not None:
        store["lease"] = lease
    config = tmp_path / f"{name}.json"
    node = {"id": "n", "devices": ["CPU"], "models": ["a"], "quotas": [0.5], "ports": [port]}
    config.write_text(
        json.dumps(
            deployment(
                tmp_path / f"{name}.db",
                {"a": {"timeout": 5}},
                [node],
                store=store,
                cache={"max_entries": 0},
                **top,
            )
        )
    )
    return config


async def http_get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as resp:
        return resp.status, await resp.text()


async def predict(session: aiohttp.ClientSession, base: str, model: str, text: str) -> str:
    body = {"instances": [text]}
    async with session.post(
        f"{base}/v1/models/{model}:predict", json=body, timeout=aiohttp.ClientTimeout(TIMEOUT)
    ) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["predictions"][0]


def per_model(metrics_text: str, sample: str, **labels: str) -> dict[str, float]:
    """model -> the sum of the values of the samples named ``sample`` (with ``labels``)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                out[s.labels["model"]] = out.get(s.labels["model"], 0.0) + s.value
    return out


def test_two_replicas_report_the_same_figures_as_sql_over_the_store(tmp_path, pg_url):
    with CliServer(handler="serve_handlers:tag_fast") as backend:
        port = int(backend.address.rsplit(":", 1)[1])
        a_cfg = replica_config(tmp_path, "a", pg_url, port)
        b_cfg = replica_config(tmp_path, "b", pg_url, port)
        with DispatcherProcess(a_cfg) as a, DispatcherProcess(b_cfg) as b:
            # MIP through a (model m), HTTP through b (both models)
            with Client(a.mip_address("m"), timeout=TIMEOUT) as c:
                for k in range(40):
                    assert c.infer_one(f"a{k}")[0].as_text() == f"F:A{k}"

            async def load_and_read():
                async with aiohttp.ClientSession() as s:
                    for k in range(25):
                        assert await predict(s, b.http, "m", f"b{k}") == f"F:B{k}"
                        assert await predict(s, b.http, "k", f"k{k}") == f"F:K{k}"
                    # the writers hand over every flush_interval: wait for the store to
                    # hold every request (bounded), then read both replicas at once
                    deadline = time.monotonic() + 3 * TIMEOUT
                    while True:
                        _st, text = await http_get(s, f"{a.http}/stats")
                        stats = json.loads(text)
                        total = sum(m["requests"] for m in stats["models"].values())
                        if (total == 90 and stats["queue"] == 0) or time.monotonic() > deadline:
                            break
                        await asyncio.sleep(0.05)
                    return await asyncio.gather(
                        http_get(s, f"{a.http}/stats"),
                        http_get(s, f"{b.http}/stats"),
                        http_get(s, f"{a.http}/metrics"),
                        http_get(s, f"{b.http}/metrics"),
                    )

            (sa, ta), (sb, tb), (ma, mta), (mb, mtb) = asyncio.run(load_and_read())
            assert (sa, sb, ma, mb) == (200, 200, 200, 200)
            stats_a, stats_b = json.loads(ta), json.loads(tb)
            db = open_db(pg_url)
            try:
                sql = stats_from_store(db)
            finally:
                db.close()
            assert sql["models"]["m"]["requests"] == 65
            assert sql["models"]["k"]["requests"] == 25
            assert sql["queue"] == 0
            for stats in (stats_a, stats_b):
                assert stats["store"] == "postgresql"
                store_keys = ("requests", "queue", "statuses", "response_time")
                assert {
                    m: {k: v[k] for k in store_keys} for m, v in stats["models"].items()
                } == sql["models"]
                assert stats["queue"] == sql["queue"]
            # each replica's own figures, labelled as such
            assert stats_a["local"]["models"]["m"]["requests"] == 40
            assert stats_b["local"]["models"]["m"]["requests"] == 25
            assert stats_a["replica"] != stats_b["replica"]
            # /metrics: each replica its own requests; summed over the replicas (as a
            # dashboard does), the store's
            ok_a = per_model(mta, "wirekit_serve_requests_total", state="ok")
            ok_b = per_model(mtb, "wirekit_serve_requests_total", state="ok")
            assert (ok_a.get("m"), ok_b.get("m"), ok_b.get("k")) == (40.0, 25.0, 25.0)
            count = "wirekit_serve_request_duration_seconds_count"
            counts_a, counts_b = per_model(mta, count), per_model(mtb, count)
            for model in ("m", "k"):
                total = counts_a.get(model, 0.0) + counts_b.get(model, 0.0)
                assert total == sql["models"][model]["requests"]
            inf = "wirekit_serve_request_duration_seconds_bucket"
            assert per_model(mta, inf, le="+Inf") == counts_a


def stored_texts(url: str) -> dict[str, list[str]]:
    """request text -> the statuses of every row holding it (from the stored payloads)."""
    return {
        text: [status for (status,) in found] for text, found in rows_by_text(url, "status").items()
    }


def test_a_replica_killed_mid_load_loses_nothing_and_counts_nothing_twice(tmp_path, pg_url):
    with CliServer(handler="serve_handlers:tag_fast") as backend:
        port = int(backend.address.rsplit(":", 1)[1])
        a_cfg = replica_config(tmp_path, "a", pg_url, port, payloads=True)
        b_cfg = replica_config(tmp_path, "b", pg_url, port, payloads=True)
        completed: dict[str, list[str]] = {"a": [], "b": []}
        lock = threading.Lock()
        stop = threading.Event()
        errors: list[BaseException] = []

        def client(name: str, address: str, n: int) -> None:
            with Client(address, timeout=TIMEOUT) as c:
                for k in range(1_000_000):
                    if stop.is_set():
                        return
                    text = f"{name}{n}-{k}"
                    try:
                        (item,) = c.infer_one(text)
                    except (ConnectionLost, OSError):
                        if name == "b":
                            errors.append(AssertionError("replica b stopped serving"))
                        return  # replica a is gone
                    except BaseException as exc:
                        errors.append(exc)
                        return
                    assert item.as_text() == f"F:{text.upper()}"
                    with lock:
                        completed[name].append(text)

        with DispatcherProcess(b_cfg) as b:
            with DispatcherProcess(a_cfg) as a:
                threads = [
                    threading.Thread(target=client, args=(name, proc.mip_address("m"), n))
                    for name, proc in (("a", a), ("b", b))
                    for n in range(2)
                ]
                for t in threads:
                    t.start()
                deadline = time.monotonic() + 30
                while len(completed["a"]) < 300 and time.monotonic() < deadline and not errors:
                    time.sleep(0.01)
                a.kill9()
                # b keeps serving after its peer died
                served_at_kill = len(completed["b"])
                deadline = time.monotonic() + 30
                while len(completed["b"]) < served_at_kill + 200 and time.monotonic() < deadline:
                    time.sleep(0.01)
                stop.set()
                for t in threads:
                    t.join(TIMEOUT)
                assert not any(t.is_alive() for t in threads)
            assert not errors, errors
            assert len(completed["a"]) >= 300
            assert len(completed["b"]) >= served_at_kill + 200
            # a restarts: its journal is replayed, what it left queued ends lost
            with DispatcherProcess(a_cfg) as a, Client(a.mip_address("m"), timeout=TIMEOUT) as c:
                assert c.infer_one("after")[0].as_text() == "F:AFTER"
        stored = stored_texts(pg_url)
        assert stored["after"] == ["ok"]
        for text in completed["a"] + completed["b"]:
            assert stored.get(text) == ["ok"], text  # there, once, answered
        assert all(len(statuses) == 1 for statuses in stored.values())
        assert not [t for t, s in stored.items() if s == ["queued"]]


def poll(predicate, limit: int = 400, pause: float = 0.025) -> int:
    """Call ``predicate()`` until true; how many calls it took (``limit`` + 1: never)."""
    for n in range(1, limit + 1):
        if predicate():
            return n
        time.sleep(pause)
    return limit + 1


def test_models_added_and_removed_through_one_replica_reach_the_other(tmp_path, pg_url):
    """A quota changed through one replica's admin API routes on the other within a second;
    a model added / removed through one replica's admin API is served / refused by the
    other (the change log, LISTEN/NOTIFY); a replica started afterwards replays the log."""
    import urllib.error
    import urllib.request

    def http(
        method: str, url: str, body: dict | None = None, to: DispatcherProcess | None = None
    ) -> tuple[int, dict]:
        """One HTTP call (an admin one with the token of ``to``)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if to is None else to.admin_headers
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    with CliServer(handler="serve_handlers:tag_fast") as backend:
        port = int(backend.address.rsplit(":", 1)[1])
        configs = {name: model_a_config(tmp_path, name, pg_url, port) for name in "ABC"}
        with DispatcherProcess(configs["A"]) as a, DispatcherProcess(configs["B"]) as b:
            # --- a quota changed through A's admin API routes on B within a second
            status, done = http(
                "PUT",
                f"{a.http}/admin/models/a/quota",
                {"node": "n", "device": 0, "quota": 0.2},
                to=a,
            )
            assert status == 200 and done["status"] == "applied", done

            def quota_on_b() -> float:
                return http("GET", f"{b.http}/admin/models", to=b)[1]["models"]["a"]["rows"][0][
                    "quota"
                ]

            assert poll(lambda: quota_on_b() == 0.2) <= 40  # 40 polls 25 ms apart: 1 s
            # --- a model added through A: served by B; removed through A: refused by B
            body = {
                "name": "k",
                # no MIP front door: the replicas share this machine, and a model's MIP port
                # is opened by every replica
                "model": {"port": None},
                "placements": [{"node": "n", "device": 0, "quota": 0.25, "port": port}],
            }
            status, added = http("POST", f"{a.http}/admin/models", body, to=a)
            assert status == 201, added

            def served_by_b() -> bool:
                status, doc = http("POST", f"{b.http}/v1/models/k:predict", {"inputs": [["q"]]})
                return status == 200 and doc["outputs"] == [["F:Q"]]

            assert poll(served_by_b) <= 400
            status, _doc = http("DELETE", f"{a.http}/admin/models/k", to=a)
            assert status == 200
            assert poll(lambda: not served_by_b()) <= 400
            status, _doc = http("POST", f"{b.http}/v1/models/k:predict", {"inputs": [["q"]]})
            assert status in (404, 410)
            # --- a replica started now replays the log: k added and removed, k2 added
            status, added = http("POST", f"{a.http}/admin/models", {**body, "name": "k2"}, to=a)
            assert status == 201, added
            with DispatcherProcess(configs["C"]) as c:
                status, doc = http("GET", f"{c.http}/admin/models", to=c)
                assert status == 200 and sorted(doc["models"]) == ["a", "k2"]


def leader_names(url: str) -> list[str]:
    """The holder of the unexpired leader lease (``wirekit leader <origin> ...``), if any
    (issue 38: the lead is a lease on the ``leadership`` row, not an advisory lock)."""
    import psycopg

    with psycopg.connect(url) as conn:
        if conn.execute("SELECT to_regclass('leadership')").fetchone()[0] is None:
            return []
        rows = conn.execute("SELECT holder FROM leadership WHERE expires > now()").fetchall()
    return [r[0] for r in rows]


def decisions_of(url: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT replica, model, old, new, status FROM decisions ORDER BY id"
        ).fetchall()


def test_the_controller_runs_on_one_replica_and_moves_to_another(tmp_path, pg_url):
    """Two replicas with the same controller: exactly one leads (holds the lock), its one
    decision is stored once and reaches the other replica's catalog; the leader killed,
    the other leads once its lease (2 s here) has expired."""
    import urllib.request

    with CliServer(handler="serve_handlers:tag_fast") as backend:
        port = int(backend.address.rsplit(":", 1)[1])
        controller = {
            "period": 0.05,
            "window": 1.0,
            "policy": "serve_policy_plugin:Fixed",
            "options": {"share": 0.25},
        }
        configs = {
            name: model_a_config(tmp_path, name, pg_url, port, lease=2.0, controller=controller)
            for name in "AB"
        }

        def quota_of(proc) -> float:
            req = urllib.request.Request(f"{proc.http}/admin/models", headers=proc.admin_headers)
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                return json.loads(r.read())["models"]["a"]["rows"][0]["quota"]

        with DispatcherProcess(configs["A"]) as a, DispatcherProcess(configs["B"]) as b:
            procs = {"A": a, "B": b}
            assert poll(lambda: len(leader_names(pg_url)) == 1) <= 400
            (holder,) = leader_names(pg_url)
            leading = "A" if "leader A#" in holder else "B"
            other = "B" if leading == "A" else "A"
            assert f"leader {leading}#" in holder
            assert poll(lambda: quota_of(a) == 0.25 and quota_of(b) == 0.25) <= 400
            time.sleep(20 * 0.05)  # twenty more periods: the policy decides once per leader
            assert decisions_of(pg_url) == [(leading, "a", 0.5, 0.25, "applied")]
            procs[leading].kill9()
            names = f"leader {other}#"
            assert poll(lambda: [names in n for n in leader_names(pg_url)] == [True]) <= 400
            # the new leader's policy starts afresh: one decision of its own at most
            assert poll(lambda: len(decisions_of(pg_url)) >= 2, limit=100) <= 101
            first, *rest = decisions_of(pg_url)
            assert first == (leading, "a", 0.5, 0.25, "applied")
            assert [r[0] for r in rest] == [other] * len(rest) and len(rest) <= 1
