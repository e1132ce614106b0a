"""``wirekit serve k8s``: static models → Kubernetes manifests (issue 16, part K).

Every object is validated against the Kubernetes OpenAPI schemas that ``kubernetes-validate``
bundles (strict: an unknown field fails), through the real command line.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from k8s_support import (
    ROOT,
    SAMPLE,
    by_kind,
    changed,
    container_env,
    running_dispatcher,
    stage_dispatcher_pod,
    validate_all,
    wirekit,
)
from support.ports import free_port

from wirekit.serve.config import ConfigError, load_config, parse_config
from wirekit.serve.control.k8s import CONFIG_FILE, DATA_DIR, RUN_AS, K8sOptions, manifests


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
            ("PersistentVolumeClaim", "wirekit-data"),
            ("Service", "wirekit-node-n1"),
            ("StatefulSet", "wirekit-node-n1"),
            ("Service", "wirekit-node-n2"),
            ("StatefulSet", "wirekit-node-n2"),
            ("Deployment", "wirekit-dispatcher"),
            ("Service", "wirekit"),
        ]
    )
    n1 = got["StatefulSet", "wirekit-node-n1"]
    assert "nodeSelector" not in n1["spec"]["template"]["spec"]  # any node (issue 41)
    c = containers(n1)
    # a container per (CPU, model) with a quota > 0, its share as its CPU, resizable in place
    assert sorted(c) == ["cpu0-m1", "cpu0-m2", "gpu1-m1", "gpu2-m2"]
    for name in ("cpu0-m1", "cpu0-m2"):
        assert c[name]["resources"]["requests"]["cpu"] == "500m"
        assert c[name]["resources"]["limits"]["cpu"] == "500m"
        assert c[name]["resizePolicy"] == [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]
    # a container per GPU, for the model the GPU is given to
    assert c["gpu1-m1"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["gpu2-m2"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["cpu0-m2"]["args"] == [
        "mip", "serve", "--listen", "tcp://0.0.0.0:9102", "--handler", "tiny_model:sentiment",
    ]  # fmt: skip
    assert {"name": "WIREKIT_ROW", "value": "n1/2/m2"} in c["gpu2-m2"]["env"]
    n2 = containers(got["StatefulSet", "wirekit-node-n2"])
    assert n2["cpu0-m1"]["resources"]["limits"]["cpu"] == "1000m"
    node_ports = [p["port"] for p in got["Service", "wirekit-node-n1"]["spec"]["ports"]]
    assert node_ports == [9101, 9102, 9111, 9122]
    assert got["Service", "wirekit-node-n1"]["spec"]["clusterIP"] == "None"
    # the dispatcher: its config from the ConfigMap, its front doors in its Service
    front = {p["name"]: p["port"] for p in got["Service", "wirekit"]["spec"]["ports"]}
    front = {n: p for n, p in front.items() if not 9900 <= p <= 9915}  # kept for run time
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
        "04-persistentvolumeclaim-wirekit-data.json",
        "05-service-wirekit-node-gpu-box-example-org.json",
        "06-statefulset-wirekit-node-gpu-box-example-org.json",
        "07-deployment-wirekit-dispatcher.json",
        "08-service-wirekit.json",
    ]
    assert done.stdout.splitlines() == [str(f) for f in files]
    objects = [json.loads(f.read_text()) for f in files]
    validate_all(objects)
    assert {o["metadata"]["namespace"] for o in objects} == {"models"}
    got = by_kind(objects)
    node = got["StatefulSet", "wirekit-node-gpu-box-example-org"]
    assert "nodeSelector" not in node["spec"]["template"]["spec"]  # any node (issue 41)
    c = containers(node)
    assert sorted(c) == ["cpu0-bert", "cpu0-resnet-50", "gpu1-resnet-50", "gpu2-resnet-50",
                         "gpu3-bert"]  # fmt: skip
    assert c["cpu0-resnet-50"]["resources"]["limits"]["cpu"] == "3000m"  # 0.75 × 4 cores
    assert c["cpu0-bert"]["resources"]["limits"]["cpu"] == "1000m"
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
    front = {n: p for n, p in front.items() if not 9900 <= p <= 9915}  # kept for run time
    assert front == {"http": 8080, "mip-9001": 9001, "clipper-rpc": 7000}


def _with(path: list, value) -> dict:
    return changed(GPU_CONFIG, path, value)


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


# --- the deployment starts as generated (issue 29) ------------------------------------------


def http_get(url: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def test_the_generated_dispatcher_starts_as_generated(tmp_path):
    # Before: the ConfigMap listened on 0.0.0.0 with no admin token and no Secret, so the
    # dispatcher exited 1 at every start (a crash loop); its store was on an emptyDir.
    # Here the pod is played locally: the ConfigMap's file at the container's mount path,
    # the container's environment with the Secret's value, its working directory (the
    # data volume), its command and arguments.
    doc = json.loads(SAMPLE.read_text())
    doc["listen"]["http_port"] = free_port("")  # fixed ports, free on this shared machine
    for model in doc["models"].values():
        model["port"] = free_port("")
    config = tmp_path / "deployment.json"
    config.write_text(json.dumps(doc))
    done = wirekit("serve", "k8s", "--config", str(config))
    assert done.returncode == 0, done.stderr
    objects = json.loads(done.stdout)["items"]
    # the Secret is made once, apart (issue 41: not a new token at each run)
    secret = wirekit("serve", "k8s", "--create-admin-secret")
    assert secret.returncode == 0, secret.stderr
    objects += json.loads(secret.stdout)["items"]
    validate_all(objects)
    got = by_kind(objects)
    deployment = got["Deployment", "wirekit-dispatcher"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # the admin token from a Secret of the manifests, never in the ConfigMap
    secret = got["Secret", "wirekit-admin"]
    token = secret["stringData"]["token"]
    assert len(token) >= 32
    config_text = got["ConfigMap", "wirekit-config"]["data"]["deployment.json"]
    assert token not in config_text
    env = container_env(container, objects)
    assert env == {"WIREKIT_ADMIN_TOKEN": token}
    # the store on a PersistentVolumeClaim mounted where the dispatcher works
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    claim = volumes[mounts[container["workingDir"]]]["persistentVolumeClaim"]["claimName"]
    assert got["PersistentVolumeClaim", claim]["spec"]["accessModes"] == ["ReadWriteOnce"]
    store_path = json.loads(config_text)["store"]["path"]
    assert store_path == f"{container['workingDir']}/requests.db"  # on the data volume
    # non-root, as the image's user (the Dockerfile's USER)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == dockerfile_user()
    # play it: the ConfigMap at its mount path, the data volume as working directory
    pod_here = stage_dispatcher_pod(objects, tmp_path)
    assert pod_here.config.name == CONFIG_FILE
    check = subprocess.run(
        [sys.executable, "-m", "wirekit", "serve", "check", "--config", str(pod_here.config)],
        capture_output=True, text=True, timeout=60, env=pod_here.env, cwd=pod_here.data,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    with running_dispatcher(pod_here) as (proc, ready):
        http = f"http://127.0.0.1:{ready['http']}"
        # the probes the manifests give it answer (the backends' Services do not resolve
        # here: not ready, but alive)
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
        assert http_get(http + container["livenessProbe"]["httpGet"]["path"])[0] == 200
        status, body = http_get(http + container["readinessProbe"]["httpGet"]["path"])
        assert status in (200, 503) and "ready" in json.loads(body)
        # the admin API takes the Secret's token, and only it
        assert http_get(f"{http}/admin/models", token)[0] == 200
        assert http_get(f"{http}/admin/models")[0] == 401
        assert http_get(f"{http}/admin/models", "not-the-token")[0] == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert (pod_here.data / "requests.db").is_file()  # on the volume


def test_the_same_config_without_the_secrets_value_is_refused_by_check(tmp_path):
    # `serve check` says what `serve` would refuse at its start (it said nothing before)
    doc = json.loads(SAMPLE.read_text())
    doc["listen"]["host"] = "0.0.0.0"
    config = tmp_path / "deployment.json"
    config.write_text(json.dumps(doc))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WIREKIT_ADMIN")}
    done = subprocess.run(
        [sys.executable, "-m", "wirekit", "serve", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env=dict(env, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"wirekit serve check: {config}: admin.token: the HTTP front door"
    ), done.stderr
    assert done.stderr.count("\n") == 1


def test_an_existing_secret_and_the_volume_size_by_flag():
    opts = K8sOptions(admin_secret="zoo-admin-token", store_size="20Gi")
    from wirekit.serve.config import read_document

    doc = read_document(SAMPLE)
    doc["admin"] = {"token": "from-the-config"}
    objects = manifests(doc, opts)
    validate_all(objects)
    got = by_kind(objects)
    assert not [o for o in objects if o["kind"] == "Secret"]  # the cluster's own is used
    (container,) = got["Deployment", "wirekit-dispatcher"]["spec"]["template"]["spec"]["containers"]
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == {
        "name": "zoo-admin-token", "key": "token",
    }  # fmt: skip
    claim = got["PersistentVolumeClaim", "wirekit-data"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    # a token written in the config goes to no ConfigMap
    assert "from-the-config" not in json.dumps(objects)
    # without the flag, the config's token is the generated Secret's
    got = by_kind(manifests(doc))
    assert got["Secret", "wirekit-admin"]["stringData"]["token"] == "from-the-config"


# --- the image the manifests name: the repository's Dockerfile -------------------------------
# scripts/build-image.sh builds it and runs the manifests' pods in it (CI runs it: .ci/run);
# here the Dockerfile is read: what it copies (every path exists and is not excluded by
# .dockerignore), that it installs from a wheelhouse with no compiler and checks the twins
# load, and its non-root user.

DOCKERFILE = ROOT / "Dockerfile"


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    logical, pending = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "a continued line at the end of the Dockerfile"
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in logical]


def dockerfile_user() -> int:
    (user,) = [args for ins, args in dockerfile_instructions() if ins == "USER"]
    return int(user.split(":")[0])


def dockerignored(path: str) -> bool:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return any(fnmatch.fnmatch(path, p.removeprefix("**/")) or fnmatch.fnmatch(path, p)
               or path == p or path.startswith(p + "/") for p in patterns)  # fmt: skip


def test_the_dockerfile_builds_the_image_the_manifests_name():
    instructions = dockerfile_instructions()
    # one stage, on a base given as a build argument (scripts/build-image.sh makes one from
    # Debian's packages; a registry's python:3.11-slim is the default)
    stages = [args.split() for ins, args in instructions if ins == "FROM"]
    assert stages == [["${BASE}"]]
    assert instructions[0][0] == "ARG" and instructions[0][1].startswith("BASE=")
    # what is copied from the build context exists in the checkout (the wheelhouse is made
    # by the build), and is not excluded from it
    copies = [a.split() for i, a in instructions if i == "COPY"]
    assert ["wheelhouse/", "/tmp/wheelhouse/"] in copies
    for *sources, _ in copies:
        for source in sources:
            if source != "wheelhouse/":
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert not dockerignored(source), f"COPY {source}: excluded by .dockerignore"
    # installed from the wheelhouse alone, no compiler; the image refused if the compiled
    # twins do not load
    runs = " ".join(a for i, a in instructions if i == "RUN")
    assert "--no-index --find-links /tmp/wheelhouse" in runs
    assert "gcc" not in runs and "apt-get" not in runs
    assert "WIREKIT_REQUIRE_FAST=1" in runs and "IMPLEMENTATION" in runs
    # wirekit serve's extra, and the sample's handler module where Python finds it
    assert "wirekit[serve" in runs
    env = " ".join(a for i, a in instructions if i == "ENV")
    model_dirs = re.search(r"PYTHONPATH=(\S+)", env).group(1).split(":")
    assert ["samples/tiny_model.py", model_dirs[0] + "/"] in copies
    # a non-root user, the one the manifests run as; the dispatcher's working directory
    assert dockerfile_user() != 0
    assert dockerfile_user() == RUN_AS
    (workdir,) = [a for i, a in instructions if i == "WORKDIR"]
    assert workdir == DATA_DIR
    # the tag the manifests name by default is the version this Dockerfile builds
    assert K8sOptions().image == f"wirekit:{wirekit_version()}"
    assert f"-t {K8sOptions().image} ." in DOCKERFILE.read_text()


def wirekit_version() -> str:
    import wirekit

    return wirekit.__version__
