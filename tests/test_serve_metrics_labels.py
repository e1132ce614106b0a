"""Metrics an operator can join (issue 38, item 7), through a real ``wirekit serve`` process on
each event loop, on the twin the run uses (``WIREKIT_PURE=1``: the pure one):

* every series that names a device names it the one way -- ``device="<node>/<index>"``, or
  ``"cache"`` (answered from the response cache) or ``"none"`` (no device answered) -- never
  ``node=`` and never ``device=""``; the quota gauge too;
* an answer from the cache counts under ``device="cache"`` (the general path's and the MIP
  lane's, compiled or pure), a failure under ``device="none"``; ``/stats`` uses the same keys;
* after ``wirekit serve models remove X`` no series has ``model="X"``, and X added again
  starts from 0;
* the standard ``process_*`` / ``python_*`` families and ``wirekit_build_info`` are there.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from browser_support import Browser, require_chromium
from serve_support import TIMEOUT, BackendProcess, DispatcherProcess, deployment, run
from support.loops import LOOPS
from support.ports import free_port

from wirekit import __version__
from wirekit._impl import pure_requested
from wirekit.cli import main as wirekit_main
from wirekit.mip.client import AsyncClient
from wirekit.serve.control.metrics import HistogramHistory, Metrics

TOKEN = "labels-test-token"
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=TIMEOUT)
#: a device label: ``node/index``, or one of the two named values
DEVICE = re.compile(r"^[^/\"]+/\d+$|^cache$|^none$")
#: one sample line of the exposition: name, labels, value
SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of an exposition: ``(name, labels, value)``."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = SAMPLE.match(line)
        assert found, line
        name, labels, value = found.groups()
        out.append((name, dict(LABEL.findall(labels or "")), float(value)))
    return out


def requests_total(text: str, **labels: str) -> float:
    """``wirekit_serve_requests_total`` summed over the series matching ``labels``."""
    return sum(
        value
        for name, have, value in samples(text)
        if name == "wirekit_serve_requests_total"
        and all(have.get(k) == v for k, v in labels.items())
    )


def models_cli(*argv: str) -> tuple[int, str, str]:
    """``wirekit serve models ARGV`` in this process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    status = wirekit_main(
        ["serve", "models", *argv, *(["--json"] if argv[0] != "list" else [])], out, err
    )
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module", params=LOOPS)
def served(request, tmp_path_factory) -> Iterator[tuple[DispatcherProcess, int, str]]:
    """``wirekit serve`` on one loop: ``m`` and ``gone`` share n1's CPU (one backend), the
    cache on; ``broken`` on n2, where nothing listens (every request fails).  Yields the
    dispatcher, the backend's port and the loop."""
    tmp_path: Path = tmp_path_factory.mktemp(f"labels-{request.param}")
    with BackendProcess("serve_handlers:tag_fast") as backend:
        doc = deployment(
            tmp_path / "r.db",
            {"m": {"timeout": 5}, "gone": {"timeout": 5}, "broken": {"timeout": 1, "attempts": 1}},
            [
                {
                    "id": "n1",
                    "devices": ["CPU"],
                    "models": ["m", "gone"],
                    "quotas": [0.5, 0.5],
                    "ports": [backend.port, backend.port],
                },
                {
                    "id": "n2",
                    "devices": ["CPU"],
                    "models": ["broken"],
                    "quotas": [1],
                    "ports": [free_port()],
                },
            ],
            admin={"token": TOKEN},
            cache={"max_entries": 64, "ttl": 300},
        )
        with DispatcherProcess.of(doc, tmp_path, env={"WIREKIT_LOOP": request.param}) as proc:
            yield proc, backend.port, request.param


async def _predict(http: aiohttp.ClientSession, base: str, model: str, value: str) -> int:
    async with http.post(f"{base}/v1/models/{model}:predict", json={"inputs": [[value]]}) as r:
        await r.read()
        return r.status


