"""The controller's built-in policy on recorded metric series (no sockets), the metrics
window it reads, and the ``controller`` config table."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from wirekit.serve.config import ConfigError, ControllerConfig, parse_config
from wirekit.serve.control.controller import (
    Decision,
    RowQuota,
    Snapshot,
    TargetPolicy,
    load_policy,
)
from wirekit.serve.control.metrics import Metrics, RecentStats, Window

TARGET = 0.1


def stats(value: float | None, ok: int = 100) -> RecentStats:
    """A window where every response time statistic is ``value``."""
    return RecentStats(
        seconds=10.0,
        requests=ok,
        rate=ok / 10,
        ok=ok if value is not None else 0,
        errors=0,
        queue=0,
        avg=value,
        p50=value,
        p95=value,
        p99=value,
        max=value,
    )


def config(**kw) -> ControllerConfig:
    base = dict(
        period=1.0,
        targets=(("a", TARGET), ("b", TARGET)),
        tolerance=0.1,
        max_step=0.1,
        min_share=0.05,
        cooldown=2.0,
        stabilization=5.0,
    )
    base.update(kw)
    return ControllerConfig(**base)


class Plant:
    """Quotas as a catalog keeps them, and the policy's decisions applied to them."""

    def __init__(self, rows: list[RowQuota]) -> None:
        self.quota = {(r.node, r.device, r.model): r.quota for r in rows}
        self.types = {(r.node, r.device, r.model): r.device_type for r in rows}
        self.decisions: list[tuple[int, Decision]] = []

    def rows(self) -> tuple[RowQuota, ...]:
        return tuple(
            RowQuota(n, d, self.types[(n, d, m)], m, q) for (n, d, m), q in self.quota.items()
        )

    def step(
        self,
        policy: TargetPolicy,
        t: int,
        models: dict[str, RecentStats],
        by_row: dict[str, RecentStats] | None = None,
    ) -> list[Decision]:
        out = policy.decide(Snapshot(float(t), models, self.rows(), by_row or {}))
        for d in sorted(out, key=lambda d: d.new > d.old):  # the controller's order
            key = (d.node, d.device, d.model)
            assert d.old == pytest.approx(self.quota[key])
            self.quota[key] = d.new
            self.decisions.append((t, d))
            total = sum(q for (n, i, _), q in self.quota.items() if (n, i) == key[:2])
            assert total <= 1 + 1e-9, f"device {key[:2]} over 1: {total}"  # at every step
        return out


def cpu_rows(a: float = 0.5, b: float = 0.5) -> list[RowQuota]:
    return [RowQuota("n1", 0, "CPU", "a", a), RowQuota("n1", 0, "CPU", "b", b)]


def reversals(decisions: list[Decision]) -> int:
    """How often a row's moves change direction."""
    last: dict[tuple, int] = {}
    count = 0
    for d in decisions:
        key = (d.node, d.device, d.model)
        sign = 1 if d.new > d.old else -1
        if key in last and last[key] != sign:
            count += 1
        last[key] = sign
    return count


def test_noisy_steady_input_within_the_band_makes_no_decision():
    rng = random.Random(1)
    plant = Plant(cpu_rows())
    policy = TargetPolicy(config())
    for t in range(300):
        noisy = {m: stats(TARGET * rng.uniform(0.91, 1.09)) for m in ("a", "b")}
        plant.step(policy, t, noisy)
    assert plant.decisions == []


def test_noise_beyond_the_band_does_not_oscillate():
    rng = random.Random(2)
    plant = Plant(cpu_rows(0.4, 0.4))  # free share: increases are possible at once
    policy = TargetPolicy(config())
    for t in range(300):
        noisy = {m: stats(TARGET * rng.uniform(0.7, 1.3)) for m in ("a", "b")}
        plant.step(policy, t, noisy)
    # Spikes may take some free share, but a decrease needs a whole quiet window: the shares
    # never go back and forth.
    assert reversals([d for _, d in plant.decisions]) == 0
    assert len(plant.decisions) <= 4


