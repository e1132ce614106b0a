"""Static models → Kubernetes: the manifests of a deployment config (``wirekit serve k8s``).

:func:`manifests` is a pure function, config document in, Kubernetes objects (dicts) out;
:func:`write` puts them on standard output (one ``v1 List``) or one file per object in a
directory.  Output is JSON, which is YAML too: ``kubectl apply -f`` reads it as it is, and
no YAML library is needed.  The mapping (specs/k8s.md has it with an example):

- every **node** of the config is a one-replica ``StatefulSet`` named ``<name>-node-<id>``
  (a stable pod name, ``<name>-node-<id>-0``, for an actuator to address), and a headless
  ``Service`` of the same name through which the dispatcher reaches its backends.  Its pod
  may run on any Kubernetes node: only the config's ``k8s`` tables (``node_selector``,
  ``tolerations``; :class:`~wirekit.serve.config.K8sConfig`) place it;
- in its pod, a **container per (CPU device, model)** with a quota > 0, named
  ``cpu<device>-<model>``, with ``requests.cpu`` = ``limits.cpu`` = quota × ``cpu_cores``
  (the cores one CPU device stands for) and an in-place ``resizePolicy`` for CPU, so an
  actuator can change a share without a restart; a **container per GPU** given to a model,
  ``gpu<device>-<model>``, with ``limits: nvidia.com/gpu: 1``.  Memory (and a GPU
  container's CPU) is requested and limited as ``k8s.cpu_backend`` / ``k8s.gpu_backend``
  say, with defaults.  Each runs the model's ``handler`` (``wirekit mip serve``, or
  ``wirekit clipper container`` for Clipper models) and knows its row from ``WIREKIT_ROW``
  (``node/device/model``);
- the **actuator** of a node is the Kubernetes API itself: the dispatcher's
  ``ServiceAccount`` is bound to a ``Role`` that may patch pods (``pods/resize``: CPU in
  place) and StatefulSets (GPUs: the pod is recreated), and nothing else;
- the **dispatcher** (``wirekit serve``) is a one-replica ``Deployment`` (the SQLite store
  has one writer: strategy ``Recreate``) and a ``Service`` named ``<name>`` with its HTTP,
  MIP front door and Clipper RPC ports; its config is a ``ConfigMap``: the given config with
  ``listen.host`` ``0.0.0.0``, each node's ``endpoint`` replaced by its Service and the
  store's file name relative (in the working directory: the data volume).  Listening beyond
  loopback, its admin API needs a token: the ``Secret`` ``<name>-admin`` (key ``token``)
  reaches it as ``WIREKIT_ADMIN_TOKEN``.  The manifests name it and do not write it (a new
  token at each run would change it under a running dispatcher): :func:`admin_secret`
  makes it once (``--create-admin-secret``, for ``kubectl create``, which never replaces
  one); only the config's own ``admin.token`` is written with the manifests, out of the
  ConfigMap; ``--admin-secret`` names another Secret.  Its Service also exposes
  ``k8s.runtime_mip_ports``: the MIP front doors of models added at run time.
  Its requests store and journals are on a ``PersistentVolumeClaim`` ``<name>-data``;
  probes: startup and liveness on ``/healthz``, readiness on ``/readyz`` (a TCP check of
  the first front door without HTTP).
- every pod meets the "restricted" Pod Security Standard: the image's non-root user
  (:data:`RUN_AS`, the ``Dockerfile``'s), which owns the data volume (``fsGroup``); the
  runtime's default seccomp profile; no privilege escalation, every capability dropped.

Kubernetes needs fixed ports: a listener on port 0 (any free port) is refused with a
:class:`~wirekit.serve.config.ConfigError` naming it, as is a name that cannot become a
Kubernetes name, or two containers of one pod on one port.
"""

from __future__ import annotations

import copy
import json
import posixpath
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from wirekit import __version__

from ..config import (
    SERVER_KINDS,
    ConfigError,
    Deployment,
    DeviceRow,
    K8sPlacement,
    K8sResources,
    k8s_quantity,
    parse_config,
)
from ..doors.adminauth import ADMIN_TOKEN_ENV

