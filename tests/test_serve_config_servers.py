"""The config of model-server backends (kinds ``oip`` and ``tfserving``): the model keys
``grpc``, ``server_model``, ``load``, ``load_timeout`` (not live settings, refused for a kind
they do not apply to), the node key ``grpc_ports`` (shaped as ``ports``), the admin API's
short form with a ``grpc_port`` per placement, and :func:`server_address`."""

from __future__ import annotations

import json

import pytest

from wirekit.serve.backends.servers import ServerAddress, server_address
from wirekit.serve.config import (
    BACKEND_KINDS,
    LIVE_SETTINGS,
    MODEL_KEYS,
    ConfigError,
    ModelConfig,
    parse_config,
    parse_model,
    parse_settings,
)
from wirekit.serve.record.replicas import model_doc, model_of


def _deployment(model: dict, **node: object) -> dict:
    entry = {"id": "n", "devices": ["CPU", "GPU"], "models": ["m"], "quotas": [0.5, 1]}
    entry["ports"] = [9000, 9001]
    entry.update(node)
    return {"models": {"m": model}, "nodes": [entry]}


def _error(doc: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    return info.value


def test_backend_kinds_name_the_model_servers():
    assert BACKEND_KINDS == ("mip", "kubemo", "clipper", "oip", "tfserving")


def test_defaults():
    model = parse_config(_deployment({"backend": "oip"})).models["m"]
    assert (model.grpc, model.server_model, model.load, model.load_timeout) == (
        False,
        "",
        False,
        60.0,
    )
    assert [row.grpc_port for row in parse_config(_deployment({})).rows] == [None, None]


def test_keys_are_read_for_oip():
    doc = {
        "backend": "oip",
        "grpc": True,
        "server_model": "iris-v2",
        "load": True,
        "load_timeout": 12.5,
    }
    model = parse_config(_deployment(doc)).models["m"]
    assert (model.grpc, model.server_model, model.load, model.load_timeout) == (
        True,
        "iris-v2",
        True,
        12.5,
    )


def test_server_model_applies_to_tfserving():
    model = parse_config(_deployment({"backend": "tfserving", "server_model": "x"})).models["m"]
    assert model.server_model == "x"


@pytest.mark.parametrize(
    ("backend", "key", "value", "kinds"),
    [
        ("mip", "grpc", True, "oip"),
        ("mip", "grpc", False, "oip"),
        ("tfserving", "grpc", True, "oip"),
        ("kubemo", "server_model", "x", "oip and tfserving"),
        ("clipper", "load", True, "oip"),
        ("tfserving", "load", True, "oip"),
        ("mip", "load_timeout", 3, "oip"),
    ],
)
def test_a_key_for_another_kind_is_refused(backend, key, value, kinds):
    model = {"backend": backend, key: value}
    node = {"ports": ["c", "c"]} if backend == "clipper" else {}
    error = _error(_deployment(model, **node))
    assert error.where == f"models.m.{key}"
    assert error.reason == (
        f"applies to {kinds} backends only, and this model's backend is {backend!r}"
    )


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("grpc", 1, "expected true or false, got an integer"),
        ("load", "yes", "expected true or false, got a string"),
        ("server_model", "a/b", "a name cannot hold '/' at 1 (a path separator)"),
        ("server_model", 3, "expected a name (a string), got an integer"),
        ("load_timeout", 0, "must be > 0 and <= 2.592e+06, got 0"),
    ],
)
def test_bad_values_are_refused(key, value, reason):
    error = _error(_deployment({"backend": "oip", key: value}))
    assert (error.where, error.reason) == (f"models.m.{key}", reason)


def test_they_are_not_live_settings():
    assert {"grpc", "server_model", "load", "load_timeout"} <= set(MODEL_KEYS)
    assert not {"grpc", "server_model", "load", "load_timeout"} & set(LIVE_SETTINGS)
    model = ModelConfig(name="m", backend="oip")
    with pytest.raises(ConfigError) as info:
        parse_settings({"server_model": "y"}, model)
    assert info.value.where == "server_model"
    assert info.value.reason.startswith("cannot change while the model is served:")


