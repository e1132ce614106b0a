"""TF Serving's REST API (and KServe's v1 protocol) at ``wirekit serve``'s HTTP door
(specs/tfserving.md), against a real ``wirekit serve --with-backends`` process on loopback
whose backends are wirekit's MIP echo: the ``kserve`` client from PyPI, unchanged; TF
Serving's documented examples, answered in TF Serving's shapes; and every refusal an
``{"error"}`` with its status.  The process runs the compiled twins, or the pure ones under
``WIREKIT_PURE=1`` (it inherits the environment)."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kserve import InferenceRESTClient, RESTConfig
from prometheus_client.parser import text_string_to_metric_families
from serve_support import admin_headers, deployment, run
from support.ports import free_port
from support.process import ROOT, ServerProcess
from support.service import running_service, start_backend

from wirekit.errors import DecodeError
from wirekit.mip import Item
from wirekit.mip.runtime import echo
from wirekit.oip import OipItem, Tensor, reply_sample
from wirekit.oip.metadata import TensorSpec
from wirekit.serve.doors.tfserving import json_tensor, tensor_json

TIMEOUT = 30.0

X = {"name": "x", "datatype": "FP32", "shape": [-1, 2]}
#: the inputs of TF Serving's row-format example (tag, signal, sensor)
EXAMPLE_INPUTS = [
    {"name": "tag", "datatype": "BYTES", "shape": [-1]},
    {"name": "signal", "datatype": "INT64", "shape": [-1, 5]},
    {"name": "sensor", "datatype": "FP32", "shape": [-1, 2, 2]},
]
MODELS: dict[str, dict[str, Any]] = {
    # no declared inputs: wirekit's JSON-item mapping
    "plain": {},
    # one FP32 input, two versions, the whole request one MIP sample
    "vec": {"inputs": [X], "outputs": [X], "versions": [1, 2]},
    # TF Serving's example's three inputs, one MIP sample per row
    "example": {"inputs": EXAMPLE_INPUTS, "tensors": "rows"},
    # TF Serving's half_plus_three's one input (here echoed, not halved)
    "scalars": {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}]},
    # binary values: a BYTES input whose name ends in _bytes
    "images": {"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [-1]}]},
}


class Serve(ServerProcess):
    """``wirekit serve --config CONFIG --with-backends`` (echo backends), and its ready line."""

    def __init__(self, config: Path, cwd: Path) -> None:
        super().__init__(
            [sys.executable, "-m", "wirekit", "serve", "--config", str(config), "--with-backends"],
            ready=None,
            pythonpath=[ROOT],
            cwd=cwd,
            start_timeout=TIMEOUT * 2,
            stop_timeout=TIMEOUT,
        )
        self.start()
        self.ready = json.loads(self.first_line) if self.first_line else {}


def _call(
    base: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, Any]:
    """``method path`` with ``body`` (JSON, or bytes as they are) and ``headers``:
    ``(status, JSON answer, headers)``."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read()), exc.headers


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The HTTP door of a running ``wirekit serve`` serving :data:`MODELS`, once ready."""
    tmp = tmp_path_factory.mktemp("tfserving")
    config = tmp / "serve.json"
    config.write_text(
        json.dumps(
            {
                "listen": {"http_port": 0},
                "models": {name: {"port": None, **model} for name, model in MODELS.items()},
                "nodes": [
                    {
                        "id": "n",
                        "devices": ["CPU"],
                        "models": list(MODELS),
                        "quotas": [0.2] * len(MODELS),
                        "ports": [free_port() for _ in MODELS],
                    }
                ],
            }
        )
    )
    serve = Serve(config, tmp)
    try:
        assert serve.ready.get("event") == "ready", serve.log
        url = f"http://127.0.0.1:{serve.ready['http']}"
        until = time.monotonic() + TIMEOUT
        while _call(url, "GET", "/readyz")[0] != 200:
            assert time.monotonic() < until, serve.log
            time.sleep(0.05)
        yield url
    finally:
        serve.close()


# --- the kserve client (v1), unchanged -----------------------------------------------------


async def _kserve_v1(base: str) -> tuple[Any, ...]:
    client = InferenceRESTClient(RESTConfig(protocol="v1", timeout=TIMEOUT))
    try:
        iris = {"instances": [[6.8, 2.8, 4.8, 1.4], [6.0, 3.4, 4.5, 1.6]]}
        plain = await client.infer(base, iris, model_name="plain")
        vec = await client.infer(base, {"instances": [[1, 2], [3, 4]]}, model_name="vec")
        ready = await client.is_model_ready(base, "vec")
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await client.infer(base, {"instances": [[1, 2, 3]]}, model_name="vec")
        with pytest.raises(httpx.HTTPStatusError) as unknown:
            await client.infer(base, iris, model_name="nope")
        return plain, vec, ready, refused.value, unknown.value
    finally:
        await client.close()


def test_the_kserve_v1_client_predicts_unchanged(base):
    plain, vec, ready, refused, unknown = asyncio.run(_kserve_v1(base))
    assert plain == {"predictions": [[6.8, 2.8, 4.8, 1.4], [6.0, 3.4, 4.5, 1.6]]}
    assert vec == {"predictions": [[1.0, 2.0], [3.0, 4.0]]}
    assert ready is True
    assert refused.response.status_code == 400
    assert "input 'x': expected shape [-1, 2], got [1, 3]" in str(refused)
    assert unknown.response.status_code == 404
    assert "unknown model 'nope'" in str(unknown)


# --- TF Serving's documented examples ------------------------------------------------------

ROW_EXAMPLE = {
    "instances": [
        {"tag": "foo", "signal": [1, 2, 3, 4, 5], "sensor": [[1, 2], [3, 4]]},
        {"tag": "bar", "signal": [3, 4, 1, 2, 5], "sensor": [[4, 5], [6, 8]]},
    ]
}
COLUMNAR_EXAMPLE = {
    "inputs": {
        "tag": ["foo", "bar"],
        "signal": [[1, 2, 3, 4, 5], [3, 4, 1, 2, 5]],
        "sensor": [[[1, 2], [3, 4]], [[4, 5], [6, 8]]],
    }
}


def test_the_row_format_example_is_answered_predictions(base):
    """Several named outputs: a list of objects, one per instance (echoed)."""
    status, doc, headers = _call(base, "POST", "/v1/models/example:predict", ROW_EXAMPLE)
    assert (status, doc) == (200, {"predictions": ROW_EXAMPLE["instances"]})
    assert headers["X-Request-Id"] and headers["Content-Type"] == "application/json"


def test_the_columnar_format_example_is_answered_outputs(base):
    """Several named outputs: an object of them."""
    status, doc, _ = _call(base, "POST", "/v1/models/example:predict", COLUMNAR_EXAMPLE)
    assert (status, doc) == (200, {"outputs": COLUMNAR_EXAMPLE["inputs"]})


def test_one_input_given_bare(base):
    """TF Serving's half_plus_three call, and its one-input forms."""
    body = {"instances": [1.0, 2.0, 5.0]}
    assert _call(base, "POST", "/v1/models/scalars:predict", body)[:2] == (
        200,
        {"predictions": [1.0, 2.0, 5.0]},
    )
    body = {"signature_name": "serving_default", "inputs": [[1, 2], [3, 4]]}
    assert _call(base, "POST", "/v1/models/vec:predict", body)[:2] == (
        200,
        {"outputs": [[1.0, 2.0], [3.0, 4.0]]},
    )
    body = {"instances": [{"x": [1, 2]}]}  # named, though it is the only one
    assert _call(base, "POST", "/v1/models/vec:predict", body)[:2] == (
        200,
        {"predictions": [[1.0, 2.0]]},
    )


