"""Metrics of the design: response time (avg/min/max) per model and the queue length
(waiting + being processed), in total and per model, plus counts per status and the cache's
hits and misses.

:class:`Metrics` keeps them live in memory (started from the store at start-up, so they always
describe the whole store) and :func:`stats_from_store` computes the same figures with SQL from
a store: the two agree, which the tests check.  On a shared PostgreSQL store (several
replicas), ``/stats`` and ``/metrics`` report the figures computed from the store -- the same
on every replica -- and each replica's live counters only as its process-local figures
(``"local"`` in ``/stats``, ``wirekit_serve_local_*`` in ``/metrics``).  ``snapshot()`` is
the JSON of ``/stats``; :meth:`Metrics.prometheus` is the text of ``/metrics``.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .storedb import OK, QUEUED, StoreDB, as_db


@dataclass(slots=True)
class ModelStats:
    requests: int = 0
    queue: int = 0
    count: int = 0  #: answered with status ok (the response-time sample)
    total: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    statuses: dict[str, int] = field(default_factory=dict)

    def arrive(self, n: int = 1) -> None:
        """``n`` requests arrived (they are in the queue until they finish)."""
        self.requests += n
        self.queue += n

    def answered_ok(self, n: int, total: float, lo: float, hi: float) -> None:
        """``n`` requests finished with status ok, their response times summing to
        ``total``, the shortest ``lo`` and the longest ``hi``."""
        self.queue -= n
        self.statuses[OK] = self.statuses.get(OK, 0) + n
        self.count += n
        self.total += total
        if lo < self.min:
            self.min = lo
        if hi > self.max:
            self.max = hi

    def as_dict(self) -> dict[str, Any]:
        rt: dict[str, Any] = {"count": self.count, "avg": None, "min": None, "max": None}
        if self.count:
            rt.update(avg=self.total / self.count, min=self.min, max=self.max)
        return {
            "requests": self.requests,
            "queue": self.queue,
            "statuses": dict(sorted(self.statuses.items())),
            "response_time": rt,
        }


class Metrics:
    """Live counters, updated by the dispatcher as requests arrive and finish."""

    def __init__(self, models: Iterable[str] = ()) -> None:
        self.models: dict[str, ModelStats] = {m: ModelStats() for m in models}
        #: requests the store held as queued at start (a previous run's, never answered):
        #: part of ``queue``, not in flight in this process
        self._stale: dict[str, int] = {}

    def stats(self, model: str) -> ModelStats:
        """The live counters of ``model`` (created on first use)."""
        stats = self.models.get(model)
        if stats is None:
            stats = self.models[model] = ModelStats()
        return stats

    def load(self, conn: sqlite3.Connection | StoreDB) -> None:
        """Start from what a store already holds."""
        for model, s in model_stats(conn).items():
            self.models[model] = s
            self._stale[model] = s.queue

    def in_flight(self, model: str) -> int:
        """Requests of ``model`` this process took and has not answered yet."""
        s = self.models.get(model)
        return 0 if s is None else s.queue - self._stale.get(model, 0)

    def arrived(self, model: str) -> None:
        s = self.stats(model)
        s.requests += 1
        s.queue += 1

    def finished(self, model: str, status: str, response_time: float) -> None:
        s = self.stats(model)
        s.queue -= 1
        s.statuses[status] = s.statuses.get(status, 0) + 1
        if status == OK:
            s.count += 1
            s.total += response_time
            if response_time < s.min:
                s.min = response_time
            if response_time > s.max:
                s.max = response_time

    @property
    def queue(self) -> int:
        return sum(s.queue for s in self.models.values())

    def snapshot(self) -> dict[str, Any]:
        """``{"queue": total, "models": {model: {...}}}``."""
        return snapshot_of(self.models)

    def prometheus(
        self,
        extra: dict[str, Any] | None = None,
        shared: dict[str, ModelStats] | None = None,
    ) -> bytes:
        """The Prometheus text exposition of these metrics (and of ``extra``: cache
        hits/misses/entries, devices backed off).  ``shared``: the figures of a shared
        store (:func:`model_stats`) -- reported under the usual names, and these live
        counters then as ``wirekit_serve_local_*``."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        if shared is None:
            registry.register(_Collector(self.models, extra or {}))
        else:
            registry.register(_Collector(shared, extra or {}))
            registry.register(
                _Collector(self.models, {}, "wirekit_serve_local_", " (this replica)")
            )
        return generate_latest(registry)


