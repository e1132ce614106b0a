"""What ``wirekit serve`` tells of itself: ``/stats``, ``/metrics`` and ``/controller``.

:class:`Observability` draws the documents from the service's live counters
(:class:`~wirekit.serve.control.metrics.Metrics`), the snapshots of their histograms (the
last minute's latency and rate), the dispatcher's own counters and, on a shared store, the
store's figures of every replica.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .control.catalog import CatalogChange
from .control.controller import DECISION_OUTCOMES, catalog_targets, quota_rows
from .control.metrics import (
    HistogramHistory,
    Metrics,
    ModelStats,
    device_label,
    latency_of,
    model_stats,
    snapshot_of,
)
from .dispatch.dispatcher import REFUSED_JOURNAL
from .doors.fdwatch import BurstLog
from .logs import serve_logger
from .record.storedb import StoreDB

log = serve_logger()

#: seconds between two snapshots of the histograms (``/stats``' window)
SNAPSHOT_INTERVAL = 1.0


class Observability:
    """The figures of a :class:`~wirekit.serve.service.Service` (``service``: its
    ``catalog``, ``router``, ``dispatcher``, ``cache``, ``controller``, ``store`` and
    ``readiness()`` are read) and of its live counters ``metrics``."""

    def __init__(self, service: Any, metrics: Metrics) -> None:
        self.service = service
        self.metrics = metrics
        #: snapshots of the histograms: ``/stats``' latency and rate over the last minute
        #: (:meth:`HistogramHistory.take` every :data:`SNAPSHOT_INTERVAL`, by the service)
        self.history = HistogramHistory(metrics, interval=SNAPSHOT_INTERVAL)
        #: on a shared store: the connection ``/stats`` queries (set by the service at
        #: start, closed at stop)
        self.shared_db: StoreDB | None = None
        #: says when ``/stats`` cannot read the shared store (once per burst)
        self._store_read = BurstLog(log)

    def follow(self, change: CatalogChange) -> None:
        """The catalog's subscriber: a model removed (through the admin API, ``wirekit serve
        models remove`` or a change another replica made) has its series dropped from
        ``/metrics`` -- this process's own (:meth:`Metrics.forget`) and those drawn from the
        router, the dispatcher, the cache and the controller (:meth:`prometheus_extra`: the
        exposition leaves out every model in ``Metrics.removed``); a model added (again) is
        exported from 0."""
        if change.kind == "remove":
            self.metrics.forget(change.model)
            self.history.forget(change.model)
        elif change.kind == "add":
            self.metrics.served(change.model)
            self.history.forget(change.model)

    def quotas(self) -> list[dict[str, Any]]:
        """Every row of the catalog with its current quota."""
        return quota_rows(self.service.catalog)

    def controller_state(self) -> dict[str, Any]:
        """The ``GET /controller`` document."""
        if self.service.controller is None:
            return {
                "enabled": False,
                "quotas": self.quotas(),
                "targets": catalog_targets(self.service.catalog),
                # the operators' (issue 38): every change to what is served is a decision
                "decisions": list(self.service.admin.decisions),
            }
        return self.service.controller.state()

    def extra(self) -> dict[str, Any]:
        return {
            "cache": self.service.cache.stats(),
            "backed_off": self.service.router.backed_off(),
            "quotas": self.quotas(),
        }

    def _row_labels(self) -> dict[str, tuple[str, str]]:
        """Row key -> (model, device label) of every row of the catalog."""
        return {r.key: (r.model, device_label(r.key, r.model)) for r in self.service.catalog.rows()}

    def in_flight_by_device(self) -> dict[tuple[str, str], int]:
        """(model, device label) -> requests sent to that row's backend and not answered
        yet (the rows whose backend counts them)."""
        d = self.service.dispatcher
        if d is None:
            return {}
        out = {}
        for key, (model, label) in self._row_labels().items():
            n = getattr(d.backends.get(key), "in_flight", None)
            if isinstance(n, int):
                out[(model, label)] = n
        return out

    def prometheus_extra(self) -> dict[str, Any]:
        """What ``/metrics`` shows beside the metrics' own figures."""
        extra = self.extra()
        labels = self._row_labels()

        def label(model: str, key: str) -> tuple[str, str]:
            return labels.get(key, (model, device_label(key, model)))

        extra["backoffs"] = {label(m, k): n for (m, k), n in self.service.router.backoffs.items()}
        d = self.service.dispatcher
        if d is not None:
            batches: dict[tuple[str, str], list[int]] = {}
            for key, counts in d.row_batches.items():
                model = labels.get(key, (key.rsplit("/", 1)[-1], ""))[0]
                batches[label(model, key)] = counts
            extra["batches"] = batches
        extra["in_flight"] = self.in_flight_by_device()
        extra["targets"] = catalog_targets(self.service.catalog)
        decisions: dict[tuple[str, str], int] = {}
        if self.service.controller:
            # Every counter from 0 (Prometheus' advice): the first decision is then a change
            # that `increase()`/`changes()` see, not a series that starts at 1.
            for model in self.service.catalog.models():
                for outcome in DECISION_OUTCOMES:
                    decisions[(model, outcome)] = 0
            decisions.update(self.service.controller.outcomes)
        extra["decisions"] = decisions
        extra["ready"] = self.service.readiness()["ready"]
        door = self.service.http_door
        extra["http_bad_requests"] = door.bad_requests if door is not None else 0
        # every reason from 0, as the decisions above
        extra["refused"] = {REFUSED_JOURNAL: 0, **self.service.dispatcher.refused}
        extra["store_backlog"] = self.service.store.backlog
        return extra

    def live_figures(self) -> dict[str, dict[str, Any]]:
        """Per model, ``/stats``' figures from this process's histograms: ``latency``
        (p50/p95/p99 over the window), ``rate`` (requests finished per second over the
        window) and ``devices`` (per device label: requests and end states since start,
        latency over the window, in flight now)."""
        seconds, window = self.history.window()
        in_flight = self.in_flight_by_device()
        out: dict[str, dict[str, Any]] = {}
        for model in self.metrics.models:
            out[model] = {"latency": latency_of([]), "rate": 0.0, "devices": {}}
        totals: dict[str, list[int]] = {}
        for (model, device), series in sorted(self.metrics.series.items()):
            counts = window.get((model, device), [])
            entry = out.setdefault(model, {"latency": latency_of([]), "rate": 0.0, "devices": {}})
            entry["devices"][device] = {
                "requests": sum(series.states.values()),
                "states": dict(sorted(series.states.items())),
                "latency": latency_of(counts),
                "in_flight": in_flight.get((model, device), 0),
            }
            total = totals.setdefault(model, [0] * len(series.duration.counts))
            for i, n in enumerate(counts):
                total[i] += n
        for (model, device), n in in_flight.items():
            devices = out.setdefault(
                model, {"latency": latency_of([]), "rate": 0.0, "devices": {}}
            )["devices"]
            if device not in devices:
                devices[device] = {
                    "requests": 0,
                    "states": {},
                    "latency": latency_of([]),
                    "in_flight": n,
                }
        for model, counts in totals.items():
            out[model]["latency"] = latency_of(counts)
            out[model]["rate"] = sum(counts) / seconds
        return out

    def stats(self) -> dict[str, Any]:
        """The ``/stats`` document."""
        snap = self.metrics.snapshot()
        snap.update(self.extra())
        d = self.service.dispatcher
        snap["resubmissions"] = d.resubmissions if d else 0
        snap["batches"] = {"sent": d.batches if d else 0, "retried": d.batch_retries if d else 0}
        snap["lane_requests"] = d.lane_requests if d else 0
        return snap

    def _with_live(self, snap: dict[str, Any]) -> dict[str, Any]:
        """``snap`` with the per-model live figures (:meth:`live_figures`), the window they
        cover and readiness (``ready``, and ``/readyz``'s ``ready_reasons`` and
        ``ready_policy``: what the live page shows)."""
        models = snap.setdefault("models", {})
        for model, figures in self.live_figures().items():
            models.setdefault(model, {}).update(figures)
        snap["stats_window"] = self.history.span
        readiness = self.service.readiness()
        snap["ready"] = readiness["ready"]
        snap["ready_reasons"] = readiness["reasons"]
        snap["ready_policy"] = readiness.get("policy")
        return snap

    def metrics_text(self) -> bytes:
        """The ``/metrics`` text: this process's figures (the same on every store)."""
        return self.metrics.prometheus(self.prometheus_extra())

    async def shared_stats(self) -> dict[str, ModelStats] | None:
        """The per-model figures computed from a shared (PostgreSQL) store, the same on
        every replica; None on the embedded store, whose live counters already describe the
        whole store.  Queried in a worker thread: the loop never waits on the database."""
        db = self.shared_db
        if db is None:
            return None
        stored = await asyncio.to_thread(model_stats, db)
        # every model served is reported, with zeros before its first request (as the live
        # counters do)
        return {**{m: ModelStats() for m in self.metrics.models}, **stored}

    async def http_stats(self) -> dict[str, Any]:
        """``/stats``: the store's figures per model (on a shared store every replica's,
        with this replica's own under ``"local"``), this process's live figures
        (:meth:`live_figures`) and ``"backlog"``, the requests journaled but not yet in the
        store (:attr:`~wirekit.serve.record.store.RequestStore.backlog`).  A shared store
        that cannot be read (the database away) is no error: the document then has this
        process's own figures, as on the embedded store, and ``"store_unavailable"`` says
        why (one WARNING per burst in the log)."""
        snap = self.stats()
        try:
            shared = await self.shared_stats()
        except Exception as exc:
            why = " ".join(str(exc).split()) or type(exc).__name__  # one line
            self._store_read.event(
                time.monotonic(), "wirekit serve: /stats cannot read the store: %s", why
            )
            snap["store_unavailable"] = why
            shared = None
        if shared is not None:
            local = {"queue": snap["queue"], "models": snap["models"]}
            snap.update(snapshot_of(shared))
            snap["local"] = local
            snap["replica"] = self.service.store.replica
            snap["leader"] = self.service.leadership()
        snap["store"] = self.service.store.kind
        snap["backlog"] = self.service.store.backlog
        return self._with_live(snap)

    async def http_metrics(self) -> bytes:
        """``/metrics``: this process's figures, on every store (each replica exports its
        own; a dashboard sums them)."""
        return self.metrics_text()
