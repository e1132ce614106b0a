"""The models metadata (wirekit.serve.control.catalog): quotas, the sharing rules, models added and
removed, subscribers, and the router following every change."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from wirekit.serve.config import DeviceRow, ModelConfig, parse_config
from wirekit.serve.control.catalog import Catalog, CatalogChange, CatalogError
from wirekit.serve.dispatch.router import NoDevice, Router


def row(model, node, device, dtype, quota, port=9000):
    return DeviceRow(model, node, device, dtype, "127.0.0.1", port, quota, "mip")


def two_models() -> Catalog:
    """n1: CPU 0 (m1 0.5, m2 0.25), GPU 1 (m2 whole)."""
    return Catalog(
        {"m1": ModelConfig("m1"), "m2": ModelConfig("m2", apps=("app2",))},
        [
            row("m1", "n1", 0, "CPU", 0.5, 9001),
            row("m2", "n1", 0, "CPU", 0.25, 9002),
            row("m1", "n1", 1, "GPU", 0.0),
            row("m2", "n1", 1, "GPU", 1.0, 9003),
        ],
    )


def test_reading() -> None:
    cat = two_models()
    assert cat.models() == ["m1", "m2"]
    assert cat.model("m2").apps == ("app2",)
    with pytest.raises(KeyError):
        cat.model("nope")
    assert [r.key for r in cat.rows("m1")] == ["n1/0/m1", "n1/1/m1"]  # quota 0 included
    assert len(cat.rows()) == 4
    assert cat.quota("n1", 0, "m2") == 0.25
    assert cat.quota("n1", 1, "m1") == 0.0
    assert cat.free_share("n1", 0) == pytest.approx(0.25)
    assert cat.free_share("n1", 1) == 0.0
    with pytest.raises(KeyError):
        cat.free_share("n9", 0)
    assert cat.devices() == {("n1", 0): "CPU", ("n1", 1): "GPU"}
    assert cat.app_models() == {"m1": "m1", "m2": "m2", "app2": "m2"}
    assert cat.version == 0


def test_from_a_config_document() -> None:
    dep = parse_config(
        {
            "nodes": [
                {
                    "id": "n1",
                    "devices": ["CPU", "GPU"],
                    "models": ["a", "b"],
                    "quotas": [0.5, 0.5, 1, 0],
                    "ports": [1, 2, 3, None],
                }
            ]
        }
    )
    cat = Catalog(dep.models, dep.rows)
    assert sorted(cat.rows(), key=str) == sorted(dep.rows, key=str)
    assert cat.free_share("n1", 0) == 0.0


def test_set_quota_and_subscribers() -> None:
    cat = two_models()
    seen: list[CatalogChange] = []
    cat.subscribe(seen.append)
    cat.set_quota("n1", 0, "m1", 0.75)
    assert cat.quota("n1", 0, "m1") == 0.75
    assert cat.free_share("n1", 0) == 0.0
    assert cat.version == 1
    assert seen == [CatalogChange("quota", "m1", "n1", 0, 0.5, 0.75, 1)]
    cat.set_quota("n1", 0, "m1", 0.75)  # no change: nothing told, no new version
    assert cat.version == 1 and len(seen) == 1
    cat.set_quota("n1", 1, "m2", 0)
    cat.set_quota("n1", 1, "m1", 1)
    assert [c.version for c in seen] == [1, 2, 3]
    assert seen[-1] == CatalogChange("quota", "m1", "n1", 1, 0.0, 1.0, 3)


@pytest.mark.parametrize(
    ("node", "device", "model", "share", "message"),
    [
        ("n1", 0, "m1", 1.5, "n1/0/m1: a share is from 0 to 1, got 1.5"),
        ("n1", 0, "m1", -0.1, "n1/0/m1: a share is from 0 to 1, got -0.1"),
        ("n1", 0, "m1", float("nan"), "n1/0/m1: a share is a number from 0 to 1, got nan"),
        ("n1", 0, "m1", True, "n1/0/m1: a share is a number from 0 to 1, got True"),
        (
            "n1",
            0,
            "m1",
            0.8,
            "n1/0/m1: cannot give 0.8 of n1/0 (CPU): 0.75 is free (held by m2 0.25)",
        ),
        ("n1", 1, "m1", 0.5, "n1/1/m1: a GPU is given 0 or 1 of itself, got 0.5"),
        ("n1", 1, "m1", 1, "n1/1/m1: cannot give 1 of n1/1 (GPU): 0 is free (held by m2 1)"),
        ("n1", 7, "m1", 0.1, "n1/7/m1: 'm1' has no backend on that device"),
        ("n1", 0, "zz", 0.1, "unknown model 'zz'"),
    ],
)
def test_set_quota_refusals(node, device, model, share, message) -> None:
    cat = two_models()
    seen: list[CatalogChange] = []
    cat.subscribe(seen.append)
    with pytest.raises(CatalogError) as info:
        cat.set_quota(node, device, model, share)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, ValueError)
    assert seen == [] and cat.version == 0
    assert cat.quota("n1", 0, "m1") == 0.5


def test_a_share_needs_a_backend_port() -> None:
    cat = Catalog(
        {"m": ModelConfig("m")}, [row("m", "n", 0, "CPU", 1), row("m", "n", 1, "CPU", 0, None)]
    )
    with pytest.raises(CatalogError, match=r"n/1/m: no backend port for this device"):
        cat.set_quota("n", 1, "m", 0.5)
    cat.set_quota("n", 1, "m", 0)  # 0 needs none
    assert cat.version == 0


def test_cpu_shares_sum_to_one_exactly() -> None:
    cat = Catalog(
        {f"m{k}": ModelConfig(f"m{k}") for k in range(10)},
        [row(f"m{k}", "n", 0, "CPU", 0.1) for k in range(10)],
    )
    assert cat.free_share("n", 0) == 0.0  # 0.1 ten times: within the float tolerance
    with pytest.raises(CatalogError, match=r"cannot give 0.2 of n/0 \(CPU\): 0.1 is free"):
        cat.set_quota("n", 0, "m0", 0.2)


def test_add_model() -> None:
    cat = two_models()
    seen: list[CatalogChange] = []
    cat.subscribe(seen.append)
    m3 = ModelConfig("m3")
    cat.add_model(m3, [row("m3", "n1", 0, "CPU", 0.25), row("m3", "n2", 0, "GPU", 1)])
    assert cat.models() == ["m1", "m2", "m3"]
    assert cat.free_share("n1", 0) == 0.0
    assert cat.free_share("n2", 0) == 0.0  # a new device
    assert seen == [CatalogChange("add", "m3", None, None, None, None, 1)]


@pytest.mark.parametrize(
    ("model", "rows", "message"),
    [
        (
            "m3",
            [("m3", "n1", 0, "CPU", 0.5)],
            "n1/0/m3: cannot give 0.5 of n1/0 (CPU): 0.25 is free (held by m1 0.5, m2 0.25)",
        ),
        ("m3", [("m3", "n1", 1, "GPU", 1)], "n1/1/m3: cannot give 1 of n1/1 (GPU): 0 is free"),
        ("m3", [("m3", "n1", 1, "CPU", 0.1)], "n1/1/m3: device n1/1 is a GPU, not a CPU"),
        ("m1", [("m1", "n2", 0, "CPU", 0.1)], "model 'm1' already exists"),
        ("app2", [("app2", "n2", 0, "CPU", 0.1)], "model 'app2': 'app2' is already an app of"),
        ("m3", [], "model 'm3': no device given"),
        ("m3", [("m3", "n1", 0, "CPU", 0)], "model 'm3': no device has a quota > 0"),
        ("m3", [("m1", "n2", 0, "CPU", 0.1)], "n2/0/m1: a row of 'm1', not of 'm3'"),
        (
            "m3",
            [("m3", "n2", 0, "CPU", 0.6), ("m3", "n2", 0, "CPU", 0.1)],
            "n2/0/m3: the model is given that device twice",
        ),
    ],
)
def test_add_model_refusals(model, rows, message) -> None:
    cat = two_models()
    with pytest.raises(CatalogError) as info:
        cat.add_model(ModelConfig(model), [row(*r) for r in rows])
    assert str(info.value).startswith(message)
    assert cat.models() == ["m1", "m2"] and cat.version == 0


def test_add_model_app_clash() -> None:
    cat = two_models()
    with pytest.raises(CatalogError, match="app 'app2' already names 'm2'"):
        cat.add_model(ModelConfig("m3", apps=("app2",)), [row("m3", "n2", 0, "CPU", 1)])


def test_remove_model_releases_its_quotas() -> None:
    cat = two_models()
    seen: list[CatalogChange] = []
    cat.subscribe(seen.append)
    assert cat.remove_model("m2").name == "m2"
    assert cat.models() == ["m1"]
    assert cat.free_share("n1", 0) == 0.5
    assert cat.free_share("n1", 1) == 1.0  # the GPU is free again, still known
    assert seen == [CatalogChange("remove", "m2", None, None, None, None, 1)]
    with pytest.raises(KeyError):
        cat.remove_model("m2")
    # the released GPU can be given whole to the model that remains
    cat.set_quota("n1", 1, "m1", 1)
    assert cat.quota("n1", 1, "m1") == 1.0


def test_initial_rows_are_checked() -> None:
    with pytest.raises(CatalogError, match="cannot give"):
        Catalog(
            {"a": ModelConfig("a"), "b": ModelConfig("b")},
            [row("a", "n", 0, "CPU", 0.7), row("b", "n", 0, "CPU", 0.7)],
        )
    with pytest.raises(CatalogError, match="unknown model 'c'"):
        Catalog({}, [row("c", "n", 0, "CPU", 0.7)])


def test_every_subscriber_is_told_even_if_one_fails() -> None:
    cat = two_models()
    told: list[int] = []

    def broken(change: CatalogChange) -> None:
        raise RuntimeError("subscriber bug")

    cat.subscribe(broken)
    cat.subscribe(lambda c: told.append(c.version))
    with pytest.raises(RuntimeError, match="subscriber bug"):
        cat.set_quota("n1", 0, "m1", 0.1)
    assert told == [1] and cat.quota("n1", 0, "m1") == 0.1


# --- the router follows the catalog ---------------------------------------------------------


def split(router: Router, model: str, n: int = 4000) -> Counter:
    return Counter(router.choose(model).key for _ in range(n))


def test_router_follows_quota_changes() -> None:
    cat = two_models()
    router = Router.following(cat, rng=random.Random(1))
    assert router.probabilities("m2") == pytest.approx({"n1/0/m2": 0.2, "n1/1/m2": 0.8})
    cat.set_quota("n1", 1, "m2", 0)  # the GPU taken away: one device left, no draw
    assert router.rows("m2") == [cat.rows("m2")[0]]
    assert set(split(router, "m2", 100)) == {"n1/0/m2"}
    cat.set_quota("n1", 1, "m1", 1)  # m1 gets the GPU: 0.5 CPU vs 1 GPU
    assert router.probabilities("m1") == pytest.approx({"n1/0/m1": 1 / 3, "n1/1/m1": 2 / 3})
    counts = split(router, "m1")
    assert 0.28 < counts["n1/0/m1"] / 4000 < 0.39
    cat.set_quota("n1", 0, "m1", 0)
    cat.set_quota("n1", 1, "m1", 0)
    with pytest.raises(NoDevice, match="no device has a quota > 0"):
        router.choose("m1")


def test_router_follows_add_and_remove() -> None:
    cat = two_models()
    router = Router.following(cat, rng=random.Random(2))
    with pytest.raises(NoDevice):
        router.choose("m3")
    cat.add_model(ModelConfig("m3"), [row("m3", "n2", 0, "CPU", 0.5)])
    assert router.choose("m3").key == "n2/0/m3"
    router.fail(cat.rows("m2")[1])
    assert router.backed_off() == ["n1/1/m2"]
    cat.remove_model("m2")
    assert "m2" not in router.models
    assert router.backed_off() == []  # its back-offs are forgotten with it
    with pytest.raises(NoDevice):
        router.choose("m2")
