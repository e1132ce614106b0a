"""y2 kernels: the Cython twin equals the NumPy reference (and the construct word spec) on
generated words and models, edge values included; bad input raises and changes nothing."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from strategies import y2_word as _word
from strategies import y2_words
from twins import load_codec

from wirekit.errors import DecodeError, EncodeError
from wirekit.y2 import _pure, spec

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOAT_DTYPES = [np.float32, np.float64]


def _fast():
    return load_codec("y2", "fast")


def _strided(arr: np.ndarray, data) -> np.ndarray:
    """``arr`` as it is, or as a non-contiguous view holding the same values."""
    if not data.draw(st.booleans(), label="non-contiguous"):
        return arr
    holder = np.zeros((len(arr), 2), dtype=arr.dtype)
    holder[:, 0] = arr
    return holder[:, 0]


# --- pack / unpack / wire -------------------------------------------------------------------


@st.composite
def fields(draw):
    n = draw(st.integers(0, 60))
    edge = st.sampled_from
    layer = draw(st.lists(st.one_of(st.integers(0, 511), edge([0, 511])), min_size=n, max_size=n))
    weight = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    index = draw(
        st.lists(st.one_of(st.integers(0, 2**21 - 1), edge([0, 2**21 - 1])), min_size=n, max_size=n)
    )
    positive = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    return layer, weight, index, positive


@given(fields(), st.data())
def test_pack_equals_reference_and_construct(y2_codec, f, data):
    layer, weight, index, positive = f
    arrays = []
    for values, top in zip(f, (511, 1, 2**21 - 1, 1), strict=True):
        dtypes = [d for d in INT_DTYPES if np.iinfo(d).max >= top]
        if top == 1:
            dtypes.append(np.bool_)
        dtype = data.draw(st.sampled_from(dtypes))
        arrays.append(_strided(np.array(values, dtype=dtype), data))
    words = y2_codec.pack(*arrays)
    assert words.dtype == np.uint32 and words.shape == (len(layer),)
    assert np.array_equal(words, _pure.pack(layer, weight, index, positive))
    built = b"".join(
        spec.LAYER_WORD.build(dict(layer=a, bias=not b, index=c, positive=bool(d)))
        for a, b, c, d in zip(layer, weight, index, positive, strict=True)
    )
    assert y2_codec.to_wire(words) == built
    # y2's reading of the same bits: parameter 2 * layer for a weight, 2 * layer + 1 a bias
    as_y2 = b"".join(
        spec.WORD.build(dict(param=2 * a + (0 if b else 1), index=c, positive=bool(d)))
        for a, b, c, d in zip(layer, weight, index, positive, strict=True)
    )
    assert built == as_y2


@given(st.lists(y2_words, max_size=80), st.data())
def test_unpack_equals_reference_and_inverts_pack(y2_codec, values, data):
    words = _strided(np.array(values, dtype=np.uint32), data)
    got = y2_codec.unpack(words)
    ref = _pure.unpack(words)
    for a, b in zip(got, ref, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert np.array_equal(y2_codec.pack(*got), words)
    for k, w in enumerate(values):
        c = spec.LAYER_WORD.parse(int(w).to_bytes(4, "big"))
        assert (c.layer, not c.bias, c.index, c.positive) == tuple(int(x[k]) for x in got)
        y = spec.WORD.parse(int(w).to_bytes(4, "big"))
        assert (y.param, y.index, y.positive) == (2 * c.layer + c.bias, c.index, c.positive)


@given(st.lists(y2_words, max_size=80), st.data())
def test_wire_round_trip_equals_reference(y2_codec, values, data):
    words = _strided(np.array(values, dtype=np.uint32), data)
    wire = y2_codec.to_wire(words)
    assert wire == _pure.to_wire(words) == np.array(values, dtype=">u4").tobytes()
    back = y2_codec.from_wire(wire)
    assert back.dtype == np.uint32 and back.dtype.isnative and np.array_equal(back, words)
    # big-endian views are accepted as they are by every kernel
    view = y2_codec.from_wire(wire, copy=False)
    assert np.array_equal(view, words)
    assert y2_codec.to_wire(view) == wire
    for a, b in zip(y2_codec.unpack(view), _pure.unpack(words), strict=True):
        assert np.array_equal(a, b)


def test_from_wire_without_copy_views_the_buffer(y2_codec):
    buf = bytearray(np.array([7, 8], dtype=">u4").tobytes())
    view = y2_codec.from_wire(buf, copy=False)
    buf[7] = 9
    assert view.tolist() == [7, 9]


@pytest.mark.parametrize("n", [1, 5, 7])
def test_from_wire_rejects_partial_words(y2_codec, n):
    with pytest.raises(DecodeError) as info:
        y2_codec.from_wire(bytes(n))
    assert (info.value.field, info.value.offset) == ("words", n - n % 4)


@pytest.mark.parametrize(
    ("args", "field", "text"),
    [
        (([512], [0], [0], [0]), "layer[0]", "512 is out of range 0..511"),
        (([0, -1], [0, 0], [0, 0], [0, 0]), "layer[1]", "-1 is out of range 0..511"),
        (([0, 0, 1], [0, 0, 2], [0, 0, 0], [0, 0, 0]), "is_weight[2]", "2 is out of range 0..1"),
        (([0, 0], [0, 0], [0, 2**21], [0, 0]), "index[1]", "2097152 is out of range 0..2097151"),
        (([0], [0], [0], [255]), "positive[0]", "255 is out of range 0..1"),
        # the first bad position wins, whatever field it is in
        (([0, 600], [0, 0], [0, 0], [5, 0]), "positive[0]", "5 is out of range 0..1"),
        (([1, 2], [0], [0, 0], [0, 0]), "is_weight", "length 1, but layer has length 2"),
        (([0.5], [0], [0], [0]), "layer", "expected integers, got dtype float64"),
        (([[0]], [[0]], [[0]], [[0]]), "layer", "expected a 1-D array, got 2 dimensions"),
    ],
)
def test_pack_errors_same_from_both_twins(args, field, text):
    for codec in (_fast(), _pure):
        with pytest.raises(EncodeError) as info:
            codec.pack(*args)
        assert (info.value.field, info.value.reason) == (field, text)


@given(st.integers(0, 200), st.sampled_from(range(4)), st.data())
def test_pack_reports_first_bad_position_in_any_dtype(n, which, data):
    arrays = [np.zeros(n + 1, dtype=data.draw(st.sampled_from(INT_DTYPES))) for _ in range(4)]
    top = (511, 1, 2**21 - 1, 1)[which]
    arr = arrays[which]
    big = np.iinfo(arr.dtype).max
    bad = data.draw(
        st.sampled_from(
            [v for v in (top + 1, big, -1) if v <= big and (v >= 0 or arr.dtype.kind == "i")]
            or [big]
        )
    )
    if bad <= top:  # the dtype cannot hold an out-of-range value: nothing to test
        return
    arr[n] = bad
    results = set()
    for codec in (_fast(), _pure):
        with pytest.raises(EncodeError) as info:
            codec.pack(*arrays)
        results.add(str(info.value))
    assert results == {
        f"y2: cannot encode {('layer', 'is_weight', 'index', 'positive')[which]}[{n}]: "
        f"{bad} is out of range 0..{top}"
    }


#: pack's input dtypes: unpack's (uint16, bool, uint32, uint8) and int64 take the one-pass
#: kernels, int32 the field-by-field path.
PACK_DTYPES = {
    "unpack's": (np.uint16, np.bool_, np.uint32, np.uint8),
    "int64": (np.int64,) * 4,
    "int32": (np.int32,) * 4,
}


@pytest.mark.parametrize("avx2", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtypes", sorted(PACK_DTYPES))
def test_pack_large_matches_reference(dtypes, threads, avx2):
    with _avx2(avx2):
        _check_pack_large(dtypes, threads)


def _check_pack_large(dtypes, threads):
    rng = np.random.default_rng(5)
    n = 100_003  # several blocks and chunks, and a tail
    tops = (511, 1, 2**21 - 1, 1)
    kinds = zip(tops, PACK_DTYPES[dtypes], strict=True)
    f = [rng.integers(0, top + 1, n).astype(d) for top, d in kinds]
    assert np.array_equal(_fast().pack(*f, threads=threads), _pure.pack(*f))
    for which, name in enumerate(("layer", "is_weight", "index", "positive")):
        if f[which].dtype == np.bool_:
            continue  # cannot hold an out-of-range value
        bad = [a.copy() for a in f]
        bad[which][77_777] = tops[which] + 1
        bad[which][99_999] = tops[which] + 1
        with pytest.raises(EncodeError, match=rf"{name}\[77777\]"):
            _fast().pack(*bad, threads=threads)


# --- models ---------------------------------------------------------------------------------


@st.composite
def models(draw, max_layers=4):
    """A list of (weights, biases) float arrays; some N-d, some non-contiguous, some empty."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    elements = st.one_of(
        st.floats(-3, 3, width=32),
        st.sampled_from([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.5, float("nan"), float("inf")]),
    )
    layers = []
    for _ in range(draw(st.integers(0, max_layers))):
        pair = []
        for shape in (
            draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=9)),
            (draw(st.integers(0, 9)),),
        ):
            arr = draw(hnp.arrays(dtype, shape, elements=elements))
            layout = draw(st.sampled_from(["c", "fortran", "strided"]))
            if layout == "fortran":
                arr = np.asfortranarray(arr)
            elif layout == "strided":
                holder = np.zeros((*arr.shape[:-1], arr.shape[-1] * 2), dtype=dtype)
                holder[..., ::2] = arr
                arr = holder[..., ::2]
            pair.append(arr)
        layers.append(tuple(pair))
    return layers


