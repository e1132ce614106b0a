"""Metrics of the dispatcher, kept in memory and exported two ways: ``GET /metrics``
(Prometheus text, :meth:`Metrics.prometheus`) and ``GET /stats`` (JSON, :meth:`Metrics.snapshot`
plus what the service adds).

Two kinds of figures:

* **This process's, since it started** (the Prometheus series; see :data:`METRIC_NAMES`):
  histograms of the response time per model and device
  (``wirekit_serve_request_duration_seconds``), of the time a request waited in the
  dispatcher before it was first sent to a backend (``..._queue_duration_seconds``) and of
  the time at the backend per attempt (``..._backend_duration_seconds``), all with the
  buckets :data:`DURATION_BUCKETS`; counters of requests by model, device and end state,
  resubmissions, back-offs, batches, cache hits/misses/evictions, controller decisions;
  gauges of the queue and of the requests in flight per device.  A device is named the same
  way on every series that names one: ``device="<node>/<index>"`` (``n1/0``), or
  ``device="cache"`` (answered from the response cache) or ``device="none"`` (no device
  answered: failed, refused, abandoned or lost before an answer) -- never empty, so series
  of different families join on ``(model, device)``.  A model removed from the catalog has
  its series dropped (:meth:`Metrics.forget`).  Beside them each scrape carries
  ``wirekit_build_info`` and prometheus_client's standard ``process_*``, ``python_info`` and
  ``python_gc_*`` families.  Every replica on a shared
  store exports its own (Prometheus' ``instance`` label tells them apart): a dashboard sums
  them, ``sum by (le, model) (rate(..._bucket[5m]))``, and nothing store-wide is exported
  there, so nothing is counted twice.  They are recorded through :meth:`Metrics.finished`,
  :meth:`Metrics.lane_answered`, :meth:`Metrics.waited` and :meth:`Metrics.backend_time`,
  which the general path and both twins of the MIP lane call.
* **The store's** (``/stats``' per-model ``requests``, ``queue``, ``statuses`` and
  ``response_time``; ``wirekit serve stats``): :class:`ModelStats`, started from the store
  at start-up on the embedded store (so they describe the whole file, previous runs
  included) and computed with SQL from the store on a shared PostgreSQL store (every
  replica's requests; this replica's own under ``"local"``).  :func:`stats_from_store`
  computes the same figures from a store: the two agree, which the tests check.

The controller needs figures over a recent window rather than since the start:
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

``/stats``' ``latency`` and ``rate`` (per model and per device) are read from the same
histograms as ``/metrics``, over the last :data:`STATS_WINDOW` seconds
(:class:`HistogramHistory`): the quantiles are interpolated within a bucket as Prometheus'
``histogram_quantile`` does, so ``/stats`` says what a Prometheus query over the same
window says.
"""

from __future__ import annotations

import functools
import math
import sqlite3
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..record.storedb import ABANDONED, LOST, OK, QUEUED, StoreDB, as_db


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

    def finished(self, status: str, n: int, total: float, lo: float, hi: float) -> None:
        """``n`` requests finished with ``status``, their response times summing to
        ``total``, the shortest ``lo`` and the longest ``hi`` (the one way a model's
        figures count an end: a single request is ``n`` = 1)."""
        self.queue -= n
        self.statuses[status] = self.statuses.get(status, 0) + n
        if status == OK:
            self.count += n
            self.total += total
            if lo < self.min:
                self.min = lo
            if hi > self.max:
                self.max = hi
            if self.recent is not None:
                self.recent.answered_ok(n, total, lo, hi)
        elif self.recent is not None and status != ABANDONED:  # a client gone: no one's error
            self.recent.failed(n)

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


