"""Whether ``wirekit serve`` can serve: the one probe of a backend, liveness and readiness.

:func:`probe_row` is the one way a backend is probed: by ``wirekit serve check --probe``, and
by the running service every :data:`PROBE_INTERVAL` (:class:`Health`, the first time before
the dispatcher says it is ready; the backends that cannot be reached then are logged once).
:class:`Health` keeps the last probes and answers ``/healthz`` (:meth:`Health.liveness`) and
``/readyz`` (:meth:`Health.readiness`): the whole dispatcher's under the ``health.ready``
policy (``all`` or ``any`` of the models ready), or one model's.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from .config import SERVER_KINDS, DeviceRow, ModelConfig
from .control.metrics import device_label

#: seconds between two probes of the backends (what ``/readyz`` says of them), and how
#: long one TCP connection attempt of a probe may take
PROBE_INTERVAL = 2.0
PROBE_TIMEOUT = 1.0


def probed(row: DeviceRow) -> bool:
    """Whether :func:`probe_row` probes ``row``'s backend: all but KubeMo's, whose server
    stops its serving thread when a connection closes without a request (the router's
    back-off alone says whether it answers)."""
    return row.backend != "kubemo"


async def probe_row(
    row: DeviceRow,
    clipper: Any = None,
    timeout: float = PROBE_TIMEOUT,
    model: ModelConfig | None = None,
) -> str | None:
    """Why the backend of ``row`` cannot be reached now, or None: a TCP connection opened
    and closed within ``timeout`` seconds (MIP), a live container registered with
    ``clipper``, the embedded Clipper RPC frontend (Clipper), the server ready and so is
    its model (``oip``, ``tfserving``: :func:`~wirekit.serve.backends.oipcontrol.probe` of
    the row's server, ``model`` the row's model config, for the server's name of the
    model and its protocol; default: the model's defaults).  Not for a row that is not
    :func:`probed`."""
    if row.backend in SERVER_KINDS:
        from .backends.oipcontrol import probe
        from .backends.servers import server_address

        if model is None:
            model = ModelConfig(name=row.model, backend=row.backend)
        return await probe(server_address(row, model), timeout)
    if row.backend == "clipper":
        if clipper is None or not row.clipper_name:
            return "no Clipper RPC port"
        if any(r.alive for r in clipper.replicas(row.clipper_name)):
            return None
        return f"no Clipper container {row.clipper_name!r} registered"
    if row.port is None:
        return "no port"
    try:
        _reader, writer = await asyncio.wait_for(
            asyncio.open_connection(row.endpoint, row.port), timeout
        )
    except (OSError, asyncio.TimeoutError) as exc:
        text = getattr(exc, "strerror", None) or str(exc) or "no answer in time"
        return f"{row.endpoint}:{row.port}: {text}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


async def probe_rows(
    rows: Iterable[DeviceRow],
    clipper: Any = None,
    timeout: float = PROBE_TIMEOUT,
    models: Mapping[str, ModelConfig] | None = None,
) -> dict[str, str | None]:
    """:func:`probe_row` of every row at once (``models``: the models' configs by name):
    row key -> None or why it cannot be reached (a probe's own error is its result)."""
    rows = list(rows)
    models = models or {}
    results = await asyncio.gather(
        *(probe_row(row, clipper, timeout, models.get(row.model)) for row in rows),
        return_exceptions=True,
    )
    out: dict[str, str | None] = {}
    for row, result in zip(rows, results, strict=True):
        if isinstance(result, BaseException):
            result = str(result) or type(result).__name__
        out[row.key] = result
    return out


class Health:
    """The service's health: its loop's lag, the last probe of each backend, and the
    ``/healthz`` and ``/readyz`` documents drawn from them.

    ``service`` is the :class:`~wirekit.serve.service.Service` (its ``store``, ``router``,
    ``dispatcher`` and ``clipper`` are read); ``given``: the keys of rows whose backend the
    caller gave (tests), taken as reachable."""

    def __init__(self, service: Any, given: Collection[str] = ()) -> None:
        self.service = service
        self.given = frozenset(given)
        #: how late the watch task woke up last (the loop's lag, seconds)
        self.loop_lag = 0.0
        #: row key -> (router clock time, why it could not be reached or None) of its last
        #: probe
        self.probes: dict[str, tuple[float, str | None]] = {}
        #: row key -> why the backend process this dispatcher runs for it (``--with-backends``)
        #: is not serving now (it exited and is being restarted), or None
        self.process_problem: Callable[[str], str | None] | None = None

    def liveness(self) -> dict[str, Any]:
        """The ``/healthz`` document: the loop answers (this runs on it)."""
        return {"ok": True, "loop_lag_seconds": self.loop_lag}

    def readiness(self, model: str | None = None) -> dict[str, Any]:
        """The ``/readyz`` document: ready when the store takes writes and the models are:
        a model is ready when at least one of its devices (a row with a quota) has a
        reachable backend -- its last probe connected (an ``oip`` or ``tfserving`` server:
        said itself and its model ready), and no failure of it since (the router's
        back-off).  ``model``: that model alone (no policy); None: the whole dispatcher,
        under the ``health.ready`` policy the document names (``policy``): ``all``, every
        model ready; ``any``, at least one.  ``reasons`` lists every problem found, also
        those the policy lets pass (a model not ready under ``any``), and the rows
        journaled but not yet in the store (a database outage caught up: ``"N rows waiting
        to reach the store"``, not ready past ``store.max_backlog``; ``store.backlog``)."""
        service = self.service
        policy = service.deployment.health.ready
        reasons: list[str] = []
        blocking = 0  # the reasons that make the document not ready
        store = service.store.write_problem()
        if store is not None:
            reasons.append(store)
        d = service.dispatcher
        models: dict[str, Any] = {}
        if d is None:
            reasons.append("not started")
        blocking = len(reasons)
        if d is not None:
            router = service.router
            backed_off = set(router.backed_off())
            failed_at = router.failed_at
            for name in sorted(d.models) if model is None else [model]:
                devices: dict[str, str] = {}
                for row in router.rows(name):
                    probe = self.probes.get(row.key)
                    if not probed(row):  # the router's word alone
                        probe = (-math.inf, None)
                    down = self.process_problem and self.process_problem(row.key)
                    if down:
                        state = f"unreachable: {down}"
                    elif probe is None:
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
        if model is not None or policy == "all":
            blocking = len(reasons)
        elif not any(m["ready"] for m in models.values()):
            blocking = len(reasons) + 1
            reasons.append("policy any: no model is ready")
        backlog = service.store.backlog
        if backlog:  # said; not ready past the limit
            limit = service.deployment.store.max_backlog
            if backlog > limit:
                blocking += 1
                reasons.append(
                    f"{backlog} rows waiting to reach the store"
                    f" (more than store.max_backlog, {limit})"
                )
            else:
                reasons.append(f"{backlog} rows waiting to reach the store")
        doc: dict[str, Any] = {"ready": not blocking, "reasons": reasons}
        if model is None:
            doc["policy"] = policy
        doc["store"] = {"kind": service.store.kind, "ok": store is None, "backlog": backlog}
        doc["models"] = models
        return doc

    def problem(self, key: str) -> str | None:
        """Why the backend of row ``key`` could not be reached at its last probe (None: it
        could, or it was not probed)."""
        probe = self.probes.get(key)
        return None if probe is None else probe[1]

    async def probe(self) -> dict[str, str | None]:
        """Probe the backend of every routed row at once (:func:`probe_rows`; a backend
        the caller gave is taken as reachable) and keep the results for :meth:`readiness`;
        returns them (row key -> None or why it cannot be reached)."""
        service = self.service
        d = service.dispatcher
        if d is None:
            return {}
        router = service.router
        rows = [row for name in list(d.models) for row in router.rows(name) if probed(row)]
        clock: Callable[[], float] = router.clock
        catalog = service.catalog
        models = {name: catalog.model(name) for name in {r.model for r in rows} if name in catalog}
        results = await probe_rows(
            [r for r in rows if r.key not in self.given], service.clipper, models=models
        )
        results.update({r.key: None for r in rows if r.key in self.given})
        now = clock()
        self.probes = {key: (now, result) for key, result in results.items()}
        return results
