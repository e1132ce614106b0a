"""The virtualenvs of the real peer servers (MLServer, KServe) the OIP tests and benchmark run.

KServe and MLServer are installed from PyPI, each in a virtualenv of its own (their pins
conflict with each other and with wirekit's test environment), under a cache directory:
``$WIREKIT_PEERS_DIR``, else ``~/.cache/wirekit-peers``.  Creating one is idempotent: a
virtualenv whose marker file names exactly the requirements asked for is used as it is; any
other (a half-done install, other pins) is made anew.  Several processes asking at once wait
for each other (a lock file per virtualenv).  Its directory's name carries a digest of its
requirements, so that checkouts pinning differently (branches, older trees) never remake
each other's virtualenv under a process that uses it.

    python tests/peer_venvs.py            # create (or check) every peer's virtualenv
    python tests/peer_venvs.py kserve     # one of them
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: the environment variable naming the cache directory of the peers' virtualenvs
PEERS_DIR_ENV_VAR = "WIREKIT_PEERS_DIR"
#: the file written into a virtualenv once its requirements installed
READY_MARKER = "wirekit-peer-requirements.txt"
#: bound on one ``pip install`` (a cold cache downloads a few hundred MB)
INSTALL_TIMEOUT = 1200.0


@dataclass(frozen=True)
class Peer:
    """A peer server: its virtualenv's name and the requirements installed into it."""

    name: str
    requirements: tuple[str, ...]

    @property
    def label(self) -> str:
        """The virtualenv's directory name: the peer, its pinned version and a digest of all
        its requirements (two checkouts pinning differently never remake each other's)."""
        digest = hashlib.sha256(_marker_text(self).encode()).hexdigest()[:8]
        return f"{self.name}-{self.requirements[0].split('==')[1]}-{digest}"


#: what the test models need in both (``tests/oip_models/``: the iris model is trained with
#: scikit-learn inside the peer's virtualenv and saved with joblib)
MODEL_REQUIREMENTS = ("scikit-learn==1.9.1", "joblib==1.6.0")
#: KServe's model server (REST v1/v2 and gRPC on its own ``ModelServer``)
KSERVE = Peer("kserve", ("kserve==0.21.0", *MODEL_REQUIREMENTS))
#: MLServer and its scikit-learn runtime; uvloop pinned: with the latest uvloop MLServer's
#: inference worker dies
MLSERVER = Peer(
    "mlserver",
    ("mlserver==1.7.1", "mlserver-sklearn==1.7.1", "uvloop==0.21.0", *MODEL_REQUIREMENTS),
)
PEERS = {peer.name: peer for peer in (KSERVE, MLSERVER)}


def peers_dir() -> Path:
    """Where the peers' virtualenvs live (created on demand)."""
    configured = os.environ.get(PEERS_DIR_ENV_VAR)
    return Path(configured) if configured else Path.home() / ".cache" / "wirekit-peers"


def venv_python(peer: Peer) -> Path:
    """The interpreter of ``peer``'s virtualenv (which may not exist yet)."""
    return peers_dir() / peer.label / "bin" / "python"


def is_ready(peer: Peer) -> bool:
    """Whether ``peer``'s virtualenv exists with exactly its requirements installed."""
    marker = peers_dir() / peer.label / READY_MARKER
    try:
        return marker.read_text() == _marker_text(peer) and venv_python(peer).exists()
    except OSError:
        return False


def ensure_venv(peer: Peer, *, log: Path | None = None) -> Path:
    """``peer``'s virtualenv, created and installed first if it is not ready; its Python.

    The install's output goes to ``log`` (default: ``pip.log`` inside the virtualenv); a
    failed install raises ``RuntimeError`` naming that log and leaves no marker, so the next
    call starts over."""
    home = peers_dir()
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home / f"{peer.label}.lock"):
        if is_ready(peer):
            return venv_python(peer)
        target = home / peer.label
        if target.exists():
            shutil.rmtree(target)
        venv.EnvBuilder(with_pip=True, clear=True).create(target)
        log = log or target / "pip.log"
        python = str(venv_python(peer))
        with open(log, "w") as out:
            status = subprocess.run(
                [python, "-m", "pip", "install", "--disable-pip-version-check", *peer.requirements],
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=INSTALL_TIMEOUT,
                check=False,
            ).returncode
        if status != 0:
            raise RuntimeError(
                f"installing {' '.join(peer.requirements)} into {target} failed "
                f"(exit {status}); see {log}"
            )
        (target / READY_MARKER).write_text(_marker_text(peer))
        return venv_python(peer)


def _marker_text(peer: Peer) -> str:
    return "\n".join(peer.requirements) + "\n"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def main(argv: list[str]) -> int:
    names = argv or list(PEERS)
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        print(f"peer_venvs.py: unknown peer {unknown[0]!r} (known: {', '.join(PEERS)})")
        return 2
    for name in names:
        print(f"{name}: {ensure_venv(PEERS[name])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
