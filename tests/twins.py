"""``load_codec``: the one helper tests use to pick a protocol's fast or pure codec module.

It lives outside ``conftest.py`` so that test modules can import it by a unique name.
"""

from __future__ import annotations

import importlib

import pytest

from wirekit._impl import pure_requested, twin

IMPLEMENTATIONS = ("fast", "pure")


def load_codec(protocol: str, impl: str):
    """The ``impl`` ("fast" or "pure") codec module; fast is skipped only under WIREKIT_PURE=1."""
    if impl == "fast" and pure_requested():
        pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
    return twin(protocol, impl)


def load_connection(impl: str):
    """The ``impl`` twin of the MIP server's sans-IO ``Connection``: the compiled class
    (``wirekit._fast.mipconn``, which must load) or ``PyConnection`` (the pure one)."""
    if impl == "fast":
        if pure_requested():
            pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
        return importlib.import_module("wirekit._fast.mipconn").Connection
    from wirekit.mip.connection import PyConnection

    return PyConnection


def load_lane(impl: str):
    """The ``impl`` twin of the dispatcher's MIP lane: ``wirekit._fast.servelane`` (which
    must load) or ``wirekit.serve.dispatch.lane`` (the pure one)."""
    if impl == "fast":
        if pure_requested():
            pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
        return importlib.import_module("wirekit._fast.servelane")
    return importlib.import_module("wirekit.serve.dispatch.lane")
