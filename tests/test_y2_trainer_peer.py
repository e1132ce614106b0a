"""wirekit's delta words against y2's trainer, as a peer (issue 27).

y2's worker (``worker_service/neural_network/model_trainer.py`` of y2_compute_service)
builds each word in ``compress_gradients`` and reads it in
``decompress_and_apply_messages``.  What its code does, as read there:

* for each parameter ``i`` of ``model.parameters()`` and each element ``j`` (C order):
  ``residual += grad``, ``grad = 0``; if ``|residual| >= delta``: the word ``(i << 22) |
  (j << 1) | s`` is sent, with ``s = 1`` and ``residual -= delta``, ``grad = +delta`` when the
  residual is ``>= delta``, else ``s = 0`` and ``residual += delta``, ``grad = -delta``;
  ``optimizer.step()`` then applies the gradient;
* a received word adds ``+delta`` (bit 0 set) or ``-delta`` to the gradient of parameter
  ``word >> 22`` at element ``(word >> 1) & (2**21 - 1)``.

The first tests re-express that loop here (y2 is not on PyPI; its code is not copied) and
run it on a real ``nn.Module`` trained for a few steps: y2's words must apply through
``wirekit.y2.apply`` to exactly the update y2 meant, ``wirekit.y2.compress`` must produce
the same words and residuals, and wirekit's words must decode, by y2's rule, to what wirekit
meant.  The last test runs y2's own ``ModelTrainer`` methods, unchanged, when
``WIREKIT_Y2_TRAINER`` gives the path of ``model_trainer.py`` (or ``WIREKIT_Y2_COMMUNICATION``
that of ``communication.py`` in the same checkout, as for tests/test_y2_service.py).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import queue
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from twins import load_codec

if os.environ.get("WIREKIT_REQUIRE_TORCH"):
    import torch
else:
    torch = pytest.importorskip("torch")

from wirekit import y2

#: y2's threshold (its ``ModelTrainer.delta``, 2.0 upstream): a power of two, exact in float32.
DELTA = 2.0**-4
STEPS = 3
INDEX_MASK = (1 << 21) - 1


def _model() -> torch.nn.Module:
    """Linear layers of the 1-D and 2-D parameters y2's loop handles; the first has no
    bias, so parameter indices and module layers differ (W0, W1, b1, W2, b2)."""
    torch.manual_seed(27)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 5, bias=False),
        torch.nn.Tanh(),
        torch.nn.Linear(5, 4),
        torch.nn.Tanh(),
        torch.nn.Linear(4, 3),
    )


def _batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    for _ in range(STEPS):
        yield torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)


def _y2_compress(params: list[torch.Tensor], residuals: list[torch.Tensor]) -> bytes:
    """y2's ``compress_gradients``, re-expressed: element by element in torch's float32,
    the gradient moved into the residual and replaced by the ±delta sent (or 0)."""
    message = bytearray()
    for i, param in enumerate(params):
        grad, residual = param.grad.view(-1), residuals[i].view(-1)  # C order, as y2's
        for j in range(grad.numel()):  # first * second_dim + second
            residual[j] += grad[j]
            grad[j] = 0.0
            if abs(residual[j]) < DELTA:
                continue
            positive = bool(residual[j] >= DELTA)
            residual[j] -= DELTA if positive else -DELTA
            grad[j] = DELTA if positive else -DELTA
            message += ((i << 22) | (j << 1) | int(positive)).to_bytes(4, "big")
    return bytes(message)


def _y2_decompress(grads: list[torch.Tensor], message: bytes) -> None:
    """y2's ``decompress_and_apply_messages`` for one message, re-expressed."""
    for k in range(0, len(message), 4):
        word = int.from_bytes(message[k : k + 4], "big")
        grad = grads[word >> 22].view(-1)
        grad[(word >> 1) & INDEX_MASK] += DELTA if word & 1 else -DELTA


