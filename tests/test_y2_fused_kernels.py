"""The DDP hook's fused passes over a bucket in both y2 twins: ``accumulate`` (the step's
gradient, through the momentum correction's velocity or not, into the residual, and the
tau sample in the same pass) and ``compress_with_rest`` (the words at the threshold, each
selected element then moved by the rest of the tau in the same pass).  Both twins give
bit-identical residuals, velocities, samples and words (float32 and float64), the same as
the NumPy passes they replace (the add, the strided sample, ``compress`` then ``apply`` of
the flipped words), and refuse bad arguments with the same errors; the hook's adaptive and
fixed-tau selection is unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from twins import IMPLEMENTATIONS, load_codec

from wirekit.errors import EncodeError
from wirekit.y2 import _pure
from wirekit.y2 import torch as y2_torch

PURE_FIRST = tuple(reversed(IMPLEMENTATIONS))  # WIREKIT_PURE=1 skips at fast, after pure ran
Model = list[tuple[np.ndarray, np.ndarray]]


def _copy(model: Model) -> Model:
    return [(w.copy(), b.copy()) for w, b in model]


def _same(a: Model, b: Model) -> bool:
    return all(
        x.tobytes() == y.tobytes()
        for p, q in zip(a, b, strict=True)
        for x, y in zip(p, q, strict=True)
    )


@st.composite
def models(draw):
    """Residuals, gradients and velocities laid out alike: up to three layers of up to
    5000 weights (over several of the Cython loop's 2048-element chunks) and 40 biases,
    float32 or float64, values spread over magnitudes (some exactly 0)."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    shapes = draw(
        st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 40)), min_size=1, max_size=3)
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def one() -> Model:
        def arr(n: int) -> np.ndarray:
            a = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 3, n)
            a[rng.random(n) < 0.05] = 0
            return a.astype(dtype)

        return [(arr(w), arr(b)) for w, b in shapes]

    return one(), one(), one()


def _reference(residuals: Model, grads: Model, every: int, velocity, momentum: float):
    """The hook's NumPy passes before the fusion: the add, then the strided sample."""
    for k, (pair, gpair) in enumerate(zip(residuals, grads, strict=True)):
        for j in (0, 1):
            grad = gpair[j]
            if velocity is not None:
                speed = velocity[k][j]
                speed *= speed.dtype.type(momentum)
                speed += grad
                grad = speed
            pair[j].__iadd__(grad)
    flat = [a for pair in residuals for a in pair if a.size]
    if not every or not flat:
        return None
    return _strided_sample(residuals, every)


def _strided_sample(residuals: Model, every: int) -> np.ndarray:
    """The tau sample as the hook took it before the fusion: ``|r|`` of every ``every``-th
    element of each non-empty array, concatenated."""
    flat = [a for pair in residuals for a in pair if a.size]
    return np.abs(np.concatenate([a[::every] for a in flat]))


@settings(max_examples=60, deadline=None)
@given(models(), st.integers(0, 40), st.sampled_from([None, 0.0, 0.5, 0.9]))
def test_twins_accumulate_alike_and_as_the_numpy_passes(case, every, momentum):
    residuals, grads, velocity = case
    want_res, want_vel = _copy(residuals), _copy(velocity)
    want = _reference(
        want_res, grads, every, want_vel if momentum is not None else None, momentum or 0
    )
    for impl in PURE_FIRST:
        res, vel = _copy(residuals), _copy(velocity)
        if momentum is None:
            sample = load_codec("y2", impl).accumulate(res, grads, every)
        else:
            sample = load_codec("y2", impl).accumulate(res, grads, every, vel, momentum)
        assert _same(res, want_res), impl
        assert _same(vel, want_vel), impl
        if want is None:
            assert sample.size == 0, impl
        else:
            assert sample.dtype == want.dtype and sample.tobytes() == want.tobytes(), impl


