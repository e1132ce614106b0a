"""The running service: builds the dispatcher from a :class:`Deployment`, opens its doors,
and stops it all (assembly and lifecycle).

>>> service = Service(load_config("deployment.json"))   # doctest: +SKIP
>>> await service.start(); service.addresses()           # doctest: +SKIP
{'http': 8080, 'grpc': None, 'mip': {'m1': 9001}, 'clipper_rpc': None}
>>> await service.stop()                                 # doctest: +SKIP

What it tells of itself is :mod:`~wirekit.serve.observability`'s (``/stats``, ``/metrics``,
``/controller``), whether it can serve :mod:`~wirekit.serve.health`'s (``/healthz``,
``/readyz``, the probes of the backends), and the models changed while it serves
:mod:`~wirekit.serve.admin`'s (``/admin/models``); the service's methods of the same names
hand over to them.
"""

from __future__ import annotations

import asyncio
import random
import weakref
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from wirekit._memory import MemoryReturn
from wirekit.mip.limits import BufferBudget

from .admin import ModelAdmin
from .backends.remote import Backend, ClipperBackend, KubeMoBackend, MipBackend
from .config import SERVER_KINDS, ConfigError, Deployment, DeviceRow, ModelConfig, validate
from .control.catalog import Catalog, CatalogChange
from .control.controller import Controller
from .control.metrics import Metrics, ModelStats, RecentStats, Window
from .dispatch.cache import ResponseCache
from .dispatch.dispatcher import Dispatcher
from .dispatch.payload import Payload
from .dispatch.router import Router
from .doors.adminauth import ADMIN_TOKEN_ENV, admin_token, is_loopback
from .doors.fdwatch import FdWatch
from .doors.http import build_app
from .doors.httpdoor import HttpDoor
from .doors.mipfront import MipFrontDoor
from .health import PROBE_INTERVAL, PROBE_TIMEOUT, Health
from .logs import serve_logger
from .observability import SNAPSHOT_INTERVAL, Observability
from .record.decisions import OPERATOR
from .record.store import RequestStore

if TYPE_CHECKING:
    from .doors.grpcdoor import GrpcDoor
    from .record.pgsync import ReplicaLease
    from .record.replicas import ReplicaSync

log = serve_logger()

#: time slots of the controller's metrics window per model at most (memory: slots × the
#: histogram buckets used, whatever the traffic)
WINDOW_SLOTS = 600

