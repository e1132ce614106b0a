"""A custom controller policy, loaded by name (``serve_policy_plugin:Fixed``) in the tests."""

from __future__ import annotations

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
