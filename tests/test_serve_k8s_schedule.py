"""``wirekit serve k8s``: manifests that schedule on a real cluster (issue 41).

- no pod is tied to a Kubernetes node unless the config's ``k8s`` tables say where;
- every pod meets the Pod Security Standards, baseline and restricted, checked here rule by
  rule as Kubernetes documents them;
- every container asks for CPU and memory, settable in the config;
- the admin token's Secret is made once (``--create-admin-secret``), not at each run;
- the dispatcher's Service exposes the MIP ports kept for models added at run time;
- ``imagePullPolicy`` and the registry's pull Secrets are settable.

Every object is validated against the Kubernetes schemas (``kubernetes-validate``, strict),
and the command runs as a user runs it: ``python -m wirekit serve k8s``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from k8s_support import (
    ROOT,
    SAMPLE,
    by_kind,
    changed,
    k8s_objects,
    running_dispatcher,
    stage_dispatcher_pod,
    validate_all,
    wirekit,
)

from wirekit.serve.config import ConfigError, k8s_quantity, read_document
from wirekit.serve.control.k8s import K8sOptions, admin_secret, manifests

POD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Pod")


def pod_templates(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``kind/name`` -> the pod (``metadata``, ``spec``) of every object that makes pods."""
    pods = {}
    for obj in objects:
        if obj["kind"] == "Pod":
            pods[f"Pod/{obj['metadata']['name']}"] = obj
        elif obj["kind"] in POD_KINDS:
            pods[f"{obj['kind']}/{obj['metadata']['name']}"] = obj["spec"]["template"]
    return pods


def dispatcher_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(objects)["Deployment", "wirekit-dispatcher"]["spec"]["template"]["spec"]


def node_pod(objects: list[dict[str, Any]], node: str) -> dict[str, Any]:
    return by_kind(objects)["StatefulSet", f"wirekit-node-{node}"]["spec"]["template"]["spec"]


def every_container(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        c
        for key in ("containers", "initContainers", "ephemeralContainers")
        for c in spec.get(key, [])
    ]


# --- the Pod Security Standards ---------------------------------------------------------------
# The rules of https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the
# "Baseline" and "Restricted" tables: each control, the fields it restricts, the values it
# allows), one check each.  A control that names `containers[*]` covers init and ephemeral
# containers as well.

#: Baseline, "Capabilities": what may be added (beyond it, nothing)
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})  # fmt: skip
#: Baseline, "Sysctls": the safe set
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})  # fmt: skip
#: Baseline, "SELinux": the types that may be set
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t",
                           "container_engine_t"})  # fmt: skip
#: Restricted, "Volume Types": the only volume sources allowed
RESTRICTED_VOLUMES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
})  # fmt: skip
SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    """The Baseline controls ``pod`` (``metadata``, ``spec``) breaks, named."""
    spec, annotations = pod["spec"], pod.get("metadata", {}).get("annotations", {})
    pod_sc = spec.get("securityContext", {})
    found = []
    contexts = [("spec.securityContext", pod_sc)] + [
        (f"container {c['name']}", c.get("securityContext", {})) for c in every_container(spec)
    ]
    for where, sc in contexts:
        if sc.get("windowsOptions", {}).get("hostProcess") not in (None, False):
            found.append(f"HostProcess: {where}")
        selinux = sc.get("seLinuxOptions", {})
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user", "") != "":
            found.append(f"SELinux: {where}")
        if selinux.get("role", "") != "":
            found.append(f"SELinux: {where}")
        if sc.get("seccompProfile", {}).get("type") not in (None, *SECCOMP_ALLOWED):
            found.append(f"Seccomp: {where}")
        if sc.get("appArmorProfile", {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"AppArmor: {where}")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key) not in (None, False):
            found.append(f"Host Namespaces: spec.{key}")
    for c in every_container(spec):
        sc = c.get("securityContext", {})
        if sc.get("privileged") not in (None, False):
            found.append(f"Privileged Containers: {c['name']}")
        if set(sc.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES:
            found.append(f"Capabilities: {c['name']}")
        if any(p.get("hostPort", 0) != 0 for p in c.get("ports", [])):
            found.append(f"Host Ports: {c['name']}")
        if sc.get("procMount", "Default") != "Default":
            found.append(f"/proc Mount Type: {c['name']}")
    for volume in spec.get("volumes", []):
        if "hostPath" in volume:
            found.append(f"HostPath Volumes: {volume['name']}")
    for key, value in annotations.items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            found.append(f"AppArmor: annotation {key}")
    for sysctl in pod_sc.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"Sysctls: {sysctl['name']}")
    return found


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The Restricted controls (Baseline's included) ``pod`` breaks, named."""
    spec = pod["spec"]
    pod_sc = spec.get("securityContext", {})
    found = baseline_violations(pod)
    for volume in spec.get("volumes", []):
        sources = set(volume) - {"name"}
        if sources - RESTRICTED_VOLUMES:
            found.append(f"Volume Types: {volume['name']} ({', '.join(sorted(sources))})")
    if pod_sc.get("runAsUser") == 0:
        found.append("Running as Non-root user: spec.securityContext.runAsUser")
    for c in every_container(spec):
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"Privilege Escalation: {c['name']}")
        # non-root: the pod says so and no container says otherwise, or every container says so
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            found.append(f"Running as Non-root: {c['name']}")
        if sc.get("runAsUser") == 0:
            found.append(f"Running as Non-root user: {c['name']}")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in SECCOMP_ALLOWED:
            found.append(f"Seccomp: {c['name']}")
        capabilities = sc.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"Capabilities: {c['name']} does not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"Capabilities: {c['name']} adds more than NET_BIND_SERVICE")
    return found


