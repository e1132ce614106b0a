"""``wirekit serve check`` refuses what ``wirekit serve`` refuses (issue 35, item 6).

Both commands run the one validator (:func:`wirekit.serve.config.validate`): a controller
policy or an actuator plugin that cannot be loaded, or an HTTP bind beyond loopback with no
admin token, is refused by the check with the message the dispatcher gives at its start.
Through the real command line, as an operator runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TIMEOUT = 60


def config(tmp_path: Path, **top: Any) -> Path:
    """A one-model config file (``top`` keys added), which parses."""
    doc: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "http_port": 0},
        "store": {"path": str(tmp_path / "requests.db")},
        "models": {"m": {"port": 0}},
        "nodes": [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [9]}],
        **top,
    }
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps(doc))
    return path


def wirekit(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WIREKIT_ADMIN_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "wirekit", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
    )


REFUSED = {
    "policy": (
        {"controller": {"policy": "no_such_policy_module:P"}},
        "controller.policy: 'no_such_policy_module:P': cannot import",
    ),
    "actuator": (
        {"controller": {"actuator": {"kind": "no_such_actuator_module:A"}}},
        "controller.actuator.kind: 'no_such_actuator_module:A': cannot import",
    ),
    "actuator without its methods": (
        {"controller": {"actuator": {"kind": "collections:OrderedDict"}}},
        "OrderedDict has no set_cpu_share()",
    ),
    "no admin token beyond loopback": (
        {"listen": {"host": "0.0.0.0", "http_port": 0}},
        "admin.token: the HTTP front door listens on 0.0.0.0, beyond loopback",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_serve_check_refuses_what_serve_refuses(tmp_path: Path, case: str) -> None:
    top, expected = REFUSED[case]
    path = config(tmp_path, **top)
    checked = wirekit("serve", "check", "--config", str(path))
    served = wirekit("serve", "--config", str(path))
    assert served.returncode == 1, served.stderr
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert checked.stdout == ""
    assert expected in served.stderr
    assert expected in checked.stderr
    # one message, the command's name aside
    served_line = served.stderr.strip().splitlines()[-1]
    checked_line = checked.stderr.strip().splitlines()[-1]
    assert served_line.startswith(f"wirekit serve: {path}: ")
    assert checked_line == served_line.replace("wirekit serve:", "wirekit serve check:", 1)


def test_serve_check_accepts_a_loadable_controller(tmp_path: Path) -> None:
    path = config(
        tmp_path,
        controller={"actuator": {"kind": "command", "argv": ["true", "{model}", "{share}"]}},
    )
    checked = wirekit("serve", "check", "--config", str(path))
    assert checked.returncode == 0, checked.stderr
    assert "n/0/m" in checked.stdout


def test_check_probe_leaves_a_kubemo_server_alone(tmp_path: Path) -> None:
    """``serve check --probe`` probes as the dispatcher does (one probe function): a KubeMo
    server, which stops serving when a connection closes without a request, is not probed."""
    import socket

    with (
        socket.create_server(("127.0.0.1", 0)) as kubemo,
        socket.create_server(("127.0.0.1", 0)) as mip,
    ):
        kubemo.settimeout(0.5)
        doc = {
            "store": {"path": str(tmp_path / "requests.db")},
            "models": {"k": {"backend": "kubemo"}, "m": {}},
            "nodes": [
                {
                    "id": "n",
                    "devices": ["CPU"],
                    "models": ["k", "m"],
                    "quotas": [0.5, 0.5],
                    "ports": [kubemo.getsockname()[1], mip.getsockname()[1]],
                }
            ],
        }
        path = tmp_path / "deployment.json"
        path.write_text(json.dumps(doc))
        checked = wirekit("serve", "check", "--config", str(path), "--probe")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "probe n/0/k: not probed (kubemo)" in checked.stdout
        assert "probe n/0/m: reachable" in checked.stdout
        with pytest.raises(TimeoutError):
            kubemo.accept()


def test_serve_check_shows_a_model_servers_grpc_port() -> None:
    """The MLServer sample: ``iris-grpc`` is served over MLServer's gRPC port and asked over
    its REST port; ``serve check`` shows both."""
    sample = Path(__file__).resolve().parent.parent / "samples" / "mlserver-deployment.json"
    checked = wirekit("serve", "check", "--config", str(sample))
    assert checked.returncode == 0, checked.stderr
    lines = checked.stdout.splitlines()
    iris = "mlserver/0/iris CPU quota 0.5 P=1.000 oip 127.0.0.1:8090"
    assert any(" ".join(line.split()) == iris for line in lines), checked.stdout
    assert any(line.endswith("oip 127.0.0.1:8090 (gRPC 8091)") for line in lines), checked.stdout
