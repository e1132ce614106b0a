"""Models added and removed while ``wirekit serve`` runs (issue 16, dynamic models): the
catalog drives routing at once (the MIP lane twins included), the admin API adds, lists and
removes models, a removal drains (in flight answered, new requests refused clearly, quota
released), and the admin API's bearer token."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import pytest
from serve_support import answer_of, deployment, run, start_backend, tagged
from test_serve_lane import lane, lane_service  # noqa: F401 - the twin fixture

from wirekit import mip
from wirekit.mip.client import AsyncClient
from wirekit.serve.config import ConfigError, parse_config
from wirekit.serve.service import ADMIN_TOKEN_ENV, Service, admin_token

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)


async def tags_of(client: AsyncClient, n: int, prefix: str = "x") -> Counter:
    outs = await asyncio.gather(*(client.infer_one(f"{prefix}{k}") for k in range(n)))
    tags: Counter = Counter()
    for k, (item,) in enumerate(outs):
        tag, value = answer_of(item.as_text())
        assert value == f"{prefix.upper()}{k}"
        tags[tag] += 1
    return tags


def test_lane_follows_quota_changes_on_an_open_connection(lane, tmp_path):  # noqa: F811
    """Regression: the lane kept the route it took when the connection opened (its single
    device, its clients), so a quota change did not reach a connection already open."""

    async def main():
        async with (
            lane_service(lane, tmp_path / "r.db", [tagged("A"), tagged("B")], quotas=[1, 0]) as (
                service,
                address,
            ),
            AsyncClient(address, timeout=10) as c,
        ):
            assert await tags_of(c, 50) == Counter(A=50)
            lane_before = service.dispatcher.lane_requests
            service.catalog.set_quota("n", 1, "m", 1)  # B gets the device, A none
            service.catalog.set_quota("n", 0, "m", 0)
            await service.dispatcher.backends["n/1/m"].lane_client.connect()
            assert await tags_of(c, 50, "y") == Counter(B=50)
            assert service.dispatcher.lane_requests - lane_before == 50  # the lane took them
            service.catalog.set_quota("n", 0, "m", 0.5)
            service.catalog.set_quota("n", 1, "m", 0.5)
            both = await tags_of(c, 200, "z")
            assert set(both) == {"A", "B"}

    run(main())


async def admin_service(tmp_path, **top):
    """A service with model m1 on n1 CPU 0 (quota 0.5) and a GPU n1/1 nobody holds; the
    backends: tag A (m1), and free ones the tests place new models on."""
    servers = [await start_backend(tagged(t)) for t in ("A", "N", "G")]
    doc = deployment(
        tmp_path / "r.db",
        {"m1": {"timeout": 5}},
        [
            {
                "id": "n1",
                "devices": ["CPU", "GPU"],
                "models": ["m1"],
                "quotas": [0.5, 0],
                "ports": [servers[0][1], None],
            }
        ],
        cache={"max_entries": 0},
        **top,
    )
    service = Service(parse_config(doc))
    await service.start()
    return service, servers


async def stop_all(service, servers):
    await service.stop()
    for server, _port in servers:
        await server.shutdown()


def test_admin_api_adds_lists_and_removes_a_model(tmp_path):
    async def main():
        service, servers = await admin_service(tmp_path)
        port_n, port_g = servers[1][1], servers[2][1]
        base = f"http://127.0.0.1:{service.addresses()['http']}"
        try:
            async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                async with http.get(f"{base}/admin/models") as r:
                    assert r.status == 200
                    doc = await r.json()
                assert list(doc["models"]) == ["m1"]
                assert doc["devices"] == [
                    {"node": "n1", "device": 0, "type": "CPU", "free": 0.5},
                    {"node": "n1", "device": 1, "type": "GPU", "free": 1.0},
                ]
                # refused: more CPU than is free; the answer says what is free
                body = {
                    "name": "m2",
                    "model": {"apps": ["app2"]},
                    "placements": [{"node": "n1", "device": 0, "quota": 0.75, "port": port_n}],
                }
                async with http.post(f"{base}/admin/models", json=body) as r:
                    assert r.status == 409
                    refusal = await r.json()
                assert refusal["error"] == (
                    "n1/0/m2: cannot give 0.75 of n1/0 (CPU): 0.5 is free (held by m1 0.5)"
                )
                assert [(d["device"], d["free"]) for d in refusal["free"]] == [(0, 0.5), (1, 1)]
                # refused by the config's own validation (a GPU is whole)
                bad = {**body, "placements": [{"node": "n1", "device": 1, "quota": 0.5}]}
                async with http.post(f"{base}/admin/models", json=bad) as r:
                    assert r.status == 400
                    assert "a GPU is given 0 or 1 of itself" in (await r.json())["error"]
                # added: half the CPU and the whole GPU
                body["placements"] = [
                    {"node": "n1", "device": 0, "quota": 0.5, "port": port_n},
                    {"node": "n1", "device": 1, "quota": 1, "port": port_g},
                ]
                async with http.post(f"{base}/admin/models", json=body) as r:
                    assert r.status == 201, await r.text()
                    added = await r.json()
                assert [(row["device"], row["quota"]) for row in added["rows"]] == [
                    (0, 0.5),
                    (1, 1),
                ]
                assert service.catalog.free_share("n1", 0) == 0
                # it answers on its own MIP front door, and over HTTP (both forms)
                async with AsyncClient(f"tcp://127.0.0.1:{added['mip_port']}", timeout=10) as c:
                    tags = await tags_of(c, 200)
                assert set(tags) == {"N", "G"} and tags["G"] > tags["N"]
                async with http.post(f"{base}/v1/models/m2:predict", json={"inputs": [["h"]]}) as r:
                    assert answer_of((await r.json())["outputs"][0][0])[1] == "H"
                async with http.post(f"{base}/app2/predict", json={"input": "c"}) as r:
                    assert answer_of((await r.json())["output"])[1] == "C"
                assert "m2" in (await (await http.get(f"{base}/stats")).json())["models"]
                # removed: quotas released, later requests told it was removed
                async with http.delete(f"{base}/admin/models/m2") as r:
                    assert r.status == 200
                    assert await r.json() == {
                        "removed": "m2",
                        "drained": True,
                        "in_flight_at_timeout": 0,
                    }
                assert service.catalog.free_share("n1", 0) == 0.5
                assert service.catalog.free_share("n1", 1) == 1.0
                for url, doc in (
                    (f"{base}/v1/models/m2:predict", {"inputs": [["h"]]}),
                    (f"{base}/app2/predict", {"input": "c"}),
                ):
                    async with http.post(url, json=doc) as r:
                        assert r.status == 410
                        assert await r.json() == {
                            "error": "model 'm2' was removed",
                            "removed": "m2",
                        }
                async with http.delete(f"{base}/admin/models/m2") as r:
                    assert r.status == 404
                async with http.post(f"{base}/v1/models/m9:predict", json={"inputs": [["h"]]}) as r:
                    assert r.status == 404
                # and the name can be used again
                async with http.post(f"{base}/admin/models", json=body) as r:
                    assert r.status == 201
                async with http.post(f"{base}/v1/models/m2:predict", json={"inputs": [["h"]]}) as r:
                    assert r.status == 200
        finally:
            await stop_all(service, servers)

    run(main())


def test_removal_drains_requests_in_flight(tmp_path):
    """Requests in flight when the removal starts are answered (not failed); requests after
    it on a connection still open get an error reply; the front door stops listening."""

    async def main():
        gate = asyncio.Event()
        held, hport = await start_backend(tagged("H", gate=gate))
        service, servers = await admin_service(tmp_path)
        try:
            from wirekit.serve.config import ModelConfig, parse_model

            model, rows = parse_model(
                {
                    "name": "m2",
                    "placements": [{"node": "n1", "device": 0, "quota": 0.5, "port": hport}],
                },
                service.catalog.devices(),
            )
            await service.add_model(model, rows)
            assert isinstance(service.catalog.model("m2"), ModelConfig)
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m2']}"
            async with AsyncClient(address, timeout=10) as c:
                in_flight = [asyncio.ensure_future(c.infer_one(f"f{k}")) for k in range(20)]
                while service.metrics.in_flight("m2") < 20:
                    await asyncio.sleep(0.005)
                removal = asyncio.ensure_future(service.remove_model("m2"))
                await asyncio.sleep(0.05)
                assert not removal.done()  # draining: waits for the 20 in flight
                # answered in order on the connection: after the 20, once the gate opens
                late = asyncio.ensure_future(
                    c.request(mip.Inference.request([[mip.Item.text("late")]]))
                )
                await asyncio.sleep(0.05)
                gate.set()
                answers = await asyncio.gather(*in_flight)
                assert [answer_of(a[0].as_text()) for a in answers] == [
                    ("H", f"F{k}") for k in range(20)
                ]
                assert await late == mip.ErrorReply(int(mip.ErrorCode.METHOD))
                assert await asyncio.wait_for(removal, 10) == {
                    "removed": "m2",
                    "drained": True,
                    "in_flight_at_timeout": 0,
                }
            with pytest.raises(OSError):
                async with AsyncClient(address, timeout=2) as c:
                    await c.ping()
            assert service.catalog.free_share("n1", 0) == 0.5
            assert "n1/0/m2" not in service.dispatcher.backends
            statuses = service.metrics.snapshot()["models"]["m2"]["statuses"]
            assert statuses == {"ok": 20}
        finally:
            await stop_all(service, servers)
            await held.shutdown()

    run(main())


def test_admin_token_is_required_when_set(tmp_path):
    async def main():
        service, servers = await admin_service(tmp_path, admin={"token": "s3cret"})
        base = f"http://127.0.0.1:{service.addresses()['http']}"
        try:
            async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                    async with http.get(f"{base}/admin/models", headers=headers) as r:
                        assert r.status == 401
                        assert r.headers["WWW-Authenticate"].startswith("Bearer")
                    async with http.delete(f"{base}/admin/models/m1", headers=headers) as r:
                        assert r.status == 401
                assert service.catalog.models() == ["m1"]
                ok = {"Authorization": "Bearer s3cret"}
                async with http.get(f"{base}/admin/models", headers=ok) as r:
                    assert r.status == 200
                # predictions need no token
                async with http.post(f"{base}/v1/models/m1:predict", json={"inputs": [["a"]]}) as r:
                    assert r.status == 200
        finally:
            await stop_all(service, servers)

    run(main())


def test_admin_api_beyond_loopback_needs_a_token(tmp_path):
    doc = deployment(
        tmp_path / "r.db",
        {"m": {}},
        [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [9]}],
    )
    doc["listen"]["host"] = "0.0.0.0"
    dep = parse_config(doc)
    with pytest.raises(ConfigError, match="needs a bearer token") as info:
        Service(dep)
    assert info.value.where == "admin.token"
    assert admin_token(dep, {ADMIN_TOKEN_ENV: "from-env"}) == "from-env"
    assert admin_token(parse_config({**doc, "admin": {"enabled": False}}), {}) is None
    assert admin_token(parse_config({**doc, "admin": {"token": "t"}}), {}) == "t"
    doc["listen"]["host"] = "::1"
    assert admin_token(parse_config(doc), {}) is None  # loopback: no token needed
