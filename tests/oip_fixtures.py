"""Module-scoped pytest fixtures of real OIP model servers (``oip_servers.py``).

Import the ones a test module uses into it (pytest finds fixtures in the module's names)::

    from oip_fixtures import kserve, mlserver, mlserver_b  # noqa: F401

Each is started once per test module (a server start costs seconds; CI's time is short) and
stopped at its end:

* ``mlserver``, ``mlserver_b``: two MLServer 1.7.1 processes on 127.0.0.1 with ``echo`` and
  ``iris`` loaded, ``broken`` (its load fails with ``oip_servers.BROKEN_MESSAGE``) and
  ``slow`` (its load takes ``oip_servers.SLOW_LOAD_SECONDS``) in their model folder;
* ``kserve``: KServe 0.21.0 in a network namespace of its own (``kserve.ns``; reach it with
  ``kserve.request(...)``, ``kserve.ns.run(fn)``, or ``kserve.local_port("http"|"grpc")``),
  ``echo`` and ``iris`` loaded, ``broken`` and ``slow`` in its repository.

The peers' virtualenvs (``peer_venvs.py``) are installed by scripts/test.sh before the
suite, else from PyPI on first use under CI (``CI=true``) or ``WIREKIT_PEERS_INSTALL=1``
(about three minutes on a cold cache, then cached); elsewhere a test needing one that is
not installed skips, saying how.  Where they cannot run (not Linux; for KServe, no network
namespace: not root or no ``ip``) the tests skip saying why -- and fail under CI, where
they must run (:func:`require_peers`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import peer_venvs
import pytest
from oip_servers import Server, peers_unavailable, running_kserve, running_mlserver

#: set to 1: install the peers' virtualenvs when missing (CI does, ``CI=true``)
INSTALL_ENV_VAR = "WIREKIT_PEERS_INSTALL"
#: what the fixtures' servers serve (``broken``: in the folder, not loaded)
FIXTURE_MODELS = ("echo", "iris", "broken", "slow")


def require_peers(*names: str) -> None:
    """Skip (fail under ``CI=true``) where the real servers ``names`` (``mlserver``,
    ``kserve``; none: both) cannot run: not Linux, no network namespace for KServe, or
    their virtualenvs not installed yet -- installed here (from PyPI, about three minutes on
    a cold cache) under ``CI=true`` or ``WIREKIT_PEERS_INSTALL=1``, else skipped, saying
    how (the README's test command, scripts/test.sh, installs them before the suite; a
    bare ``pytest`` does not install servers from PyPI unasked)."""
    names = names or tuple(peer_venvs.PEERS)
    ci = os.environ.get("CI") == "true"
    reason = peers_unavailable(kserve="kserve" in names)
    if reason is not None:
        if ci:
            pytest.fail(f"the real model servers must run under CI: {reason}")
        pytest.skip(reason)
    peers = [peer_venvs.PEERS[name] for name in names]
    missing = [peer.label for peer in peers if not peer_venvs.is_ready(peer)]
    if missing and not (ci or os.environ.get(INSTALL_ENV_VAR) == "1"):
        pytest.skip(
            f"the real servers' virtualenvs are not installed ({', '.join(missing)}): run "
            f"`python tests/peer_venvs.py` or set {INSTALL_ENV_VAR}=1 (a few minutes, PyPI)"
        )
    for peer in peers:
        peer_venvs.ensure_venv(peer)


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """MLServer with ``echo`` and ``iris`` loaded, ``broken`` (fails) and ``slow`` loadable."""
    require_peers("mlserver")
    workdir = tmp_path_factory.mktemp("mlserver")
    with running_mlserver(workdir, models=FIXTURE_MODELS, who="mlserver") as server:
        yield server


@pytest.fixture(scope="module")
def mlserver_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second MLServer like :func:`mlserver` (for a quota split, a server killed...)."""
    require_peers("mlserver")
    workdir = tmp_path_factory.mktemp("mlserver-b")
    with running_mlserver(workdir, models=FIXTURE_MODELS, who="mlserver-b") as server:
        yield server


@pytest.fixture(scope="module")
def kserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """KServe in a namespace of its own with ``echo`` and ``iris`` loaded, ``broken`` (its
    load fails) and ``slow`` in its repository."""
    require_peers("kserve")
    workdir = tmp_path_factory.mktemp("kserve")
    with running_kserve(workdir, models=FIXTURE_MODELS) as server:
        yield server