CONFIG_DIR = "/etc/wirekit"  #: where the dispatcher's container finds the ConfigMap
CONFIG_FILE = "deployment.json"
DATA_DIR = "/var/lib/wirekit"  #: the dispatcher's working directory (the store, the journal)
#: the user and group every container runs as: the image's non-root ``wirekit`` user (the
#: repository's ``Dockerfile``, ``USER 10001:10001``)
RUN_AS = 10001
ADMIN_TOKEN_KEY = "token"  #: the key of the admin token in its Secret
#: the label of a Kubernetes node's host name: ``k8s: {node_selector: {NODE_LABEL: ...}}``
#: pins a node's pod to one Kubernetes node
NODE_LABEL = "kubernetes.io/hostname"
#: the ``imagePullPolicy`` values
PULL_POLICIES = ("IfNotPresent", "Always", "Never")
#: what the dispatcher's process holds besides its MIP memory budget and its cache: its
#: memory limit below the three would have it killed before the budget refuses anything
DISPATCHER_BASELINE = 128 * 1024 * 1024

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class K8sOptions:
    """What the config does not say about the cluster (``wirekit serve k8s`` flags)."""

    #: an image with wirekit (``wirekit`` on PATH) and the models' handler modules
    image: str = f"wirekit:{__version__}"
    namespace: str = "default"
    name: str = "wirekit"  #: prefix of every object's name
    cpu_cores: float = 1.0  #: the cores one CPU device of the config stands for
    #: the Secret with the admin token under ``token`` (None: ``<name>-admin``); the
    #: manifests name it, and write it only with the config's ``admin.token``
    admin_secret: str | None = None
    store_size: str = "1Gi"  #: the size the data volume (store and journals) asks for
    #: when the kubelet pulls the image: ``IfNotPresent`` (a tag is pulled once per node),
    #: ``Always`` (a moving tag), ``Never`` (an image loaded onto the nodes)
    image_pull_policy: str = "IfNotPresent"
    #: Secrets of type ``kubernetes.io/dockerconfigjson`` for a private registry
    image_pull_secrets: tuple[str, ...] = ()


def manifests(doc: Any, options: K8sOptions | None = None) -> list[dict[str, Any]]:
    """The Kubernetes objects of a deployment config document (parsed JSON/TOML).

    The document is validated as ``wirekit serve`` does (:func:`parse_config`), then checked
    for what Kubernetes needs; both raise :class:`ConfigError` naming the bad value.
    """
    opts = options or K8sOptions()
    _check_options(opts)
    dep = parse_config(doc)
    node_ids = _node_names(dep, opts)
    cluster_doc = _cluster_config(doc, dep, node_ids)
    parse_config(cluster_doc)  # what the dispatcher will read is valid too
    objects: list[dict[str, Any]] = [
        _object("v1", "ServiceAccount", opts.name, opts),
        _actuator_role(opts),
        _actuator_binding(opts),
        {
            **_object("v1", "ConfigMap", f"{opts.name}-config", opts),
            "data": {CONFIG_FILE: json.dumps(cluster_doc, indent=2) + "\n"},
        },
    ]
    if dep.admin.enabled and dep.admin.token is not None and opts.admin_secret is None:
        # the config's own token: the same at each run (the file says it)
        objects.append(admin_secret(opts, dep.admin.token))
    objects.append(_data_claim(opts))
    for node_id, service in node_ids.items():
        rows = [r for r in dep.rows if r.node == node_id and r.quota > 0]
        if rows:  # a node without a model to serve has no pod
            objects.extend(_node_objects(node_id, service, rows, dep, opts))
    objects.extend(_dispatcher_objects(dep, opts))
    return objects


def admin_secret_name(options: K8sOptions | None = None) -> str:
    """The name of the Secret the dispatcher's admin token comes from."""
    opts = options or K8sOptions()
    return opts.admin_secret or f"{opts.name}-admin"


def admin_secret(options: K8sOptions | None = None, token: str | None = None) -> dict[str, Any]:
    """The Secret of the dispatcher's admin token (:func:`admin_secret_name`), with
    ``token`` or a new random one: ``wirekit serve k8s --create-admin-secret | kubectl
    create -f -`` makes it once (``kubectl create`` refuses to replace an existing one, so
    running it again rotates nothing)."""
    opts = options or K8sOptions()
    _check_options(opts)
    return {
        **_object("v1", "Secret", admin_secret_name(opts), opts),
        "type": "Opaque",
        "stringData": {ADMIN_TOKEN_KEY: token or secrets.token_urlsafe(32)},
    }