#: the upper bounds (seconds) of the buckets of every duration histogram, and +Inf: suited
#: to 0.5 ms .. 30 s, about 2 to 2.5 times apart (the same list on every replica, so that
#: their buckets add up)
DURATION_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
)  # fmt: skip
_LE = [*(repr(b) for b in DURATION_BUCKETS), "+Inf"]
#: seconds of history ``/stats`` reads its ``latency`` and ``rate`` over
STATS_WINDOW = 60.0
#: the ``device`` label of a request no device answered: it failed (no attempt succeeded),
#: was refused, or was ended ``lost`` or ``abandoned`` before any device answered it
NO_DEVICE = "none"
#: the ``device`` label of a request answered from the response cache (no device took it);
#: also the device key the MIP lane and :meth:`Metrics.finished` pass for it
CACHE_DEVICE = "cache"
_CACHE = CACHE_DEVICE

#: the ``door`` label: the front door a request came in by -- the MIP front door (its lane
#: included), the HTTP door's JSON ``:predict``, Clipper's query frontend, TF Serving's REST
#: API, the Open Inference Protocol over REST and over gRPC
DOOR_MIP = "mip"
DOOR_HTTP = "http"
DOOR_CLIPPER = "clipper"
DOOR_TFSERVING = "tfserving"
DOOR_OIP_REST = "oip-rest"
DOOR_OIP_GRPC = "oip-grpc"
#: every value of the ``door`` label a door passes (:meth:`Metrics.finished`)
DOORS: tuple[str, ...] = (
    DOOR_MIP, DOOR_HTTP, DOOR_CLIPPER, DOOR_TFSERVING, DOOR_OIP_REST, DOOR_OIP_GRPC
)  # fmt: skip
#: the door label of requests no door of this process took (``lost``: another process's)
NO_DOOR = ""

#: every series ``/metrics`` exports: name -> (type, labels, what it is); the README's table
#: and the tests follow it
METRIC_NAMES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "wirekit_serve_requests_total": (
        "counter",
        ("model", "device", "door", "state"),
        "Requests finished, by model, device that answered, front door they came in by"
        " and end state (ok, error, failed, abandoned, lost)",
    ),
    "wirekit_serve_request_duration_seconds": (
        "histogram",
        ("model", "device", "door"),
        "Response time: arrival to answer, every end state, by the front door it came in by",
    ),
    "wirekit_serve_queue_duration_seconds": (
        "histogram",
        ("model",),
        "Time a request waited in the dispatcher before it was first sent to a backend",
    ),
    "wirekit_serve_backend_duration_seconds": (
        "histogram",
        ("model", "device"),
        "Time at the backend per attempt: sent to answered (or failed, or timed out)",
    ),
    "wirekit_serve_resubmissions_total": (
        "counter",
        ("model",),
        "Attempts after the first (a device failed or timed out)",
    ),
    "wirekit_serve_backoffs_total": (
        "counter",
        ("model", "device"),
        "Times a device was taken out of rotation after a failure",
    ),
    "wirekit_serve_batches_total": (
        "counter",
        ("model", "device"),
        "Joined batches sent (adaptive batching)",
    ),
    "wirekit_serve_batch_retries_total": (
        "counter",
        ("model", "device"),
        "Joined batches whose requests were sent again one by one",
    ),
    "wirekit_serve_lane_requests_total": (
        "counter",
        ("model",),
        "Requests the MIP lane took (the fast path)",
    ),
    "wirekit_serve_cache_hits_total": ("counter", ("model",), "Response cache hits"),
    "wirekit_serve_cache_misses_total": ("counter", ("model",), "Response cache misses"),
    "wirekit_serve_cache_evictions_total": (
        "counter",
        (),
        "Responses dropped from the cache to stay within its bounds",
    ),
    "wirekit_serve_cache_entries": ("gauge", (), "Responses in the cache"),
    "wirekit_serve_cache_size_bytes": ("gauge", (), "Bytes of the responses in the cache"),
    "wirekit_serve_controller_decisions_total": (
        "counter",
        ("model", "outcome"),
        "Quota decisions of the controller (and operators' through it), by outcome",
    ),
    "wirekit_serve_in_flight": (
        "gauge",
        ("model", "device"),
        "Requests sent to a device and not answered yet",
    ),
    "wirekit_serve_queue_length": (
        "gauge",
        ("model",),
        "Requests this process took and has not answered yet (waiting or at a backend)",
    ),
    "wirekit_serve_quota": (
        "gauge",
        ("model", "device", "device_type"),
        "Share of a device given to a model (the models metadata, the controller's)",
    ),
    "wirekit_serve_response_time_target_seconds": (
        "gauge",
        ("model",),
        "The controller's response-time target of a model (when it has one)",
    ),
    "wirekit_serve_devices_backed_off": (
        "gauge",
        (),
        "Devices out of rotation after a failure, now",
    ),
    "wirekit_serve_ready": ("gauge", (), "1 when this process can serve (what /readyz says)"),
    "wirekit_serve_http_bad_requests_total": (
        "counter",
        (),
        "Malformed HTTP requests the HTTP door refused (logged once per burst, not each)",
    ),
    "wirekit_serve_refused_total": (
        "counter",
        ("reason",),
        "Requests refused before they were sent anywhere, by reason (journal: their arrival"
        " could not be journaled, e.g. a full disk; logged once per burst, not each)",
    ),
    "wirekit_build_info": (
        "gauge",
        ("version", "python", "compiled"),
        "Always 1: the wirekit version, the Python version and whether the compiled twins"
        ' are in use (compiled="true") or the pure-Python ones',
    ),
    "wirekit_serve_store_backlog": (
        "gauge",
        (),
        "Requests journaled but not yet in the store (a database outage being caught up)",
    ),
}


