"""The Prometheus rules and the Grafana dashboard of ``deploy/``, proven against real data.

``promtool`` checks the rule file and the sample Prometheus config; the dashboard is checked
against Grafana's dashboard JSON model (no Grafana needed).  Then a real Prometheus (Debian's
``prometheus`` binary, on loopback, its storage in a temporary directory) loads the very rule
file -- only its ``for:`` durations shortened -- and scrapes a real ``wirekit serve``
subprocess every second, under load from this test, plus a replica that is down.  The
deployment has a model answered in about 0.2 s with a 50 ms response-time target (``slow``),
a fast one with a 1 s target (``fast``) and one whose backends refuse every connection
(``broken``): every rule's expression and every dashboard query (its variables substituted as
Grafana would) must return data, and each alert fire -- the over-target alert for ``slow``
and never for ``fast``.

Needs ``/usr/bin/prometheus`` and ``promtool`` (``scripts/test.sh`` installs Debian's
``prometheus`` package): without them these tests skip, or fail when ``CI`` is set.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import random
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serve_support import ROOT, TIMEOUT, BackendProcess, DispatcherProcess, deployment
from support.ports import free_port
from support.process import terminate

RULES = ROOT / "deploy" / "prometheus" / "wirekit-serve-rules.yml"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "wirekit-serve-dashboard.json"
IN_CI = os.environ.get("CI", "").lower() == "true"

#: what the test waits, at most, for every query to have data and every alert to fire
DEADLINE = 60.0
#: the ``for:`` of every alert in the test's copy of the rules
ALERT_FOR = "2s"
#: what ``$__rate_interval`` stands for in the dashboard's queries (Grafana computes it from
#: the scrape interval, 1 s here, and the panel's width)
RATE_INTERVAL = "20s"
SLOW_TARGET = 0.05  # seconds; tag_slow answers in 0.2 s
FAST_TARGET = 1.0  # seconds; tag_fast answers at once
ALERTS = {
    "WirekitServeModelOverTarget",
    "WirekitServeErrorRatioHigh",
    "WirekitServeNotReady",
    "WirekitServeReplicaDown",
    "WirekitServeDeviceBackedOff",
}


def _tool(name: str) -> str:
    """The path of ``name`` (``prometheus``, ``promtool``); skips without it, or fails
    under CI."""
    path = shutil.which(name) or (
        f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None
    )
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is needed under CI: scripts/test.sh installs Debian's prometheus")
        pytest.skip(f"{name} is not installed (Debian's prometheus package)")
    return path


# --- static checks ---------------------------------------------------------------------------


def test_promtool_checks_the_rules_and_the_sample_config():
    promtool = _tool("promtool")
    out = subprocess.run(
        [promtool, "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 3,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    out = subprocess.run(
        [promtool, "check", "config", PROMETHEUS_CONFIG.name],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 3,
        cwd=PROMETHEUS_CONFIG.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 rule files found" in out.stdout  # it loads the rules beside it


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", ())


def test_the_dashboard_follows_grafanas_json_model():
    dashboard = json.loads(DASHBOARD.read_text())
    for key in ("title", "uid", "schemaVersion", "panels", "templating", "time", "annotations"):
        assert key in dashboard, key
    assert dashboard["id"] is None  # Grafana gives one on import
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    queried = [p for p in _panels(dashboard) if p["type"] != "row"]
    assert len(queried) >= 10
    for panel in queried:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        # every panel and query goes through the datasource variable, none is hard-wired
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            for name in re.findall(r"\$(?!__)\{?(\w+)", target["expr"]):
                assert name in variables, (panel["title"], name)
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}"
    titles = " / ".join(p["title"] for p in queried).lower()
    for subject in ("requests", "errors", "p95", "device", "queue vs backend", "in flight"):
        assert subject in titles
    for subject in ("quota", "controller decisions", "cache hit"):
        assert subject in titles


# --- against a real Prometheus -----------------------------------------------------------------


@contextlib.contextmanager
def _refusing_ports(n: int) -> Iterator[list[int]]:
    """``n`` loopback ports bound but not listening (a connection is refused at once), held
    so that nothing else takes them while the test runs."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        yield [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _test_rules(path: Path) -> Path:
    """A copy of the rule file with every alert's ``for:`` shortened to :data:`ALERT_FOR`
    (nothing else changed)."""
    text, count = re.subn(r"(?m)^(\s+)for: \S+$", rf"\g<1>for: {ALERT_FOR}", RULES.read_text())
    assert count == len(ALERTS), "one for: per alert"
    path.write_text(text)
    return path