def write(objects: list[dict[str, Any]], out: TextIO | None, directory: Path | None) -> list[str]:
    """Write ``objects`` as one ``v1 List`` to ``out``, or one ``NN-kind-name.json`` file each
    into ``directory`` (created if missing); returns the files written."""
    if directory is None:
        assert out is not None
        out.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
        out.write("\n")
        return []
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for i, obj in enumerate(objects):
        path = directory / f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.json"
        path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
        written.append(str(path))
    return written


# --- names -----------------------------------------------------------------------------------


def _dns(text: str, where: str, what: str) -> str:
    """``text`` as a DNS-1035 label part (lower case, ``-`` for anything else)."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not name:
        raise ConfigError(where, f"{what} {text!r} has no letter or digit to name it by")
    return name


def _fits(name: str, where: str, what: str) -> str:
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise ConfigError(
            where, f"{what} {name!r} is not a Kubernetes name (a-z, 0-9, '-', 63 at most)"
        )
    return name


_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _check_options(opts: K8sOptions) -> None:
    _fits(opts.name, "--name", "name")
    _fits(opts.namespace, "--namespace", "namespace")
    if opts.admin_secret is not None and (
        len(opts.admin_secret) > 253 or not _SUBDOMAIN.match(opts.admin_secret)
    ):
        raise ConfigError(
            "--admin-secret", f"{opts.admin_secret!r} is not a Kubernetes Secret name"
        )
    if not _QUANTITY.match(opts.store_size):
        raise ConfigError(
            "--store-size", f"not a Kubernetes quantity (such as 1Gi): {opts.store_size!r}"
        )
    if not opts.image or any(c.isspace() for c in opts.image):
        raise ConfigError("--image", f"not an image reference: {opts.image!r}")
    if not opts.cpu_cores > 0 or opts.cpu_cores > 4096:
        raise ConfigError("--cpu-cores", f"must be > 0 and <= 4096, got {opts.cpu_cores}")
    if opts.image_pull_policy not in PULL_POLICIES:
        raise ConfigError(
            "--image-pull-policy",
            f"must be one of {', '.join(PULL_POLICIES)}, got {opts.image_pull_policy!r}",
        )
    for secret in opts.image_pull_secrets:
        if len(secret) > 253 or not _SUBDOMAIN.match(secret):
            raise ConfigError("--image-pull-secret", f"{secret!r} is not a Kubernetes Secret name")


def _node_names(dep: Deployment, opts: K8sOptions) -> dict[str, str]:
    """node id -> the name of its StatefulSet and Service (unique, valid)."""
    names: dict[str, str] = {}
    for n, node_id in enumerate(dict.fromkeys(r.node for r in dep.rows)):
        where = f"nodes[{n}].id"
        name = _fits(node_name(node_id, opts, where), where, "node name")
        for other, taken in names.items():
            if taken == name:
                raise ConfigError(where, f"nodes {other!r} and {node_id!r} both become {name!r}")
        names[node_id] = name
    return names


def node_name(node_id: str, options: K8sOptions | None = None, where: str = "node") -> str:
    """The name of a node's StatefulSet and Service; its pod is this + ``-0``."""
    opts = options or K8sOptions()
    return f"{opts.name}-node-{_dns(node_id, where, 'node id')}"


def container_name(row: DeviceRow, where: str = "model") -> str:
    """The name of a row's container in its node's pod: ``cpu<device>-<model>`` or
    ``gpu<device>-<model>``."""
    kind = "cpu" if row.device_type == "CPU" else "gpu"
    return _fits(f"{kind}{row.device}-{_dns(row.model, where, 'model')}", where, "container")


def cpu_quantity(share: float, options: K8sOptions | None = None) -> str:
    """A CPU share of one device as a Kubernetes quantity (millicores, 1m at least)."""
    opts = options or K8sOptions()
    return f"{max(1, round(share * opts.cpu_cores * 1000))}m"


def resize_patch(row: DeviceRow, share: float, options: K8sOptions | None = None) -> dict[str, Any]:
    """The patch that gives ``row``'s container ``share`` of its CPU device in place: the body
    of ``PATCH pods/<node_name(row.node)>-0/resize`` (``kubectl patch pod ... --subresource
    resize -p ...``); what a Kubernetes actuator's ``set_cpu_share`` sends."""
    cpu = cpu_quantity(share, options)
    return {
        "spec": {
            "containers": [
                {
                    "name": container_name(row),
                    "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}},
                }
            ]
        }
    }


# --- objects ---------------------------------------------------------------------------------


def _labels(opts: K8sOptions, component: str, **extra: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "wirekit",
        "app.kubernetes.io/instance": opts.name,
        "app.kubernetes.io/component": component,
        **extra,
    }


