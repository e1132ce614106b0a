"""A model's settings changed while it is served (``PATCH /admin/models/{name}``, ``wirekit
serve models set``) and response-time targets in the catalog: a timeout changed live bounds
the requests that arrive after the change and not those in flight (both MIP lane twins, and
HTTP), a model added at run time with a target is controlled like one from the config, the
change reaches every replica on a PostgreSQL store (through the change log and its
compaction), and the refusals -- an unknown model, a bad value (the config validator's own
message), a setting that cannot change live, a missing token."""

from __future__ import annotations

import asyncio
import io
import json

import aiohttp
import pytest
from mip_net import CliServer
from serve_support import (
    DispatcherProcess,
    admin_headers,
    answer_of,
    deployment,
    run,
    start_backend,
    tagged,
)
from test_serve_lane import lane, lane_service  # noqa: F401 - the twin fixture
from test_serve_models import admin_service, stop_all
from test_serve_policy import stats
from test_serve_replicas_sync import described, replica, started, until

from wirekit.cli import main as wirekit_main
from wirekit.mip import ErrorCode
from wirekit.mip.client import AsyncClient
from wirekit.mip.runtime import ServerError
from wirekit.serve.config import (
    ConfigError,
    ControllerConfig,
    DeviceRow,
    ModelConfig,
    parse_config,
    parse_model,
    parse_settings,
)
from wirekit.serve.control.actuators import LogActuator
from wirekit.serve.control.catalog import Catalog, CatalogError
from wirekit.serve.control.controller import Controller, RowQuota, Snapshot, TargetPolicy
from wirekit.serve.record.pgsync import Change, fold

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)
TOKEN = "settings-token"


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = wirekit_main(
        ["serve", "models", *argv, *(["--json"] if argv[0] != "list" else [])], out, err
    )
    return status, out.getvalue(), err.getvalue()


# --- a timeout changed live -------------------------------------------------------------------


def test_a_timeout_changed_live_bounds_new_requests_not_those_in_flight(lane, tmp_path):  # noqa: F811
    """Regression: a model's timeout could only change by removing and adding the model.
    Lowered live, it fails the next request on a MIP connection already open (the lane's
    path, both twins) and over HTTP, with the new value in the reason, while a request in
    flight since before the change keeps its own deadline and is answered; raised again,
    requests are answered."""

    async def main():
        gate = asyncio.Event()
        async with (
            lane_service(
                lane,
                tmp_path / "r.db",
                [tagged("H", gate=gate)],
                model={"timeout": 5, "attempts": 3},
                backoff=0,
            ) as (service, address),
            AsyncClient(address, timeout=10) as held,
            AsyncClient(address, timeout=10) as c,
            aiohttp.ClientSession(timeout=HTTP_TIMEOUT, headers=admin_headers(service)) as http,
        ):
            base = f"http://127.0.0.1:{service.addresses()['http']}"
            await c.connect()  # open before the change
            # held by the backend: in flight (on a connection of its own, as a MIP front door
            # answers a connection's requests in order)
            first = asyncio.ensure_future(held.infer_one("a"))
            await until(lambda: service.metrics.in_flight("m") == 1)
            patch = {"timeout": 0.2, "attempts": 1}
            async with http.patch(f"{base}/admin/models/m", json=patch) as r:
                assert r.status == 200, await r.text()
                changed = await r.json()
            assert (changed["timeout"], changed["attempts"]) == (0.2, 1)
            assert service.catalog.model("m").timeout == 0.2
            # the next request, on the connection already open: given up after 0.2 s
            with pytest.raises(ServerError) as info:
                await c.infer_one("b")
            assert info.value.code == ErrorCode.INTERNAL
            async with http.post(f"{base}/v1/models/m:predict", json={"inputs": [["c"]]}) as r:
                assert r.status == 504
                assert (await r.json())["error"] == (
                    "no device answered after 1 attempt(s): n/0/m: no answer within 0.2 s"
                )
            assert not first.done()  # its deadline is still the 5 s it was sent with
            gate.set()
            (item,) = await asyncio.wait_for(first, 10)
            assert answer_of(item.as_text()) == ("H", "A")
            async with http.patch(f"{base}/admin/models/m", json={"timeout": 5}) as r:
                assert r.status == 200
            (item,) = await c.infer_one("d")
            assert answer_of(item.as_text()) == ("H", "D")

    run(main())


