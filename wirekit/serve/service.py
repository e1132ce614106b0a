"""The running service: builds the dispatcher from a :class:`Deployment` and opens its doors.

>>> service = Service(load_config("deployment.json"))   # doctest: +SKIP
>>> await service.start(); service.addresses()           # doctest: +SKIP
{'http': 8080, 'mip': {'m1': 9001}, 'clipper_rpc': None}
>>> await service.stop()                                 # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import random
from functools import partial
from types import ModuleType
from typing import Any

from aiohttp import web

from wirekit.mip.limits import BufferBudget

from .actuators import build_actuator
from .backends import Backend, ClipperBackend, KubeMoBackend, MipBackend
from .cache import ResponseCache
from .catalog import Catalog
from .config import ConfigError, Deployment, DeviceRow
from .controller import Controller, quota_rows
from .dispatcher import Dispatcher
from .http import build_app
from .metrics import Metrics, Window
from .mipfront import MipFrontDoor
from .payload import Payload
from .router import Router
from .store import RequestStore


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
            payloads=deployment.store.payloads,
            batch_max=deployment.store.batch_max,
            journal=deployment.store.journal,
            flush_interval=deployment.store.flush_interval,
        )
        ctl = deployment.controller
        #: the recent window the controller reads (kept only when a controller is configured)
        window = Window(ctl.window, min(1.0, ctl.period / 2)) if ctl is not None else None
        self.metrics = Metrics(deployment.models, window=window)
        self.cache: ResponseCache[Payload] = ResponseCache(
            deployment.cache.max_entries, deployment.cache.ttl, deployment.cache.max_bytes
        )
        #: the models metadata: the one source of truth of models, rows and quotas; the
        #: router follows its every change
        self.catalog = Catalog(deployment.models, deployment.rows)
        self.router = Router.following(self.catalog, backoff=deployment.backoff, rng=rng)
        self._given_backends = backends or {}
        self._lane = lane  # the MIP lane's twin (tests choose; default: the dispatcher's)
        self.dispatcher: Dispatcher | None = None
        self._tasks: set[asyncio.Task] = set()
        self._mip_servers: dict[str, asyncio.Server] = {}
        #: the bytes every MIP front-door connection holds, against ``mip.max_buffered``
        self.mip_budget = BufferBudget(deployment.mip.max_buffered)
        self._runner: web.AppRunner | None = None
        self._http_port: int | None = None
        self.clipper: Any = None  # the embedded Clipper RPC frontend, when a model uses Clipper
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
                    self.metrics.recent,
                    actuator,
                    store=self.store,
                    can_serve=self._can_serve,
                )
            except ValueError as exc:
                raise ConfigError("controller.policy", str(exc)) from None

    def _backend_for(self, row: DeviceRow) -> Backend:
        if row.key in self._given_backends:
            return self._given_backends[row.key]
        timeout = self.deployment.models[row.model].timeout
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
        try:
            self.metrics.load(reader)
        finally:
            reader.close()
        loop = asyncio.get_running_loop()
        try:
            if dep.clipper_rpc_port is not None:
                from wirekit.clipper.frontend import Frontend

                host = f"[{dep.host}]" if ":" in dep.host else dep.host
                self.clipper = Frontend(
                    f"tcp://{host}:{dep.clipper_rpc_port}", dep.clipper_generation
                ).start()
            # Rows at quota 0 with a backend port get their backend too: the controller may
            # give them a share later (lazy: nothing connects until a request is routed).
            backends = {
                r.key: self._backend_for(r)
                for r in dep.rows
                if r.quota > 0 or (self.controller is not None and r.port is not None)
            }
            self.dispatcher = Dispatcher(
                dep.models,
                self.router,
                backends,
                self.store,
                self.metrics,
                self.cache,
                lane=self._lane,
            )
            for name, model in dep.models.items():
                if model.mip_port is None:
                    continue
                self._mip_servers[name] = await loop.create_server(
                    partial(
                        MipFrontDoor, self.dispatcher, name, self._tasks, dep.mip, self.mip_budget
                    ),
                    dep.host,
                    model.mip_port,
                )
            if dep.http_port is not None:
                app = build_app(
                    self.dispatcher,
                    dep.app_models(),
                    self.stats,
                    self.metrics_text,
                    max_items=dep.mip.max_items,
                    controller=self.controller_state,
                )
                self._runner = web.AppRunner(app, access_log=None)
                await self._runner.setup()
                site = web.TCPSite(self._runner, dep.host, dep.http_port)
                await site.start()
                self._http_port = self._runner.addresses[0][1]  # the port bound
            if self.controller is not None:
                self._controller_task = asyncio.ensure_future(self.controller.run())
        except BaseException:
            await self.stop()
            raise

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
        """Whether the dispatcher has a backend for ``row`` (a share can be given to it)."""
        return self.dispatcher is not None and row.key in self.dispatcher.backends

    def quotas(self) -> list[dict[str, Any]]:
        """Every row of the catalog with its current quota."""
        return quota_rows(self.catalog)

    def controller_state(self) -> dict[str, Any]:
        """The ``GET /controller`` document."""
        if self.controller is None:
            return {"enabled": False, "quotas": self.quotas(), "decisions": []}
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
        return self.metrics.prometheus(self.extra())

    async def stop(self, grace: float = 5.0) -> None:
        """Stop the controller, close the listeners, let requests in flight finish (up to
        ``grace`` seconds), then close the backends and the store."""
        task, self._controller_task = self._controller_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=grace)
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
