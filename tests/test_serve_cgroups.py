"""End to end with the ``cgroup`` actuator: real processes, real cgroups.

Two ``wirekit mip serve`` backends whose handler burns CPU per request, each in a cgroup the
test creates (``--cgroup``), behind ``wirekit serve`` (a subprocess) with the controller on.
Steady light load: no decision.  Heavy load on model a pushes its response time past its
target: within a bounded number of periods share moves from b to a, the decision is in the
store, the cgroups' quotas follow, and a's throughput rises (compared as a ratio within the
run).  Load removed: the shares drift back to the config's.

Skips where cgroups cannot be written, unless ``WIREKIT_REQUIRE_CGROUPS=1`` (``.ci/run``).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import aiohttp
import pytest
from serve_support import (
    BackendProcess,
    DispatcherProcess,
    cgroup_root,
    deployment,
    remove_cgroup,
    run,
)

from wirekit.cgroups import cpu_limit
from wirekit.mip.client import AsyncClient
from wirekit.serve.record.store import RequestStore

PERIOD = 0.5
CPUS = 0.4  #: the CPUs a share of 1 stands for: a small slice, robust on a busy machine
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)


@pytest.fixture
def cgroups():
    root = cgroup_root()
    tag = uuid.uuid4().hex[:8]
    paths = {m: root / f"wirekit-e2e-{tag}-{m}" for m in ("a", "b")}
    yield paths
    for path in paths.values():
        if path.exists():
            remove_cgroup(path)


class Load:
    """``workers`` clients of one model, each sending one request after the other
    (``pause`` seconds between); the completion times are kept."""

    def __init__(self, address: str, workers: int, pause: float) -> None:
        self.address = address
        self.workers = workers
        self.pause = pause
        self.done: list[float] = []
        self.sent = 0
        self.tasks: list[asyncio.Task] = []

    async def _worker(self, client: AsyncClient) -> None:
        while True:
            self.sent += 1
            text = f"q{self.sent}"  # each one its own: the response cache never answers
            (item,) = await client.infer_one(text)
            assert item.as_text() == f"burnt:{text.upper()}"
            self.done.append(time.monotonic())
            if self.pause:
                await asyncio.sleep(self.pause)

    async def start(self) -> Load:
        self.client = AsyncClient(self.address, timeout=20)
        self.tasks = [asyncio.ensure_future(self._worker(self.client)) for _ in range(self.workers)]
        return self

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        results = await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.client.close()
        for r in results:  # a worker that failed (not cancelled) fails the test
            if not isinstance(r, asyncio.CancelledError):
                raise r

    def rate(self, start: float, end: float) -> float:
        return sum(1 for t in self.done if start <= t < end) / (end - start)


def test_controller_moves_cpu_between_cgroups(tmp_path, cgroups):
    store = tmp_path / "requests.db"
    with (
        BackendProcess("serve_handlers:burn", cgroup=cgroups["a"]) as ba,
        BackendProcess("serve_handlers:burn", cgroup=cgroups["b"]) as bb,
    ):
        for backend, path in ((ba, cgroups["a"]), (bb, cgroups["b"])):
            assert str(backend.proc.pid) in (path / "cgroup.procs").read_text().split()
        doc = deployment(
            store,
            {"a": {"timeout": 20}, "b": {"timeout": 20}},
            [
                {
                    "id": "n1",
                    "devices": ["CPU"],
                    "models": ["a", "b"],
                    "quotas": [0.5, 0.5],
                    "ports": [ba.port, bb.port],
                }
            ],
            controller={
                "period": PERIOD,
                "window": 2.0,
                "targets": {"a": 0.08, "b": 0.25},
                "max_step": 0.2,
                "min_share": 0.1,
                "cooldown": 1.0,
                "stabilization": 1.5,
                "actuator": {
                    "kind": "cgroup",
                    "cgroups": {m: str(p) for m, p in cgroups.items()},
                    "cpus": CPUS,
                },
            },
        )
        with DispatcherProcess.of(doc, tmp_path) as dispatcher:
            result = run(scenario(dispatcher, cgroups), timeout=120)
    decisions = RequestStore(store).decisions(1000)
    check(result, decisions, cgroups)


async def controller_state(http: aiohttp.ClientSession, base: str) -> dict:
    async with http.get(f"{base}/controller") as resp:
        assert resp.status == 200
        return await resp.json()


def quota_of(state: dict, model: str) -> float:
    return next(q["quota"] for q in state["quotas"] if q["model"] == model)


async def wait_for(predicate, http, base, periods: int) -> tuple[bool, dict]:
    """Poll ``GET /controller`` until ``predicate(state)``, for at most ``periods`` periods."""
    state = await controller_state(http, base)
    for _ in range(periods * 4):
        if predicate(state):
            return True, state
        await asyncio.sleep(PERIOD / 4)
        state = await controller_state(http, base)
    return predicate(state), state


async def scenario(dispatcher: DispatcherProcess, cgroups) -> dict:
    base = dispatcher.http
    out: dict = {}
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
        # The start-up sync gives each cgroup its config share.
        ok, _ = await wait_for(
            lambda _s: cpu_limit(cgroups["a"]) == pytest.approx(0.5 * CPUS), http, base, 10
        )
        assert ok, "the controller did not set the cgroups' quotas at start"
        light_a = await Load(dispatcher.mip_address("a"), 1, 0.1).start()
        light_b = await Load(dispatcher.mip_address("b"), 1, 0.1).start()
        try:
            # Steady light load: both under target at their config shares, nothing to do.
            await asyncio.sleep(10 * PERIOD)
            state = await controller_state(http, base)
            out["steady"] = state
            await light_a.stop()
            # Heavy load on a.
            heavy = await Load(dispatcher.mip_address("a"), 8, 0.0).start()
            t_load = time.monotonic()
            moved, state = await wait_for(
                lambda s: quota_of(s, "a") >= 0.69, http, base, periods=40
            )
            t_moved = time.monotonic()
            out["moved"], out["loaded"] = moved, state
            async with http.get(f"{base}/stats") as resp:
                out["loaded_window"] = (await resp.json())["window"]
            out["loaded_limits"] = {m: cpu_limit(p) for m, p in cgroups.items()}
            first = min(
                (d["time"] for d in state["decisions"] if d["status"] == "applied"), default=None
            )
            out["first_decision_wall"] = first
            out["load_wall"] = time.time() - (t_moved - t_load)
            await asyncio.sleep(4 * PERIOD)
            t_end = time.monotonic()
            # a's throughput before the first move vs. at the new share (ratios, one run).
            out["rate_before"] = heavy.rate(t_load + 0.5, t_load + 1.5)
            out["rate_after"] = heavy.rate(t_end - 2.0, t_end)
            out["during_heavy"] = await controller_state(http, base)
            await heavy.stop()
            # Load removed: the shares drift back to the config's.
            back, state = await wait_for(
                lambda s: abs(quota_of(s, "a") - 0.5) < 0.01 and abs(quota_of(s, "b") - 0.5) < 0.01,
                http,
                base,
                periods=40,
            )
            out["back"], out["final"] = back, state
            out["final_limits"] = {m: cpu_limit(p) for m, p in cgroups.items()}
        finally:
            for load in (light_a, light_b):
                if load.tasks and not all(t.done() for t in load.tasks):
                    await load.stop()
    return out


def check(r: dict, decisions: list[dict], cgroups) -> None:
    assert r["steady"]["decisions"] == [], "steady light load made a decision"
    assert r["moved"], f"share did not move to a within 40 periods: {r['loaded_window']}"
    # The first move waited for b's stabilization window (1.5 s): the 0.5..1.5 s after the
    # load started ran at the config share.
    assert r["first_decision_wall"] is not None
    assert r["first_decision_wall"] >= r["load_wall"] + 1.5 - 0.3
    a, b = quota_of(r["loaded"], "a"), quota_of(r["loaded"], "b")
    assert a + b <= 1 + 1e-9 and b >= 0.1 - 1e-9
    assert r["loaded_limits"]["a"] == pytest.approx(a * CPUS, abs=0.01)
    assert r["loaded_limits"]["b"] == pytest.approx(b * CPUS, abs=0.01)
    # a's measured throughput rose with its quota (>= 0.7 / 0.5 = 1.4 expected; margin).
    assert r["rate_after"] / r["rate_before"] > 1.15, (r["rate_before"], r["rate_after"])
    # In the store: a's increases, with the reason and the metrics they saw.
    ups = [d for d in decisions if d["model"] == "a" and d["new"] > d["old"]]
    assert ups and all(d["status"] == "applied" for d in ups), [
        (d["status"], d["error"], d["old"], d["new"]) for d in decisions
    ]
    assert ups[0]["reason"] == "over target" and ups[0]["metrics"]["ratio"] > 1.1
    # Under steady heavy load a never lost share (no flapping) ...
    heavy = [d for d in r["during_heavy"]["decisions"] if d["model"] == "a"]
    assert all(d["new"] > d["old"] for d in heavy), heavy
    # ... and with the load gone the shares went back to the config's.
    assert r["back"], f"shares did not drift back within 40 periods: {r['final']['quotas']}"
    assert r["final_limits"]["a"] == pytest.approx(0.5 * CPUS, abs=0.01)
    assert all(d["status"] == "applied" for d in decisions)