def test_models_set_through_a_real_dispatcher_process(tmp_path):
    """``wirekit serve models set`` against ``wirekit serve`` in its own process, a real
    ``wirekit mip serve`` backend answering in 0.2 s: a timeout of 0.05 s set live fails
    the next request, 10 s makes it answer again; the token is required."""
    with CliServer(handler="serve_handlers:tag_slow") as slow:
        port = int(slow.address.rsplit(":", 1)[1])
        doc = deployment(
            tmp_path / "r.db",
            {"m1": {"timeout": 10}},
            [{"id": "n1", "devices": ["CPU"], "models": ["m1"], "quotas": [1], "ports": [port]}],
            admin={"token": TOKEN},
            backoff=0,
            cache={"max_entries": 0},
        )
        with DispatcherProcess.of(doc, tmp_path) as proc:
            url = ["--url", proc.http, "--token", TOKEN]

            async def main():
                async with AsyncClient(proc.mip_address("m1"), timeout=20) as c:
                    (item,) = await c.infer_one("x")
                    assert answer_of(item.as_text()) == ("S", "X")
                    status, _out, err = await asyncio.to_thread(
                        cli, "set", "m1", "--model-timeout", "0.05", "--url", proc.http
                    )
                    assert status == 2 and "no admin token" in err  # no token: nothing sent
                    status, out, err = await asyncio.to_thread(
                        cli, "set", "m1", "--model-timeout", "0.05", "--attempts", "1", *url
                    )
                    assert status == 0, err
                    assert (json.loads(out)["timeout"], json.loads(out)["attempts"]) == (0.05, 1)
                    with pytest.raises(ServerError) as info:
                        await c.infer_one("y")
                    assert info.value.code == ErrorCode.INTERNAL
                    status, out, err = await asyncio.to_thread(
                        cli, "set", "m1", "--model-timeout", "10", *url
                    )
                    assert status == 0, err
                    (item,) = await c.infer_one("z")
                    assert answer_of(item.as_text()) == ("S", "Z")

            run(main())
            assert proc.stop() == 0