class Histogram:
    """Counts of observations per bucket of :data:`DURATION_BUCKETS` (the last: above the
    last bound) and their sum: one ``bisect`` and two additions per observation."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(DURATION_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float, n: int = 1) -> None:
        """``n`` observations of ``seconds`` each (below 0 -- a clock step -- counts as 0)."""
        if seconds < 0.0:
            seconds = 0.0
        self.counts[bisect_left(DURATION_BUCKETS, seconds)] += n
        self.sum += seconds * n

    def observe_each(self, times: Iterable[float]) -> None:
        """One observation of each of ``times`` (what :meth:`observe` does for each, in one
        call: the MIP lane's backend times of one flush)."""
        counts = self.counts
        total = self.sum
        for seconds in times:
            if seconds < 0.0:
                seconds = 0.0
            counts[bisect_left(DURATION_BUCKETS, seconds)] += 1
            total += seconds
        self.sum = total

    @property
    def count(self) -> int:
        return sum(self.counts)

    def copy(self) -> Histogram:
        h = Histogram()
        h.counts = list(self.counts)
        h.sum = self.sum
        return h

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(le, observations <= le), ...]`` as the exposition writes them."""
        out = []
        seen = 0
        for le, n in zip(_LE, self.counts, strict=True):
            seen += n
            out.append((le, seen))
        return out


def quantile(q: float, counts: list[int]) -> float | None:
    """The ``q`` quantile of per-bucket ``counts`` (of :data:`DURATION_BUCKETS`),
    interpolated linearly within its bucket as Prometheus' ``histogram_quantile`` does (the
    first bucket from 0; the +Inf bucket answers the last bound); None without data."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i == len(DURATION_BUCKETS):
                return DURATION_BUCKETS[-1]
            lo = DURATION_BUCKETS[i - 1] if i else 0.0
            hi = DURATION_BUCKETS[i]
            return lo + (hi - lo) * (rank - seen) / n
        seen += n
    return DURATION_BUCKETS[-1]  # pragma: no cover - the counts add up to total


def latency_of(counts: list[int]) -> dict[str, float | None]:
    """``{"p50", "p95", "p99"}`` of per-bucket counts (None each without data)."""
    return {f"p{round(q * 100)}": quantile(q, counts) for q in (0.50, 0.95, 0.99)}


class DoorSeries:
    """One (model, device, door) triple's figures since the process started: its requests
    by end state and the histogram of their response times."""

    __slots__ = ("door", "duration", "states")

    def __init__(self, door: str) -> None:
        self.door = door  #: one of :data:`DOORS`, or :data:`NO_DOOR`
        self.states: dict[str, int] = {}
        self.duration = Histogram()


