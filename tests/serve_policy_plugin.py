"""A custom controller policy (``serve_policy_plugin:Fixed``) and actuator
(``serve_policy_plugin:Recording``), loaded by name in the tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from wirekit.serve.config import ControllerConfig
from wirekit.serve.control.controller import Decision, Snapshot


class Fixed:
    """Sets model ``a``'s CPU rows to ``options.share`` once."""

    def __init__(self, config: ControllerConfig) -> None:
        self.share = dict(config.options)["share"]
        self.done = False

    def decide(self, snapshot: Snapshot) -> list[Decision]:
        if self.done:
            return []
        self.done = True
        return [
            Decision(r.node, r.device, r.device_type, r.model, r.quota, self.share, "fixed")
            for r in snapshot.rows
            if r.model == "a" and r.device_type == "CPU"
        ]


class Recording:
    """An actuator that records its calls in ``CALLS`` (a module-level list)."""

    CALLS: ClassVar[list[tuple]] = []

    def __init__(self, options: dict) -> None:
        self.tag = options.get("tag", "")

    def set_cpu_share(self, node: str, model: str, share: float) -> None:
        self.CALLS.append((self.tag, node, model, share))

    def set_gpus(self, node: str, model: str, count: int) -> None:
        self.CALLS.append((self.tag, node, model, count))


class Toward:
    """Moves model ``a``'s CPU rows to ``options.share`` whenever they are elsewhere (so a
    decision lost with the lead is taken again by the next leader).  ``before``: called
    with the decisions before they are returned (a test's hook)."""

    def __init__(self, config: ControllerConfig) -> None:
        self.share = dict(config.options)["share"]
        self.before: Callable[[list[Decision]], None] | None = None

    def decide(self, snapshot: Snapshot) -> list[Decision]:
        out = [
            Decision(r.node, r.device, r.device_type, r.model, r.quota, self.share, "toward")
            for r in snapshot.rows
            if r.model == "a" and r.device_type == "CPU" and r.quota != self.share
        ]
        if out and self.before is not None:
            self.before(out)
        return out


class Watch:
    """Records every snapshot's figures of model ``a`` (``seen``); once ``a`` has at least
    ``options.ok`` answered requests in the window, moves its CPU rows to
    ``options.share`` (once)."""

    def __init__(self, config: ControllerConfig) -> None:
        options = dict(config.options)
        self.ok = options["ok"]
        self.share = options["share"]
        self.seen: list[int] = []
        self.done = False

    def decide(self, snapshot: Snapshot) -> list[Decision]:
        stats = snapshot.models.get("a")
        self.seen.append(0 if stats is None else stats.ok)
        if self.done or stats is None or stats.ok < self.ok:
            return []
        self.done = True
        return [
            Decision(
                r.node,
                r.device,
                r.device_type,
                r.model,
                r.quota,
                self.share,
                "load seen",
                {"ok": stats.ok},
            )
            for r in snapshot.rows
            if r.model == "a" and r.device_type == "CPU"
        ]


class Flip:
    """Moves model ``a``'s CPU rows between 0.25 and 0.5 every period, except a row in its
    ``config.cooldown`` after a change (its own, or one handed over by ``resume``)."""

    def __init__(self, config: ControllerConfig) -> None:
        self.cooldown = config.cooldown
        self.changed: dict[tuple[str, int, str], float] = {}
        self.resumed: dict[tuple[str, int, str], float] = {}

    def resume(self, changed: dict[tuple[str, int, str], float]) -> None:
        self.resumed.update(changed)
        self.changed.update(changed)

    def decide(self, snapshot: Snapshot) -> list[Decision]:
        out = []
        for r in snapshot.rows:
            key = (r.node, r.device, r.model)
            if r.model != "a" or snapshot.time - self.changed.get(key, -1e18) < self.cooldown:
                continue
            self.changed[key] = snapshot.time
            new = 0.25 if r.quota != 0.25 else 0.5
            out.append(Decision(r.node, r.device, r.device_type, r.model, r.quota, new, "flip"))
        return out