def _copy(model):
    """A deep copy keeping each array's memory layout."""
    out = []
    for pair in model:
        copies = []
        for a in pair:
            if a.ndim and not a.flags.c_contiguous and not a.flags.f_contiguous:
                holder = np.zeros((*a.shape[:-1], a.shape[-1] * 2), dtype=a.dtype)
                holder[..., ::2] = a
                copies.append(holder[..., ::2])
            else:
                copies.append(a.copy(order="A"))
        out.append(tuple(copies))
    return out


def _same(m1, m2):
    return all(
        a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
        for p1, p2 in zip(m1, m2, strict=True)
        for a, b in zip(p1, p2, strict=True)
    )


# --- compress -------------------------------------------------------------------------------


@given(models(), st.sampled_from([0.25, 0.5, 1.0, 2.5]))
def test_compress_equals_reference(y2_codec, model, tau):
    mine, ref = _copy(model), _copy(model)
    words = y2_codec.compress(mine, tau)
    assert words.dtype == np.uint32
    assert np.array_equal(words, _pure.compress(ref, tau))
    assert _same(mine, ref)


@given(models(max_layers=3), st.sampled_from([0.25, 1.0]))
def test_compress_semantics(model, tau):
    before = _copy(model)
    words = _pure.compress(model, tau)
    # order: layer, then weights before biases, then index: the words sort as (layer, w, i)
    layer, weight, index, _positive = _pure.unpack(words)
    keys = list(zip(layer.tolist(), (1 - weight.astype(int)).tolist(), index.tolist(), strict=True))
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    hit = set(keys)
    for k, pair in enumerate(before):
        for kind, (old, new) in enumerate(zip(pair, model[k], strict=True)):
            t = old.dtype.type(tau)
            for i, (o, n) in enumerate(zip(old.reshape(-1), new.reshape(-1), strict=True)):
                if (k, kind, i) in hit:
                    assert abs(o) >= t and n == (o - t if o > 0 else o + t)
                else:
                    assert not abs(o) >= t and np.array_equal(o, n, equal_nan=True)


