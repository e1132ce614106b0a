"""What the ``wirekit serve k8s`` tests share: the command run as a user runs it, the
objects it writes, their validation against the Kubernetes schemas, and a config changed at
one place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "serve-deployment.json"
#: the oldest Kubernetes whose schema has ``resizePolicy`` (specs/k8s.md), and the newest known
K8S_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def wirekit(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``python -m wirekit ARGV`` in a subprocess (bounded), this checkout's wirekit."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "wirekit", *argv],
        capture_output=True, text=True, timeout=60, env=env, cwd=cwd,
    )  # fmt: skip


def k8s_objects(*argv: str) -> list[dict[str, Any]]:
    """The objects ``wirekit serve k8s ARGV`` writes to standard output (a ``v1 List``)."""
    done = wirekit("serve", "k8s", *argv)
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert (listing["apiVersion"], listing["kind"]) == ("v1", "List")
    items: list[dict[str, Any]] = listing["items"]
    return items


def validate_all(objects: list[dict[str, Any]]) -> None:
    """Every object valid under each of :data:`K8S_VERSIONS` (strict: no unknown field);
    ``kubernetes_validate.ValidationError`` names the bad field otherwise."""
    for version in K8S_VERSIONS:
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)


def by_kind(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The objects by ``(kind, name)``."""
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def changed(doc: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    """A deep copy of the config ``doc`` with ``value`` at ``path`` (keys and indexes)."""
    copy: dict[str, Any] = json.loads(json.dumps(doc))
    target: Any = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copy
