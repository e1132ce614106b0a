"""The error a MIP backend's answer to an OIP request can carry."""

from __future__ import annotations

from typing import Any

from wirekit.errors import WirekitError


class BackendError(WirekitError):
    """The backend answered an OIP request with an ERROR item: ``message`` is its text, the
    model's own words, which a door passes on to the client."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # keep pickling working (the message is the only argument)
        return (type(self), (self.message,))


__all__ = ["BackendError"]
