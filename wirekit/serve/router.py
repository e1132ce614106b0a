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
"""

from __future__ import annotations

import bisect
import random
import time
from collections.abc import Callable, Collection, Iterable
from itertools import accumulate

from .config import DeviceRow


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
        self._rows: dict[str, list[DeviceRow]] = {}
        for row in rows:
            if row.quota > 0:
                self._rows.setdefault(row.model, []).append(row)
        self._cum: dict[str, list[float]] = {
            m: list(accumulate(r.quota for r in rs)) for m, rs in self._rows.items()
        }
        #: models served by one device: no draw needed
        self._single = {m: rs[0] for m, rs in self._rows.items() if len(rs) == 1}
        self.backoff = backoff
        self._rng = rng or random.Random()
        self._clock = clock
        self._out_until: dict[str, float] = {}  # row key -> clock time it comes back

    @property
    def models(self) -> list[str]:
        return list(self._rows)

    def rows(self, model: str) -> list[DeviceRow]:
        """The rows of ``model`` that can be chosen (quota > 0)."""
        return list(self._rows.get(model, ()))

    def probabilities(self, model: str) -> dict[str, float]:
        """P_i per row key, with every device in rotation."""
        rows = self._rows.get(model, [])
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
        rows = self._rows.get(model)
        if rows is None:
            raise NoDevice(f"unknown model {model!r}")
        out = self._out_until
        if not exclude and not out:  # the common case: one draw, no filtering
            cum = self._cum[model]
            return rows[bisect.bisect_right(cum, self._rng.random() * cum[-1])]
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
        self._out_until[row.key] = self._clock() + self.backoff

    def succeed(self, row: DeviceRow) -> None:
        """A device answered: it is back in rotation."""
        self._out_until.pop(row.key, None)

    def backed_off(self) -> list[str]:
        """Keys of the rows out of rotation right now (expired entries are dropped)."""
        now = self._clock()
        for key in [k for k, t in self._out_until.items() if t <= now]:
            del self._out_until[key]
        return sorted(self._out_until)
