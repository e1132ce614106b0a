"""Models added and removed while ``wirekit serve`` runs (issue 16, dynamic models): the
catalog drives routing at once (the MIP lane twins included), the admin API adds, lists and
removes models, a removal drains (in flight answered, new requests refused clearly, quota
released), and the admin API's bearer token."""

from __future__ import annotations

import asyncio
import io
import json
from collections import Counter

import aiohttp
import pytest
from serve_support import admin_headers, answer_of, deployment, run, start_backend, tagged
from support.service import start_service, stop_service
from test_serve_lane import lane, lane_service  # noqa: F401 - the twin fixture

from wirekit import mip
from wirekit.cli import main as wirekit_main
from wirekit.mip.client import AsyncClient
from wirekit.serve.config import ConfigError, parse_config, parse_model
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
    return await start_service(doc), servers


stop_all = stop_service


def shared_store(tmp_path, store_url) -> dict:
    """The ``store`` table for ``admin_service``: the SQLite file, or a PostgreSQL URL (the
    catalog's changes then also go through the change log)."""
    if store_url is None:
        return {}
    return {"store": {"path": str(tmp_path / "r.db"), "url": store_url}}


def test_admin_api_adds_lists_and_removes_a_model(tmp_path, store_url):
    async def main():
        service, servers = await admin_service(tmp_path, **shared_store(tmp_path, store_url))
        port_n, port_g = servers[1][1], servers[2][1]
        base = f"http://127.0.0.1:{service.addresses()['http']}"
        try:
            async with aiohttp.ClientSession(
                timeout=HTTP_TIMEOUT, headers=admin_headers(service)
            ) as http:
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


@pytest.mark.parametrize("controlled", [False, True], ids=["no-controller", "controller"])
def test_admin_api_sets_a_quota_and_routing_follows_at_once(tmp_path, store_url, controlled):
    """PUT /admin/models/{name}/quota (and `wirekit serve models quota`): the operator's
    decision; routing follows at once; refused with what is free; with a controller it is
    applied and recorded as the controller's own decisions are (reason "admin")."""
    top = shared_store(tmp_path, store_url)
    if controlled:
        top["controller"] = {"period": 3600, "window": 3600, "actuator": {"kind": "log"}}

    async def main():
        service, servers = await admin_service(tmp_path, **top)
        port_n, port_g = servers[1][1], servers[2][1]
        base = f"http://127.0.0.1:{service.addresses()['http']}"
        url = ["--url", base]
        try:
            async with aiohttp.ClientSession(
                timeout=HTTP_TIMEOUT, headers=admin_headers(service)
            ) as http:
                body = {
                    "name": "m2",
                    "placements": [
                        {"node": "n1", "device": 0, "quota": 0.25, "port": port_n},
                        {"node": "n1", "device": 1, "quota": 1, "port": port_g},
                    ],
                }
                async with http.post(f"{base}/admin/models", json=body) as r:
                    assert r.status == 201, await r.text()
                    port = (await r.json())["mip_port"]
                async with AsyncClient(f"tcp://127.0.0.1:{port}", timeout=10) as c:
                    assert set(await tags_of(c, 60)) == {"N", "G"}
                    # the GPU taken away: every request goes to the CPU row at once, on the
                    # connection already open
                    quota = f"{base}/admin/models/m2/quota"
                    async with http.put(quota, json={"node": "n1", "device": 1, "quota": 0}) as r:
                        assert r.status == 200, await r.text()
                        done = await r.json()
                    assert (done["old"], done["new"], done["status"], done["reason"]) == (
                        1,
                        0,
                        "applied",
                        "admin",
                    )
                    assert await tags_of(c, 40) == Counter(N=40)
                    # through the command line: the GPU back, the CPU row off
                    status, out, err = await asyncio.to_thread(
                        cli, "quota", "m2", "n1:1", "1", *url
                    )
                    assert status == 0, err
                    status, out, err = await asyncio.to_thread(
                        cli, "quota", "m2", "n1:0", "0", *url
                    )
                    assert status == 0 and json.loads(out)["new"] == 0, err
                    assert await tags_of(c, 40) == Counter(G=40)
                # refused: more than is free (m1 holds 0.5); the quota is unchanged
                async with http.put(quota, json={"node": "n1", "device": 0, "quota": 0.75}) as r:
                    assert r.status == 409
                    refusal = await r.json()
                assert "0.5 is free (held by m1 0.5)" in refusal["error"]
                assert refusal["decision"]["status"] == "refused"
                assert service.catalog.quota("n1", 0, "m2") == 0
                status, _out, err = await asyncio.to_thread(
                    cli, "quota", "m2", "n1:0", "0.75", *url
                )
                assert status == 1 and "HTTP 409" in err
                # bad bodies and names
                for bad, code in [
                    ({"node": "n1", "device": 0}, 400),
                    ({"node": "n1", "device": 7, "quota": 0.1}, 400),
                    ({"node": "n1", "device": 0, "quota": 0.1, "x": 1}, 400),
                ]:
                    async with http.put(quota, json=bad) as r:
                        assert r.status == code, (bad, await r.text())
                async with http.put(
                    f"{base}/admin/models/nope/quota", json={"node": "n1", "device": 0, "quota": 0}
                ) as r:
                    assert r.status == 404
                if controlled:
                    async with http.get(f"{base}/controller") as r:
                        decisions = (await r.json())["decisions"]
                    # the model added is an operator's decision too (issue 38)
                    assert [(d["kind"], d["reason"], d["status"]) for d in decisions] == [
                        ("add", "admin", "applied"),
                        ("quota", "admin", "applied"),
                        ("quota", "admin", "applied"),
                        ("quota", "admin", "applied"),
                        ("quota", "admin", "refused"),
                        ("quota", "admin", "refused"),
                    ]
                    # the node's actuator was told each applied change, nothing refused
                    calls = [c for c in service.controller.actuator.calls if c[2] == "m2"]
                    assert calls[-3:] == [
                        ("gpu", "n1", "m2", 0),
                        ("gpu", "n1", "m2", 1),
                        ("cpu", "n1", "m2", 0),
                    ]
            status, _out, err = cli("quota", "m2", "n1", "0.5", *url)
            assert status == 2 and "NODE:DEVICE expected" in err
        finally:
            await stop_all(service, servers)

    run(main())


