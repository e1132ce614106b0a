"""The ``door`` label of the request series (issue 36): every front door's requests are
counted in the same ``wirekit_serve_requests_total`` and
``wirekit_serve_request_duration_seconds`` families, told apart by ``door``; the per-device
figures ``/stats`` reads are every door's together; the MIP lane's answers count on
``door="mip"`` (in process, no sockets: the real-process checks are in
tests/test_serve_metrics.py)."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from wirekit.serve.control.metrics import (
    DOOR_CLIPPER,
    DOOR_HTTP,
    DOOR_MIP,
    DOOR_OIP_GRPC,
    DOOR_OIP_REST,
    DOOR_TFSERVING,
    DOORS,
    METRIC_NAMES,
    Metrics,
)


def _samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples named ``name`` of ``metrics``' exposition: sorted labels -> value."""
    out = {}
    for family in text_string_to_metric_families(metrics.prometheus().decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_the_door_label_values_are_the_documented_ones():
    assert DOORS == ("mip", "http", "clipper", "tfserving", "oip-rest", "oip-grpc")
    assert METRIC_NAMES["wirekit_serve_requests_total"][1] == ("model", "device", "door", "state")
    assert METRIC_NAMES["wirekit_serve_request_duration_seconds"][1] == (
        "model",
        "device",
        "door",
    )


def test_each_door_has_its_own_series_and_the_device_figures_add_them_up():
    metrics = Metrics(["m"])
    for door, n in ((DOOR_HTTP, 3), (DOOR_CLIPPER, 2), (DOOR_OIP_REST, 1), (DOOR_OIP_GRPC, 4)):
        for _ in range(n):
            metrics.arrived("m")
            metrics.finished("m", "ok", 0.002, "n/0/m", door)
    metrics.arrived("m")
    metrics.finished("m", "failed", 0.5, None, DOOR_TFSERVING)
    metrics.arrived("m")
    metrics.finished("m", "ok", 0.001, "n/0/m")  # no door named: the JSON predict's

    requests = _samples(metrics, "wirekit_serve_requests_total")
    by_door = Counter()
    for labels, value in requests.items():
        by_door[dict(labels)["door"]] += value
    assert by_door == {"http": 4, "clipper": 2, "oip-rest": 1, "oip-grpc": 4, "tfserving": 1}
    key = (("device", "n/0"), ("door", "oip-grpc"), ("model", "m"), ("state", "ok"))
    assert requests[key] == 4
    failed = (("device", "none"), ("door", "tfserving"), ("model", "m"), ("state", "failed"))
    assert requests[failed] == 1
    counts = _samples(metrics, "wirekit_serve_request_duration_seconds_count")
    assert counts[(("device", "n/0"), ("door", "clipper"), ("model", "m"))] == 2
    # the per-device figures (/stats, the history) are every door's together
    series = metrics.series[("m", "n/0")]
    assert series.states == {"ok": 11}
    assert series.duration.count == 11
    assert abs(series.duration.sum - (10 * 0.002 + 0.001)) < 1e-12
    assert metrics.snapshot()["models"]["m"]["statuses"] == {"ok": 11, "failed": 1}


def test_the_mip_lane_counts_on_the_mip_door_and_lost_requests_on_none():
    metrics = Metrics(["m"])
    t_in = 10.0
    answers = [("a", "n/0/m", t_in), ("b", "n/0/m", t_in), ("c", "cache", t_in)]
    metrics.arrived("m")
    metrics.lane_answered("m", 10.004, answers, 0.012, 0.004, 0.004, [0.003, 0.003])
    metrics.lane_answered("m", 10.005, answers[:1], 0.005, 0.005, 0.005, [0.004])
    metrics.ended_lost("m", 2)
    requests = _samples(metrics, "wirekit_serve_requests_total")
    assert requests[(("device", "n/0"), ("door", DOOR_MIP), ("model", "m"), ("state", "ok"))] == 3
    assert requests[(("device", "cache"), ("door", DOOR_MIP), ("model", "m"), ("state", "ok"))] == 1
    assert requests[(("device", "none"), ("door", ""), ("model", "m"), ("state", "lost"))] == 2
    backend = _samples(metrics, "wirekit_serve_backend_duration_seconds_count")
    assert backend == {(("device", "n/0"), ("model", "m")): 3}  # no door: per attempt
    assert metrics.series[("m", "n/0")].states == {"ok": 3}
