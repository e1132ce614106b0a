"""The live page of ``wirekit serve`` (``GET /``, :mod:`wirekit.serve.doors.page`), in a real
headless Chromium (Debian's ``chromium``, driven over the DevTools protocol:
``tests/browser_support.py``) against a real ``wirekit serve`` subprocess with real backend
processes, under load, with a controller moving quotas and a model added and removed
through the admin API while the page watches.

The page must load with no console error, exception or Content-Security-Policy violation,
show every model of the deployment (a name full of HTML characters as text), show the
numbers ``/stats`` and ``/controller`` give, put the controller's decisions and the models
added and removed on its timeline -- and leave ``/healthz``, ``/metrics`` and the admin API
as they were.  The headers (CSP, nosniff, no CORS) and the static files' routes are checked
without a browser."""

from __future__ import annotations

import asyncio
import http.client
import json
import re

import aiohttp
from browser_support import Browser, require_chromium
from serve_support import TIMEOUT, BackendProcess, DispatcherProcess, deployment

from wirekit.serve.doors import page

#: a model name made of HTML: the page must show it as text, never as markup
ODD = "<em>odd&amp;"
#: seconds between two polls of the page in these tests
POLL = 0.3
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=TIMEOUT)


def http_get(port: int, path: str, headers: dict[str, str] | None = None, method: str = "GET"):
    """One request to 127.0.0.1:``port``: status, headers, body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


# ---- the files and their headers, without a browser --------------------------------------


def test_page_files_are_shipped_and_only_local():
    """Every file the page loads is one the module serves, shipped in the package; the
    HTML loads no script or style but its own files (nothing inline, nothing remote)."""
    html = page.static_file(page.INDEX).decode()
    loaded = set(re.findall(r'(?:src|href)="(/static/[^"]+)"', html))
    assert loaded == {f"/static/{name}" for name in page.STATIC_FILES}
    for name in page.STATIC_FILES:
        assert page.static_file(name)
    assert "<script>" not in html and "style=" not in html and "<style" not in html
    assert not re.search(r'(?:src|href)="(?:https?:)?//', html)


def test_page_headers_and_routes(tmp_path):
    """``GET /`` and its files carry the CSP, nosniff and no CORS header (not even to a
    foreign Origin or a preflight); an unknown file or a path out of the folder is 404;
    the other routes answer as before."""
    doc = deployment(
        tmp_path / "r.db",
        {"m1": {"timeout": 5}},
        [{"id": "n1", "devices": ["CPU"], "models": ["m1"], "quotas": [1], "ports": [9]}],
    )
    with DispatcherProcess.of(doc, tmp_path) as dispatcher:
        port = dispatcher.addresses["http"]
        for path, kind in [
            ("/", "text/html"),
            ("/static/page.js", "text/javascript"),
            ("/static/page.css", "text/css"),
            ("/static/favicon.svg", "image/svg+xml"),
        ]:
            status, headers, body = http_get(port, path, {"Origin": "http://evil.example"})
            assert status == 200, path
            assert headers["Content-Type"].startswith(kind)
            assert headers["Content-Security-Policy"] == page.CONTENT_SECURITY_POLICY
            assert "script-src 'self'" in headers["Content-Security-Policy"]
            assert "unsafe" not in headers["Content-Security-Policy"]
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert not [h for h in headers if h.lower().startswith("access-control-")]
            assert body
        status, headers, _ = http_get(
            port,
            "/",
            {"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"},
            method="OPTIONS",
        )
        assert status == 405
        assert not [h for h in headers if h.lower().startswith("access-control-")]
        for path in ["/static/nope.js", "/static/..%2Fhttp.py", "/static/%2e%2e%2fpage.py"]:
            status, headers, body = http_get(port, path)
            assert status == 404, path
            assert b"import" not in body
        assert http_get(port, "/", method="POST")[0] == 405
        assert http_get(port, "/", method="HEAD")[0] == 200
        assert http_get(port, "/healthz")[0] == 200
        status, _, body = http_get(port, "/readyz")  # its one backend is not there: 503
        assert (status, json.loads(body)["ready"]) == (503, False)
        assert http_get(port, "/metrics")[0] == 200
        assert json.loads(http_get(port, "/stats")[2])["models"].keys() == {"m1"}
        assert http_get(port, "/admin/models")[0] == 401
        admin = {"Authorization": f"Bearer {dispatcher.admin_token}"}
        assert http_get(port, "/admin/models", admin)[0] == 200


# ---- the page in Chromium -----------------------------------------------------------------

#: the page's view of its model cards: name -> figures, states, devices (quota, requests)
CARDS = """
Object.fromEntries([...document.querySelectorAll("article[data-model]")].map((card) => [
  card.dataset.model,
  {
    name: card.querySelector("[data-field=name]").textContent,
    requests: card.querySelector(".figures [data-field=requests]").dataset.value,
    states: card.querySelector("[data-field=states]").textContent,
    markers: card.querySelectorAll(".marker").length,
    removed: card.dataset.removed === "true",
    devices: Object.fromEntries([...card.querySelectorAll("tr[data-device]")].map((tr) => [
      tr.dataset.device, [tr.querySelector("[data-field=quota]").textContent,
        tr.querySelector("[data-field=requests]").dataset.value]])),
  },
]))
"""
#: the page's timeline: one entry per row
EVENTS = """
[...document.querySelectorAll("#events tbody tr")].map((tr) => ({
  kind: tr.dataset.kind, model: tr.dataset.model, row: tr.dataset.row,
  old: tr.dataset.old, new: tr.dataset.new,
}))
"""
POLLS = "Number(document.body.dataset.polls || 0)"


def states_text(statuses: dict[str, int]) -> str:
    """How the page writes end states (``ok 1,234 · timeout 2``)."""
    shown = [f"{k} {n:,}" for k, n in statuses.items() if n > 0]
    return " · ".join(shown) if shown else "–"


def quota_text(quota: float) -> str:
    """How the page writes a quota (at most 3 decimals, no trailing zeros)."""
    return f"{round(quota, 3):g}"


def devices_shown(stats: dict, model: str) -> dict[str, list[str]]:
    """The device table the page should show for ``model``: per ``node/device``, its quota
    and the requests it finished (empty when it finished none)."""
    devices = stats["models"][model]["devices"]
    out = {
        f"{q['node']}/{q['device']}": [quota_text(q["quota"]), ""]
        for q in stats["quotas"]
        if q["model"] == model
    }
    for key, figures in devices.items():
        out.setdefault(key, ["–", ""])[1] = str(figures["requests"])
    return out


def expected_of(stats: dict) -> dict:
    """The figures of ``/stats`` that stay put once the load has stopped (the rates and
    percentiles are over a sliding window: they move on)."""
    return {
        model: (s["requests"], s["statuses"], devices_shown(stats, model))
        for model, s in stats["models"].items()
    } | {"quotas": stats["quotas"]}


async def get_json(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(url) as resp:
        assert resp.status == 200, url
        return await resp.json()


async def load(http: aiohttp.ClientSession, base: str, model: str, count: int, workers: int):
    """``count`` predictions of ``model`` over HTTP from ``workers`` concurrent clients;
    every one answered."""

    async def worker(index: int) -> None:
        for i in range(index, count, workers):
            async with http.post(
                f"{base}/v1/models/{model}:predict", json={"inputs": [[f"x{i}"]]}
            ) as resp:
                assert resp.status == 200, await resp.text()

    await asyncio.gather(*(worker(w) for w in range(workers)))


async def next_poll(tab: Browser) -> None:
    """Wait until the page has polled twice more (a poll begun after now has ended)."""
    polls = await tab.evaluate(POLLS)
    await tab.wait_for(f"{POLLS} >= {polls + 2}")


async def page_matches_stats(tab: Browser, http: aiohttp.ClientSession, base: str) -> dict:
    """Compare the page's cards with ``/stats`` read around the page's poll, until they
    agree (the figures may move between a poll and the read; they settle once the load has
    stopped); the last comparison's figures."""
    shown: dict = {}
    expected: dict = {}
    for _ in range(20):
        before = await get_json(http, f"{base}/stats")
        await next_poll(tab)
        cards = await tab.evaluate(CARDS)
        after = await get_json(http, f"{base}/stats")
        if expected_of(before) == expected_of(after):
            expected = {
                model: {
                    "name": model,
                    "requests": str(s["requests"]),
                    "states": states_text(s["statuses"]),
                    "devices": devices_shown(after, model),
                    "removed": not any(q["model"] == model for q in after["quotas"]),
                }
                for model, s in after["models"].items()
            }
            shown = {
                m: {k: c[k] for k in ("name", "requests", "states", "devices", "removed")}
                for m, c in cards.items()
            }
            if shown == expected:
                return cards
        await asyncio.sleep(POLL)
    assert shown == expected  # the last look, with the difference shown
    return cards