__all__ = [
    "ADMIN_TOKEN_ENV",
    "PROBE_INTERVAL",
    "PROBE_TIMEOUT",
    "SNAPSHOT_INTERVAL",
    "Service",
    "admin_token",
    "is_loopback",
]


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
        checked = validate(deployment)  # ConfigError: what `serve check` refuses too
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
        #: ``/stats``, ``/metrics`` and ``/controller``
        self.observability = Observability(self, self.metrics)
        self._given_backends = backends or {}
        #: ``/healthz``, ``/readyz`` and the probes of the backends
        self.health = Health(self, given=self._given_backends)
        self._watch_task: asyncio.Task | None = None
        self.cache: ResponseCache[Payload] = ResponseCache(
            deployment.cache.max_entries, deployment.cache.ttl, deployment.cache.max_bytes
        )
        #: the models metadata: the one source of truth of models, rows and quotas; the
        #: router follows its every change
        self.catalog = Catalog(deployment.models, deployment.rows)
        #: the admin operations (``/admin/models``) and the admin API's token
        self.admin = ModelAdmin(self, deployment, checked.admin_token)
        #: Clipper application name -> model, kept up to date as models come and go
        self.apps: dict[str, str] = self.catalog.app_models()
        self.catalog.subscribe(self._follow)  # backends first, then the router draws on them
        self.catalog.subscribe(self.observability.follow)  # a removed model's series dropped
        self.router = Router.following(self.catalog, backoff=deployment.backoff, rng=rng)
        #: the MIP front-door connections of each model (closed when it is removed)
        self.front_conns: dict[str, weakref.WeakSet[MipFrontDoor]] = {}
        self._lane = lane  # the MIP lane's twin (tests choose; default: the dispatcher's)
        self.dispatcher: Dispatcher | None = None
        self._tasks: set[asyncio.Task] = set()
        #: the MIP front door of each model that has one
        self.mip_servers: dict[str, asyncio.Server] = {}
        #: the one memory budget of this process: every front door (MIP and HTTP) charges it
        self.budget = BufferBudget(deployment.mip.memory_budget)
        #: gives memory back to the system after big connections end (wirekit._memory)
        self.memory_return = MemoryReturn()
        self._http: HttpDoor | None = None
        self._http_port: int | None = None
        #: the OIP gRPC door (``listen.grpc_port``; imported only when configured)
        self._grpc: GrpcDoor | None = None
        self._grpc_port: int | None = None
        #: says when accept fails on any door for lack of file descriptors
        self._fd_watch = FdWatch()
        self.clipper: Any = None  # the embedded Clipper RPC frontend, when a model uses Clipper
        #: on a shared store: the models metadata shared with the other replicas
        self.replicas: ReplicaSync | None = None
        #: on a shared store: this replica's lease (taken when the store opens)
        self.lease: ReplicaLease | None = None
        self._lease_task: asyncio.Task | None = None
        #: the controller (None unless the config has a ``controller`` table)
        self.controller: Controller | None = None
        self._controller_task: asyncio.Task | None = None
        if ctl is not None:
            self.controller = Controller(
                ctl,
                self.catalog,
                self._recent,
                checked.actuator,
                store=self.store,
                recent_rows=self._recent_rows,
                policy=checked.policy,
                can_serve=self.can_serve,
            )

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

    def backend_for(self, row: DeviceRow) -> Backend:
        if row.key in self._given_backends:
            return self._given_backends[row.key]
        timeout = self.catalog.model(row.model).timeout
        if row.backend == "clipper":
            assert self.clipper is not None and row.clipper_name
            return ClipperBackend(self.clipper, row.clipper_name, timeout=timeout)
        assert row.port is not None
        if row.backend in SERVER_KINDS:
            return self._server_backend(row, timeout)
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

    def _server_backend(self, row: DeviceRow, timeout: float) -> Backend:
        """The backend of a row whose device is a model server (``oip``, ``tfserving``)."""
        from .backends.oip import OipGrpcBackend, OipRestBackend, TfServingBackend
        from .backends.servers import server_address

        model = self.catalog.model(row.model)
        address = server_address(row, model)
        connections = self.deployment.connections
        if row.backend == "tfserving":
            return TfServingBackend(address, model, connections=connections, timeout=timeout)
        if model.grpc:
            return OipGrpcBackend(address, model, timeout=timeout)
        return OipRestBackend(address, model, connections=connections, timeout=timeout)

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
            self.observability.shared_db = reader
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
            # the models with load = true, on their servers before any door opens
            await self.admin.load_config_models()
            bind = getattr(self.controller.actuator if self.controller else None, "bind", None)
            if bind is not None:  # the repository actuator loads through the admin
                bind(self.admin, asyncio.get_running_loop())
            backends = {r.key: self.backend_for(r) for r in catalog.rows() if r.quota > 0}
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
                    self.mip_servers[name] = await self.open_front_door(model)
            if dep.http_port is not None:
                app = build_app(
                    self.dispatcher,
                    self.apps,
                    self.observability.http_stats,
                    self.observability.http_metrics,
                    max_items=dep.mip.max_items,
                    max_message_size=dep.mip.max_message_size,
                    admin=self.admin if dep.admin.enabled else None,
                    admin_access=self.admin.access(),
                    controller=self.observability.controller_state,
                    limits=dep.http,
                    health=self.health.liveness,
                    readiness=self.health.readiness,
                )
                self._http = HttpDoor(app, dep.http, self.budget)
                self._http_port = await self._http.start(dep.host, dep.http_port)
                self.admin.write_token(self._http_port)
            if dep.grpc_port is not None:
                await self._open_grpc_door()
            self._fd_watch.start()
            await self.health.probe()
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
                    lease=self.deployment.store.lease,
                )
                await self.replicas.start()
                if self.controller is not None:
                    # decisions stored through the lead, fenced by its term: only while leading
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

    def leadership(self) -> dict[str, Any] | None:
        """This replica's own view of the lead on a shared store (``/stats``' ``leader``):
        ``leading`` -- whether it would act as leader now (its lease renewed in time; its
        actions are still fenced by the term in the store) --, ``term`` it leads under
        (None when not leading) and ``terms``, how many times it became leader.  None on
        the embedded store."""
        if self.replicas is None:
            return None
        lock = self.replicas.leader
        term = lock.term
        return {"leading": term is not None, "term": term, "terms": lock.terms}

    def _close_lease(self) -> None:
        if self.lease is not None:
            self.lease.close()
            self.lease = self.store.lease = None

    async def _open_grpc_door(self) -> None:
        """Open the OIP gRPC door (``listen.grpc_port``) on the dispatcher (ConfigError when
        grpcio or protobuf, of the ``serve`` extra, is not installed)."""
        try:
            from .doors.grpcdoor import GrpcDoor, OipGrpcHandlers
        except ImportError as exc:
            raise ConfigError(
                "listen.grpc_port",
                f"the gRPC door needs grpcio and protobuf ({exc.name} is not installed): "
                "pip install 'wirekit[serve]'",
            ) from None

        dep = self.deployment
        assert self.dispatcher is not None and dep.grpc_port is not None
        handlers = OipGrpcHandlers(
            self.dispatcher,
            self.budget,
            max_items=dep.mip.max_items,
            readiness=self.health.readiness,
        )
        self._grpc = GrpcDoor(handlers, dep.grpc)
        self._grpc_port = await self._grpc.start(dep.host, dep.grpc_port)

    async def open_front_door(self, model: ModelConfig) -> asyncio.Server:
        """Open the MIP front door of ``model`` (its connections are remembered)."""
        dep = self.deployment
        conns = self.front_conns.setdefault(model.name, weakref.WeakSet())
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
            d.add_model(catalog.model(change.model), {r.key: self.backend_for(r) for r in rows})
            self.metrics.stats(change.model)
        elif change.kind == "quota" and change.new:
            key = f"{change.node}/{change.device}/{change.model}"
            if key not in d.backends:
                (row,) = [r for r in self.catalog.rows(change.model) if r.key == key]
                d.add_backends({key: self.backend_for(row)})
            else:
                d.routes_changed()
        else:
            d.routes_changed()

    def addresses(self) -> dict[str, Any]:
        """The ports actually bound (useful when the config asked for port 0)."""
        return {
            "host": self.deployment.host,
            "http": self._http_port,
            "grpc": self._grpc_port,
            "mip": {
                name: srv.sockets[0].getsockname()[1] for name, srv in self.mip_servers.items()
            },
            "clipper_rpc": (int(self.clipper.endpoint.rsplit(":", 1)[1]) if self.clipper else None),
        }

    def can_serve(self, row: DeviceRow) -> bool:
        """Whether ``row`` has a backend, or one can be made for it when it is given a share
        (:meth:`_follow` makes it): a port, or a Clipper container name with the Clipper
        RPC port open."""
        d = self.dispatcher
        if d is not None and row.key in d.backends:
            return True
        if row.backend == "clipper":
            return self.clipper is not None and bool(row.clipper_name)
        return row.port is not None

    # ------------------------------------------------------------------ handed over

    @property
    def admin_token(self) -> str | None:
        """The admin API's bearer token (:class:`~wirekit.serve.admin.ModelAdmin`)."""
        return self.admin.admin_token

    @property
    def admin_token_file(self) -> Path | None:
        """Where the generated admin token is, while the service runs (None: none)."""
        return self.admin.admin_token_file

    async def add_model(self, model: ModelConfig, rows: Iterable[DeviceRow]) -> None:
        """:meth:`ModelAdmin.add_model <wirekit.serve.admin.ModelAdmin.add_model>`."""
        await self.admin.add_model(model, rows)

    async def add_model_doc(self, doc: Any, *, by: str = OPERATOR) -> dict[str, Any]:
        return await self.admin.add_model_doc(doc, by=by)

    async def set_model_doc(self, name: str, doc: Any, *, by: str = OPERATOR) -> dict[str, Any]:
        return await self.admin.set_model_doc(name, doc, by=by)

    async def remove_model(
        self, name: str, drain_timeout: float | None = None, *, by: str | None = None
    ) -> dict[str, Any]:
        """:meth:`ModelAdmin.remove_model <wirekit.serve.admin.ModelAdmin.remove_model>`."""
        return await self.admin.remove_model(name, drain_timeout, by=by)

    async def set_quota_doc(self, name: str, doc: Any, *, by: str = OPERATOR) -> dict[str, Any]:
        return await self.admin.set_quota_doc(name, doc, by=by)

    def models_doc(self) -> dict[str, Any]:
        return self.admin.models_doc()

    def liveness(self) -> dict[str, Any]:
        return self.health.liveness()

    def readiness(self, model: str | None = None) -> dict[str, Any]:
        return self.health.readiness(model)

    @property
    def http_door(self) -> HttpDoor | None:
        """The HTTP front door while it listens (None: not started, or stopped)."""
        return self._http

    @property
    def loop_lag(self) -> float:
        return self.health.loop_lag

    def stats(self) -> dict[str, Any]:
        return self.observability.stats()

    async def http_stats(self) -> dict[str, Any]:
        return await self.observability.http_stats()

    async def http_metrics(self) -> bytes:
        return await self.observability.http_metrics()

    def metrics_text(self) -> bytes:
        return self.observability.metrics_text()

    async def shared_stats(self) -> dict[str, ModelStats] | None:
        return await self.observability.shared_stats()

    def live_figures(self) -> dict[str, dict[str, Any]]:
        return self.observability.live_figures()

    def prometheus_extra(self) -> dict[str, Any]:
        return self.observability.prometheus_extra()

    def quotas(self) -> list[dict[str, Any]]:
        return self.observability.quotas()

    def controller_state(self) -> dict[str, Any]:
        return self.observability.controller_state()

    async def _watch(self) -> None:
        """Every second: a snapshot of the histograms, the loop's lag; every
        :data:`PROBE_INTERVAL`: a probe of the backends."""
        loop = asyncio.get_running_loop()
        next_probe = loop.time() + PROBE_INTERVAL
        while True:
            due = loop.time() + SNAPSHOT_INTERVAL
            await asyncio.sleep(SNAPSHOT_INTERVAL)
            self.health.loop_lag = max(0.0, loop.time() - due)
            self.observability.history.take()
            if loop.time() >= next_probe:
                try:
                    await self.health.probe()
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
        for srv in self.mip_servers.values():
            srv.close()
        self._fd_watch.stop()
        if self._http is not None:
            await self._http.stop()
            self._http = None
        if self._grpc is not None:
            await self._grpc.stop(grace)
            self._grpc = None
        self.admin.remove_token()
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
        self.mip_servers.clear()
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
        shared_db, self.observability.shared_db = self.observability.shared_db, None
        if shared_db is not None:
            shared_db.close()
