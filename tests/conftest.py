"""Shared fixtures: every codec test runs against both twins (Cython and pure).

Each protocol ``P`` has a pure codec ``wirekit.P._pure`` and a Cython twin ``wirekit._fast.P``
exporting the same functions.  ``load_codec`` (in ``twins.py``) picks one; a ``<P>_codec``
fixture is parametrized over both.
The ``fast`` variant fails (it does not skip) when the extension is missing, so a broken build
cannot pass as green; only an explicit ``WIREKIT_PURE=1`` skips it.
"""

from __future__ import annotations

import functools
import os

import pytest
from hypothesis import HealthCheck, settings
from twins import IMPLEMENTATIONS, load_codec, load_connection

# The Clipper runtime tests' fixtures (ctx, raw, started, clipper_side).
pytest_plugins = ["clipper_support"]

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
def mip_conn(impl, mip_codec):
    """Makes a MIP server ``Connection`` of the ``impl`` twin, on that twin's codec."""
    return functools.partial(load_connection(impl), codec=mip_codec)


@pytest.fixture(scope="session")
def zmtp_codec(impl):
    return load_codec("zmtp", impl)


@pytest.fixture(scope="session")
def clipper_codec(impl):
    return load_codec("clipper", impl)


@pytest.fixture(scope="session")
def y2_codec(impl):
    return load_codec("y2", impl)


# -- PostgreSQL (issue 17) -------------------------------------------------------------------
# One throwaway server per session (tests/pg_server.py), a fresh database per test.


@pytest.fixture(scope="session")
def pg_server_url():
    """The URL of a PostgreSQL server for the tests: ``WIREKIT_PG_URL`` when set, else a
    throwaway server started here; a skip without PostgreSQL, a failure under
    ``WIREKIT_REQUIRE_PG=1``."""
    from pg_server import given_or_throwaway

    missing = None
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing = "psycopg is not installed (the 'pg' extra)"
    with given_or_throwaway() as url:
        if url is None:
            missing = missing or "no PostgreSQL binaries (apt-get install postgresql)"
        if missing is not None:
            if os.environ.get("WIREKIT_REQUIRE_PG") == "1":
                pytest.fail(f"WIREKIT_REQUIRE_PG=1 but {missing}")
            pytest.skip(missing)
        yield url


_pg_dbs = iter(range(1, 1 << 30))


@pytest.fixture
def pg_url(pg_server_url):
    """A URL to a new, empty database on the test server (dropped after the test)."""
    import psycopg

    name = f"wirekit_t{os.getpid()}_{next(_pg_dbs)}"
    base, _, _db = pg_server_url.rpartition("/")
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_kind(request) -> str:
    """Parametrizes a store test over both store backends."""
    return request.param


@pytest.fixture
def store_url(store_kind, tmp_path, request) -> str | None:
    """None for the SQLite store (the path is the test's to choose), a fresh PostgreSQL
    database URL for the PostgreSQL one."""
    if store_kind == "sqlite":
        return None
    return request.getfixturevalue("pg_url")


# -- the admin API's generated tokens (issue 25) ----------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def runtime_dir(tmp_path_factory):
    """Where every ``wirekit serve`` of the session (in process or a subprocess) writes its
    generated admin token, and where the ``wirekit serve models`` commands look for it: a
    directory of the session's own (``XDG_RUNTIME_DIR``), not the user's."""
    directory = tmp_path_factory.mktemp("xdg-runtime")
    directory.chmod(0o700)
    saved = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(directory)
    try:
        yield directory
    finally:
        if saved is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = saved
