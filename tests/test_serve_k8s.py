"""``wirekit serve k8s``: static models → Kubernetes manifests (issue 16, part K).

Every object is validated against the Kubernetes OpenAPI schemas that ``kubernetes-validate``
bundles (strict: an unknown field fails), through the real command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest

from wirekit.serve.config import ConfigError, load_config, parse_config
from wirekit.serve.control.k8s import K8sOptions, manifests

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "serve-deployment.json"
#: the oldest Kubernetes whose schema has ``resizePolicy`` (specs/k8s.md), and the newest known
K8S_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def wirekit(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "wirekit", *argv],
        capture_output=True, text=True, timeout=60, env=env, cwd=cwd,
    )  # fmt: skip


def validate_all(objects: list[dict]) -> None:
    for version in K8S_VERSIONS:
        for obj in objects:
            # raises kubernetes_validate.ValidationError naming the bad field
            kubernetes_validate.validate(obj, version, strict=True)


def by_kind(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def containers(obj: dict) -> dict[str, dict]:
    return {c["name"]: c for c in obj["spec"]["template"]["spec"]["containers"]}


def test_the_sample_deployment_as_valid_kubernetes_objects():
    done = wirekit("serve", "k8s", "--config", str(SAMPLE))
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert (listing["apiVersion"], listing["kind"]) == ("v1", "List")
    objects = listing["items"]
    validate_all(objects)
    got = by_kind(objects)
    assert sorted(got) == sorted(
        [
            ("ServiceAccount", "wirekit"),
            ("Role", "wirekit-actuator"),
            ("RoleBinding", "wirekit-actuator"),
            ("ConfigMap", "wirekit-config"),
            ("Service", "wirekit-node-n1"),
            ("StatefulSet", "wirekit-node-n1"),
            ("Service", "wirekit-node-n2"),
            ("StatefulSet", "wirekit-node-n2"),
            ("Deployment", "wirekit-dispatcher"),
            ("Service", "wirekit"),
        ]
    )
    n1 = got["StatefulSet", "wirekit-node-n1"]
    assert n1["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "n1"}
    c = containers(n1)
    # a container per (CPU, model) with a quota > 0, its share as its CPU, resizable in place
    assert sorted(c) == ["cpu0-m1", "cpu0-m2", "gpu1-m1", "gpu2-m2"]
    for name in ("cpu0-m1", "cpu0-m2"):
        assert c[name]["resources"] == {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}
        assert c[name]["resizePolicy"] == [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]
    # a container per GPU, for the model the GPU is given to
    assert c["gpu1-m1"]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert c["gpu2-m2"]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert c["cpu0-m2"]["args"] == [
        "mip", "serve", "--listen", "tcp://0.0.0.0:9102", "--handler", "tiny_model:sentiment",
    ]  # fmt: skip
    assert {"name": "WIREKIT_ROW", "value": "n1/2/m2"} in c["gpu2-m2"]["env"]
    n2 = containers(got["StatefulSet", "wirekit-node-n2"])
    assert n2["cpu0-m1"]["resources"]["limits"] == {"cpu": "1000m"}
    node_ports = [p["port"] for p in got["Service", "wirekit-node-n1"]["spec"]["ports"]]
    assert node_ports == [9101, 9102, 9111, 9122]
    assert got["Service", "wirekit-node-n1"]["spec"]["clusterIP"] == "None"
    # the dispatcher: its config from the ConfigMap, its front doors in its Service
    front = {p["name"]: p["port"] for p in got["Service", "wirekit"]["spec"]["ports"]}
    assert front == {"http": 8080, "mip-9001": 9001, "mip-9002": 9002}
    dispatcher = containers(got["Deployment", "wirekit-dispatcher"])["dispatcher"]
    assert dispatcher["args"][:3] == ["serve", "--config", "/etc/wirekit/deployment.json"]
    assert got["Deployment", "wirekit-dispatcher"]["spec"]["replicas"] == 1
    config_map = got["ConfigMap", "wirekit-config"]
    cluster = parse_config(json.loads(config_map["data"]["deployment.json"]))
    assert cluster.host == "0.0.0.0"
    assert {r.endpoint for r in cluster.rows} == {"wirekit-node-n1", "wirekit-node-n2"}
    # the same models, devices, quotas and ports as the file: only where they are changed
    sample = load_config(SAMPLE)
    assert [(r.key, r.quota, r.port) for r in cluster.rows] == [
        (r.key, r.quota, r.port) for r in sample.rows
    ]
    # the actuator may resize pods and patch the node StatefulSets, nothing more
    role = got["Role", "wirekit-actuator"]
    assert {r for rule in role["rules"] for r in rule["resources"]} == {
        "pods", "pods/resize", "statefulsets",
    }  # fmt: skip
    assert "delete" not in {v for rule in role["rules"] for v in rule["verbs"]}
    binding = got["RoleBinding", "wirekit-actuator"]
    assert binding["subjects"][0]["name"] == dispatcher_sa(got)


def dispatcher_sa(got: dict) -> str:
    return got["Deployment", "wirekit-dispatcher"]["spec"]["template"]["spec"]["serviceAccountName"]


GPU_CONFIG = {
    "listen": {"http_port": 8080, "clipper_rpc_port": 7000},
    "models": {
        "ResNet_50": {"port": 9001, "handler": "zoo.vision:resnet"},
        "bert": {"port": None, "backend": "clipper", "handler": "zoo.text:bert"},
    },
    "nodes": [
        {
            "id": "gpu-box.example.org",
            "endpoint": "10.0.0.7",
            "devices": ["CPU", "GPU", "GPU", "GPU"],
            "models": ["ResNet_50", "bert"],
            "quotas": [0.75, 0.25, 1, 0, 1, 0, 0, 1],
            "ports": [9101, "bert-cpu", 9111, None, 9121, None, None, "bert-gpu"],
        }
    ],
}


def test_a_gpu_node_into_a_directory(tmp_path):
    config = tmp_path / "gpu.json"
    config.write_text(json.dumps(GPU_CONFIG))
    out = tmp_path / "manifests"
    done = wirekit(
        "serve", "k8s", "--config", str(config), "-o", str(out),
        "--cpu-cores", "4", "--namespace", "models", "--image", "registry.local/zoo:7",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    files = sorted(out.iterdir())
    assert [f.name for f in files] == [
        "00-serviceaccount-wirekit.json",
        "01-role-wirekit-actuator.json",
        "02-rolebinding-wirekit-actuator.json",
        "03-configmap-wirekit-config.json",
        "04-service-wirekit-node-gpu-box-example-org.json",
        "05-statefulset-wirekit-node-gpu-box-example-org.json",
        "06-deployment-wirekit-dispatcher.json",
        "07-service-wirekit.json",
    ]
    assert done.stdout.splitlines() == [str(f) for f in files]
    objects = [json.loads(f.read_text()) for f in files]
    validate_all(objects)
    assert {o["metadata"]["namespace"] for o in objects} == {"models"}
    got = by_kind(objects)
    node = got["StatefulSet", "wirekit-node-gpu-box-example-org"]
    assert node["spec"]["template"]["spec"]["nodeSelector"] == {
        "kubernetes.io/hostname": "gpu-box.example.org"
    }
    c = containers(node)
    assert sorted(c) == ["cpu0-bert", "cpu0-resnet-50", "gpu1-resnet-50", "gpu2-resnet-50",
                         "gpu3-bert"]  # fmt: skip
    assert c["cpu0-resnet-50"]["resources"]["limits"] == {"cpu": "3000m"}  # 0.75 × 4 cores
    assert c["cpu0-bert"]["resources"]["limits"] == {"cpu": "1000m"}
    gpus = [n for n in c if c[n]["resources"].get("limits", {}).get("nvidia.com/gpu") == "1"]
    assert sorted(gpus) == ["gpu1-resnet-50", "gpu2-resnet-50", "gpu3-bert"]
    assert {x["image"] for x in c.values()} == {"registry.local/zoo:7"}
    # Clipper containers dial the dispatcher's Service on the Clipper RPC port
    assert c["gpu3-bert"]["args"] == [
        "clipper", "container", "--handler", "zoo.text:bert", "--name", "bert-gpu",
        "--address", "tcp://wirekit:7000", "--generation", "v3",
    ]  # fmt: skip
    assert "ports" not in c["gpu3-bert"]
    front = {p["name"]: p["port"] for p in got["Service", "wirekit"]["spec"]["ports"]}
    assert front == {"http": 8080, "mip-9001": 9001, "clipper-rpc": 7000}


def _with(path: list, value) -> dict:
    doc = json.loads(json.dumps(GPU_CONFIG))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_with(["listen", "http_port"], 0), "listen.http_port: Kubernetes needs a fixed port"),
        (
            _with(["models", "ResNet_50", "port"], 0),
            "models.ResNet_50.port: Kubernetes needs a fixed port",
        ),
        (
            _with(["listen", "clipper_rpc_port"], 0),
            "listen.clipper_rpc_port: Clipper containers connect",
        ),
        (
            _with(["nodes", 0, "id"], "node one"),
            "nodes[0].id: node id 'node one' must be the node's kubernetes.io/hostname label",
        ),
        (
            _with(["nodes", 0, "ports", 2], 9101),
            "nodes[0].ports: port 9101 is both n/0/ResNet_50 and n/1/ResNet_50",
        ),
        (_with(["nodes", 0, "quotas", 0], 0.9), "nodes[0].quotas: device 0 (CPU) is given 1.15"),
    ],
)
def test_a_config_kubernetes_cannot_take_is_refused_naming_the_value(tmp_path, doc, message):
    if doc["nodes"][0]["id"] == GPU_CONFIG["nodes"][0]["id"]:
        doc["nodes"][0]["id"] = "n"
    config = tmp_path / "bad.json"
    config.write_text(json.dumps(doc))
    done = wirekit("serve", "k8s", "--config", str(config))
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith(f"wirekit serve k8s: {config}: ")
    assert message in done.stderr
    assert done.stderr.count("\n") == 1  # one line, no traceback


def test_unreadable_config_and_bad_flags(tmp_path):
    missing = tmp_path / "none.json"
    done = wirekit("serve", "k8s", "--config", str(missing))
    assert (done.returncode, done.stdout) == (2, "")  # a file that is not there: usage
    assert done.stderr.startswith(f"wirekit serve k8s: {missing}: config: cannot read")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    done = wirekit("serve", "k8s", "--config", str(bad_json))
    assert done.returncode == 1 and "not valid JSON" in done.stderr
    done = wirekit("serve", "k8s", "--config", str(SAMPLE), "--name", "Not_A_Name")
    assert done.returncode == 2
    assert "--name: name 'Not_A_Name' is not a Kubernetes name" in done.stderr
    done = wirekit("serve", "k8s", "--config", str(SAMPLE), "--cpu-cores", "0")
    assert done.returncode == 2 and "--cpu-cores: must be > 0" in done.stderr
    done = wirekit("serve", "k8s")
    assert done.returncode == 2 and "give --config FILE" in done.stderr


def test_toml_sample_gives_the_same_pods_as_the_json_one():
    from wirekit.serve.config import read_document

    json_objects = manifests(read_document(SAMPLE))
    toml_objects = manifests(read_document(SAMPLE.with_suffix(".toml")))

    def pods(objects):
        return [o for o in objects if o["kind"] in ("StatefulSet", "Deployment", "Service")]

    assert pods(json_objects) == pods(toml_objects)


def test_model_names_that_collide_as_kubernetes_names():
    doc = {
        "listen": {"http_port": 8080},
        "models": {"a_b": {"port": 9001}, "a.b": {"port": 9002}},
        "nodes": [{"id": "n", "devices": ["CPU"], "models": ["a_b", "a.b"],
                   "quotas": [0.5, 0.5], "ports": [9101, 9102]}],
    }  # fmt: skip
    with pytest.raises(ConfigError, match="both become 'cpu0-a-b'"):
        manifests(doc, K8sOptions())


def test_a_resize_patch_names_the_container_the_manifests_made():
    from wirekit.serve.config import read_document
    from wirekit.serve.control.k8s import cpu_quantity, node_name, resize_patch

    opts = K8sOptions(cpu_cores=2)
    got = by_kind(manifests(read_document(SAMPLE), opts))
    cpu_rows = [r for r in load_config(SAMPLE).rows if r.quota > 0 and r.device_type == "CPU"]
    assert len(cpu_rows) == 3
    for row in cpu_rows:
        (change,) = resize_patch(row, 0.25, opts)["spec"]["containers"]
        assert change["resources"] == {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}
        node = got["StatefulSet", node_name(row.node, opts)]
        container = containers(node)[change["name"]]
        assert container["resources"]["limits"]["cpu"] == cpu_quantity(row.quota, opts)
        container["resources"] = change["resources"]  # as the resize leaves it
        validate_all([node])
    assert cpu_quantity(0) == "1m"  # a share of 0: the container stays, throttled
