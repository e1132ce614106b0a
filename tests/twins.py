"""``load_codec``: the one helper that picks a protocol's fast or pure codec module.

It lives outside ``conftest.py`` because ``benchmarks/conftest.py`` is also imported as a
module named ``conftest``: ``from conftest import ...`` in a test could get either one.
"""

from __future__ import annotations

import importlib

import pytest

from wirekit._impl import pure_requested

IMPLEMENTATIONS = ("fast", "pure")


def load_codec(protocol: str, impl: str):
    """The ``impl`` ("fast" or "pure") codec module of ``protocol``."""
    if impl == "pure":
        return importlib.import_module(f"wirekit.{protocol}._pure")
    if pure_requested():
        pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
    return importlib.import_module(f"wirekit._fast.{protocol}")
