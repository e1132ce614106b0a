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

The controller needs the same figures over a recent window rather than since the start:
``Metrics(models, window=Window(...))`` also keeps, per model, the last ``span`` seconds in
time slots (:class:`Window`), read with :meth:`Metrics.recent` (and shown under ``"window"``
in ``/stats``).  Off unless asked for: without a window the request path pays one ``if``.

With a window it also keeps one per *row* (a model on a device of a node, keyed by the row's
key ``node/device/model``): the requests that row finished, read with
:meth:`Metrics.recent_rows` (``"rows"`` under ``"window"``).  A request is counted on the
device that answered it, when it finishes -- the general path's :meth:`Metrics.finished` with
its ``device``, the MIP lane's groups split per row (:meth:`Metrics.rows_answered`) -- so a
row's ``requests`` are the requests it *finished* in the window (answered ok or with an
error; ``rate`` its throughput) and its ``queue`` is None: a request has no device until it
is answered (nor in the store).  Answers from the cache count on no row.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable, Iterable
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
    #: the recent-window counters of this model (None: no window kept)
    recent: WindowCounters | None = None

    def arrive(self, n: int = 1) -> None:
        """``n`` requests arrived (they are in the queue until they finish)."""
        self.requests += n
        self.queue += n
        if self.recent is not None:
            self.recent.arrive(n)

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
        if self.recent is not None:
            self.recent.answered_ok(n, total, lo, hi)

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


#: histogram buckets per doubling of the response time: a percentile is read to within
#: 2 ** (1/8) - 1 = 9 % of the true value
_BUCKETS_PER_OCTAVE = 8
_NO_TIME = -(1 << 20)  # the bucket of response times <= 0
_CACHE = "cache"  # the device of an answer from the cache (no row)


class _Slot:
    __slots__ = ("arrivals", "count", "errors", "hist", "index", "max", "total")

    def __init__(self) -> None:
        self.reset(-1)

    def reset(self, index: int) -> None:
        self.index = index
        self.arrivals = self.count = self.errors = 0
        self.total = 0.0
        self.max = -math.inf
        self.hist: dict[int, int] = {}


def _bucket(seconds: float) -> int:
    if not 0 < seconds < 1e9:  # <= 0 (a clock step) or absurd: the lowest / a high bucket
        return _NO_TIME if not seconds > 0 else 30 * _BUCKETS_PER_OCTAVE
    return math.floor(math.log2(seconds) * _BUCKETS_PER_OCTAVE)


@dataclass(frozen=True, slots=True)
class RecentStats:
    """One model's figures over the recent window (response times of requests answered ok,
    in seconds; ``None`` when none was answered in the window)."""

    seconds: float  #: the time the figures cover (the span, or less just after start)
    requests: int  #: requests that arrived in the window (a row's: that it finished)
    rate: float  #: requests per second that arrived (a row's: that it finished)
    ok: int  #: answered ok in the window
    errors: int  #: finished otherwise (backend error, failed) in the window
    queue: int | None  #: waiting or being processed now (None for a row: not known)
    avg: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