async def _get(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as r:
        assert r.status == 200, url
        return json.loads(await r.read()) if url.endswith("/stats") else await r.text()


def test_one_device_labelling_cache_and_none_and_the_process(served):
    proc, _port, _loop = served
    base = proc.http

    async def main() -> tuple[str, dict]:
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
            # the general path: a miss, then the same input from the cache
            assert [await _predict(http, base, "m", "same") for _ in range(2)] == [200, 200]
            # the MIP lane: a miss, then the same input from the cache (one by one, so the
            # second finds the first's answer)
            async with AsyncClient(proc.mip_address("m"), timeout=TIMEOUT) as client:
                for _ in range(2):
                    (out,) = await client.infer_one("lane")
                    assert out.as_text() == "F:LANE"
            # nothing listens for broken: it fails, answered by no device
            assert await _predict(http, base, "broken", "x") == 503
            return await _get(http, f"{base}/metrics"), await _get(http, f"{base}/stats")

    text, stats = run(main(), timeout=10 * TIMEOUT)
    found = samples(text)
    devices = {labels["device"] for _, labels, _ in found if "device" in labels}
    assert devices >= {"n1/0", "cache", "none"}, devices
    for name, labels, _ in found:
        assert "node" not in labels, (name, labels)
        if "device" in labels:
            assert DEVICE.match(labels["device"]), (name, labels)
    assert 'device=""' not in text
    # one answer from the cache per path, each under device="cache"
    assert requests_total(text, model="m", device="cache", door="http", state="ok") == 1
    assert requests_total(text, model="m", device="cache", door="mip", state="ok") == 1
    assert requests_total(text, model="m", device="n1/0", state="ok") == 2
    # the failure under device="none", nowhere else
    assert requests_total(text, model="broken", device="none", state="failed") == 1
    assert requests_total(text, model="broken") == 1
    # the quota gauge joins the others on (model, device)
    quotas = {
        (labels["model"], labels["device"]): value
        for name, labels, value in found
        if name == "wirekit_serve_quota"
    }
    assert quotas == {("m", "n1/0"): 0.5, ("gone", "n1/0"): 0.5, ("broken", "n2/0"): 1.0}
    # /stats names the devices the same way
    assert set(stats["models"]["m"]["devices"]) == {"n1/0", "cache"}
    broken = stats["models"]["broken"]["devices"]  # n2/0 was tried (its backend time)
    assert broken["none"]["states"] == {"failed": 1}
    assert broken.get("n2/0", {"requests": 0})["requests"] == 0
    # the process, and what is running
    names = {name for name, _, _ in found}
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_start_time_seconds",
        "python_info",
    ):
        assert name in names, name
    (info,) = [(labels, value) for name, labels, value in found if name == "wirekit_build_info"]
    compiled = "false" if pure_requested() else "true"
    assert info == ({"version": __version__, "python": info[0]["python"], "compiled": compiled}, 1)
    assert re.match(r"^3\.\d+\.\d+", info[0]["python"])


def test_a_removed_models_series_are_dropped(served):
    proc, port, _loop = served
    base = proc.http
    url = ["--url", base, "--token", TOKEN]

    async def main() -> tuple[str, str, str]:
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
            assert await _predict(http, base, "gone", "before") == 200
            assert await _predict(http, base, "gone", "before") == 200  # from the cache
            before = await _get(http, f"{base}/metrics")
            status, _out, err = models_cli("remove", "gone", *url)
            assert status == 0, err
            removed = await _get(http, f"{base}/metrics")
            status, _out, err = models_cli(
                "add", "--name", "gone", "--place", f"n1:0:0.5:{port}", *url
            )
            assert status == 0, err
            assert await _predict(http, base, "gone", "after") == 200
            again = await _get(http, f"{base}/metrics")
            return before, removed, again

    before, removed, again = run(main(), timeout=10 * TIMEOUT)
    gone = [(n, labels) for n, labels, _ in samples(before) if labels.get("model") == "gone"]
    assert {n for n, _ in gone} >= {
        "wirekit_serve_requests_total",
        "wirekit_serve_request_duration_seconds_bucket",
        "wirekit_serve_backend_duration_seconds_count",
        "wirekit_serve_queue_length",
        "wirekit_serve_quota",
        "wirekit_serve_in_flight",
        "wirekit_serve_cache_hits_total",
        "wirekit_serve_resubmissions_total",
    }, gone
    left = [(n, labels) for n, labels, _ in samples(removed) if labels.get("model") == "gone"]
    assert left == []
    assert requests_total(removed, model="m") >= 1  # the others stay
    # added again: its series start from 0 (one request since)
    assert requests_total(again, model="gone") == 1
    assert requests_total(again, model="gone", device="n1/0", state="ok") == 1


