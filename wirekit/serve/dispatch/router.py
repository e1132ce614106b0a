"""Routing by quota: a request for model M goes to device i with probability P_i.

P_i is proportional to the quota of (device i, M) over the devices with quota > 0 for M, so
the P_i sum to 1; quota-0 rows are never chosen.  A device that timed out or refused a
connection is taken out of rotation for a back-off period; while it is out, the others share
its part in proportion to their quotas.

What a quota means when a device is full.  The quota is the share of *requests*, not of
capacity: each request is drawn for exactly once, by :meth:`Router.choose` (the
dispatcher's only routing decision; the MIP lane and the general path both use it and never
draw a second time for the same request).  When the device drawn has no free slot (its
``connections`` requests are in flight) or no open connection yet, the request waits for a
slot on *that* device, first come first served, within the model's ``timeout``; it is not
moved to a device that has room.  Only a failure (a timeout, a refused or lost connection)
moves a request elsewhere: it is resubmitted to a device drawn among those not tried yet,
the failing one backed off.  So the split follows the quotas idle and saturated alike (a
"draw among the devices that have room" rule would not: under saturation a slot frees on a
device when it answers, so the split would follow the devices' speeds -- 50/50 for equal
devices, whatever the quotas).  The price: when one device is slower than its quota asks
for, its requests queue (and may time out) while another device idles; set the quotas to
the devices' capacities, or lower the slow device's quota.

The quotas are the :class:`~wirekit.serve.control.catalog.Catalog`'s: :meth:`Router.following`
subscribes to it, and every change rebuilds the table of the model concerned at once
(:meth:`Router.update`), so the next draw -- the MIP lane's and the compiled lane's
included, which call :meth:`Router.choose` -- follows the change.  No other copy of the
quotas exists.
"""

from __future__ import annotations

import bisect
import random
import time
from collections.abc import Callable, Collection, Iterable
from itertools import accumulate

from ..config import DeviceRow
from ..control.catalog import Catalog, CatalogChange


class NoDevice(LookupError):
    """No device can take a request for the model (unknown model or every device tried)."""