@settings(max_examples=60, deadline=None)
@given(models(), st.floats(1e-6, 2.0), st.sampled_from([0.0, 1e-7, 0.3, 5.0]))
def test_twins_compress_with_rest_as_compress_then_apply(case, threshold, rest):
    residuals = case[0]
    for impl in PURE_FIRST:
        codec = load_codec("y2", impl)
        before = _copy(residuals)
        words = codec.compress(before, threshold)
        if rest and len(words):
            codec.apply(before, words ^ np.uint32(1), rest)
        fused = _copy(residuals)
        got = codec.compress_with_rest(fused, threshold, rest)
        assert got.dtype == np.uint32 and got.tobytes() == words.tobytes(), impl
        assert _same(fused, before), impl
        # the other twin's bytes are the same too
        other = _copy(residuals)
        assert _pure.compress_with_rest(other, threshold, rest).tobytes() == got.tobytes()
        assert _same(other, fused), impl


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_the_fallbacks_float16_strided_and_shared_memory(impl):
    """What the Cython loops do not take (float16, strided views, arrays sharing memory,
    threads asked for) goes the NumPy way: the same results as the pure twin."""
    codec = load_codec("y2", impl)
    rng = np.random.default_rng(7)
    half = [
        (rng.standard_normal(300).astype(np.float16), rng.standard_normal(5).astype(np.float16))
    ]
    grads16 = [(rng.standard_normal(300).astype(np.float16), np.zeros(5, np.float16))]
    a, b = _copy(half), _copy(half)
    assert codec.accumulate(a, grads16, 7).tobytes() == _pure.accumulate(b, grads16, 7).tobytes()
    assert _same(a, b)
    assert (
        codec.compress_with_rest(a, 0.5, 0.25, threads=2).tobytes()
        == _pure.compress_with_rest(b, 0.5, 0.25).tobytes()
    )
    assert _same(a, b)
    base = rng.standard_normal(2000).astype(np.float32)
    grads = [(rng.standard_normal(1000).astype(np.float32), np.zeros(0, np.float32))]
    c = [(base.copy()[::2], np.zeros(0, np.float32))]
    d = [(base.copy()[::2], np.zeros(0, np.float32))]
    assert codec.accumulate(c, grads, 3, _copy(grads), 0.5).tobytes() == (
        _pure.accumulate(d, grads, 3, _copy(grads), 0.5).tobytes()
    )
    assert _same(c, d)
    shared = np.arange(100, dtype=np.float64)
    e = [(shared, np.zeros(0))]
    f = [(shared.copy(), np.zeros(0))]
    assert codec.accumulate(e, [(shared, np.zeros(0))], 10).tobytes() == (
        _pure.accumulate(f, [(f[0][0], np.zeros(0))], 10).tobytes()
    )
    assert e[0][0].tobytes() == f[0][0].tobytes()


def _error(fn):
    try:
        fn()
    except Exception as exc:  # the type and text are what is compared
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize(
    "call",
    [
        lambda c, m: c.compress_with_rest(m, 0.5, -1.0),
        lambda c, m: c.compress_with_rest(m, 0.5, math.nan),
        lambda c, m: c.compress_with_rest(m, 0.5, math.inf),
        lambda c, m: c.compress_with_rest(m, 0.5, 1e39),  # not a finite float32
        lambda c, m: c.compress_with_rest(m, 0.5, "x"),
        lambda c, m: c.compress_with_rest(m, 0.0, 0.1),
        lambda c, m: c.accumulate(m, [(np.zeros(3, np.float32), np.zeros(2, np.float32))], 1),
        lambda c, m: c.accumulate(m, [(np.zeros(4, np.float64), np.zeros(2, np.float32))], 1),
        lambda c, m: c.accumulate(m, [], 1),
        lambda c, m: c.accumulate(m, m, -1),
        lambda c, m: c.accumulate(m, m, True),
        lambda c, m: c.accumulate(m, m, 1, m, math.inf),
        lambda c, m: c.accumulate(m, m, 1, m, "x"),
        lambda c, m: c.accumulate(m, m, 1, [(np.zeros(4, np.float32),)]),
    ],
)
def test_twins_refuse_alike(call):
    errors = {}
    for impl in PURE_FIRST:
        model = [(np.ones(4, np.float32), np.ones(2, np.float32))]
        keep = _copy(model)
        errors[impl] = _error(lambda impl=impl, model=model: call(load_codec("y2", impl), model))
        assert errors[impl] is not None, impl
        assert _same(model, keep), impl  # refused before anything changed
    assert len(set(errors.values())) == 1, errors