def test_the_fields_survive_the_change_log():
    dep = parse_config(
        _deployment(
            {"backend": "oip", "grpc": True, "server_model": "s", "load": True},
            grpc_ports=[8001, None],
        )
    )
    model, rows = dep.models["m"], list(dep.rows)
    doc = json.loads(json.dumps(model_doc(model, rows)))
    assert model_of(doc) == (model, rows)


def test_grpc_ports_give_each_row_its_grpc_port():
    dep = parse_config(_deployment({"backend": "oip"}, grpc_ports=[8001, 0]))
    assert [(row.port, row.grpc_port) for row in dep.rows] == [(9000, 8001), (9001, None)]


@pytest.mark.parametrize(
    ("grpc_ports", "where", "reason"),
    [
        ([1], "nodes[0].grpc_ports", "expected 2 values (parallel to quotas), got 1"),
        ("x", "nodes[0].grpc_ports", "expected a list, got a string"),
        ([1, 70000], "nodes[0].grpc_ports[1]", "must be between 0 and 65535, got 70000"),
    ],
)
def test_bad_grpc_ports_are_refused(grpc_ports, where, reason):
    error = _error(_deployment({"backend": "oip"}, grpc_ports=grpc_ports))
    assert (error.where, error.reason) == (where, reason)


@pytest.mark.parametrize("backend", ["mip", "tfserving"])
def test_a_grpc_port_is_for_oip_only(backend):
    error = _error(_deployment({"backend": backend}, grpc_ports=[None, 8001]))
    assert (error.where, error.reason) == (
        "nodes[0].grpc_ports[1]",
        f"only oip backends have a gRPC port, and m's backend is {backend!r}",
    )


def test_placements_take_a_grpc_port():
    devices = {("n", 0): "CPU", ("n", 1): "GPU"}
    doc = {
        "name": "m",
        "model": {"backend": "oip"},
        "placements": [
            {"node": "n", "device": 0, "quota": 0.5, "port": 9000, "grpc_port": 8001},
            {"node": "n", "device": 1, "quota": 1, "port": 9001},
        ],
    }
    _model, rows = parse_model(doc, devices)
    assert [(r.port, r.grpc_port) for r in rows] == [(9000, 8001), (9001, None)]
    doc["model"] = {}
    with pytest.raises(ConfigError) as info:
        parse_model(doc, devices)
    assert info.value.where == "nodes[0].grpc_ports[0]"


def _row(port: int | None, grpc_port: int | None, host: str = "127.0.0.1"):
    doc = _deployment({"backend": "oip"}, endpoint=host, grpc_ports=[grpc_port, None])
    doc["nodes"][0]["ports"] = [port, 9001]
    return parse_config(doc).rows[0]


def test_server_address_over_rest():
    model = ModelConfig(name="m", backend="oip")
    address = server_address(_row(9000, 8001), model)
    assert address == ServerAddress("oip", "127.0.0.1", 9000, 8001, "m")
    assert address.rest_url == "http://127.0.0.1:9000"
    assert address.grpc_target == "127.0.0.1:8001"
    assert server_address(_row(9000, None), model).grpc_port is None


def test_server_address_over_grpc():
    model = ModelConfig(name="m", backend="oip", grpc=True, server_model="s")
    assert server_address(_row(9000, 8001), model) == ServerAddress(
        "oip", "127.0.0.1", 9000, 8001, "s"
    )
    only = server_address(_row(9000, None), model)
    assert only == ServerAddress("oip", "127.0.0.1", None, 9000, "s")
    with pytest.raises(ValueError, match="no REST port"):
        _ = only.rest_url


def test_server_address_brackets_ipv6():
    address = server_address(_row(9000, None, host="::1"), ModelConfig(name="m", backend="oip"))
    assert address.rest_url == "http://[::1]:9000"
    with pytest.raises(ValueError, match="no gRPC port"):
        _ = address.grpc_target