def test_compress_threads_give_the_same_output():
    rng = np.random.default_rng(11)
    model = [
        (rng.normal(0, 1, (700, 1000)).astype(np.float32), rng.normal(0, 1, 1000)) for _ in range(3)
    ]
    one, two, ref = _copy(model), _copy(model), _copy(model)
    fast = _fast()
    w1 = fast.compress(one, 2.0)
    w2 = fast.compress(two, 2.0, threads=2)
    assert np.array_equal(w1, w2) and _same(one, two)
    assert np.array_equal(w1, _pure.compress(ref, 2.0)) and _same(one, ref)


@pytest.mark.parametrize("dtype", [np.float16, np.longdouble, ">f8", ">f4"])
def test_compress_and_apply_other_float_dtypes(y2_codec, dtype):
    rng = np.random.default_rng(3)
    model = [(rng.normal(0, 1, (30, 40)).astype(dtype), rng.normal(0, 1, 40).astype(dtype))]
    mine, ref = _copy(model), _copy(model)
    words = y2_codec.compress(mine, 1.0)
    assert np.array_equal(words, _pure.compress(ref, 1.0)) and _same(mine, ref)
    y2_codec.apply(mine, words, 0.1)
    _pure.apply(ref, words, 0.1)
    assert _same(mine, ref)


def test_compress_edge_addresses():
    # layer 511 exists and its last weight (index 2**21 - 1) is addressable
    model = [(np.zeros(0, np.float32), np.zeros(0, np.float32))] * 511
    last = np.zeros(2**21, np.float32)
    last[-1] = -5.0
    model = [*model, (last, np.array([0.0, 3.0]))]
    for codec in (_fast(), _pure):
        words = codec.compress(_copy(model), 1.0)
        assert [hex(w) for w in words.tolist()] == ["0xffbffffe", "0xffc00003"]


