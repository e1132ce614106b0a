"""Issue 37, end to end: two real MLServer 1.7.1 processes (``tests/oip_servers.py``: their
own pinned virtualenv, from PyPI) behind one real ``wirekit serve`` process, as two devices of
backend kind ``oip``.

What the other issue-37 tests do not already cover, all through the real processes:

* the quota split over the two servers (0.7/0.3) follows the quotas (chi-square, as for MIP
  backends), counted from the store and from ``/metrics``;
* a MIP client sending OIP items gets what MLServer answers directly (iris and echo), and
  so does a client of the OIP REST (JSON), OIP gRPC and TF Serving doors (echo: iris
  through those doors, and the binary extension, are test_serve_oip_backends_mlserver.py's);
* ``wirekit serve models add`` (the CLI) of a model with ``load: true`` on both servers:
  loaded on each, then served by both; ``models remove`` while requests are in flight:
  drained (each answered), then unloaded from each; a model both servers fail to load
  (``broken``): exit non-zero, the error per device with MLServer's reason, no route;
* one server killed with -9 while requests are in flight on it (the ``slow`` model: each
  answer takes 0.3 s): every request answered, those in flight resubmitted to the other
  server, each recorded once to its end in the store (``ok``, attempts > 1 for the
  resubmitted) and counted once in ``/metrics``.

The tests run in file order and share the servers (module-scoped: a server start costs
seconds); the kill comes last.
"""

from __future__ import annotations

import http.client
import io
import json
import math
import os
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from oip_fixtures import mlserver, mlserver_b  # noqa: F401
from oip_servers import BROKEN_MESSAGE, IRIS_CLASSES, IRIS_ROWS, Server
from serve_support import TIMEOUT, DispatcherProcess, deployment
from support.rows import select

from wirekit import mip, oip
from wirekit.cli import main as wirekit_main
from wirekit.mip.client import Client
from wirekit.oip.grpc import messages as pb
from wirekit.oip.grpc.convert import request_to_grpc, response_from_grpc

pytestmark = pytest.mark.skipif(
    os.environ.get("WIREKIT_PURE") == "1",
    reason="real model servers' processes: the dispatcher's path to them has no compiled"
    " twin, the pure run has the same code (the doors' OIP twins are tested on both runs"
    " by test_serve_oip_rest.py and test_serve_oip_grpc.py)",
)

TOKEN = "e2e-admin-token"
NODE = "n"
#: the echo model's quotas on device 0 (the first MLServer) and device 1 (the second)
SPLIT = {f"{NODE}/0/echo": 0.7, f"{NODE}/1/echo": 0.3}
ENDED = ("ok", "error", "failed", "lost", "abandoned")
#: the series of ``/metrics`` the tests read
SERIES = (
    "wirekit_serve_requests_total",
    "wirekit_serve_resubmissions_total",
    "wirekit_serve_in_flight",
)


