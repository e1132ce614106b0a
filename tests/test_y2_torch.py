"""wirekit.y2.torch: the DDP hook against a NumPy reference of y2's semantics on 2 real gloo
processes, the layer layout, the cluster roles, and training end to end.

CI installs ``wirekit[torch]`` and sets ``WIREKIT_REQUIRE_TORCH=1``: there a missing torch is
an error, not a skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

if os.environ.get("WIREKIT_REQUIRE_TORCH"):
    import torch
else:
    torch = pytest.importorskip("torch")

import y2_torch_workers as workers
from strategies import y2_word

from wirekit import y2
from wirekit.y2 import sums as sum_blocks
from wirekit.y2.torch import (
    CAPACITY_MIN,
    CAPACITY_SLACK,
    TAU_SCALE,
    Segment,
    Y2HookState,
    y2_layout,
)

#: The small model's parameters (in ``parameters()`` order) and their y2 (layer, is_weight):
#: Linear(5, 4) is layer 0, the bias-less Linear(4, 3) layer 1, Gain's ``gain`` layer 2.
SMALL_LAYOUT = [(0, True, 20), (0, False, 4), (1, True, 12), (2, True, 3)]


def _reference_tau(residuals: list[np.ndarray], density: float | None, fixed: float) -> tuple:
    """(threshold, tau) of a rank's step: the fixed tau for both, or the ``1 - density``
    quantile of ``|residual|`` and ``TAU_SCALE ×`` the mean ``|residual|`` of the elements
    reaching it."""
    if density is None:
        return fixed, fixed
    sample = np.abs(np.concatenate(residuals))
    k = int(len(sample) * (1 - density))
    threshold = float(np.partition(sample, k)[k])
    mean = float(sample[sample >= threshold].mean(dtype=np.float64))
    return threshold, max(threshold, TAU_SCALE * mean)  # tau_scale's default


def _reference_compress(residuals: list[np.ndarray], threshold: float, tau: float) -> np.ndarray:
    """y2's compression, written out: per layer its weights then its biases, index
    ascending; |r| >= threshold sends one word of ±tau (bit 0 set for +tau), r moves by
    the threshold, then by the rest of the tau."""
    t, extra = np.float32(threshold), np.float32(tau - threshold)
    words = []
    order = sorted(
        range(len(SMALL_LAYOUT)), key=lambda i: (SMALL_LAYOUT[i][0], not SMALL_LAYOUT[i][1])
    )
    for i in order:
        layer, is_weight, _n = SMALL_LAYOUT[i]
        r = residuals[i]
        for idx in range(r.size):
            if r[idx] >= t:
                words.append(y2_word(layer, is_weight, idx, 1))
                r[idx] -= t
                if tau > threshold:
                    r[idx] -= extra
            elif r[idx] <= -t:
                words.append(y2_word(layer, is_weight, idx, 0))
                r[idx] += t
                if tau > threshold:
                    r[idx] += extra
    return np.array(words, dtype=np.uint32)


def _reference_apply(update: list[np.ndarray], words: np.ndarray, tau: float) -> None:
    slot = {(layer, w): i for i, (layer, w, _n) in enumerate(SMALL_LAYOUT)}
    t = np.float32(tau)
    for word in words.tolist():
        arr = update[slot[(word >> 23, not (word >> 22) & 1)]]  # an even parameter: weights
        arr[(word >> 1) & (2**21 - 1)] += t if word & 1 else -t


def _check_against_reference(results, world=2, capacity=None, density=None):
    """``capacity``: the adaptive tau's block size in words (None: fixed tau, two
    all-gathers); words beyond it stay in the residual.  ``density``: the adaptive tau's
    (None: the tau is fixed)."""
    residuals = [[np.zeros(n, np.float32) for *_, n in SMALL_LAYOUT] for _ in range(world)]
    expected_bytes = 0
    for step in range(len(results[0]["steps"])):
        per_rank = [results[r]["steps"][step] for r in range(world)]
        update = [np.zeros(n, np.float32) for *_, n in SMALL_LAYOUT]
        for r in range(world):
            exchange = per_rank[r]["exchange"]
            taus = {float(t) for parts in exchange.values() for _w, t in [parts[r]]}
            assert len(taus) == 1  # one bucket, or a fixed tau
            tau = taus.pop()
            for res, grad in zip(residuals[r], per_rank[r]["local"], strict=True):
                res += grad
            threshold, want_tau = _reference_tau(residuals[r], density, tau)
            assert tau == want_tau
            words = _reference_compress(residuals[r], threshold, tau)
            if capacity is not None:  # not sent: back into the residual
                _reference_apply(residuals[r], words[capacity:], tau)
                words = words[:capacity]
            _reference_apply(update, words, tau)
            for other in range(world):  # every rank received exactly these words from r
                sent = np.concatenate(
                    [parts[r][0] for parts in per_rank[other]["exchange"].values()]
                )
                assert np.array_equal(np.sort(sent), np.sort(words))
        for arr in update:
            arr /= np.float32(world)
        for r in range(world):
            for got, want in zip(per_rank[r]["averaged"], update, strict=True):
                assert np.array_equal(got, want)
        for parts in per_rank[0]["exchange"].values():
            longest = capacity if capacity is not None else max(len(w) for w, _t in parts)
            expected_bytes += (world - 1) * (16 + 4 * longest)
    for r in range(world):
        for got, want in zip(results[r]["residuals"], residuals[r], strict=True):
            assert np.array_equal(got, want)
    assert results[0]["bytes_sent"] == expected_bytes
    assert all(r["bytes_counted"] == r["bytes_sent"] for r in results)


def test_hook_equals_numpy_reference_fixed_tau_many_buckets(tmp_path):
    # a tiny bucket cap: several buckets per step; a fixed tau that leaves residuals behind
    results = workers.run("hook_steps", tmp_path, tau=0.8, steps=4, bucket_cap_mb=1e-5)
    # DDP starts with one bucket and rebuilds them, by the cap, after the first step
    assert len(results[0]["steps"][-1]["exchange"]) > 1
    assert results[0]["words_sent"] > 0
    assert any(np.any(r != 0) for r in results[0]["residuals"])  # error feedback kept some
    _check_against_reference(results)


def test_hook_equals_numpy_reference_adaptive_tau(tmp_path):
    results = workers.run("hook_steps", tmp_path, tau=None, steps=3, bucket_cap_mb=25.0)
    (exchange,) = results[0]["steps"][0]["exchange"].values()
    assert exchange[0][1] != exchange[1][1]  # each rank picked its own tau
    # density 0.25 of 39 elements: about 10 words per rank and step
    assert all(8 <= len(w) <= 12 for w, _t in exchange)
    assert results[0]["capacity"] == 29  # 1.25 × 0.25 × 39, rounded up, + 16
    _check_against_reference(results, capacity=29, density=0.25)


def test_adaptive_tau_words_beyond_the_block_stay_in_the_residual(tmp_path):
    # a block of 3 words where about 10 are due: the first 3 (in word order) go
    results = workers.run(
        "hook_steps", tmp_path, tau=None, steps=3, bucket_cap_mb=25.0, capacity=(0.0, 3)
    )
    assert results[0]["capacity"] == 3
    assert all(
        len(w) == 3 for step in results[0]["steps"] for parts in step["exchange"].values()
        for w, _t in parts
    )  # fmt: skip
    _check_against_reference(results, capacity=3, density=0.25)


def test_a_steps_words_decode_as_y2_deltas(tmp_path):
    results = workers.run("hook_steps", tmp_path, tau=0.8, steps=1, bucket_cap_mb=25.0)
    (exchange,) = results[0]["steps"][0]["exchange"].values()
    capture = tmp_path / "step.bin"
    capture.write_bytes(b"".join(y2.encode(y2.Delta(w)) for w, _t in exchange))
    out = subprocess.run(
        [sys.executable, "-m", "wirekit.cli", "decode", "--proto", "y2", "--json", str(capture)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    decoded = [json.loads(line) for line in out.splitlines()]
    assert [d["kind"] for d in decoded] == ["delta", "delta"]
    for d, (w, _t) in zip(decoded, exchange, strict=True):
        assert [int(x["word"], 16) for x in d["words"]] == w.tolist()
        assert {(x["layer"], x["weight"]) for x in d["words"]} <= {
            (layer, w) for layer, w, _n in SMALL_LAYOUT
        }


# --- the reduce-scatter exchange (the default) -------------------------------------------------

SMALL_ELEMENTS = sum(n for *_, n in SMALL_LAYOUT)


def _compress_order() -> list[tuple[int, int]]:
    """(parameter, element) in the order ``y2.compress`` emits words: by layer, weights
    before biases, index ascending."""
    order = sorted(
        range(len(SMALL_LAYOUT)), key=lambda i: (SMALL_LAYOUT[i][0], not SMALL_LAYOUT[i][1])
    )
    return [(i, k) for i in order for k in range(SMALL_LAYOUT[i][2])]


def _dense_signs(
    residual: list[np.ndarray], threshold: float, tau: float, capacity: int | None
) -> list[np.ndarray]:
    """A rank's step written out densely: +1 / -1 where ``|r| >= threshold`` (r moves by
    the threshold, then by the rest of the tau), at most ``capacity`` of them (an even
    spread in word order; the others get their tau back)."""
    t, extra, back = np.float32(threshold), np.float32(tau - threshold), np.float32(tau)
    hits = [(i, k) for i, k in _compress_order() if abs(residual[i][k]) >= t]
    kept = hits
    if capacity is not None and len(hits) > capacity:
        kept = [hits[j * len(hits) // capacity] for j in range(capacity)]
    signs = [np.zeros(r.size, np.int64) for r in residual]
    for i, k in hits:
        sign = 1 if residual[i][k] >= t else -1
        residual[i][k] -= t * np.float32(sign)
        if tau > threshold:
            residual[i][k] -= extra * np.float32(sign)
        if (i, k) in kept:
            signs[i][k] = sign
        else:
            residual[i][k] += back * np.float32(sign)
    return signs


def _signs_of(words: np.ndarray) -> list[np.ndarray]:
    """What ``words`` add up to per element of the small model (applied with tau 1)."""
    model = [
        (np.zeros(20, np.float64), np.zeros(4, np.float64)),
        (np.zeros(12, np.float64), np.zeros(0, np.float64)),
        (np.zeros(3, np.float64), np.zeros(0, np.float64)),
    ]
    y2.apply(model, words, 1.0)
    return [model[0][0], model[0][1], model[1][0], model[2][0]]


def _nearest(sums: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Each sum as the magnitude of ``table`` (or 0) nearest to it, with its sign (the lower
    one on a tie; the largest beyond the table)."""
    candidates = np.concatenate([[0.0], table])
    index = np.argmin(np.abs(np.abs(sums)[:, None] - candidates[None, :]), axis=1)
    return np.sign(sums) * candidates[index]