@pytest.mark.parametrize(
    ("model", "tau", "field"),
    [
        ([(np.zeros(1), np.zeros(1))] * 513, 1.0, "residuals"),
        ([(np.zeros(2**21 + 1, np.float32), np.zeros(1))], 1.0, "residuals[0].weights"),
        ([(np.zeros(1), np.zeros(1))], 0.0, "tau"),
        ([(np.zeros(1), np.zeros(1))], float("nan"), "tau"),
        ([(np.zeros(1), np.zeros(1))], "x", "tau"),
        ([(np.zeros(1, np.float16), np.zeros(1))], 1e-9, "tau"),  # rounds to 0 in float16
        ([(np.zeros(1, np.float32), np.zeros(1, np.float32))], 1e39, "tau"),  # inf in float32
        ([(np.zeros(1, np.float32), np.zeros(1, np.float32))], 1e-46, "tau"),  # 0 in float32
    ],
)
def test_compress_rejects_before_touching_anything(model, tau, field):
    for codec in (_fast(), _pure):
        mine = _copy(model[:3])
        with pytest.raises(EncodeError) as info:
            codec.compress(model[:-3] + mine if len(model) > 3 else mine, tau)
        assert info.value.field == field
        assert _same(mine, model[:3])


@pytest.mark.parametrize(
    "tau",
    [float(np.finfo(np.float32).max), float(np.finfo(np.float32).max) + 5e30, 1e-45, 2.5],
)
def test_compress_model_forms_and_float32_tau_limits(tau):
    # tuples or lists of pairs, mixed float32/float64, tau at the float32 limits (the last
    # rounds to FLT_MAX): both twins agree
    rng = np.random.default_rng(9)
    pairs = [
        (rng.normal(0, 3, (7, 5)).astype(np.float32), rng.normal(0, 3, 5)),
        (np.full(4, np.finfo(np.float32).max), np.zeros(0, np.float32)),
    ]
    for form in (tuple, list):
        mine = form(form(p) for p in _copy(pairs))
        ref = _copy(pairs)
        assert np.array_equal(_fast().compress(mine, tau), _pure.compress(ref, tau))
        assert _same([tuple(p) for p in mine], ref)


@pytest.mark.parametrize(
    ("model", "error"),
    [
        (5, TypeError),
        ([(np.zeros(1),)], TypeError),
        ([(np.zeros(1, np.int32), np.zeros(1))], TypeError),
        ([(np.zeros(1), [0.0])], TypeError),
        ([(np.zeros(1), np.zeros(1))[::-1]], None),
    ],
)
def test_model_argument_checks_same_from_both_twins(model, error):
    if error is None:
        readonly = np.zeros(1)
        readonly.flags.writeable = False
        model, error = [(np.zeros(1), readonly)], ValueError
    texts = set()
    for codec in (_fast(), _pure):
        for call in (
            lambda c=codec: c.compress(model, 1.0),
            lambda c=codec: c.apply(model, [0], 1.0),
        ):
            with pytest.raises(error) as info:
                call()
            texts.add(str(info.value).replace("params", "residuals"))
    assert len(texts) == 1


# --- apply ----------------------------------------------------------------------------------


@st.composite
def model_and_words(draw):
    model = draw(models())
    valid = []
    for k, (weights, biases) in enumerate(model):
        for is_weight, arr in ((1, weights), (0, biases)):
            if arr.size:
                valid.append((k, is_weight, arr.size))
    words = []
    if valid:
        for _ in range(draw(st.integers(0, 40))):
            k, is_weight, size = draw(st.sampled_from(valid))
            i = draw(st.one_of(st.integers(0, size - 1), st.just(size - 1)))
            words.append(_word(k, is_weight, i, draw(st.integers(0, 1))))
    return model, np.array(words, dtype=np.uint32)


@given(model_and_words(), st.data())
def test_apply_equals_reference(y2_codec, mw, data):
    model, words = mw
    mine, ref = _copy(model), _copy(model)
    order = data.draw(st.sampled_from(["native", "big-endian", "strided", "list"]))
    if order == "big-endian":
        given_words = words.astype(">u4")
    elif order == "strided":
        given_words = _strided(words, data)
    elif order == "list":
        given_words = words.tolist()
    else:
        given_words = words
    assert y2_codec.apply(mine, given_words, 0.25) is None
    _pure.apply(ref, words, 0.25)
    assert _same(mine, ref)


@given(models(), st.sampled_from([0.5, 1.0]))
def test_apply_of_compress_rebuilds_the_update(model, tau):
    residual = _copy(model)
    before = _copy(model)
    fast = _fast()
    words = fast.compress(residual, tau)
    target = [tuple(np.zeros_like(a) for a in pair) for pair in model]
    fast.apply(target, words, tau)
    # target + residual == the original residual, element by element where a word was sent
    for p_before, p_res, p_tgt in zip(before, residual, target, strict=True):
        for b, r, t in zip(p_before, p_res, p_tgt, strict=True):
            sent = t != 0
            assert np.array_equal((r + t)[sent], b[sent])