@dataclass
class Stage:
    """The two MLServers and the ``wirekit serve`` in front of them."""

    a: Server  #: device 0's server
    b: Server  #: device 1's server
    front: DispatcherProcess
    store: Path

    @property
    def url(self) -> str:
        return self.front.http

    def post(self, path: str, doc: Any, timeout: float = 60.0) -> tuple[int, Any]:
        """``POST path`` of the front's HTTP door with a JSON body: (status, JSON answer)."""
        conn = http.client.HTTPConnection(
            "127.0.0.1", self.front.addresses["http"], timeout=timeout
        )
        try:
            conn.request("POST", path, json.dumps(doc), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(body)
        except ValueError:
            return resp.status, body.decode(errors="replace")

    def infer(self, model: str, doc: dict[str, Any]) -> tuple[int, Any]:
        return self.post(f"/v2/models/{model}/infer", doc)

    def metrics(self) -> dict[tuple[str, str], float]:
        """``/metrics``' samples of :data:`SERIES`: (series, its labels text) -> value."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=TIMEOUT) as answer:
            text = answer.read().decode()
        samples = {}
        for line in text.splitlines():
            for name in SERIES:
                if line.startswith(name + "{"):
                    labels, value = line[len(name) :].rsplit(" ", 1)
                    samples[(name, labels)] = float(value)
        return samples

    def rows(self, model: str, count: int) -> list[tuple[str, str, str | None, int]]:
        """``(id, status, device, attempts)`` of every row of ``model`` in the store, once
        ``count`` of them have ended (bounded wait: the store writes a little after the
        answer)."""
        query = "SELECT id, status, device, attempts FROM requests WHERE model = ?"
        deadline = time.monotonic() + TIMEOUT
        while True:
            rows = [tuple(r) for r in select(self.store, query, (model,))]
            if sum(r[1] in ENDED for r in rows) >= count or time.monotonic() > deadline:
                return rows  # type: ignore[return-value]
            time.sleep(0.05)


def front_doc(directory: Path, a: Server, b: Server) -> dict[str, Any]:
    """``echo`` (quotas 0.7/0.3) and ``iris`` (0.3/0.3) on devices 0 and 1 (the two
    servers), REST; devices 2 and 3 (the same two servers) left for the models the tests
    add; the admin
    API with :data:`TOKEN`; no cache (every request reaches a server); a store flushed
    often."""
    models = {name: {"backend": "oip", "timeout": 30, "attempts": 3} for name in ("echo", "iris")}
    node = {
        "id": NODE,
        "endpoint": "127.0.0.1",
        "devices": ["CPU"] * 4,
        "models": list(models),
        "quotas": [0.7, 0.3, 0.3, 0.3] + [0] * 4,
        "ports": [a.ports["http"]] * 2 + [b.ports["http"]] * 2 + [None] * 4,
    }
    store = {"path": str(directory / "front.db"), "flush_interval": 0.01}
    doc = deployment(directory / "front.db", models, [node], cache={"max_entries": 0}, store=store)
    doc["admin"] = {"token": TOKEN}
    doc["listen"]["grpc_port"] = 0
    return doc


@pytest.fixture(scope="module")
def stage(
    mlserver: Server,  # noqa: F811
    mlserver_b: Server,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    directory = tmp_path_factory.mktemp("oip-e2e")
    with DispatcherProcess.of(front_doc(directory, mlserver, mlserver_b), directory) as front:
        yield Stage(mlserver, mlserver_b, front, directory / "front.db")


def models_cli(stage: Stage, *argv: str) -> tuple[int, str, str]:
    """``wirekit serve models ARGV --url FRONT --token T`` (the CLI's own entry point):
    (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    command = [
        "serve",
        "models",
        argv[0],
        "--url",
        stage.url,
        "--token",
        TOKEN,
        *argv[1:],
        *(["--json"] if argv[0] != "list" else []),
    ]
    status = wirekit_main(command, out, err)
    return status, out.getvalue(), err.getvalue()


def add(stage: Stage, tmp_path: Path, name: str) -> tuple[int, str, str]:
    """``models add`` of ``name`` (the servers' model of that name) with ``load: true`` on
    devices 2 (the first server) and 3 (the second), half each."""
    placements = [
        {"node": NODE, "device": device, "quota": 0.5, "port": server.ports["http"]}
        for device, server in ((2, stage.a), (3, stage.b))
    ]
    doc = {
        "name": name,
        "model": {"backend": "oip", "load": True, "load_timeout": 60, "timeout": 30},
        "placements": placements,
    }
    path = tmp_path / f"add-{name}.json"
    path.write_text(json.dumps(doc))
    return models_cli(stage, "add", str(path))


def echo_doc(k: int) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1, 2], "data": [k, -k]}]}


def echoed(answer: Any) -> list[int]:
    (out,) = answer["outputs"]
    return (
        [v for row in out["data"] for v in row]
        if out["data"] and isinstance(out["data"][0], list)
        else out["data"]
    )


def chi_square_p(counts: Counter, shares: dict[str, float]) -> float:
    """The p-value of ``counts`` under the split ``shares`` (two categories: one degree of
    freedom, P(X > x) = erfc(sqrt(x / 2)))."""
    n = sum(counts.values())
    stat = sum((counts[k] - n * p) ** 2 / (n * p) for k, p in shares.items())
    return math.erfc(math.sqrt(stat / 2))


def many(stage: Stage, model: str, keys: range, workers: int) -> list[tuple[int, Any]]:
    """``len(keys)`` echo requests to ``model``'s OIP REST door, ``workers`` at a time."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda k: stage.infer(model, echo_doc(k)), keys))


def wait_in_flight(stage: Stage, model: str, count: int, device: str | None = None) -> float:
    """Wait (bounded) until wirekit has ``count`` requests of ``model`` in flight (on
    ``device``, a ``node/index`` label, or on all its devices); how many it had."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        held = sum(
            value
            for (name, labels), value in stage.metrics().items()
            if name == "wirekit_serve_in_flight"
            and f'model="{model}"' in labels
            and (device is None or f'device="{device}"' in labels)
        )
        if held >= count or time.monotonic() > deadline:
            return held
        time.sleep(0.02)


def requests_total(samples: dict[tuple[str, str], float], model: str) -> Counter:
    """``wirekit_serve_requests_total`` of ``model``: (device, state) -> count."""
    out: Counter = Counter()
    for (name, labels), value in samples.items():
        if name == "wirekit_serve_requests_total" and f'model="{model}"' in labels:
            fields = dict(part.split("=", 1) for part in labels.strip("{}").split(","))
            device = f"{fields['device'].strip(chr(34))}/{model}"  # the label: node/index
            out[(device, fields["state"].strip('"'))] += int(value)
    return out