class _Collector:
    def __init__(
        self,
        models: dict[str, ModelStats],
        extra: dict[str, Any],
        prefix: str = "wirekit_serve_",
        scope: str = "",
    ) -> None:
        self.models = models
        self.extra = extra
        self.prefix = prefix
        self.scope = scope

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        models = self.models
        p, scope = self.prefix, self.scope
        queue = GaugeMetricFamily(
            f"{p}queue_length",
            f"Requests waiting or being processed, per model{scope}",
            labels=["model"],
        )
        total = GaugeMetricFamily(
            f"{p}queue_length_total", f"Requests waiting or being processed{scope}"
        )
        requests = CounterMetricFamily(
            f"{p}requests",
            f"Requests finished, per model and status{scope}",
            labels=["model", "status"],
        )
        rt = {
            k: GaugeMetricFamily(
                f"{p}response_seconds_{k}",
                f"{label} response time of the requests answered ok, per model{scope}",
                labels=["model"],
            )
            for k, label in (("avg", "Average"), ("min", "Minimum"), ("max", "Maximum"))
        }
        for model, s in sorted(models.items()):
            queue.add_metric([model], s.queue)
            for status, n in sorted(s.statuses.items()):
                requests.add_metric([model, status], n)
            if s.count:
                rt["avg"].add_metric([model], s.total / s.count)
                rt["min"].add_metric([model], s.min)
                rt["max"].add_metric([model], s.max)
        total.add_metric([], sum(s.queue for s in models.values()))
        yield from (queue, total, requests, *rt.values())
        cache = self.extra.get("cache")
        if cache:
            for key in ("hits", "misses"):
                c = CounterMetricFamily(f"wirekit_serve_cache_{key}", f"Response cache {key}")
                c.add_metric([], cache[key])
                yield c
            g = GaugeMetricFamily("wirekit_serve_cache_entries", "Responses in the cache")
            g.add_metric([], cache["entries"])
            yield g
        if "backed_off" in self.extra:
            g = GaugeMetricFamily(
                "wirekit_serve_devices_backed_off", "Devices out of rotation after a failure"
            )
            g.add_metric([], len(self.extra["backed_off"]))
            yield g


def model_stats(source: sqlite3.Connection | StoreDB) -> dict[str, ModelStats]:
    """The figures of every model, computed with SQL over a store."""
    db = as_db(source)
    out: dict[str, ModelStats] = {}
    for model, status, n in db.status_counts():
        s = out.setdefault(model, ModelStats())
        s.requests += n
        if status == QUEUED:
            s.queue += n
        else:
            s.statuses[status] = n
    for model, n, total, lo, hi in db.ok_times():
        s = out.setdefault(model, ModelStats())
        s.count, s.total, s.min, s.max = n, total, lo, hi
    return out


def snapshot_of(models: dict[str, ModelStats]) -> dict[str, Any]:
    """``{"queue": total, "models": {model: {...}}}`` of per-model figures."""
    return {
        "queue": sum(s.queue for s in models.values()),
        "models": {m: s.as_dict() for m, s in sorted(models.items())},
    }


def stats_from_store(source: sqlite3.Connection | StoreDB) -> dict[str, Any]:
    """The metrics computed with SQL over a store (the ``wirekit serve stats`` figures)."""
    return snapshot_of(model_stats(source))


def render_stats(stats: dict[str, Any]) -> str:
    """A human table of a :func:`stats_from_store` / ``snapshot()`` dict."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.3f}"

    lines = [
        f"{'model':<20} {'requests':>9} {'queue':>6} {'ok':>9} {'avg ms':>10} {'min ms':>10}"
        f" {'max ms':>10}  other statuses"
    ]
    for model, s in stats["models"].items():
        rt = s["response_time"]
        others = ", ".join(f"{k}={v}" for k, v in s["statuses"].items() if k != OK)
        lines.append(
            f"{model:<20} {s['requests']:>9} {s['queue']:>6} {rt['count']:>9}"
            f" {ms(rt['avg']):>10} {ms(rt['min']):>10} {ms(rt['max']):>10}  {others}"
        )
    lines.append(f"queue total: {stats['queue']}")
    return "\n".join(lines)