def test_binary_values_are_b64_both_ways(base):
    png, text = b"\x89PNG\r\n\x1a\n\xff", b"plain text"
    body = {"instances": [{"b64": base64.b64encode(v).decode()} for v in (png, text)]}
    status, doc, _ = _call(base, "POST", "/v1/models/images:predict", body)
    # the output's name ends in _bytes: every value b64, UTF-8 or not
    assert (status, doc) == (200, {"predictions": body["instances"]})
    # a BYTES output of another name: strings, but bytes that are not UTF-8 stay b64
    body = {"inputs": {"tag": ["a", {"b64": base64.b64encode(png).decode()}],
                       "signal": [[0] * 5] * 2, "sensor": [[[0, 0], [0, 0]]] * 2}}  # fmt: skip
    status, doc, _ = _call(base, "POST", "/v1/models/example:predict", body)
    assert status == 200 and doc["outputs"]["tag"] == body["inputs"]["tag"]


def test_a_version_in_the_path(base):
    body = {"instances": [[1, 2]]}
    assert _call(base, "POST", "/v1/models/vec/versions/1:predict", body)[:2] == (
        200,
        {"predictions": [[1.0, 2.0]]},
    )
    for version in ("3", "0", "x", "01x"):
        assert _call(base, "POST", f"/v1/models/vec/versions/{version}:predict", body)[:2] == (
            404,
            {"error": f"model 'vec' has no version {version} (its versions: 1, 2)"},
        )