def _check_reduce_scatter(results, world: int, adaptive: bool) -> None:
    """Every rank's averaged gradients are the dense sum of every rank's signs × its tau,
    rounded to the nearest magnitude of the step's table (whole taus with one tau for all),
    / world; what the table could not say went into the owner's residual; each rank's
    words reached the owners exactly once; the bytes add up."""
    residuals = [[np.zeros(n, np.float32) for *_, n in SMALL_LAYOUT] for _ in range(world)]
    capacity = (
        min(SMALL_ELEMENTS, int(np.ceil(CAPACITY_SLACK * 0.25 * SMALL_ELEMENTS)) + CAPACITY_MIN)
        if adaptive
        else None
    )
    edges = [r * SMALL_ELEMENTS // world for r in range(world + 1)]
    expected_bytes = [0] * world
    rounded = 0
    for step in range(len(results[0]["steps"])):
        per_rank = [results[r]["steps"][step] for r in range(world)]
        ((bucket, parts),) = per_rank[0]["exchange"].items()
        taus = [t for _w, t in parts]
        unit = min(taus)
        table = sum_blocks.magnitudes(taus)
        assert table.size == (world if len(set(taus)) == 1 else sum_blocks.LEVELS)
        total = [np.zeros(n, np.float64) for *_, n in SMALL_LAYOUT]
        for r in range(world):
            assert [t for _w, t in per_rank[r]["exchange"][bucket]] == taus
            for res, grad in zip(residuals[r], per_rank[r]["local"], strict=True):
                res += grad
            threshold, want_tau = _reference_tau(residuals[r], 0.25 if adaptive else None, taus[r])
            assert taus[r] == want_tau
            signs = _dense_signs(residuals[r], threshold, taus[r], capacity)
            for acc, s in zip(total, signs, strict=True):
                acc += s * (taus[r] / unit)
            # rank r's words, as the owners received them: each exactly once
            got = [per_rank[j]["exchange"][bucket][r][0] for j in range(world)]
            sums = [np.zeros(n) for *_, n in SMALL_LAYOUT]
            for words in got:
                for acc, s in zip(sums, _signs_of(words), strict=True):
                    acc += s
            assert all(np.array_equal(a, s) for a, s in zip(sums, signs, strict=True))
            assert sum(len(w) for w in got) == sum(int(np.abs(s).sum()) for s in signs)
        whole = [_nearest(t, table) for t in total]
        # what the table does not say: into the residual of the element's owner
        offset = 0
        for i in per_rank[0]["bucket"]:
            for k in range(SMALL_LAYOUT[i][2]):
                owner = int(np.searchsorted(edges, offset + k, side="right")) - 1
                left = (total[i][k : k + 1] - whole[i][k : k + 1]) * unit
                residuals[owner][i][k : k + 1] += left
                rounded += bool(left[0])
            offset += SMALL_LAYOUT[i][2]
        want = [w * (unit / world) for w in whole]
        for r in range(world):
            for got_grad, want_grad in zip(per_rank[r]["averaged"], want, strict=True):
                assert np.array_equal(got_grad, want_grad.astype(np.float32))
        # bytes: the counts and tau, the words for other ranges, the sums block
        received = [[len(w) for w, _t in per_rank[j]["exchange"][bucket]] for j in range(world)]
        for r in range(world):
            size = edges[r + 1] - edges[r]
            own = received[r][r]
            sent = sum(received[j][r] for j in range(world))
            bound = sum_blocks.block_size(size, min(size, sum(received[r])), table.size)
            expected_bytes[r] += (
                (world - 1) * 8 * (world + 1) + 4 * (sent - own) + (world - 1) * bound
            )
    for r in range(world):
        for got, want_res in zip(results[r]["residuals"], residuals[r], strict=True):
            assert np.array_equal(got, want_res)
        assert results[r]["bytes_sent"] == results[r]["bytes_counted"] == expected_bytes[r]
    assert (rounded > 0) == adaptive  # own taus: some sums were between magnitudes


@pytest.mark.parametrize("tau", [0.8, None], ids=["fixed-tau", "adaptive-tau"])
def test_reduce_scatter_equals_the_dense_sum_on_4_ranks(tmp_path, tau):
    results = workers.run(
        "hook_steps", tmp_path, world=4, tau=tau, steps=3, bucket_cap_mb=25.0,
        exchange="reduce-scatter",
    )  # fmt: skip
    assert all(r["words_sent"] > 0 for r in results)
    # every rank received words from several ranks: the ranges were really scattered
    (parts,) = results[0]["steps"][-1]["exchange"].values()
    assert sum(len(w) > 0 for w, _t in parts) >= 2
    _check_reduce_scatter(results, world=4, adaptive=tau is None)


def test_bytes_per_rank_stay_flat_with_reduce_scatter_and_grow_with_all_gather(tmp_path):
    """Counted at the collectives (what each rank hands them for the other ranks), a model
    of 19,210 parameters, default settings, 2 and 8 real gloo processes."""
    runs = {}
    for world in (2, 8):
        (tmp_path / str(world)).mkdir()
        results = workers.run(
            "byte_scaling", tmp_path / str(world), world=world, steps=3, hidden=256
        )
        for r in results:  # the hook's own counter says what the collectives were handed
            for exchange in ("reduce-scatter", "all-gather"):
                assert r[exchange]["counted"] == r[exchange]["state"], r
        runs[world] = {
            k: max(r[k]["counted"] if isinstance(r[k], dict) else r[k] for r in results)
            for k in ("reduce-scatter", "all-gather", "allreduce")
        }
    fewer = {w: {k: runs[w]["allreduce"] / runs[w][k] for k in runs[w]} for w in runs}
    # all-gather: each rank receives every other rank's words, (W - 1) blocks
    assert runs[8]["all-gather"] >= 6 * runs[2]["all-gather"], runs
    assert fewer[8]["all-gather"] < 10, fewer
    # reduce-scatter: the words go to one owner each, the sums come back as a bitmap and
    # 5 bits per nonzero sum: ×(W - 1) / W (1/2 -> 7/8) and more nonzero sums as more
    # ranks' words meet in a range, bounded by the range; far from all-gather's ×(W - 1)
    assert runs[8]["reduce-scatter"] <= 3 * runs[2]["reduce-scatter"], runs
    assert fewer[8]["reduce-scatter"] >= 10, fewer


@pytest.mark.parametrize(
    ("corrupt", "texts"),
    [
        (
            "count",
            ["rank[1].counts[0] at byte 0: 1000000 words for a range of 19 elements"] * 2,
        ),
        (
            "word",
            [
                "rank[1].words[0] at byte 0: word 0xffffffff addresses no element",
                "rank[0].sums at byte 0: that rank refused the words it received",
            ],
        ),
        (
            "order",
            [
                "rank[1].words[1] at byte 4: element",
                "rank[0].sums at byte 0: that rank refused the words it received",
            ],
        ),
        ("sums", ["rank[1].sums at byte 0: 1000 nonzero sums do not fit"] * 2),
        ("tau", ["rank[1].tau at byte 16: 1e+308 makes the sum of the ranks' taus too large"] * 2),
    ],
)
def test_reduce_scatter_refuses_a_peers_bad_exchange_on_every_rank(tmp_path, corrupt, texts):
    results = workers.run("bad_reduce_scatter_peer", tmp_path, corrupt=corrupt)
    assert all(r is not None and text in r for r, text in zip(results, texts, strict=True)), results


# --- the layout -----------------------------------------------------------------------------


def test_layout_of_the_small_model():
    model = workers.small_model()
    layout = y2_layout(model)
    got = [
        (seg.layer, seg.is_weight, seg.stop) for p in model.parameters() for seg in layout[id(p)]
    ]
    assert got == SMALL_LAYOUT


def test_layout_splits_a_parameter_beyond_2_21_elements():
    big = torch.nn.Embedding(2**21 + 5, 1)
    model = torch.nn.Sequential(big, torch.nn.Linear(1, 2))
    layout = y2_layout(model)
    assert layout[id(big.weight)] == [
        Segment(0, True, 0, 2**21),
        Segment(1, True, 2**21, 2**21 + 5),
    ]
    lin = model[1]
    assert layout[id(lin.weight)] == [Segment(2, True, 0, 2)]
    assert layout[id(lin.bias)] == [Segment(2, False, 0, 2)]


def test_layout_refuses_more_than_512_layers():
    model = torch.nn.Sequential(*[torch.nn.Linear(1, 1) for _ in range(513)])
    with pytest.raises(ValueError, match=r"needs 513 layers .* delta words address 512"):
        Y2HookState(model)
    y2_layout(torch.nn.Sequential(*list(model)[:512]))  # 512 fit


def test_tied_and_frozen_parameters_get_one_address():
    a = torch.nn.Linear(3, 3)
    b = torch.nn.Linear(3, 3)
    b.weight = a.weight  # tied
    frozen = torch.nn.Linear(2, 2)
    frozen.requires_grad_(False)
    layout = y2_layout(torch.nn.Sequential(a, b, frozen))
    assert layout == {
        id(a.weight): [Segment(0, True, 0, 9)],
        id(a.bias): [Segment(0, False, 0, 3)],
        id(b.bias): [Segment(1, False, 0, 3)],
    }


@pytest.mark.parametrize(("kwargs", "text"), [({"tau": 0.0}, "tau"), ({"density": 0}, "density")])
def test_state_checks_its_arguments(kwargs, text):
    with pytest.raises(ValueError, match=text):
        Y2HookState(torch.nn.Linear(2, 2), **kwargs)


# --- training end to end (the example, under torchrun) --------------------------------------

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "y2_ddp_train.py")
#: Seconds the 2-process training run (three trainings) may take.
TRAIN_TIMEOUT = 300
TRAIN_EPOCHS = 10


