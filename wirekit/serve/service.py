"""The running service: builds the dispatcher from a :class:`Deployment` and opens its doors.

>>> service = Service(load_config("deployment.json"))   # doctest: +SKIP
>>> await service.start(); service.addresses()           # doctest: +SKIP
{'http': 8080, 'mip': {'m1': 9001}, 'clipper_rpc': None}
>>> await service.stop()                                 # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import random
import time
import weakref
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from aiohttp import web

from wirekit._memory import MemoryReturn
from wirekit.mip.limits import BufferBudget

from .actuators import build_actuator
from .backends import Backend, ClipperBackend, KubeMoBackend, MipBackend
from .cache import ResponseCache
from .catalog import Catalog, CatalogChange, CatalogError
from .config import (
    ConfigError,
    Deployment,
    DeviceRow,
    ModelConfig,
    live_settings,
    parse_model,
    parse_settings,
)
from .controller import (
    Controller,
    Decision,
    catalog_targets,
    decision_record,
    quota_rows,
    set_decided_quota,
)
from .dispatcher import Dispatcher
from .http import build_app
from .metrics import Metrics, ModelStats, RecentStats, Window, model_stats, snapshot_of
from .mipfront import MipFrontDoor
from .payload import Payload
from .router import Router
from .store import RequestStore
from .storedb import StoreDB

if TYPE_CHECKING:
    from .replicas import ReplicaSync

log = logging.getLogger("wirekit.serve")

#: time slots of the controller's metrics window per model at most (memory: slots × the
#: histogram buckets used, whatever the traffic)
WINDOW_SLOTS = 600

#: the environment variable that gives the admin API's bearer token (``admin.token``)
ADMIN_TOKEN_ENV = "WIREKIT_ADMIN_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen address) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def admin_token(deployment: Deployment, environ: Any = os.environ) -> str | None:
    """The admin API's bearer token: ``admin.token``, else ``WIREKIT_ADMIN_TOKEN``, else None
    (then the admin API answers loopback clients only).  Raises :class:`ConfigError` when
    the HTTP front door listens beyond loopback with the admin API on and no token."""
    admin = deployment.admin
    token = admin.token or environ.get(ADMIN_TOKEN_ENV) or None
    if (
        admin.enabled
        and token is None
        and deployment.http_port is not None
        and not is_loopback(deployment.host)
    ):
        raise ConfigError(
            "admin.token",
            f"the HTTP front door listens on {deployment.host}, beyond loopback: the admin API"
            f" (/admin/models) needs a bearer token (admin.token or {ADMIN_TOKEN_ENV}),"
            " or turn it off with admin.enabled = false",
        )
    return token


class Service:
    """Everything ``wirekit serve`` runs, in one asyncio loop."""

    def __init__(
        self,
        deployment: Deployment,
        *,
        backends: dict[str, Backend] | None = None,
        rng: random.Random | None = None,
        lane: ModuleType | None = None,
    ) -> None:
        self.deployment = deployment
        self.store = RequestStore(
            deployment.store.path,
            url=deployment.store.url,
            replica=deployment.store.replica,
            payloads=deployment.store.payloads,
            batch_max=deployment.store.batch_max,
            journal=deployment.store.journal,
            flush_interval=deployment.store.flush_interval,
        )
        ctl = deployment.controller
        #: the recent window the controller reads (kept only when a controller is configured)
        window = None
        if ctl is not None:  # slots of up to 1 s (half a period), at most WINDOW_SLOTS of them
            window = Window(ctl.window, max(min(1.0, ctl.period / 2), ctl.window / WINDOW_SLOTS))
        self.metrics = Metrics(deployment.models, window=window)
        self.cache: ResponseCache[Payload] = ResponseCache(
            deployment.cache.max_entries, deployment.cache.ttl, deployment.cache.max_bytes
        )
        #: the models metadata: the one source of truth of models, rows and quotas; the
        #: router follows its every change
        self.catalog = Catalog(deployment.models, deployment.rows)
        self.admin_token = admin_token(deployment)
        #: Clipper application name -> model, kept up to date as models come and go
        self.apps: dict[str, str] = self.catalog.app_models()
        self.catalog.subscribe(self._follow)  # backends first, then the router draws on them
        self.router = Router.following(self.catalog, backoff=deployment.backoff, rng=rng)
        self._removing: set[str] = set()
        #: the MIP front-door connections of each model (closed when it is removed)
        self._front_conns: dict[str, weakref.WeakSet[MipFrontDoor]] = {}
        self._given_backends = backends or {}
        self._lane = lane  # the MIP lane's twin (tests choose; default: the dispatcher's)
        self.dispatcher: Dispatcher | None = None
        self._tasks: set[asyncio.Task] = set()
        self._mip_servers: dict[str, asyncio.Server] = {}
        #: the one memory budget of this process: every front door (MIP and HTTP) charges it
        self.budget = BufferBudget(deployment.mip.memory_budget)
        #: gives memory back to the system after big connections end (wirekit._memory)
        self.memory_return = MemoryReturn()
        self._runner: web.AppRunner | None = None
        self._http_port: int | None = None
        self.clipper: Any = None  # the embedded Clipper RPC frontend, when a model uses Clipper
        #: on a shared store: the connection ``/stats`` and ``/metrics`` query
        self._shared_db: StoreDB | None = None
        #: on a shared store: the models metadata shared with the other replicas
        self.replicas: ReplicaSync | None = None
        #: the controller (None unless the config has a ``controller`` table)
        self.controller: Controller | None = None
        self._controller_task: asyncio.Task | None = None
        if ctl is not None:
            try:
                actuator = build_actuator(ctl.actuator)
            except ValueError as exc:
                raise ConfigError("controller.actuator.kind", str(exc)) from None
            try:
                self.controller = Controller(
                    ctl,
                    self.catalog,
                    self._recent,
                    actuator,
                    store=self.store,
                    recent_rows=self._recent_rows,
                    can_serve=self._can_serve,
                )
            except ValueError as exc:
                raise ConfigError("controller.policy", str(exc)) from None

    def _recent(self) -> dict[str, RecentStats]:
        """What the controller's policy reads: this process's window, or on a shared store
        every replica's (read from the store by the leader before each period)."""
        if self.replicas is not None and self.controller is not None:
            return self.replicas.recent(self.controller.config.window)
        return self.metrics.recent()

    def _recent_rows(self) -> dict[str, RecentStats]:
        """The same per row (``node/device/model``): this process's window, or on a shared
        store every replica's."""
        if self.replicas is not None and self.controller is not None:
            return self.replicas.recent_rows(self.controller.config.window)
        return self.metrics.recent_rows()

    def _backend_for(self, row: DeviceRow) -> Backend:
        if row.key in self._given_backends:
            return self._given_backends[row.key]
        timeout = self.catalog.model(row.model).timeout
        if row.backend == "clipper":
            assert self.clipper is not None and row.clipper_name
            return ClipperBackend(self.clipper, row.clipper_name, timeout=timeout)
        assert row.port is not None
        if row.backend == "kubemo":
            return KubeMoBackend(row.endpoint, row.port, timeout=timeout)
        if row.backend == "mip":
            return MipBackend(
                row.endpoint,
                row.port,
                max_in_flight=self.deployment.connections,
                timeout=timeout,
            )
        raise NotImplementedError(f"{row.key}: the {row.backend} backend is not available")

    async def start(self) -> None:
        """Open the store and every listener."""
        dep = self.deployment
        self.store.open()
        reader = self.store.reader()
        if self.store.kind == "postgresql":
            # the store's figures are queried when asked for; the live counters stay this
            # replica's own (they start empty)
            self._shared_db = reader
        else:
            try:
                self.metrics.load(reader)  # the live counters describe the whole file
            finally:
                reader.close()
        try:
            if dep.clipper_rpc_port is not None:
                from wirekit.clipper.frontend import Frontend

                host = f"[{dep.host}]" if ":" in dep.host else dep.host
                self.clipper = Frontend(
                    f"tcp://{host}:{dep.clipper_rpc_port}", dep.clipper_generation
                ).start()
            catalog = self.catalog
            backends = {r.key: self._backend_for(r) for r in catalog.rows() if r.quota > 0}
            self.dispatcher = Dispatcher(
                {name: catalog.model(name) for name in catalog.models()},
                self.router,
                backends,
                self.store,
                self.metrics,
                self.cache,
                lane=self._lane,
            )
            for name in catalog.models():
                model = catalog.model(name)
                if model.mip_port is not None:
                    self._mip_servers[name] = await self._front_door(model)
            if dep.http_port is not None:
                app = build_app(
                    self.dispatcher,
                    self.apps,
                    self.http_stats,
                    self.http_metrics,
                    max_items=dep.mip.max_items,
                    admin=self if dep.admin.enabled else None,
                    admin_token=self.admin_token,
                    controller=self.controller_state,
                )
                self._runner = web.AppRunner(app, access_log=None)
                await self._runner.setup()
                site = web.TCPSite(self._runner, dep.host, dep.http_port)
                await site.start()
                self._http_port = self._runner.addresses[0][1]  # the port bound
            if self.store.url is not None:
                # several replicas on one store: one models metadata (and one controller)
                from .replicas import ReplicaSync

                self.replicas = ReplicaSync(
                    self,
                    self.store.url,
                    self.store.replica,
                    compact_every=self.deployment.store.compact_every,
                    compact_keep=self.deployment.store.compact_keep,
                )
                await self.replicas.start()
                if self.controller is not None:
                    # decisions stored on the lock's session: only while leading
                    self.store.leader = self.replicas.leader
            if self.controller is not None:
                self._controller_task = asyncio.ensure_future(
                    self.replicas.lead(self.controller)
                    if self.replicas is not None
                    else self.controller.run()
                )
        except BaseException:
            await self.stop()
            raise

    async def _front_door(self, model: ModelConfig) -> asyncio.Server:
        """Open the MIP front door of ``model`` (its connections are remembered)."""
        dep = self.deployment
        conns = self._front_conns.setdefault(model.name, weakref.WeakSet())
        assert self.dispatcher is not None

        def factory() -> MipFrontDoor:
            assert self.dispatcher is not None
            door = MipFrontDoor(
                self.dispatcher, model.name, self._tasks, dep.mip, self.budget, self.memory_return
            )
            conns.add(door)
            return door

        loop = asyncio.get_running_loop()
        return await loop.create_server(factory, dep.host, model.mip_port)

    # ------------------------------------------------------------------ models at run time

    def _follow(self, change: CatalogChange) -> None:
        """The catalog changed (its subscriber, told before the router): the backends a
        change makes routable exist before the router may choose them."""
        if change.kind != "quota":
            self.apps.clear()
            self.apps.update(self.catalog.app_models())
        d = self.dispatcher
        if d is None:  # not started: start() builds from the catalog
            return
        if change.kind == "settings":
            keys = [r.key for r in self.catalog.rows(change.model)]
            d.update_model(self.catalog.model(change.model), keys)
        elif change.kind == "add":
            catalog = self.catalog
            rows = [r for r in catalog.rows(change.model) if r.quota > 0]
            d.add_model(catalog.model(change.model), {r.key: self._backend_for(r) for r in rows})
            self.metrics.stats(change.model)
        elif change.kind == "quota" and change.new:
            key = f"{change.node}/{change.device}/{change.model}"
            if key not in d.backends:
                (row,) = [r for r in self.catalog.rows(change.model) if r.key == key]
                d.add_backends({key: self._backend_for(row)})
            else:
                d.routes_changed()
        else:
            d.routes_changed()

    async def add_model(self, model: ModelConfig, rows: Iterable[DeviceRow]) -> None:
        """Serve ``model`` from now on: its rows join the catalog (refused with a
        :class:`CatalogError` that says what is free when a share is not), backends, its
        HTTP routes and metrics, and its MIP front door when it has a ``mip_port``."""
        if self.dispatcher is None:
            raise RuntimeError("the service is not started")
        rows = list(rows)
        name = model.name
        if name in self._removing:
            raise CatalogError(f"model {name!r} is being removed: add it again once it is gone")
        if model.backend == "clipper" and self.clipper is None:
            raise CatalogError(
                f"model {name!r}: a Clipper model needs the Clipper RPC port"
                " (listen.clipper_rpc_port), which this dispatcher does not open"
            )
        server = None
        if model.mip_port is not None:
            try:
                server = await self._front_door(model)
            except OSError as exc:
                raise CatalogError(
                    f"model {name!r}: cannot listen on port {model.mip_port}: {exc.strerror or exc}"
                ) from None
        try:
            self.catalog.add_model(model, rows)
        except BaseException:
            if server is not None:
                server.close()
            raise
        if server is not None:
            self._mip_servers[name] = server
        log.warning(
            "wirekit serve: model %s added (%s)",
            name,
            ", ".join(f"{r.key} {r.quota:g}" for r in rows if r.quota > 0),
        )

    async def add_model_doc(self, doc: Any) -> dict[str, Any]:
        """:meth:`add_model` from a document (``POST /admin/models``, see
        :func:`wirekit.serve.config.parse_model`); returns the model's entry of
        :meth:`models_doc`."""
        catalog = self.catalog
        endpoints = {r.node: r.endpoint for r in catalog.rows()}
        model, rows = parse_model(doc, catalog.devices(), endpoints)
        await self.add_model(model, rows)
        return self._model_doc(model.name)

    def set_model_doc(self, name: str, doc: Any) -> dict[str, Any]:
        """Change the settings of model ``name`` in place (``PATCH /admin/models/{name}``,
        body: some of :data:`~wirekit.serve.config.LIVE_SETTINGS`, validated as the config
        file's ``models.<name>`` table is, see :func:`~wirekit.serve.config.parse_settings`).
        New requests use them at once (MIP connections already open included), requests in
        flight finish with theirs; on a shared store every replica follows.  Returns the
        model's entry of :meth:`models_doc`.  KeyError for an unknown model,
        :class:`ConfigError` for a bad value or a setting that cannot change live,
        :class:`CatalogError` while the model is being removed."""
        model = self.catalog.model(name)  # KeyError
        if name in self._removing:
            raise CatalogError(f"model {name!r} is being removed")
        new = parse_settings(doc, model)
        self.catalog.set_model(new)
        changed = {k: v for k, v in live_settings(new).items() if getattr(model, k) != v}
        if changed:
            log.warning("wirekit serve: model %s settings changed: %s", name, changed)
        return self._model_doc(name)

    async def remove_model(self, name: str, drain_timeout: float | None = None) -> dict[str, Any]:
        """Stop serving ``name``: new requests get a clear error at once (MIP: an error
        reply; HTTP: 410), its MIP front door stops listening, requests in flight finish and
        are answered (within ``drain_timeout``, default ``admin.drain_timeout``), then its
        quotas are released, its backends and front-door connections closed.  KeyError if
        there is no such model; :class:`CatalogError` if it is being removed already."""
        d = self.dispatcher
        if d is None:
            raise RuntimeError("the service is not started")
        if name in self._removing:
            raise CatalogError(f"model {name!r} is being removed already")
        model = self.catalog.model(name)  # KeyError
        self._removing.add(name)
        try:
            d.drain(name, model.apps)
            server = self._mip_servers.pop(name, None)
            if server is not None:
                server.close()
            if drain_timeout is None:
                drain_timeout = self.deployment.admin.drain_timeout
            loop = asyncio.get_running_loop()
            until = loop.time() + drain_timeout
            in_flight = self.metrics.in_flight
            while in_flight(name) > 0 and loop.time() < until:
                await asyncio.sleep(0.005)
            left = in_flight(name)
            keys = [r.key for r in self.catalog.rows(name)]
            self.catalog.remove_model(name)  # quotas released; the router drops it
            await d.remove_backends(keys)
            # requests cut short by the backends' closing are answered (failed) meanwhile
            until = loop.time() + 1.0
            while in_flight(name) > 0 and loop.time() < until:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0)  # the answers owed are written (the front doors flush)
            for door in list(self._front_conns.pop(name, ())):
                door.close()
        finally:
            self._removing.discard(name)
        log.warning(
            "wirekit serve: model %s removed (%s)",
            name,
            "drained" if not left else f"{left} request(s) still in flight after the drain",
        )
        return {"removed": name, "drained": not left, "in_flight_at_timeout": left}

    def _model_doc(self, name: str) -> dict[str, Any]:
        catalog = self.catalog
        model = catalog.model(name)
        server = self._mip_servers.get(name)
        return {
            "backend": model.backend,
            "mip_port": server.sockets[0].getsockname()[1] if server is not None else None,
            "timeout": model.timeout,
            "attempts": model.attempts,
            "apps": list(model.apps),
            "max_batch": model.max_batch,
            "target": model.target,
            "removing": name in self._removing,
            "rows": [
                {
                    "node": r.node,
                    "device": r.device,
                    "device_type": r.device_type,
                    "quota": r.quota,
                    "endpoint": r.endpoint,
                    "port": r.port if r.backend != "clipper" else r.clipper_name,
                }
                for r in catalog.rows(name)
            ],
        }

    async def set_quota_doc(self, name: str, doc: Any) -> dict[str, Any]:
        """Set one quota of model ``name`` (``PUT /admin/models/{name}/quota``, body
        ``{"node": ..., "device": ..., "quota": ...}``): an operator's decision.

        With a controller it is applied as the controller applies its own (catalog, then the
        node's actuator, rolled back if the actuator fails; recorded with reason
        ``admin``); without one the catalog alone changes -- routing follows at once, on
        every replica sharing the store.  Returns the decision as recorded (``status``
        ``applied``, ``refused`` or ``failed``).  KeyError for an unknown model;
        :class:`ConfigError` for a body not shaped as above."""
        catalog = self.catalog
        catalog.model(name)  # KeyError
        if not isinstance(doc, dict) or set(doc) - {"node", "device", "quota"}:
            raise ConfigError("body", 'expected {"node": NODE, "device": INDEX, "quota": SHARE}')
        node, device, quota = doc.get("node"), doc.get("device"), doc.get("quota")
        if not isinstance(node, str):
            raise ConfigError("body.node", f"expected a node id, got {node!r}")
        if isinstance(device, bool) or not isinstance(device, int):
            raise ConfigError("body.device", f"expected a device index, got {device!r}")
        if isinstance(quota, bool) or not isinstance(quota, (int, float)):
            raise ConfigError("body.quota", f"expected a share from 0 to 1, got {quota!r}")
        row = next((r for r in catalog.rows(name) if (r.node, r.device) == (node, device)), None)
        if row is None:
            raise ConfigError("body", f"model {name!r} has no row on {node}/{device}")
        decision = Decision(
            node, device, row.device_type, name, row.quota, float(quota), "admin", {}
        )
        if self.controller is not None:
            # an operator's decision: stored from any replica, not only the leader
            return await self.controller.apply(decision, fenced=False)
        error = set_decided_quota(catalog, decision, self._can_serve)
        status = "refused" if error is not None else "applied"
        log.info("admin: %s %s %g -> %g%s", row.key, status, row.quota, quota,
                 f": {error}" if error else "")  # fmt: skip
        return decision_record(decision, status, error, time.time())

    def models_doc(self) -> dict[str, Any]:
        """The ``GET /admin/models`` document: every model and its rows, and the free share
        of every device."""
        catalog = self.catalog
        return {
            "version": catalog.version,
            "models": {name: self._model_doc(name) for name in catalog.models()},
            "devices": [
                {
                    "node": node,
                    "device": index,
                    "type": kind,
                    "free": catalog.free_share(node, index),
                }
                for (node, index), kind in sorted(catalog.devices().items())
            ],
        }

    def addresses(self) -> dict[str, Any]:
        """The ports actually bound (useful when the config asked for port 0)."""
        return {
            "host": self.deployment.host,
            "http": self._http_port,
            "mip": {
                name: srv.sockets[0].getsockname()[1] for name, srv in self._mip_servers.items()
            },
            "clipper_rpc": (int(self.clipper.endpoint.rsplit(":", 1)[1]) if self.clipper else None),
        }

    def _can_serve(self, row: DeviceRow) -> bool:
        """Whether ``row`` has a backend, or one can be made for it when it is given a share
        (:meth:`_follow` makes it): a port, or a Clipper container name with the Clipper
        RPC port open."""
        d = self.dispatcher
        if d is not None and row.key in d.backends:
            return True
        if row.backend == "clipper":
            return self.clipper is not None and bool(row.clipper_name)
        return row.port is not None

    def quotas(self) -> list[dict[str, Any]]:
        """Every row of the catalog with its current quota."""
        return quota_rows(self.catalog)

    def controller_state(self) -> dict[str, Any]:
        """The ``GET /controller`` document."""
        if self.controller is None:
            return {
                "enabled": False,
                "quotas": self.quotas(),
                "targets": catalog_targets(self.catalog),
                "decisions": [],
            }
        return self.controller.state()

    def extra(self) -> dict[str, Any]:
        return {
            "cache": self.cache.stats(),
            "backed_off": self.router.backed_off(),
            "quotas": self.quotas(),
        }

    def stats(self) -> dict[str, Any]:
        """The ``/stats`` document."""
        snap = self.metrics.snapshot()
        snap.update(self.extra())
        d = self.dispatcher
        snap["resubmissions"] = d.resubmissions if d else 0
        snap["batches"] = {"sent": d.batches if d else 0, "retried": d.batch_retries if d else 0}
        snap["lane_requests"] = d.lane_requests if d else 0
        return snap

    def metrics_text(self) -> bytes:
        """The ``/metrics`` text of this process's live counters."""
        return self.metrics.prometheus(self.extra())

    async def shared_stats(self) -> dict[str, ModelStats] | None:
        """The per-model figures computed from a shared (PostgreSQL) store, the same on
        every replica; None on the embedded store, whose live counters already describe the
        whole store.  Queried in a worker thread: the loop never waits on the database."""
        db = self._shared_db
        if db is None:
            return None
        stored = await asyncio.to_thread(model_stats, db)
        # every model served is reported, with zeros before its first request (as the live
        # counters do)
        return {**{m: ModelStats() for m in self.metrics.models}, **stored}

    async def http_stats(self) -> dict[str, Any]:
        """``/stats``: on a shared store, the store's figures, with this replica's own under
        ``"local"``."""
        snap = self.stats()
        shared = await self.shared_stats()
        if shared is not None:
            local = {"queue": snap["queue"], "models": snap["models"]}
            snap.update(snapshot_of(shared))
            snap["local"] = local
            snap["replica"] = self.store.replica
        snap["store"] = self.store.kind
        return snap

    async def http_metrics(self) -> bytes:
        """``/metrics``: on a shared store, the store's figures under the usual names and
        this replica's as ``wirekit_serve_local_*``."""
        shared = await self.shared_stats()
        return self.metrics.prometheus(self.extra(), shared)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop the controller, close the listeners, let requests in flight finish (up to
        ``grace`` seconds), then close the backends and the store."""
        task, self._controller_task = self._controller_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=grace)
        if self.replicas is not None:
            await self.replicas.close()
            self.replicas = None
        for srv in self._mip_servers.values():
            srv.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        dispatcher = self.dispatcher
        if dispatcher is not None:
            # Requests in flight: answered within the grace period, else cancelled.
            loop = asyncio.get_running_loop()
            until = loop.time() + grace
            while dispatcher.active and loop.time() < until:
                await asyncio.sleep(0.005)
            dispatcher.closing = True  # attempt loops stop trying further devices
            tasks = set(dispatcher.tasks) | set(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=grace)
        elif self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=grace)
        self._mip_servers.clear()
        if self.dispatcher is not None:
            await self.dispatcher.close()
        if self.clipper is not None:
            self.clipper.stop()
        self.store.close()
        if self._shared_db is not None:
            self._shared_db.close()
            self._shared_db = None