class Prometheus:
    """``prometheus`` on loopback with a generated config, its storage in ``directory``."""

    def __init__(self, binary: str, directory: Path, targets: list[str], rules: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.config = directory / "prometheus.yml"
        # YAML is a superset of JSON: the config is written as JSON
        self.config.write_text(
            json.dumps(
                {
                    "global": {
                        "scrape_interval": "1s",
                        "scrape_timeout": "1s",
                        "evaluation_interval": "1s",
                    },
                    "rule_files": [str(rules)],
                    "scrape_configs": [
                        {"job_name": "wirekit-serve", "static_configs": [{"targets": targets}]}
                    ],
                }
            )
        )
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log = directory / "prometheus.log"

    def __enter__(self) -> Prometheus:
        for _attempt in range(3):  # a free port taken between the probe and the bind: again
            self.port = free_port()
            with self.log.open("wb") as log:
                self.proc = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={self.config}",
                        f"--storage.tsdb.path={self.directory / 'data'}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            until = time.monotonic() + TIMEOUT * 3
            while self.proc.poll() is None and time.monotonic() < until:
                with contextlib.suppress(OSError):
                    if self.get("/-/ready", raw=True) == 200:
                        return self
                time.sleep(0.1)
            terminate(self.proc)
            if "address already in use" not in self.log.read_text():
                break
        raise AssertionError(f"prometheus did not start: {self.log.read_text()[-2000:]}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            terminate(self.proc)

    def get(self, path: str, raw: bool = False, **params: str) -> Any:
        """``GET path?params`` of the HTTP API: the ``data`` of its answer (``raw``: only
        the status code)."""
        query = urllib.parse.urlencode(params)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        try:
            conn.request("GET", f"{path}?{query}" if query else path)
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        if raw:
            return response.status
        answer = json.loads(body)
        assert answer.get("status") == "success", (path, params, answer)
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now."""
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return data["result"]


def _has_data(result: list[dict[str, Any]]) -> bool:
    """At least one series, with a number (not NaN: a quantile of no requests)."""
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


class Load:
    """Threads sending predictions over HTTP keep-alive connections until stopped: ``slow``
    (three at a time, new inputs: never from the cache, and they push entries out of it),
    ``fast`` (24 inputs drawn at random: hits and misses) and ``broken``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stopping = threading.Event()
        self.answers: dict[str, dict[int, int]] = {}
        self.lock = threading.Lock()
        plan = [("slow", 0.0)] * 3 + [("fast", 0.03)] * 2 + [("broken", 0.05)]
        self.threads = [
            threading.Thread(target=self._send, args=(model, pause, i), daemon=True)
            for i, (model, pause) in enumerate(plan)
        ]

    def _send(self, model: str, pause: float, seed: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        n = 0
        rng = random.Random(seed)
        try:
            while not self.stopping.is_set():
                n += 1
                # fast: a few inputs over and over (hits); the others: new ones (misses)
                value = f"word{rng.randrange(24)}" if model == "fast" else f"{seed}-{n}"
                body = json.dumps({"inputs": [[value]]})
                try:
                    conn.request("POST", f"/v1/models/{model}:predict", body=body)
                    response = conn.getresponse()
                    response.read()
                    status = response.status
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
                    status = 0
                with self.lock:
                    counts = self.answers.setdefault(model, {})
                    counts[status] = counts.get(status, 0) + 1
                if pause:
                    self.stopping.wait(pause)
        finally:
            conn.close()

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(TIMEOUT * 2)


_LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?(\w+)\)$")


def _grafana_regex(values: list[str]) -> str:
    """A multi-value variable as Grafana's Prometheus data source writes it into a query:
    each value's regex characters escaped (with a backslash, itself escaped for a PromQL
    string), all of them as one alternation."""
    escaped = [re.sub(r"([$^*{}\[\]'+?.()|\\])", r"\\\\\1", v) for v in values]
    return "(" + "|".join(escaped) + ")"


def _substitute(expr: str, values: dict[str, str]) -> str:
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in values.items():
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, expr
    return expr


def _dashboard_queries(prom: Prometheus) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The dashboard's variables resolved through Prometheus (as Grafana's ``label_values``
    does), and every query of its panels and annotations with them substituted:
    ``(where, expr)``."""
    dashboard = json.loads(DASHBOARD.read_text())
    values: dict[str, str] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        found = _LABEL_VALUES.match(variable["query"]["query"])
        assert found, variable
        selector, label = found.groups()
        params = {"match[]": _substitute(selector, values)} if selector else {}
        options = sorted(prom.get(f"/api/v1/label/{label}/values", **params))
        if not options:
            return values, []  # not scraped yet
        values[variable["name"]] = (
            _grafana_regex(options) if variable["multi"] else options[0]  # one: as it is
        )
    queries = [
        (f"panel {panel['title']!r} {target['refId']}", _substitute(target["expr"], values))
        for panel in _panels(dashboard)
        for target in panel.get("targets", ())
    ]
    queries += [
        (f"annotation {a['name']!r}", _substitute(a["expr"], values))
        for a in dashboard["annotations"]["list"]
        if "expr" in a
    ]
    return values, queries


#: what the data must show, beyond being there: ``(PromQL that returns data when it holds,
#: what it means)``
EXPECTED = [
    (
        'job_model:wirekit_serve_request_duration_seconds:p95_rate5m{model="fast"}'
        f" < {FAST_TARGET}",
        "fast is under its target (with data: its alert is not missing for want of any)",
    ),
    (
        'job_model:wirekit_serve_backend_duration_seconds:mean_rate5m{model="slow"} > 0.1'
        " > on (model) job_model:wirekit_serve_queue_duration_seconds:mean_rate5m",
        "slow's time is spent at its backend (0.2 s), not in the dispatcher's queue",
    ),
    (
        'job_model:wirekit_serve_cache_hits:ratio_rate5m{model="fast"} > 0',
        "fast's repeated inputs are answered from the cache",
    ),
    (
        'max_over_time(wirekit_serve_quota{model="slow"}[1m]) > 0.5',
        "the controller gave slow more of n1's CPU than its configured 0.5",
    ),
    (
        'job_model:wirekit_serve_request_errors:ratio_rate5m{model="fast"} == 0',
        "fast's requests all end ok: the error ratio is 0, not absent",
    ),
]


def _dispatcher_doc(tmp_path: Path, fast: int, slow: int, refusing: list[int]) -> dict:
    """fast and slow share n1's CPU (so the controller can move share between them);
    broken's two devices on n2 refuse every connection."""
    return deployment(
        tmp_path / "requests.db",
        {"fast": {}, "slow": {"timeout": 5.0}, "broken": {"timeout": 1.0, "attempts": 2}},
        [
            {
                "id": "n1",
                "endpoint": "127.0.0.1",
                "devices": ["CPU"],
                "models": ["fast", "slow"],
                "quotas": [0.5, 0.5],
                "ports": [fast, slow],
            },
            {
                "id": "n2",
                "endpoint": "127.0.0.1",
                "devices": ["CPU", "CPU"],
                "models": ["broken"],
                "quotas": [1, 1],
                "ports": refusing,
            },
        ],
        cache={"max_entries": 32, "ttl": 30},  # slow's new inputs evict
        backoff=0.5,
        controller={
            "period": 1,
            "window": 5,
            "targets": {"slow": SLOW_TARGET, "fast": FAST_TARGET},
            "cooldown": 1,
            "stabilization": 1,
            "min_requests": 3,
        },
    )


def test_every_rule_and_dashboard_query_has_data_and_the_alerts_fire(tmp_path):
    prometheus = _tool("prometheus")
    rules = _test_rules(tmp_path / "rules.yml")
    with contextlib.ExitStack() as stack:
        fast = stack.enter_context(BackendProcess("serve_handlers:tag_fast"))
        slow = stack.enter_context(BackendProcess("serve_handlers:tag_slow"))
        refusing = stack.enter_context(_refusing_ports(3))
        doc = _dispatcher_doc(tmp_path, fast.port, slow.port, refusing[:2])
        dispatcher = stack.enter_context(DispatcherProcess.of(doc, tmp_path))
        replica = f"127.0.0.1:{dispatcher.addresses['http']}"
        down = f"127.0.0.1:{refusing[2]}"  # a replica that is down: nothing answers there
        prom = stack.enter_context(Prometheus(prometheus, tmp_path, [replica, down], rules))
        # The load starts once Prometheus has scraped the dispatcher: a counter's first
        # sample must come before the load moves it, or `changes()` sees no change (the
        # controller's decisions, all made in the first seconds of load, were missed
        # when Prometheus was slow to start).
        scraped = time.monotonic() + DEADLINE
        while not prom.query(f'up{{instance="{replica}"}} == 1'):
            assert time.monotonic() < scraped, f"Prometheus never scraped {replica}"
            time.sleep(0.2)
        load = stack.enter_context(Load(dispatcher.addresses["http"]))

        seen_alerts: list[dict[str, Any]] = []
        # What had data (or fired) at some poll: each query must show its data at least once
        # before the deadline, not all in the same poll -- an annotation over the last minute
        # (the controller's decisions) may have gone quiet by the time a slower query (an
        # alert's `for`) shows on a loaded machine.
        shown: set[str] = set()
        until = time.monotonic() + DEADLINE
        while True:
            missing: list[str] = []

            def check(key: str, ok: bool, why: str, missing: list[str] = missing) -> None:
                if ok:
                    shown.add(key)
                elif key not in shown:
                    missing.append(why)

            groups = prom.get("/api/v1/rules")["groups"]
            loaded = [rule for group in groups for rule in group["rules"]]
            for rule in loaded:
                if rule["health"] != "ok":
                    missing.append(f"rule {rule['name']}: health {rule['health']}")
                else:
                    check(
                        f"rule {rule['name']}",
                        _has_data(prom.query(rule["query"])),
                        f"rule {rule['name']}: no data for {rule['query']}",
                    )
            values, queries = _dashboard_queries(prom)
            if not queries:
                missing.append(f"dashboard variables not resolved yet: {values}")
            for where, expr in queries:
                check(
                    f"{where} {expr}", _has_data(prom.query(expr)), f"{where}: no data for {expr}"
                )
            for expr, meaning in EXPECTED:
                check(expr, bool(prom.query(expr)), f"not shown: {meaning} ({expr})")
            alerts = prom.get("/api/v1/alerts")["alerts"]
            seen_alerts += alerts
            firing = {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}
            for name in sorted(ALERTS):
                check(f"alert {name}", name in firing, f"alert {name} not firing")
            if not missing or time.monotonic() > until:
                break
            time.sleep(1.0)
        answers = dict(load.answers)

    detail = (
        "\n".join(missing) + f"\nanswers: {answers}\nprometheus: {prom.log.read_text()[-2000:]}"
    )
    assert not missing, detail
    names = {rule["name"] for rule in loaded}
    in_file = re.findall(r"(?m)^\s+- (?:record|alert): (\S+)$", RULES.read_text())
    assert names == set(in_file) and len(loaded) == len(in_file)  # every rule loaded, once
    assert names >= ALERTS
    assert len(queries) >= 20

    # The over-target alert is about the slow model alone: the fast one, well under its
    # target, never even became pending.
    over = [a for a in seen_alerts if a["labels"]["alertname"] == "WirekitServeModelOverTarget"]
    assert {a["labels"]["model"] for a in over} == {"slow"}, over
    assert float(over[-1]["value"]) > SLOW_TARGET
    errors = [a for a in alerts if a["labels"]["alertname"] == "WirekitServeErrorRatioHigh"]
    assert {a["labels"]["model"] for a in errors} == {"broken"}, errors
    down_alerts = [a for a in alerts if a["labels"]["alertname"] == "WirekitServeReplicaDown"]
    assert {a["labels"]["instance"] for a in down_alerts} == {down}
    not_ready = [a for a in alerts if a["labels"]["alertname"] == "WirekitServeNotReady"]
    assert {a["labels"]["instance"] for a in not_ready} == {replica}  # broken has no backend
    backed_off = [a for a in alerts if a["labels"]["alertname"] == "WirekitServeDeviceBackedOff"]
    assert {a["labels"]["model"] for a in backed_off} == {"broken"}
    assert answers["fast"].get(200, 0) > 0 and answers["slow"].get(200, 0) > 0


# --- the error-ratio alert's traffic floor, with promtool's rule unit tests -------------------

#: ``promtool test rules`` input: two models over 40 minutes, as rates (counters may grow by
#: fractions): ``quiet`` gets 19 requests per 5 minutes, 1 of them failed (5.3 %: over the
#: 5 % threshold, under the traffic floor); ``busy`` gets 72 per minute, 12 of them failed
#: (a real error burst); ``calm`` as much traffic as ``busy``, 1 failure per 100 (under the
#: threshold).
_FLOOR_CASES = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
{series}
    promql_expr_test:
      - expr: count(job_model:wirekit_serve_request_errors:ratio_rate5m > 0.05)
        eval_time: 30m
        exp_samples:
          - labels: '{{}}'
            value: 2
    alert_rule_test:
      - eval_time: 30m
        alertname: WirekitServeErrorRatioHigh
        exp_alerts:
          - exp_labels: {{job: wirekit-serve, model: busy, severity: warning}}
            exp_annotations:
              summary: "wirekit serve: model busy fails 16.67% of its requests"
              description: >-
                16.67% of the requests of busy ended other than ok (failed, error,
                abandoned) over the last 5 minutes.  The dashboard's errors by state and
                back-offs say which and where.
"""


def test_the_error_ratio_alert_has_a_traffic_floor(tmp_path):
    """1 failure in 19 requests (5.3 % of a trickle) does not page; an error burst at 1.2
    request/s does (promtool evaluates the very rule file over synthetic series, its
    ``for:`` as written)."""
    promtool = _tool("promtool")
    per_minute = {"quiet": (3.6, 0.2), "busy": (60, 12), "calm": (59.4, 0.6)}
    series = []
    for model, (ok, failed) in per_minute.items():
        for device, state, step in (("n1/0", "ok", ok), ("none", "failed", failed)):
            labels = (
                f'job="wirekit-serve",instance="r1:8080",model="{model}",device="{device}",'
                f'door="http",state="{state}"'
            )
            series.append(f"      - series: 'wirekit_serve_requests_total{{{labels}}}'")
            series.append(f"        values: '0+{step}x40'")
    cases = tmp_path / "floor.yml"
    cases.write_text(_FLOOR_CASES.format(rules=json.dumps(str(RULES)), series="\n".join(series)))
    out = subprocess.run(
        [promtool, "test", "rules", str(cases)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 3,
    )
    assert out.returncode == 0, out.stdout + out.stderr