def _pod(**spec: Any) -> dict[str, Any]:
    """A pod that meets the restricted profile, with ``spec`` changed."""
    container = {
        "name": "c",
        "image": "x",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    base: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
    }
    return {"metadata": {}, "spec": {**base, **spec}}


def _container(**security: Any) -> list[dict[str, Any]]:
    return [{"name": "c", "image": "x", "securityContext": security}]


@pytest.mark.parametrize(
    ("pod", "control"),
    [
        (_pod(hostNetwork=True), "Host Namespaces"),
        (_pod(hostPID=True), "Host Namespaces"),
        (_pod(volumes=[{"name": "v", "hostPath": {"path": "/"}}]), "HostPath Volumes"),
        (_pod(volumes=[{"name": "v", "nfs": {"server": "s", "path": "/"}}]), "Volume Types"),
        (_pod(containers=_container(privileged=True)), "Privileged Containers"),
        (_pod(containers=_container(allowPrivilegeEscalation=True)), "Privilege Escalation"),
        (
            _pod(containers=_container(allowPrivilegeEscalation=False)),
            "Capabilities: c does not drop ALL",
        ),
        (
            _pod(
                containers=_container(
                    allowPrivilegeEscalation=False,
                    capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]},
                )
            ),
            "Capabilities: c adds more",
        ),
        (_pod(securityContext={"seccompProfile": {"type": "RuntimeDefault"}}), "Non-root"),
        (_pod(securityContext={"runAsNonRoot": True}), "Seccomp"),
        (
            _pod(
                securityContext={
                    "runAsNonRoot": True,
                    "seccompProfile": {"type": "Unconfined"},
                }
            ),
            "Seccomp",
        ),
        (
            _pod(
                containers=[
                    {
                        "name": "c",
                        "image": "x",
                        "ports": [{"containerPort": 80, "hostPort": 80}],
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ]
            ),
            "Host Ports",
        ),
    ],
)
def test_the_pod_security_check_finds_what_it_checks(pod, control):
    assert restricted_violations(_pod()) == []  # the reference pod meets the profile
    found = restricted_violations(pod)
    assert any(control in v for v in found), found


def test_every_pod_meets_the_restricted_profile():
    configs = [SAMPLE, SAMPLE.with_suffix(".toml")]
    for config in configs:
        objects = k8s_objects("--config", str(config), "--image-pull-secret", "regcred")
        pods = pod_templates(objects)
        assert sorted(pods) == [
            "Deployment/wirekit-dispatcher",
            "StatefulSet/wirekit-node-n1",
            "StatefulSet/wirekit-node-n2",
        ]
        for name, pod in pods.items():
            assert restricted_violations(pod) == [], name
            # the settings the issue names, where they are set
            assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
            for c in every_container(pod["spec"]):
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
                assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    validate_all(objects)


# --- where the pods run ------------------------------------------------------------------------