def test_over_target_gets_share_in_bounded_steps_and_settles():
    """A closed loop: a's response time is work / share; b idles."""
    plant = Plant(cpu_rows())
    cfg = config()
    policy = TargetPolicy(cfg)
    work = 0.08  # a needs 0.8 of the CPU to meet its target
    first_up = None
    for t in range(60):
        share_a = plant.quota[("n1", 0, "a")]
        out = plant.step(policy, t, {"a": stats(work / share_a), "b": stats(None)})
        for d in out:
            assert abs(d.new - d.old) <= cfg.max_step + 1e-9, d
            assert d.new >= cfg.min_share - 1e-9
            if d.model == "a" and first_up is None:
                first_up = t
    # b is idle from the start: it gives only once it was watched a whole stabilization
    # window (5 s), then a grows a step per cooldown until it meets its target.
    assert first_up is not None and first_up >= cfg.stabilization
    assert plant.quota[("n1", 0, "a")] == pytest.approx(0.8, abs=0.1)
    a_over = work / plant.quota[("n1", 0, "a")] / TARGET
    assert a_over <= 1 + cfg.tolerance + 1e-9
    assert plant.quota[("n1", 0, "b")] >= cfg.min_share
    assert reversals([d for _, d in plant.decisions]) == 0
    # Cooldown: no row moved twice within cfg.cooldown.
    last: dict[tuple, int] = {}
    for t, d in plant.decisions:
        key = (d.node, d.device, d.model)
        assert key not in last or t - last[key] >= cfg.cooldown
        last[key] = t


def test_load_removed_shares_drift_back_to_home():
    plant = Plant(cpu_rows())
    policy = TargetPolicy(config())
    for t in range(40):  # a loaded: it takes share from b
        plant.step(policy, t, {"a": stats(0.08 / plant.quota[("n1", 0, "a")]), "b": stats(None)})
    assert plant.quota[("n1", 0, "a")] > 0.6
    for t in range(40, 120):  # both idle
        plant.step(policy, t, {"a": stats(None), "b": stats(None)})
    assert plant.quota[("n1", 0, "a")] == pytest.approx(0.5)
    assert plant.quota[("n1", 0, "b")] == pytest.approx(0.5)


def test_one_quiet_period_takes_nothing_away():
    """The stabilization window: a decrease waits for a whole window of low recommendations."""
    plant = Plant(cpu_rows(0.7, 0.3))
    policy = TargetPolicy(config(stabilization=10.0))
    series = [stats(TARGET)] * 12 + [stats(None)] + [stats(TARGET)] * 12
    for t, s in enumerate(series):
        plant.step(policy, t, {"a": s, "b": stats(TARGET)})
    assert plant.decisions == []


def test_two_loaded_models_do_not_trade_share():
    plant = Plant(cpu_rows())
    policy = TargetPolicy(config())
    for t in range(100):
        plant.step(policy, t, {"a": stats(3 * TARGET), "b": stats(3 * TARGET)})
    assert plant.decisions == []


def test_model_without_a_target_is_left_alone():
    plant = Plant(cpu_rows(0.2, 0.2))
    policy = TargetPolicy(config(targets=(("a", TARGET),)))
    for t in range(30):
        plant.step(policy, t, {"a": stats(5 * TARGET), "b": stats(None)})
    assert all(d.model == "a" for _, d in plant.decisions)
    assert plant.quota[("n1", 0, "b")] == 0.2
    assert plant.quota[("n1", 0, "a")] == pytest.approx(0.8)  # free share only


def test_too_few_requests_is_no_figure():
    plant = Plant(cpu_rows(0.3, 0.3))
    policy = TargetPolicy(config(min_requests=20))
    for t in range(20):
        plant.step(policy, t, {"a": stats(5 * TARGET, ok=19), "b": stats(TARGET)})
    assert not [d for _, d in plant.decisions if d.new > d.old]


def gpu_rows() -> list[RowQuota]:
    return [
        RowQuota("n1", 0, "CPU", "a", 0.5),
        RowQuota("n1", 0, "CPU", "b", 0.5),
        RowQuota("n1", 1, "GPU", "a", 1.0),
        RowQuota("n1", 1, "GPU", "b", 0.0),
        RowQuota("n1", 2, "GPU", "a", 0.0),
        RowQuota("n1", 2, "GPU", "b", 0.0),
    ]


def test_gpus_move_whole_and_go_back():
    plant = Plant(gpu_rows())
    policy = TargetPolicy(config())
    for t in range(10):
        plant.step(policy, t, {"a": stats(2 * TARGET), "b": stats(TARGET)})
    gpu = [d for _, d in plant.decisions if d.device_type == "GPU"]
    assert [(d.device, d.model, d.old, d.new) for d in gpu] == [(2, "a", 0.0, 1.0)]
    # a's own GPU 1 is never taken from it, b's rows stay off
    assert plant.quota[("n1", 1, "a")] == 1.0
    for t in range(10, 40):
        plant.step(policy, t, {"a": stats(None), "b": stats(TARGET)})
    gpu = [d for _, d in plant.decisions if d.device_type == "GPU"]
    assert [(d.device, d.model, d.new) for d in gpu] == [(2, "a", 1.0), (2, "a", 0.0)]
    assert all(d.new in (0.0, 1.0) for d in gpu)
    assert plant.quota[("n1", 1, "a")] == 1.0


