"""What the ``wirekit serve k8s`` tests share: the command run as a user runs it, the
objects it writes, their validation against the Kubernetes schemas, a config changed at
one place, and the dispatcher's pod played on this machine."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
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


def container_env(container: dict[str, Any], objects: list[dict[str, Any]]) -> dict[str, str]:
    """The environment Kubernetes gives ``container``: its values, and its Secret keys from
    the Secrets among ``objects``."""
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secrets[ref["name"]]["stringData"][ref["key"]]
    return env


@dataclass
class StagedPod:
    """The dispatcher's pod laid out on this machine: its ConfigMap's file (``config``),
    its data volume and working directory (``data``), its arguments and environment."""

    config: Path
    data: Path
    args: list[str]
    env: dict[str, str]


def stage_dispatcher_pod(objects: list[dict[str, Any]], where: Path) -> StagedPod:
    """The dispatcher's pod of ``objects`` (the Secret among them) as Kubernetes would run
    it, under ``where``: the ConfigMap's file at a stand-in of its mount path (``etc``),
    the data volume's path (its working directory) replaced by ``data`` in the config, the
    container's environment with the Secret's value, its arguments."""
    got = by_kind(objects)
    deployment = got["Deployment", "wirekit-dispatcher"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["wirekit"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")["mountPath"]
    etc, data = where / "etc", where / "data"
    etc.mkdir()
    data.mkdir()
    ((name, text),) = got["ConfigMap", "wirekit-config"]["data"].items()
    config = etc / name
    config.write_text(text.replace(container["workingDir"], str(data)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WIREKIT_ADMIN")}
    env.update(PYTHONPATH=str(ROOT), **container_env(container, objects))
    args = [a.replace(mount, str(etc)) for a in container["args"]]
    return StagedPod(config, data, args, env)


@contextlib.contextmanager
def running_dispatcher(pod: StagedPod) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """``wirekit`` with the staged pod's arguments, environment and working directory;
    yields the process and its ready line (asserted), and stops it (SIGTERM) after."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wirekit", *pod.args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=pod.env, cwd=pod.data,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        ready = json.loads(proc.stdout.readline() or "{}")
        assert ready.get("event") == "ready", proc.stderr.read() if proc.poll() else ready
        yield proc, ready
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=60)