def test_a_bad_rest_is_named():
    model = [(np.ones(4, np.float32), np.ones(2, np.float32))]
    with pytest.raises(EncodeError, match="rest"):
        _pure.compress_with_rest(model, 0.5, 1e39)


def test_a_rest_that_rounds_to_zero_moves_nothing():
    for impl in PURE_FIRST:
        codec = load_codec("y2", impl)
        model = [(np.array([1.0, -1.0, 0.1], np.float32), np.zeros(0, np.float32))]
        words = codec.compress_with_rest(model, 0.5, 1e-50)
        assert words.tolist() == [1, 2] and model[0][0].tolist() == [0.5, -0.5, np.float32(0.1)]


# --- the hook: its selection as before the fusion --------------------------------------------


def _hook_reference(state, bucket, grads, n):
    """The hook's ``_add_gradient`` then ``_select`` as they were (NumPy add, strided sample,
    ``compress``, ``apply`` of the flipped words by the rest)."""
    from wirekit import y2

    for offset, layer, seg in bucket.places:
        slot = 0 if seg.is_weight else 1
        grad = grads[offset + seg.start : offset + seg.stop]
        res = bucket.residual[layer][slot]
        if bucket.velocity:
            speed = bucket.velocity[layer][slot]
            speed *= speed.dtype.type(state.momentum)
            speed += grad
            grad = speed
        res += grad
    if state.tau is not None:
        return y2.compress(bucket.residual, state.tau), state.tau
    sample = _strided_sample(bucket.residual, max(1, n // y2_torch.TAU_SAMPLE))
    threshold, tau = y2_torch._adaptive_tau(sample, state.density, state.tau_scale, bucket.dtype)
    words = y2.compress(bucket.residual, threshold)
    if tau > threshold and len(words):
        y2.apply(bucket.residual, words ^ np.uint32(1), tau - threshold)
    return words, tau


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("tau", [None, 0.02])
def test_the_hooks_selection_is_unchanged(dtype, momentum, tau):
    """Several steps of the hook's first passes (adaptive or fixed tau, momentum correction
    on or off) on a bucket of a small MLP, against the passes as they were: the same words,
    taus, residuals and velocities, bit for bit (the active twin)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 200), torch.nn.ReLU(), torch.nn.Linear(200, 5))
    params = list(model.parameters())[::-1]  # DDP's bucket order
    n = sum(p.numel() for p in params)
    rng = np.random.default_rng(3)
    states = []
    for _ in range(2):
        state = y2_torch.Y2HookState(model, tau=tau, momentum=momentum, density=0.05)
        states.append((state, state._bucket(params, dtype)))
    for _step in range(6):
        grads = (rng.standard_normal(n) * 0.01).astype(dtype)
        (new, b_new), (old, b_old) = states
        new._add_gradient(b_new, grads.copy(), sample=True)
        words, got_tau = new._select(b_new, n)
        want_words, want_tau = _hook_reference(old, b_old, grads.copy(), n)
        assert words.tobytes() == want_words.tobytes() and got_tau == want_tau
        assert _same(b_new.residual, b_old.residual)
        assert _same(b_new.velocity, b_old.velocity)
    # a sample not taken with the gradient (a caller that skips it) is taken from the residual
    (new, b_new), (old, b_old) = states
    if tau is None:
        b_new.tau_sample = None
        words, got_tau = new._select(b_new, n)
        b_ref = _copy(b_old.residual)
        want = _pure.compress_with_rest(b_ref, *_threshold_and_rest(old, b_old, n))
        assert words.tobytes() == want.tobytes()


def _threshold_and_rest(state, bucket, n):
    """The threshold and the rest of the tau the hook picks from the residual as it is."""
    sample = _strided_sample(bucket.residual, max(1, n // y2_torch.TAU_SAMPLE))
    threshold, tau = y2_torch._adaptive_tau(sample, state.density, state.tau_scale, bucket.dtype)
    return threshold, tau - threshold
