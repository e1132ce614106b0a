"""The controller loop: decisions through the catalog (routing follows) and an actuator,
rolled back when the actuator fails, stored, logged, at ``GET /controller`` and in
``/metrics``; a policy or actuator failure never stops the loop or the service."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_policy_plugin import Fixed
from serve_support import deployment, run, start_backend, tagged
from support.service import start_service, stop_service

from wirekit.serve.config import ControllerConfig, DeviceRow, ModelConfig, parse_config
from wirekit.serve.control.actuators import ActuatorError, LogActuator
from wirekit.serve.control.catalog import Catalog
from wirekit.serve.control.controller import Controller, Decision, Snapshot
from wirekit.serve.dispatch.router import Router
from wirekit.serve.record.store import RequestStore
from wirekit.serve.service import Service

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)


def catalog() -> Catalog:
    rows = [
        DeviceRow("a", "n1", 0, "CPU", "127.0.0.1", 9001, 0.5, "mip"),
        DeviceRow("b", "n1", 0, "CPU", "127.0.0.1", 9002, 0.5, "mip"),
        DeviceRow("a", "n1", 1, "GPU", "127.0.0.1", None, 0.0, "mip"),
    ]
    return Catalog({"a": ModelConfig("a"), "b": ModelConfig("b")}, rows)


class Failing:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def set_cpu_share(self, node, model, share):
        self.calls.append((node, model, share))
        raise ActuatorError("docker: no such container")

    def set_gpus(self, node, model, count):  # pragma: no cover - not asked here
        raise AssertionError


class Asks:
    """A policy that asks for the decisions it is given, once."""

    def __init__(self, *decisions: Decision) -> None:
        self.decisions = list(decisions)

    def decide(self, snapshot: Snapshot) -> list[Decision]:
        out, self.decisions = self.decisions, []
        return out


def cut_a(share: float = 0.25) -> Decision:
    return Decision("n1", 0, "CPU", "a", 0.5, share, "test", {"seen": 1})


def test_a_failed_actuator_rolls_the_quota_back_and_is_recorded(tmp_path):
    cat = catalog()
    router = Router.following(cat)
    store = RequestStore(tmp_path / "r.db")
    actuator = Failing()
    ctl = Controller(ControllerConfig(), cat, dict, actuator, store=store, policy=Asks(cut_a()))
    [record] = run(ctl.step())
    assert actuator.calls == [("n1", "a", 0.25)]  # the actuator was asked for the new share
    assert record["status"] == "failed" and "no such container" in record["error"]
    assert cat.quota("n1", 0, "a") == 0.5  # rolled back: the node still has 0.5
    assert router.probabilities("a") == {"n1/0/a": 1.0}
    [stored] = store.decisions()
    assert stored["status"] == "failed" and stored["metrics"] == {"seen": 1}
    assert ctl.failures == 1
    assert ctl.state()["decisions"][-1]["status"] == "failed"


def test_an_applied_decision_moves_routing_and_is_stored(tmp_path):
    cat = catalog()
    router = Router.following(cat)
    store = RequestStore(tmp_path / "r.db")
    act = LogActuator()
    grow_b = Decision("n1", 0, "CPU", "b", 0.5, 0.75, "test")
    ctl = Controller(ControllerConfig(), cat, dict, act, store=store, policy=Asks(cut_a(), grow_b))
    records = run(ctl.step())
    assert [r["status"] for r in records] == ["applied", "applied"]
    assert list(act.calls) == [("cpu", "n1", "a", 0.25), ("cpu", "n1", "b", 0.75)]
    assert (cat.quota("n1", 0, "a"), cat.quota("n1", 0, "b")) == (0.25, 0.75)
    assert router.rows("b")[0].quota == 0.75
    assert [(d["model"], d["new"], d["status"]) for d in store.decisions()] == [
        ("a", 0.25, "applied"),
        ("b", 0.75, "applied"),
    ]


def test_decreases_are_applied_before_increases(tmp_path):
    """Regression: a policy listing a's increase before b's decrease on a full device had
    the increase refused (the device would have been above 1 in between)."""
    cat = catalog()
    grow_a = Decision("n1", 0, "CPU", "a", 0.5, 0.7, "test")
    cut_b = Decision("n1", 0, "CPU", "b", 0.5, 0.3, "test")
    ctl = Controller(ControllerConfig(), cat, dict, LogActuator(), policy=Asks(grow_a, cut_b))
    records = run(ctl.step())
    assert [(r["model"], r["status"]) for r in records] == [("b", "applied"), ("a", "applied")]
    assert (cat.quota("n1", 0, "a"), cat.quota("n1", 0, "b")) == (0.7, 0.3)


def test_refused_decisions_never_reach_the_actuator(tmp_path):
    cat = catalog()
    act = LogActuator()
    too_much = Decision("n1", 0, "CPU", "a", 0.5, 0.9, "test")
    no_backend = Decision("n1", 1, "GPU", "a", 0.0, 1.0, "test")
    ctl = Controller(
        ControllerConfig(),
        cat,
        dict,
        act,
        policy=Asks(too_much, no_backend),
        can_serve=lambda row: row.port is not None,
    )
    records = run(ctl.step())
    assert [r["status"] for r in records] == ["refused", "refused"]
    assert "0.5 is free" in records[0]["error"]
    assert "no backend" in records[1]["error"]
    assert list(act.calls) == []
    assert cat.quota("n1", 0, "a") == 0.5 and cat.quota("n1", 1, "a") == 0.0


def test_a_policy_that_raises_skips_the_period_only(caplog):
    class Broken:
        def __init__(self) -> None:
            self.calls = 0

        def decide(self, snapshot):
            self.calls += 1
            if self.calls == 1:
                raise ZeroDivisionError("bad policy")
            return [cut_a()]

    cat = catalog()
    ctl = Controller(ControllerConfig(), cat, dict, LogActuator(), policy=Broken())
    assert run(ctl.step()) == []
    assert "the policy failed" in caplog.text
    assert [r["status"] for r in run(ctl.step())] == ["applied"]
    assert ctl.periods == 2


def test_a_slow_actuator_runs_off_the_event_loop():
    """The actuator is called in a worker thread: the loop keeps ticking meanwhile."""
    release = threading.Event()

    class Slow:
        timeout = 10.0

        def set_cpu_share(self, node, model, share):
            assert release.wait(10)

        def set_gpus(self, node, model, count):  # pragma: no cover
            pass

    async def main():
        ctl = Controller(ControllerConfig(), catalog(), dict, Slow(), policy=Asks(cut_a()))
        step = asyncio.ensure_future(ctl.step())
        ticks = 0
        while ticks < 5:
            await asyncio.sleep(0)
            ticks += 1
        assert not step.done()
        release.set()
        return await step

    [record] = run(main())
    assert record["status"] == "applied"


def test_service_runs_the_controller_and_shows_it(tmp_path):
    store = tmp_path / "requests.db"

    async def main():
        a, pa = await start_backend(tagged("A"))
        b, pb = await start_backend(tagged("B"))
        doc = deployment(
            store,
            {"a": {}, "b": {}},
            [
                {
                    "id": "n1",
                    "devices": ["CPU"],
                    "models": ["a", "b"],
                    "quotas": [0.5, 0.5],
                    "ports": [pa, pb],
                }
            ],
            controller={
                "period": 0.05,
                "window": 1.0,
                "policy": "serve_policy_plugin:Fixed",
                "options": {"share": 0.25},
            },
        )
        service = await start_service(doc)
        try:
            assert isinstance(service.controller.policy, Fixed)
            base = f"http://127.0.0.1:{service.addresses()['http']}"
            async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                for _ in range(200):
                    if service.controller.last:
                        break
                    await asyncio.sleep(0.05)
                async with http.get(f"{base}/controller") as resp:
                    state = await resp.json()
                async with http.get(f"{base}/metrics") as resp:
                    metrics = await resp.text()
                async with http.post(f"{base}/v1/models/a:predict", json={"instances": ["x"]}) as r:
                    assert r.status == 200
                async with http.get(f"{base}/stats") as resp:
                    stats = await resp.json()
            # what the policy sees of the row that answered: its own window
            assert service.controller.snapshot().rows_recent["n1/0/a"].ok == 1
        finally:
            await stop_service(service, [a, b])
        return state, metrics, stats

    state, metrics, stats = run(main())
    assert state["enabled"] and state["actuator"] == "log"
    assert [(d["model"], d["old"], d["new"], d["status"]) for d in state["decisions"]] == [
        ("a", 0.5, 0.25, "applied")
    ]
    quotas = {(q["node"], q["device"], q["model"]): q["quota"] for q in state["quotas"]}
    assert quotas == {("n1", 0, "a"): 0.25, ("n1", 0, "b"): 0.5}
    gauges = {
        (s.labels["model"], s.labels["device_type"]): s.value
        for f in text_string_to_metric_families(metrics)
        if f.name == "wirekit_serve_quota"
        for s in f.samples
    }
    assert gauges == {("a", "CPU"): 0.25, ("b", "CPU"): 0.5}
    assert stats["window"]["models"]["a"]["ok"] == 1
    row = stats["window"]["rows"]["n1/0/a"]  # the same per device: a's row on n1/0
    assert (row["ok"], row["requests"], row["queue"]) == (1, 1, None)
    assert set(stats["window"]["rows"]) == {"n1/0/a"}
    assert [d["status"] for d in RequestStore(store).decisions()] == ["applied"]


def test_no_controller_unless_configured(tmp_path):
    doc = deployment(
        tmp_path / "r.db",
        {"a": {}},
        [{"id": "n1", "devices": ["CPU"], "models": ["a"], "quotas": [1], "ports": [9]}],
    )
    service = Service(parse_config(doc))
    assert service.controller is None and service.metrics.window is None
    assert service.controller_state()["enabled"] is False


def test_a_custom_actuator_by_name(tmp_path):
    from serve_policy_plugin import Recording

    doc = deployment(
        tmp_path / "r.db",
        {"a": {}},
        [{"id": "n1", "devices": ["CPU"], "models": ["a"], "quotas": [1], "ports": [9]}],
        controller={"actuator": {"kind": "serve_policy_plugin:Recording", "options": {"tag": "t"}}},
    )
    service = Service(parse_config(doc))
    assert isinstance(service.controller.actuator, Recording)
    Recording.CALLS.clear()
    run(service.controller.sync())
    assert Recording.CALLS == [("t", "n1", "a", 1.0)]


def test_an_actuator_without_its_methods_is_a_config_error(tmp_path):
    from wirekit.serve.config import ConfigError

    doc = deployment(
        tmp_path / "r.db",
        {"a": {}},
        [{"id": "n1", "devices": ["CPU"], "models": ["a"], "quotas": [1], "ports": [9]}],
        controller={"actuator": {"kind": "collections:OrderedDict"}},
    )
    with pytest.raises(ConfigError, match=r"OrderedDict has no set_cpu_share\(\)"):
        Service(parse_config(doc))
    doc["controller"] = {"actuator": {"kind": "serve_policy_plugin:Fixed"}}  # raises
    with pytest.raises(ConfigError, match=r"Fixed\(\) failed: AttributeError"):
        Service(parse_config(doc))


def test_an_unloadable_policy_is_a_config_error(tmp_path):
    from wirekit.serve.config import ConfigError

    doc = deployment(
        tmp_path / "r.db",
        {"a": {}},
        [{"id": "n1", "devices": ["CPU"], "models": ["a"], "quotas": [1], "ports": [9]}],
        controller={"policy": "no_such_policy_module:P"},
    )
    with pytest.raises(ConfigError, match=r"controller\.policy: .*cannot import"):
        Service(parse_config(doc))


def test_the_metrics_window_has_a_bounded_number_of_slots(tmp_path):
    from wirekit.serve.service import WINDOW_SLOTS

    doc = deployment(
        tmp_path / "r.db",
        {"a": {}},
        [{"id": "n1", "devices": ["CPU"], "models": ["a"], "quotas": [1], "ports": [9]}],
        controller={"period": 0.5, "window": 86400},  # a day in slots of 0.25 s: 345600
    )
    window = Service(parse_config(doc)).metrics.window
    assert window.slots == WINDOW_SLOTS and window.slot == 86400 / WINDOW_SLOTS
    doc["controller"] = {"period": 0.5, "window": 10}
    window = Service(parse_config(doc)).metrics.window
    assert (window.slots, window.slot) == (40, 0.25)