# --- refusals, the command line --------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"], ids=["loopback", "beyond-loopback"])
def test_settings_refusals_and_the_command_line(tmp_path, host):
    """An unknown model is 404; a bad value is 400 with the message the config file's
    validator gives for the same value in ``models.<name>``; a setting that cannot change
    live is refused naming it; without the token (required beyond loopback) 401 and nothing
    changes.  ``wirekit serve models set`` and ``add --target``."""

    async def main():
        service, servers = await admin_service(
            tmp_path, admin={"token": TOKEN}, listen={"host": host, "http_port": 0}
        )
        base = f"http://127.0.0.1:{service.addresses()['http']}"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        url = ["--url", base, "--token", TOKEN]
        try:
            async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:

                async def patch(name, body, headers=auth):
                    async with http.patch(
                        f"{base}/admin/models/{name}", json=body, headers=headers
                    ) as r:
                        return r.status, await r.json()

                before = service.catalog.model("m1")
                for headers in ({}, {"Authorization": "Bearer wrong"}):
                    status, doc = await patch("m1", {"timeout": 1}, headers)
                    assert status == 401 and "Bearer" in doc["error"]
                assert await patch("nope", {"timeout": 1}) == (
                    404,
                    {"error": "unknown model 'nope'"},
                )
                for body, where in [
                    ({"timeout": -1}, "timeout"),
                    ({"timeout": "2"}, "timeout"),
                    ({"attempts": 0}, "attempts"),
                    ({"max_batch": 1.5}, "max_batch"),
                    ({"target": 0}, "target"),
                ]:
                    status, doc = await patch("m1", body)
                    # the config file's own message for the same value
                    file_doc = deployment(
                        tmp_path / "x.db",
                        {"m1": body},
                        [{"id": "n", "devices": ["CPU"], "models": ["m1"], "quotas": [1],
                          "ports": [9]}],
                    )  # fmt: skip
                    with pytest.raises(ConfigError) as info:
                        parse_config(file_doc)
                    assert info.value.where == f"models.m1.{where}"
                    assert (status, doc) == (
                        400,
                        {"error": f"{where}: {info.value.reason}", "where": where},
                    )
                status, doc = await patch("m1", {"port": 9, "apps": ["x"], "timeout": 1})
                assert status == 400 and doc["where"] == "port"
                assert doc["error"] == (
                    "port: cannot change while the model is served, nor can apps: remove the"
                    " model and add it again (what can change: timeout, attempts, max_batch,"
                    " target)"
                )
                status, doc = await patch("m1", {"rows": []})
                assert status == 400 and doc["error"].startswith("rows: unknown key (allowed:")
                assert service.catalog.model("m1") == before  # nothing refused changed it
                version = service.catalog.version

                # the command line
                status, out, err = await asyncio.to_thread(
                    cli, "set", "m1", "--model-timeout", "2", "--target", "0.5", *url
                )
                assert status == 0, err
                assert json.loads(out)["model"] == "m1"
                assert (json.loads(out)["timeout"], json.loads(out)["target"]) == (2, 0.5)
                assert service.catalog.version == version + 1
                status, out, _err = await asyncio.to_thread(cli, "list", *url)
                assert out.splitlines()[0].endswith(", target 0.5 s")
                status, out, err = await asyncio.to_thread(cli, "set", "m1", "--no-target", *url)
                assert status == 0 and json.loads(out)["target"] is None, err
                assert service.catalog.model("m1").target is None
                status, _out, err = await asyncio.to_thread(
                    cli, "set", "m1", "--attempts", "0", *url
                )
                assert (status, err) == (
                    1,
                    "wirekit serve models set: PATCH /admin/models/m1: HTTP 400: attempts: must be"
                    " between 1 and 100, got 0\n",
                )
                status, _out, err = await asyncio.to_thread(
                    cli, "set", "nope", "--attempts", "2", *url
                )
                assert status == 1 and "HTTP 404: unknown model 'nope'" in err
                status, _out, err = await asyncio.to_thread(cli, "set", "m1", *url)
                assert status == 2 and "give at least one of --model-timeout" in err
                status, out, err = await asyncio.to_thread(
                    cli, "add", "--name", "m2", "--place", f"n1:0:0.25:{servers[1][1]}",
                    "--target", "0.25", *url,
                )  # fmt: skip
                assert status == 0, err
                assert json.loads(out)["added"]["target"] == 0.25
                assert service.catalog.model("m2").target == 0.25
        finally:
            await stop_all(service, servers)

    run(main())


