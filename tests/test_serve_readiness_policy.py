"""The policy of ``/readyz`` (``health.ready``): ``all`` -- every model has a reachable
device, the default -- or ``any`` -- at least one has.  Against real ``wirekit serve``
processes serving two models, one (``up``) on a real MIP backend, the other (``down``)
placed on a port nothing listens on (as the README's ``models add ... --place`` does).

Under ``all`` the whole dispatcher is not ready and the reason names ``down``; under ``any``
it is ready and still lists that reason.  OIP's ``/v2/health/ready`` and gRPC
``ServerReady``, ``/stats`` and the ``wirekit_serve_ready`` gauge say what ``/readyz`` says;
a model's own readiness (``/readyz?model=``, OIP's REST and gRPC per-model readiness) is the
same under both.  The
live page shows the reasons; ``wirekit serve check`` shows the policy and refuses a bad one,
as ``wirekit serve`` does."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import Browser, require_chromium
from serve_support import TIMEOUT, BackendProcess, DispatcherProcess, deployment
from test_serve_page import http_get

from wirekit.oip.grpc import messages as pb

#: the reason ``/readyz`` gives for ``down`` (its device's label, then the probe's words)
DOWN_REASON = "model down: no reachable device (n1/1: unreachable: "


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_models(store: Path, up_port: int, **top: Any) -> dict[str, Any]:
    """``up`` on CPU 0 (its backend at ``up_port``), ``down`` on CPU 1 (nothing there)."""
    return deployment(
        store,
        {"up": {"timeout": 5}, "down": {"timeout": 5}},
        [
            {
                "id": "n1",
                "devices": ["CPU", "CPU"],
                "models": ["up", "down"],
                "quotas": [1, 0, 0, 1],
                "ports": [up_port, None, None, closed_port()],
            }
        ],
        **top,
    )


@pytest.fixture(scope="module")
def backend() -> Iterator[BackendProcess]:
    with BackendProcess("serve_handlers:tag_a") as up:
        yield up


@pytest.fixture(scope="module", params=["all", "any", None])
def dispatcher(request, backend, tmp_path_factory) -> Iterator[tuple[str, DispatcherProcess]]:
    """A dispatcher of :func:`two_models` under each policy (None: no ``health`` table,
    which is ``all``)."""
    policy = request.param
    directory = tmp_path_factory.mktemp(f"ready-{policy}")
    top = {} if policy is None else {"health": {"ready": policy}}
    doc = two_models(directory / "r.db", backend.port, **top)
    doc["listen"]["grpc_port"] = 0  # the OIP gRPC door: ServerReady, ModelReady
    with DispatcherProcess.of(doc, directory) as process:
        yield policy or "all", process


def grpc_ready(process: DispatcherProcess, method: str, request: Any) -> bool:
    """The ``ready`` of the OIP gRPC door's ``method`` (ServerReady, ModelReady)."""
    grpc = pytest.importorskip("grpc")
    answer = getattr(pb, f"{method}Response")
    with grpc.insecure_channel(f"127.0.0.1:{process.addresses['grpc']}") as channel:
        call = channel.unary_unary(
            f"/{pb.SERVICE}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=answer.FromString,
        )
        return bool(call(request, timeout=TIMEOUT).ready)


def get(process: DispatcherProcess, path: str) -> tuple[int, dict[str, Any]]:
    status, _headers, body = http_get(process.addresses["http"], path)
    return status, json.loads(body)