def _object(api: str, kind: str, name: str, opts: K8sOptions, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": opts.namespace}
    meta["labels"] = labels or _labels(opts, "dispatcher")
    return {"apiVersion": api, "kind": kind, "metadata": meta}


def _actuator_role(opts: K8sOptions) -> dict[str, Any]:
    return {
        **_object("rbac.authorization.k8s.io/v1", "Role", f"{opts.name}-actuator", opts),
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["get", "patch"]},
            {
                "apiGroups": ["apps"],
                "resources": ["statefulsets"],
                "verbs": ["get", "list", "patch"],
            },
        ],
    }


def _actuator_binding(opts: K8sOptions) -> dict[str, Any]:
    return {
        **_object("rbac.authorization.k8s.io/v1", "RoleBinding", f"{opts.name}-actuator", opts),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": f"{opts.name}-actuator",
        },
        "subjects": [{"kind": "ServiceAccount", "name": opts.name, "namespace": opts.namespace}],
    }


def _cluster_config(doc: Mapping[str, Any], dep: Deployment, nodes: dict[str, str]) -> Any:
    """The config the dispatcher reads in the cluster: listening on every interface, each
    node's backends reached through its Service, every listener on a fixed port."""
    if dep.http_port == 0:
        raise ConfigError("listen.http_port", "Kubernetes needs a fixed port, got 0 (any)")
    if dep.grpc_port == 0:
        raise ConfigError("listen.grpc_port", "Kubernetes needs a fixed port, got 0 (any)")
    if dep.clipper_rpc_port == 0:
        raise ConfigError(
            "listen.clipper_rpc_port",
            "Clipper containers connect to the dispatcher: Kubernetes needs a fixed port",
        )
    for name, model in dep.models.items():
        if model.mip_port == 0:
            raise ConfigError(
                f"models.{name}.port",
                "Kubernetes needs a fixed port for the MIP front door, got 0 (any); "
                "null: no MIP front door",
            )
    cluster = copy.deepcopy(dict(doc))
    cluster["listen"] = {**cluster.get("listen", {}), "host": "0.0.0.0"}
    cluster["nodes"] = [{**node, "endpoint": nodes[node["id"]]} for node in cluster["nodes"]]
    # the store (or, with a PostgreSQL url, this replica's journals) on the data volume,
    # the dispatcher's working directory (absolute: a relative store.path is the config
    # file's directory's, the ConfigMap's)
    store_name = posixpath.basename(dep.store.path.replace("\\", "/")) or "requests.db"
    cluster["store"] = {**cluster.get("store", {}), "path": f"{DATA_DIR}/{store_name}"}
    if "admin" in cluster:  # a token belongs in the Secret, not in a ConfigMap
        cluster["admin"] = {k: v for k, v in cluster["admin"].items() if k != "token"}
    return cluster


def _data_claim(opts: K8sOptions) -> dict[str, Any]:
    """The dispatcher's data volume: its requests store and journals outlive its pod."""
    return {
        **_object("v1", "PersistentVolumeClaim", f"{opts.name}-data", opts),
        "spec": {
            "accessModes": ["ReadWriteOnce"],  # one dispatcher (strategy Recreate)
            "resources": {"requests": {"storage": opts.store_size}},
        },
    }


def _pod_security() -> dict[str, Any]:
    """Every pod: the image's non-root user, which also owns the mounted volumes, and the
    container runtime's default seccomp profile (the "restricted" Pod Security Standard)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> dict[str, Any]:
    """Every container: no way to more privileges than its user's, no capability (the
    "restricted" Pod Security Standard; wirekit binds no port below 1024 in a pod)."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }


def _pod_spec(
    opts: K8sOptions, placement: K8sPlacement, containers: list[dict[str, Any]], **more: Any
) -> dict[str, Any]:
    """A pod template's spec: its containers, where it may run, the security of every pod."""
    spec: dict[str, Any] = dict(more)
    if placement.node_selector:
        spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        spec["tolerations"] = [dict(t) for t in placement.tolerations]
    if opts.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    spec["securityContext"] = _pod_security()
    spec["containers"] = containers
    return spec


def _resources(device: Mapping[str, str], config: K8sResources) -> dict[str, Any]:
    """A container's ``resources``: the config's requests and limits, with its ``device``
    (a CPU share: request and limit; a GPU: limit) added."""
    requests = {**{k: v for k, v in device.items() if k == "cpu"}, **dict(config.requests)}
    limits = {**device, **dict(config.limits)}
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources


def _node_objects(
    node_id: str, name: str, rows: list[DeviceRow], dep: Deployment, opts: K8sOptions
) -> list[dict[str, Any]]:
    n = list(dict.fromkeys(r.node for r in dep.rows)).index(node_id)
    labels = _labels(opts, "node", **{"wirekit.io/node": name.removeprefix(f"{opts.name}-node-")})
    containers = []
    ports: dict[int, str] = {}
    names: dict[str, str] = {}
    for row in rows:
        where = f"models.{row.model}"
        container = _backend_container(row, dep, opts, where)
        if container["name"] in names:
            raise ConfigError(
                where,
                f"{names[container['name']]} and {row.key} both become "
                f"{container['name']!r} (a container name in a pod is unique)",
            )
        names[container["name"]] = row.key
        if row.port is not None:
            if row.port in ports:
                raise ConfigError(
                    f"nodes[{n}].ports",
                    f"port {row.port} is both {ports[row.port]} and {row.key}: the containers"
                    " of one pod share its network, each backend needs its own port",
                )
            ports[row.port] = row.key
        containers.append(container)
    stateful_set = {
        **_object("apps/v1", "StatefulSet", name, opts, **labels),
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                # on any Kubernetes node unless the config places it; the backends do not
                # call the Kubernetes API: no token of it in their pod
                "spec": _pod_spec(
                    opts,
                    dep.k8s.placement(node_id),
                    containers,
                    automountServiceAccountToken=False,
                ),
            },
        },
    }
    service = {
        **_object("v1", "Service", name, opts, **labels),
        "spec": {
            # headless: the name resolves to the pod itself (no ports when the pod has only
            # Clipper containers, which dial out)
            "clusterIP": "None",
            "selector": labels,
            "ports": [
                {"name": f"mip-{port}", "port": port, "targetPort": port, "protocol": "TCP"}
                for port in sorted(ports)
            ],
        },
    }
    return [service, stateful_set]


def _backend_container(
    row: DeviceRow, dep: Deployment, opts: K8sOptions, where: str
) -> dict[str, Any]:
    model = dep.models[row.model]
    handler = model.handler
    if row.backend in SERVER_KINDS:
        raise ConfigError(
            where,
            f"the {row.backend} backend is a model server of your own (MLServer, KServe, TF"
            " Serving): wirekit serve k8s makes MIP and Clipper backends only",
        )
    if row.backend == "clipper":
        args = [
            "clipper", "container", "--handler", handler, "--name", row.clipper_name or row.model,
            "--address", f"tcp://{opts.name}:{dep.clipper_rpc_port}",
            "--generation", dep.clipper_generation,
        ]  # fmt: skip
    else:
        args = ["mip", "serve", "--listen", f"tcp://0.0.0.0:{row.port}", "--handler", handler]
    container: dict[str, Any] = {
        "name": container_name(row, where),
        "image": opts.image,
        "imagePullPolicy": opts.image_pull_policy,
        "command": ["wirekit"],
        "args": args,
        "env": [
            {"name": "WIREKIT_ROW", "value": row.key},
            {"name": "WIREKIT_DEVICE", "value": row.device_type},
        ],
    }
    if row.device_type == "CPU":
        cpu = cpu_quantity(row.quota, opts)
        container["resources"] = _resources({"cpu": cpu}, dep.k8s.cpu_backend)
        container["resizePolicy"] = [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]
    else:
        container["resources"] = _resources({dep.k8s.gpu_resource: "1"}, dep.k8s.gpu_backend)
    if row.port is not None:
        container["ports"] = [{"name": f"mip-{row.port}", "containerPort": row.port}]
        container["readinessProbe"] = {"tcpSocket": {"port": row.port}, "periodSeconds": 5}
    container["securityContext"] = _container_security()
    return container