def test_removal_drains_requests_in_flight(tmp_path, store_url):
    """Requests in flight when the removal starts are answered (not failed); requests after
    it on a connection still open get an error reply; the front door stops listening."""

    async def main():
        gate = asyncio.Event()
        held, hport = await start_backend(tagged("H", gate=gate))
        service, servers = await admin_service(tmp_path, **shared_store(tmp_path, store_url))
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
                http = aiohttp.ClientSession(timeout=HTTP_TIMEOUT)
                base = f"http://127.0.0.1:{service.addresses()['http']}"
                over_http = asyncio.ensure_future(
                    http.post(f"{base}/v1/models/m2:predict", json={"inputs": [["web"]]})
                )
                while service.metrics.in_flight("m2") < 21:
                    await asyncio.sleep(0.005)
                removal = asyncio.ensure_future(service.remove_model("m2"))
                await asyncio.sleep(0.05)
                assert not removal.done()  # draining: waits for the 21 in flight
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
                async with await over_http as r:
                    assert r.status == 200
                    assert (await r.json())["outputs"] == [["H:WEB"]]
                await http.close()
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
            # the late request, refused at the MIP door (model removed), is on record too
            assert statuses == {"ok": 21, "failed": 1}
        finally:
            await stop_all(service, servers)
            await held.shutdown()

    run(main())