@given(model_and_words(), st.data())
def test_bad_word_changes_nothing_and_raises_the_same_error(mw, data):
    model, words = mw
    n_layers = len(model)
    bad_kind = data.draw(st.sampled_from(["layer", "index"]))
    if bad_kind == "layer" or not n_layers:
        bad = (data.draw(st.integers(n_layers, 511)) << 23) | 1
    else:
        k = data.draw(st.integers(0, n_layers - 1))
        is_weight = data.draw(st.integers(0, 1))
        size = model[k][1 - is_weight].size
        i = data.draw(st.integers(size, 2**21 - 1))
        bad = _word(k, is_weight, i, 0)
    at = data.draw(st.integers(0, len(words)))
    words = np.insert(words, at, np.uint32(bad))
    errors = set()
    for codec in (_fast(), _pure):
        mine = _copy(model)
        with pytest.raises(DecodeError) as info:
            codec.apply(mine, words, 0.5)
        assert _same(mine, model)  # nothing was touched
        assert (info.value.field, info.value.offset) == (f"words[{at}]", 4 * at)
        errors.add(str(info.value))
    assert len(errors) == 1


def test_apply_error_texts():
    model = [(np.zeros((2, 3)), np.zeros(3))]
    for codec in (_fast(), _pure):
        with pytest.raises(DecodeError, match=r"parameter 4 \(layer 2\) does not exist \(the"):
            codec.apply(model, [2 << 23], 1.0)
        with pytest.raises(
            DecodeError, match=r"weight index 6 is out of range for parameter 0 \(layer 0: 6 "
        ):
            codec.apply(model, [6 << 1], 1.0)
        with pytest.raises(DecodeError, match=r"parameter 1 \(layer 0: 3 biases\)$"):
            codec.apply(model, [(1 << 22) | (3 << 1)], 1.0)
        with pytest.raises(DecodeError, match=r"parameter 1 \(layer 0: 1 bias\)$"):
            codec.apply([(np.zeros(2), np.zeros(1))], [(1 << 22) | (1 << 1)], 1.0)
    with pytest.raises(EncodeError, match=r"words\[0\]"):
        _fast().apply(model, [-1], 1.0)


def test_apply_duplicate_words_add_in_order_in_the_array_dtype():
    model = [(np.array([1e8], np.float32), np.zeros(0))]
    words = np.full(3, 1, dtype=np.uint32)  # parameter 0 (layer 0's weights), +tau
    ref = _copy(model)
    _fast().apply(model, words, 3.0)
    _pure.apply(ref, words, 3.0)
    assert _same(model, ref)
    assert model[0][0][0] == np.float32(1e8)  # each +3 rounds away in float32


# --- vector loops, threads, unpack(out=) ----------------------------------------------------


@contextlib.contextmanager
def _avx2(on: bool):
    """Run the fast twin with its AVX2 loops (where the CPU has AVX2) or without."""
    fast = _fast()
    old = fast.use_avx2(on)
    try:
        yield
    finally:
        fast.use_avx2(old)


def test_use_avx2_off_forces_the_portable_loops_and_says_what_was_on():
    fast = _fast()
    old = fast.use_avx2(False)
    try:
        assert fast.AVX2 is False  # the portable loops, whatever the CPU
        assert fast.use_avx2(True) is False  # the old setting
        with_avx2 = fast.AVX2  # True where the CPU has AVX2
        assert fast.use_avx2(False) is with_avx2
        words = np.arange(70000, dtype=np.uint32) * np.uint32(2654435761)
        assert all(
            np.array_equal(a, b)
            for a, b in zip(fast.unpack(words), _pure.unpack(words), strict=True)
        )
    finally:
        fast.use_avx2(old)


SPECIAL = [0.0, -0.0, 2.5, -2.5, float("nan"), float("inf"), float("-inf"), 1e-40, -3.0, 7.0]


@given(
    st.booleans(),
    st.integers(0, 100),
    st.integers(0, 3),
    st.sampled_from(FLOAT_DTYPES),
    st.lists(st.one_of(st.floats(-4, 4, width=32), st.sampled_from(SPECIAL)), max_size=40),
)
def test_compress_vector_loops_equal_reference(simd, n, offset, dtype, specials):
    # lengths around the vector widths, misaligned starts, values at and next to tau
    t = dtype(2.5)
    pool = np.array([*SPECIAL, np.nextafter(t, 0), -np.nextafter(t, 0), np.nextafter(t, 9)])
    rng = np.random.default_rng(n * 4 + offset)
    holder = rng.normal(0, 2, n + offset).astype(dtype)
    if n + offset:
        holder[rng.integers(0, n + offset, len(specials))] = np.array(specials, dtype=dtype)
        holder[rng.integers(0, n + offset, 6)] = rng.choice(pool, 6)
    arr = holder[offset:]
    model = [(arr, np.flip(holder.copy()))]
    mine, ref = _copy(model), _copy(model)
    with _avx2(simd):
        words = _fast().compress(mine, 2.5, threads=1)
    assert np.array_equal(words, _pure.compress(ref, 2.5))
    assert _same(mine, ref)