def test_items_for_models_that_declare_no_inputs(base):
    """wirekit's JSON-item mapping: ``instances`` one item per sample, an ``inputs`` list
    one item per value."""
    body = {"instances": ["a", {"k": [1]}, 3]}
    assert _call(base, "POST", "/v1/models/plain:predict", body)[:2] == (
        200,
        {"predictions": ["a", {"k": [1]}, 3]},
    )
    body = {"inputs": [["a", 1], ["b", 2]]}
    assert _call(base, "POST", "/v1/models/plain:predict", body)[:2] == (
        200,
        {"outputs": [["a", 1], ["b", 2]]},
    )


# --- model status and metadata -------------------------------------------------------------

AVAILABLE = {"state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}


def test_model_status(base):
    assert _call(base, "GET", "/v1/models/vec")[:2] == (
        200,
        {
            "name": "vec",
            "ready": True,
            "model_version_status": [
                {"version": "1", **AVAILABLE},
                {"version": "2", **AVAILABLE},
            ],
        },
    )
    assert _call(base, "GET", "/v1/models/vec/versions/2")[:2] == (
        200,
        {"name": "vec", "ready": True, "model_version_status": [{"version": "2", **AVAILABLE}]},
    )
    assert _call(base, "GET", "/v1/models/plain")[1]["model_version_status"] == [
        {"version": "1", **AVAILABLE}
    ]
    assert _call(base, "GET", "/v1/models/vec/versions/9")[:2] == (
        404,
        {"error": "model 'vec' has no version 9 (its versions: 1, 2)"},
    )
    assert _call(base, "GET", "/v1/models")[:2] == (
        200,
        {"models": sorted(MODELS)},
    )


def _tensor_info(name: str, dtype: str, dims: list[int]) -> dict[str, Any]:
    return {
        "name": name,
        "dtype": dtype,
        "tensor_shape": {
            "dim": [{"size": str(d), "name": ""} for d in dims],
            "unknown_rank": False,
        },
    }


def test_model_metadata(base):
    def signature(inputs: dict, outputs: dict) -> dict:
        return {
            "signature_def": {
                "signature_def": {
                    "serving_default": {
                        "inputs": inputs,
                        "outputs": outputs,
                        "method_name": "tensorflow/serving/predict",
                    }
                }
            }
        }

    x = {"x": _tensor_info("x", "DT_FLOAT", [-1, 2])}
    assert _call(base, "GET", "/v1/models/vec/metadata")[:2] == (
        200,
        {"model_spec": {"name": "vec", "signature_name": "", "version": "2"},
         "metadata": signature(x, x)},
    )  # fmt: skip
    status, doc, _ = _call(base, "GET", "/v1/models/example/versions/1/metadata")
    assert status == 200 and doc["model_spec"]["version"] == "1"
    inputs = doc["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert inputs == {
        "tag": _tensor_info("tag", "DT_STRING", [-1]),
        "signal": _tensor_info("signal", "DT_INT64", [-1, 5]),
        "sensor": _tensor_info("sensor", "DT_FLOAT", [-1, 2, 2]),
    }


# --- refusals ------------------------------------------------------------------------------

REFUSED = [
    # the declared inputs
    ("vec", {"instances": [[1, 2, 3]]}, 400, "input 'x': expected shape [-1, 2], got [1, 3]"),
    ("vec", {"inputs": [1, 2]}, 400, "input 'x': expected shape [-1, 2], got [2]"),
    ("vec", {"inputs": [["a", "b"]]}, 400, 'tensor "x": FP32 data must be numbers'),
    ("vec", {"inputs": {"y": [[1, 2]]}}, 400, "unknown input 'y' (the model's inputs: x)"),
    (
        "example",
        {"inputs": {"tag": ["a"], "signal": [[1, 2, 3, 4, 5]]}},
        400,
        "missing input 'sensor' (the model's inputs: tag, signal, sensor)",
    ),
    (
        "example",
        {"inputs": {"tag": ["a"], "signal": [[1.5, 2, 3, 4, 5]], "sensor": [[[1, 2], [3, 4]]]}},
        400,
        'tensor "signal": INT64 data must be integers',
    ),
    (
        "example",
        {"instances": [[1, 2]]},
        400,
        "instances[0]: the model has 3 inputs (tag, signal, sensor): name them in an object",
    ),
    (
        "example",
        {"instances": [{"tag": "a"}, {"signal": [1, 2, 3, 4, 5]}]},
        400,
        "instances[1]: names the inputs signal, instances[0] names tag (every instance names"
        " the same inputs)",
    ),
    (
        "scalars",
        {"instances": [1, [2]]},
        400,
        "input 'x': the lists are ragged at depth 1 (a"
        " tensor's lists have equal lengths at each depth)",
    ),
    (
        "vec",
        {"instances": [[1, 2], [3]]},
        400,
        "input 'x': the lists are ragged at depth 1 (a"
        " tensor's lists have equal lengths at each depth)",
    ),
    ("scalars", {"instances": [{"v": 1}]}, 400, "unknown input 'v' (the model's inputs: x)"),
    (
        "scalars",
        {"instances": [[{"b64": "AA=="}]]},
        400,
        "input 'x': a b64 value in a FP32 tensor (BYTES only)",
    ),
    (
        "images",
        {"instances": [{"b64": "not base64!"}]},
        400,
        "input 'image_bytes': a b64 value is not base64",
    ),
    (
        "images",
        {"instances": [7]},
        400,
        "input 'image_bytes': a BYTES value is a string or {\"b64\": ...}, got 7",
    ),
    ("vec", {"instances": []}, 400, "instances must be a non-empty list (one entry per row)"),
    # the body
    (
        "vec",
        {"instances": [[1, 2]], "inputs": [[1, 2]]},
        400,
        'the body has both "instances" and "inputs": give one of them',
    ),
    (
        "vec",
        {"examples": []},
        400,
        'the body needs "instances" (row format) or "inputs" (columnar format)',
    ),
    ("vec", {"signature_name": 1, "inputs": [[1, 2]]}, 400, "signature_name must be a string"),
    (
        "plain",
        {"inputs": {"a": [1]}},
        400,
        "model 'plain' declares no inputs: a map of named tensors needs them (models.plain.inputs),"
        " or give a list of samples",
    ),
    ("plain", {"instances": "x"}, 400, "instances must be a non-empty list"),
    ("nope", {"instances": [1]}, 404, "unknown model 'nope'"),
]


@pytest.mark.parametrize(("model", "body", "status", "error"), REFUSED)
def test_bad_requests_get_an_error_and_nothing_else(base, model, body, status, error):
    assert _call(base, "POST", f"/v1/models/{model}:predict", body)[:2] == (
        status,
        {"error": error},
    )


def test_bodies_that_are_not_a_json_object(base):
    status, doc, headers = _call(base, "POST", "/v1/models/vec:predict", b"{not json")
    assert status == 400 and doc["error"].startswith("body is not JSON")
    assert headers["Content-Type"] == "application/json"
    assert _call(base, "POST", "/v1/models/vec:predict", b"[1]")[:2] == (
        400,
        {"error": "body must be a JSON object"},
    )
    status, doc, _ = _call(base, "POST", "/v1/models/vec:predict", b'{"instances": [NaN]}')
    assert status == 400 and doc["error"].startswith("body is not JSON")


def test_other_apis_are_json_errors(base):
    assert _call(base, "POST", "/v1/models/vec:classify", {"examples": []})[:2] == (
        501,
        {"error": "classify is not served by wirekit: use predict"},
    )
    assert _call(base, "POST", "/v1/models/vec/versions/2:regress", {"examples": []})[:2] == (
        501,
        {"error": "regress is not served by wirekit: use predict"},
    )
    assert _call(base, "POST", "/v1/models/nope:regress", {})[:2] == (
        404,
        {"error": "unknown model 'nope'"},
    )
    assert _call(base, "GET", "/v1/models/vec/labels/stable")[:2] == (
        404,
        {"error": "no such API: GET /v1/models/vec/labels/stable"},
    )
    assert _call(base, "GET", "/v1/models/nope")[:2] == (404, {"error": "unknown model 'nope'"})
    assert _call(base, "GET", "/v1/models/nope/metadata")[:2] == (
        404,
        {"error": "unknown model 'nope'"},
    )


# --- in process: what an echo cannot show --------------------------------------------------


def _says_no(batch):
    """A model answering the OIP ERROR item: its own message for the client."""
    return [[Item(int(OipItem.ERROR), b"the model says no")] for _ in batch]


def _answers_a_scalar(batch):
    """A model answering one FP32 scalar (1.0): no dim 0 to split into rows."""
    return [reply_sample([Tensor("y", "FP32", (), b"\0\0\x80?")]) for _ in batch]


def _answers_text(batch):
    """A model answering a TEXT item: not the OIP mapping."""
    return [[Item.text("not a tensor")] for _ in batch]


def test_model_errors_answers_and_limits(tmp_path):
    async def main():
        backends = [await start_backend(h) for h in (_says_no, _answers_a_scalar, _answers_text)]
        ports = [port for _, port in backends]
        models = {name: {"port": None, "inputs": [X]} for name in ("no", "scalar", "text")}
        models["rows"] = {"port": None, "inputs": [X], "tensors": "rows"}
        models["dead"] = {"port": None}
        doc = deployment(
            tmp_path / "requests.db",
            models,
            [
                {
                    "id": "n",
                    "devices": ["CPU"],
                    "models": list(models),
                    "quotas": [0.2] * 5,
                    "ports": [*ports, ports[1], free_port()],
                }
            ],
            mip={"max_items": 8},
        )
        async with running_service(doc, backends=backends) as service:
            url = f"http://127.0.0.1:{service.addresses()['http']}"
            calls = [
                ("POST", "/v1/models/no:predict", {"instances": [[1, 2]]}),
                ("POST", "/v1/models/scalar:predict", {"inputs": [[1, 2]]}),
                ("POST", "/v1/models/scalar:predict", {"instances": [[1, 2]]}),
                ("POST", "/v1/models/text:predict", {"instances": [[1, 2]]}),
                # rows: (1 + 1 input) items per row, at most 8 items
                ("POST", "/v1/models/rows:predict", {"instances": [[1, 2]] * 4}),
                ("POST", "/v1/models/rows:predict", {"instances": [[1, 2]] * 5}),
                ("POST", "/v1/models/dead:predict", {"instances": list(range(9))}),
                ("GET", "/v1/models/dead", None),
                ("POST", "/v1/models/dead:predict", {"instances": [1]}),
            ]
            answers = [await asyncio.to_thread(_call, url, *call) for call in calls]
            return answers, service.metrics

    answered, metrics = run(main())
    answers = [(status, doc) for status, doc, _ in answered]
    assert answers[0] == (400, {"error": "the model says no"})
    assert answers[1] == (200, {"outputs": 1.0})
    assert answers[2] == (
        502,
        {
            "error": "the model's outputs do not share a 0-th dimension (y []): ask in the"
            ' columnar format ("inputs")'
        },
    )
    status, doc = answers[3]
    assert status == 502 and doc["error"].startswith("the model's answer is not OIP's: ")
    # rows: each row answered its scalar, stacked back along dim 0
    assert answers[4] == (200, {"predictions": [1.0] * 4})
    assert answers[5] == (
        413,
        {"error": "10 items exceed the limit of 8 per request (mip.max_items)"},
    )
    assert answers[6] == (
        413,
        {"error": "9 items exceed the limit of 8 per request (mip.max_items)"},
    )
    status, doc = answers[7]
    assert status == 503 and doc["ready"] is False
    (version,) = doc["model_version_status"]
    assert (version["version"], version["state"]) == ("1", "UNAVAILABLE")
    assert version["status"]["error_code"] == "UNAVAILABLE"
    assert version["status"]["error_message"].startswith("model dead: no reachable device")
    status, doc = answers[8]
    assert status == 503 and doc["error"].startswith("no device answered")
    # the door label: OIP tensors on "tfserving", JSON items (the dead model's) on "http"
    requests: Counter = Counter()
    for family in text_string_to_metric_families(metrics.prometheus().decode()):
        for sample in family.samples:
            if sample.name == "wirekit_serve_requests_total":
                requests[sample.labels["model"], sample.labels["door"]] += sample.value
    assert requests == {("no", "tfserving"): 1, ("scalar", "tfserving"): 2,
                        ("text", "tfserving"): 1, ("rows", "tfserving"): 1,
                        ("dead", "http"): 1}  # fmt: skip


def test_a_model_added_at_run_time_declares_its_inputs(tmp_path):
    """``POST /admin/models`` validates the declarations as the config file does (the same
    message, at ``models.<name>...``); the model added is served by TF Serving's API with
    them; ``PATCH`` cannot change them."""

    async def main():
        backends = [await start_backend(echo) for _ in range(2)]
        ports = [port for _, port in backends]
        doc = deployment(
            tmp_path / "requests.db",
            {"m1": {"port": None}},
            [{"id": "n", "devices": ["CPU", "CPU"], "models": ["m1"], "quotas": [1, 0],
              "ports": [ports[0], None]}],
        )  # fmt: skip
        async with running_service(doc, backends=backends) as service:
            url = f"http://127.0.0.1:{service.addresses()['http']}"
            admin = {**admin_headers(service), "Content-Type": "application/json"}

            def add(model: dict) -> tuple[int, Any]:
                place = {"node": "n", "device": 1, "quota": 1, "port": ports[1]}
                body = {"name": "m2", "model": {"port": None, **model}, "placements": [place]}
                return _call(url, "POST", "/admin/models", body, admin)[:2]

            bad = await asyncio.to_thread(add, {"inputs": [{**X, "datatype": "FP128"}]})
            good = await asyncio.to_thread(add, {"inputs": [X], "versions": [4]})
            answers = [
                await asyncio.to_thread(_call, url, *call)
                for call in [
                    ("POST", "/v1/models/m2/versions/4:predict", {"instances": [[1, 2]]}),
                    ("POST", "/v1/models/m2:predict", {"instances": [[1, 2, 3]]}),
                    ("GET", "/v1/models/m2/metadata"),
                    ("PATCH", "/admin/models/m2", {"versions": [5]}, admin),
                ]
            ]
            return bad, good, [(status, doc) for status, doc, _ in answers]

    bad, good, answers = run(main())
    where = "models.m2.inputs[0].datatype"
    assert bad == (
        400,
        {
            "error": f"{where}: must be one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16,"
            " INT32, INT64, FP16, FP32, FP64, BF16, BYTES, got 'FP128'",
            "where": where,
        },
    )
    status, entry = good
    assert status == 201
    assert (entry["inputs"], entry["outputs"], entry["versions"]) == ([X], [], [4])
    assert (entry["platform"], entry["tensors"]) == ("wirekit", "sample")
    assert answers[0] == (200, {"predictions": [[1.0, 2.0]]})
    assert answers[1] == (400, {"error": "input 'x': expected shape [-1, 2], got [1, 3]"})
    status, metadata = answers[2]
    assert status == 200 and metadata["model_spec"]["version"] == "4"
    status, refused = answers[3]
    assert status == 400 and refused["where"] == "versions"
    assert refused["error"].startswith("versions: cannot change while the model is served")


# --- the conversions, for any shape --------------------------------------------------------

ELEMENTS = {
    "FP64": st.floats(allow_nan=False, allow_infinity=False),
    "INT64": st.integers(-(2**63), 2**63 - 1),
    "BOOL": st.booleans(),
    "BYTES": st.text(max_size=5),
}


def _nested(flat: list[Any], shape: tuple[int, ...]) -> Any:
    """``flat`` as nested lists of ``shape`` (written plainly, as the test's own truth)."""
    if not shape:
        return flat[0]
    step = len(flat) // shape[0] if shape[0] else 0
    return [_nested(flat[k * step : (k + 1) * step], shape[1:]) for k in range(shape[0])]


@st.composite
def json_tensors(draw: st.DrawFn) -> tuple[str, tuple[int, ...], Any]:
    datatype = draw(st.sampled_from(sorted(ELEMENTS)))
    shape = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    count = 1
    for dim in shape:
        count *= dim
    flat = draw(st.lists(ELEMENTS[datatype], min_size=count, max_size=count))
    return datatype, shape, _nested(flat, shape)


@given(json_tensors())
def test_json_values_round_trip_through_tensors(case):
    """TF Serving's nested JSON -> an OIP tensor (shape from the nesting) -> the same JSON."""
    datatype, shape, value = case
    tensor = json_tensor(TensorSpec("t", datatype, (-1,) * len(shape)), value)
    assert (tensor.datatype, tensor.shape) == (datatype, shape)
    assert tensor_json(tensor) == value


@pytest.mark.parametrize(
    ("shape", "value"),
    [((0,), []), ((2, 0), [[], []]), ((1, 2, 0), [[[], []]]), ((0, 3), [])],
)
def test_empty_tensors_are_written_as_their_shape(shape, value):
    assert tensor_json(Tensor("t", "FP32", shape, b"")) == value


def test_a_bytes_output_badly_framed_is_refused_not_walked():
    with pytest.raises(DecodeError, match="length 9 exceeds the 2 bytes left"):
        tensor_json(Tensor("t", "BYTES", (1,), b"\x09\0\0\0ab"))
