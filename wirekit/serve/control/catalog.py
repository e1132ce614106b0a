"""The models metadata of ``wirekit serve``: which models exist, on which devices, with what
share of each device -- the one source of truth that routing, the dispatcher, the metrics and
the controller follow.

A :class:`Catalog` holds the :class:`~wirekit.serve.config.ModelConfig` of every model and its
:class:`~wirekit.serve.config.DeviceRow` per device (quota 0 rows included: a device the model
may be given later).  Every change -- a quota set, a model added or removed, a model's
settings changed -- bumps :attr:`Catalog.version` and is told, synchronously and in order,
to every subscriber as a :class:`CatalogChange`; the :class:`~wirekit.serve.dispatch.router.Router`
rebuilds the routing table of the model concerned from it, so the next request already
follows the change.

The rules are the design's: a share is between 0 and 1; the CPU shares of one device sum to
at most 1 (0 disables the pair); a GPU is given whole (0 or 1).  A change that breaks one is
refused with a :class:`CatalogError` that says what is free.

>>> from wirekit.serve.config import DeviceRow, ModelConfig
>>> row = DeviceRow("m1", "n1", 0, "CPU", "127.0.0.1", 9001, 0.5, "mip")
>>> catalog = Catalog({"m1": ModelConfig("m1")}, [row])
>>> catalog.free_share("n1", 0)
0.5
>>> catalog.set_quota("n1", 0, "m1", 0.75); catalog.quota("n1", 0, "m1"), catalog.version
(0.75, 1)
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from wirekit.errors import WirekitError

from ..config import LIVE_SETTINGS, DeviceRow, ModelConfig

EPSILON = 1e-9  #: shares summing to 1 + EPSILON still fit (float sums of 0.1s)


class CatalogError(WirekitError, ValueError):
    """A change the models metadata refuses (the message says why, and what is free)."""


@dataclass(frozen=True, slots=True)
class CatalogChange:
    """One change of the catalog, as told to subscribers.

    ``kind`` is ``"quota"`` (``node``/``device`` name the device, ``old``/``new`` the share),
    ``"add"``, ``"remove"`` (a whole model) or ``"settings"`` (the model's
    :data:`~wirekit.serve.config.LIVE_SETTINGS` changed: :meth:`Catalog.model` has the new
    ones); the device fields are None but for ``"quota"``."""

    kind: str
    model: str
    node: str | None
    device: int | None
    old: float | None
    new: float | None
    version: int


def _fmt(share: float) -> str:
    return f"{share:.4g}"


class Catalog:
    """The models, their rows and the quotas (see the module docstring).

    Changes are serialized by a lock; subscribers are called after each change, outside the
    lock, in subscription order, in the thread that made the change.  In ``wirekit serve``
    the subscribers (the service, the router) touch the event loop's objects: change the
    catalog from the loop's thread (from another thread, through
    ``loop.call_soon_threadsafe``).  A subscriber that raises does not undo the change; the
    error propagates to the caller of the change after every subscriber has been told."""

    def __init__(self, models: Mapping[str, ModelConfig], rows: Iterable[DeviceRow]) -> None:
        self._lock = threading.RLock()
        self._models: dict[str, ModelConfig] = dict(models)
        self._rows: dict[str, dict[tuple[str, int], DeviceRow]] = {m: {} for m in self._models}
        #: (node, device) -> device type, for every device ever seen (kept when emptied)
        self._devices: dict[tuple[str, int], str] = {}
        self._subscribers: list[Callable[[CatalogChange], None]] = []
        self.version = 0
        rows = list(rows)
        for row in rows:
            if row.model not in self._models:
                raise CatalogError(f"{row.key}: row of unknown model {row.model!r}")
        self._check_rows(rows)
        for row in rows:
            self._devices.setdefault((row.node, row.device), row.device_type)
            self._rows[row.model][(row.node, row.device)] = row

    # ------------------------------------------------------------------ reading

    def models(self) -> list[str]:
        """The names of the models, in the order they were added."""
        with self._lock:
            return list(self._models)

    def model(self, name: str) -> ModelConfig:
        """The config of ``name`` (KeyError if there is no such model)."""
        with self._lock:
            return self._models[name]

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def rows(self, model: str | None = None) -> list[DeviceRow]:
        """The rows of ``model`` (of every model when None), quota 0 included.  KeyError for
        an unknown model."""
        with self._lock:
            if model is not None:
                return list(self._rows[model].values())
            return [r for rows in self._rows.values() for r in rows.values()]

    def devices(self) -> dict[tuple[str, int], str]:
        """Every device known, ``(node, index) -> "CPU" | "GPU"``."""
        with self._lock:
            return dict(self._devices)

    def quota(self, node: str, device: int, model: str) -> float:
        """The share of ``model`` on that device (0.0 when it has no row there)."""
        with self._lock:
            row = self._rows[model].get((node, device))
            return row.quota if row is not None else 0.0

    def free_share(self, node: str, device: int) -> float:
        """1 minus the sum of the quotas on that device (KeyError for an unknown device)."""
        with self._lock:
            if (node, device) not in self._devices:
                raise KeyError((node, device))
            return max(0.0, round(1.0 - self._used(node, device), 12))

    def app_models(self) -> dict[str, str]:
        """Clipper application name -> model (each model is also an app of its own name)."""
        with self._lock:
            apps = {name: name for name in self._models}
            for m in self._models.values():
                for app in m.apps:
                    apps[app] = m.name
            return apps

    def _used(self, node: str, device: int, skip: str | None = None) -> float:
        key = (node, device)
        return sum(rows[key].quota for m, rows in self._rows.items() if m != skip and key in rows)

    # ------------------------------------------------------------------ changing

    def subscribe(self, callback: Callable[[CatalogChange], None]) -> None:
        """Call ``callback(change)`` after every change from now on."""
        with self._lock:
            self._subscribers.append(callback)

    def unsubscribe(self, callback: Callable[[CatalogChange], None]) -> None:
        """Stop calling ``callback`` (one subscribed with :meth:`subscribe`; a callback not
        subscribed is ignored)."""
        with self._lock:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

    def set_quota(self, node: str, device: int, model: str, share: float) -> None:
        """Give ``model`` ``share`` of the device (validated, see the module docstring)."""
        with self._lock:
            rows = self._rows.get(model)
            if rows is None:
                raise CatalogError(f"unknown model {model!r}")
            row = rows.get((node, device))
            if row is None:
                raise CatalogError(
                    f"{node}/{device}/{model}: {model!r} has no backend on that device"
                    " (add the model with a row there)"
                )
            share = self._check_share(row, share, self._used(node, device, skip=model))
            if share > 0 and row.backend != "clipper" and not row.port:
                raise CatalogError(
                    f"{row.key}: no backend port for this device (add the model with one)"
                )
            old = row.quota
            if share == old:
                return
            rows[(node, device)] = dataclasses.replace(row, quota=share)
            change = self._bump("quota", model, node, device, old, share)
        self._tell(change)

    def add_model(self, model: ModelConfig, rows: Iterable[DeviceRow]) -> None:
        """Add ``model`` with its rows (at least one with a quota > 0).  Refused with a
        :class:`CatalogError` naming what is free when a share asked for is not."""
        rows = list(rows)
        with self._lock:
            name = model.name
            if name in self._models:
                raise CatalogError(f"model {name!r} already exists (remove it first)")
            apps = self.app_models()
            for app in model.apps:
                if app in apps:
                    raise CatalogError(f"model {name!r}: app {app!r} already names {apps[app]!r}")
            if name in apps:
                raise CatalogError(f"model {name!r}: {name!r} is already an app of {apps[name]!r}")
            if not rows:
                raise CatalogError(f"model {name!r}: no device given")
            for row in rows:
                if row.model != name:
                    raise CatalogError(f"{row.key}: a row of {row.model!r}, not of {name!r}")
            if not any(r.quota > 0 for r in rows):
                raise CatalogError(f"model {name!r}: no device has a quota > 0 for this model")
            self._check_rows(rows)
            self._models[name] = model
            self._rows[name] = {}
            for row in rows:
                self._devices.setdefault((row.node, row.device), row.device_type)
                self._rows[name][(row.node, row.device)] = row
            change = self._bump("add", name, None, None, None, None)
        self._tell(change)

    def set_model(self, model: ModelConfig) -> None:
        """Change the settings of the model ``model.name`` to ``model``'s: only its
        :data:`~wirekit.serve.config.LIVE_SETTINGS` may differ (a :class:`CatalogError`
        names the others).  Nothing changes (and nobody is told) when none differs."""
        with self._lock:
            old = self._models.get(model.name)
            if old is None:
                raise CatalogError(f"unknown model {model.name!r}")
            fixed = [
                f.name
                for f in dataclasses.fields(ModelConfig)
                if f.name not in LIVE_SETTINGS and getattr(old, f.name) != getattr(model, f.name)
            ]
            if fixed:
                raise CatalogError(
                    f"model {model.name!r}: {', '.join(fixed)} cannot change while it is served"
                    " (remove it and add it again)"
                )
            if model == old:
                return
            self._models[model.name] = model
            change = self._bump("settings", model.name, None, None, None, None)
        self._tell(change)

    def remove_model(self, name: str) -> ModelConfig:
        """Remove ``name`` and release its quotas (KeyError if there is no such model)."""
        with self._lock:
            model = self._models.pop(name)
            del self._rows[name]
            change = self._bump("remove", name, None, None, None, None)
        self._tell(change)
        return model

    # ------------------------------------------------------------------ internals

    def _bump(self, kind, model, node, device, old, new) -> CatalogChange:
        self.version += 1
        return CatalogChange(kind, model, node, device, old, new, self.version)

    def _tell(self, change: CatalogChange) -> None:
        errors = []
        for callback in list(self._subscribers):
            try:
                callback(change)
            except Exception as exc:  # every subscriber is told; the first error is raised
                errors.append(exc)
        if errors:
            raise errors[0]

    def _check_share(self, row: DeviceRow, share: float, others: float) -> float:
        where = row.key
        if isinstance(share, bool) or not isinstance(share, int | float) or share != share:
            raise CatalogError(f"{where}: a share is a number from 0 to 1, got {share!r}")
        share = float(share)
        if not 0.0 <= share <= 1.0:
            raise CatalogError(f"{where}: a share is from 0 to 1, got {_fmt(share)}")
        if row.device_type == "GPU" and share not in (0.0, 1.0):
            raise CatalogError(f"{where}: a GPU is given 0 or 1 of itself, got {_fmt(share)}")
        if share > 0 and others + share > 1.0 + EPSILON:
            free = max(0.0, round(1.0 - others, 12))
            raise CatalogError(
                f"{where}: cannot give {_fmt(share)} of {row.node}/{row.device}"
                f" ({row.device_type}): {_fmt(free)} is free"
                f" ({self._holders(row.node, row.device, skip=row.model)})"
            )
        return share

    def _holders(self, node: str, device: int, skip: str | None = None) -> str:
        key = (node, device)
        held = [
            f"{m} {_fmt(rows[key].quota)}"
            for m, rows in self._rows.items()
            if m != skip and key in rows and rows[key].quota > 0
        ]
        return "held by " + ", ".join(held) if held else "no other model holds a share"

    def _check_rows(self, rows: list[DeviceRow]) -> None:
        """Device types consistent, one row per (model, device), shares within the rules."""
        seen: set[tuple[str, str, int]] = set()
        extra: dict[tuple[str, int], float] = {}
        types: dict[tuple[str, int], str] = dict(self._devices)
        for row in rows:
            key = (row.node, row.device)
            if (row.model, *key) in seen:
                raise CatalogError(f"{row.key}: the model is given that device twice")
            seen.add((row.model, *key))
            known = types.setdefault(key, row.device_type)
            if known != row.device_type:
                raise CatalogError(
                    f"{row.key}: device {row.node}/{row.device} is a {known}, not a"
                    f" {row.device_type}"
                )
            used = self._used(*key) + extra.get(key, 0.0)
            share = self._check_share(row, row.quota, used)
            extra[key] = extra.get(key, 0.0) + share