@pytest.mark.parametrize("simd", [True, False])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_compress_blocks_and_dense_hits(simd, dtype):
    # several kernel blocks, a tail, and every element a hit (the word buffer grows fastest)
    rng = np.random.default_rng(8)
    model = [
        (rng.normal(0, 1, (37, 301)).astype(dtype), np.full(5003, -9.0, dtype)),
        (rng.normal(0, 3, 4099).astype(dtype), rng.normal(0, 1, 3).astype(dtype)),
    ]
    mine, ref = _copy(model), _copy(model)
    with _avx2(simd):
        words = _fast().compress(mine, 0.5, threads=1)
    assert np.array_equal(words, _pure.compress(ref, 0.5))
    assert _same(mine, ref)


def _big_model(seed=12):
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(0, 1, (300, 1000)).astype(np.float32), rng.normal(0, 1, 1000)) for _ in range(2)
    ] + [(rng.normal(0, 1, 300_001).astype(np.float16), rng.normal(0, 1, 7).astype(np.float32))]


@pytest.mark.parametrize("threads", [None, 1, 2, 3, 7])
def test_compress_output_does_not_depend_on_threads(threads):
    model = _big_model()
    mine, ref = _copy(model), _copy(model)
    assert np.array_equal(_fast().compress(mine, 2.0, threads=threads), _pure.compress(ref, 2.0))
    assert _same(mine, ref)


def test_compress_threads_with_arrays_sharing_memory():
    # tied weights (one array in two layers) and overlapping views: updates must happen in
    # layer order, as in the reference, whatever the thread count
    rng = np.random.default_rng(13)
    tied = rng.normal(0, 2, (600, 1000)).astype(np.float32)
    base = rng.normal(0, 2, 700_000)
    model = [(tied, base[:400_000]), (tied, base[300_000:]), (tied[::2], np.zeros(3))]

    def fresh():
        t, b = tied.copy(), base.copy()
        return [(t, b[:400_000]), (t, b[300_000:]), (t[::2], np.zeros(3))]

    ref = fresh()
    expected = _pure.compress(ref, 1.5)
    for threads in (2, None):
        mine = fresh()
        assert np.array_equal(_fast().compress(mine, 1.5, threads=threads), expected)
        assert _same(mine, ref)
    assert len(model) == 3


@pytest.mark.parametrize("threads", [0, -1, True, 2.0, "2"])
def test_threads_argument_checked_by_both_twins(threads):
    texts = set()
    for codec in (_fast(), _pure):
        for call in (
            lambda c=codec: c.compress([(np.zeros(1), np.zeros(1))], 1.0, threads=threads),
            lambda c=codec: c.unpack(np.zeros(3, np.uint32), threads=threads),
            lambda c=codec: c.pack([1], [0], [2], [1], threads=threads),
        ):
            with pytest.raises(ValueError) as info:
                call()
            texts.add(str(info.value))
    assert texts == {f"y2: threads must be an int >= 1 or None, got {threads!r}"}


def _unpack_out(n):
    return (
        np.empty(n, np.uint16),
        np.empty(n, np.bool_),
        np.empty(n, np.uint32),
        np.empty(n, np.uint8),
    )


@given(st.lists(y2_words, max_size=120), st.sampled_from(["=", ">", "strided"]), st.data())
def test_unpack_out_and_vector_loops_equal_reference(y2_codec, values, layout, data):
    native = np.array(values, dtype=np.uint32)
    if layout == ">":
        words = native.astype(">u4")
    else:
        words = _strided(native, data) if layout == "strided" else native
    with _avx2(data.draw(st.booleans(), label="avx2")):
        out = _unpack_out(len(values))
        got = y2_codec.unpack(words, out=out)
        plain = y2_codec.unpack(words)
    assert all(a is b for a, b in zip(got, out, strict=True))
    for a, b, c in zip(out, plain, _pure.unpack(native), strict=True):
        assert a.dtype == b.dtype == c.dtype and np.array_equal(a, c) and np.array_equal(b, c)


@pytest.mark.parametrize("threads", [None, 1, 2, 3])
def test_unpack_threads_give_the_same_output(y2_codec, threads):
    rng = np.random.default_rng(21)
    words = rng.integers(0, 2**32, 400_037, dtype=np.uint64).astype(np.uint32)
    expected = _pure.unpack(words)
    for form in (words, words.astype(">u4")):
        for got in (
            y2_codec.unpack(form, threads=threads),
            y2_codec.unpack(form, out=_unpack_out(len(words)), threads=threads),
        ):
            assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