PLACED = {
    "listen": {"http_port": 8080, "grpc_port": 8081, "clipper_rpc_port": 7000},
    "models": {
        "vision": {"port": 9001, "handler": "zoo.vision:resnet"},
        "text": {"port": None, "backend": "clipper", "handler": "zoo.text:bert"},
    },
    "k8s": {
        "node_selector": {"wirekit.io/pool": "inference", "kubernetes.io/arch": "amd64"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml",
                         "effect": "NoSchedule"}],
        "dispatcher": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"cpu": None, "memory": "2Gi"},
            "node_selector": {"kubernetes.io/os": "linux"},
        },
        "cpu_backend": {"requests": {"memory": 536870912}, "limits": {"ephemeral-storage": "1Gi"}},
        "gpu_backend": {"limits": {"memory": "24Gi"}},
        "gpu_resource": "amd.com/gpu",
        "runtime_mip_ports": [9000, 9003],
    },
    "nodes": [
        {
            "id": "gpu-1",
            "endpoint": "10.0.0.7",
            "devices": ["CPU", "GPU"],
            "models": ["vision", "text"],
            "quotas": [0.5, 0.5, 1, 0],
            "ports": [9101, None, 9111, None],
            "k8s": {
                "node_selector": {"kubernetes.io/hostname": "gpu-box-1", "kubernetes.io/arch":
                                  "arm64"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                 "effect": "NoExecute", "tolerationSeconds": 60}],
            },
        },
        {"id": "cpu-1", "devices": ["CPU"], "models": ["vision"], "quotas": [1], "ports": [9201]},
    ],
}  # fmt: skip


def test_no_pod_is_placed_unless_the_config_says_where(tmp_path):
    for objects in (k8s_objects("--config", str(SAMPLE)), manifests(_without_k8s(PLACED))):
        for name, pod in pod_templates(objects).items():
            spec = pod["spec"]
            assert "nodeSelector" not in spec, name
            assert "affinity" not in spec and "nodeName" not in spec, name
            assert "tolerations" not in spec, name


def _without_k8s(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    doc.pop("k8s")
    for node in doc["nodes"]:
        node.pop("k8s", None)
    return doc


def test_placement_resources_and_ports_from_the_config(tmp_path):
    config = tmp_path / "placed.json"
    config.write_text(json.dumps(PLACED))
    objects = k8s_objects("--config", str(config), "--cpu-cores", "4")
    validate_all(objects)
    got = by_kind(objects)
    gpu_node, cpu_node = node_pod(objects, "gpu-1"), node_pod(objects, "cpu-1")
    # the node's labels added to every node's, winning on the same key; tolerations added
    assert gpu_node["nodeSelector"] == {
        "wirekit.io/pool": "inference",
        "kubernetes.io/arch": "arm64",
        "kubernetes.io/hostname": "gpu-box-1",
    }
    assert cpu_node["nodeSelector"] == {
        "wirekit.io/pool": "inference",
        "kubernetes.io/arch": "amd64",
    }
    dedicated = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    assert cpu_node["tolerations"] == [dedicated]
    assert gpu_node["tolerations"] == [
        dedicated,
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 60},
    ]  # fmt: skip
    dispatcher = dispatcher_pod(objects)
    assert dispatcher["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "tolerations" not in dispatcher
    # resources: merged into the defaults entry by entry, null removes one
    (d,) = dispatcher["containers"]
    assert d["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"memory": "2Gi"},
    }
    c = {x["name"]: x for x in gpu_node["containers"]}
    assert c["cpu0-vision"]["resources"] == {
        "requests": {"cpu": "2000m", "memory": "536870912"},
        "limits": {"cpu": "2000m", "memory": "1Gi", "ephemeral-storage": "1Gi"},
    }
    assert c["gpu1-vision"]["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"amd.com/gpu": "1", "cpu": "4", "memory": "24Gi"},
    }
    # the Service: every listener, and the run-time ports the config does not use already
    service = got["Service", "wirekit"]["spec"]["ports"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in service] == [
        ("http", 8080, 8080), ("mip-9001", 9001, 9001), ("clipper-rpc", 7000, 7000),
        ("grpc", 8081, 8081), ("mip-9000", 9000, 9000), ("mip-9002", 9002, 9002),
        ("mip-9003", 9003, 9003),
    ]  # fmt: skip
    # the dispatcher reads the config's k8s tables and ignores them
    cluster = json.loads(got["ConfigMap", "wirekit-config"]["data"]["deployment.json"])
    assert cluster["k8s"] == PLACED["k8s"]
    for pod in pod_templates(objects).values():
        assert restricted_violations(pod) == []


def test_every_container_has_requests_and_limits_by_default():
    objects = k8s_objects("--config", str(SAMPLE))
    for name, pod in pod_templates(objects).items():
        for c in every_container(pod["spec"]):
            resources = c["resources"]
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources[kind]), (name, c["name"], kind)
            for resource, request in resources["requests"].items():
                limit = resources["limits"][resource]
                assert k8s_quantity(request) <= k8s_quantity(limit), (name, c["name"])
    gpu = {c["name"]: c for c in node_pod(objects, "n1")["containers"]}["gpu1-m1"]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_the_documented_placement_example_is_a_valid_config():
    text = (ROOT / "specs" / "k8s.md").read_text()
    start = text.index("```json\n", text.index("## Where the pods run")) + len("```json\n")
    doc = json.loads(text[start : text.index("```", start)])
    objects = manifests(doc)
    assert node_pod(objects, "n1")["nodeSelector"] == {
        "wirekit.io/pool": "inference",
        "kubernetes.io/hostname": "gpu-box-1",
    }
    assert dispatcher_pod(objects)["nodeSelector"] == {"kubernetes.io/os": "linux"}


