"""The controller of ``wirekit serve``: metrics → policy → decisions → catalog and actuator.

Every ``controller.period`` seconds the :class:`Controller` takes a :class:`Snapshot` (each
model's figures over the recent window, from :meth:`Metrics.recent
<wirekit.serve.control.metrics.Metrics.recent>`, each row's -- a model on a device -- from
:meth:`Metrics.recent_rows <wirekit.serve.control.metrics.Metrics.recent_rows>`, and every
row of the catalog with its quota), asks the
policy for :class:`Decision` s and applies them one by one, the decreases first (so that
the share they free is there for the increases):

1. ``catalog.set_quota(node, device, model, new)`` -- routing follows at once through the
   catalog's subscribers (the Router, hence the MIP lane and the compiled paths, which call
   ``Router.choose``).  A change the catalog refuses is recorded as ``refused``.
2. the node's actuator -- ``set_cpu_share(node, model, share)`` for a CPU row (``share``: the
   model's CPU share on that node after the change) or ``set_gpus(node, model, count)`` for a
   GPU row -- in a worker thread, so a slow command never stalls the event loop, within the
   actuator's timeout.
3. When the actuator fails (raises, or runs out of time) the quota is **rolled back** to the
   old value: the catalog keeps describing what the node really has.  The decision is
   recorded as ``failed`` with the error.
4. The decision, its reason and the metrics it saw go into the store's ``decisions`` table,
   the log (``wirekit.serve.controller``), the list :meth:`Controller.state` returns (the
   JSON of ``GET /controller``).

A policy that raises is logged and the period skipped: nothing a policy or an actuator does
stops the loop or the dispatcher.

The built-in policy, :class:`TargetPolicy`, is described in its docstring; another one is named
``module:Class`` in ``controller.policy`` and implements :class:`Policy`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from wirekit._callables import CallableLoadError, load_callable

from ..config import ControllerConfig, DeviceRow
from ..logs import serve_logger
from ..record.decisions import CONTROLLER, QUOTA
from .actuators import Actuator
from .catalog import Catalog
from .metrics import RecentStats

log = serve_logger("wirekit.serve.controller")

#: decisions kept for ``GET /controller`` (the store keeps them all)
LAST_DECISIONS = 100
#: how a decision ended: applied (catalog and actuator), refused (the quota was not valid),
#: failed (the actuator failed: rolled back)
APPLIED, REFUSED, FAILED = "applied", "refused", "failed"
DECISION_OUTCOMES = (APPLIED, REFUSED, FAILED)
_EPS = 1e-9


# --- what a policy sees and says ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowQuota:
    """One row of the catalog as the policy sees it: a model on a device of a node."""

    node: str
    device: int
    device_type: str  #: "CPU" or "GPU"
    model: str
    quota: float

    @property
    def key(self) -> str:
        """``node/device/model``: the row's key in :attr:`Snapshot.rows_recent`."""
        return f"{self.node}/{self.device}/{self.model}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the policy decides on: the time (the controller's clock, seconds), each model's
    figures over the window, every row of the catalog (quota 0 included), each row's own
    figures over the window (``rows_recent[row.key]``: the requests that device finished
    for that model; ``queue`` None; a row that finished none may be missing), and each
    model's target (``targets``, the catalog's: models added at run time included)."""

    time: float
    models: Mapping[str, RecentStats]
    rows: tuple[RowQuota, ...]
    rows_recent: Mapping[str, RecentStats] = field(default_factory=dict)
    #: each model's response time target, seconds, as the catalog has it now (models
    #: without one are absent); None: not given (a snapshot made by hand), the policy's
    #: config's ``targets`` then
    targets: Mapping[str, float] | None = None

    def device_total(self, node: str, device: int) -> float:
        """The sum of the quotas on one device."""
        return sum(r.quota for r in self.rows if r.node == node and r.device == device)


@dataclass(frozen=True, slots=True)
class Decision:
    """Set the quota of ``model`` on ``device`` of ``node`` from ``old`` to ``new``, because
    of ``reason``; ``metrics`` is what the policy saw (stored with the decision); ``by``:
    who decided (the controller, or an operator through the admin API:
    :func:`wirekit.serve.record.decisions.operator`)."""

    node: str
    device: int
    device_type: str
    model: str
    old: float
    new: float
    reason: str
    metrics: Mapping[str, Any] = field(default_factory=dict)
    by: str = CONTROLLER


def set_decided_quota(
    catalog: Catalog, d: Decision, can_serve: Callable[[DeviceRow], bool]
) -> str | None:
    """Carry ``d`` out in ``catalog``: None, or why it was refused -- by the catalog, or
    because a share would go to a row with no backend to serve it (``can_serve``).  The
    one catalog step of every decision, the controller's and an operator's."""
    try:
        row = next(
            (r for r in catalog.rows(d.model) if (r.node, r.device) == (d.node, d.device)), None
        )
        if d.old == 0 and d.new > 0 and row is not None and not can_serve(row):
            raise ValueError(f"{row.key}: no backend to give a share to (no port configured)")
        catalog.set_quota(d.node, d.device, d.model, d.new)
    except (ValueError, KeyError) as exc:
        return str(exc)
    return None


def catalog_targets(catalog: Catalog) -> dict[str, float]:
    """Each model of ``catalog`` that has a response time target -> the target, seconds
    (what :attr:`Snapshot.targets` holds and ``GET /controller`` shows)."""
    out = {}
    for name in catalog.models():
        target = catalog.model(name).target
        if target is not None:
            out[name] = target
    return out


def decision_record(d: Decision, status: str, error: str | None, time: float) -> dict[str, Any]:
    """A decision as stored, logged and shown by ``GET /controller`` and the admin API
    (the columns are :mod:`wirekit.serve.record.decisions`'; a quota's ``before`` and
    ``after`` are its ``old`` and ``new``)."""
    return {
        "time": time,
        "node": d.node,
        "device": d.device,
        "device_type": d.device_type,
        "model": d.model,
        "old": d.old,
        "new": d.new,
        "status": status,
        "reason": d.reason,
        "error": error,
        "metrics": dict(d.metrics),
        "by": d.by,
        "kind": QUOTA,
        "before": d.old,
        "after": d.new,
    }


@runtime_checkable
class Policy(Protocol):
    """A control policy: ``controller.policy = "module:Class"``.

    The class is built once as ``Class(config)`` (the :class:`ControllerConfig`; its
    ``options`` holds the ``controller.options`` table, free for a custom policy) and asked
    once per period.  It returns the changes it wants; an empty list is "leave everything".
    It may keep state between periods (the built-in one keeps its recommendations and the
    time of each row's last change).  The controller checks nothing a policy says beyond what
    the catalog refuses (a share outside 0..1, CPU shares above 1 on a device, a GPU share
    other than 0 or 1), so a policy also owns its steps, floors and flapping.
    """

    def decide(self, snapshot: Snapshot) -> list[Decision]: ...

    # Optional: ``resume(changed)`` -- the time of each row's last change, ``(node, device,
    # model)`` -> time on the snapshots' clock, taken over from a previous leader
    # (:meth:`TargetPolicy.resume`; :meth:`Controller.resume` calls it when it exists).


# --- the built-in policy --------------------------------------------------------------------


class TargetPolicy:
    """Hold each model's response time to its target, without flapping.

    The targets are the catalog's (:attr:`Snapshot.targets`): seeded by
    ``controller.targets`` (or a model's ``target`` key), given to a model added at run time
    with it, changed with ``PATCH /admin/models/{name}``.  A snapshot without them (made by
    hand) is judged on ``config.targets``.

    Per period, per row (a model on a device) of a model with a target: ``value`` is the
    ``metric`` (``p95`` by default: the 95th percentile of the response times of the requests
    answered ok in the window) of the row's **own** figures (the requests that device
    answered for that model, ``Snapshot.rows_recent``) when the row answered at least
    ``min_requests`` in the window, else of the **model's** figures (all its devices), and
    ``ratio = value / target``: a slow device of a model gets share on that device, not on
    the model's fast one.  A model answered fewer than ``min_requests`` times in the window
    has no figure: its rows are *idle*.  A row is **over** when ``ratio > 1 + tolerance``,
    **under** when ``ratio < 1 - tolerance`` or idle, **in band** otherwise.  Models without
    a target are never changed.  The decision's metrics say which figure was used
    (``"source": "device"`` or ``"model"``) and hold both.

    CPU rows (per device, the shares of the models on it never sum above 1):

    * an over model is recommended ``share × ratio`` (what would bring it to target if time
      scales with the inverse of the share), at most ``max_step`` more than now;
    * the extra comes from the device's free share first, then from under models on the same
      device (each recommended at most ``max_step`` less, never below ``min_share``, and never
      below ``share × ratio / (1 - tolerance/2)``, the share that keeps a measured model
      inside its band: a donor is not pushed over its own target);
    * when no model on a device is over, an under model above its *home* share (its quota
      when the controller first saw the row, i.e. the config's) is recommended at most
      ``max_step`` closer to home (and, measured, not below the share that keeps it in its
      band: a loaded model that met its target keeps what it needs), and a model below home
      gets back up to home from the free share: with the load gone, the shares drift back to
      the config's;
    * rows at quota 0 stay 0 (the config disabled the pair).

    GPU rows move whole: an over model gets a GPU of its rows at quota 0 when nobody holds
    that GPU; an under model releases a GPU it holds beyond its home count.

    Against flapping, what Kubernetes' HorizontalPodAutoscaler does and more:

    * a **tolerance band** (HPA: 0.1) -- no change while the ratio is within 1 ± tolerance;
    * a **scale-down stabilization window** (HPA: 300 s by default) -- a decrease goes only
      as low as the *highest* recommendation for that row in the last ``stabilization``
      seconds, so one quiet period never takes share away;
    * a **cooldown** per row after every change it asked for, up or down, applied or not
      (the HPA has none for scale-up
      by default: its scale-up follows every period) -- the effect of a change is measured
      before the next one;
    * **bounded steps** (``max_step`` of a device per decision; HPA's scaling policies);
    * a **minimum sample** (``min_requests``) below which a model's figure is not trusted
      (HPA ignores pods without metrics);
    * a shortfall is only taken from models that are themselves under target, so two loaded
      models never trade share back and forth.
    """

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.targets = dict(config.targets)
        self._home: dict[tuple[str, int, str], float] = {}
        self._changed: dict[tuple[str, int, str], float] = {}  # row -> time of last change
        #: row -> (time, recommended share) over the stabilization window
        self._recs: dict[tuple[str, int, str], deque[tuple[float, float]]] = {}
        self._first_seen: dict[tuple[str, int, str], float] = {}

    # the state of a model this period: ("over" | "under" | "band", ratio or None)
    def _state(self, stats: RecentStats | None, target: float) -> tuple[str, float | None]:
        cfg = self.config
        if stats is None or stats.ok < cfg.min_requests:
            return "under", None
        value = getattr(stats, cfg.metric)
        if value is None:
            return "under", None
        ratio = value / target
        if ratio > 1 + cfg.tolerance:
            return "over", ratio
        if ratio < 1 - cfg.tolerance:
            return "under", ratio
        return "band", ratio

    def _stable(self, key: tuple[str, int, str], now: float, rec: float, current: float) -> float:
        """Record ``rec`` and return the share it may move to now: an increase at once, a
        decrease only to the highest recommendation of the stabilization window."""
        recs = self._recs.setdefault(key, deque())
        recs.append((now, rec))
        horizon = now - self.config.stabilization
        while recs and recs[0][0] < horizon - _EPS:
            recs.popleft()
        if rec >= current:
            return rec
        if now - self._first_seen.get(key, now) < self.config.stabilization - _EPS:
            return current  # not watched for a whole window yet
        return min(current, max(r for _, r in recs))

    def resume(self, changed: Mapping[tuple[str, int, str], float]) -> None:
        """Take over the time of each row's last change (``(node, device, model)`` -> time
        on the snapshots' clock), for instance a previous leader's: each row keeps its
        cooldown across a change of leader.  The later of that time and this policy's own
        is kept."""
        for key, at in changed.items():
            self._changed[key] = max(at, self._changed.get(key, at))

    def _cooling(self, key: tuple[str, int, str], now: float) -> bool:
        changed = self._changed.get(key)
        return changed is not None and now - changed < self.config.cooldown - _EPS

    def _figure(self, snapshot: Snapshot, row: RowQuota) -> tuple[RecentStats | None, str]:
        """The figures a row is judged on: its own with at least ``min_requests`` answered
        ok in the window, else its model's; and which (``"device"`` or ``"model"``)."""
        own = snapshot.rows_recent.get(row.key)
        if own is not None and own.ok >= self.config.min_requests:
            return own, "device"
        return snapshot.models.get(row.model), "model"

    def decide(self, snapshot: Snapshot) -> list[Decision]:
        if snapshot.targets is not None:  # the catalog's, models added at run time included
            self.targets = dict(snapshot.targets)
        now = snapshot.time
        present = {(r.node, r.device, r.model) for r in snapshot.rows}
        for state in (self._home, self._changed, self._recs, self._first_seen):
            for key in [k for k in state if k not in present]:  # a model removed
                del state[key]  # (re-added, it starts afresh: its new quota is its home)
        for r in snapshot.rows:
            key = (r.node, r.device, r.model)
            self._home.setdefault(key, r.quota)
            self._first_seen.setdefault(key, now)
        decisions: list[Decision] = []
        devices: dict[tuple[str, int], list[RowQuota]] = {}
        for r in snapshot.rows:
            devices.setdefault((r.node, r.device), []).append(r)
        for (node, device), rows in sorted(devices.items()):
            # each model's state on this device (a model has one row per device)
            states: dict[str, tuple[str, float | None]] = {}
            for r in rows:
                if r.model in self.targets:
                    states[r.model] = self._state(
                        self._figure(snapshot, r)[0], self.targets[r.model]
                    )
            if rows[0].device_type == "GPU":
                decisions.extend(self._gpu(node, device, rows, states, snapshot))
            else:
                decisions.extend(self._cpu(node, device, rows, states, snapshot))
        for d in decisions:
            self._changed[(d.node, d.device, d.model)] = now
        return decisions

    def _metrics(self, snapshot: Snapshot, row: RowQuota, ratio: float | None) -> dict[str, Any]:
        stats = snapshot.models.get(row.model)
        own = snapshot.rows_recent.get(row.key)
        return {
            "metric": self.config.metric,
            "target": self.targets.get(row.model),
            "ratio": ratio,
            "source": self._figure(snapshot, row)[1],
            "window": stats.as_dict() if stats is not None else None,
            "device_window": own.as_dict() if own is not None else None,
        }

    def _cpu(self, node, device, rows, states, snapshot) -> list[Decision]:
        cfg = self.config
        now = snapshot.time
        live = [r for r in rows if r.model in self.targets and r.quota > 0]
        free = 1.0 - sum(r.quota for r in rows)
        over = sorted(
            (r for r in live if states[r.model][0] == "over"),
            key=lambda r: -(states[r.model][1] or 0.0),
        )
        # What the over models ask for, beyond what is free.
        want = {}
        for r in over:
            ratio = states[r.model][1] or 1.0
            up = min(cfg.max_step, max(r.quota * (ratio - 1), 0.01), 1.0 - r.quota)
            want[r.model] = max(up, 0.0)
        shortfall = max(0.0, sum(want.values()) - max(free, 0.0))
        recs: dict[str, tuple[float, str]] = {}
        for r in live:
            state, ratio = states[r.model]
            home = self._home[(node, device, r.model)]
            # The least share that keeps a model with a figure inside the band (None: idle).
            keep = None if ratio is None else r.quota * ratio / (1 - cfg.tolerance / 2)
            if state == "over":
                recs[r.model] = (r.quota + want[r.model], "over target")
            elif state == "under" and over and shortfall > _EPS:
                low = max(cfg.min_share, r.quota - cfg.max_step, keep or 0.0)
                recs[r.model] = (min(r.quota, low), "under target, share given")
            elif state == "under" and not over and r.quota > home + _EPS:
                low = max(home, r.quota - cfg.max_step, keep or 0.0)
                recs[r.model] = (min(r.quota, low), "back toward home share")
            elif state != "over" and not over and r.quota < home - _EPS:
                recs[r.model] = (min(home, r.quota + cfg.max_step), "back toward home share")
            else:
                recs[r.model] = (r.quota, "")
        # Decreases first (stabilized, cooled down), then increases from what is free.
        out: list[Decision] = []
        moves: dict[str, float] = {}
        for r in live:
            rec, _why = recs[r.model]
            key = (node, device, r.model)
            allowed = self._stable(key, now, rec, r.quota)
            if allowed < r.quota - _EPS and not self._cooling(key, now):
                moves[r.model] = max(allowed, cfg.min_share)
        free += sum(r.quota - moves[r.model] for r in live if r.model in moves)
        ups = [r for r in over] + [
            r for r in live if r not in over and recs[r.model][0] > r.quota + _EPS
        ]
        for r in ups:
            key = (node, device, r.model)
            if self._cooling(key, now):
                continue
            up = min(recs[r.model][0] - r.quota, free)
            if up > 0.005:
                moves[r.model] = r.quota + up
                free -= up
        for r in live:
            if r.model not in moves or abs(moves[r.model] - r.quota) < _EPS:
                continue
            new = round(moves[r.model], 6)
            out.append(
                Decision(
                    node,
                    device,
                    r.device_type,
                    r.model,
                    r.quota,
                    new,
                    recs[r.model][1] or "share freed",
                    self._metrics(snapshot, r, states[r.model][1]),
                )
            )
        return out

    def _gpu(self, node, device, rows, states, snapshot) -> list[Decision]:
        now = snapshot.time
        holders = [r for r in rows if r.quota > 0]
        out = []
        if not holders:
            # A free GPU: the most loaded over model among its rows gets it.
            cands = [
                r
                for r in rows
                if r.model in self.targets
                and states[r.model][0] == "over"
                and not self._cooling((node, device, r.model), now)
            ]
            if cands:
                r = max(cands, key=lambda r: states[r.model][1] or 0.0)
                out.append(
                    Decision(
                        node,
                        device,
                        "GPU",
                        r.model,
                        0.0,
                        1.0,
                        "over target, a free GPU given",
                        self._metrics(snapshot, r, states[r.model][1]),
                    )
                )
            return out
        for r in holders:
            key = (node, device, r.model)
            if r.model not in self.targets:
                continue
            home = self._home[key]
            under = states[r.model][0] == "under"
            rec = 0.0 if under and home == 0 else 1.0
            if self._stable(key, now, rec, r.quota) == 0.0 and not self._cooling(key, now):
                out.append(
                    Decision(
                        node,
                        device,
                        "GPU",
                        r.model,
                        1.0,
                        0.0,
                        "under target, a GPU beyond its home count released",
                        self._metrics(snapshot, r, states[r.model][1]),
                    )
                )
        return out


# --- loading a policy -----------------------------------------------------------------------


def load_policy(spec: str, config: ControllerConfig) -> Policy:
    """Build the policy named ``module:Class`` (raises ``ValueError`` saying what is wrong)."""
    return load_plugin(spec, config, "controller.policy", ("decide",))


def load_plugin(spec: str, argument: Any, where: str, methods: tuple[str, ...]) -> Any:
    """``module:Class(argument)``, checked for ``methods``; ``ValueError`` naming ``where``
    and what is wrong (the module cannot be imported, has no such class, lacks a method)."""
    class_name = spec.partition(":")[2]
    try:
        cls = load_callable(spec)
    except CallableLoadError as exc:
        raise ValueError(f"{where} {spec!r}: {exc}") from None
    try:
        obj = cls(argument)
    except Exception as exc:
        raise ValueError(f"{where} {spec!r}: {class_name}() failed: {exc!r}") from None
    missing = [m for m in methods if not callable(getattr(obj, m, None))]
    if missing:
        raise ValueError(f"{where} {spec!r}: {class_name} has no {missing[0]}()")
    return obj


# --- the loop -------------------------------------------------------------------------------


class Controller:
    """The loop: one :meth:`step` per ``config.period`` seconds while :meth:`run` runs.

    ``catalog`` is the :class:`~wirekit.serve.control.catalog.Catalog` (quotas are read from it and
    changed through ``set_quota``), ``recent`` returns each model's window figures
    (:meth:`Metrics.recent <wirekit.serve.control.metrics.Metrics.recent>`), ``recent_rows``
    each row's (:meth:`Metrics.recent_rows <wirekit.serve.control.metrics.Metrics.recent_rows>`),
    ``store`` the
    :class:`~wirekit.serve.record.store.RequestStore` (``record_decision``; None: not stored).
    """

    def __init__(
        self,
        config: ControllerConfig,
        catalog: Any,
        recent: Callable[[], Mapping[str, RecentStats]],
        actuator: Actuator,
        *,
        store: Any = None,
        recent_rows: Callable[[], Mapping[str, RecentStats]] | None = None,
        policy: Policy | None = None,
        can_serve: Callable[[Any], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.recent = recent
        #: each row's window figures by row key (:meth:`Metrics.recent_rows
        #: <wirekit.serve.control.metrics.Metrics.recent_rows>`; None: none)
        self.recent_rows = recent_rows
        self.actuator = actuator
        self.store = store
        self.policy = policy if policy is not None else load_policy(config.policy, config)
        #: whether a row (a DeviceRow) has a backend that can take requests: a row at quota
        #: 0 without one is never given a share (default: every row can)
        self.can_serve = can_serve or (lambda _row: True)
        self.clock = clock
        self.wall = wall
        self.periods = 0  #: periods run
        self.failures = 0  #: decisions whose actuator failed (rolled back)
        self.last: deque[dict[str, Any]] = deque(maxlen=LAST_DECISIONS)
        #: (model, status) -> decisions applied so far with that status
        self.outcomes: dict[tuple[str, str], int] = {}

    def snapshot(self) -> Snapshot:
        catalog = self.catalog
        rows = tuple(
            RowQuota(r.node, r.device, r.device_type, r.model, r.quota) for r in catalog.rows()
        )
        by_row = dict(self.recent_rows()) if self.recent_rows is not None else {}
        targets = catalog_targets(catalog)
        return Snapshot(self.clock(), dict(self.recent()), rows, by_row, targets)

    async def sync(self) -> None:
        """Tell the actuator every (node, model)'s current CPU share and GPU count, so the
        nodes start from what the catalog says (a failure is logged; the loop goes on)."""
        pairs = sorted({(r.node, r.model) for r in self.catalog.rows()})
        for node, model in pairs:
            rows = [r for r in self.catalog.rows(model) if r.node == node]
            for device_type in sorted({r.device_type for r in rows}):
                d = Decision(node, -1, device_type, model, 0.0, 0.0, "start-up sync")
                try:
                    await asyncio.wait_for(
                        asyncio.to_thread(self._actuate, d), self.actuator_timeout()
                    )
                except Exception as exc:
                    log.warning(
                        "controller: start-up sync of %s/%s %s failed: %s",
                        node,
                        model,
                        device_type,
                        str(exc) or type(exc).__name__,
                    )

    def resume(self, last: Mapping[tuple[str, int, str], float]) -> None:
        """Hand the policy (when it has a ``resume`` method) the wall-clock time of each
        row's last decision (``(node, device, model)`` -> unix time), for instance from
        the store's decisions when this replica becomes the leader: the rows keep their
        cooldown across a change of leader."""
        resume = getattr(self.policy, "resume", None)
        if resume is None or not last:
            return
        offset = self.clock() - self.wall()  # wall time -> the snapshots' clock
        resume({key: at + offset for key, at in last.items()})

    async def run(self) -> None:
        """Sync the nodes (:meth:`sync`), then step every period until cancelled."""
        await self.sync()
        while True:
            await asyncio.sleep(self.config.period)
            await self.step()

    async def step(self) -> list[dict[str, Any]]:
        """One period: decide and apply; returns the decisions as recorded."""
        self.periods += 1
        try:
            snapshot = self.snapshot()
            decisions = list(self.policy.decide(snapshot))
        except Exception:
            log.exception("controller: the policy failed; period %d skipped", self.periods)
            return []
        # Decreases first: the share they free is what an increase of the same period takes
        # (the catalog refuses a device above 1 at every single step).
        decisions.sort(key=lambda d: d.new > d.old)
        done = []
        for decision in decisions:
            done.append(await self.apply(decision))
        return done

    async def apply(self, d: Decision, *, fenced: bool = True) -> dict[str, Any]:
        """Apply one decision (catalog, then actuator, rolled back if the actuator fails)
        and record it.  ``fenced``: a decision of this controller's policy, stored only
        while this replica leads (on a shared store); ``False`` for an operator's decision
        (``Service.set_quota_doc``), stored from any replica."""
        error = set_decided_quota(self.catalog, d, self.can_serve)
        status = REFUSED if error is not None else APPLIED
        if status == APPLIED:
            try:
                await asyncio.wait_for(asyncio.to_thread(self._actuate, d), self.actuator_timeout())
            except Exception as exc:
                status = FAILED
                error = str(exc) or type(exc).__name__
                if isinstance(exc, asyncio.TimeoutError):
                    error = f"the actuator did not finish in {self.actuator_timeout():g} s"
                self.failures += 1
                try:  # the catalog describes what the node has: the old quota
                    self.catalog.set_quota(d.node, d.device, d.model, d.old)
                except (ValueError, KeyError):  # pragma: no cover - the old quota was valid
                    log.exception("controller: rolling back %s/%s/%s", d.node, d.device, d.model)
        record = decision_record(d, status, error, self.wall())
        self.last.append(record)
        self.outcomes[(d.model, status)] = self.outcomes.get((d.model, status), 0) + 1
        if self.store is not None:
            try:
                await asyncio.to_thread(self.store.record_decision, **record, fenced=fenced)
            except Exception:
                log.exception("controller: the decision could not be stored")
        level = logging.WARNING if status != APPLIED else logging.INFO
        log.log(
            level,
            "controller: %s/%d/%s %s %g -> %g (%s)%s",
            d.node,
            d.device,
            d.model,
            status,
            d.old,
            d.new,
            d.reason,
            f": {error}" if error else "",
        )
        return record

    def remember(self, record: dict[str, Any]) -> None:
        """Show a decision recorded elsewhere -- an operator's model added, removed or set
        (:meth:`wirekit.serve.admin.ModelAdmin.decided`) -- among :meth:`state`'s."""
        self.last.append(record)

    def actuator_timeout(self) -> float:
        """How long one actuator call may take before its decision is failed: the
        actuator's own timeout (``command``) plus a margin, else ``config.actuator.timeout``."""
        return getattr(self.actuator, "timeout", self.config.actuator.timeout) + 5.0

    def _actuate(self, d: Decision) -> None:
        rows = [r for r in self.catalog.rows(d.model) if r.node == d.node]
        if d.device_type == "GPU":
            count = sum(1 for r in rows if r.device_type == "GPU" and r.quota > 0)
            self.actuator.set_gpus(d.node, d.model, count)
        else:
            share = sum(r.quota for r in rows if r.device_type == "CPU")
            self.actuator.set_cpu_share(d.node, d.model, round(share, 6))

    def state(self) -> dict[str, Any]:
        """The JSON of ``GET /controller``."""
        return {
            "enabled": True,
            "period": self.config.period,
            "policy": self.config.policy,
            "actuator": self.config.actuator.kind,
            "periods": self.periods,
            "failures": self.failures,
            "quotas": quota_rows(self.catalog),
            "targets": catalog_targets(self.catalog),
            "decisions": list(self.last),
        }


def quota_rows(catalog: Any) -> list[dict[str, Any]]:
    """Every row of ``catalog`` with its current quota (``GET /controller``, the gauges)."""
    return [
        {
            "node": r.node,
            "device": r.device,
            "device_type": r.device_type,
            "model": r.model,
            "quota": r.quota,
        }
        for r in catalog.rows()
    ]
