"""Shared fixtures: every codec test runs against both twins (Cython and pure).

Each protocol ``P`` has a pure codec ``wirekit.P._pure`` and a Cython twin ``wirekit._fast.P``
exporting the same functions.  ``load_codec`` (in ``twins.py``) picks one; a ``<P>_codec``
fixture is parametrized over both.
The ``fast`` variant fails (it does not skip) when the extension is missing, so a broken build
cannot pass as green; only an explicit ``WIREKIT_PURE=1`` skips it.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from twins import IMPLEMENTATIONS, load_codec

# Bounded property testing: CI has 2 cores and a time budget; no wall-clock deadlines.
settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("WIREKIT_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("ci")


@pytest.fixture(scope="session", params=IMPLEMENTATIONS)
def impl(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def mip_codec(impl):
    return load_codec("mip", impl)


@pytest.fixture(scope="session")
def zmtp_codec(impl):
    return load_codec("zmtp", impl)


@pytest.fixture(scope="session")
def clipper_codec(impl):
    return load_codec("clipper", impl)


@pytest.fixture(scope="session")
def y2_codec(impl):
    return load_codec("y2", impl)