def _placed(path: list[Any], value: Any) -> dict[str, Any]:
    return changed(PLACED, path, value)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            _placed(["k8s", "node_selector"], {"bad key!": "x"}),
            "k8s.node_selector.bad key!: label 'bad key!' is not a Kubernetes name",
        ),
        (
            _placed(["nodes", 0, "k8s", "node_selector"], {"zone": "a b"}),
            "nodes[0].k8s.node_selector.zone: expected a label value",
        ),
        (
            _placed(["nodes", 0, "k8s", "tolerations"], [{"operator": "Equal"}]),
            "nodes[0].k8s.tolerations[0].operator: a toleration without a key must be Exists",
        ),
        (
            _placed(["k8s", "tolerations"], [{"key": "a", "effect": "Never"}]),
            "k8s.tolerations[0].effect: must be one of NoSchedule, PreferNoSchedule, NoExecute",
        ),
        (
            _placed(["k8s", "dispatcher", "requests", "memory"], "lots"),
            "k8s.dispatcher.requests.memory: expected a Kubernetes quantity",
        ),
        (
            _placed(["k8s", "gpu_backend", "requests"], {"memory": "32Gi"}),
            "k8s.gpu_backend.requests.memory: 32Gi is above its limit (24Gi)",
        ),
        (
            _placed(["k8s", "cpu_backend", "limits"], {"cpu": "2"}),
            "k8s.cpu_backend.limits.cpu: is the device itself",
        ),
        (
            _placed(["k8s", "gpu_backend", "limits"], {"amd.com/gpu": "2"}),
            "k8s.gpu_backend.limits.amd.com/gpu: is the device itself",
        ),
        (
            _placed(["k8s", "runtime_mip_ports"], [9000, 9200]),
            "k8s.runtime_mip_ports[1]: must be between 9000 and 9099",
        ),
        (
            _placed(["k8s", "dispatcher"], {"limits": {"memory": "300Mi"}, "requests": {}}),
            "k8s.dispatcher.limits.memory: 300Mi is below what the dispatcher may hold:"
            " memory_budget (268435456) + cache.max_bytes (67108864) + 128Mi for the process",
        ),
        (_placed(["k8s", "affinity"], {}), "k8s.affinity: unknown key"),
        (_placed(["listen", "grpc_port"], 0), "listen.grpc_port: Kubernetes needs a fixed port"),
    ],
)
def test_k8s_settings_kubernetes_cannot_take_are_refused(doc, message):
    with pytest.raises(ConfigError) as refused:
        manifests(doc)
    assert message in str(refused.value)


def test_a_bad_k8s_setting_on_the_command_line(tmp_path):
    # one line naming the file and the value, exit 1, as for any bad config; `wirekit serve
    # check` refuses it too (the one config reader)
    config = tmp_path / "bad.json"
    config.write_text(json.dumps(_placed(["k8s", "dispatcher", "requests", "memory"], "lots")))
    done = wirekit("serve", "k8s", "--config", str(config))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"wirekit serve k8s: {config}: k8s.dispatcher.requests.memory: expected a Kubernetes"
        " quantity (such as 500m or 1Gi), got 'lots'\n"
    )
    done = wirekit("serve", "check", "--config", str(config))
    assert done.returncode == 1 and "k8s.dispatcher.requests.memory" in done.stderr


# --- the admin token: made once --------------------------------------------------------------


def test_a_second_run_writes_the_same_manifests_and_no_new_token(tmp_path):
    first = wirekit("serve", "k8s", "--config", str(SAMPLE))
    second = wirekit("serve", "k8s", "--config", str(SAMPLE))
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout  # kubectl apply of a new run changes nothing
    objects = json.loads(first.stdout)["items"]
    assert [o for o in objects if o["kind"] == "Secret"] == []
    (container,) = dispatcher_pod(objects)["containers"]
    assert container["env"] == [
        {
            "name": "WIREKIT_ADMIN_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "wirekit-admin", "key": "token"}},
        }
    ]


