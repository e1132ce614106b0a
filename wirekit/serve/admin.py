"""The admin operations of ``wirekit serve``: models added, removed, their settings and
quotas changed while it serves (the ``/admin/models`` API of the HTTP front door, the
``wirekit serve models`` commands), and the admin API's bearer token.

:class:`ModelAdmin` validates a request's document (:func:`~wirekit.serve.config.parse_model`,
:func:`~wirekit.serve.config.parse_settings`, :func:`~wirekit.serve.config.parse_quota`) and
changes the catalog, which the router and the dispatcher follow.  Who may call it is the
HTTP front door's concern (:mod:`wirekit.serve.doors.adminauth`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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
from .control.catalog import CatalogError
from .control.controller import Decision, decision_record, set_decided_quota
from .doors.adminauth import (
    AdminAccess,
    TokenFileError,
    default_token_file,
    new_token,
    remove_token_file,
    write_token_file,
)
from .logs import serve_logger

log = serve_logger()


class ModelAdmin:
    """The admin operations of a :class:`~wirekit.serve.service.Service` (``service``: its
    ``catalog``, ``dispatcher``, ``metrics``, ``controller``, ``clipper``, MIP front doors
    and ``can_serve()`` are used), and its admin token.

    The token is the configured one (``token``, from :func:`~wirekit.serve.config.validate`),
    else one generated here and written to :attr:`admin_token_file` at start (None: no admin
    API)."""

    def __init__(self, service: Any, deployment: Deployment, token: str | None) -> None:
        self.service = service
        self.deployment = deployment
        #: the admin API's bearer token (None: no admin API)
        self.admin_token = token
        self._token_generated = False
        admin = deployment.admin
        if token is None and admin.enabled and deployment.http_port is not None:
            self.admin_token, self._token_generated = new_token(), True
        #: where the generated token is, while the service runs (None: none generated)
        self.admin_token_file: Path | None = None
        #: the models being removed (refused by the other operations meanwhile)
        self.removing: set[str] = set()

    def access(self) -> AdminAccess | None:
        """The admin API's checks (None when it is off)."""
        admin = self.deployment.admin
        if not admin.enabled or self.admin_token is None:
            return None
        return AdminAccess.of(self.admin_token, self.deployment.host, admin.allowed_hosts)

    def write_token(self, http_port: int | None) -> None:
        """Write the generated admin token where the ``wirekit serve models`` commands look
        for it (``admin.token_file``, else the runtime directory, named after the HTTP
        address); the path is logged, never the token."""
        if not self._token_generated or http_port is None:
            return
        assert self.admin_token is not None
        configured = self.deployment.admin.token_file
        path = (
            Path(configured)
            if configured is not None
            else default_token_file(self.deployment.host, http_port)
        )
        try:
            write_token_file(path, self.admin_token, private_dir=configured is None)
        except TokenFileError as exc:
            raise ConfigError("admin.token_file", str(exc)) from None
        self.admin_token_file = path
        log.info("wirekit serve: admin API token written to %s (mode 0600)", path)

    async def add_model(self, model: ModelConfig, rows: Iterable[DeviceRow]) -> None:
        """Serve ``model`` from now on: its rows join the catalog (refused with a
        :class:`CatalogError` that says what is free when a share is not), backends, its
        HTTP routes and metrics, and its MIP front door when it has a ``mip_port``."""
        if self.service.dispatcher is None:
            raise RuntimeError("the service is not started")
        rows = list(rows)
        name = model.name
        if name in self.removing:
            raise CatalogError(f"model {name!r} is being removed: add it again once it is gone")
        if model.backend == "clipper" and self.service.clipper is None:
            raise CatalogError(
                f"model {name!r}: a Clipper model needs the Clipper RPC port"
                " (listen.clipper_rpc_port), which this dispatcher does not open"
            )
        server = None
        if model.mip_port is not None:
            try:
                server = await self.service.open_front_door(model)
            except OSError as exc:
                raise CatalogError(
                    f"model {name!r}: cannot listen on port {model.mip_port}: {exc.strerror or exc}"
                ) from None
        try:
            self.service.catalog.add_model(model, rows)
        except BaseException:
            if server is not None:
                server.close()
            raise
        if server is not None:
            self.service.mip_servers[name] = server
        log.info(
            "wirekit serve: model %s added (%s)",
            name,
            ", ".join(f"{r.key} {r.quota:g}" for r in rows if r.quota > 0),
        )

    async def add_model_doc(self, doc: Any) -> dict[str, Any]:
        """:meth:`add_model` from a document (``POST /admin/models``, see
        :func:`wirekit.serve.config.parse_model`); returns the model's entry of
        :meth:`models_doc`."""
        catalog = self.service.catalog
        endpoints = {r.node: r.endpoint for r in catalog.rows()}
        model, rows = parse_model(doc, catalog.devices(), endpoints)
        await self.add_model(model, rows)
        return self.model_doc(model.name)

    def set_model_doc(self, name: str, doc: Any) -> dict[str, Any]:
        """Change the settings of model ``name`` in place (``PATCH /admin/models/{name}``,
        body: some of :data:`~wirekit.serve.config.LIVE_SETTINGS`, validated as the config
        file's ``models.<name>`` table is, see :func:`~wirekit.serve.config.parse_settings`).
        New requests use them at once (MIP connections already open included), requests in
        flight finish with theirs; on a shared store every replica follows.  Returns the
        model's entry of :meth:`models_doc`.  KeyError for an unknown model,
        :class:`ConfigError` for a bad value or a setting that cannot change live,
        :class:`CatalogError` while the model is being removed."""
        model = self.service.catalog.model(name)  # KeyError
        if name in self.removing:
            raise CatalogError(f"model {name!r} is being removed")
        new = parse_settings(doc, model)
        self.service.catalog.set_model(new)
        changed = {k: v for k, v in live_settings(new).items() if getattr(model, k) != v}
        if changed:
            log.info("wirekit serve: model %s settings changed: %s", name, changed)
        return self.model_doc(name)

    async def remove_model(self, name: str, drain_timeout: float | None = None) -> dict[str, Any]:
        """Stop serving ``name``: new requests get a clear error at once (MIP: an error
        reply; HTTP: 410), its MIP front door stops listening, requests in flight finish and
        are answered (within ``drain_timeout``, default ``admin.drain_timeout``), then its
        quotas are released, its backends and front-door connections closed.  KeyError if
        there is no such model; :class:`CatalogError` if it is being removed already."""
        d = self.service.dispatcher
        if d is None:
            raise RuntimeError("the service is not started")
        if name in self.removing:
            raise CatalogError(f"model {name!r} is being removed already")
        model = self.service.catalog.model(name)  # KeyError
        self.removing.add(name)
        try:
            d.drain(name, model.apps)
            server = self.service.mip_servers.pop(name, None)
            if server is not None:
                server.close()
            if drain_timeout is None:
                drain_timeout = self.deployment.admin.drain_timeout
            loop = asyncio.get_running_loop()
            until = loop.time() + drain_timeout
            in_flight = self.service.metrics.in_flight
            while in_flight(name) > 0 and loop.time() < until:
                await asyncio.sleep(0.005)
            left = in_flight(name)
            keys = [r.key for r in self.service.catalog.rows(name)]
            self.service.catalog.remove_model(name)  # quotas released; the router drops it
            await d.remove_backends(keys)
            # requests cut short by the backends' closing are answered (failed) meanwhile
            until = loop.time() + 1.0
            while in_flight(name) > 0 and loop.time() < until:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0)  # the answers owed are written (the front doors flush)
            for door in list(self.service.front_conns.pop(name, ())):
                door.close()
        finally:
            self.removing.discard(name)
        # requests cut short by the drain's end are something to look at; a drain is not
        log.log(
            logging.WARNING if left else logging.INFO,
            "wirekit serve: model %s removed (%s)",
            name,
            "drained" if not left else f"{left} request(s) still in flight after the drain",
        )
        return {"removed": name, "drained": not left, "in_flight_at_timeout": left}

    def model_doc(self, name: str) -> dict[str, Any]:
        catalog = self.service.catalog
        model = catalog.model(name)
        server = self.service.mip_servers.get(name)
        return {
            "backend": model.backend,
            "mip_port": server.sockets[0].getsockname()[1] if server is not None else None,
            "timeout": model.timeout,
            "attempts": model.attempts,
            "apps": list(model.apps),
            "max_batch": model.max_batch,
            "target": model.target,
            # what it declares of itself (specs/serve.md; not live settings)
            "inputs": [spec.document() for spec in model.inputs],
            "outputs": [spec.document() for spec in model.outputs],
            "versions": list(model.versions),
            "platform": model.platform,
            "tensors": model.tensors,
            "removing": name in self.removing,
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
        catalog = self.service.catalog
        catalog.model(name)  # KeyError
        node, device, quota = parse_quota(doc)  # ConfigError naming the bad field
        row = next((r for r in catalog.rows(name) if (r.node, r.device) == (node, device)), None)
        if row is None:
            raise ConfigError("body", f"model {name!r} has no row on {node}/{device}")
        decision = Decision(node, device, row.device_type, name, row.quota, quota, "admin", {})
        if self.service.controller is not None:
            # an operator's decision: stored from any replica, not only the leader
            return await self.service.controller.apply(decision, fenced=False)
        error = set_decided_quota(catalog, decision, self.service.can_serve)
        status = "refused" if error is not None else "applied"
        log.info("admin: %s %s %g -> %g%s", row.key, status, row.quota, quota,
                 f": {error}" if error else "")  # fmt: skip
        return decision_record(decision, status, error, time.time())

    def models_doc(self) -> dict[str, Any]:
        """The ``GET /admin/models`` document: every model and its rows, and the free share
        of every device."""
        catalog = self.service.catalog
        return {
            "version": catalog.version,
            "models": {name: self.model_doc(name) for name in catalog.models()},
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

    def remove_token(self) -> None:
        """Remove the generated token's file (at stop), if it still holds this token."""
        if self.admin_token_file is not None:
            assert self.admin_token is not None
            remove_token_file(self.admin_token_file, self.admin_token)
            self.admin_token_file = None
