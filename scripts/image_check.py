"""Run in an image what ``wirekit serve k8s`` makes Kubernetes run, and check it answers.

Used by ``scripts/build-image.sh`` once it has built the image.  The manifests are generated
by the image itself (``wirekit serve k8s --config CONFIG``); every container of every
workload in them (the dispatcher's Deployment, the nodes' StatefulSets) is started with
``docker run`` as its pod spec says: its command and arguments, working directory,
environment (the admin token from the Secret the manifests create or name), user, security
settings and CPU/memory limits, its ConfigMap volumes (written to files, mounted read-only)
and its data volumes (anonymous volumes).

All the containers share one network namespace with no way out (``--network none``: loopback
only, nothing on the host's network), where the manifests' Service names resolve to loopback,
as a one-node cluster's Services would route them.  Node placement (``nodeSelector``,
affinity) has no meaning on one machine and is not looked at.

Then, from inside that namespace: every container's readiness probe passes (the
dispatcher's ``/readyz``; the backends' ports), the dispatcher's startup and liveness probe
(``/healthz``), a prediction through the dispatcher answered by a backend, and the admin API
refusing a request without the token and answering one with it.

Usage: python scripts/image_check.py IMAGE --config samples/serve-deployment.json
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

#: the kinds of object whose pod template is run (one replica each)
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")
#: how long the pods may take to pass their probes (their images start in seconds)
READY_TIMEOUT = 120.0
#: what the check asks of the first model: a sample the sample's handlers take
PREDICTION = {"inputs": [["a fine day"], ["so bad"]]}

#: run inside the pods' network namespace: one HTTP request, its status and body on stdout
HTTP_ONE = """
import json, sys, urllib.error, urllib.request
url, method, body, token = sys.argv[1:5]
request = urllib.request.Request(url, data=body.encode() or None, method=method)
if token:
    request.add_header("Authorization", "Bearer " + token)
try:
    with urllib.request.urlopen(request, timeout=10) as response:
        print(json.dumps([response.status, response.read().decode()]))
except urllib.error.HTTPError as error:
    print(json.dumps([error.code, error.read().decode()]))
except OSError as error:
    print(json.dumps([0, str(error)]))
"""

#: run inside the pods' network namespace: whether a TCP port accepts a connection
TCP_ONE = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
except OSError:
    sys.exit(1)
"""


def docker(*args: str, capture: bool = True) -> str:
    """``docker ARGS``; its standard output.  A failure raises with its standard error."""
    done = subprocess.run(["docker", *args], capture_output=capture, text=True)
    if done.returncode:
        raise RuntimeError(f"docker {' '.join(args[:3])} ...: {done.stderr or ''}".strip())
    return done.stdout or ""