def test_live_page_in_chromium(tmp_path):
    binary = require_chromium()
    with (
        BackendProcess("serve_handlers:tag_a") as a,
        BackendProcess("serve_handlers:tag_b") as b,
        BackendProcess("serve_handlers:tag_fast") as c,
    ):
        doc = deployment(
            tmp_path / "r.db",
            {"m1": {"timeout": 5}, ODD: {"timeout": 5}},
            [
                {
                    "id": "n1",
                    "devices": ["CPU", "CPU"],
                    "models": ["m1", ODD],
                    "quotas": [0.5, 0.5, 1, 0],
                    "ports": [a.port, b.port, a.port, None],
                }
            ],
            controller={
                "period": 0.5,
                "window": 3.0,
                # m1 is always over its target: the controller gives it share on n1/0,
                # taken from ODD (far under its own)
                "targets": {"m1": 0.00001, ODD: 30.0},
                "cooldown": 0.5,
                "stabilization": 0.5,
                "min_requests": 3,
                "actuator": {"kind": "log"},
            },
        )
        with DispatcherProcess.of(doc, tmp_path) as dispatcher:
            result = asyncio.run(
                asyncio.wait_for(scenario(binary, dispatcher, c.port), timeout=150)
            )
    problems, cards, events, decisions = result
    assert problems == []
    assert set(cards) == {"m1", ODD, "m3"}
    assert [m for m, card in cards.items() if card["removed"]] == ["m3"]
    assert cards[ODD]["name"] == ODD  # text, not markup
    # the controller decided, and the page shows each decision it made on the timeline and
    # as a marker on the model's chart
    applied = [d for d in decisions if d["status"] == "applied" and d["kind"] == "quota"]
    assert applied, "the controller made no decision: the test proves nothing"
    shown = {(e["row"], float(e["old"]), float(e["new"])) for e in events if e["old"]}
    for d in applied:
        assert (f"{d['node']}/{d['device']}/{d['model']}", d["old"], d["new"]) in shown
    assert cards["m1"]["markers"] >= 1
    kinds = [(e["kind"], e["model"]) for e in events]
    assert ("model added", "m3") in kinds and ("model removed", "m3") in kinds


