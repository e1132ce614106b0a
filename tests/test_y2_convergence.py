"""wirekit.y2.torch: the hook's convergence options (``warmup_steps``, ``momentum``,
``momentum_masking``, ``tau_scale``) on real gloo processes, against NumPy's bookkeeping.

CI installs ``wirekit[torch]`` and sets ``WIREKIT_REQUIRE_TORCH=1``: there a missing torch is
an error, not a skip.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

if os.environ.get("WIREKIT_REQUIRE_TORCH"):
    import torch
else:
    torch = pytest.importorskip("torch")

import y2_torch_workers as workers

from wirekit.y2.torch import TAU_SCALE, WARMUP_STEPS, Y2HookState

#: the per-rank body of the multi-process tests (tests/y2_convergence_workers.py)
OPTION_STEPS = "y2_convergence_workers:option_steps"

#: The small model's elements (tests/y2_torch_workers.py's small_model: 20 + 4 + 12 + 3).
ELEMENTS = 39


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"warmup_steps": -1}, "y2: warmup_steps must be a whole number >= 0, got -1"),
        ({"warmup_steps": 1.5}, "y2: warmup_steps must be a whole number >= 0, got 1.5"),
        ({"warmup_steps": True}, "y2: warmup_steps must be a whole number >= 0, got True"),
        ({"momentum": -0.1}, "y2: momentum must be in [0, 1), got -0.1"),
        ({"momentum": 1.0}, "y2: momentum must be in [0, 1), got 1.0"),
        ({"momentum": math.nan}, "y2: momentum must be in [0, 1), got nan"),
        ({"tau_scale": 0.5}, "y2: tau_scale must be a finite number >= 1, got 0.5"),
        ({"tau_scale": math.inf}, "y2: tau_scale must be a finite number >= 1, got inf"),
        ({"tau_scale": math.nan}, "y2: tau_scale must be a finite number >= 1, got nan"),
    ],
)
def test_options_are_checked(kwargs, text):
    with pytest.raises(ValueError) as info:
        Y2HookState(torch.nn.Linear(2, 2), **kwargs)
    assert str(info.value) == text


def test_defaults():
    state = Y2HookState(torch.nn.Linear(2, 2))
    assert (state.warmup_steps, state.momentum, state.momentum_masking, state.tau_scale) == (
        WARMUP_STEPS,
        0.0,
        False,
        TAU_SCALE,
    )
    Y2HookState(torch.nn.Linear(2, 2), warmup_steps=0, momentum=0.0, tau_scale=1.0)


def test_warm_up_sends_dense_steps_then_words(tmp_path):
    """Two warm-up steps: an all-reduce of the gradients (the exact mean, no words, the
    residual empty, a ring all-reduce's bytes), then the words of y2's scheme."""
    world = 2
    results = workers.run(
        OPTION_STEPS,
        tmp_path,
        world=world,
        steps=4,
        warmup_steps=2,
        density=0.25,
    )
    for step in range(4):
        per_rank = [results[r]["steps"][step] for r in range(world)]
        mean = [
            sum(per_rank[r]["local"][i] for r in range(world)) / world
            for i in range(len(per_rank[0]["local"]))
        ]
        for rank in per_rank:
            dense = step < 2
            words = [w for ranks in rank["words"].values() for w, _t in ranks]
            assert (len(words) == 0) == dense, step
            same = all(
                np.allclose(got, want, rtol=1e-6, atol=1e-7)
                for got, want in zip(rank["averaged"], mean, strict=True)
            )
            assert same == dense, step
            if dense:
                assert all(not r.any() for r in rank["residuals"])
                assert rank["bytes"] == 2 * (world - 1) * ELEMENTS * 4 // world
            else:
                assert rank["bytes"] == (world - 1) * 4 * (4 + math.ceil(1.25 * 0.25 * 39) + 16)
    for r in range(world):  # the dense steps' bytes in the total too
        assert results[r]["bytes_sent"] == sum(s["bytes"] for s in results[r]["steps"])


@pytest.mark.parametrize("masking", [False, True])
def test_momentum_correction_bookkeeping(tmp_path, masking):
    """Momentum correction with a fixed tau: ``u = 0.9 u + g``, ``r += u``, every element
    with ``|r| >= tau`` sends a word and moves by tau; with masking its ``u`` is zeroed."""
    world, tau, momentum = 2, 0.5, 0.9
    results = workers.run(
        OPTION_STEPS,
        tmp_path,
        world=world,
        steps=4,
        tau=tau,
        momentum=momentum,
        momentum_masking=masking,
    )
    for rank, result in enumerate(results):
        u = [np.zeros_like(g) for g in result["steps"][0]["local"]]
        r = [np.zeros_like(g) for g in u]
        for step in result["steps"]:
            sent = 0
            for i, g in enumerate(step["local"]):
                u[i] = np.float32(momentum) * u[i] + g
                r[i] = r[i] + u[i]
                selected = np.abs(r[i]) >= np.float32(tau)
                sent += int(selected.sum())
                r[i][selected] -= np.sign(r[i][selected]) * np.float32(tau)
                if masking:
                    u[i][selected] = 0
                np.testing.assert_allclose(step["velocities"][i], u[i], rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(step["residuals"][i], r[i], rtol=1e-5, atol=1e-6)
                u[i], r[i] = step["velocities"][i], step["residuals"][i]  # no drift
            # all-gather: every rank's words; this rank's own are its sent ones
            assert sum(len(ranks[rank][0]) for ranks in step["words"].values()) == sent
            assert sent > 0


def test_a_dense_step_with_momentum_correction_is_momentum_sgds(tmp_path):
    """During the warm-up with momentum correction the hook hands DDP the ranks' mean
    velocity (what momentum SGD applies), and keeps the velocity."""
    world, momentum = 2, 0.9
    results = workers.run(
        OPTION_STEPS,
        tmp_path,
        world=world,
        steps=3,
        warmup_steps=3,
        momentum=momentum,
    )
    velocities = [[np.zeros_like(g) for g in results[r]["steps"][0]["local"]] for r in range(2)]
    for step in range(3):
        for r in range(world):
            for i, g in enumerate(results[r]["steps"][step]["local"]):
                velocities[r][i] = np.float32(momentum) * velocities[r][i] + g
        for r in range(world):
            got = results[r]["steps"][step]
            for i, v in enumerate(got["velocities"]):
                np.testing.assert_allclose(v, velocities[r][i], rtol=1e-5, atol=1e-6)
                want = (velocities[0][i] + velocities[1][i]) / world
                np.testing.assert_allclose(got["averaged"][i], want, rtol=1e-5, atol=1e-6)