def test_removal_after_the_drain_timeout_fails_what_is_left_once(tmp_path):
    """A backend that never answers: after ``drain_timeout`` the removal goes on; each
    request still in flight is answered once, with an error, and recorded as failed."""

    async def main():
        gate = asyncio.Event()  # never set
        held, hport = await start_backend(tagged("H", gate=gate))
        service, servers = await admin_service(tmp_path)
        try:
            model, rows = parse_model(
                {
                    "name": "m2",
                    "model": {"attempts": 2},
                    "placements": [{"node": "n1", "device": 0, "quota": 0.5, "port": hport}],
                },
                service.catalog.devices(),
            )
            await service.add_model(model, rows)
            address = f"tcp://127.0.0.1:{service.addresses()['mip']['m2']}"
            async with AsyncClient(address, timeout=10) as c:
                calls = [
                    asyncio.ensure_future(c.request(mip.Inference.request([[mip.Item.text("x")]])))
                    for _ in range(5)
                ]
                while service.metrics.in_flight("m2") < 5:
                    await asyncio.sleep(0.005)
                result = await service.remove_model("m2", drain_timeout=0.1)
                assert result == {"removed": "m2", "drained": False, "in_flight_at_timeout": 5}
                answers = await asyncio.gather(*calls)
            assert answers == [mip.ErrorReply(int(mip.ErrorCode.INTERNAL))] * 5
            assert service.metrics.in_flight("m2") == 0
            assert service.metrics.snapshot()["models"]["m2"]["statuses"] == {"failed": 5}
            assert service.catalog.free_share("n1", 0) == 0.5
        finally:
            await stop_all(service, servers)
            gate.set()
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


KNOWN = {("n1", 0): "CPU", ("n1", 1): "GPU"}


def test_parse_model_long_form_fills_known_nodes() -> None:
    model, rows = parse_model(
        {
            "models": {"m2": {"port": None, "timeout": 2}},
            "nodes": [{"id": "n1", "models": ["m2"], "quotas": [0.25, 1], "ports": [7, 8]}],
        },
        KNOWN,
        {"n1": "10.0.0.5"},
    )
    assert (model.name, model.mip_port, model.timeout) == ("m2", None, 2.0)
    assert [(r.key, r.device_type, r.endpoint, r.port, r.quota) for r in rows] == [
        ("n1/0/m2", "CPU", "10.0.0.5", 7, 0.25),
        ("n1/1/m2", "GPU", "10.0.0.5", 8, 1.0),
    ]


@pytest.mark.parametrize(
    ("doc", "where", "message"),
    [
        (
            {"name": "m", "placements": [{"node": "n9", "device": 0, "quota": 1, "port": 1}]},
            "placements[0].node",
            "unknown node 'n9' (known: n1; a new node needs the long form, with its devices)",
        ),
        (
            {"name": "m", "placements": [{"node": "n1", "device": 2, "quota": 1, "port": 1}]},
            "placements[0].device",
            "must be between 0 and 1, got 2",
        ),
        (
            {
                "name": "m",
                "placements": [
                    {"node": "n1", "device": 0, "quota": 0.1, "port": 1},
                    {"node": "n1", "device": 0, "quota": 0.2, "port": 2},
                ],
            },
            "placements[1].device",
            "device 0 of 'n1' is placed twice",
        ),
        (
            {"name": "m", "placements": [{"node": "n1", "device": 1, "quota": 0.5, "port": 1}]},
            "nodes[0].quotas[1]",
            "a GPU is given 0 or 1 of itself, got 0.5",
        ),
        (
            {"name": "m", "placements": [{"node": "n1", "device": 0, "quota": 0.5}]},
            "nodes[0].ports[0]",
            "device 0 serves m (quota 0.5): a backend port 1..65535 is needed",
        ),
        ({"name": "m", "placements": [], "x": 1}, "x", "unknown key"),
        ({"models": {}, "nodes": [], "listen": {}}, "listen", "unknown key"),
        (
            {
                "nodes": [
                    {
                        "id": "n1",
                        "models": ["a", "b"],
                        "quotas": [1, 0, 0, 1],
                        "ports": [1, 2, 3, 4],
                    }
                ]
            },
            "nodes",
            "one model at a time, got 2",
        ),
    ],
)
def test_parse_model_refusals(doc, where, message) -> None:
    with pytest.raises(ConfigError) as info:
        parse_model(doc, KNOWN)
    assert info.value.where == where
    assert info.value.reason.startswith(message)


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = wirekit_main(
        ["serve", "models", *argv, *(["--json"] if argv[0] != "list" else [])], out, err
    )
    return status, out.getvalue(), err.getvalue()