def _numpy(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    return [t.detach().numpy().copy() for t in tensors]


@pytest.fixture(params=["fast", "pure"])
def codec(request):
    return load_codec("y2", request.param)


def test_y2_trainer_words_apply_through_wirekit_as_y2_meant(codec):
    model = _model()
    params = list(model.parameters())
    residuals = [p.detach().clone() for p in params]  # y2 starts them at the parameters
    optimizer = torch.optim.SGD(params, lr=0.05)
    seen_params: set[int] = set()
    for inputs, targets in _batches():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        grads_in = _numpy([p.grad for p in params])
        wk_residuals = [r + g for r, g in zip(_numpy(residuals), grads_in, strict=True)]

        message = _y2_compress(params, residuals)  # y2's words; grads now hold its update
        meant = _numpy([p.grad for p in params])
        words = codec.from_wire(message)
        assert codec.decode(b"\0\0\0\1" + len(message).to_bytes(4, "big") + message) == (
            y2.Delta(words)
        )
        update = [np.zeros_like(m) for m in meant]
        codec.apply(y2.parameter_pairs(update), words, DELTA)
        for got, want in zip(update, meant, strict=True):
            assert np.array_equal(got, want)  # every word lands on its element, its sign

        # wirekit as the compressing peer: the same words, byte for byte, the same residuals
        assert codec.to_wire(codec.compress(y2.parameter_pairs(wk_residuals), DELTA)) == message
        for got, want in zip(wk_residuals, _numpy(residuals), strict=True):
            assert np.array_equal(got, want)
        seen_params |= {int(w) >> 22 for w in words}
        optimizer.step()  # y2 then trains on its update
    # every parameter was addressed, W1 (index 1: the (weights, biases) view's "layer 0
    # biases") included
    assert seen_params == set(range(len(params)))


def test_wirekit_words_decode_by_y2s_rule_to_what_wirekit_meant(codec):
    model = _model()
    params = list(model.parameters())
    inputs, targets = next(_batches())
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    residuals = [(p.grad * 8).numpy().copy() for p in params]  # some cross DELTA, both signs
    before = [r.copy() for r in residuals]
    words = codec.compress(y2.parameter_pairs(residuals), DELTA)
    assert len(words) > 10

    grads = [torch.zeros_like(p) for p in params]
    _y2_decompress(grads, codec.to_wire(words))
    for got, r in zip(grads, before, strict=True):
        meant = np.where(np.abs(r) >= DELTA, np.sign(r) * DELTA, 0).astype(np.float32)
        assert np.array_equal(got.numpy(), meant)  # +tau where r was positive, -tau negative
    signs = [int(w & 1) for w in words]
    assert 0 < sum(signs) < len(signs)  # both signs were exercised


def test_old_layout_words_convert_by_the_documented_flip():
    # the old layout: layer 3, weight (bit 22 set), index 42, -tau (bit 0 set)
    old = (3 << 23) | (1 << 22) | (42 << 1) | 1
    new = old ^ y2.OLD_LAYOUT_FLIP
    assert y2.word_fields(new) == {
        "param": 6,
        "layer": 3,
        "weight": True,
        "index": 42,
        "positive": False,
    }
    assert new ^ y2.OLD_LAYOUT_FLIP == old


# ------------------------------------------------------------------ y2's own trainer code


def _trainer_path() -> Path | None:
    given = os.environ.get("WIREKIT_Y2_TRAINER")
    if given:
        return Path(given)
    comm = os.environ.get("WIREKIT_Y2_COMMUNICATION")
    if comm:  # worker_service/communications/communication.py, same checkout
        path = Path(comm).resolve().parents[1] / "neural_network" / "model_trainer.py"
        return path if path.is_file() else None
    return None


TRAINER = _trainer_path()


def _load_trainer_class(path: Path):
    spec = importlib.util.spec_from_file_location("y2_model_trainer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():  # its `dimensions is 1` (a SyntaxWarning since 3.8)
        warnings.simplefilter("ignore", SyntaxWarning)
        spec.loader.exec_module(module)
    return module.ModelTrainer


@pytest.mark.skipif(
    TRAINER is None,
    reason="set WIREKIT_Y2_TRAINER to y2's worker_service/neural_network/model_trainer.py "
    "(y2's worker is not on PyPI)",
)
def test_y2s_own_trainer_methods_against_wirekit(codec, monkeypatch):
    trainer_class = _load_trainer_class(TRAINER)
    monkeypatch.setattr(trainer_class, "delta", DELTA)
    model = _model()
    params = list(model.parameters())
    # the trainer's state, as its __init__ sets it, without its data loaders and CTC loss
    trainer = trainer_class.__new__(trainer_class)
    trainer.model = model
    trainer.residuals = [p.detach().clone() for p in params]
    trainer.list_parameters = None
    trainer.log = logging.getLogger("y2-trainer")
    optimizer = torch.optim.SGD(params, lr=0.05)
    for inputs, targets in _batches():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        grads_in = _numpy([p.grad for p in params])
        wk_residuals = [r + g for r, g in zip(_numpy(trainer.residuals), grads_in, strict=True)]
        message = bytes(trainer.compress_gradients())  # y2's real code
        meant = _numpy([p.grad for p in params])
        update = [np.zeros_like(m) for m in meant]
        codec.apply(y2.parameter_pairs(update), codec.from_wire(message), DELTA)
        assert all(np.array_equal(a, b) for a, b in zip(update, meant, strict=True))
        assert codec.to_wire(codec.compress(y2.parameter_pairs(wk_residuals), DELTA)) == message
        optimizer.step()

    # wirekit's words through y2's real decoder
    residuals = [(p.detach() * 4).numpy().copy() for p in params]
    before = [r.copy() for r in residuals]
    words = codec.compress(y2.parameter_pairs(residuals), DELTA)
    for p in params:
        p.grad = torch.zeros_like(p)
    inbox: queue.Queue[bytes] = queue.Queue()
    inbox.put(codec.to_wire(words))
    trainer.decompress_and_apply_messages(inbox)
    for p, r in zip(params, before, strict=True):
        meant = np.where(np.abs(r) >= DELTA, np.sign(r) * DELTA, 0).astype(np.float32)
        assert np.array_equal(p.grad.numpy(), meant)