def test_settings_while_a_model_is_being_removed(tmp_path):
    """PATCH while the model drains is 409; a settings change that reaches the catalog then
    anyway (from another replica's log) does not make the dispatcher take new requests for
    it again (regression: ``Dispatcher.update_model`` put the draining model back)."""

    async def main():
        gate = asyncio.Event()
        held, hport = await start_backend(tagged("H", gate=gate))
        service, servers = await admin_service(tmp_path)
        servers.append((held, hport))
        base = f"http://127.0.0.1:{service.addresses()['http']}"
        try:
            model, rows = parse_model(
                {"name": "m2", "placements": [{"node": "n1", "device": 0, "quota": 0.5,
                                               "port": hport}]},
                service.catalog.devices(),
            )  # fmt: skip
            await service.add_model(model, rows)
            async with aiohttp.ClientSession(
                timeout=HTTP_TIMEOUT, headers=admin_headers(service)
            ) as http:
                predict = f"{base}/v1/models/m2:predict"
                first = asyncio.ensure_future(http.post(predict, json={"inputs": [["a"]]}))
                await until(lambda: service.metrics.in_flight("m2") == 1)
                removal = asyncio.ensure_future(service.remove_model("m2"))
                await until(lambda: service.models_doc()["models"]["m2"]["removing"])
                async with http.patch(f"{base}/admin/models/m2", json={"timeout": 1}) as r:
                    assert r.status == 409
                    assert await r.json() == {"error": "model 'm2' is being removed"}
                service.catalog.set_model(parse_settings({"timeout": 1}, model))
                async with http.post(predict, json={"inputs": [["b"]]}) as r:
                    assert r.status == 410
                gate.set()
                async with await first as r:
                    assert r.status == 200
                assert (await asyncio.wait_for(removal, 10))["drained"] is True
                assert "m2" not in service.dispatcher.models
        finally:
            await stop_all(service, servers)

    run(main())


# --- targets: the catalog's ------------------------------------------------------------------


def two_models() -> Catalog:
    rows = [
        DeviceRow("a", "n1", 0, "CPU", "127.0.0.1", 9001, 0.4, "mip"),
        DeviceRow("b", "n1", 0, "CPU", "127.0.0.1", 9002, 0.2, "mip"),
    ]
    return Catalog({"a": ModelConfig("a", target=0.1), "b": ModelConfig("b")}, rows)


def test_the_policy_follows_the_catalogs_targets():
    """Regression: the built-in policy read ``controller.targets`` only, so a model without
    one there (added at run time) was never grown.  The snapshot carries the catalog's
    targets: given one, the slow model is grown; its target taken away, it is left alone."""
    catalog = two_models()
    config = ControllerConfig(targets=(("a", 0.1),), cooldown=0, stabilization=0)
    recent = {"a": stats(0.1), "b": stats(0.3)}  # a on target, b three times its target
    ctl = Controller(config, catalog, lambda: recent, LogActuator(), clock=iter(range(99)).__next__)

    async def main():
        assert await ctl.step() == []  # b has no target: left alone
        catalog.set_model(ModelConfig("b", target=0.1))
        assert ctl.snapshot().targets == {"a": 0.1, "b": 0.1}
        assert ctl.state()["targets"] == {"a": 0.1, "b": 0.1}
        (done,) = await ctl.step()
        assert (done["model"], done["status"], done["reason"]) == ("b", "applied", "over target")
        assert (done["old"], done["new"], done["metrics"]["target"]) == (0.2, 0.3, 0.1)
        catalog.set_model(ModelConfig("b"))
        assert await ctl.step() == []

    run(main())
    # a snapshot made by hand (no targets) is judged on the config's
    policy = TargetPolicy(config)
    rows = (RowQuota("n1", 0, "CPU", "a", 0.4), RowQuota("n1", 0, "CPU", "b", 0.2))
    assert policy.decide(Snapshot(0.0, {"a": stats(0.3), "b": stats(0.3)}, rows)) != []
    assert policy.targets == {"a": 0.1}