class WindowCounters:
    """One model's counters over the last ``span`` seconds, in time slots: memory is the
    slots (``span / slot``) times the histogram buckets used, whatever the traffic."""

    __slots__ = ("_ring", "_start", "_window")

    def __init__(self, window: Window) -> None:
        self._window = window
        self._ring = [_Slot() for _ in range(window.slots)]
        self._start = window.clock()

    def _slot(self) -> _Slot:
        w = self._window
        index = int(w.clock() / w.slot)
        slot = self._ring[index % w.slots]
        if slot.index != index:
            slot.reset(index)
        return slot

    def arrive(self, n: int) -> None:
        self._slot().arrivals += n

    def failed(self, counted: int = 0) -> None:
        """One finished otherwise than ok (``counted``: also count it as a request, as a
        row's window does)."""
        slot = self._slot()
        slot.errors += 1
        slot.arrivals += counted

    def answered_ok(self, n: int, total: float, lo: float, hi: float, counted: int = 0) -> None:
        """``n`` answered ok, their times summing to ``total`` from ``lo`` to ``hi``
        (``counted``: requests to count as well, as a row's window does).  For the
        percentiles a group (the MIP lane's) counts ``lo``, ``hi`` and the rest at the mean
        of the rest: exact for groups of up to 2, close for more."""
        slot = self._slot()
        slot.arrivals += counted
        slot.count += n
        slot.total += total
        if hi > slot.max:
            slot.max = hi
        hist = slot.hist
        b = _bucket(lo)
        hist[b] = hist.get(b, 0) + 1
        if n > 1:
            b = _bucket(hi)
            hist[b] = hist.get(b, 0) + 1
        if n > 2:
            b = _bucket((total - lo - hi) / (n - 2))
            hist[b] = hist.get(b, 0) + n - 2

    def read(self, queue: int | None) -> RecentStats:
        """The figures of the slots inside the window now."""
        w = self._window
        now = w.clock()
        first = int(now / w.slot) - w.slots + 1
        arrivals = count = errors = 0
        total = 0.0
        hi = -math.inf
        hist: dict[int, int] = {}
        for slot in self._ring:
            if slot.index < first:
                continue
            arrivals += slot.arrivals
            count += slot.count
            errors += slot.errors
            total += slot.total
            hi = max(hi, slot.max)
            for b, n in slot.hist.items():
                hist[b] = hist.get(b, 0) + n
        seconds = min(w.span, max(now - self._start, w.slot))

        def pct(q: float) -> float | None:
            if not count:
                return None
            rank = q * count
            seen = 0
            for b in sorted(hist):
                seen += hist[b]
                if seen >= rank:
                    edge = 0.0 if b == _NO_TIME else 2.0 ** ((b + 1) / _BUCKETS_PER_OCTAVE)
                    return min(edge, hi)
            return hi  # pragma: no cover - the ranks add up to count

        return RecentStats(
            seconds=seconds,
            requests=arrivals,
            rate=arrivals / seconds,
            ok=count,
            errors=errors,
            queue=queue,
            avg=total / count if count else None,
            p50=pct(0.50),
            p95=pct(0.95),
            p99=pct(0.99),
            max=hi if count else None,
        )


