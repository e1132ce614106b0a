"""``/healthz``, ``/readyz``, ``/metrics`` and ``/stats`` of a real ``wirekit serve``
subprocess (issue 28), on loopback, with real ``wirekit mip serve`` backends:

* ``/readyz`` is 503 with the reason while every backend of a model is down (its process
  killed), 200 once it is back; ``/healthz`` stays 200 throughout;
* after a known load -- requests answered, failed (no backend listening) and timed out,
  through the HTTP door, the MIP lane and adaptive batching -- ``/metrics`` parsed with
  prometheus_client's parser has a request histogram whose ``_count`` is the number of
  requests of each model, counters by end state matching, monotone buckets, the queue and
  backend histograms; every exported name follows the Prometheus rules and the table of
  :data:`wirekit.serve.control.metrics.METRIC_NAMES`; ``/stats`` says the same figures.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from typing import Any

import aiohttp
from mip_net import CliServer
from serve_support import TIMEOUT, DispatcherProcess, deployment, run
from support.ports import free_port

from wirekit.mip.client import AsyncClient
from wirekit.serve.control.metrics import DURATION_BUCKETS, METRIC_NAMES, quantile

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=TIMEOUT)


def _port_of(server: CliServer) -> int:
    return int(server.address.rsplit(":", 1)[1])


def _node(name: str, models: list[str], ports: list[int]) -> dict[str, Any]:
    return {
        "id": name,
        "devices": ["CPU"],
        "models": models,
        "quotas": [round(1 / len(models), 6)] * len(models),
        "ports": ports,
    }


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as r:
        body = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, body


async def _wait_status(http, url: str, status: int, timeout: float = 6 * TIMEOUT) -> Any:
    """Poll ``url`` until it answers ``status`` (bounded); its body."""
    deadline = time.monotonic() + timeout
    while True:
        got, body = await _get(http, url)
        if got == status:
            return body
        assert time.monotonic() < deadline, f"{url}: still {got} {body}"
        await asyncio.sleep(0.1)


def test_readyz_says_when_every_backend_of_a_model_is_down(tmp_path):
    with (
        CliServer(handler="serve_handlers:tag_fast") as up,
        CliServer(handler="serve_handlers:tag_fast") as doomed,
    ):
        port_k, port_m = _port_of(up), _port_of(doomed)
        doc = deployment(
            tmp_path / "requests.db",
            {"m": {"timeout": 2}, "k": {"timeout": 2}},
            [_node("n", ["m", "k"], [port_m, port_k])],
        )
        with DispatcherProcess.of(doc, tmp_path) as proc:
            base = proc.http

            async def main() -> None:
                async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                    ready = await _wait_status(http, f"{base}/readyz", 200)
                    assert ready["ready"] and ready["reasons"] == []
                    assert ready["models"]["m"]["devices"] == {"n/0": "reachable"}
                    doomed.proc.kill()  # every backend of m is gone
                    doomed.proc.communicate(timeout=TIMEOUT)  # reaped, pipes closed
                    down = await _wait_status(http, f"{base}/readyz", 503)
                    assert not down["ready"]
                    assert any(
                        r.startswith("model m: no reachable device") for r in down["reasons"]
                    )
                    assert down["models"]["k"]["ready"] and not down["models"]["m"]["ready"]
                    status, alive = await _get(http, f"{base}/healthz")
                    assert status == 200 and alive["ok"]
                    assert (await _get(http, f"{base}/readyz?model=k"))[0] == 200
                    assert (await _get(http, f"{base}/readyz?model=m"))[0] == 503
                    assert (await _get(http, f"{base}/readyz?model=nope"))[0] == 404
                    _status, stats = await _get(http, f"{base}/stats")
                    assert stats["ready"] is False
                    _status, text = await _get(http, f"{base}/metrics")
                    assert "\nwirekit_serve_ready 0.0\n" in text
                    # the backend comes back on its port: ready again
                    with CliServer(
                        "--listen", f"tcp://127.0.0.1:{port_m}", handler="serve_handlers:tag_fast"
                    ):
                        again = await _wait_status(http, f"{base}/readyz", 200)
                        assert again["models"]["m"]["devices"] == {"n/0": "reachable"}
                        status, alive = await _get(http, f"{base}/healthz")
                        assert status == 200

            run(main(), timeout=20 * TIMEOUT)


def _families(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def _histograms(family) -> dict[tuple, dict[str, Any]]:
    """labels (without ``le``) -> {"buckets": [(le, n)...], "count": n, "sum": s}."""
    out: dict[tuple, dict[str, Any]] = defaultdict(lambda: {"buckets": []})
    for s in family.samples:
        labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        if s.name.endswith("_bucket"):
            out[labels]["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_count"):
            out[labels]["count"] = s.value
        elif s.name.endswith("_sum"):
            out[labels]["sum"] = s.value
    return out


def _per_device(histograms: dict[tuple, dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """The request histograms of :func:`_histograms` summed over the ``door`` label: labels
    (device, model) -> {"buckets", "count"}."""
    out: dict[tuple, dict[str, Any]] = {}
    for labels, h in histograms.items():
        key = tuple((k, v) for k, v in labels if k != "door")
        total = out.setdefault(key, {"buckets": [(le, 0.0) for le, _ in h["buckets"]], "count": 0})
        total["buckets"] = [
            (le, a + b) for (le, a), (_, b) in zip(total["buckets"], h["buckets"], strict=True)
        ]
        total["count"] += h["count"]
    return out


def test_metrics_after_a_known_load_say_what_happened_and_stats_agree(tmp_path):
    n_ok_http, n_ok_mip, n_bad, n_slow, n_batch = 12, 40, 5, 3, 32
    with (
        CliServer(handler="serve_handlers:tag_fast") as fast,
        CliServer(handler="serve_handlers:tag_slow") as slow,
    ):
        nowhere = free_port()
        doc = deployment(
            tmp_path / "requests.db",
            {
                "ok": {"timeout": 5},
                "bad": {"timeout": 2},
                "slow": {"timeout": 0.05},  # the backend takes 0.2 s: every request times out
                "batch": {"timeout": 5, "max_batch": 8},
            },
            [
                _node("n", ["ok", "bad", "batch"], [_port_of(fast), nowhere, _port_of(fast)]),
                _node("s", ["slow"], [_port_of(slow)]),
            ],
            cache={"max_entries": 0},
        )
        with DispatcherProcess.of(doc, tmp_path) as proc:
            base = proc.http

            async def main() -> tuple[str, dict[str, Any]]:
                async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                    for k in range(n_ok_http):
                        async with http.post(
                            f"{base}/v1/models/ok:predict", json={"inputs": [[f"h{k}"]]}
                        ) as r:
                            assert r.status == 200
                    for model, n in (("bad", n_bad), ("slow", n_slow)):
                        for k in range(n):
                            async with http.post(
                                f"{base}/v1/models/{model}:predict", json={"inputs": [[f"x{k}"]]}
                            ) as r:
                                # nothing listens for "bad": 503; "slow" is too slow: 504
                                expected = 503 if model == "bad" else 504
                                assert r.status == expected, await r.text()
                    # the MIP lane (pipelined), and adaptive batching
                    for model, n in (("ok", n_ok_mip), ("batch", n_batch)):
                        async with AsyncClient(proc.mip_address(model), timeout=TIMEOUT) as c:
                            outs = await asyncio.gather(*(c.infer_one(f"q{k}") for k in range(n)))
                        assert [o[0].as_text() for o in outs] == [f"F:Q{k}" for k in range(n)]
                    _status, text = await _get(http, f"{base}/metrics")
                    status, stats = await _get(http, f"{base}/stats")
                    assert status == 200
                    return text, stats

            text, stats = run(main(), timeout=20 * TIMEOUT)

    fams = _families(text)
    expected = {
        "ok": {"ok": n_ok_http + n_ok_mip},
        "bad": {"failed": n_bad},
        "slow": {"failed": n_slow},
        "batch": {"ok": n_batch},
    }
    # requests by model and end state; the response-time histogram counts every one
    states: dict[str, Counter] = defaultdict(Counter)
    for s in fams["wirekit_serve_requests"].samples:
        states[s.labels["model"]][s.labels["state"]] += s.value
    assert {m: dict(c) for m, c in states.items()} == expected
    durations = _histograms(fams["wirekit_serve_request_duration_seconds"])
    counts: Counter = Counter()
    for labels, h in durations.items():
        counts[dict(labels)["model"]] += h["count"]
        les = [le for le, _ in h["buckets"]]
        assert les == [*DURATION_BUCKETS, float("inf")]
        values = [n for _, n in h["buckets"]]
        assert values == sorted(values) and values[-1] == h["count"]  # monotone, +Inf = count
    assert counts == {m: sum(c.values()) for m, c in expected.items()}
    # failed requests answered by no device; the others by their device; each counted on
    # the front door it came in by
    assert durations[(("device", "none"), ("door", "http"), ("model", "bad"))]["count"] == n_bad
    assert durations[(("device", "n/0"), ("door", "http"), ("model", "ok"))]["count"] == n_ok_http
    assert durations[(("device", "n/0"), ("door", "mip"), ("model", "ok"))]["count"] == n_ok_mip
    assert {dict(labels)["door"] for labels in durations} == {"http", "mip"}
    by_door: Counter = Counter()
    for s in fams["wirekit_serve_requests"].samples:
        by_door[s.labels["door"]] += s.value
    assert by_door == {"http": n_ok_http + n_bad + n_slow, "mip": n_ok_mip + n_batch}
    by_device = _per_device(durations)
    # the queue and backend split: every request sent is in the queue histogram once; the
    # slow model's backend time is its timeout at least
    queue = _histograms(fams["wirekit_serve_queue_duration_seconds"])
    assert queue[(("model", "ok"),)]["count"] == n_ok_http + n_ok_mip
    assert queue[(("model", "batch"),)]["count"] == n_batch
    assert queue[(("model", "slow"),)]["count"] == n_slow
    backend = _histograms(fams["wirekit_serve_backend_duration_seconds"])
    assert backend[(("device", "n/0"), ("model", "ok"))]["count"] == n_ok_http + n_ok_mip
    slow_backend = backend[(("device", "s/0"), ("model", "slow"))]
    assert slow_backend["count"] == n_slow and slow_backend["sum"] >= 0.05 * n_slow * 0.9
    assert backend[(("device", "n/0"), ("model", "bad"))]["count"] >= 1
    # counters of back-offs and batches
    backoffs = {
        (s.labels["model"], s.labels["device"]): s.value
        for s in fams["wirekit_serve_backoffs"].samples
    }
    assert backoffs[("bad", "n/0")] >= 1 and backoffs[("slow", "s/0")] == n_slow
    batches = {s.labels["model"]: s.value for s in fams["wirekit_serve_batches"].samples}
    assert batches["batch"] >= 1
    lane = {s.labels["model"]: s.value for s in fams["wirekit_serve_lane_requests"].samples}
    assert lane["ok"] >= 1  # the MIP lane took the pipelined requests of "ok"
    in_flight = {
        (s.labels["model"], s.labels["device"]): s.value
        for s in fams["wirekit_serve_in_flight"].samples
    }
    assert in_flight[("ok", "n/0")] == 0
    queue_length = {s.labels["model"]: s.value for s in fams["wirekit_serve_queue_length"].samples}
    assert queue_length == {"ok": 0, "bad": 0, "slow": 0, "batch": 0}

    # /stats says the same per model and device
    for model, figures in stats["models"].items():
        devices = figures["devices"]
        for device, d in devices.items():
            labels = (("device", device), ("model", model))
            if labels not in by_device:  # a device with requests in flight only (none here)
                assert (d["requests"], d["states"], d["in_flight"]) == (0, {}, 0)
                assert d["latency"] == {"p50": None, "p95": None, "p99": None}
                continue
            assert d["requests"] == by_device[labels]["count"]
            per_state: Counter = Counter()
            for s in fams["wirekit_serve_requests"].samples:  # every door's
                if (s.labels["model"], s.labels["device"]) == (model, device):
                    per_state[s.labels["state"]] += s.value
            assert d["states"] == per_state
            counts_of = [
                int(b - a)
                for (_, a), (_, b) in zip(
                    [(0, 0.0), *by_device[labels]["buckets"][:-1]],
                    by_device[labels]["buckets"],
                    strict=True,
                )
            ]
            # the window (a minute) covers the whole run: the same quantiles
            assert d["latency"]["p95"] == quantile(0.95, counts_of)
        assert sum(d["requests"] for d in devices.values()) == sum(expected[model].values())
    # "bad" has no backend listening: not ready, in both
    assert stats["ready"] is False and "\nwirekit_serve_ready 0.0\n" in text
    assert stats["models"]["ok"]["rate"] > 0
    assert stats["models"]["ok"]["latency"]["p50"] is not None
    assert {(q["node"], q["device"], q["model"]) for q in stats["quotas"]} >= {("s", 0, "slow")}


def test_every_exported_name_follows_the_prometheus_rules(tmp_path):
    """Every family ``/metrics`` exports is in the table (type and labels as listed);
    ``_total`` only on counters; durations in seconds, sizes in bytes; no family of the
    table is missing from a dispatcher with a cache and a controller."""
    with CliServer(handler="serve_handlers:tag_fast") as fast:
        doc = deployment(
            tmp_path / "requests.db",
            {"m": {"timeout": 5, "target": 1.0}},
            [_node("n", ["m"], [_port_of(fast)])],
            controller={"period": 0.2, "window": 5, "actuator": {"kind": "log"}},
        )
        with DispatcherProcess.of(doc, tmp_path) as proc:

            async def main() -> str:
                async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                    for k in range(3):
                        async with http.post(
                            f"{proc.http}/v1/models/m:predict", json={"inputs": [["same"]]}
                        ) as r:
                            assert r.status == 200, k
                    return (await _get(http, f"{proc.http}/metrics"))[1]

            text = run(main(), timeout=10 * TIMEOUT)
    exported = {}
    standard = ("process_", "python_")  # prometheus_client's collectors: their own names
    families = _families(text).values()
    assert {f.name for f in families if f.name.startswith(standard)} >= {
        "process_resident_memory_bytes",
        "process_cpu_seconds",
        "process_open_fds",
        "python_info",
        "python_gc_objects_collected",
    }
    for family in families:
        if family.name.startswith(standard):
            continue
        for s in family.samples:
            exported.setdefault(family.name, (family.type, set()))[1].add(s.name)
            labels = set(s.labels) - {"le"}
            name = family.name + ("_total" if family.type == "counter" else "")
            assert name in METRIC_NAMES, name
            assert labels == set(METRIC_NAMES[name][1]), (name, labels)
    for family_name, (kind, samples) in exported.items():
        name = family_name + ("_total" if kind == "counter" else "")
        assert METRIC_NAMES[name][0] == kind, name
        for sample in samples:
            assert sample.endswith("_total") == (kind == "counter"), sample
        if any(word in name for word in ("duration", "time", "latency")):
            assert name.endswith("_seconds"), name
        if "size" in name or "bytes" in name:
            assert name.endswith("_bytes"), name
        assert not any(unit in name for unit in ("_ms", "_us", "milli", "micro", "_kb")), name
    # a cache and a controller: every series of the table is there (decisions may not be
    # yet: the controller has nothing to decide; batching is off)
    missing = set(METRIC_NAMES) - {
        family_name + ("_total" if kind == "counter" else "")
        for family_name, (kind, _) in exported.items()
    }
    assert missing <= {
        "wirekit_serve_controller_decisions_total",
        "wirekit_serve_batches_total",
        "wirekit_serve_batch_retries_total",
        "wirekit_serve_backoffs_total",
    }, missing