# --- the quota split ----------------------------------------------------------------------------


def test_the_quota_split_over_two_servers_follows_the_quotas(stage: Stage):
    n = 500
    answers = many(stage, "echo", range(n), 8)
    assert [status for status, _ in answers] == [200] * n, answers[:3]
    assert [echoed(doc) for _, doc in answers] == [[k, -k] for k in range(n)]
    rows = stage.rows("echo", n)
    assert len(rows) == n and {r[1] for r in rows} == {"ok"}
    assert {r[3] for r in rows} == {1}  # no server failed: no resubmission
    counts = Counter(r[2] for r in rows)
    assert chi_square_p(counts, SPLIT) > 1e-4, counts
    # the test has teeth: the same counts are far off an even split (by 4.7 sigmas at least
    # but once in a million runs)
    assert chi_square_p(counts, dict.fromkeys(SPLIT, 0.5)) < 1e-3, counts
    metrics = requests_total(stage.metrics(), "echo")
    assert {device: v for (device, state), v in metrics.items() if state == "ok"} == counts
    assert sum(metrics.values()) == n


# --- a MIP client sending OIP items ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "inputs"),
    [
        ("iris", [{"name": "x", "datatype": "FP64", "shape": [4, 4], "data": IRIS_ROWS}]),
        ("echo", [{"name": "t", "datatype": "FP32", "shape": [2, 2], "data": [1.5, -2, 3, 0.25]}]),
    ],
)
def test_a_mip_client_with_oip_items_gets_mlserver_s_answer(stage: Stage, model, inputs):
    direct = stage.a.infer(model, inputs)
    assert direct.status == 200, direct.body
    tensors = [
        oip.tensor_from_json(i["name"], i["datatype"], i["shape"], i["data"]) for i in inputs
    ]
    wire = oip.request_to_mip(oip.InferRequest(tensors))
    with Client(f"tcp://127.0.0.1:{stage.front.addresses['mip'][model]}", timeout=TIMEOUT) as c:
        reply = c.request(mip.decode(wire))
    outputs, _parameters = oip.response_from_mip(reply)
    got = [(t.name, t.datatype, list(t.shape), oip.tensor_to_json_data(t)) for t in outputs]
    expected = [
        (o["name"], o["datatype"], o["shape"], _flat(o["data"])) for o in direct.json()["outputs"]
    ]
    assert got == expected
    if model == "iris":
        assert got[0][3] == IRIS_CLASSES


def _flat(data: list[Any]) -> list[Any]:
    return [v for x in data for v in (_flat(x) if isinstance(x, list) else [x])]


# --- echo through the other doors (iris is test_serve_oip_backends_mlserver.py's) ----------------

ECHO_INPUTS = [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1.5, -2, 3, 0.25]}]


