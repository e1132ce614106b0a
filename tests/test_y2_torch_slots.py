"""wirekit.y2.torch's ``slots`` exchange (the default: two collectives per bucket) on real
gloo processes: the same update as the three-collective ``reduce-scatter`` while the slots
hold every word, nothing lost when they do not, and a peer's malformed slot or sums block
refused with :class:`DecodeError` on every rank before anything is allocated for it."""

from __future__ import annotations

import os

import numpy as np
import pytest

if os.environ.get("WIREKIT_REQUIRE_TORCH"):
    import torch  # noqa: F401
else:
    pytest.importorskip("torch")

import y2_torch_workers as workers

from wirekit.y2.torch import EXCHANGES, Y2HookState


def test_slots_is_the_default_exchange():
    import torch

    assert EXCHANGES[0] == "slots"
    assert Y2HookState(torch.nn.Linear(2, 2)).exchange == "slots"


@pytest.mark.parametrize("tau", [0.8, None], ids=["fixed-tau", "adaptive-tau"])
def test_slots_give_the_reduce_scatters_update(tmp_path, tau):
    """4 ranks, 3 steps of the small model: every slot and block holds all its words and
    sums, so the averaged gradients, the residuals and the words each owner received are
    those of the three-collective exchange, bit for bit; the bytes counted at the
    collectives are the hook's own count."""
    runs = {}
    for exchange in ("reduce-scatter", "slots"):
        (tmp_path / exchange).mkdir()
        runs[exchange] = workers.run(
            "hook_steps", tmp_path / exchange, world=4, tau=tau, steps=3, bucket_cap_mb=25.0,
            exchange=exchange,
        )  # fmt: skip
    for old, new in zip(runs["reduce-scatter"], runs["slots"], strict=True):
        assert new["words_sent"] == old["words_sent"]
        assert new["bytes_sent"] == new["bytes_counted"]
        for step_old, step_new in zip(old["steps"], new["steps"], strict=True):
            for a, b in zip(step_old["averaged"], step_new["averaged"], strict=True):
                assert np.array_equal(a, b)
            (parts_old,) = step_old["exchange"].values()
            (parts_new,) = step_new["exchange"].values()
            for (w_old, t_old), (w_new, t_new) in zip(parts_old, parts_new, strict=True):
                assert t_old == t_new and np.array_equal(w_old, w_new)
        for a, b in zip(old["residuals"], new["residuals"], strict=True):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("tau", [0.3, None], ids=["fixed-tau", "adaptive-tau"])
def test_words_and_sums_beyond_the_slots_wait_in_the_residuals(tmp_path, tau):
    """Slots of one word after the first step: what did not go is in the residuals, so on
    every element the ranks' residuals plus ``world ×`` the averaged updates add up to the
    ranks' gradients."""
    world, steps = 4, 4
    results = workers.run(
        "y2_torch_slots_workers:tight_slots", tmp_path, world=world, steps=steps, tau=tau
    )
    grads = sum(np.concatenate(s["local"]) for r in results for s in r["steps"])
    moved = world * sum(np.concatenate(s["averaged"]) for s in results[0]["steps"])
    kept = sum(np.concatenate(r["residuals"]) for r in results)
    np.testing.assert_allclose(kept + moved, grads, rtol=1e-4, atol=1e-4)
    # the later steps sent at most a word per owner
    sent = [len(w) for w, _t in results[0]["steps"][-1]["exchange"][0]]
    assert max(sent) <= 1, sent


@pytest.mark.parametrize(
    ("corrupt", "texts"),
    [
        (
            "count",
            [
                "rank[1].slot at byte 0: 1000000 words for a slot of 19",
                "rank[0].sums at byte 0: that rank refused the words it received",
            ],
        ),
        (
            "next",
            [
                "rank[1].slot at byte 4: a next slot of 1000000 words for at most 19",
                "rank[0].sums at byte 0: that rank refused the words it received",
            ],
        ),
        (
            "tau",
            [
                "rank[1].tau at byte 8: nan is not a positive tau",
                "rank[0].sums at byte 0: that rank refused the words it received",
            ],
        ),
        (
            "word",
            [
                "rank[1].words[0] at byte 0: word 0xffffffff addresses no element",
                "rank[0].sums at byte 0: that rank refused the words it received",
            ],
        ),
        ("sums", ["rank[1].sums at byte 0: 1000 nonzero sums do not fit 20 elements"] * 2),
        ("bound", ["rank[1].sums.next at byte 0: 4000000000 bytes for a block of 8 to"] * 2),
    ],
)
def test_a_peers_bad_slot_or_block_is_refused_on_every_rank(tmp_path, corrupt, texts):
    results = workers.run("y2_torch_slots_workers:bad_slots_peer", tmp_path, corrupt=corrupt)
    # DDP wraps the hook's exception in its own RuntimeError; the text is ours
    assert all(r is not None and text in r for r, text in zip(results, texts, strict=True)), results
