"""Helpers for the ``wirekit serve`` tests: tagged model handlers, deployments on port 0,
the dispatcher as a real subprocess, HTTP calls with timeouts.

Every blocking call has a timeout; every server, subprocess and session is closed on exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from support.process import ROOT as ROOT  # the tests import it from here too
from support.process import TIMEOUT as TIMEOUT
from support.process import ServerProcess, listening_line
from support.service import start_backend as start_backend


def tagged(tag: str, *, gate: asyncio.Event | None = None, delay: float = 0.0):
    """A handler answering each sample ``"<tag>:<INPUT UPPERCASED>"`` (so a client can check
    both the answer and which device gave it).  ``gate``: hold every request until set."""

    async def handler(batch):
        if gate is not None:
            await gate.wait()
        if delay:
            await asyncio.sleep(delay)
        return [[f"{tag}:{sample[0].as_text().upper()}"] for sample in batch]

    return handler


def answer_of(text: str) -> tuple[str, str]:
    """``"tag:VALUE"`` -> ``(tag, "VALUE")``."""
    tag, _, value = text.partition(":")
    return tag, value


def deployment(
    store_path: Path,
    models: dict[str, dict[str, Any]],
    nodes: list[dict[str, Any]],
    **top: Any,
) -> dict[str, Any]:
    """A deployment document listening on port 0 everywhere (``top`` keys replace)."""
    doc: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "http_port": 0},
        "store": {"path": str(store_path)},
        "models": {name: {"port": 0, **m} for name, m in models.items()},
        "nodes": nodes,
    }
    doc.update(top)
    return doc


def admin_headers(service: Any) -> dict[str, str]:
    """The ``Authorization`` header of the admin API of an in-process ``Service`` (its
    configured token, or the one it generated)."""
    return {"Authorization": f"Bearer {service.admin_token}"}


def _is_ready(line: str) -> bool:
    """Whether ``line`` is the JSON ready line of ``wirekit serve``."""
    try:
        return json.loads(line).get("event") == "ready"
    except (ValueError, AttributeError):
        return False


class DispatcherProcess(ServerProcess):
    """``wirekit serve --config FILE`` in a subprocess; ``addresses`` from its ready line.

    ``env``: more environment variables (``WIREKIT_LOOP``...); ``max_fds``: its file
    descriptor limit (``ulimit -n``); ``args``: more command-line flags.  Its log (standard
    error) is kept: :attr:`log_lines`, :meth:`wait_for_log`."""

    def __init__(
        self,
        config: Path,
        *,
        env: dict[str, str] | None = None,
        max_fds: int | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        argv = [sys.executable, "-m", "wirekit.cli", "serve", "--config", str(config), *args]
        super().__init__(argv, ready=_is_ready, env=env, max_fds=max_fds)
        self.config = config
        self.args = args
        self.addresses: dict[str, Any] = {}

    @classmethod
    def of(cls, doc: dict[str, Any], directory: Path, **options: Any) -> DispatcherProcess:
        """For the deployment ``doc``, written to ``directory/deployment.json``."""
        config = directory / "deployment.json"
        config.write_text(json.dumps(doc))
        return cls(config, **options)

    def start(self) -> DispatcherProcess:
        super().start()
        self.addresses = json.loads(self.first_line)
        return self

    def mip_address(self, model: str) -> str:
        return f"tcp://127.0.0.1:{self.addresses['mip'][model]}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.addresses['http']}"

    @property
    def admin_token(self) -> str:
        """The admin token the dispatcher generated (read from the file its ready line
        names; a config with ``admin.token`` has none)."""
        return Path(self.addresses["admin_token_file"]).read_text().strip()

    @property
    def admin_headers(self) -> dict[str, str]:
        """The headers of an admin API request: its generated token, a JSON body."""
        return {"Authorization": f"Bearer {self.admin_token}", "Content-Type": "application/json"}


class BackendProcess(ServerProcess):
    """``wirekit mip serve --handler HANDLER [--cgroup PATH]`` on port 0 in a subprocess."""

    def __init__(self, handler: str, *, cgroup: Path | None = None) -> None:
        argv = [sys.executable, "-m", "wirekit.cli", "mip", "serve", "--handler", handler]
        argv += ["--listen", "tcp://127.0.0.1:0", "--log-level", "warning"]
        if cgroup is not None:
            argv += ["--cgroup", str(cgroup)]
        super().__init__(argv, ready=listening_line)
        self.port = 0

    def start(self) -> BackendProcess:
        super().start()
        self.port = int(self.first_line.rsplit(":", 1)[1])
        return self


def cgroup_root() -> Path:
    """A directory where the tests may create CPU cgroups (the v1 ``cpu`` controller's
    hierarchy or the v2 root).  Skips the test saying why there is none -- or fails it when
    ``WIREKIT_REQUIRE_CGROUPS=1`` (CI, which runs as root with a writable controller)."""
    import uuid

    import pytest

    reason = "no cgroup CPU controller is mounted at /sys/fs/cgroup"
    for root in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")):
        if (root / "cpu.cfs_quota_us").exists() or (root / "cgroup.subtree_control").exists():
            probe = root / f"wirekit-probe-{uuid.uuid4().hex[:8]}"
            try:
                probe.mkdir()
                probe.rmdir()
            except OSError as exc:
                reason = f"cgroups at {root} cannot be written: {exc.strerror or exc}"
                break
            return root
    if os.environ.get("WIREKIT_REQUIRE_CGROUPS") == "1":
        pytest.fail(f"WIREKIT_REQUIRE_CGROUPS=1 but {reason}")
    pytest.skip(reason)


def remove_cgroup(path: Path) -> None:
    """Remove a test's cgroup once its processes are gone (retried briefly: the kernel
    takes a moment to let go of exited tasks)."""

    for _ in range(100):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    path.rmdir()


def run(coro, timeout: float = 60.0):
    """Run a test coroutine with an overall time bound."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