def test_a_model_added_with_a_target_reaches_the_controller(tmp_path):
    """POST /admin/models with a target: ``GET /admin/models`` and ``GET /controller`` show
    it, the controller's policy sees it and grows the model under real load (a backend
    answering in 20 ms, a target of 1 ms); PATCH takes it away again."""

    async def main():
        slow, slow_port = await start_backend(tagged("S", delay=0.02))
        top = {"controller": {"period": 3600, "window": 3600, "min_requests": 5}}
        service, servers = await admin_service(tmp_path, **top)
        servers.append((slow, slow_port))
        base = f"http://127.0.0.1:{service.addresses()['http']}"
        try:
            async with aiohttp.ClientSession(
                timeout=HTTP_TIMEOUT, headers=admin_headers(service)
            ) as http:
                body = {
                    "name": "m2",
                    "model": {"target": 0.001},
                    "placements": [{"node": "n1", "device": 0, "quota": 0.25, "port": slow_port}],
                }
                async with http.post(f"{base}/admin/models", json=body) as r:
                    assert r.status == 201, await r.text()
                    assert (await r.json())["target"] == 0.001
                async with http.get(f"{base}/admin/models") as r:
                    models = (await r.json())["models"]
                assert (models["m1"]["target"], models["m2"]["target"]) == (None, 0.001)
                async with http.get(f"{base}/controller") as r:
                    assert (await r.json())["targets"] == {"m2": 0.001}
                for k in range(10):
                    async with http.post(
                        f"{base}/v1/models/m2:predict", json={"inputs": [[f"q{k}"]]}
                    ) as r:
                        assert r.status == 200
                decisions = await service.controller.step()
                # (its GPU row has no backend: the free GPU the policy asks for is refused)
                grown = [d for d in decisions if (d["model"], d["device"]) == ("m2", 0)]
                assert [(d["status"], d["reason"], d["old"]) for d in grown] == [
                    ("applied", "over target", 0.25)
                ]
                assert grown[0]["new"] > 0.25
                assert service.catalog.quota("n1", 0, "m2") == grown[0]["new"]
                async with http.patch(f"{base}/admin/models/m2", json={"target": None}) as r:
                    assert r.status == 200 and (await r.json())["target"] is None
                async with http.get(f"{base}/controller") as r:
                    assert (await r.json())["targets"] == {}
        finally:
            await stop_all(service, servers)

    run(main())


def test_targets_in_the_config():
    """``controller.targets`` seeds each model's target (the catalog's from then on); a
    model's own ``target`` key says the same; both at once must agree."""
    nodes = [{"id": "n", "devices": ["CPU"], "models": ["a", "b"], "quotas": [0.5, 0.5],
              "ports": [1, 2]}]  # fmt: skip
    dep = parse_config(
        {
            "models": {"b": {"target": 0.2}},
            "nodes": nodes,
            "controller": {"targets": {"a": 0.1}},
        }
    )
    assert (dep.models["a"].target, dep.models["b"].target) == (0.1, 0.2)
    assert dict(dep.controller.targets) == {"a": 0.1, "b": 0.2}
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "models": {"a": {"target": 0.2}},
                "nodes": nodes,
                "controller": {"targets": {"a": 0.1}},
            }
        )
    assert str(info.value) == (
        "controller.targets.a: also given as models.a.target (0.2): give it once"
    )
    model, _rows = parse_model(
        {"name": "c", "model": {"target": 0.5}, "placements": [{"node": "n", "device": 0,
         "quota": 0.1, "port": 3}]},
        {("n", 0): "CPU"},
    )  # fmt: skip
    assert model.target == 0.5
    assert parse_settings({"target": None}, model).target is None
    assert parse_settings({}, model) == model


def test_the_catalog_changes_live_settings_only():
    catalog = two_models()
    seen = []
    catalog.subscribe(seen.append)
    catalog.set_model(ModelConfig("b", timeout=1.0))
    assert catalog.model("b").timeout == 1.0
    assert [(c.kind, c.model, c.version) for c in seen] == [("settings", "b", 1)]
    catalog.set_model(ModelConfig("b", timeout=1.0))  # the same: no change told
    assert catalog.version == 1
    with pytest.raises(CatalogError) as info:
        catalog.set_model(ModelConfig("b", timeout=1.0, apps=("x",), mip_port=None))
    assert str(info.value) == (
        "model 'b': mip_port, apps cannot change while it is served (remove it and add it again)"
    )
    with pytest.raises(CatalogError, match="unknown model 'z'"):
        catalog.set_model(ModelConfig("z"))


