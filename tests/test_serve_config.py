"""The deployment config: the design's example, JSON and TOML, and clear errors."""

from __future__ import annotations

import copy
import json

import pytest
from serve_support import ROOT

from wirekit.serve.config import ConfigError, load_config, parse_config
from wirekit.serve.dispatch.router import Router

DESIGN = {
    "nodes": [
        {
            "id": "n1",
            "devices": ["CPU", "GPU", "GPU"],
            "models": ["m1", "m2"],
            "quotas": [0.5, 0.5, 1, 0, 0, 1],
            "ports": [9001, 9002, 9003, None, None, 9004],
        }
    ]
}


def test_design_example_gives_one_row_per_device_and_model():
    dep = parse_config(DESIGN)
    rows = [(r.model, r.device, r.device_type, r.quota, r.port) for r in dep.rows]
    assert rows == [
        ("m1", 0, "CPU", 0.5, 9001),
        ("m2", 0, "CPU", 0.5, 9002),
        ("m1", 1, "GPU", 1.0, 9003),
        ("m2", 1, "GPU", 0.0, None),
        ("m1", 2, "GPU", 0.0, None),
        ("m2", 2, "GPU", 1.0, 9004),
    ]
    assert sorted(dep.models) == ["m1", "m2"]
    router = Router(dep.rows)
    assert router.probabilities("m1") == {"n1/0/m1": 1 / 3, "n1/1/m1": 2 / 3}
    assert router.probabilities("m2") == {"n1/0/m2": 1 / 3, "n1/2/m2": 2 / 3}


def test_json_and_toml_samples_describe_the_same_deployment():
    a = load_config(ROOT / "samples" / "serve-deployment.json")
    b = load_config(ROOT / "samples" / "serve-deployment.toml")
    assert a == b
    assert a.models["m2"].apps == ("sentiment",)
    assert a.app_models()["sentiment"] == "m2"
    assert a.models["m1"].timeout == 2.0 and a.models["m1"].attempts == 3


def _bad(mutate):
    doc = copy.deepcopy(DESIGN)
    mutate(doc)
    return doc


def _set(path, value):
    def mutate(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "where", "text"),
    [
        (_set(["nodes", 0, "quotas"], [0.5, 0.5, 1, 0, 0]), "nodes[0].quotas", "expected 6"),
        (_set(["nodes", 0, "quotas", 2], 0.5), "nodes[0].quotas[2]", "GPU is given 0 or 1"),
        (_set(["nodes", 0, "quotas", 0], 0.7), "nodes[0].quotas", "given 1.2 of itself"),
        (_set(["nodes", 0, "quotas", 0], -0.1), "nodes[0].quotas[0]", "must be >= 0"),
        (_set(["nodes", 0, "quotas", 0], "half"), "nodes[0].quotas[0]", "expected a number"),
        (_set(["nodes", 0, "devices", 1], "TPU"), "nodes[0].devices[1]", "CPU or GPU"),
        (_set(["nodes", 0, "ports", 0], None), "nodes[0].ports[0]", "a backend port"),
        (_set(["nodes", 0, "ports", 0], 70000), "nodes[0].ports[0]", "between 0 and 65535"),
        (_set(["nodes", 0, "ports"], [1, 2]), "nodes[0].ports", "parallel to quotas"),
        (_set(["nodes", 0, "colour"], "red"), "nodes[0].colour", "unknown key"),
        (_set(["nodes"], []), "nodes", "must not be empty"),
        (_set(["models"], {"m3": {}}), "models.m3", "no node serves this model"),
        (_set(["models"], {"m1": {"timeout": 0}}), "models.m1.timeout", "must be > 0"),
        (_set(["models"], {"m1": {"attempts": 0}}), "models.m1.attempts", "between 1 and"),
        (_set(["models"], {"m1": {"backend": "grpc"}}), "models.m1.backend", "must be one of"),
        (
            lambda d: d.setdefault("store", {}).update(compact_every=-1),
            "store.compact_every",
            "must be >= 0",
        ),
        (
            lambda d: d.setdefault("store", {}).update(compact_keep="1m"),
            "store.compact_keep",
            "expected a number",
        ),
        (
            _set(["models"], {"m1": {"port": 7000}, "m2": {"port": 7000}}),
            "models.m2.port",
            "also models.m1",
        ),
        (
            _set(["nodes", 0, "quotas"], [0.5, 0, 1, 0, 0, 0]),
            "models.m2",
            "no device has a quota > 0",
        ),
        (
            lambda d: d["nodes"].append(copy.deepcopy(d["nodes"][0])),
            "nodes[1].id",
            "duplicate node id",
        ),
    ],
)
def test_bad_configs_name_the_bad_value(mutate, where, text):
    with pytest.raises(ConfigError) as info:
        parse_config(_bad(mutate))
    assert info.value.where == where
    assert text in str(info.value)


def test_load_errors_name_the_file(tmp_path):
    bad_json = tmp_path / "d.json"
    bad_json.write_text("{nodes: 1}")
    with pytest.raises(ConfigError, match=r"d\.json: config: not valid JSON"):
        load_config(bad_json)
    bad_toml = tmp_path / "d.toml"
    bad_toml.write_text("nodes = [")
    with pytest.raises(ConfigError, match=r"d\.toml: config: not valid TOML"):
        load_config(bad_toml)
    good_but_wrong = tmp_path / "e.json"
    doc = _bad(_set(["nodes", 0, "quotas", 2], 0.25))
    good_but_wrong.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as info:
        load_config(good_but_wrong)
    assert str(info.value).startswith(f"{good_but_wrong}: nodes[0].quotas[2]: ")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")


def test_clipper_models_need_no_ports_and_get_an_rpc_port():
    doc = {
        "models": {"c1": {"backend": "clipper"}},
        "nodes": [{"id": "n", "devices": ["CPU"], "models": ["c1"], "quotas": [1]}],
    }
    dep = parse_config(doc)
    assert dep.rows[0].port is None and dep.rows[0].backend == "clipper"
    assert dep.clipper_rpc_port == 0
    doc["nodes"][0]["ports"] = [5000]
    with pytest.raises(ConfigError, match="containers connect to the dispatcher"):
        parse_config(doc)