class Window:
    """The shape of the recent window: ``span`` seconds in slots of ``slot`` seconds (a
    request leaves the window between ``span - slot`` and ``span`` seconds after it
    finished)."""

    def __init__(
        self, span: float = 30.0, slot: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not (span > 0 and 0 < slot <= span):
            raise ValueError(f"a window needs 0 < slot <= span, got slot {slot}, span {span}")
        self.span = span
        self.slot = slot
        self.slots = max(1, round(span / slot))
        self.clock = clock

    def counters(self) -> WindowCounters:
        return WindowCounters(self)


class Metrics:
    """Live counters, updated by the dispatcher as requests arrive and finish."""

    def __init__(self, models: Iterable[str] = (), *, window: Window | None = None) -> None:
        #: the recent window kept beside the totals (None: none)
        self.window = window
        self.models: dict[str, ModelStats] = {}
        #: row key (``node/device/model``) -> its window counters (kept with a window only)
        self.rows: dict[str, WindowCounters] = {}
        for m in models:
            self.stats(m)
        #: requests the store held as queued at start (a previous run's, never answered):
        #: part of ``queue``, not in flight in this process
        self._stale: dict[str, int] = {}

    def stats(self, model: str) -> ModelStats:
        """The live counters of ``model`` (created on first use)."""
        stats = self.models.get(model)
        if stats is None:
            stats = self.models[model] = ModelStats()
            if self.window is not None:
                stats.recent = self.window.counters()
        return stats

    def load(self, conn: sqlite3.Connection | StoreDB) -> None:
        """Start from what a store already holds (the window starts empty)."""
        for model, s in model_stats(conn).items():
            s.recent = self.stats(model).recent
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
        if s.recent is not None:
            s.recent.arrive(1)

    def finished(
        self, model: str, status: str, response_time: float, device: str | None = None
    ) -> None:
        """A request of ``model`` finished with ``status`` after ``response_time`` seconds,
        answered by the row ``device`` (its key; None or ``"cache"``: no row)."""
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
            if s.recent is not None:
                s.recent.answered_ok(1, response_time, response_time, response_time)
                if device is not None and device != _CACHE:
                    rt = response_time
                    self.row(device).answered_ok(1, rt, rt, rt, 1)
        elif s.recent is not None:
            s.recent.failed()
            if device is not None and device != _CACHE:
                self.row(device).failed(1)

    def row(self, key: str) -> WindowCounters:
        """The window counters of the row ``key`` (created on first use; needs a window)."""
        counters = self.rows.get(key)
        if counters is None:
            if self.window is None:
                raise ValueError("no window is kept: Metrics(..., window=Window(...))")
            counters = self.rows[key] = self.window.counters()
        return counters

    def rows_answered(self, groups: dict[str, list[Any]]) -> None:
        """The MIP lane's answers of one flush, per row: ``{row key: [n, total, lo, hi]}``
        (``n`` answered ok, their response times summing to ``total``, from ``lo`` to
        ``hi``), counted on each row's window as :meth:`finished` counts one."""
        for key, (n, total, lo, hi) in groups.items():
            self.row(key).answered_ok(n, total, lo, hi, n)

    def recent(self) -> dict[str, RecentStats]:
        """Per model, the figures of the recent window (empty without a window)."""
        if self.window is None:
            return {}
        return {m: s.recent.read(s.queue) for m, s in sorted(self.models.items()) if s.recent}

    def recent_rows(self) -> dict[str, RecentStats]:
        """Per row key (``node/device/model``), the figures of the requests that row
        finished in the recent window (``queue`` None; empty without a window)."""
        return {k: c.read(None) for k, c in sorted(self.rows.items())}

    @property
    def queue(self) -> int:
        return sum(s.queue for s in self.models.values())

    def snapshot(self) -> dict[str, Any]:
        """``{"queue": total, "models": {model: {...}}}``, and ``"window"`` (the recent
        window per model, see :class:`RecentStats`) when one is kept."""
        snap = snapshot_of(self.models)
        if self.window is not None:
            snap["window"] = {
                "seconds": self.window.span,
                "models": {m: r.as_dict() for m, r in self.recent().items()},
                "rows": {k: r.as_dict() for k, r in self.recent_rows().items()},
            }
        return snap

    def prometheus(
        self,
        extra: dict[str, Any] | None = None,
        shared: dict[str, ModelStats] | None = None,
    ) -> bytes:
        """The Prometheus text exposition of these metrics (and of ``extra``: cache
        hits/misses/entries, devices backed off, the quota of every row).  ``shared``: the
        figures of a shared store (:func:`model_stats`) -- reported under the usual names,
        and these live counters then as ``wirekit_serve_local_*``."""
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
            model = _label(model)
            queue.add_metric([model], s.queue)
            for status, n in sorted(s.statuses.items()):
                requests.add_metric([model, _label(status)], n)
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
        if "quotas" in self.extra:
            g = GaugeMetricFamily(
                "wirekit_serve_quota",
                "Share of a device given to a model (the models metadata, the controller's)",
                labels=["node", "device", "device_type", "model"],
            )
            for q in self.extra["quotas"]:
                labels = [q["node"], str(q["device"]), q["device_type"], q["model"]]
                g.add_metric([_label(v) for v in labels], q["quota"])
            yield g
        if "backed_off" in self.extra:
            g = GaugeMetricFamily(
                "wirekit_serve_devices_backed_off", "Devices out of rotation after a failure"
            )
            g.add_metric([], len(self.extra["backed_off"]))
            yield g


def _as_text(value: Any) -> str:
    """A model or status read from a store as text, whatever the row holds (SQLite keeps
    any type in any column: a file written by something else may hold a number or bytes)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _as_seconds(value: Any, default: float) -> float:
    """A response-time figure read from a store as a float (``default`` for none)."""
    try:
        return default if value is None else float(value)
    except (TypeError, ValueError, OverflowError):
        return default


def _label(value: str) -> str:
    """A label value the exposition can write (UTF-8): a lone surrogate is written as its
    escape rather than failing the whole scrape (the exposition escapes quotes, backslashes
    and line breaks itself)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def model_stats(source: sqlite3.Connection | StoreDB) -> dict[str, ModelStats]:
    """The figures of every model, computed with SQL over a store (a row of odd types --
    the model a number, a time that is not one -- is counted as well as it can be, never
    failing the whole)."""
    db = as_db(source)
    out: dict[str, ModelStats] = {}
    for model, status, n in db.status_counts():
        s = out.setdefault(_as_text(model), ModelStats())
        s.requests += n
        status = _as_text(status)
        if status == QUEUED:
            s.queue += n
        else:
            s.statuses[status] = s.statuses.get(status, 0) + n
    for model, n, total, lo, hi in db.ok_times():
        s = out.setdefault(_as_text(model), ModelStats())
        s.count += n
        s.total += _as_seconds(total, 0.0)
        s.min = min(s.min, _as_seconds(lo, math.inf))
        s.max = max(s.max, _as_seconds(hi, -math.inf))
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