class DeviceSeries:
    """One (model, device) pair's figures since the process started: the histogram of the
    backend's time, and per front door (:class:`DoorSeries`) its requests by end state and
    the histogram of their response times; :attr:`states` and :attr:`duration` are those of
    every door together."""

    __slots__ = ("backend", "device", "doors", "model")

    def __init__(self, model: str, device: str) -> None:
        self.model = model
        self.device = device  #: ``node/index``, or :data:`NO_DEVICE`
        self.backend = Histogram()
        #: door label -> its figures (made on first use: :meth:`door`)
        self.doors: dict[str, DoorSeries] = {}

    def door(self, door: str) -> DoorSeries:
        """The figures of the requests that came in by ``door`` (made on first use)."""
        series = self.doors.get(door)
        if series is None:
            series = self.doors[door] = DoorSeries(door)
        return series

    @property
    def states(self) -> dict[str, int]:
        """Requests by end state, every door together (a new dict)."""
        out: dict[str, int] = {}
        for series in self.doors.values():
            for state, n in series.states.items():
                out[state] = out.get(state, 0) + n
        return out

    @property
    def duration(self) -> Histogram:
        """The response-time histogram of every door together (a new one)."""
        total = Histogram()
        counts = total.counts
        for series in self.doors.values():
            for i, n in enumerate(series.duration.counts):
                counts[i] += n
            total.sum += series.duration.sum
        return total


def device_label(key: str, model: str) -> str:
    """The ``device`` label (``node/index``) of the row key ``node/index/model``."""
    suffix = "/" + model
    return key[: -len(suffix)] if key.endswith(suffix) else key


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

    def failed(self, n: int = 1, counted: int = 0) -> None:
        """``n`` finished otherwise than ok (``counted``: also count them as requests, as a
        row's window does)."""
        slot = self._slot()
        slot.errors += n
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