def test_custom_policy_is_loaded_by_name():
    cfg = config(policy="serve_policy_plugin:Fixed", options=(("share", 0.25),))
    policy = load_policy(cfg.policy, cfg)
    out = policy.decide(Snapshot(0.0, {}, tuple(cpu_rows())))
    assert [(d.model, d.new) for d in out] == [("a", 0.25)]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_module_x:P", "cannot import no_such_module_x"),
        ("wirekit.serve.control.controller:Nope", "has no Nope"),
        ("wirekit.serve.control.controller:RowQuota", None),
    ],
)
def test_bad_policy_names_are_refused(spec, message):
    with pytest.raises((ValueError, TypeError)) as info:
        load_policy(spec, config())
    if message:
        assert message in str(info.value)


# --- the metrics window -----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def two_devices() -> list[RowQuota]:
    """Model a on two CPU devices of one node, b beside it on each, half and half."""
    return [RowQuota("n1", d, "CPU", m, 0.5) for d in (0, 1) for m in ("a", "b")]


def test_a_slow_device_gets_share_on_that_device_only():
    """A closed loop per device: a's response time on device 0 is 0.08 / share (it needs 0.8
    of it), on device 1 0.02 / share (0.5 is plenty); the model's figure (its p95 over both
    devices) is the slow one's.  Judged on each device's own figure, a grows on device 0 and
    not on device 1 -- judged on the model's (as before), it would take b's share on both."""
    plant = Plant(two_devices())
    cfg = config()
    policy = TargetPolicy(cfg)
    work = {0: 0.08, 1: 0.02}
    for t in range(80):
        own = {d: stats(work[d] / plant.quota[("n1", d, "a")], ok=50) for d in (0, 1)}
        by_row = {f"n1/{d}/a": own[d] for d in (0, 1)}
        out = plant.step(policy, t, {"a": own[0], "b": stats(None)}, by_row)
        for d in out:
            if d.model == "a":
                assert d.metrics["source"] == "device"
                assert d.metrics["device_window"] == by_row[f"n1/{d.device}/a"].as_dict()
            else:  # b has no figure of its own on either device: its model's (idle)
                assert (d.metrics["source"], d.metrics["device_window"]) == ("model", None)
    assert plant.quota[("n1", 0, "a")] == pytest.approx(0.8, abs=0.1)
    assert plant.quota[("n1", 1, "a")] == 0.5  # never moved: a is fast there
    assert {d.device for _, d in plant.decisions if d.model == "a"} == {0}


def test_a_device_with_too_few_requests_is_judged_on_the_model():
    """Below ``min_requests`` answered in the window a row's own figure is not trusted: the
    model's is used (``"source": "model"``), here over target on both devices."""
    plant = Plant(two_devices())
    cfg = config(min_requests=5)
    policy = TargetPolicy(cfg)
    slow = stats(2 * TARGET)
    by_row = {"n1/0/a": slow, "n1/1/a": stats(TARGET / 10, ok=cfg.min_requests - 1)}
    ups = []
    for t in range(int(cfg.stabilization) + 2):
        ups += [d for d in plant.step(policy, t, {"a": slow, "b": stats(None)}, by_row)]
    by_device = {d.device: d for d in ups if d.model == "a"}
    assert set(by_device) == {0, 1}
    assert by_device[0].metrics["source"] == "device"
    assert by_device[1].metrics["source"] == "model"
    assert by_device[1].metrics["window"] == slow.as_dict()
    # with enough requests of its own, device 1 is judged fast and a keeps its share there
    plant = Plant(two_devices())
    policy = TargetPolicy(cfg)
    by_row["n1/1/a"] = stats(TARGET / 10, ok=cfg.min_requests)
    for t in range(int(cfg.stabilization) + 2):
        plant.step(policy, t, {"a": slow, "b": stats(None)}, by_row)
    assert plant.quota[("n1", 1, "a")] == 0.5 and plant.quota[("n1", 0, "a")] > 0.5


