"""Routing by quota (chi-square over 10,000 requests), back-off, and the response cache."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from wirekit.serve.config import parse_config
from wirekit.serve.dispatch.cache import ResponseCache, digest
from wirekit.serve.dispatch.router import NoDevice, Router

N = 10_000
#: chi-square critical values at p = 0.001 for 1 and 2 degrees of freedom
CHI2_CRIT = {1: 10.828, 2: 13.816}


def chi_square(observed: Counter, expected_p: dict[str, float], n: int) -> float:
    return sum((observed[k] - n * p) ** 2 / (n * p) for k, p in expected_p.items())


def deployment(devices, quotas, models=("m",)):
    ports = [9000 + k if q else None for k, q in enumerate(quotas)]
    return parse_config(
        {
            "nodes": [
                {
                    "id": "n",
                    "devices": devices,
                    "models": list(models),
                    "quotas": quotas,
                    "ports": ports,
                }
            ]
        }
    )


def split(router: Router, model: str, n: int = N) -> Counter:
    return Counter(router.choose(model).key for _ in range(n))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_70_30_split_passes_chi_square(seed):
    dep = deployment(["CPU", "CPU"], [0.7, 0.3])
    router = Router(dep.rows, rng=random.Random(seed))
    counts = split(router, "m")
    assert set(counts) == {"n/0/m", "n/1/m"}
    assert sum(counts.values()) == N
    stat = chi_square(counts, {"n/0/m": 0.7, "n/1/m": 0.3}, N)
    assert stat < CHI2_CRIT[1], (counts, stat)
    # the test has teeth: the same counts are far off an even split
    assert chi_square(counts, {"n/0/m": 0.5, "n/1/m": 0.5}, N) > 100 * CHI2_CRIT[1]


def test_quota_zero_devices_never_get_a_request():
    # CPU0: m 0.7, x 0.3; CPU1: m 0, x 1 ... device 1 never serves m, device 0's x share is 0.3
    dep = deployment(["CPU", "CPU", "CPU"], [0.7, 0.3, 0, 1, 0.3, 0], models=("m", "x"))
    router = Router(dep.rows, rng=random.Random(7))
    m = split(router, "m")
    x = split(router, "x")
    assert set(m) == {"n/0/m", "n/2/m"}
    assert set(x) == {"n/0/x", "n/1/x"}
    assert chi_square(m, {"n/0/m": 0.7, "n/2/m": 0.3}, N) < CHI2_CRIT[1]
    assert chi_square(x, {"n/0/x": 0.3 / 1.3, "n/1/x": 1 / 1.3}, N) < CHI2_CRIT[1]


def test_a_gpu_at_100_percent_takes_the_models_gpu_share():
    # the design's node: CPU half for m1, GPU 1 all m1, GPU 2 none of m1
    dep = deployment(["CPU", "GPU", "GPU"], [0.5, 0.5, 1, 0, 0, 1], models=("m1", "m2"))
    router = Router(dep.rows, rng=random.Random(11))
    counts = split(router, "m1")
    assert set(counts) == {"n/0/m1", "n/1/m1"}
    assert chi_square(counts, {"n/0/m1": 1 / 3, "n/1/m1": 2 / 3}, N) < CHI2_CRIT[1]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_device_is_out_of_rotation_for_the_backoff():
    dep = deployment(["CPU", "CPU", "CPU"], [0.5, 0.3, 0.2])
    clock = FakeClock()
    router = Router(dep.rows, backoff=5.0, rng=random.Random(3), clock=clock)
    rows = {r.key: r for r in router.rows("m")}
    router.fail(rows["n/0/m"])
    assert router.backed_off() == ["n/0/m"]
    counts = split(router, "m", 2000)
    assert set(counts) == {"n/1/m", "n/2/m"}
    # the others share its part in proportion to their quotas (0.3 : 0.2)
    assert chi_square(counts, {"n/1/m": 0.6, "n/2/m": 0.4}, 2000) < CHI2_CRIT[1]
    clock.now += 5.01
    assert router.backed_off() == []
    assert set(split(router, "m", 2000)) == {"n/0/m", "n/1/m", "n/2/m"}


def test_exclusion_and_everything_backed_off():
    dep = deployment(["CPU", "CPU"], [0.5, 0.5])
    clock = FakeClock()
    router = Router(dep.rows, backoff=5.0, rng=random.Random(3), clock=clock)
    a, b = router.rows("m")
    assert {router.choose("m", [a.key]).key for _ in range(50)} == {b.key}
    with pytest.raises(NoDevice, match="every device"):
        router.choose("m", [a.key, b.key])
    with pytest.raises(NoDevice, match="unknown model"):
        router.choose("nope")
    router.fail(a)
    clock.now += 1
    router.fail(b)
    # all out: the one coming back first is used rather than failing the request
    assert router.choose("m").key == a.key
    router.succeed(a)
    assert router.backed_off() == [b.key]


def test_cache_lru_ttl_and_counters():
    clock = FakeClock()
    cache: ResponseCache[str] = ResponseCache(max_entries=2, ttl=10.0, clock=clock)
    k1, k2, k3 = (digest(b) for b in (b"one", b"two", b"three"))
    assert cache.get("m", k1) is None
    cache.put("m", k1, "r1", 2)
    cache.put("m", k2, "r2", 2)
    assert cache.get("m", k1) == "r1"  # k1 is now the most recent
    assert cache.get("other", k1) is None  # keyed by model too
    cache.put("m", k3, "r3", 2)  # evicts k2, the least recently used
    assert cache.get("m", k2) is None
    assert cache.get("m", k3) == "r3"
    clock.now += 10.5
    assert cache.get("m", k1) is None  # expired
    assert cache.stats() == {
        "hits": 2,
        "misses": 4,
        "entries": 1,
        "bytes": 2,
        "evictions": 1,
        "models": {"m": {"hits": 2, "misses": 3}, "other": {"hits": 0, "misses": 1}},
    }


def test_cache_byte_bound_and_disabled():
    cache: ResponseCache[str] = ResponseCache(max_entries=100, ttl=10.0, max_bytes=10)
    for k in range(5):
        cache.put("m", bytes([k]), str(k), 4)
    assert len(cache) == 2 and cache.bytes == 8
    cache.put("m", b"big", "x", 11)  # larger than the whole cache: not kept
    assert cache.get("m", b"big") is None
    off: ResponseCache[str] = ResponseCache(max_entries=0)
    off.put("m", b"k", "v", 1)
    assert not off.enabled and len(off) == 0
    assert digest(b"abc") == digest(bytearray(b"abc")) != digest(b"abd")
