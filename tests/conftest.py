"""Shared fixtures: every codec test runs against both twins (Cython and pure).

Each protocol ``P`` has a pure codec ``wirekit.P._pure`` and a Cython twin ``wirekit._fast.P``
exporting the same functions.  ``twin_codec("P")`` gives a fixture parametrized over both.
The ``fast`` variant fails (it does not skip) when the extension is missing, so a broken build
cannot pass as green; only an explicit ``WIREKIT_PURE=1`` skips it.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from wirekit._impl import pure_requested, twin

# Bounded property testing: CI has 2 cores and a time budget; no wall-clock deadlines.
settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("WIREKIT_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("ci")

IMPLEMENTATIONS = ("fast", "pure")


def load_codec(protocol: str, impl: str):
    """The ``impl`` ("fast" or "pure") codec module of ``protocol``, for fixtures."""
    if impl == "fast" and pure_requested():
        pytest.skip("WIREKIT_PURE=1: the Cython twin is deliberately not used")
    return twin(protocol, impl)


@pytest.fixture(scope="session", params=IMPLEMENTATIONS)
def impl(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def mip_codec(impl):
    return load_codec("mip", impl)


@pytest.fixture(scope="session")
def clipper_codec(impl):
    return load_codec("clipper", impl)
