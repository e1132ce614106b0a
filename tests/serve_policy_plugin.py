"""A custom controller policy (``serve_policy_plugin:Fixed``) and actuator
(``serve_policy_plugin:Recording``), loaded by name in the tests."""

from __future__ import annotations

from typing import ClassVar

from wirekit.serve.config import ControllerConfig
from wirekit.serve.controller import Decision, Snapshot


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