def test_window_per_device_on_the_general_path():
    """``Metrics.finished`` with the row that answered: each row's window; errors count on
    their row, answers from the cache and requests without a device on none."""
    clock = Clock()
    metrics = Metrics(["m"], window=Window(10.0, 1.0, clock))
    for k in range(20):
        metrics.arrived("m")
        metrics.finished("m", "ok", 0.01 if k % 2 else 0.3, "n/0/m" if k % 2 else "n/1/m")
    for device in ("n/1/m", None, "cache"):
        metrics.arrived("m")
        metrics.finished("m", "error" if device != "cache" else "ok", 0.5, device)
    rows = metrics.recent_rows()
    assert set(rows) == {"n/0/m", "n/1/m"}
    fast, slow = rows["n/0/m"], rows["n/1/m"]
    assert (fast.ok, fast.errors, fast.requests, fast.queue) == (10, 0, 10, None)
    assert (slow.ok, slow.errors, slow.requests) == (10, 1, 11)
    assert fast.avg == pytest.approx(0.01) and slow.p95 == pytest.approx(0.3, rel=0.1)
    assert metrics.recent()["m"].ok == 21 and metrics.recent()["m"].errors == 2
    window = metrics.snapshot()["window"]
    assert window["rows"]["n/0/m"] == fast.as_dict()
    clock.t += 20  # out of the window
    assert metrics.recent_rows()["n/0/m"].ok == 0
    # the lane's groups, per row
    metrics.rows_answered({"n/0/m": [4, 0.4, 0.05, 0.2]})
    got = metrics.recent_rows()["n/0/m"]
    assert (got.ok, got.requests, got.max) == (4, 4, 0.2) and got.avg == pytest.approx(0.1)
    # without a window nothing is kept per row either
    plain = Metrics(["m"])
    plain.arrived("m")
    plain.finished("m", "ok", 0.1, "n/0/m")
    assert plain.recent_rows() == {} and plain.rows == {}


def test_window_percentiles_and_expiry():
    clock = Clock()
    metrics = Metrics(["m"], window=Window(10.0, 1.0, clock))
    for k in range(100):
        metrics.arrived("m")
        metrics.finished("m", "ok", 0.010 if k < 90 else 0.200)
    metrics.arrived("m")
    metrics.finished("m", "error", 0.5)
    r = metrics.recent()["m"]
    assert r.ok == 100 and r.errors == 1 and r.requests == 101
    assert r.p50 == pytest.approx(0.010, rel=0.1)
    assert r.p95 == pytest.approx(0.200, rel=0.1)
    assert r.max == 0.200
    assert r.avg == pytest.approx((90 * 0.010 + 10 * 0.200) / 100)
    clock.t += 5
    metrics.arrived("m")
    metrics.finished("m", "ok", 1.0)
    assert metrics.recent()["m"].ok == 101
    clock.t += 6  # the first 101 left the window, the last one is in it
    r = metrics.recent()["m"]
    assert (r.ok, r.errors, r.requests, r.max) == (1, 0, 1, 1.0)
    clock.t += 20
    r = metrics.recent()["m"]
    assert (r.ok, r.requests, r.p95, r.rate) == (0, 0, None, 0.0)
    # the totals since the start are untouched by the window
    assert metrics.snapshot()["models"]["m"]["response_time"]["count"] == 101
    assert metrics.snapshot()["window"]["models"]["m"]["ok"] == 0


def test_window_counts_lane_groups():
    clock = Clock()
    metrics = Metrics(["m"], window=Window(10.0, 1.0, clock))
    s = metrics.stats("m")
    s.arrive(10)
    s.finished("ok", 10, 10 * 0.05, 0.01, 0.2)
    r = metrics.recent()["m"]
    assert (r.ok, r.requests, r.max) == (10, 10, 0.2)
    assert r.avg == pytest.approx(0.05)
    assert r.p50 == pytest.approx((0.5 - 0.21) / 8, rel=0.1)


def test_no_window_unless_asked():
    metrics = Metrics(["m"])
    metrics.arrived("m")
    metrics.finished("m", "ok", 0.1)
    assert metrics.recent() == {}
    assert "window" not in metrics.snapshot()


# --- the controller table -----------------------------------------------------------------------


def doc(controller) -> dict:
    return {
        "models": {"a": {"port": 0}},
        "nodes": [{"id": "n1", "devices": ["CPU"], "models": ["a"], "quotas": [1.0], "ports": [9]}],
        "controller": controller,
    }


def test_controller_config_defaults_and_values():
    assert parse_config({k: v for k, v in doc({}).items() if k != "controller"}).controller is None
    dep = parse_config(
        doc(
            {
                "period": 0.5,
                "targets": {"a": 0.2},
                "actuator": {"kind": "command", "argv": ["docker", "update", "--cpus", "{cpus}"]},
            }
        )
    )
    c = dep.controller
    assert c is not None and c.period == 0.5 and c.target("a") == 0.2 and c.metric == "p95"
    assert c.actuator.argv == ("docker", "update", "--cpus", "{cpus}")
    assert replace(c, period=1.0).period == 1.0