def test_training_with_the_hook_on_label_sorted_digits(tmp_path):
    """digits sorted by label over 2 nodes: without an exchange a node learns its half of the
    classes only; with y2's it learns them all, for far fewer bytes than all-reduce."""
    log = tmp_path / "run.y2"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", EXAMPLE, "--json", "--epochs", str(TRAIN_EPOCHS), "--split", "sorted",
            "--hooks", "local,allreduce,y2", "--y2-log", str(log),
        ],
        capture_output=True, text=True, timeout=TRAIN_TIMEOUT, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    local, plain, hooked = report["runs"]
    assert (local["hook"], plain["hook"], hooked["hook"]) == ("local", "allreduce", "y2")
    assert plain["accuracy"] > 0.9, report  # digits is learnt
    assert local["accuracy"] < 0.6, report  # a node alone sees 5 of the 10 digits
    # the exchange carries the other node's classes (10 epochs: 0.93 against all-reduce's
    # 0.97 when measured; README, "y2 on PyTorch", has the longer runs)
    assert hooked["accuracy"] > 0.85 and hooked["accuracy"] > local["accuracy"] + 0.3, report
    assert hooked["bytes_per_step"] * 10 <= plain["bytes_per_step"], report
    # rank 0's y2 log: NodeIndex per node, Runtime per node and epoch, Finished per node
    messages = []
    data = log.read_bytes()
    pos = 0
    while pos < len(data):
        msg, pos = y2.decode_prefix(data, pos)
        messages.append(msg)
    assert messages[:2] == [y2.NodeIndex(0, 2), y2.NodeIndex(1, 2)]
    runtimes = messages[2:-2]
    assert len(runtimes) == TRAIN_EPOCHS * 2 and all(isinstance(m, y2.Runtime) for m in runtimes)
    # 1348 training samples (digits less its test quarter), 674 a node, 32 a step
    assert [r.sample_count for r in runtimes] == [674 // 32 * 32] * (TRAIN_EPOCHS * 2)
    assert [m.loss_milli for m in runtimes] == [x for epoch in hooked["runtimes"] for x in epoch]
    assert messages[-2:] == [y2.Finished(), y2.Finished()]


#: Seconds the 8-process run (two trainings of 30 epochs) may take on 2 shared cores.
EIGHT_RANKS_TIMEOUT = 900


def test_eight_ranks_keep_all_reduces_accuracy_for_a_tenth_of_the_bytes():
    """Issue 27's bar at the defaults, on the hardest case the benchmark has: 8 ranks,
    digits sorted by label (a rank sees one or two digits), 30 epochs, seed 1.  Training is
    deterministic for a seed (gloo on the CPU, a deterministic hook), so this is the
    benchmark's number, not a sample of it (0.987 there, all-reduce 0.984).  With the
    threshold as the words' tau and the sums in whole units of the mean tau (before issue
    27's fix) it fails: 0.960 against all-reduce's 0.980 in the same run."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "8", EXAMPLE, "--json", "--epochs", "30", "--split", "sorted", "--seeds", "1",
            "--hooks", "allreduce,y2",
        ],
        capture_output=True, text=True, timeout=EIGHT_RANKS_TIMEOUT, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    plain, hooked = json.loads(out.stdout.strip().splitlines()[-1])["runs"]
    assert (plain["hook"], hooked["hook"]) == ("allreduce", "y2")
    assert plain["accuracy"] > 0.97, plain
    assert hooked["accuracy"] >= plain["accuracy"] - 0.01, (hooked, plain)
    assert hooked["bytes_per_step"] * 10 <= plain["bytes_per_step"], (hooked, plain)


# --- the cluster roles ----------------------------------------------------------------------


def test_cluster_roles_on_two_gloo_processes(tmp_path):
    log = tmp_path / "roles.y2"
    n = 1001  # odd: the shards still tile 0..n
    results = workers.run("cluster_roles", tmp_path, log_path=str(log), n=n)
    assert [r["node"] for r in results] == [y2.NodeIndex(0, 2), y2.NodeIndex(1, 2)]
    assert [r["shard"] for r in results] == [(0, 500), (500, 1001)]
    expected = [
        [y2.Runtime(500, 0, 100 * epoch, 7, 0), y2.Runtime(501, 1, 100 * epoch + 1, 7, -5)]
        for epoch in range(2)
    ]
    assert results[0]["reports"] == expected  # gathered to rank 0 ...
    assert results[1]["reports"] == [None, None]  # ... only
    out = subprocess.run(
        [sys.executable, "-m", "wirekit.cli", "decode", "--proto", "y2", "--json", str(log)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    decoded = [json.loads(line) for line in out.splitlines()]
    assert [d["kind"] for d in decoded] == ["node_index"] * 2 + ["runtime"] * 4 + [
        "delta",
        "finished",
        "finished",
    ]
    assert [(d["node_id"], d["node_count"]) for d in decoded[:2]] == [(0, 2), (1, 2)]
    assert [d["training_ms"] for d in decoded[2:6]] == [0, 1, 100, 101]
    assert [d["loss_milli"] for d in decoded[2:6]] == [0, -5, 0, -5]
    assert [int(w["word"], 16) for w in decoded[6]["words"]] == [0x01C00055, 0]


@pytest.mark.parametrize(
    ("tau", "corrupt", "value", "text"),
    [
        (0.5, 0, 1e12, "rank[1].words at byte 0: 1000000000000.0 words for at most 39"),
        (0.5, 0, 2.5, "rank[1].words at byte 0: 2.5 words"),
        (0.5, 1, float("nan"), "rank[1].tau at byte 8: nan is not a positive tau"),
        # the adaptive tau's one block (capacity 19 for 39 elements at density 0.05)
        (None, 0, 20, "rank[1].words at byte 0: 20.0 words for at most 19"),
        (None, 3, -1, "rank[1].tau at byte 8: nan is not a positive tau"),  # all-ones high half
        (0.5, 1, 1e300, "rank[1].tau at byte 8: 1e+300 makes the sum of the ranks' taus too large"),
    ],
)
def test_a_peers_bad_sizes_are_refused_before_allocating(tmp_path, tau, corrupt, value, text):
    results = workers.run("bad_peer", tmp_path, corrupt=corrupt, value=value, tau=tau)
    # DDP wraps the hook's exception in its own RuntimeError; the text is ours
    assert all(r is not None and text in r for r in results), results
