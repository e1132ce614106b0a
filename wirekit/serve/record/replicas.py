"""Several ``wirekit serve`` replicas on one PostgreSQL store: one models metadata, one
controller (issue 17).  Used by :class:`~wirekit.serve.service.Service` when the store is a
``postgresql://`` URL; specs/replicas.md says what it guarantees.

* **The models metadata.**  Every change of this replica's
  :class:`~wirekit.serve.control.catalog.Catalog` (a quota set, a model added or removed through its
  admin API or by the controller) is appended to the store's change log
  (:class:`~wirekit.serve.record.pgsync.ChangeLog`), which notifies the others; every replica
  applies the others' changes to its own catalog, in log order, on its event loop -- its
  router, dispatcher and compiled paths follow through the catalog's subscription as for a
  local change.  A replica that starts loads the newest snapshot of the log, then replays
  the changes after it, over the config's models, so every replica describes the same
  models.  Every ``compact_every`` seconds each replica compacts the log (the changes
  older than ``compact_keep`` seconds folded into a snapshot, under an advisory lock:
  one replica's compaction does the work, the others' find none left).
* **The controller acts once.**  Only the replica that holds the lead
  (:class:`~wirekit.serve.record.pgsync.LeaderLock`: a lease of ``store.lease`` seconds on
  the ``leadership`` row, renewed every ``lease_period``, each takeover a new term) runs
  controller periods, on the figures of
  every replica's requests over its window (:meth:`PostgresDB.recent
  <wirekit.serve.record.storedb.PostgresDB.recent>`, read from the store before each period).
  Its quota changes are logged and its decisions stored through the lock, fenced by its
  term: a replica that lost the lead without knowing it (paused past its lease, cut off)
  cannot publish or record a decision (no decision is taken twice); its own catalog is
  then put back to what the log says.  An
  operator's quota change (the admin API) is stored from any replica, not fenced.  A new
  leader hands its policy the time of each row's last decision (the cooldowns carry over).
* **A replica that dies leaves nothing in flight.**  Every replica renews its lease
  (:class:`~wirekit.serve.record.pgsync.ReplicaLease`, :func:`renew_periodically`) every
  ``lease_period`` seconds; every replica polls the lead as often (renewing it when it
  leads), and the one that leads ends the ``queued`` rows of every *other* replica whose
  lease has expired as ``lost`` (:func:`~wirekit.serve.record.pgsync.adopt_expired`) -- so
  they leave every replica's ``/stats`` queue within ``lease`` + ``lease_period`` seconds of
  the death, or of the pause of a replica (the leader included: it is replaced within the
  same bound, and never sweeps itself when it resumes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import time
from typing import Any

from ..config import (
    LIVE_SETTINGS,
    DeviceRow,
    ModelConfig,
    check_name,
    live_settings,
    model_from_fields,
)
from ..control.catalog import CatalogChange
from ..control.metrics import RecentStats
from ..logs import serve_logger
from .pgsync import Change, ChangeLog, LeaderLock, NotLeader, ReplicaLease, adopt_expired
from .storedb import PostgresDB

log = serve_logger()


def model_doc(model: ModelConfig, rows: list[DeviceRow]) -> dict[str, Any]:
    """A model and its rows as JSON-able data (what :func:`model_of` reads back)."""
    return {
        "model": dataclasses.asdict(model),
        "rows": [
            {f.name: getattr(r, f.name) for f in dataclasses.fields(DeviceRow) if f.init}
            for r in rows
        ],
    }


def model_of(doc: dict[str, Any]) -> tuple[ModelConfig, list[DeviceRow]]:
    """:func:`model_doc` read back; its names checked by the config's one rule
    (:func:`~wirekit.serve.config.check_name`: a change another replica logged -- or
    anything else that wrote to the log -- cannot bring in a name this one refuses)."""
    model, rows = model_from_fields(doc["model"]), [DeviceRow(**r) for r in doc["rows"]]
    check_name(model.name, "model.name")
    for k, app in enumerate(model.apps):
        check_name(app, f"model.apps[{k}]")
    for k, row in enumerate(rows):
        check_name(row.node, f"rows[{k}].node")
        check_name(row.model, f"rows[{k}].model")
    return model, rows


def with_settings(model: ModelConfig, doc: dict[str, Any]) -> ModelConfig:
    """``model`` with the live settings of a ``"settings"`` change's ``doc`` (only the
    :data:`~wirekit.serve.config.LIVE_SETTINGS`; any other key is ignored)."""
    settings = doc["settings"]
    return dataclasses.replace(model, **{k: v for k, v in settings.items() if k in LIVE_SETTINGS})


def _settled(entry: dict[str, Any]) -> dict[str, Any]:
    """The ``add`` document of a folded model entry (one with an ``add``) with its later
    ``settings`` in it: the model as it is once both are applied."""
    add: dict[str, Any] = entry["add"]
    settings = entry.get("settings")
    if settings is None:
        return add
    model = {**add["model"], **{k: v for k, v in settings.items() if k in LIVE_SETTINGS}}
    return {**add, "model": model}


class ReplicaSync:
    """The catalog and the controller of one replica, shared through the store (see the
    module docstring).  ``start()`` on the service's loop once it serves; ``close()`` at
    the end."""

    def __init__(
        self,
        service: Any,
        url: str,
        replica: str,
        *,
        retry: float = 0.5,
        compact_every: float = 300.0,
        compact_keep: float = 60.0,
        lease_period: float = 2.0,
        lease: float = 10.0,
    ) -> None:
        self.service = service
        self.catalog = service.catalog
        # the replica's name and this process: a restarted replica replays its own past
        # changes like anyone else's
        self.origin = f"{replica}#{os.getpid():x}-{os.urandom(3).hex()}"
        self.log = ChangeLog(url, self.origin)
        # the lead is a lease as long as the replicas' own, renewed as often (by the sweep's
        # polls): a leader that stops renewing is replaced within lease + lease_period
        self.leader = LeaderLock(
            url,
            lease=lease,
            period=lease_period if 0 < lease_period < lease else None,
            retry=retry,
            name=f"wirekit leader {self.origin}",
            replica=replica,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        # one thread for the log's writes: the changes are appended in the order made
        self._writer = concurrent.futures.ThreadPoolExecutor(1, "wirekit-catalog")
        self._incoming: asyncio.Queue[list[Change]] = asyncio.Queue()
        self._applier: asyncio.Task | None = None
        self._applying = False  # a change from the log is being applied: not published
        self._remote: set[str] = set()  # models being added/removed from the log
        self._deciding = False  # a controller period runs: its changes go via the lock
        self.applied = 0  #: changes of other replicas applied here
        self.ready = asyncio.Event()  #: set once the log so far is applied
        self.url = url
        self._db: PostgresDB | None = None  # the window's queries (the leader's)
        self._recent: dict[str, dict[str, Any]] = {}
        self._recent_rows: dict[str, dict[str, Any]] = {}
        #: seconds between two compactions of the change log by this replica (0: never)
        self.compact_every = compact_every
        #: the changes younger than this (seconds) stay in the log when it is compacted
        self.compact_keep = compact_keep
        self._compactor: asyncio.Task | None = None
        #: seconds between two sweeps of the expired leases (by the leader; 0: never)
        self.lease_period = lease_period
        self.adopted = 0  #: rows this replica ended ``lost`` as the leader
        self._adopter: asyncio.Task | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.catalog.subscribe(self._publish)
        self._applier = asyncio.ensure_future(self._apply_all())
        upto = await asyncio.to_thread(self.log.last)
        self.log.follow(self._from_listener, after=0)
        # the changes logged before this replica started: applied before it says ready.
        # ``log.applied`` reaches ``upto`` once they were handed over (from the listener's
        # thread, with call_soon_threadsafe, so they are on the loop's queue before this
        # task runs again); then wait until the applier is through all of them -- not
        # only until it took them off the queue (a snapshot's models are added with awaits).
        while self.log.applied < upto:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        await self._incoming.join()
        if self.compact_every > 0:
            self._compactor = asyncio.ensure_future(self._compact_periodically())
        if self.lease_period > 0:
            self._adopter = asyncio.ensure_future(self._adopt_periodically())
        self.ready.set()

    async def _adopt_periodically(self) -> None:
        """Every ``lease_period`` seconds: poll the lead (also without a controller: the poll
        renews the leader's lease) and, while leading, end the rows of the other replicas
        whose lease expired ``lost``."""
        while True:
            try:
                if await asyncio.to_thread(self.leader.poll):
                    ended = await asyncio.to_thread(adopt_expired, self.leader, self.origin)
                    self._count_adopted(ended)
            except NotLeader:  # the lead was lost on the way: the next leader sweeps
                pass
            except Exception as exc:  # the store unreachable: the next period tries again
                log.warning("wirekit serve: ending the rows of expired replicas: %s", exc)
            await asyncio.sleep(self.lease_period)

    def _count_adopted(self, ended: list[tuple[str, str, int]]) -> None:
        by_replica: dict[str, int] = {}
        for replica, model, n in ended:
            self.service.metrics.ended_lost(model, n)
            by_replica[replica] = by_replica.get(replica, 0) + n
            self.adopted += n
        for replica, n in sorted(by_replica.items()):
            log.warning(
                "wirekit serve: replica %s's lease expired: %d request(s) it had in flight"
                " ended lost",
                replica,
                n,
            )

    async def _compact_periodically(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.compact_every)
            try:  # on the log's writer thread: never beside one of this replica's appends
                upto = await loop.run_in_executor(self._writer, self.log.compact, self.compact_keep)
            except Exception as exc:  # the store unreachable: the next period tries again
                log.warning("wirekit serve: compacting the catalog's change log: %s", exc)
            else:
                if upto:
                    log.info("wirekit serve: catalog change log compacted up to %d", upto)

    # -- local changes -> the log --------------------------------------------------------

    def _publish(self, change: CatalogChange) -> None:
        """The catalog's subscriber: log a change made here (not one applied from the
        log)."""
        if self._applying or (change.kind != "quota" and change.model in self._remote):
            return
        if change.kind == "quota":
            doc: dict[str, Any] = {
                "model": change.model,
                "node": change.node,
                "device": change.device,
                "share": change.new,
            }
        elif change.kind == "add":
            doc = model_doc(self.catalog.model(change.model), self.catalog.rows(change.model))
        elif change.kind == "settings":
            doc = {
                "model": change.model,
                "settings": live_settings(self.catalog.model(change.model)),
            }
        else:
            doc = {"model": change.model}
        via = self.leader if self._deciding else None
        fut = self._writer.submit(self.log.append, change.kind, doc, via=via)
        fut.add_done_callback(lambda f: self._published(f, change))

    def _published(self, fut: concurrent.futures.Future, change: CatalogChange) -> None:
        exc = fut.exception()
        if exc is None:
            return
        log.warning("wirekit serve: catalog change %s not shared: %s", change, exc)
        if isinstance(exc, NotLeader) and change.kind == "quota" and self._loop is not None:
            # the lead was lost: this replica's catalog goes back to what the log says
            self._loop.call_soon_threadsafe(self._restore, change)

    def _restore(self, change: CatalogChange) -> None:
        self._applying = True
        try:
            if change.old is not None and change.node is not None and change.device is not None:
                self.catalog.set_quota(change.node, change.device, change.model, change.old)
        except (ValueError, KeyError) as exc:
            log.warning("wirekit serve: restoring %s: %s", change, exc)
        finally:
            self._applying = False

    # -- the log -> this replica ---------------------------------------------------------

    def _from_listener(self, changes: list[Change]) -> None:
        """The follower's callback (the listener's thread): hand over to the loop."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._incoming.put_nowait, changes)

    async def _apply_all(self) -> None:
        while True:
            batch = await self._incoming.get()
            try:
                for change in batch:
                    try:
                        await self._apply(change)
                    except Exception as exc:  # a change this catalog refuses: logged, skipped
                        log.warning(
                            "wirekit serve: catalog change %d not applied: %s", change.seq, exc
                        )
                    self.applied += 1
            finally:
                self._incoming.task_done()  # start() joins the queue

    async def _apply(self, change: Change) -> None:
        doc = change.doc
        if change.kind == "snapshot":
            await self._load(change)
            return
        if change.kind == "quota":
            self._applying = True
            try:
                self.catalog.set_quota(doc["node"], doc["device"], doc["model"], doc["share"])
            finally:
                self._applying = False
            return
        if change.kind == "settings":
            self._applying = True
            try:
                self.catalog.set_model(with_settings(self.catalog.model(doc["model"]), doc))
            finally:
                self._applying = False
            return
        name = doc["model"]["name"] if change.kind == "add" else doc["model"]
        self._remote.add(name)
        try:
            if change.kind == "add":
                if name not in self.catalog:
                    model, rows = model_of(doc)
                    await self.service.add_model(model, rows)
            elif change.kind == "remove" and name in self.catalog:
                await self.service.remove_model(name)
        finally:
            self._remote.discard(name)

    def _quota_of(self, doc: dict[str, Any]) -> float | None:
        if doc["model"] not in self.catalog:
            return None
        for r in self.catalog.rows(doc["model"]):
            if (r.node, r.device) == (doc["node"], doc["device"]):
                return r.quota
        return None

    async def _load(self, snapshot: Change) -> None:
        """Apply a snapshot of the log (:func:`~wirekit.serve.record.pgsync.fold`): the models
        removed, the quotas lowered, the models added, the quotas raised -- so no device
        goes above its whole share on the way.  Each step as a change from the log (one
        this catalog refuses is logged and skipped)."""
        seq, models = snapshot.seq, snapshot.doc["models"]
        steps: list[Change] = []
        for name, m in models.items():
            add = _settled(m) if m["add"] is not None else None
            if m["removed"] and name in self.catalog:
                if add is not None and add == model_doc(
                    self.catalog.model(name), self.catalog.rows(name)
                ):
                    continue  # removed and added back as it is here: left alone
                steps.append(Change(seq, "", "remove", {"model": name}))
        quotas = list(snapshot.doc["quotas"].values())

        def lower(q: dict[str, Any]) -> bool:
            now = self._quota_of(q)
            return now is not None and q["share"] < now

        steps += [Change(seq, "", "quota", q) for q in quotas if lower(q)]
        steps += [Change(seq, "", "add", _settled(m)) for m in models.values() if m["add"]]
        for change in steps:
            await self._apply_logged(change)
        for q in quotas:
            if self._quota_of(q) != q["share"]:
                await self._apply_logged(Change(seq, "", "quota", q))
        for name, m in models.items():  # the last settings of the models kept in place
            if m.get("settings") is not None and name in self.catalog:
                doc = {"model": name, "settings": m["settings"]}
                await self._apply_logged(Change(seq, "", "settings", doc))

    async def _apply_logged(self, change: Change) -> None:
        try:
            await self._apply(change)
        except Exception as exc:
            log.warning("wirekit serve: catalog snapshot %d: %s not applied: %s",
                        change.seq, change.kind, exc)  # fmt: skip

    # -- the controller: the leader only ----------------------------------------------------

    async def lead(self, controller: Any) -> None:
        """Run ``controller``'s periods while this replica leads (polling the lock every
        ``retry`` seconds otherwise); its changes and decisions go through the lock's
        session."""
        synced = False
        while True:
            leading = await asyncio.to_thread(self.leader.poll)
            if not leading:
                synced = False
                await asyncio.sleep(self.leader.retry)
                continue
            if not synced:
                log.info("wirekit serve: this replica leads the controller")
                await controller.sync()
                # the rows the previous leader changed keep their cooldown
                since = time.time() - controller.config.cooldown
                try:
                    last = await asyncio.to_thread(self._window_db().last_decisions, since)
                except Exception as exc:  # the store unreachable: the policy starts afresh
                    log.warning("wirekit serve: reading the last decisions: %s", exc)
                else:
                    controller.resume(last)
                synced = True
            # what the policy reads: every replica's requests over the window, from the store
            # (read here, off the loop; the controller's snapshot takes it from recent())
            since = time.time() - controller.config.window
            try:
                self._recent = await asyncio.to_thread(self._window_db().recent, since)
                self._recent_rows = await asyncio.to_thread(self._window_db().recent_rows, since)
            except Exception as exc:  # a lost connection: reopened at the next period
                log.warning("wirekit serve: the controller's window not read: %s", exc)
                await asyncio.sleep(controller.config.period)
                continue  # no period on figures that are not there
            self._deciding = True
            step = asyncio.ensure_future(controller.step())
            try:
                await asyncio.shield(step)
            except asyncio.CancelledError:
                # a stop during a period: the period ends first -- its changes published,
                # its decisions stored -- and only then is the lead given up (the stop
                # waits its grace for this)
                await asyncio.wait({step})
                raise
            finally:
                self._deciding = False
            await asyncio.sleep(controller.config.period)

    def _window_db(self) -> PostgresDB:
        if self._db is None:
            self._db = PostgresDB(self.url)
        return self._db

    def recent(self, span: float) -> dict[str, RecentStats]:
        """The window figures of every replica's requests, per model, as of the leader's
        last period (the controller's ``recent``; empty before the first)."""
        return _as_recent(self._recent, span)

    def recent_rows(self, span: float) -> dict[str, RecentStats]:
        """The same per row (``node/device/model``: the requests each device finished, on
        every replica; the controller's ``recent_rows``)."""
        return _as_recent(self._recent_rows, span)

    async def close(self) -> None:
        """Stop sharing: the catalog's changes from now on stay here; the ones made before
        are in the log when this returns (the writer is drained before the log closes);
        every session to the store is closed, and none is opened afterwards."""
        self.catalog.unsubscribe(self._publish)
        if self._adopter is not None:
            self._adopter.cancel()
            await asyncio.wait({self._adopter}, timeout=5)
            self._adopter = None
        if self._compactor is not None:
            self._compactor.cancel()
            await asyncio.wait({self._compactor}, timeout=5)
            self._compactor = None
        # the appends still queued run before the log closes (closed under them, the log
        # reopened a session that nobody closed: a ResourceWarning in a later test)
        await asyncio.to_thread(self._writer.shutdown, True)
        if self._applier is not None:
            self._applier.cancel()
            await asyncio.wait({self._applier}, timeout=5)
            self._applier = None
        await asyncio.to_thread(self.log.close)
        await asyncio.to_thread(self.leader.close)
        if self._db is not None:
            await asyncio.to_thread(self._db.close)
            self._db = None