@pytest.mark.parametrize(
    "controller, where, message",
    [
        ({"period": 0}, "controller.period", "must be >= 0.05"),
        ({"periodd": 1}, "controller.periodd", "unknown key"),
        ({"targets": {"zz": 1}}, "controller.targets.zz", "unknown key"),
        ({"targets": {"a": 0}}, "controller.targets.a", "must be > 0"),
        ({"metric": "p42"}, "controller.metric", "must be one of avg, p50, p95, p99"),
        ({"policy": "nocolon"}, "controller.policy", "expected module:Class"),
        ({"tolerance": 2}, "controller.tolerance", "<= 0.9"),
        ({"actuator": {"kind": "ssh"}}, "controller.actuator.kind", "must be one of"),
        ({"actuator": {"kind": "command"}}, "controller.actuator.argv", "needs argv"),
        ({"actuator": {"kind": "cgroup"}}, "controller.actuator.cgroups", "a cgroup per model"),
        (
            {"actuator": {"kind": "command", "argv": ["x", "{cpu}"]}},
            "controller.actuator.argv[1]",
            "unknown placeholder {cpu}",
        ),
        (
            {"actuator": {"kind": "command", "argv": ["x", "{cpus"]}},
            "controller.actuator.argv[1]",
            "not a template",
        ),
    ],
)
def test_controller_config_errors(controller, where, message):
    with pytest.raises(ConfigError) as info:
        parse_config(doc(controller))
    assert info.value.where == where
    assert message in info.value.reason


def test_load_lowered_gives_back_only_what_the_target_allows():
    """A model that met its target with extra share gives back toward home, but not so much
    that it goes over again: no up-down-up."""
    plant = Plant(cpu_rows(0.3, 0.3))
    policy = TargetPolicy(config())
    work = [0.07] * 30 + [0.04] * 60  # a needs 0.7, then 0.4 of the CPU
    for t, w in enumerate(work):
        plant.step(policy, t, {"a": stats(w / plant.quota[("n1", 0, "a")]), "b": stats(None)})
        if t == 29:
            assert plant.quota[("n1", 0, "a")] == pytest.approx(0.7, abs=0.1)
    final = plant.quota[("n1", 0, "a")]
    assert 0.4 <= final <= 0.5  # down from 0.7, not below what its load needs
    assert 0.04 / final / TARGET <= 1.1  # in or under its band
    assert reversals([d for _, d in plant.decisions if d.model == "a"]) == 1


def test_a_removed_model_is_forgotten():
    """The policy's state follows the rows: a model removed and added back starts afresh,
    its new quota its home."""
    policy = TargetPolicy(config())
    plant = Plant(cpu_rows(0.5, 0.5))
    plant.step(policy, 0, {})
    del plant.quota[("n1", 0, "b")]
    plant.step(policy, 1, {})
    plant.quota[("n1", 0, "b")] = 0.2
    plant.step(policy, 2, {})
    for t in range(3, 30):  # b idle below its (new) home: nothing to restore
        plant.step(policy, t, {"a": stats(None), "b": stats(None)})
    assert plant.quota[("n1", 0, "b")] == 0.2 and plant.decisions == []


def test_resumed_change_times_keep_a_rows_cooldown():
    """A policy that takes over (a new leader) with the time of a row's last change leaves
    that row alone for the rest of its cooldown; without it, it would move at once."""
    over = {"a": stats(2 * TARGET), "b": stats(TARGET)}
    first = Plant(cpu_rows(0.4, 0.4))  # free share: a may grow at once
    assert [d.model for d in first.step(TargetPolicy(config()), 0, over)] == ["a"]
    fresh, resumed = Plant(cpu_rows(0.4, 0.4)), Plant(cpu_rows(0.4, 0.4))
    policy = TargetPolicy(config())  # cooldown 2
    policy.resume({("n1", 0, "a"): 0.0})
    assert resumed.step(policy, 1, over) == []  # one second after the change: cooling
    assert [d.model for d in fresh.step(TargetPolicy(config()), 1, over)] == ["a"]
    assert [d.model for d in resumed.step(policy, 2, over)] == ["a"]  # cooled down
    policy.resume({("n1", 0, "a"): 0.5})  # an older time than its own change: kept its own
    assert resumed.step(policy, 3, over) == []
