"""End to end through both front doors (MIP per model, HTTP/JSON incl. Clipper's form) to
wirekit MIP servers and KubeMo's own server; cache; metrics against the store."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
from mip_net import KubemoServer, kubemo_echo
from prometheus_client.parser import text_string_to_metric_families
from serve_support import answer_of, deployment, run, start_backend, tagged
from support.rows import store_rows
from support.service import start_service, stop_service

from wirekit import mip
from wirekit.mip.client import AsyncClient
from wirekit.serve.control.metrics import stats_from_store
from wirekit.serve.record.storedb import open_db

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)


def direct_stats(path, url=None):
    """The metrics computed straight from the rows, in Python (no SQL aggregates); from the
    PostgreSQL store at ``url`` when given."""
    rows = store_rows(url or path)
    out = {}
    for r in rows:
        s = out.setdefault(r.model, {"requests": 0, "queue": 0, "rts": [], "statuses": Counter()})
        s["requests"] += 1
        if r.status == "queued":
            s["queue"] += 1
        else:
            s["statuses"][r.status] += 1
        if r.status == "ok":
            s["rts"].append(r.time_out - r.time_in)
    return rows, out


def assert_stats_match(stats, direct):
    assert stats["queue"] == sum(s["queue"] for s in direct.values())
    for model, d in direct.items():
        s = stats["models"][model]
        assert s["requests"] == d["requests"]
        assert s["queue"] == d["queue"]
        assert s["statuses"] == dict(d["statuses"])
        rt = s["response_time"]
        assert rt["count"] == len(d["rts"])
        if d["rts"]:
            assert rt["min"] == min(d["rts"])
            assert rt["max"] == max(d["rts"])
            assert abs(rt["avg"] - sum(d["rts"]) / len(d["rts"])) <= 1e-12 * max(1.0, rt["max"])


def store_doc(path, url):
    """The ``store`` table of a deployment: the SQLite file, or a PostgreSQL URL."""
    return {"path": str(path), "url": url} if url else {"path": str(path)}


def test_both_front_doors_to_wirekit_and_kubemo_backends(tmp_path, store_url):
    store = tmp_path / "requests.db"

    async def main():
        a, pa = await start_backend(tagged("A"))
        b, pb = await start_backend(tagged("B"))
        with KubemoServer(kubemo_echo) as km:
            kport = int(km.address.rsplit(":", 1)[1])
            doc = deployment(
                store,
                {"m1": {"timeout": 5}, "km": {"backend": "kubemo", "apps": ["echo-app"]}},
                [
                    {
                        "id": "n1",
                        "devices": ["CPU", "GPU"],
                        "models": ["m1"],
                        "quotas": [0.7, 1],
                        "ports": [pa, pb],
                    },
                    {
                        "id": "n2",
                        "devices": ["CPU"],
                        "models": ["km"],
                        "quotas": [1],
                        "ports": [kport],
                    },
                ],
                store=store_doc(store, store_url),
            )
            service = await start_service(doc)
            try:
                await exercise(service)
            finally:
                await stop_service(service, [a, b])

    async def exercise(service):
        ports = service.addresses()
        # --- MIP front door, 200 concurrent requests pipelined on one connection
        async with AsyncClient(f"tcp://127.0.0.1:{ports['mip']['m1']}", timeout=10) as c:
            outs = await asyncio.gather(*(c.infer_one(f"x{k}") for k in range(200)))
            tags = Counter()
            for k, (item,) in enumerate(outs):
                tag, value = answer_of(item.as_text())
                assert value == f"X{k}"
                tags[tag] += 1
            assert set(tags) == {"A", "B"} and sum(tags.values()) == 200
            # malformed input gets the MIP error the codec names, and the connection lives on
            bad = await c.request(mip.Inference(True, 0, 1, 1, (mip.Item.text("r"),)))
            assert bad == mip.ErrorReply(int(mip.ErrorCode.SUBTYPE))
            assert await c.ping() >= 0
        async with AsyncClient(f"tcp://127.0.0.1:{ports['mip']['km']}", timeout=10) as c:
            (echoed,) = await c.infer_one("kubemo says hi")
            assert echoed.as_text() == "kubemo says hi"
            assert (await c.infer([[{"k": 1}], [{"k": 2}]]))[1][0].as_json() == {"k": 2}

        base = f"http://127.0.0.1:{ports['http']}"
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
            # --- HTTP: the model form
            async with http.post(
                f"{base}/v1/models/m1:predict", json={"inputs": [["hello"], ["world"]]}
            ) as r:
                assert r.status == 200
                doc = await r.json()
            assert [answer_of(o[0])[1] for o in doc["outputs"]] == ["HELLO", "WORLD"]
            async with http.post(
                f"{base}/v1/models/km:predict", json={"instances": [{"a": [1, 2]}, "t"]}
            ) as r:
                assert (await r.json()) == {"predictions": [{"a": [1, 2]}, "t"]}
            # --- HTTP: Clipper's query frontend form, by model name and by app name
            async with http.post(f"{base}/m1/predict", json={"input": "clip"}) as r:
                doc = await r.json()
            assert doc["default"] is False and answer_of(doc["output"])[1] == "CLIP"
            assert isinstance(doc["query_id"], int)
            async with http.post(
                f"{base}/echo-app/predict", json={"input_batch": [[1.5, 2.5], "s"]}
            ) as r:
                doc = await r.json()
            assert [p["output"] for p in doc["batch_predictions"]] == [[1.5, 2.5], "s"]
            # --- errors
            async with http.post(f"{base}/v1/models/nope:predict", json={"inputs": [["x"]]}) as r:
                assert r.status == 404
            async with http.post(f"{base}/v1/models/m1:predict", data=b"{not json") as r:
                assert r.status == 400 and "not JSON" in (await r.json())["error"]
            async with http.post(f"{base}/v1/models/m1:predict", json={"inputs": "x"}) as r:
                assert r.status == 400
            async with http.post(f"{base}/nope/predict", json={"input": 1}) as r:
                assert r.status == 404
            # --- cache: the same input to the same model, through either door
            async with http.post(f"{base}/v1/models/m1:predict", json={"inputs": [["x7"]]}) as r:
                cached = (await r.json())["outputs"]
            assert answer_of(cached[0][0]) == (answer_of(outs[7][0].as_text())[0], "X7")
            assert service.cache.hits == 1
            await service.store.flush()
            # --- /stats equals the store, computed two ways
            async with http.get(f"{base}/stats") as r:
                stats = await r.json()
            async with http.get(f"{base}/metrics") as r:
                assert r.headers["Content-Type"].startswith("text/plain")
                prom = await r.text()
        rows, direct = direct_stats(store, store_url)
        assert_stats_match(stats, direct)
        db = open_db(store_url or store, readonly=True)
        try:
            sql = stats_from_store(db)
        finally:
            db.close()
        store_keys = ("requests", "queue", "statuses", "response_time")  # the store's figures
        assert sql["queue"] == stats["queue"]
        assert sql["models"] == {
            m: {k: s[k] for k in store_keys} for m, s in stats["models"].items()
        }
        assert stats["cache"]["hits"] == 1 and stats["cache"]["misses"] >= 200
        hit = [r for r in rows if r.device == "cache"]
        assert len(hit) == 1 and hit[0].status == "ok" and hit[0].client.startswith("http:")
        devices = Counter(r.device for r in rows if r.model == "m1")
        assert set(devices) == {"n1/0/m1", "n1/1/m1", "cache"}
        assert all(r.payload_size > 8 for r in rows)
        # --- Prometheus text carries the same numbers (this process's, here the whole store)
        fams = {f.name: f for f in text_string_to_metric_families(prom)}
        ok = Counter()
        for s in fams["wirekit_serve_requests"].samples:
            ok[(s.labels["model"], s.labels["state"])] += s.value
        assert ok[("m1", "ok")] == direct["m1"]["statuses"]["ok"]
        counts = Counter()
        for s in fams["wirekit_serve_request_duration_seconds"].samples:
            if s.name.endswith("_count"):
                counts[s.labels["model"]] += s.value
        assert counts["m1"] == direct["m1"]["requests"]
        hits = {s.labels["model"]: s.value for s in fams["wirekit_serve_cache_hits"].samples}
        assert hits["m1"] == 1
        queue = {s.labels["model"]: s.value for s in fams["wirekit_serve_queue_length"].samples}
        assert queue["m1"] == 0

    run(main())


def test_queue_length_counts_waiting_and_running_requests(tmp_path, store_url):
    store = tmp_path / "q.db"

    async def main():
        gate = asyncio.Event()
        srv, port = await start_backend(tagged("G", gate=gate))
        doc = deployment(
            store,
            {"slow": {"timeout": 10}, "other": {"timeout": 10}},
            [
                {
                    "id": "n",
                    "devices": ["CPU"],
                    "models": ["slow", "other"],
                    "quotas": [0.5, 0.5],
                    "ports": [port, port],
                }
            ],
            cache={"max_entries": 0},
            store=store_doc(store, store_url),
        )
        service = await start_service(doc)
        try:
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['slow']}"
            async with AsyncClient(address, timeout=10) as c:
                calls = [asyncio.ensure_future(c.infer_one(f"q{k}")) for k in range(7)]
                for _ in range(500):  # bounded wait until all 7 are inside the dispatcher
                    if service.metrics.queue == 7:
                        break
                    await asyncio.sleep(0.01)
                await service.store.flush()
                stats = await service.http_stats()  # the store's figures on PostgreSQL
                _rows, direct = direct_stats(store, store_url)
                assert stats["queue"] == 7 and stats["models"]["slow"]["queue"] == 7
                assert stats["models"]["other"]["queue"] == 0
                assert_stats_match(stats, direct)
                gate.set()
                outs = await asyncio.gather(*calls)
                assert [o[0].as_text() for o in outs] == [f"G:Q{k}" for k in range(7)]
            await service.store.flush()
            _rows, direct = direct_stats(store, store_url)
            assert service.stats()["queue"] == 0  # the live counters
            assert_stats_match(await service.http_stats(), direct)
        finally:
            gate.set()
            await stop_service(service, [srv])

    run(main())