#: per device row of a model's card on the live page: its key, the text shown, its class
DEVICE_ROWS = """
Object.fromEntries([...document.querySelectorAll("article[data-model]")].map((card) => [
  card.dataset.model,
  [...card.querySelectorAll("tr[data-device]")].map((tr) => [
    tr.dataset.device, tr.querySelector("td").textContent, tr.className]),
]))
"""


def test_the_page_labels_a_failure_as_a_failure(served):
    """The live page shows the requests no device answered as not answered (in the failure
    colour), those from the cache as the cache's -- not "none (cache)" for both.  Once, on
    the asyncio loop's dispatcher (the page does not depend on the loop)."""
    proc, _port, loop = served
    if loop != "asyncio":
        pytest.skip("the page is the same on every loop")
    binary = require_chromium()

    async def main() -> tuple[dict, list[str]]:
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
            assert await _predict(http, proc.http, "broken", "page") == 503
            assert [await _predict(http, proc.http, "m", "page") for _ in range(2)] == [200, 200]
        async with Browser(binary) as tab:
            await tab.open(f"{proc.http}/?poll=0.3")
            await tab.wait_for(
                "Boolean(document.querySelector('article[data-model=broken] tr[data-device=none]')"
                " && document.querySelector('article[data-model=m] tr[data-device=cache]'))"
            )
            return await tab.evaluate(DEVICE_ROWS), tab.problems()

    rows, problems = run(main(), timeout=10 * TIMEOUT)
    assert problems == []
    broken = {key: (text, cls) for key, text, cls in rows["broken"]}
    assert broken["none"] == ("none: not answered (failed, abandoned or lost)", "failure")
    m = {key: (text, cls) for key, text, cls in rows["m"]}
    assert m["cache"] == ("cache: answered from the response cache", "")
    assert m["n1/0"] == ("n1/0", "")
    assert not any("(cache)" in text for card in rows.values() for _, text, _ in card)


def test_forget_hides_a_late_end_and_served_starts_from_zero():
    """:meth:`Metrics.forget` drops every series of the model, a request of it ending after
    the removal is not exported, and the model added again starts from 0 (its recent
    histogram window too); ``/stats``' per-model figures stay."""
    metrics = Metrics(["a", "b"])
    history = HistogramHistory(metrics, interval=0.0)
    for model in ("a", "b"):
        metrics.arrived(model)
        metrics.finished(model, "ok", 0.01, f"n1/0/{model}")
    metrics.arrived("a")
    metrics.lane_answered("a", 1.0, [("x", "cache", 0.5)], 0.5, 0.5, 0.5)
    history.take()
    metrics.forget("a")
    history.forget("a")
    metrics.arrived("a")
    metrics.finished("a", "failed", 0.5, None)  # cut short by the drain's end
    text = metrics.prometheus({"backoffs": {("a", "n1/0"): 1}, "decisions": {("a", "x"): 1}})
    assert 'model="a"' not in text.decode()
    assert 'model="b"' in text.decode()
    assert metrics.snapshot()["models"]["a"]["statuses"] == {"ok": 2, "failed": 1}
    metrics.served("a")
    assert metrics.removed == set()
    metrics.arrived("a")
    metrics.finished("a", "ok", 0.01, "n1/0/a")
    again = [line for line in metrics.prometheus().decode().splitlines() if 'model="a"' in line]
    assert [line for line in again if line.startswith("wirekit_serve_requests_total")] == [
        'wirekit_serve_requests_total{device="n1/0",door="http",model="a",state="ok"} 1.0'
    ]
    _seconds, window = history.window()
    assert sum(window[("a", "n1/0")]) == 1 and min(window[("a", "n1/0")]) >= 0