def test_the_admin_secret_is_made_apart_once(tmp_path):
    made = [k8s_objects("--create-admin-secret", "--namespace", "models", "--name", "zoo")]
    made.append([admin_secret(K8sOptions(namespace="models", name="zoo"))])
    for objects in made:
        (secret,) = objects
        validate_all(objects)
        assert (secret["kind"], secret["metadata"]["name"]) == ("Secret", "zoo-admin")
        assert secret["metadata"]["namespace"] == "models"
        assert len(secret["stringData"]["token"]) >= 32
    # a new token each time: for `kubectl create`, which never replaces the Secret there is
    assert made[0][0]["stringData"] != made[1][0]["stringData"]
    # the manifests of the same --name and --namespace name it
    objects = k8s_objects("--config", str(SAMPLE), "--namespace", "models", "--name", "zoo")
    env = by_kind(objects)["Deployment", "zoo-dispatcher"]["spec"]["template"]["spec"]
    ref = env["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "zoo-admin", "key": "token"}
    # into a directory, as the manifests
    out = tmp_path / "secret"
    done = wirekit("serve", "k8s", "--create-admin-secret", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert [f.name for f in out.iterdir()] == ["00-secret-wirekit-admin.json"]


# --- the image ---------------------------------------------------------------------------------


def test_image_pull_policy_and_registry_secrets():
    objects = k8s_objects(
        "--config", str(SAMPLE), "--image", "registry.example.com/team/zoo:7",
        "--image-pull-policy", "Always",
        "--image-pull-secret", "regcred", "--image-pull-secret", "mirror",
    )  # fmt: skip
    validate_all(objects)
    for pod in pod_templates(objects).values():
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
        for c in every_container(pod["spec"]):
            assert (c["image"], c["imagePullPolicy"]) == (
                "registry.example.com/team/zoo:7",
                "Always",
            )
    default = manifests(read_document(SAMPLE))
    for pod in pod_templates(default).values():
        assert "imagePullSecrets" not in pod["spec"]
        assert {c["imagePullPolicy"] for c in every_container(pod["spec"])} == {"IfNotPresent"}
    done = wirekit("serve", "k8s", "--config", str(SAMPLE), "--image-pull-policy", "Sometimes")
    assert done.returncode == 2 and "--image-pull-policy" in done.stderr
    with pytest.raises(ConfigError, match="'Not_A_Name' is not a Kubernetes Secret name"):
        manifests(read_document(SAMPLE), K8sOptions(image_pull_secrets=("Not_A_Name",)))


def test_the_options_are_checked_by_the_function_too():
    with pytest.raises(ConfigError, match="--image-pull-policy"):
        manifests(read_document(SAMPLE), K8sOptions(image_pull_policy="always"))


# --- a model added at run time, reached on a port the Service keeps -------------------------


def test_a_model_added_at_run_time_listens_on_a_port_the_service_exposes(tmp_path):
    # The dispatcher's pod is played on the machine, as tests/test_serve_k8s.py does: the
    # ConfigMap's file, the Secret's token in its environment, its working directory.  A
    # model is then added through the admin API on a port of k8s.runtime_mip_ports, on a
    # node of the operator's own, and its MIP front door answers there: the port the
    # Service forwards.
    import socket
    import urllib.request

    from support.ports import free_port

    doc = json.loads(SAMPLE.read_text())
    doc["listen"]["http_port"] = free_port("")
    for model in doc["models"].values():
        model["port"] = free_port("")
    runtime_port = free_port("")
    doc["k8s"] = {"runtime_mip_ports": [runtime_port, runtime_port]}
    config = tmp_path / "deployment.json"
    config.write_text(json.dumps(doc))
    objects = k8s_objects("--config", str(config))
    objects += k8s_objects("--create-admin-secret")
    got = by_kind(objects)
    service = {p["port"]: p["targetPort"] for p in got["Service", "wirekit"]["spec"]["ports"]}
    assert service[runtime_port] == runtime_port
    token = got["Secret", "wirekit-admin"]["stringData"]["token"]
    with running_dispatcher(stage_dispatcher_pod(objects, tmp_path)) as (_proc, ready):
        added = {
            "models": {"m3": {"port": runtime_port, "handler": "tiny_model:words"}},
            "nodes": [{"id": "own", "endpoint": "127.0.0.1", "devices": ["CPU"],
                       "models": ["m3"], "quotas": [1], "ports": [free_port()]}],
        }  # fmt: skip
        request = urllib.request.Request(
            f"http://127.0.0.1:{ready['http']}/admin/models",
            data=json.dumps(added).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status in (200, 201)
        with socket.create_connection(("127.0.0.1", runtime_port), timeout=10):
            pass  # its MIP front door takes connections on the kept port
