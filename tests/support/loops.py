"""The event loops a server test runs on: asyncio, and uvloop where it is installed."""

from __future__ import annotations

import importlib.util

import pytest

LOOPS = [
    "asyncio",
    pytest.param(
        "uvloop",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed"
        ),
    ),
]
