"""The running service: builds the dispatcher from a :class:`Deployment` and opens its doors.

>>> service = Service(load_config("deployment.json"))   # doctest: +SKIP
>>> await service.start(); service.addresses()           # doctest: +SKIP
{'http': 8080, 'mip': {'m1': 9001}, 'clipper_rpc': None}
>>> await service.stop()                                 # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from wirekit._memory import MemoryReturn
from wirekit.mip.limits import BufferBudget

from .backends.remote import Backend, ClipperBackend, KubeMoBackend, MipBackend
from .config import (
    ConfigError,
    Deployment,
    DeviceRow,
    ModelConfig,
    live_settings,
    parse_model,
    parse_quota,
    parse_settings,
)
from .control.actuators import build_actuator
from .control.catalog import Catalog, CatalogChange, CatalogError
from .control.controller import (
    DECISION_OUTCOMES,
    Controller,
    Decision,
    catalog_targets,
    decision_record,
    quota_rows,
    set_decided_quota,
)
from .control.metrics import (
    HistogramHistory,
    Metrics,
    ModelStats,
    RecentStats,
    Window,
    device_label,
    latency_of,
    model_stats,
    snapshot_of,
)
from .dispatch.cache import ResponseCache
from .dispatch.dispatcher import Dispatcher
from .dispatch.payload import Payload
from .dispatch.router import Router
from .doors.adminauth import (
    ADMIN_TOKEN_ENV,
    AdminAccess,
    TokenFileError,
    admin_token,
    default_token_file,
    is_loopback,
    new_token,
    remove_token_file,
    write_token_file,
)
from .doors.fdwatch import FdWatch
from .doors.http import build_app
from .doors.httpdoor import HttpDoor
from .doors.mipfront import MipFrontDoor
from .logs import serve_logger
from .record.store import RequestStore
from .record.storedb import StoreDB

if TYPE_CHECKING:
    from .record.pgsync import ReplicaLease
    from .record.replicas import ReplicaSync

log = serve_logger()

#: time slots of the controller's metrics window per model at most (memory: slots × the
#: histogram buckets used, whatever the traffic)
WINDOW_SLOTS = 600

#: seconds between two probes of the backends (what ``/readyz`` says of them), and how
#: long one TCP connection attempt of a probe may take
PROBE_INTERVAL = 2.0
PROBE_TIMEOUT = 1.0
#: seconds between two snapshots of the histograms (``/stats``' window)
SNAPSHOT_INTERVAL = 1.0

__all__ = ["ADMIN_TOKEN_ENV", "Service", "admin_token", "is_loopback"]


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
        #: snapshots of the histograms: ``/stats``' latency and rate over the last minute
        self.history = HistogramHistory(self.metrics, interval=SNAPSHOT_INTERVAL)
        #: row key -> (router clock time, why it could not be reached or None) of its last
        #: probe (readiness)
        self._probes: dict[str, tuple[float, str | None]] = {}
        self._watch_task: asyncio.Task | None = None
        #: how late the watch task woke up last (the loop's lag, seconds)
        self.loop_lag = 0.0
        self.cache: ResponseCache[Payload] = ResponseCache(
            deployment.cache.max_entries, deployment.cache.ttl, deployment.cache.max_bytes
        )
        #: the models metadata: the one source of truth of models, rows and quotas; the
        #: router follows its every change
        self.catalog = Catalog(deployment.models, deployment.rows)
        #: the admin API's bearer token: the configured one, else one generated here and
        #: written to :attr:`admin_token_file` at start (None: no admin API)
        self.admin_token = admin_token(deployment)
        self._token_generated = False
        admin = deployment.admin
        if self.admin_token is None and admin.enabled and deployment.http_port is not None:
            self.admin_token, self._token_generated = new_token(), True
        #: where the generated token is, while the service runs (None: none generated)
        self.admin_token_file: Path | None = None
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
        self._http: HttpDoor | None = None
        self._http_port: int | None = None
        #: says when accept fails on any door for lack of file descriptors
        self._fd_watch = FdWatch()
        self.clipper: Any = None  # the embedded Clipper RPC frontend, when a model uses Clipper
        #: on a shared store: the connection ``/stats`` and ``/metrics`` query
        self._shared_db: StoreDB | None = None
        #: on a shared store: the models metadata shared with the other replicas
        self.replicas: ReplicaSync | None = None
        #: on a shared store: this replica's lease (taken when the store opens)
        self.lease: ReplicaLease | None = None
        self._lease_task: asyncio.Task | None = None
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
        if self.store.url is not None:
            from .record.pgsync import ReplicaLease
            from .record.replicas import renew_periodically

            self.lease = self.store.lease = ReplicaLease(
                self.store.url, self.store.replica, lease=dep.store.lease
            )
        try:
            self.store.open()
        except BaseException:
            self._close_lease()
            raise
        if self.lease is not None:
            self._lease_task = asyncio.ensure_future(
                renew_periodically(self.lease, dep.store.lease_period)
            )
        for lost_model, n in self.store.lost_by_model.items():  # a previous run's, unanswered
            self.metrics.ended_lost(lost_model, n)
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
                    admin_access=self._admin_access(),
                    controller=self.controller_state,
                    limits=dep.http,
                    health=self.liveness,
                    readiness=self.readiness,
                )
                self._http = HttpDoor(app, dep.http, self.budget)
                self._http_port = await self._http.start(dep.host, dep.http_port)
                self._write_token_file()
            self._fd_watch.start()
            await self._probe_backends()
            self._watch_task = asyncio.ensure_future(self._watch())
            if self.store.url is not None:
                # several replicas on one store: one models metadata (and one controller)
                from .record.replicas import ReplicaSync

                self.replicas = ReplicaSync(
                    self,
                    self.store.url,
                    self.store.replica,
                    compact_every=self.deployment.store.compact_every,
                    compact_keep=self.deployment.store.compact_keep,
                    lease_period=self.deployment.store.lease_period,
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

    def _close_lease(self) -> None:
        if self.lease is not None:
            self.lease.close()
            self.lease = self.store.lease = None

    def _admin_access(self) -> AdminAccess | None:
        """The admin API's checks (None when it is off)."""
        admin = self.deployment.admin
        if not admin.enabled or self.admin_token is None:
            return None
        return AdminAccess.of(self.admin_token, self.deployment.host, admin.allowed_hosts)

    def _write_token_file(self) -> None:
        """Write the generated admin token where the ``wirekit serve models`` commands look
        for it (``admin.token_file``, else the runtime directory, named after the HTTP
        address); the path is logged, never the token."""
        if not self._token_generated or self._http_port is None:
            return
        assert self.admin_token is not None
        configured = self.deployment.admin.token_file
        path = (
            Path(configured)
            if configured is not None
            else default_token_file(self.deployment.host, self._http_port)
        )
        try:
            write_token_file(path, self.admin_token, private_dir=configured is None)
        except TokenFileError as exc:
            raise ConfigError("admin.token_file", str(exc)) from None
        self.admin_token_file = path
        log.info("wirekit serve: admin API token written to %s (mode 0600)", path)

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
        log.info(
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
            log.info("wirekit serve: model %s settings changed: %s", name, changed)
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
        # requests cut short by the drain's end are something to look at; a drain is not
        log.log(
            logging.WARNING if left else logging.INFO,
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
        node, device, quota = parse_quota(doc)  # ConfigError naming the bad field
        row = next((r for r in catalog.rows(name) if (r.node, r.device) == (node, device)), None)
        if row is None:
            raise ConfigError("body", f"model {name!r} has no row on {node}/{device}")
        decision = Decision(node, device, row.device_type, name, row.quota, quota, "admin", {})
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

    def _row_labels(self) -> dict[str, tuple[str, str]]:
        """Row key -> (model, device label) of every row of the catalog."""
        return {r.key: (r.model, device_label(r.key, r.model)) for r in self.catalog.rows()}

    def in_flight_by_device(self) -> dict[tuple[str, str], int]:
        """(model, device label) -> requests sent to that row's backend and not answered
        yet (the rows whose backend counts them)."""
        d = self.dispatcher
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

        extra["backoffs"] = {label(m, k): n for (m, k), n in self.router.backoffs.items()}
        d = self.dispatcher
        if d is not None:
            batches: dict[tuple[str, str], list[int]] = {}
            for key, counts in d.row_batches.items():
                model = labels.get(key, (key.rsplit("/", 1)[-1], ""))[0]
                batches[label(model, key)] = counts
            extra["batches"] = batches
        extra["in_flight"] = self.in_flight_by_device()
        extra["targets"] = catalog_targets(self.catalog)
        decisions: dict[tuple[str, str], int] = {}
        if self.controller:
            # Every counter from 0 (Prometheus' advice): the first decision is then a change
            # that `increase()`/`changes()` see, not a series that starts at 1.
            for model in self.catalog.models():
                for outcome in DECISION_OUTCOMES:
                    decisions[(model, outcome)] = 0
            decisions.update(self.controller.outcomes)
        extra["decisions"] = decisions
        extra["ready"] = self.readiness()["ready"]
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
        d = self.dispatcher
        snap["resubmissions"] = d.resubmissions if d else 0
        snap["batches"] = {"sent": d.batches if d else 0, "retried": d.batch_retries if d else 0}
        snap["lane_requests"] = d.lane_requests if d else 0
        return snap

    def _with_live(self, snap: dict[str, Any]) -> dict[str, Any]:
        """``snap`` with the per-model live figures (:meth:`live_figures`), the window they
        cover and readiness."""
        models = snap.setdefault("models", {})
        for model, figures in self.live_figures().items():
            models.setdefault(model, {}).update(figures)
        snap["stats_window"] = self.history.span
        snap["ready"] = self.readiness()["ready"]
        return snap

    def metrics_text(self) -> bytes:
        """The ``/metrics`` text: this process's figures (the same on every store)."""
        return self.metrics.prometheus(self.prometheus_extra())

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
        """``/stats``: the store's figures per model (on a shared store every replica's,
        with this replica's own under ``"local"``), and this process's live figures
        (:meth:`live_figures`)."""
        snap = self.stats()
        shared = await self.shared_stats()
        if shared is not None:
            local = {"queue": snap["queue"], "models": snap["models"]}
            snap.update(snapshot_of(shared))
            snap["local"] = local
            snap["replica"] = self.store.replica
        snap["store"] = self.store.kind
        return self._with_live(snap)

    async def http_metrics(self) -> bytes:
        """``/metrics``: this process's figures, on every store (each replica exports its
        own; a dashboard sums them)."""
        return self.metrics_text()

    # ------------------------------------------------------------------ health

    def liveness(self) -> dict[str, Any]:
        """The ``/healthz`` document: the loop answers (this runs on it)."""
        return {"ok": True, "loop_lag_seconds": self.loop_lag}

    def readiness(self, model: str | None = None) -> dict[str, Any]:
        """The ``/readyz`` document: ready when the store takes writes and every model
        (``model``: that one) has at least one device (a row with a quota) whose backend is
        reachable -- its last probe connected, and no failure of it since (the router's
        back-off); otherwise the reasons."""
        reasons: list[str] = []
        store = self.store.write_problem()
        if store is not None:
            reasons.append(store)
        d = self.dispatcher
        models: dict[str, Any] = {}
        if d is None:
            reasons.append("not started")
        else:
            router = self.router
            backed_off = set(router.backed_off())
            failed_at = router.failed_at
            for name in sorted(d.models) if model is None else [model]:
                devices: dict[str, str] = {}
                for row in router.rows(name):
                    probe = self._probes.get(row.key)
                    if row.backend == "kubemo":  # not probed: the router's word alone
                        probe = (-math.inf, None)
                    if probe is None:
                        state = "not probed yet"
                    elif probe[1] is not None:
                        state = f"unreachable: {probe[1]}"
                    elif row.key in backed_off and failed_at.get(row.key, 0.0) > probe[0]:
                        state = "backed off after a failure"
                    else:
                        state = "reachable"
                    devices[device_label(row.key, name)] = state
                ok = "reachable" in devices.values()
                if not ok:
                    why = (
                        "; ".join(f"{k}: {v}" for k, v in devices.items())
                        or "no device has a quota for it"
                    )
                    reasons.append(f"model {name}: no reachable device ({why})")
                models[name] = {"ready": ok, "devices": devices}
        return {
            "ready": not reasons,
            "reasons": reasons,
            "store": {"kind": self.store.kind, "ok": store is None},
            "models": models,
        }

    async def _probe_row(self, row: DeviceRow) -> str | None:
        """Why the backend of ``row`` cannot be reached now, or None: a TCP connection
        opened and closed (MIP), a live container registered (Clipper).  KubeMo's server is
        not probed (a connection closed without a request stops its serving thread): the
        router's back-off alone says whether it answers."""
        if row.key in self._given_backends:
            return None  # given by the caller (tests): taken as reachable
        if row.backend == "clipper":
            if self.clipper is None or not row.clipper_name:
                return "no Clipper RPC port"
            if any(r.alive for r in self.clipper.replicas(row.clipper_name)):
                return None
            return f"no Clipper container {row.clipper_name!r} registered"
        if row.port is None:
            return "no port"
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(row.endpoint, row.port), PROBE_TIMEOUT
            )
        except (OSError, asyncio.TimeoutError) as exc:
            text = getattr(exc, "strerror", None) or str(exc) or "no answer in time"
            return f"{row.endpoint}:{row.port}: {text}"
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None

    async def _probe_backends(self) -> None:
        """Probe the backend of every routed row at once (:meth:`_probe_row`)."""
        d = self.dispatcher
        if d is None:
            return
        rows = [
            row
            for name in list(d.models)
            for row in self.router.rows(name)
            if row.backend != "kubemo"
        ]
        clock = self.router.clock
        results = await asyncio.gather(*(self._probe_row(r) for r in rows), return_exceptions=True)
        now = clock()
        keep = {}
        for row, result in zip(rows, results, strict=True):
            if isinstance(result, BaseException):
                result = str(result) or type(result).__name__
            keep[row.key] = (now, result)
        self._probes = keep

    async def _watch(self) -> None:
        """Every second: a snapshot of the histograms, the loop's lag; every
        :data:`PROBE_INTERVAL`: a probe of the backends."""
        loop = asyncio.get_running_loop()
        next_probe = loop.time() + PROBE_INTERVAL
        while True:
            due = loop.time() + SNAPSHOT_INTERVAL
            await asyncio.sleep(SNAPSHOT_INTERVAL)
            self.loop_lag = max(0.0, loop.time() - due)
            self.history.take()
            if loop.time() >= next_probe:
                try:
                    await self._probe_backends()
                except Exception:  # pragma: no cover - a probe's own errors are results
                    log.exception("wirekit serve: probing the backends failed")
                next_probe = loop.time() + PROBE_INTERVAL

    async def stop(self, grace: float = 5.0) -> None:
        """Stop the controller, close the listeners, let requests in flight finish (up to
        ``grace`` seconds), then close the backends and the store."""
        task, self._controller_task = self._controller_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=grace)
        watch, self._watch_task = self._watch_task, None
        if watch is not None:
            watch.cancel()
            await asyncio.wait({watch}, timeout=grace)
        if self.replicas is not None:
            await self.replicas.close()
            self.replicas = None
        for srv in self._mip_servers.values():
            srv.close()
        self._fd_watch.stop()
        if self._http is not None:
            await self._http.stop()
            self._http = None
        if self.admin_token_file is not None:
            assert self.admin_token is not None
            remove_token_file(self.admin_token_file, self.admin_token)
            self.admin_token_file = None
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
        lease_task, self._lease_task = self._lease_task, None
        if lease_task is not None:
            lease_task.cancel()
            await asyncio.wait({lease_task}, timeout=grace)
        if self.lease is not None:
            try:  # what is left queued is the leader's to end at its next sweep
                await asyncio.to_thread(self.lease.release)
            except Exception as exc:
                log.warning("wirekit serve: releasing this replica's lease: %s", exc)
            self._close_lease()
        if self._shared_db is not None:
            self._shared_db.close()
            self._shared_db = None