# --- replicas --------------------------------------------------------------------------------


def test_fold_keeps_the_last_settings_of_each_model():
    added = {"model": {"name": "k", "timeout": 5.0}, "rows": []}

    def settings(name, timeout):
        return {"model": name, "settings": {"timeout": timeout, "attempts": 3, "max_batch": 1,
                                            "target": None}}  # fmt: skip

    changes = [
        Change(1, "A", "settings", settings("a", 1.0)),  # a model of the config
        Change(2, "A", "add", added),
        Change(3, "A", "settings", settings("k", 2.0)),
        Change(4, "B", "settings", settings("k", 3.0)),
        Change(5, "A", "settings", settings("a", 4.0)),
    ]
    state = fold(None, changes)
    last_a, last_k = settings("a", 4.0)["settings"], settings("k", 3.0)["settings"]
    assert state["models"]["a"] == {"removed": False, "add": None, "settings": last_a}
    assert state["models"]["k"] == {"removed": False, "add": added, "settings": last_k}
    # folded in two steps: the same; a removal forgets the settings
    assert fold(fold(None, changes[:3]), changes[3:]) == state
    gone = fold(state, [Change(6, "A", "remove", {"model": "k"})])
    assert gone["models"]["k"] == {"removed": True, "add": None}


def test_settings_reach_every_replica_and_survive_compaction(tmp_path, pg_url):
    """A PATCH through replica A: B's catalog, dispatcher and backends follow (through the
    change log); after the log is compacted, C started afterwards has the same settings --
    of a model of the config and of one added at run time."""

    async def main():
        backend, port = await start_backend(tagged("A"))
        a, b = (replica(tmp_path, pg_url, n, port) for n in ("A", "B"))
        try:
            async with (
                started(a, b),
                aiohttp.ClientSession(timeout=HTTP_TIMEOUT, headers=admin_headers(a)) as http,
            ):
                base = f"http://127.0.0.1:{a.addresses()['http']}"

                async def call(method, path, body):
                    async with http.request(method, f"{base}{path}", json=body) as r:
                        assert r.status in (200, 201), await r.text()

                await call("PATCH", "/admin/models/a", {"timeout": 0.5, "target": 0.3})
                await until(lambda: b.catalog.model("a").timeout == 0.5)
                assert b.catalog.model("a").target == 0.3
                assert b.dispatcher.models["a"].timeout == 0.5
                assert b.dispatcher.backends["n/0/a"].timeout == 0.5
                assert b.controller_state()["targets"] == {"a": 0.3}
                add = {
                    "name": "k",
                    "model": {"port": None, "target": 0.2},
                    "placements": [{"node": "n", "device": 0, "quota": 0.25, "port": port}],
                }
                await call("POST", "/admin/models", add)
                await call("PATCH", "/admin/models/k", {"attempts": 2, "max_batch": 4})
                await until(lambda: "k" in b.catalog and b.catalog.model("k").attempts == 2)
                assert described(b) == described(a)
                upto = await asyncio.to_thread(a.replicas.log.compact, 0)
                c = replica(tmp_path, pg_url, "C", port)
                async with started(c):
                    seen_c = described(c)
                    timeouts_c = c.dispatcher.models["a"].timeout, c.dispatcher.models["k"].timeout
                return upto, described(a), seen_c, timeouts_c
        finally:
            await backend.shutdown()

    upto, seen_a, seen_c, timeouts_c = run(main())
    assert upto > 0
    assert seen_c == seen_a
    a_doc, k_doc = seen_c["models"]["a"], seen_c["models"]["k"]
    assert (a_doc["timeout"], a_doc["target"]) == (0.5, 0.3)
    assert (k_doc["attempts"], k_doc["max_batch"], k_doc["target"]) == (2, 4, 0.2)
    assert timeouts_c == (0.5, 5.0)