class Router:
    """Weighted choice of a device per model, with back-off of failing devices."""

    def __init__(
        self,
        rows: Iterable[DeviceRow],
        *,
        backoff: float = 5.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: model -> (its rows with quota > 0, their cumulative quotas): one entry, replaced
        #: whole on a change, so that a reader never sees rows and sums of two versions
        self._table: dict[str, tuple[list[DeviceRow], list[float]]] = {}
        #: models served by one device: no draw needed
        self._single: dict[str, DeviceRow] = {}
        self.backoff = backoff
        self._rng = rng or random.Random()
        self._clock = clock
        self._out_until: dict[str, float] = {}  # row key -> clock time it comes back
        #: (model, row key) -> times that row was taken out of rotation (:meth:`fail`)
        self.backoffs: dict[tuple[str, str], int] = {}
        #: row key -> clock time of its last failure (:meth:`fail`), while routed
        self.failed_at: dict[str, float] = {}
        self._catalog: Catalog | None = None
        by_model: dict[str, list[DeviceRow]] = {}
        for row in rows:
            by_model.setdefault(row.model, []).append(row)
        for model, model_rows in by_model.items():
            self.update(model, model_rows)

    @classmethod
    def following(
        cls,
        catalog: Catalog,
        *,
        backoff: float = 5.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> Router:
        """A router of ``catalog``'s rows that follows its every change (it subscribes): the
        model a change concerns has its table rebuilt before the change returns."""
        router = cls(catalog.rows(), backoff=backoff, rng=rng, clock=clock)
        router._catalog = catalog
        catalog.subscribe(router.follow)
        return router

    def follow(self, change: CatalogChange) -> None:
        """Apply one change of the catalog this router follows (its subscription)."""
        assert self._catalog is not None, "follow() is for Router.following(catalog)"
        if change.kind == "remove":
            self.update(change.model, ())
        else:
            self.update(change.model, self._catalog.rows(change.model))

    def update(self, model: str, rows: Iterable[DeviceRow]) -> None:
        """Route ``model`` over ``rows`` from now on (those with quota > 0; none: the model
        is no longer routed).  Back-offs of devices no longer routed are forgotten."""
        live = [r for r in rows if r.quota > 0]
        old = self._table.get(model)
        if not live:
            self._table.pop(model, None)
            self._single.pop(model, None)
        else:
            self._table[model] = (live, list(accumulate(r.quota for r in live)))
            if len(live) == 1:
                self._single[model] = live[0]
            else:
                self._single.pop(model, None)
        if old is not None and self._out_until:
            keep = {r.key for r in live}
            for row in old[0]:
                if row.key not in keep:
                    self._out_until.pop(row.key, None)
                    self.failed_at.pop(row.key, None)

    @property
    def models(self) -> list[str]:
        return list(self._table)

    def rows(self, model: str) -> list[DeviceRow]:
        """The rows of ``model`` that can be chosen (quota > 0)."""
        entry = self._table.get(model)
        return list(entry[0]) if entry is not None else []

    def probabilities(self, model: str) -> dict[str, float]:
        """P_i per row key, with every device in rotation."""
        rows = self.rows(model)
        total = sum(r.quota for r in rows)
        return {r.key: r.quota / total for r in rows}

    def choose(self, model: str, exclude: Collection[str] = ()) -> DeviceRow:
        """A device for one request: weighted by quota, skipping ``exclude`` and backed-off
        devices.  If every device not excluded is backed off, the one coming back soonest is
        used rather than failing.  Raises :class:`NoDevice` when nothing is left."""
        if not exclude:
            # One device: it is used even while backed off (the one coming back soonest).
            one = self._single.get(model)
            if one is not None:
                return one
        entry = self._table.get(model)
        if entry is None:
            raise NoDevice(f"unknown model {model!r} (or no device has a quota > 0 for it)")
        rows, cum = entry
        out = self._out_until
        if not exclude and not out:  # the common case: one draw, no filtering
            return rows[bisect.bisect_right(cum, self._rng.random() * cum[-1])]
        return self._choose_filtered(model, rows, exclude)

    def _choose_filtered(
        self, model: str, rows: list[DeviceRow], exclude: Collection[str]
    ) -> DeviceRow:
        """:meth:`choose` among ``rows`` of ``model`` when some are excluded or backed off."""
        out = self._out_until
        now = self._clock()
        if out and min(out.values()) <= now:
            for key in [k for k, t in out.items() if t <= now]:
                del out[key]
        candidates = [r for r in rows if r.key not in exclude]
        if not candidates:
            raise NoDevice(f"every device of {model!r} was tried")
        live = [r for r in candidates if out.get(r.key, 0.0) <= now]
        if not live:
            return min(candidates, key=lambda r: out[r.key])
        if len(live) == 1:
            return live[0]
        cum = list(accumulate(r.quota for r in live))
        return live[bisect.bisect_right(cum, self._rng.random() * cum[-1])]

    def fail(self, row: DeviceRow) -> None:
        """Take ``row`` out of rotation for ``backoff`` seconds."""
        now = self._clock()
        self._out_until[row.key] = now + self.backoff
        self.failed_at[row.key] = now
        key = (row.model, row.key)
        self.backoffs[key] = self.backoffs.get(key, 0) + 1

    def succeed(self, row: DeviceRow) -> None:
        """A device answered: it is back in rotation."""
        self._out_until.pop(row.key, None)

    @property
    def clock(self) -> Callable[[], float]:
        """The clock of back-offs (:attr:`failed_at`)."""
        return self._clock

    def backed_off(self) -> list[str]:
        """Keys of the rows out of rotation right now (expired entries are dropped)."""
        now = self._clock()
        for key in [k for k, t in self._out_until.items() if t <= now]:
            del self._out_until[key]
        return sorted(self._out_until)