async def renew_periodically(lease: ReplicaLease, period: float) -> None:
    """Renew ``lease`` every ``period`` seconds until cancelled (off the loop, but driven by
    it: a loop that stops turning lets the lease run out).  A renewal that fails (the store
    unreachable) is logged and tried again at the next period; one that finds the lease
    lapsed says so -- the leader may have ended this replica's queued rows ``lost``, and
    their answers, recorded since, replace that."""
    while True:
        await asyncio.sleep(period)
        try:
            lapsed = await asyncio.to_thread(lease.renew)
        except Exception as exc:
            log.warning("wirekit serve: renewing this replica's lease: %s", exc)
            continue
        if lapsed is not None:
            log.warning(
                "wirekit serve: this replica's lease had lapsed (%s): the leader may have"
                " ended its queued requests lost; their answers replace that",
                lapsed,
            )


def _as_recent(figures: dict[str, dict[str, Any]], span: float) -> dict[str, RecentStats]:
    """:meth:`PostgresDB.recent <wirekit.serve.record.storedb.PostgresDB.recent>` figures as
    :class:`RecentStats` over ``span`` seconds."""
    return {
        key: RecentStats(
            seconds=span,
            requests=f["requests"],
            rate=f["requests"] / span if span > 0 else 0.0,
            ok=f["ok"],
            errors=f["errors"],
            queue=f["queue"],
            avg=f["avg"],
            p50=f["p50"],
            p95=f["p95"],
            p99=f["p99"],
            max=f["max"],
        )
        for key, f in sorted(figures.items())
    }