def _out_cases():
    words = np.arange(6, dtype=np.uint32)
    good = _unpack_out(6)
    readonly = np.zeros(6, np.uint8)
    readonly.flags.writeable = False
    shared = np.zeros(6, np.uint32)
    return words, [
        (5, TypeError, "out must be a sequence of 4 arrays, got int"),
        (good[:3], TypeError, "out must hold 4 arrays (layer, is_weight, index, positive), got 3"),
        ((*good[:3], [0] * 6), TypeError, "out positive must be a numpy array, got list"),
        (
            (good[0].astype(np.int16), *good[1:]),
            TypeError,
            "out layer must have dtype uint16, got int16",
        ),
        (
            (good[0].astype(">u2"), *good[1:]),
            TypeError,
            "out layer must have dtype uint16, got >u2",
        ),
        (
            (*good[:2], np.empty(7, np.uint32), good[3]),
            ValueError,
            "out index must have shape (6,), got (7,)",
        ),
        (
            (*good[:2], np.empty((6, 1), np.uint32), good[3]),
            ValueError,
            "out index must have shape (6,), got (6, 1)",
        ),
        (
            (*good[:2], np.empty(12, np.uint32)[::2], good[3]),
            ValueError,
            "out index must be contiguous",
        ),
        ((*good[:3], readonly), ValueError, "out positive is read-only"),
        ((good[0], good[1], words, good[3]), ValueError, "out index shares memory with the words"),
        (
            (good[0], shared[:6].view(np.bool_)[:6], shared, good[3]),
            ValueError,
            "out is_weight shares memory with out index",
        ),
    ]


@pytest.mark.parametrize("case", range(11))
def test_unpack_out_checked_by_both_twins_before_writing(case):
    words, cases = _out_cases()
    out, error, text = cases[case]
    snapshot = [np.array(a, copy=True) for a in out] if isinstance(out, tuple) else None
    for codec in (_fast(), _pure):
        with pytest.raises(error) as info:
            codec.unpack(words, out=out)
        assert str(info.value) == f"y2: {text}"
        if snapshot is not None:
            assert all(np.array_equal(a, b) for a, b in zip(out, snapshot, strict=True))


def test_unpack_out_empty_and_big_endian_view_of_the_same_bytes(y2_codec):
    assert all(len(a) == 0 for a in y2_codec.unpack(np.zeros(0, np.uint32), out=_unpack_out(0)))
    # a big-endian view of wire bytes: outputs elsewhere are fine, the bytes are untouched
    wire = bytearray(np.array([0xFF800003, 5], dtype=">u4").tobytes())
    view = y2_codec.from_wire(wire, copy=False)
    layer, is_weight, index, positive = y2_codec.unpack(view, out=_unpack_out(2))
    assert layer.tolist() == [511, 0] and index.tolist() == [1, 2] and positive.tolist() == [1, 1]
    assert is_weight.tolist() == [True, True] and bytes(wire) == bytes.fromhex("ff80000300000005")


# --- the worker pool ------------------------------------------------------------------------


def _pack_fields(n, seed=31):
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 512, n).astype(np.uint16),
        rng.integers(0, 2, n).astype(np.bool_),
        rng.integers(0, 2**21, n).astype(np.uint32),
        rng.integers(0, 2, n).astype(np.uint8),
    )


@pytest.mark.parametrize("threads", [None, 1, 2, 3, 7])
def test_pack_threads_give_the_same_output(y2_codec, threads):
    fields = _pack_fields(300_011)  # ten chunks and a short one
    expected = _pure.pack(*fields)
    assert np.array_equal(y2_codec.pack(*fields, threads=threads), expected)
    strided = [np.repeat(f, 2)[::2] for f in fields]  # the scalar loop, in chunks too
    assert np.array_equal(y2_codec.pack(*strided, threads=threads), expected)


@pytest.mark.parametrize("threads", [None, 2, 7])
def test_pack_threads_report_the_first_bad_position(y2_codec, threads):
    # bad values in two chunks (the later chunk may finish first): the first one is named
    layer, is_weight, index, positive = (f.astype(np.int64) for f in _pack_fields(200_000))
    index[190_001] = 2**21
    layer[70_000] = -1
    with pytest.raises(EncodeError) as info:
        y2_codec.pack(layer, is_weight, index, positive, threads=threads)
    assert info.value.field == "layer[70000]"


def test_pool_stops_and_starts_again():
    fast = _fast()
    fields = _pack_fields(100_000)
    expected = _pure.pack(*fields)
    assert np.array_equal(fast.pack(*fields, threads=3), expected)
    assert fast._pool_workers() >= 2
    fast._pool_stop()
    assert fast._pool_workers() == 0
    assert np.array_equal(fast.pack(*fields, threads=1), expected)  # no thread needed
    assert fast._pool_workers() == 0
    assert np.array_equal(fast.pack(*fields, threads=2), expected)
    assert fast._pool_workers() >= 1