def _dispatcher_ports(dep: Deployment) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The dispatcher's listeners, by name: HTTP, each model's MIP front door, the Clipper
    RPC and OIP gRPC ports; and the ``k8s.runtime_mip_ports`` none of them takes."""
    ports: list[dict[str, Any]] = []
    if dep.http_port is not None:
        ports.append({"name": "http", "port": dep.http_port})
    for model in dep.models.values():
        if model.mip_port is not None:
            ports.append({"name": f"mip-{model.mip_port}", "port": model.mip_port})
    if dep.clipper_rpc_port is not None:
        ports.append({"name": "clipper-rpc", "port": dep.clipper_rpc_port})
    if dep.grpc_port is not None:
        ports.append({"name": "grpc", "port": dep.grpc_port})
    runtime: list[dict[str, Any]] = []
    if dep.k8s.runtime_mip_ports is not None:
        taken = {p["port"] for p in ports}
        first, last = dep.k8s.runtime_mip_ports
        runtime.extend(
            {"name": f"mip-{port}", "port": port}
            for port in range(first, last + 1)
            if port not in taken
        )
    return ports, runtime


def _check_dispatcher_memory(dep: Deployment) -> None:
    """A memory limit the dispatcher's own budgets fit under, with room for the process."""
    limit = dict(dep.k8s.dispatcher.limits).get("memory")
    if limit is None:
        return
    needs = dep.mip.memory_budget + dep.cache.max_bytes + DISPATCHER_BASELINE
    if k8s_quantity(limit) < needs:
        raise ConfigError(
            "k8s.dispatcher.limits.memory",
            f"{limit} is below what the dispatcher may hold: memory_budget"
            f" ({dep.mip.memory_budget}) + cache.max_bytes ({dep.cache.max_bytes}) +"
            f" {DISPATCHER_BASELINE // 2**20}Mi for the process; it would be killed before"
            f" its budget refuses anything (give {-(-needs // 2**20)}Mi or more)",
        )


def _dispatcher_objects(dep: Deployment, opts: K8sOptions) -> list[dict[str, Any]]:
    labels = _labels(opts, "dispatcher")
    ports, runtime_ports = _dispatcher_ports(dep)
    if not ports:
        raise ConfigError("listen.http_port", "the dispatcher would listen nowhere")
    _check_dispatcher_memory(dep)
    container: dict[str, Any] = {
        "name": "dispatcher",
        "image": opts.image,
        "imagePullPolicy": opts.image_pull_policy,
        "command": ["wirekit"],
        "args": ["serve", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}", "--log-level", "info"],
        "workingDir": DATA_DIR,
        # the ports of the config (those kept for models added at run time are the
        # Service's: a container's list is informational)
        "ports": [{"name": p["name"], "containerPort": p["port"]} for p in ports],
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "data", "mountPath": DATA_DIR},
        ],
        "resources": _resources({}, dep.k8s.dispatcher),
    }
    if dep.admin.enabled:
        # beyond loopback the admin API needs a configured token: the Secret's
        container["env"] = [
            {
                "name": ADMIN_TOKEN_ENV,
                "valueFrom": {
                    "secretKeyRef": {"name": admin_secret_name(opts), "key": ADMIN_TOKEN_KEY}
                },
            }
        ]
    if dep.http_port is not None:
        # alive: the process and its loop answer (restarted otherwise); ready: it can serve
        # (its store takes writes, a backend of every model is reachable), else no traffic;
        # started: a long journal replay at start is not taken for a hung process
        alive: dict[str, Any] = {"httpGet": {"path": "/healthz", "port": "http"}}
        ready: dict[str, Any] = {"httpGet": {"path": "/readyz", "port": "http"}}
    else:  # no HTTP front door: its first listener takes connections
        alive = ready = {"tcpSocket": {"port": ports[0]["port"]}}
    container["startupProbe"] = {**alive, "periodSeconds": 5, "failureThreshold": 60}
    container["livenessProbe"] = {**alive, "periodSeconds": 10, "failureThreshold": 3}
    container["readinessProbe"] = {**ready, "periodSeconds": 5}
    container["securityContext"] = _container_security()
    deployment = {
        **_object("apps/v1", "Deployment", f"{opts.name}-dispatcher", opts, **labels),
        "spec": {
            "replicas": 1,  # the SQLite store has one writer
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": _pod_spec(
                    opts,
                    dep.k8s.dispatcher_placement,
                    [container],
                    serviceAccountName=opts.name,
                    volumes=[
                        {"name": "config", "configMap": {"name": f"{opts.name}-config"}},
                        {
                            "name": "data",
                            "persistentVolumeClaim": {"claimName": f"{opts.name}-data"},
                        },
                    ],
                ),
            },
        },
    }
    service = {
        **_object("v1", "Service", opts.name, opts, **labels),
        "spec": {
            "selector": labels,
            "ports": [
                {**p, "targetPort": p["port"], "protocol": "TCP"} for p in ports + runtime_ports
            ],
        },
    }
    return [deployment, service]