def settled(process: DispatcherProcess) -> tuple[int, dict[str, Any]]:
    """``/readyz`` once ``up``'s device has been probed reachable (the first probe runs
    before the ready line; bounded wait all the same)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        status, doc = get(process, "/readyz")
        if doc["models"]["up"]["ready"] or time.monotonic() > deadline:
            return status, doc
        time.sleep(0.1)


def test_whole_dispatcher_readiness_follows_the_policy(dispatcher):
    policy, process = dispatcher
    status, doc = settled(process)
    assert doc["policy"] == policy
    assert doc["models"]["up"] == {"ready": True, "devices": {"n1/0": "reachable"}}
    assert doc["models"]["down"]["ready"] is False
    assert doc["store"]["ok"] is True
    # the reasons name the model without a reachable device, under either policy
    assert len(doc["reasons"]) == 1 and doc["reasons"][0].startswith(DOWN_REASON)
    ready = policy == "any"
    assert (status, doc["ready"]) == ((200, True) if ready else (503, False))
    # OIP's server readiness says what /readyz says
    status, oip = get(process, "/v2/health/ready")
    if ready:
        assert (status, oip) == (200, {"ready": True})
    else:
        assert (status, oip["ready"], oip["reasons"]) == (503, False, doc["reasons"])
    # and its gRPC door's
    assert grpc_ready(process, "ServerReady", pb.ServerReadyRequest()) is ready
    # so does /stats (what the live page shows) and the gauge of /metrics
    _, stats = get(process, "/stats")
    assert (stats["ready"], stats["ready_reasons"], stats["ready_policy"]) == (
        ready,
        doc["reasons"],
        policy,
    )
    metrics = http_get(process.addresses["http"], "/metrics")[2].decode()
    assert f"\nwirekit_serve_ready {float(ready)}\n" in metrics


def test_per_model_readiness_does_not_depend_on_the_policy(dispatcher):
    _policy, process = dispatcher
    settled(process)
    status, up = get(process, "/readyz?model=up")
    assert (status, up["ready"], up["reasons"]) == (200, True, [])
    assert "policy" not in up and up["models"].keys() == {"up"}
    status, down = get(process, "/readyz?model=down")
    assert (status, down["ready"]) == (503, False)
    assert len(down["reasons"]) == 1 and down["reasons"][0].startswith(DOWN_REASON)
    assert "policy" not in down and down["models"].keys() == {"down"}
    # OIP's per-model readiness: the same truth
    assert get(process, "/v2/models/up/ready") == (200, {"name": "up", "ready": True})
    status, oip = get(process, "/v2/models/down/ready")
    assert (status, oip["ready"], oip["reasons"]) == (503, False, down["reasons"])
    assert grpc_ready(process, "ModelReady", pb.ModelReadyRequest(name="up")) is True
    assert grpc_ready(process, "ModelReady", pb.ModelReadyRequest(name="down")) is False


# ---- the live page --------------------------------------------------------------------------


def test_the_live_page_shows_the_reasons(dispatcher):
    policy, process = dispatcher
    if policy != "any":
        pytest.skip("one browser start is enough: the page under the 'any' policy")
    binary = require_chromium()
    settled(process)
    head, reasons, problems = asyncio.run(
        asyncio.wait_for(look_at_the_page(binary, process.http), timeout=TIMEOUT)
    )
    assert problems == []
    assert head == "/readyz (policy any): ready, though:"
    assert len(reasons) == 1 and reasons[0].startswith(DOWN_REASON)


async def look_at_the_page(binary: str, base: str) -> tuple[str, list[str], list[str]]:
    async with Browser(binary, width=1000) as tab:
        await tab.open(f"{base}/?poll=0.3")
        await tab.wait_for("!document.getElementById('readiness').hidden")
        head = await tab.evaluate("document.getElementById('readiness-head').textContent")
        reasons = await tab.evaluate(
            "[...document.querySelectorAll('#ready-reasons li')].map((li) => li.textContent)"
        )
        return head, reasons, tab.problems()


# ---- the config -----------------------------------------------------------------------------


def wirekit(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WIREKIT_ADMIN_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "wirekit", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
    )


def test_serve_check_shows_the_policy(tmp_path):
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps(two_models(tmp_path / "r.db", 9, health={"ready": "any"})))
    checked = wirekit("serve", "check", "--config", str(path))
    assert checked.returncode == 0, checked.stderr
    assert (
        "health.ready: any (/readyz is ready when at least one model has a reachable device)\n"
        in checked.stdout
    )
    path.write_text(json.dumps(two_models(tmp_path / "r.db", 9)))
    checked = wirekit("serve", "check", "--config", str(path))
    assert "health.ready: all (/readyz is ready when every model" in checked.stdout


@pytest.mark.parametrize(
    ("health", "problem"),
    [
        ({"ready": "some"}, "health.ready: must be one of all, any, got 'some'"),
        ({"ready": True}, "health.ready: must be one of all, any, got True"),
        ({"policy": "any"}, "health.policy: unknown key (allowed: ready)"),
        ("any", "health: expected a table/object, got a string"),
    ],
)
def test_a_bad_policy_is_refused_by_check_and_by_serve(tmp_path, health, problem):
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps(two_models(tmp_path / "r.db", 9, health=health)))
    checked = wirekit("serve", "check", "--config", str(path))
    assert (checked.returncode, checked.stdout) == (1, "")
    assert problem in checked.stderr
    served = wirekit("serve", "--config", str(path))
    assert served.returncode == 1
    assert problem in served.stderr