def grpc_infer(stage: Stage, model: str, inputs: list[dict[str, Any]]) -> list[oip.Tensor]:
    """The outputs of ``ModelInfer`` through the front's OIP gRPC door."""
    tensors = [
        oip.tensor_from_json(i["name"], i["datatype"], i["shape"], i["data"]) for i in inputs
    ]
    request = request_to_grpc(pb.ModelInferRequest, model, oip.InferRequest(tensors))
    with grpc.insecure_channel(f"127.0.0.1:{stage.front.addresses['grpc']}") as channel:
        call = channel.unary_unary(
            f"/{pb.SERVICE}/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        outputs, _parameters = response_from_grpc(call(request, timeout=TIMEOUT))
    return outputs


@pytest.mark.parametrize("door", ["oip-rest-json", "oip-grpc", "tf-serving"])
def test_echo_through_each_door_equals_mlserver_s_answer(stage: Stage, door: str):
    direct = stage.b.infer("echo", ECHO_INPUTS)
    assert direct.status == 200, direct.body
    (expected,) = direct.json()["outputs"]
    flat = _flat(expected["data"])
    if door == "tf-serving":  # the door infers the tensor from the JSON rows
        status, answer = stage.post(
            "/v1/models/echo:predict", {"instances": [[1.5, -2], [3, 0.25]]}
        )
        assert status == 200, answer
        assert answer == {"predictions": [flat[:2], flat[2:]]}
        return
    if door == "oip-grpc":
        outputs = grpc_infer(stage, "echo", ECHO_INPUTS)
        got = [(t.name, t.datatype, list(t.shape), oip.tensor_to_json_data(t)) for t in outputs]
    else:
        status, answer = stage.infer("echo", {"inputs": ECHO_INPUTS})
        assert status == 200, answer
        got = [(o["name"], o["datatype"], o["shape"], _flat(o["data"])) for o in answer["outputs"]]
    assert got == [(expected["name"], expected["datatype"], expected["shape"], flat)]


# --- models add / remove with load, through the CLI -----------------------------------------------


def test_models_add_loads_on_both_servers_then_remove_drains_and_unloads(stage, tmp_path):
    assert not stage.a.model_ready("slow") and not stage.b.model_ready("slow")
    status, out, err = add(stage, tmp_path, "slow")
    assert status == 0, err
    assert json.loads(out)["added"]["loaded"] == {
        f"{NODE}/2/slow": "loaded",
        f"{NODE}/3/slow": "loaded",
    }
    assert stage.a.model_ready("slow") and stage.b.model_ready("slow")
    # served, by both servers
    answers = many(stage, "slow", range(16), 16)
    assert [(s, echoed(doc)) for s, doc in answers] == [(200, [k, -k]) for k in range(16)]
    assert {r[2] for r in stage.rows("slow", 16)} == {f"{NODE}/2/slow", f"{NODE}/3/slow"}

    # removed while requests are in flight: each is answered, then the model is unloaded
    with ThreadPoolExecutor(8) as pool:
        inflight = [pool.submit(stage.infer, "slow", echo_doc(k)) for k in range(100, 108)]
        wait_in_flight(stage, "slow", len(inflight))
        status, out, err = models_cli(stage, "remove", "slow")
        answered = [f.result(TIMEOUT) for f in inflight]
    assert status == 0, err
    removed = json.loads(out)
    assert removed["drained"] is True
    assert removed["unloaded"] == {f"{NODE}/2/slow": "unloaded", f"{NODE}/3/slow": "unloaded"}
    assert [(s, echoed(doc)) for s, doc in answered] == [(200, [k, -k]) for k in range(100, 108)]
    assert not stage.a.model_ready("slow") and not stage.b.model_ready("slow")
    status, answer = stage.infer("slow", echo_doc(0))
    assert status == 410, answer  # gone: removed at run time


def test_a_load_both_servers_fail_is_reported_per_device_and_adds_no_route(stage, tmp_path):
    status, out, err = add(stage, tmp_path, "broken")
    assert status != 0 and out == ""
    assert "model 'broken' not added: its load failed on 2 of 2 device(s): " in err
    for device, server in ((2, stage.a), (3, stage.b)):
        said = (
            f"{NODE}/{device}/broken: failed: 127.0.0.1:{server.ports['http']}: load of model"
            " 'broken' refused: HTTP "
        )
        assert said in err
    assert err.count(BROKEN_MESSAGE) >= 2
    assert not stage.a.model_ready("broken") and not stage.b.model_ready("broken")
    code, answer = stage.infer("broken", echo_doc(1))
    assert code == 404, answer
    listed = models_cli(stage, "list")
    assert listed[0] == 0 and "broken" not in listed[1]


# --- a server killed with -9 under load (last: it takes device 0's server away) -----------------


def test_a_server_killed_mid_load_loses_no_request(stage, tmp_path):
    status, _out, err = add(stage, tmp_path, "slow")
    assert status == 0, err
    before_rows = {r[0] for r in stage.rows("slow", 0)}
    before = stage.metrics()
    n, workers = 64, 16
    killed = threading.Event()
    in_flight: list[float] = []  # on device 2 when its server was killed

    def killer() -> None:
        """Kill device 2's server once requests are in flight on it (bounded wait)."""
        in_flight.append(wait_in_flight(stage, "slow", 3, f"{NODE}/2"))
        stage.a.kill()
        killed.set()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    answers = many(stage, "slow", range(n), workers)
    thread.join(TIMEOUT)
    assert killed.is_set() and in_flight[0] >= 3 and not stage.a.alive()
    assert [(s, echoed(doc)) for s, doc in answers] == [(200, [k, -k]) for k in range(n)]

    # in the store: one row per request, ended ok; those the killed server held resubmitted
    rows = [r for r in stage.rows("slow", len(before_rows) + n) if r[0] not in before_rows]
    assert len(rows) == n and len({r[0] for r in rows}) == n
    assert {r[1] for r in rows} == {"ok"}
    resubmitted = [r for r in rows if r[3] > 1]
    assert resubmitted, "no request was in flight on the killed server"
    assert {r[2] for r in resubmitted} == {f"{NODE}/3/slow"}
    by_device = Counter(r[2] for r in rows)

    # in /metrics: each counted once, where it ended; the resubmissions too
    after = stage.metrics()
    delta = requests_total(after, "slow") - requests_total(before, "slow")
    assert delta == Counter({(device, "ok"): count for device, count in by_device.items()})
    key = ("wirekit_serve_resubmissions_total", '{model="slow"}')
    assert after.get(key, 0) - before.get(key, 0) == sum(r[3] - 1 for r in rows)