class ModelCounters:
    """One model's figures since the process started that are not per device."""

    __slots__ = ("lane_requests", "queue", "resubmissions")

    def __init__(self) -> None:
        #: time waited in the dispatcher before the first send
        self.queue = Histogram()
        self.resubmissions = 0
        self.lane_requests = 0


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
        #: (model, device label) -> its figures since start (the Prometheus series)
        self.series: dict[tuple[str, str], DeviceSeries] = {}
        self._by_key: dict[str, DeviceSeries] = {}  # row key -> its series
        #: door -> {row key: (its device series, their door's)}: what :meth:`lane_answered`
        #: counts on, one lookup per device of a flush (a row key names its model)
        self._door_keys: dict[str, dict[str, tuple[DeviceSeries, DoorSeries]]] = {}
        self._unrouted: dict[str, DeviceSeries] = {}  # model -> its NO_DEVICE series
        self._cached: dict[str, DeviceSeries] = {}  # model -> its CACHE_DEVICE series
        #: models removed from the catalog (:meth:`forget`): their series are not exported
        self.removed: set[str] = set()
        #: model -> its figures since start that are not per device
        self.counters: dict[str, ModelCounters] = {}

    def model_counters(self, model: str) -> ModelCounters:
        """The figures of ``model`` since start that are not per device (made on first use)."""
        counters = self.counters.get(model)
        if counters is None:
            counters = self.counters[model] = ModelCounters()
        return counters

    def device_series(self, model: str, device: str | None) -> DeviceSeries:
        """The series of ``model`` on the row key ``device`` (None: the model's
        :data:`NO_DEVICE` series; ``"cache"``: its :data:`CACHE_DEVICE` one), made on first
        use."""
        if device is None or device == _CACHE:
            unrouted = self._unrouted if device is None else self._cached
            series = unrouted.get(model)
            if series is None:
                label = NO_DEVICE if device is None else CACHE_DEVICE
                series = unrouted[model] = self._new_series(model, label)
            return series
        series = self._by_key.get(device)
        if series is None:
            series = self._by_key[device] = self._new_series(model, device_label(device, model))
        return series

    def _new_series(self, model: str, label: str) -> DeviceSeries:
        series = self.series.get((model, label))
        if series is None:
            series = self.series[(model, label)] = DeviceSeries(model, label)
            self.model_counters(model)
        return series

    def forget(self, model: str) -> None:
        """``model`` was removed from the catalog: drop every series of it (the Prometheus
        figures since start, and the recent window of its rows) and export none of it
        from now on, even for a request of it that ends late; its :class:`ModelStats`
        (``/stats``' figures, the store's) stay.  :meth:`served` undoes it when the model
        is added again (its series then start from 0)."""
        self.removed.add(model)
        self._drop(model)

    def served(self, model: str) -> None:
        """``model`` is (again) in the catalog: its series are exported, from 0 if it was
        removed before (what a request of it that ended after :meth:`forget` counted is
        dropped)."""
        if model in self.removed:
            self._drop(model)
            self.removed.discard(model)
        self.stats(model)
        self.model_counters(model)

    def _drop(self, model: str) -> None:
        """Drop every per-device and per-model series of ``model`` (not its ModelStats)."""
        self.counters.pop(model, None)
        self._unrouted.pop(model, None)
        self._cached.pop(model, None)
        for pair in [k for k in self.series if k[0] == model]:
            del self.series[pair]
        for key in [k for k, s in self._by_key.items() if s.model == model]:
            del self._by_key[key]
        for keys in self._door_keys.values():
            for key in [k for k, (s, _) in keys.items() if s.model == model]:
                del keys[key]
        suffix = "/" + model
        for key in [k for k in self.rows if k.endswith(suffix)]:
            del self.rows[key]

    def waited(self, model: str, seconds: float) -> None:
        """A request of ``model`` was sent to a backend for the first time, ``seconds``
        after it arrived."""
        self.model_counters(model).queue.observe(seconds)

    def backend_time(self, model: str, device: str, seconds: float, n: int = 1) -> None:
        """``n`` requests of ``model`` sent to the row ``device`` (its key) together came
        back -- answered, failed or timed out -- ``seconds`` after they were sent."""
        self.device_series(model, device).backend.observe(seconds, n)

    def resubmitted(self, model: str) -> None:
        """A request of ``model`` is tried again (an attempt after the first)."""
        self.model_counters(model).resubmissions += 1

    def lane_answered(
        self,
        model: str,
        t_out: float,
        answers: list[tuple[Any, ...]],
        total: float,
        lo: float,
        hi: float,
        backend: list[float] | None = None,
        by_row: dict[str, list[Any]] | None = None,
        stats: ModelStats | None = None,
        door: str = DOOR_MIP,
    ) -> None:
        """The MIP lane (of the front door ``door``) answered ``answers`` ok at ``t_out``:
        each ``(id, device, t_in, ...)`` (device a row key, or ``"cache"``), their response
        times summing to ``total``, from ``lo`` to ``hi``; ``backend`` the backend time of
        each that is not from the cache, in order (its queue time is 0: the lane sends a
        request in the pass it reads it); ``by_row`` the same figures per row key
        (``[n, total, lo, hi]``, with a window only).  Counted as :meth:`finished` counts
        one request, a group at a time: the answers of one device and one read share their
        response time."""
        (stats or self.stats(model)).finished(OK, len(answers), total, lo, hi)
        times = backend or ()
        sent = 0
        start = 0
        n = len(answers)
        keys = self._door_keys.get(door)
        if keys is None:
            keys = self._door_keys[door] = {}
        while start < n:  # runs of one device and one read
            device, t_in = answers[start][1], answers[start][2]
            stop = start + 1
            while stop < n and answers[stop][1] is device and answers[stop][2] is t_in:
                stop += 1
            pair = keys.get(device)
            if pair is None:
                series = self.device_series(model, device)
                pair = (series, series.door(door))
                if device != _CACHE:  # "cache" is every model's: not a row key
                    keys[device] = pair
            series = pair[0]
            self._count(pair[1], OK, t_out - t_in, stop - start)
            if device != _CACHE and sent < len(times):
                took = times[sent : sent + stop - start]
                series.backend.observe_each(took)
                sent += len(took)
            start = stop
        if sent:
            self.model_counters(model).queue.observe(0.0, sent)  # waited 0 s each
        if by_row:
            self.rows_answered(by_row)

    @staticmethod
    def _count(series: DoorSeries, status: str, seconds: float, n: int) -> None:
        """``n`` requests of ``series`` ended with ``status`` after ``seconds`` each."""
        series.states[status] = series.states.get(status, 0) + n
        series.duration.observe(seconds, n)

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
        self,
        model: str,
        status: str,
        response_time: float,
        device: str | None = None,
        door: str = DOOR_HTTP,
    ) -> None:
        """A request of ``model`` that came in by ``door`` (one of :data:`DOORS`) finished
        with ``status`` after ``response_time`` seconds, answered by the row ``device`` (its
        key; None or ``"cache"``: no row): the batched accounting (:meth:`lane_answered`'s)
        with n = 1."""
        rt = response_time
        s = self.stats(model)
        s.finished(status, 1, rt, rt, rt)
        self._count(self.device_series(model, device).door(door), status, rt, 1)
        if s.recent is not None and device is not None and device != _CACHE:
            self._row_finished(device, status, 1, rt, rt, rt)

    def _row_finished(
        self, key: str, status: str, n: int, total: float, lo: float, hi: float
    ) -> None:
        """``n`` requests the row ``key`` answered ended with ``status`` (its window)."""
        if status == OK:
            self.row(key).answered_ok(n, total, lo, hi, n)
        elif status != ABANDONED:
            self.row(key).failed(n, n)

    def ended_lost(self, model: str, n: int) -> None:
        """``n`` requests of ``model`` another process took were ended ``lost`` by this one:
        the rows a previous run of this replica left queued (at its start), or, by the
        leader of a shared store, those of a replica whose lease expired.  Counted in
        ``wirekit_serve_requests_total`` (state ``lost``, no device) and nowhere else: they
        were in no queue of this process and have no response time."""
        states = self.device_series(model, None).door(NO_DOOR).states
        states[LOST] = states.get(LOST, 0) + n

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
            self._row_finished(key, OK, n, total, lo, hi)

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

    def prometheus(self, extra: dict[str, Any] | None = None) -> bytes:
        """The Prometheus text exposition of this process's figures (:data:`METRIC_NAMES`)
        and of ``extra`` -- what the service adds, each key optional: ``cache``
        (:meth:`ResponseCache.stats <wirekit.serve.dispatch.cache.ResponseCache.stats>`),
        ``quotas`` (rows), ``targets`` (model -> seconds), ``backed_off`` (row keys),
        ``backoffs`` / ``in_flight`` ({(model, device label): n}), ``batches`` ({(model,
        device label): [sent, retried]}), ``decisions`` ({(model, outcome): n}), ``ready``
        (bool), ``http_bad_requests`` (int), ``refused`` ({reason: n}), ``store_backlog``
        (int).  Then ``wirekit_build_info`` and the standard ``process_*`` / ``python_*``
        families (:func:`build_info`).  Every series of a model in :attr:`removed` is left
        out."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self, extra or {}))
        return generate_latest(registry) + generate_latest(_standard_registry())


@functools.cache
def _standard_registry() -> Any:
    """A registry of prometheus_client's process, platform and garbage-collector collectors
    (``process_*``: CPU seconds, resident and virtual memory, open and maximum file
    descriptors, start time -- on Linux; ``python_info``; ``python_gc_*``), made once: each
    scrape appends its exposition to wirekit's own families (wirekit keeps no global
    registry, so nothing else registered in the process leaks into ``/metrics``)."""
    from prometheus_client import (
        CollectorRegistry,
        GCCollector,
        PlatformCollector,
        ProcessCollector,
    )

    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


@functools.cache
def build_info() -> tuple[str, str, str]:
    """The ``wirekit_build_info`` labels: ``(version, python, compiled)`` -- wirekit's
    version, the Python version, and ``"true"`` when the compiled twins loaded
    (``wirekit.IMPLEMENTATION`` is ``"fast"``), ``"false"`` on the pure-Python path
    (``WIREKIT_PURE=1``, or the extensions not built)."""
    import platform

    import wirekit

    compiled = wirekit.IMPLEMENTATION == "fast"
    return wirekit.__version__, platform.python_version(), "true" if compiled else "false"


class _Collector:
    """The families of :meth:`Metrics.prometheus`, built at each scrape."""

    def __init__(self, metrics: Metrics, extra: dict[str, Any]) -> None:
        self.metrics = metrics
        self.extra = extra

    def collect(self):
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        kinds = {
            "counter": CounterMetricFamily,
            "gauge": GaugeMetricFamily,
            "histogram": HistogramMetricFamily,
        }

        def family(name: str):
            kind, labels, doc = METRIC_NAMES[name]
            return kinds[kind](name, doc, labels=list(labels))

        m, extra = self.metrics, self.extra
        requests = family("wirekit_serve_requests_total")
        duration = family("wirekit_serve_request_duration_seconds")
        backend = family("wirekit_serve_backend_duration_seconds")
        removed = m.removed
        for (model, device), series in sorted(m.series.items()):
            if model in removed:
                continue
            labels = [_label(model), _label(device)]
            for door, by_door in sorted(series.doors.items()):
                door_labels = [*labels, _label(door)]
                for state, n in sorted(by_door.states.items()):
                    requests.add_metric([*door_labels, _label(state)], n)
                hist = by_door.duration
                if hist.count:
                    duration.add_metric(door_labels, hist.cumulative(), hist.sum)
            if series.backend.count:
                backend.add_metric(labels, series.backend.cumulative(), series.backend.sum)
        queue_wait = family("wirekit_serve_queue_duration_seconds")
        resubmissions = family("wirekit_serve_resubmissions_total")
        lane = family("wirekit_serve_lane_requests_total")
        for model, counters in sorted(m.counters.items()):
            if model in removed:
                continue
            labels = [_label(model)]
            if counters.queue.count:
                queue_wait.add_metric(labels, counters.queue.cumulative(), counters.queue.sum)
            resubmissions.add_metric(labels, counters.resubmissions)
            lane.add_metric(labels, counters.lane_requests)
        queue = family("wirekit_serve_queue_length")
        for model in sorted(m.models):
            if model not in removed:
                queue.add_metric([_label(model)], m.in_flight(model))
        yield from (requests, duration, queue_wait, backend, resubmissions, lane, queue)
        for name, key in (
            ("wirekit_serve_backoffs_total", "backoffs"),
            ("wirekit_serve_in_flight", "in_flight"),
        ):
            if key in extra:
                f = family(name)
                for (model, device), n in sorted(extra[key].items()):
                    if model not in removed:
                        f.add_metric([_label(model), _label(device)], n)
                yield f
        if "batches" in extra:
            sent = family("wirekit_serve_batches_total")
            retried = family("wirekit_serve_batch_retries_total")
            for (model, device), (n_sent, n_retried) in sorted(extra["batches"].items()):
                if model not in removed:
                    sent.add_metric([_label(model), _label(device)], n_sent)
                    retried.add_metric([_label(model), _label(device)], n_retried)
            yield from (sent, retried)
        cache = extra.get("cache")
        if cache:
            hits = family("wirekit_serve_cache_hits_total")
            misses = family("wirekit_serve_cache_misses_total")
            for model, c in sorted(cache.get("models", {}).items()):
                if model not in removed:
                    hits.add_metric([_label(model)], c["hits"])
                    misses.add_metric([_label(model)], c["misses"])
            evictions = family("wirekit_serve_cache_evictions_total")
            evictions.add_metric([], cache["evictions"])
            entries = family("wirekit_serve_cache_entries")
            entries.add_metric([], cache["entries"])
            size = family("wirekit_serve_cache_size_bytes")
            size.add_metric([], cache["bytes"])
            yield from (hits, misses, evictions, entries, size)
        if "decisions" in extra:
            f = family("wirekit_serve_controller_decisions_total")
            for (model, outcome), n in sorted(extra["decisions"].items()):
                if model not in removed:
                    f.add_metric([_label(model), _label(outcome)], n)
            yield f
        if "quotas" in extra:
            f = family("wirekit_serve_quota")
            for q in extra["quotas"]:
                labels = [q["model"], f"{q['node']}/{q['device']}", q["device_type"]]
                f.add_metric([_label(v) for v in labels], q["quota"])
            yield f
        if "targets" in extra:
            f = family("wirekit_serve_response_time_target_seconds")
            for model, seconds in sorted(extra["targets"].items()):
                f.add_metric([_label(model)], seconds)
            yield f
        if "backed_off" in extra:
            f = family("wirekit_serve_devices_backed_off")
            f.add_metric([], len(extra["backed_off"]))
            yield f
        if "ready" in extra:
            f = family("wirekit_serve_ready")
            f.add_metric([], 1 if extra["ready"] else 0)
            yield f
        if "http_bad_requests" in extra:
            f = family("wirekit_serve_http_bad_requests_total")
            f.add_metric([], extra["http_bad_requests"])
            yield f
        if "refused" in extra:
            f = family("wirekit_serve_refused_total")
            for reason, n in sorted(extra["refused"].items()):
                f.add_metric([reason], n)
            yield f
        if "store_backlog" in extra:
            f = family("wirekit_serve_store_backlog")
            f.add_metric([], extra["store_backlog"])
            yield f
        info = family("wirekit_build_info")
        info.add_metric([_label(v) for v in build_info()], 1)
        yield info


class HistogramHistory:
    """Snapshots of a :class:`Metrics`' histograms, taken at most every ``interval``
    seconds and kept for ``span`` seconds, so that ``/stats`` reads the figures of the
    last ``span`` seconds (the difference between now and the oldest snapshot kept) as a
    Prometheus ``rate()`` over that range would: :meth:`window`."""

    def __init__(
        self,
        metrics: Metrics,
        span: float = STATS_WINDOW,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.span = span
        self.interval = interval
        self.clock = clock
        #: (time, {(model, device): request-duration counts}) oldest first
        self._snapshots: deque[tuple[float, dict[tuple[str, str], list[int]]]] = deque()
        self.take()

    def take(self) -> None:
        """Snapshot the histograms now (called every ``interval`` by the service, and by
        :meth:`window`); drop the snapshots older than the span."""
        now = self.clock()
        snaps = self._snapshots
        if snaps and now - snaps[-1][0] < self.interval:
            return
        snaps.append((now, {k: list(s.duration.counts) for k, s in self.metrics.series.items()}))
        while len(snaps) > 1 and now - snaps[1][0] >= self.span:
            snaps.popleft()

    def forget(self, model: str) -> None:
        """Drop ``model``'s histograms from the snapshots kept (it was removed, or added
        again: its series start from 0)."""
        for _, counts in self._snapshots:
            for key in [k for k in counts if k[0] == model]:
                del counts[key]

    def window(self) -> tuple[float, dict[tuple[str, str], list[int]]]:
        """``(seconds, {(model, device): request-duration counts per bucket})`` over the
        last ``span`` seconds (or since the start when it is younger)."""
        self.take()
        now = self.clock()
        then, old = self._snapshots[0]
        out = {}
        for key, series in self.metrics.series.items():
            before = old.get(key)
            counts = series.duration.counts
            if before is None:
                out[key] = list(counts)
            else:
                out[key] = [a - b for a, b in zip(counts, before, strict=True)]
        return max(now - then, 1e-9), out


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
