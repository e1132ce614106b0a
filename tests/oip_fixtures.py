"""Module-scoped pytest fixtures of real OIP model servers (``oip_servers.py``).

Import the ones a test module uses into it (pytest finds fixtures in the module's names)::

    from oip_fixtures import kserve, mlserver, mlserver_b  # noqa: F401

Each is started once per test module (a server start costs seconds; CI's time is short) and
stopped at its end:

* ``mlserver``, ``mlserver_b``: two MLServer 1.7.1 processes on 127.0.0.1 with ``echo`` and
  ``iris`` loaded and ``broken`` in their model folder (its load fails with
  ``oip_servers.BROKEN_MESSAGE``);
* ``kserve``: KServe 0.21.0 in a network namespace of its own (``kserve.ns``; reach it with
  ``kserve.request(...)``, ``kserve.ns.run(fn)``, or ``kserve.local_port("http"|"grpc")``),
  ``echo`` and ``iris`` loaded, ``broken`` in its repository.

The peers' virtualenvs are installed from PyPI on first use (``peer_venvs.py``: about three
minutes on a cold cache, then cached).  Where they cannot run (not Linux; for KServe, no
network namespace: not root or no ``ip``) the tests skip saying why -- and fail under CI
(``CI=true``), where they must run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from oip_servers import Server, peers_unavailable, running_kserve, running_mlserver

#: what the fixtures' servers serve (``broken``: in the folder, not loaded)
FIXTURE_MODELS = ("echo", "iris", "broken")


def require_peers(kserve: bool = False) -> None:
    """Skip (fail under ``CI=true``) where the real servers cannot run."""
    reason = peers_unavailable(kserve)
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the real model servers must run under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """MLServer with ``echo`` and ``iris`` loaded and ``broken`` loadable (it fails)."""
    require_peers()
    workdir = tmp_path_factory.mktemp("mlserver")
    with running_mlserver(workdir, models=FIXTURE_MODELS, who="mlserver") as server:
        yield server


@pytest.fixture(scope="module")
def mlserver_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second MLServer like :func:`mlserver` (for a quota split, a server killed...)."""
    require_peers()
    workdir = tmp_path_factory.mktemp("mlserver-b")
    with running_mlserver(workdir, models=FIXTURE_MODELS, who="mlserver-b") as server:
        yield server


@pytest.fixture(scope="module")
def kserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """KServe in a namespace of its own with ``echo`` and ``iris`` loaded, ``broken`` in
    its repository (its load fails)."""
    require_peers(kserve=True)
    workdir = tmp_path_factory.mktemp("kserve")
    with running_kserve(workdir, models=FIXTURE_MODELS) as server:
        yield server
