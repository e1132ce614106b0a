"""A throwaway PostgreSQL server on loopback for the tests and benchmarks (issue 17).

``initdb`` into a temporary directory, ``postgres`` on a free 127.0.0.1 port with its unix
socket in that directory, ``trust`` authentication for the local superuser ``postgres``;
:meth:`PgServer.stop` stops it (``immediate``) and removes the directory.  As root (CI), the
server runs as the ``postgres`` system user (PostgreSQL refuses to run as root).

The tests get a database URL from the ``pg_url`` fixture (tests/conftest.py): the server in
``WIREKIT_PG_URL`` when set, else one of these started for the session when the binaries
exist, else a skip -- a failure under ``WIREKIT_REQUIRE_PG=1`` (``.ci/run`` exports it).

    python tests/pg_server.py     # start one, print its URL, stop on Enter / EOF
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from support.ports import free_port

TIMEOUT = 60.0


def pg_bindir() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl`` (Debian's ``/usr/lib/postgresql/N/bin``,
    newest first, or the PATH), or None when PostgreSQL is not installed."""
    for found in sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
        reverse=True,
    ):
        return Path(found).parent
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).resolve().parent
    return None


class PgServer:
    """One PostgreSQL server in a temporary directory (``start()`` / ``stop()``)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="wirekit-pg-"))
        self.port = 0
        # PostgreSQL will not run as root: hand the directory to the postgres user.
        self.user: str | None = "postgres" if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            user=self.user,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def start(self) -> PgServer:
        if self.user is not None:
            shutil.chown(self.dir, self.user)
        data = self.dir / "data"
        done = self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        if done.returncode:
            raise RuntimeError(f"initdb failed: {done.stderr[-2000:]}")
        for _attempt in range(5):  # a free port can be taken between probe and bind
            self.port = free_port()
            opts = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}"
                " -c max_connections=200 -c fsync=off -c synchronous_commit=off"
                " -c full_page_writes=off"
            )
            done = self._run(
                str(self.bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(self.dir / "log"),
                "-w",
                "-t",
                str(int(TIMEOUT)),
                "-o",
                opts,
                "start",
            )
            if done.returncode == 0:
                return self
        log = (self.dir / "log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"pg_ctl start failed: {done.stderr[-1000:]} {log}")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run(
                str(self.bindir / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "stop"
            )
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def given_or_throwaway() -> Iterator[str | None]:
    """A PostgreSQL URL: ``WIREKIT_PG_URL`` when set, else a throwaway server's (stopped on
    leaving); None when neither is there (no binaries)."""
    url = os.environ.get("WIREKIT_PG_URL")
    if url:
        yield url
        return
    bindir = pg_bindir()
    if bindir is None:
        yield None
        return
    server = PgServer(bindir).start()
    try:
        yield server.url
    finally:
        server.stop()


if __name__ == "__main__":
    bindir = pg_bindir()
    if bindir is None:
        sys.exit("no PostgreSQL binaries (apt-get install postgresql)")
    server = PgServer(bindir).start()
    try:
        print(server.url, flush=True)
        sys.stdin.read()
    finally:
        server.stop()