@pytest.mark.parametrize("idle", [(0.0, 0.0), (0.0, 0.05), (0.05, 0.05)])
def test_pool_with_sleeping_napping_and_spinning_workers(idle):
    # every job wakes sleeping workers / finds them napping / finds them watching
    fast = _fast()
    old = fast._pool_idle(*idle)
    try:
        words = np.random.default_rng(5).integers(0, 2**32, 200_000, dtype=np.uint64)
        words = words.astype(np.uint32)
        expected = _pure.unpack(words)
        for _ in range(20):
            got = fast.unpack(words, threads=2)
            assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    finally:
        assert fast._pool_idle(*old)[:2] == idle


def test_pool_shared_by_concurrent_callers():
    # one caller gets the pool, the others run alone: every result is right
    fast = _fast()
    fields = _pack_fields(150_000)
    expected = _pure.pack(*fields)
    model = _big_model(14)
    words = _pure.compress(_copy(model), 2.0)
    failures = []

    def work(k):
        for _ in range(8):
            if k % 2:
                if not np.array_equal(fast.pack(*fields, threads=2), expected):
                    failures.append(k)
            elif not np.array_equal(fast.compress(_copy(model), 2.0, threads=3), words):
                failures.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert failures == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_pool_works_in_a_forked_child():
    # the child inherits no worker threads: its pool starts afresh, the parent's goes on
    fast = _fast()
    fields = _pack_fields(200_000)
    expected = _pure.pack(*fields)
    assert np.array_equal(fast.pack(*fields, threads=2), expected)  # the parent's workers run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        ok = False
        try:
            ok = (
                fast._pool_workers() == 0
                and np.array_equal(fast.pack(*fields, threads=2), expected)
                and fast._pool_workers() >= 1
                and np.array_equal(
                    fast.compress(_copy(_big_model(15)), 2.0, threads=2),
                    _pure.compress(_copy(_big_model(15)), 2.0),
                )
            )
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert np.array_equal(fast.pack(*fields, threads=2), expected)


def test_interpreter_exits_promptly_with_workers_alive():
    # workers asleep and workers watching for work: exit joins them, without a hang
    code = (
        "import numpy as np\n"
        "from wirekit._fast import y2\n"
        "w = np.arange(300_000, dtype=np.uint32)\n"
        "y2._pool_idle(0.0, 0.0)\n"
        "y2.unpack(w, threads=2)\n"
        "y2._pool_idle(30.0, 30.0)\n"
        "y2.unpack(w, threads=2)\n"
        "print(y2._pool_workers())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 1


# --- the default thread count ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "total", "load", "expected"),
    [
        (2, 2, 3.3, 1),  # 2 cores shared with other work: one thread
        (2, 2, 1.0, 2),  # only this call running: both cores
        (2, 2, 1.9, 1),  # the other core mostly busy
        (2, 2, 0.0, 2),
        (8, 8, 4.5, 4),
        (2, 64, 30.0, 2),  # 2 cores of a big, half-busy machine
        (1, 4, 0.0, 1),  # affinity of one core
        (4, 4, 400.0, 1),
    ],
)
def test_idle_cores_rule(cores, total, load, expected):
    from wirekit.y2 import _checks

    assert _checks.idle_cores(cores, total, load) == expected


def _workers_started_by(call, load, monkeypatch):
    """How many pool workers a threads=None call starts with the load average at ``load``."""
    from wirekit.y2 import _checks

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(_checks, "IDLE_CORES_TTL", 0.0)  # measured afresh on every call
    _fast()._pool_stop()
    call()
    started = _fast()._pool_workers()
    _fast()._pool_stop()
    return started


@pytest.mark.parametrize("kernel", ["compress", "pack", "unpack"])
def test_default_threads_stay_one_on_busy_cores(kernel, monkeypatch):
    # regression: on 2 shared cores the default used both and was slower than one thread
    # (pack of 1 M words 0.78 ms against 0.49 ms); a loaded machine now gets one thread
    fast = _fast()
    model = [(np.ones((1100, 1000), np.float32), np.ones(10, np.float32))]
    words = np.arange(1 << 18, dtype=np.uint32)
    fields = fast.unpack(words)
    call = {
        "compress": lambda: fast.compress(model, 5.0),
        "pack": lambda: fast.pack(*fields),
        "unpack": lambda: fast.unpack(words),
    }[kernel]
    busy = float(os.cpu_count() or 1) + 1.5  # every core taken by other work
    assert _workers_started_by(call, busy, monkeypatch) == 0
    if len(os.sched_getaffinity(0)) > 1:  # an idle machine still gets its cores
        assert _workers_started_by(call, 0.0, monkeypatch) > 0