class Pods:
    """The manifests' containers, started in one network namespace; removed by :meth:`stop`."""

    def __init__(self, image: str, manifests: dict[str, Any], workdir: Path) -> None:
        self.image = image
        self.items = manifests["items"]
        self.workdir = workdir
        self.prefix = "wirekit-check-" + uuid.uuid4().hex[:8]
        self.started: list[str] = []
        self.network = self.prefix + "-net"
        #: the values of Secrets the manifests name but do not create, made here once
        self.made_secrets: dict[tuple[str, str], str] = {}

    def objects(self, kind: str) -> dict[str, dict[str, Any]]:
        """The manifests' objects of ``kind``, by name."""
        return {o["metadata"]["name"]: o for o in self.items if o["kind"] == kind}

    def workloads(self) -> dict[str, dict[str, Any]]:
        """The pod specs of the manifests' workloads (Deployments, StatefulSets, ...), by name."""
        specs = {}
        for kind in WORKLOADS:
            for name, workload in self.objects(kind).items():
                specs[name] = workload["spec"]["template"]["spec"]
        return specs

    def secret_value(self, name: str, key: str) -> str:
        """A Secret's value, from the manifests (``stringData`` or ``data``).  A Secret the
        manifests name but do not create is made here, as an operator would (a token)."""
        secret = self.objects("Secret").get(name)
        if secret is None:  # made once (as `wirekit serve k8s --create-admin-secret` does)
            return self.made_secrets.setdefault((name, key), "image-check-" + uuid.uuid4().hex)
        if key in secret.get("stringData", {}):
            return str(secret["stringData"][key])
        return base64.b64decode(secret["data"][key]).decode()

    def start(self) -> None:
        """The shared network namespace, then every workload's containers."""
        hosts = [f"--add-host={name}:127.0.0.1" for name in self.objects("Service")]
        self.run_container(self.network, ["--network", "none", *hosts, "--entrypoint", "sleep"],
                           ["infinity"])  # fmt: skip
        seen_ports: dict[int, str] = {}
        for name, pod in self.workloads().items():
            for container in pod["containers"]:
                where = f"{name}/{container['name']}"
                for port in container.get("ports", []):
                    other = seen_ports.setdefault(port["containerPort"], where)
                    assert other == where, f"port {port['containerPort']}: {other} and {where}"
                options = self.container_options(name, pod, container)
                command = container.get("command", [])
                if command:
                    options += ["--entrypoint", command[0]]
                self.run_container(
                    f"{self.prefix}-{name}-{container['name']}",
                    options,
                    [*command[1:], *container.get("args", [])],
                )

    def container_options(
        self, deployment: str, pod: dict[str, Any], container: dict[str, Any]
    ) -> list[str]:
        """``docker run`` options for a container of a pod spec."""
        options = ["--network", f"container:{self.network}"]
        context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
        if "runAsUser" in context:
            options += ["--user", f"{context['runAsUser']}:{context.get('runAsGroup', 0)}"]
        if context.get("readOnlyRootFilesystem"):
            options.append("--read-only")
        if context.get("allowPrivilegeEscalation") is False:
            options += ["--security-opt", "no-new-privileges"]
        for capability in context.get("capabilities", {}).get("drop", []):
            options += ["--cap-drop", capability]
        limits = container.get("resources", {}).get("limits", {})
        if "cpu" in limits:
            cpu = str(limits["cpu"])
            cores = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
            # a limit above this machine's CPUs (a GPU backend's default is 4) limits nothing
            # here, and Docker refuses it: run with what there is
            options += ["--cpus", f"{min(cores, os.cpu_count() or 1):g}"]
        if "memory" in limits:
            options += ["--memory", str(limits["memory"]).replace("i", "").lower()]
        if "workingDir" in container:
            options += ["--workdir", container["workingDir"]]
        for env in container.get("env", []):
            if "value" in env:
                options += ["--env", f"{env['name']}={env['value']}"]
            elif "secretKeyRef" in env.get("valueFrom", {}):
                ref = env["valueFrom"]["secretKeyRef"]
                options += ["--env", f"{env['name']}={self.secret_value(ref['name'], ref['key'])}"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "configMap" in volume or "secret" in volume:
                source = self.write_volume(deployment, volume)
                options += ["--volume", f"{source}:{mount['mountPath']}:ro"]
            else:  # a PersistentVolumeClaim or an emptyDir: a fresh volume, removed at the end
                options += ["--mount", f"type=volume,destination={mount['mountPath']}"]
                if mount.get("readOnly"):
                    options[-1] += ",readonly"
        return options

    def write_volume(self, deployment: str, volume: dict[str, Any]) -> Path:
        """A ConfigMap's or a Secret's files in a directory of their own (world-readable: the
        pods run as a user of the image's)."""
        folder = self.workdir / f"{deployment}-{volume['name']}"
        folder.mkdir(mode=0o755)
        if "configMap" in volume:
            data = self.objects("ConfigMap")[volume["configMap"]["name"]]["data"]
        else:
            secret_name = volume["secret"]["secretName"]
            secret = self.objects("Secret")[secret_name]
            data = {k: self.secret_value(secret_name, k) for k in secret.get("stringData", {})}
        for key, text in data.items():
            (folder / key).write_text(text)
            (folder / key).chmod(0o644)
        return folder

    def run_container(self, name: str, options: list[str], args: list[str]) -> None:
        docker("run", "--detach", "--name", name, *options, self.image, *args)
        self.started.append(name)

    def inside(self, script: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """A Python script run in the pods' network namespace (in its own container)."""
        return subprocess.run(
            ["docker", "exec", self.network, "python3", "-c", script, *argv],
            capture_output=True,
            text=True,
        )

    def http(
        self, method: str, port: int, path: str, body: str = "", token: str = ""
    ) -> tuple[int, str]:
        """One HTTP request to a port of the pods: (status, body); status 0: no connection."""
        done = self.inside(HTTP_ONE, f"http://127.0.0.1:{port}{path}", method, body, token)
        if done.returncode:
            raise RuntimeError(f"the HTTP request failed: {done.stderr}")
        status, text = json.loads(done.stdout)
        return int(status), str(text)

    def logs(self) -> None:
        """Every container's last lines, to standard error."""
        for name in self.started[1:]:
            print(f"--- docker logs {name}", file=sys.stderr)
            subprocess.run(["docker", "logs", "--tail", "40", name], stdout=sys.stderr)

    def stop(self) -> None:
        """Remove every container started, with its volumes."""
        if self.started:
            subprocess.run(["docker", "rm", "--force", "--volumes", *reversed(self.started)],
                           capture_output=True)  # fmt: skip


def port_number(container: dict[str, Any], port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    return int(
        next(p["containerPort"] for p in container.get("ports", []) if p.get("name") == port)
    )


def check(pods: Pods) -> None:
    """Wait for every probe to pass, then ask for a prediction and use the admin API."""
    probes: list[tuple[str, str, dict[str, Any]]] = []
    dispatcher: dict[str, Any] | None = None
    for name, pod in pods.workloads().items():
        for container in pod["containers"]:
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                if kind in container:
                    probes.append((f"{name}/{container['name']} {kind}", kind, container))
            if container.get("args", [])[:1] == ["serve"]:
                dispatcher = container
    assert dispatcher is not None, "no dispatcher (a container running `wirekit serve`)"
    deadline = time.monotonic() + READY_TIMEOUT
    for what, kind, container in probes:
        probe = container[kind]
        while True:
            if "httpGet" in probe:
                port = port_number(container, probe["httpGet"]["port"])
                status, text = pods.http("GET", port, probe["httpGet"]["path"])
                passed = 200 <= status < 400
                detail = f"GET {probe['httpGet']['path']}: {status} {text[:200]}"
            else:
                port = port_number(container, probe["tcpSocket"]["port"])
                passed = pods.inside(TCP_ONE, str(port)).returncode == 0
                detail = f"TCP {port}"
            if passed:
                print(f"image-check: {what}: {detail}")
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not passing after {READY_TIMEOUT:.0f} s ({detail})")
            time.sleep(0.5)

    http_port = port_number(dispatcher, "http")
    config_maps = pods.objects("ConfigMap")
    config = json.loads(next(iter(next(iter(config_maps.values()))["data"].values())))
    model = next(iter(config["models"]))
    status, text = pods.http("POST", http_port, f"/v1/models/{model}:predict",
                             json.dumps(PREDICTION))  # fmt: skip
    assert status == 200, f"prediction through the dispatcher: {status} {text}"
    answer = json.loads(text)
    assert len(answer.get("outputs", answer.get("predictions", []))) == len(PREDICTION["inputs"])
    print(f"image-check: POST /v1/models/{model}:predict through the dispatcher: {status} {text}")

    token = next((e for e in dispatcher.get("env", []) if e["name"] == "WIREKIT_ADMIN_TOKEN"), None)
    assert token is not None, "the dispatcher has no admin token"
    ref = token["valueFrom"]["secretKeyRef"]
    status, text = pods.http("GET", http_port, "/admin/models")
    assert status == 401, f"the admin API without the token: {status} {text}"
    status, text = pods.http(
        "GET", http_port, "/admin/models", token=pods.secret_value(ref["name"], ref["key"])
    )
    assert status == 200, f"the admin API with the Secret's token: {status} {text}"
    print("image-check: GET /admin/models: 401 without the token, 200 with the Secret's")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("image")
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args(argv)
    config = args.config.resolve()
    with tempfile.TemporaryDirectory(prefix="wirekit-image-check.") as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o755)
        generated = docker(
            "run", "--rm", "--network", "none", "--volume", f"{config.parent}:/in:ro",
            args.image, "serve", "k8s", "--config", f"/in/{config.name}",
        )  # fmt: skip
        pods = Pods(args.image, json.loads(generated), workdir)
        try:
            pods.start()
            check(pods)
        except (AssertionError, RuntimeError) as error:
            pods.logs()
            print(f"image-check: {error}", file=sys.stderr)
            return 1
        finally:
            pods.stop()
    print(f"image-check: {args.image}: the manifests' pods ran and answered")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DOCKER_CLI_HINTS", "false")
    sys.exit(main())
