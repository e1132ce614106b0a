"""Several ``wirekit serve`` replicas on one PostgreSQL store: one models metadata, one
controller (issue 17).  Used by :class:`~wirekit.serve.service.Service` when the store is a
``postgresql://`` URL; specs/replicas.md says what it guarantees.

* **The models metadata.**  Every change of this replica's
  :class:`~wirekit.serve.catalog.Catalog` (a quota set, a model added or removed through its
  admin API or by the controller) is appended to the store's change log
  (:class:`~wirekit.serve.pgsync.ChangeLog`), which notifies the others; every replica
  applies the others' changes to its own catalog, in log order, on its event loop -- its
  router, dispatcher and compiled paths follow through the catalog's subscription as for a
  local change.  A replica that starts replays the whole log over the config's models, so
  every replica describes the same models.
* **The controller acts once.**  Only the replica that holds the
  :class:`~wirekit.serve.pgsync.LeaderLock` runs controller periods, on the figures of
  every replica's requests over its window (:meth:`PostgresDB.recent
  <wirekit.serve.storedb.PostgresDB.recent>`, read from the store before each period).
  Its quota changes are logged on the lock's session and its decisions stored there too:
  a replica that lost the lead without knowing it cannot publish or record a decision (no
  decision is taken twice); its own catalog is then put back to what the log says.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import time
from typing import Any

from .catalog import CatalogChange
from .config import DeviceRow, ModelConfig
from .metrics import RecentStats
from .pgsync import Change, ChangeLog, LeaderLock, NotLeader
from .storedb import PostgresDB

log = logging.getLogger("wirekit.serve")


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
    """:func:`model_doc` read back."""
    fields = dict(doc["model"])
    fields["apps"] = tuple(fields.get("apps", ()))
    return ModelConfig(**fields), [DeviceRow(**r) for r in doc["rows"]]


class ReplicaSync:
    """The catalog and the controller of one replica, shared through the store (see the
    module docstring).  ``start()`` on the service's loop once it serves; ``close()`` at
    the end."""

    def __init__(self, service: Any, url: str, replica: str, *, retry: float = 0.5) -> None:
        self.service = service
        self.catalog = service.catalog
        # the replica's name and this process: a restarted replica replays its own past
        # changes like anyone else's
        self.origin = f"{replica}#{os.getpid():x}-{os.urandom(3).hex()}"
        self.log = ChangeLog(url, self.origin)
        self.leader = LeaderLock(url, retry=retry, name=f"wirekit leader {self.origin}")
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

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.catalog.subscribe(self._publish)
        self._applier = asyncio.ensure_future(self._apply_all())
        upto = await asyncio.to_thread(self.log.last)
        self.log.follow(self._from_listener, after=0)
        # the changes logged before this replica started: applied before it says ready
        while self.log.applied < upto:
            await asyncio.sleep(0.01)
        while not self._incoming.empty():
            await asyncio.sleep(0.01)
        self.ready.set()

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
            for change in await self._incoming.get():
                try:
                    await self._apply(change)
                except Exception as exc:  # a change this catalog refuses: logged, skipped
                    log.warning("wirekit serve: catalog change %d not applied: %s", change.seq, exc)
                self.applied += 1

    async def _apply(self, change: Change) -> None:
        doc = change.doc
        if change.kind == "quota":
            self._applying = True
            try:
                self.catalog.set_quota(doc["node"], doc["device"], doc["model"], doc["share"])
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
                log.warning("wirekit serve: this replica leads the controller")
                await controller.sync()
                synced = True
            # what the policy reads: every replica's requests over the window, from the store
            # (read here, off the loop; the controller's snapshot takes it from recent())
            since = time.time() - controller.config.window
            self._recent = await asyncio.to_thread(self._window_db().recent, since)
            self._recent_rows = await asyncio.to_thread(self._window_db().recent_rows, since)
            self._deciding = True
            try:
                await controller.step()
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
        if self._applier is not None:
            self._applier.cancel()
            await asyncio.wait({self._applier}, timeout=5)
            self._applier = None
        await asyncio.to_thread(self.log.close)
        await asyncio.to_thread(self.leader.close)
        if self._db is not None:
            await asyncio.to_thread(self._db.close)
            self._db = None
        self._writer.shutdown(wait=True)


def _as_recent(figures: dict[str, dict[str, Any]], span: float) -> dict[str, RecentStats]:
    """:meth:`PostgresDB.recent <wirekit.serve.storedb.PostgresDB.recent>` figures as
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