async def scenario(binary: str, dispatcher: DispatcherProcess, m3_port: int):
    base = dispatcher.http
    admin = dispatcher.admin_headers
    async with (
        aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http,
        Browser(binary, width=1200) as tab,
    ):
        await tab.open(f"{base}/?poll={POLL}")
        await tab.wait_for(f"{POLLS} >= 2")
        cards = await tab.evaluate(CARDS)
        assert set(cards) == {"m1", ODD}  # before any request: every model of the config
        assert await tab.evaluate("document.querySelectorAll('em').length") == 0

        # load on both models; meanwhile a model is added, called, then removed
        loading = asyncio.gather(load(http, base, "m1", 400, 4), load(http, base, ODD, 200, 2))
        added = {
            "models": {"m3": {"timeout": 5, "port": None}},
            "nodes": [
                {
                    "id": "n2",
                    "endpoint": "127.0.0.1",
                    "devices": ["CPU"],
                    "models": ["m3"],
                    "quotas": [1],
                    "ports": [m3_port],
                }
            ],
        }
        async with http.post(f"{base}/admin/models", json=added, headers=admin) as resp:
            assert resp.status == 201, await resp.text()
        await tab.wait_for("document.querySelector('article[data-model=m3]') !== null")
        await load(http, base, "m3", 20, 2)
        async with http.delete(f"{base}/admin/models/m3", headers=admin) as resp:
            assert resp.status == 200, await resp.text()
        # still in /stats (its requests happened), shown as removed
        await tab.wait_for(
            "document.querySelector('article[data-model=m3][data-removed]') !== null"
        )
        await loading

        # the load has stopped: the page's figures are /stats' own
        cards = await page_matches_stats(tab, http, base)
        # every decision /controller reports is on the page's timeline
        ctl = await get_json(http, f"{base}/controller")
        await next_poll(tab)
        shown = await tab.evaluate(f"({EVENTS}).length")
        assert shown <= 12  # the newest only, until "show all" is pressed
        if await tab.evaluate("!document.getElementById('more-events').hidden"):
            await tab.evaluate("document.getElementById('more-events').click()")
        events = await tab.evaluate(EVENTS)
        # the page did not take any door away
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(f"{base}/metrics") as resp:
            assert resp.status == 200
            assert "wirekit_serve" in await resp.text()
        async with http.get(f"{base}/admin/models", headers=admin) as resp:
            assert resp.status == 200
        return tab.problems(), cards, events, ctl["decisions"]


def test_browser_support_reports_a_csp_violation(tmp_path):
    """The browser helper does see what the page test asserts is absent: a page whose
    inline script the CSP blocks, and one that throws, are reported."""
    binary = require_chromium()
    from aiohttp import web

    async def bad(_request: web.Request) -> web.Response:
        return web.Response(
            text="<!doctype html><script>console.log('inline')</script>"
            "<script src='/throw.js'></script>",
            content_type="text/html",
            headers={"Content-Security-Policy": page.CONTENT_SECURITY_POLICY},
        )

    async def throw(_request: web.Request) -> web.Response:
        return web.Response(text="null.x;", content_type="text/javascript")

    async def main() -> list[str]:
        app = web.Application()
        app.router.add_get("/", bad)
        app.router.add_get("/throw.js", throw)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with Browser(binary) as tab:
                await tab.open(f"http://127.0.0.1:{port}/")
                await asyncio.sleep(0.5)
                return tab.problems()
        finally:
            await runner.cleanup()

    problems = asyncio.run(asyncio.wait_for(main(), timeout=60))
    assert any("Content Security Policy" in p for p in problems), problems
    assert any(p.startswith("exception:") for p in problems), problems