def test_models_command_with_a_toml_file(tmp_path):
    async def main():
        service, servers = await admin_service(tmp_path)
        url = ["--url", f"http://127.0.0.1:{service.addresses()['http']}"]
        try:
            model = tmp_path / "m2.toml"
            model.write_text(
                "[models.m2]\nport = 0\n\n[[nodes]]\nid = 'n1'\nmodels = ['m2']\n"
                f"quotas = [0.5, 0]\nports = [{servers[1][1]}, 0]\n"
            )
            status, out, err = await asyncio.to_thread(cli, "add", str(model), *url)
            assert status == 0, err
            port = json.loads(out)["added"]["mip_port"]
            async with AsyncClient(f"tcp://127.0.0.1:{port}", timeout=10) as c:
                assert await tags_of(c, 10) == Counter(N=10)
            status, out, err = await asyncio.to_thread(cli, "list", *url)
            assert status == 0
            assert out.splitlines() == [
                f"m1: mip, MIP port {service.addresses()['mip']['m1']}",
                f"  n1/0    CPU quota 0.5    127.0.0.1:{servers[0][1]}",
                "  n1/1    GPU quota 0      -",
                f"m2: mip, MIP port {port}",
                f"  n1/0    CPU quota 0.5    127.0.0.1:{servers[1][1]}",
                "  n1/1    GPU quota 0      -",
                "devices:",
                "  n1/0    CPU free 0",
                "  n1/1    GPU free 1",
            ]
            status, out, err = await asyncio.to_thread(cli, "add", str(model), *url)
            assert status == 1 and "HTTP 409" in err and "already exists" in err
            status, out, err = await asyncio.to_thread(cli, "remove", "m2", *url)
            assert status == 0 and json.loads(out)["removed"] == "m2"
            status, out, err = await asyncio.to_thread(cli, "remove", "m2", *url)
            assert (status, err) == (
                1,
                "wirekit serve models remove: DELETE /admin/models/m2: HTTP 404: unknown model"
                " 'm2'\n",
            )
        finally:
            await stop_all(service, servers)

    run(main())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["list"], "give the dispatcher's --url (or WIREKIT_ADMIN_URL)"),
        (["list", "--url", "ftp://x"], "--url must start with http:// or https://"),
        (
            ["add", "--url", "http://127.0.0.1:9"],
            "models add needs FILE, or --name and at least one --place",
        ),
        (
            ["add", "--url", "http://x", "--name", "m", "--place", "n1:0"],
            "expected NODE:DEVICE:QUOTA[:PORT]",
        ),
        (["add", "--url", "http://x", "--name", "m", "--place", "n1:a:1"], "DEVICE is an integer"),
        (
            ["add", "f.json", "--name", "m", "--url", "http://x"],
            "give FILE or --name/--place, not both",
        ),
    ],
)
def test_models_command_usage(argv, message, monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("WIREKIT_ADMIN_URL", raising=False)
    # no dispatcher of this machine's user is found with no --url (issue 41)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    status, out, err = cli(*argv)
    assert status == 2 and out == ""
    assert message in err


def test_models_command_unreachable_or_bad_file(tmp_path) -> None:
    url = ["--url", "http://127.0.0.1:1", "--timeout", "5"]
    status, _out, err = cli("list", *url, "--token", "t")
    assert status == 1 and "cannot reach the dispatcher at http://127.0.0.1:1" in err
    # no token given and no token file: nothing is sent, the file looked for is named
    status, _out, err = cli("list", *url)
    assert status == 2 and "no token file" in err and "serve-127.0.0.1-1.token" in err
    bad = tmp_path / "m.json"
    bad.write_text("{nope")
    status, _out, err = cli("add", str(bad), "--url", "http://127.0.0.1:1")
    assert status == 1 and "not valid JSON/TOML" in err
    status, _out, err = cli("add", str(tmp_path / "missing.json"), "--url", "http://127.0.0.1:1")
    assert status == 2 and "cannot read" in err  # a file named that is not there: usage
