"""A model's declared tensors and versions (``models.<name>.inputs``, ``outputs``,
``versions``, ``platform``, ``tensors``): read from the config file and from the admin API
alike, each bad value a :class:`ConfigError` naming where it is; not live settings; and the
OIP metadata and checks built from them (:mod:`wirekit.oip.metadata`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

import wirekit
from wirekit.oip import InferRequest, Tensor
from wirekit.oip.metadata import (
    TensorSpec,
    check_inputs,
    model_metadata,
    server_metadata,
)
from wirekit.serve.config import (
    LIVE_SETTINGS,
    ConfigError,
    ModelConfig,
    model_from_fields,
    parse_config,
    parse_model,
    parse_settings,
)
from wirekit.serve.record.replicas import model_doc, model_of

IMAGE = {"name": "image", "datatype": "FP32", "shape": [-1, 3]}
LABEL = {"name": "label", "datatype": "BYTES", "shape": [-1]}


def _deployment(model: dict) -> dict:
    return {
        "models": {"m": model},
        "nodes": [{"id": "n", "devices": ["CPU"], "models": ["m"], "quotas": [1], "ports": [9]}],
    }


def test_defaults_declare_nothing_and_version_one():
    model = parse_config(_deployment({})).models["m"]
    assert (model.inputs, model.outputs) == ((), ())
    assert (model.versions, model.platform, model.tensors) == ((1,), "wirekit", "sample")


def test_declared_tensors_and_versions_are_read():
    model = parse_config(
        _deployment(
            {
                "inputs": [IMAGE],
                "outputs": [LABEL],
                "versions": [3, 1],
                "platform": "onnxruntime_onnx",
                "tensors": "rows",
            }
        )
    ).models["m"]
    assert model.inputs == (TensorSpec("image", "FP32", (-1, 3)),)
    assert model.outputs == (TensorSpec("label", "BYTES", (-1,)),)
    assert (model.versions, model.platform, model.tensors) == ((3, 1), "onnxruntime_onnx", "rows")


def test_toml_reads_the_same(tmp_path):
    toml = tmp_path / "d.toml"
    toml.write_text(
        "[models.m]\nversions = [2]\ntensors = 'rows'\n"
        "inputs = [{name = 'image', datatype = 'FP32', shape = [-1, 3]}]\n"
        "[[nodes]]\nid = 'n'\ndevices = ['CPU']\nmodels = ['m']\nquotas = [1]\nports = [9]\n"
    )
    js = tmp_path / "d.json"
    js.write_text(json.dumps(_deployment({"versions": [2], "tensors": "rows", "inputs": [IMAGE]})))
    from wirekit.serve.config import load_config

    assert load_config(toml).models == load_config(js).models


BAD = [
    ({"inputs": {}}, "inputs", "expected a list, got a dict"),
    ({"inputs": [1]}, "inputs[0]", "expected a table/object, got an integer"),
    (
        {"inputs": [{"name": "x", "datatype": "FP32"}]},
        "inputs[0].shape",
        "missing (a tensor needs name, datatype, shape)",
    ),
    (
        {"inputs": [{**IMAGE, "dims": [1]}]},
        "inputs[0].dims",
        "unknown key (allowed: datatype, name, shape)",
    ),
    (
        {"inputs": [{**IMAGE, "name": ""}]},
        "inputs[0].name",
        "expected a non-empty string, got a string",
    ),
    (
        {"inputs": [{**IMAGE, "name": "a\nb"}]},
        "inputs[0].name",
        "a tensor name is 1 to 128 printable characters, got 'a\\nb'",
    ),
    ({"inputs": [IMAGE, IMAGE]}, "inputs[1].name", "tensor 'image' is declared twice"),
    (
        {"outputs": [{**IMAGE, "datatype": "FLOAT32"}]},
        "outputs[0].datatype",
        "must be one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16,"
        " FP32, FP64, BF16, BYTES, got 'FLOAT32'",
    ),
    (
        {"outputs": [{**IMAGE, "datatype": 11}]},
        "outputs[0].datatype",
        "must be one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16,"
        " FP32, FP64, BF16, BYTES, got an integer",
    ),
    ({"inputs": [{**IMAGE, "shape": 3}]}, "inputs[0].shape", "expected a list, got an integer"),
    (
        {"inputs": [{**IMAGE, "shape": [1, -2]}]},
        "inputs[0].shape[1]",
        "must be between -1 and 9223372036854775807, got -2",
    ),
    (
        {"inputs": [{**IMAGE, "shape": [1.5]}]},
        "inputs[0].shape[0]",
        "expected an integer, got a number",
    ),
    (
        {"inputs": [{**IMAGE, "shape": [True]}]},
        "inputs[0].shape[0]",
        "expected an integer, got a boolean",
    ),
    (
        {"inputs": [{**IMAGE, "shape": [1] * 65}]},
        "inputs[0].shape",
        "64 dimensions at most, got 65",
    ),
    ({"versions": []}, "versions", "must not be empty"),
    ({"versions": 1}, "versions", "expected a list, got an integer"),
    ({"versions": [0]}, "versions[0]", "must be between 1 and 9223372036854775807, got 0"),
    ({"versions": ["1"]}, "versions[0]", "expected an integer, got a string"),
    ({"versions": [2, 2]}, "versions[1]", "version 2 is listed twice"),
    ({"platform": 1}, "platform", "expected a non-empty string, got an integer"),
    ({"tensors": "row"}, "tensors", "must be one of sample, rows, got 'row'"),
]


@pytest.mark.parametrize(("model", "where", "reason"), BAD)
def test_bad_values_are_named_in_the_file(model, where, reason):
    with pytest.raises(ConfigError) as info:
        parse_config(_deployment(model))
    assert (info.value.where, info.value.reason) == (f"models.m.{where}", reason)


@pytest.mark.parametrize(("model", "where", "reason"), BAD)
def test_bad_values_are_named_in_the_admin_api(model, where, reason):
    """``POST /admin/models`` (:func:`parse_model`, short form): the same check, the same
    message, at the same place under ``models.<name>``."""
    doc = {"name": "m", "model": model, "placements": [{"node": "n", "device": 0, "quota": 1,
                                                        "port": 9}]}  # fmt: skip
    with pytest.raises(ConfigError) as info:
        parse_model(doc, {("n", 0): "CPU"})
    assert (info.value.where, info.value.reason) == (f"models.m.{where}", reason)


def test_a_model_added_at_run_time_keeps_its_declarations():
    doc = {
        "name": "m",
        "model": {"inputs": [IMAGE], "versions": [2, 5], "tensors": "rows"},
        "placements": [{"node": "n", "device": 0, "quota": 1, "port": 9}],
    }
    model, _rows = parse_model(doc, {("n", 0): "CPU"})
    assert model.inputs == (TensorSpec("image", "FP32", (-1, 3)),)
    assert (model.versions, model.tensors) == ((2, 5), "rows")


@pytest.mark.parametrize("key", ["inputs", "outputs", "versions", "platform", "tensors"])
def test_declarations_are_not_live_settings(key):
    """What a model declares of itself changes only by removing and adding it: a client
    that read its metadata keeps reading it true."""
    assert key not in LIVE_SETTINGS
    model = parse_config(_deployment({"inputs": [IMAGE]})).models["m"]
    with pytest.raises(ConfigError) as info:
        parse_settings({key: [] if key != "platform" else "x"}, model)
    assert info.value.where == key
    assert info.value.reason.startswith("cannot change while the model is served")


def test_live_settings_keep_the_declarations():
    model = parse_config(_deployment({"inputs": [IMAGE], "versions": [4]})).models["m"]
    changed = parse_settings({"timeout": 1.5}, model)
    assert changed == dataclasses.replace(model, timeout=1.5)


def test_declarations_cross_the_shared_store_log():
    """A replica reads a model another one added (JSON in the change log) as it was."""
    model = parse_config(
        _deployment({"inputs": [IMAGE], "outputs": [LABEL], "versions": [2, 7]})
    ).models["m"]
    doc = json.loads(json.dumps(model_doc(model, [])))
    assert model_of(doc) == (model, [])
    old = {k: v for k, v in doc["model"].items() if k not in ("inputs", "versions")}
    assert model_from_fields(old) == dataclasses.replace(model, inputs=(), versions=(1,))
    with pytest.raises(ConfigError) as info:
        model_from_fields({**doc["model"], "versions": [0]})
    assert info.value.where == "versions[0]"


def _model(**declared) -> ModelConfig:
    return ModelConfig("m", **declared)


def _tensor(name="image", datatype="FP32", shape=(2, 3)) -> Tensor:
    """A tensor of zeros (BYTES: of empty elements)."""
    count = 1
    for dim in shape:
        count *= dim
    size = {"FP32": 4, "FP64": 8, "BOOL": 1, "INT8": 1, "BYTES": 4}[datatype]
    return Tensor(name, datatype, tuple(shape), b"\0" * size * count)


SPECS = (TensorSpec("image", "FP32", (-1, 3)), TensorSpec("mask", "BOOL", (-1,)))


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([_tensor(), _tensor("mask", "BOOL", (7,))], None),
        (
            [_tensor(), _tensor("mask", "BOOL", (7,)), _tensor("other")],
            "unknown input 'other' (the model's inputs: image, mask)",
        ),
        ([_tensor()], "missing input 'mask' (the model's inputs: image, mask)"),
        (
            [_tensor(datatype="FP64"), _tensor("mask", "BOOL", (1,))],
            "input 'image': expected datatype FP32, got FP64",
        ),
        (
            [_tensor(shape=(2, 4)), _tensor("mask", "BOOL", (1,))],
            "input 'image': expected shape [-1, 3], got [2, 4]",
        ),
        (
            [_tensor(shape=(6,)), _tensor("mask", "BOOL", (1,))],
            "input 'image': expected shape [-1, 3], got [6]",
        ),
        ([_tensor(), _tensor()], "input 'image' is given twice"),
    ],
)
def test_check_inputs_names_the_tensor(inputs, message):
    assert check_inputs(_model(inputs=SPECS), InferRequest(inputs)) == message


def test_check_inputs_without_declarations_takes_any_tensor():
    req = InferRequest([_tensor("a", "INT8", (1,)), _tensor("b", "BYTES", ())])
    assert check_inputs(_model(), req) is None
    assert check_inputs(_model(), InferRequest([_tensor(), _tensor()])) == (
        "input 'image' is given twice"
    )


def test_metadata_documents():
    model = _model(
        inputs=SPECS, outputs=(TensorSpec("out", "FP16", ()),), versions=(1, 3), platform="p"
    )
    assert model_metadata(model) == {
        "name": "m",
        "versions": ["1", "3"],
        "platform": "p",
        "inputs": [
            {"name": "image", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "mask", "datatype": "BOOL", "shape": [-1]},
        ],
        "outputs": [{"name": "out", "datatype": "FP16", "shape": []}],
    }
    assert model_metadata(_model()) == {
        "name": "m",
        "versions": ["1"],
        "platform": "wirekit",
        "inputs": [],
        "outputs": [],
    }
    assert server_metadata() == {
        "name": "wirekit",
        "version": wirekit.__version__,
        "extensions": ["binary_tensor_data"],
    }


def test_check_inputs_checks_the_data_against_the_shape():
    short = Tensor("image", "FP32", (2, 3), b"\0" * 20)
    mask = _tensor("mask", "BOOL", (1,))
    assert check_inputs(_model(inputs=SPECS), InferRequest([short, mask])) == (
        'tensor "image": 20 bytes of data, shape [2, 3] of FP32 needs 24'
    )
    assert check_inputs(_model(), InferRequest([short])) == (
        'tensor "image": 20 bytes of data, shape [2, 3] of FP32 needs 24'
    )
    framed = Tensor("s", "BYTES", (1,), b"\5\0\0\0abc")
    assert "BYTES element 0 of 1" in check_inputs(_model(), InferRequest([framed]))
