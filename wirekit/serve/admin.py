"""The admin operations of ``wirekit serve``: models added, removed, their settings and
quotas changed while it serves (the ``/admin/models`` API of the HTTP front door, the
``wirekit serve models`` commands), and the admin API's bearer token.

:class:`ModelAdmin` validates a request's document (:func:`~wirekit.serve.config.parse_model`,
:func:`~wirekit.serve.config.parse_settings`, :func:`~wirekit.serve.config.parse_quota`) and
changes the catalog, which the router and the dispatcher follow.  Who may call it is the
HTTP front door's concern (:mod:`wirekit.serve.doors.adminauth`).

A model with ``load = true`` (``oip`` backends) is loaded on its devices' servers through
their repository API (:mod:`wirekit.serve.backends.oipcontrol`) before it joins the catalog,
and unloaded after its removal's drain where this process loaded it:

* :meth:`ModelAdmin.load_model` asks every server of the model's rows with a quota at once;
  a server that already serves the model is left as it is (``already loaded``) and is not
  unloaded later; when any server fails, what this call loaded is unloaded again and
  :class:`ModelLoadError` names every device and its result: nothing is half-added.
* :meth:`ModelAdmin.unload_model` unloads where :meth:`load_model` (or the ``repository``
  actuator) loaded it; per device ``unloaded``, ``left loaded (not loaded by wirekit)`` or
  ``failed: ...``.
* :meth:`ModelAdmin.follow_quotas` is the ``repository`` actuator's work: a GPU row of the
  model at quota 0 is unloaded from its server, one above 0 loaded.

Every change asked through the admin API is a decision (issue 38), whoever asked and
whether a controller runs or not: a quota set, a model added, removed or its settings
changed is kept for ``GET /controller`` (the controller's list, else :attr:`ModelAdmin.decisions`)
and stored in the store's ``decisions`` table from any replica (not fenced), with who asked
(``by``: :func:`~wirekit.serve.record.decisions.operator`), what (``kind``) and the values
before and after (:mod:`wirekit.serve.record.decisions`).  A change that was tried and did
not happen is a decision too: ``refused`` (409: the catalog or the state of the model said
no) or ``failed`` (502: a server failed the load; an actuator failed); a request refused
before anything was tried (400: a bad document; 404: an unknown model) is not.  A ``set``
that changes no value, and the changes a replica follows from another's, are not decisions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .backends.oipcontrol import (
    ModelLoadError,
    RepositoryError,
    load,
    model_ready,
    unload,
    where,
)
from .backends.servers import ServerAddress, server_address
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
from .control.controller import (
    APPLIED,
    FAILED,
    LAST_DECISIONS,
    REFUSED,
    Decision,
    decision_record,
    set_decided_quota,
)
from .doors.adminauth import (
    AdminAccess,
    TokenFileError,
    default_token_file,
    new_token,
    remove_token_file,
    write_token_file,
)
from .logs import serve_logger
from .record.decisions import ADD, ADMIN_REASON, OPERATOR, REMOVE, SET, model_decision

log = serve_logger()

#: a device's result of a load: this process loaded the model there
LOADED = "loaded"
#: the server served the model before this process asked (never unloaded by wirekit)
ALREADY_LOADED = "already loaded"
#: unloaded by this process (the ``repository`` actuator, a quota of 0)
UNLOADED = "unloaded"
#: what a removal says of a device where wirekit did not load the model
LEFT_LOADED = "left loaded (not loaded by wirekit)"


def described(model: ModelConfig, rows: Iterable[DeviceRow]) -> dict[str, Any]:
    """What a decision ``add`` or ``remove`` says of a model: its backend, live settings and
    the quota of each of its rows (``node/device``)."""
    return {
        "backend": model.backend,
        **live_settings(model),
        "quotas": {f"{r.node}/{r.device}": r.quota for r in rows},
    }


def load_addresses(model: ModelConfig, rows: Iterable[DeviceRow]) -> dict[str, ServerAddress]:
    """Row key -> the server that loads ``model`` there: its ``oip`` rows with a quota."""
    return {r.key: server_address(r, model) for r in rows if r.quota > 0 and r.backend == "oip"}


async def ensure_loaded(address: ServerAddress, timeout: float) -> str:
    """:data:`ALREADY_LOADED` when the server says the model is ready, else load it there
    (:data:`LOADED`); within ``timeout`` seconds.  Raises
    :class:`~wirekit.serve.backends.oipcontrol.RepositoryError`."""
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout
    if await model_ready(address, timeout):
        return ALREADY_LOADED
    left = until - loop.time()
    if left <= 0:
        raise RepositoryError(f"{where(address)}: no time left to load model {address.model!r}")
    await load(address, left)
    return LOADED


async def _each(addresses: dict[str, ServerAddress], call: Any, timeout: float) -> dict[str, str]:
    """``call(address, timeout)`` once per distinct server, all at once: row key -> its
    result, or ``failed: <why>``."""
    servers: dict[ServerAddress, list[str]] = {}
    for key, address in addresses.items():
        servers.setdefault(address, []).append(key)

    async def one(address: ServerAddress) -> str:
        try:
            return await asyncio.wait_for(call(address, timeout), timeout + 1.0)
        except RepositoryError as exc:
            return f"failed: {exc}"
        except asyncio.TimeoutError:
            return f"failed: {where(address)}: no answer within {timeout:g} s"

    results = await asyncio.gather(*(one(a) for a in servers))
    return {key: result for a, result in zip(servers, results, strict=True) for key in servers[a]}


async def _unload_done(address: ServerAddress, timeout: float) -> str:
    await unload(address, timeout)
    return UNLOADED


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
        #: the models being added (their servers loading them)
        self.adding: set[str] = set()
        #: model -> the lock :meth:`follow_quotas` holds while its servers follow
        self._following: dict[str, asyncio.Lock] = {}
        #: model -> row key -> (its server, what this process did there: LOADED,
        #: ALREADY_LOADED, UNLOADED) for the models with ``load = true``
        self.loads: dict[str, dict[str, tuple[ServerAddress, str]]] = {}
        #: the operators' last decisions, oldest first, when no controller runs (with one,
        #: they join its list): what ``GET /controller`` shows
        self.decisions: deque[dict[str, Any]] = deque(maxlen=LAST_DECISIONS)

    async def decided(self, record: dict[str, Any]) -> dict[str, Any]:
        """Keep an operator's decision (``record``: shaped as
        :func:`~wirekit.serve.control.controller.decision_record`) where ``GET /controller``
        shows it, and store it -- from any replica, not fenced (a store that cannot take it
        is logged, the change stands); returns it."""
        controller = self.service.controller
        if controller is not None:
            controller.remember(record)
        else:
            self.decisions.append(record)
        try:
            await asyncio.to_thread(self.service.store.record_decision, **record, fenced=False)
        except Exception as exc:
            log.warning(
                "admin: the decision could not be stored: %s", str(exc) or type(exc).__name__
            )
        return record

    async def _model_decided(
        self,
        kind: str,
        name: str,
        by: str,
        before: Any,
        after: Any,
        status: str = APPLIED,
        error: BaseException | None = None,
    ) -> None:
        await self.decided(
            model_decision(
                time=time.time(),
                kind=kind,
                model=name,
                by=by,
                before=before,
                after=after,
                status=status,
                error=None if error is None else str(error) or type(error).__name__,
            )
        )

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

    async def load_model(self, model: ModelConfig, rows: Iterable[DeviceRow]) -> dict[str, str]:
        """Load ``model`` on the server of each of its ``oip`` rows with a quota (all at
        once, each within ``model.load_timeout``; see the module docstring) and remember
        where; returns row key -> ``loaded`` / ``already loaded``.  When any fails, unloads
        what this call loaded and raises :class:`ModelLoadError`."""
        addresses = load_addresses(model, rows)
        timeout = model.load_timeout
        results = await _each(addresses, ensure_loaded, timeout)
        if any(r.startswith("failed") for r in results.values()):
            undo = {k: a for k, a in addresses.items() if results[k] == LOADED}
            rollback = await _each(undo, _unload_done, timeout)
            error = ModelLoadError(model.name, results, rollback)
            log.warning("wirekit serve: %s", error)
            raise error
        self.loads[model.name] = {k: (addresses[k], results[k]) for k in addresses}
        log.info(
            "wirekit serve: model %s loaded on its servers (%s)",
            model.name,
            ", ".join(f"{k} {r}" for k, r in results.items()),
        )
        return results

    async def unload_model(self, name: str, timeout: float = 60.0) -> dict[str, str]:
        """Unload model ``name`` from the servers where this process loaded it (forgetting
        them): row key -> ``unloaded``, ``left loaded (not loaded by wirekit)`` or
        ``failed: <why>`` (each server within ``timeout`` seconds); rows it was not loaded
        on are left out."""
        loads = self.loads.pop(name, {})
        self._following.pop(name, None)
        ours = {k: a for k, (a, did) in loads.items() if did == LOADED}
        results = await _each(ours, _unload_done, timeout)
        for key, (_address, did) in loads.items():
            if did == ALREADY_LOADED:
                results[key] = LEFT_LOADED
        if results:
            log.log(
                logging.WARNING
                if any(r.startswith("failed") for r in results.values())
                else logging.INFO,
                "wirekit serve: model %s unloaded from its servers (%s)",
                name,
                ", ".join(f"{k} {r}" for k, r in results.items()),
            )
        return results

    async def load_config_models(self) -> None:
        """Load the models of the config with ``load = true`` (at the service's start,
        before any door opens): all of them, or none -- on a failure what was loaded is
        unloaded again and a :class:`ConfigError` names the model and every device's
        result."""
        catalog = self.service.catalog
        done: list[str] = []
        for name in catalog.models():
            model = catalog.model(name)
            if not model.load:
                continue
            try:
                await self.load_model(model, catalog.rows(name))
            except ModelLoadError as exc:
                for loaded in done:
                    await self.unload_model(loaded, catalog.model(loaded).load_timeout)
                raise ConfigError(
                    f"models.{name}.load", f"the service does not start: {exc}"
                ) from None
            done.append(name)

    async def follow_quotas(self, name: str, node: str, device_type: str = "GPU") -> None:
        """The ``repository`` actuator's work: each ``device_type`` row of model ``name``
        on ``node`` (an ``oip`` model with ``load = true``) loaded on its server when its
        quota is above 0, unloaded when it is 0 (a server that already has it so is left
        alone; one that cannot be reached is taken as not serving it, so a row at quota 0
        on a server that is down does not fail the other rows' decisions).  Raises
        :class:`~wirekit.serve.backends.oipcontrol.RepositoryError` naming the devices that
        failed."""
        catalog = self.service.catalog
        if name not in catalog:
            return
        model = catalog.model(name)
        if model.backend != "oip" or not model.load:
            return
        rows = [
            r
            for r in catalog.rows(name)
            if r.node == node
            and r.device_type == device_type
            and (r.port is not None or r.grpc_port is not None)  # a device with a server
        ]
        async with self._following.setdefault(name, asyncio.Lock()):  # one change at a time
            await self._follow(name, model, rows)

    async def _follow(self, name: str, model: ModelConfig, rows: list[DeviceRow]) -> None:
        loads = self.loads.setdefault(name, {})
        timeout = model.load_timeout
        up = {r.key: server_address(r, model) for r in rows if r.quota > 0}
        # a server another row of the model still needs (two devices, one server) stays
        down = {
            r.key: address
            for r in rows
            if r.quota <= 0 and (address := server_address(r, model)) not in up.values()
        }

        async def ensure_unloaded(address: ServerAddress, timeout: float) -> str:
            try:
                if not await model_ready(address, timeout):
                    return UNLOADED
            except RepositoryError as exc:  # a server that is down serves nothing
                log.info("wirekit serve: %s: not unloaded, not reachable: %s", name, exc)
                return UNLOADED
            await unload(address, timeout)
            return UNLOADED

        results = await _each(up, ensure_loaded, timeout)
        results.update(await _each(down, ensure_unloaded, timeout))
        for key, result in results.items():
            if result.startswith("failed"):
                continue
            address = up.get(key) or down[key]
            before = loads.get(key, (address, ""))[1]
            if result == ALREADY_LOADED and before == LOADED:
                result = LOADED  # loaded by this process earlier: still ours to unload
            loads[key] = (address, result)
        failed = {k: r for k, r in results.items() if r.startswith("failed")}
        if failed:
            raise RepositoryError("; ".join(f"{k}: {r}" for k, r in failed.items()))

    async def add_model(self, model: ModelConfig, rows: Iterable[DeviceRow]) -> None:
        """Serve ``model`` from now on: its rows join the catalog (refused with a
        :class:`CatalogError` that says what is free when a share is not), backends, its
        HTTP routes and metrics, and its MIP front door when it has a ``mip_port``.  With
        ``load = true`` its servers load it first (:meth:`load_model`; a failure raises
        :class:`ModelLoadError` and nothing is added)."""
        if self.service.dispatcher is None:
            raise RuntimeError("the service is not started")
        rows = list(rows)
        name = model.name
        if name in self.removing:
            raise CatalogError(f"model {name!r} is being removed: add it again once it is gone")
        if name in self.adding:
            raise CatalogError(f"model {name!r} is being added already")
        if name in self.service.catalog:
            raise CatalogError(f"model {name!r} already exists (remove it first)")
        if model.backend == "clipper" and self.service.clipper is None:
            raise CatalogError(
                f"model {name!r}: a Clipper model needs the Clipper RPC port"
                " (listen.clipper_rpc_port), which this dispatcher does not open"
            )
        self.adding.add(name)
        try:
            if model.load:
                await self.load_model(model, rows)
            try:
                await self._add_loaded(model, rows)
            except BaseException:
                if model.load:
                    await self.unload_model(name, model.load_timeout)
                raise
        finally:
            self.adding.discard(name)

    async def _add_loaded(self, model: ModelConfig, rows: list[DeviceRow]) -> None:
        name = model.name
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

    async def add_model_doc(self, doc: Any, *, by: str = OPERATOR) -> dict[str, Any]:
        """:meth:`add_model` from a document (``POST /admin/models``, see
        :func:`wirekit.serve.config.parse_model`), a decision ``add`` by ``by`` (refused:
        a :class:`CatalogError`; failed: a :class:`ModelLoadError` or another error);
        returns the model's entry of :meth:`models_doc`."""
        catalog = self.service.catalog
        endpoints = {r.node: r.endpoint for r in catalog.rows()}
        model, rows = parse_model(doc, catalog.devices(), endpoints)
        after = described(model, rows)
        try:
            await self.add_model(model, rows)
        except ModelLoadError as exc:  # a server failed the load (a CatalogError too)
            await self._model_decided(ADD, model.name, by, None, after, FAILED, exc)
            raise
        except CatalogError as exc:
            await self._model_decided(ADD, model.name, by, None, after, REFUSED, exc)
            raise
        except Exception as exc:
            await self._model_decided(ADD, model.name, by, None, after, FAILED, exc)
            raise
        await self._model_decided(ADD, model.name, by, None, after)
        return self.model_doc(model.name)

    async def set_model_doc(self, name: str, doc: Any, *, by: str = OPERATOR) -> dict[str, Any]:
        """Change the settings of model ``name`` in place (``PATCH /admin/models/{name}``,
        body: some of :data:`~wirekit.serve.config.LIVE_SETTINGS`, validated as the config
        file's ``models.<name>`` table is, see :func:`~wirekit.serve.config.parse_settings`).
        New requests use them at once (MIP connections already open included), requests in
        flight finish with theirs; on a shared store every replica follows.  A decision
        ``set`` by ``by`` when a value changes (``before``/``after``: the settings that
        changed).  Returns the model's entry of :meth:`models_doc`.  KeyError for an
        unknown model, :class:`ConfigError` for a bad value or a setting that cannot change
        live, :class:`CatalogError` while the model is being removed (refused)."""
        model = self.service.catalog.model(name)  # KeyError
        if name in self.removing:
            error = CatalogError(f"model {name!r} is being removed")
            asked = dict(doc) if isinstance(doc, dict) else None
            await self._model_decided(SET, name, by, None, asked, REFUSED, error)
            raise error
        new = parse_settings(doc, model)
        self.service.catalog.set_model(new)
        changed = {k: v for k, v in live_settings(new).items() if getattr(model, k) != v}
        if changed:
            log.info("wirekit serve: model %s settings changed: %s", name, changed)
            before = {k: getattr(model, k) for k in changed}
            await self._model_decided(SET, name, by, before, changed)
        return self.model_doc(name)

    async def remove_model(
        self, name: str, drain_timeout: float | None = None, *, by: str | None = None
    ) -> dict[str, Any]:
        """Stop serving ``name``: new requests get a clear error at once (MIP: an error
        reply; HTTP: 410), its MIP front door stops listening, requests in flight finish and
        are answered (within ``drain_timeout``, default ``admin.drain_timeout``), then its
        quotas are released, its backends and front-door connections closed.  KeyError if
        there is no such model; :class:`CatalogError` if it is being removed already.
        ``by``: the operator who asked (``DELETE /admin/models/{name}``): a decision
        ``remove``; None (a replica following another's removal): none."""
        d = self.service.dispatcher
        if d is None:
            raise RuntimeError("the service is not started")
        if name in self.removing:
            error = CatalogError(f"model {name!r} is being removed already")
            if by is not None:
                await self._model_decided(REMOVE, name, by, None, None, REFUSED, error)
            raise error
        if by is None:
            return await self._remove(d, name, drain_timeout)
        before = described(self.service.catalog.model(name), self.service.catalog.rows(name))
        try:
            done = await self._remove(d, name, drain_timeout)
        except Exception as exc:
            await self._model_decided(REMOVE, name, by, before, None, FAILED, exc)
            raise
        await self._model_decided(REMOVE, name, by, before, None)
        return done

    async def _remove(self, d: Any, name: str, drain_timeout: float | None) -> dict[str, Any]:
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
            unloaded = None
            if name in self.loads:
                unloaded = await self.unload_model(name, model.load_timeout)
        finally:
            self.removing.discard(name)
        # requests cut short by the drain's end are something to look at; a drain is not
        log.log(
            logging.WARNING if left else logging.INFO,
            "wirekit serve: model %s removed (%s)",
            name,
            "drained" if not left else f"{left} request(s) still in flight after the drain",
        )
        doc: dict[str, Any] = {"removed": name, "drained": not left, "in_flight_at_timeout": left}
        if unloaded is not None:
            doc["unloaded"] = unloaded
        return doc

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
            "load": model.load,
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
            **(
                {"loaded": {k: did for k, (_a, did) in self.loads.get(name, {}).items()}}
                if model.load
                else {}
            ),
        }

    async def set_quota_doc(self, name: str, doc: Any, *, by: str = OPERATOR) -> dict[str, Any]:
        """Set one quota of model ``name`` (``PUT /admin/models/{name}/quota``, body
        ``{"node": ..., "device": ..., "quota": ...}``): an operator's decision (``by``).

        With a controller it is applied as the controller applies its own (catalog, then the
        node's actuator, rolled back if the actuator fails); without one the catalog alone
        changes -- routing follows at once, on every replica sharing the store.  Recorded
        either way with reason ``admin`` (:meth:`decided`).  Returns the decision as
        recorded (``status`` ``applied``, ``refused`` or ``failed``).  KeyError for an
        unknown model; :class:`ConfigError` for a body not shaped as above."""
        catalog = self.service.catalog
        catalog.model(name)  # KeyError
        node, device, quota = parse_quota(doc)  # ConfigError naming the bad field
        row = next((r for r in catalog.rows(name) if (r.node, r.device) == (node, device)), None)
        if row is None:
            raise ConfigError("body", f"model {name!r} has no row on {node}/{device}")
        decision = Decision(
            node, device, row.device_type, name, row.quota, quota, ADMIN_REASON, {}, by
        )
        if self.service.controller is not None:
            # an operator's decision: stored from any replica, not only the leader
            return await self.service.controller.apply(decision, fenced=False)
        error = set_decided_quota(catalog, decision, self.service.can_serve)
        status = "refused" if error is not None else "applied"
        log.info("admin: %s %s %g -> %g%s", row.key, status, row.quota, quota,
                 f": {error}" if error else "")  # fmt: skip
        return await self.decided(decision_record(decision, status, error, time.time()))

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
