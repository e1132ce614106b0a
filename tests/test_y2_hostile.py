"""y2 kernels fed hostile arrays: wrong dtypes, odd layouts, empty and huge inputs, values at
and past the word fields' limits, NaN and inf, read-only memory, arrays sharing memory,
NumPy subclasses whose attributes lie.  Both twins must give the same result (words, and
every array they update in place) or the same error class with the same text, and the
compiled one must never touch memory outside the arrays it is given.

Reproductions that crashed the compiled twin before its fixes run in a subprocess, so that a
crash fails one test instead of ending the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import y2_word
from twins import load_codec

from wirekit.errors import DecodeError, EncodeError
from wirekit.y2 import _pure

# np.matrix is one of the subclasses fed to the kernels
pytestmark = pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")


def _fast():
    return load_codec("y2", "fast")


def _summary(value):
    """A comparable form of a result: arrays as (dtype, shape, bytes), NaN bits included."""
    if isinstance(value, np.ndarray):
        plain = np.asarray(value)
        return plain.dtype.str, plain.shape, np.ascontiguousarray(plain).tobytes()
    if isinstance(value, (list, tuple)):
        return [_summary(v) for v in value]
    return value


def _outcome(run, codec):
    """``("ok", summary)`` of ``run(codec)``, or its exception's class and text."""
    try:
        result = run(codec)
    except Exception as exc:  # the class is what is compared
        return type(exc), str(exc)
    return "ok", _summary(result)


def _run_both_in_subprocess(body: str) -> list:
    """Run ``body`` (which defines ``run(codec)``) once per twin in a fresh interpreter and
    return both summaries; a crash of the interpreter fails the test with its stderr."""
    _fast()  # skips under WIREKIT_PURE=1
    code = (
        textwrap.dedent(
            """
        import json
        import numpy as np
        from wirekit._fast import y2 as fast
        from wirekit.y2 import _pure

        def summary(value):
            if isinstance(value, np.ndarray):
                return [value.dtype.str, list(value.shape), value.tobytes().hex()]
            if isinstance(value, (list, tuple)):
                return [summary(v) for v in value]
            return value

        def outcome(codec):
            try:
                return ["ok", summary(run(codec))]
            except Exception as exc:
                return [type(exc).__name__, str(exc)]
        """
        )
        + textwrap.dedent(body)
        + "\nprint(json.dumps([outcome(fast), outcome(_pure)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout)


# --- regressions: the compiled apply ------------------------------------------------------


@pytest.mark.parametrize("layers", [513, 600, 1025])
def test_apply_with_more_than_512_layers_matches_the_reference(layers):
    # the compiled twin filled a 1024-entry table for every layer: 513 layers wrote past it
    # (double free or corruption, SIGABRT).  Layers past 511 cannot be addressed: left alone.
    fast, pure = _run_both_in_subprocess(
        f"""
        def run(codec):
            model = [(np.zeros(2, np.float32), np.zeros(2, np.float32))
                     for _ in range({layers})]
            words = codec.pack([0, 511, 511], [1, 1, 0], [1, 0, 1], [1, 0, 1])
            codec.apply(model, words, 0.5)
            return [a for pair in model for a in pair]
        """
    )
    assert fast == pure
    assert fast[0] == "ok"
    got = [bytes.fromhex(h) for _dtype, _shape, h in fast[1]]
    assert np.frombuffer(got[0], np.float32).tolist() == [0.0, 0.5]  # layer 0 weights
    assert np.frombuffer(got[2 * 511], np.float32).tolist() == [-0.5, 0.0]
    assert np.frombuffer(got[2 * 511 + 1], np.float32).tolist() == [0.0, 0.5]
    assert all(not any(g) for g in got[2 * 512 :])


def test_apply_with_more_than_512_layers_rejects_a_word_past_the_model(y2_codec):
    model = [(np.zeros(2, np.float32), np.zeros(2, np.float32)) for _ in range(513)]
    with pytest.raises(DecodeError) as info:
        y2_codec.apply(model, y2_codec.pack([0, 0], [1, 1], [1, 2], [0, 0]), 0.5)
    assert info.value.field == "words[1]"
    assert not any(a.any() for pair in model for a in pair)


def test_apply_tied_weights_get_every_update(y2_codec):
    # one array in two slots, one of them a non-contiguous view: the compiled twin wrote both
    # slots back from separate copies and lost the first update (0.5 instead of 1.0)
    emb = np.zeros((3, 2), np.float32)
    bias = np.zeros(1, np.float32)
    model = [(emb, bias), (emb.T, bias)]
    words = y2_codec.pack([0, 1, 0, 1], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0])
    y2_codec.apply(model, words, 0.5)
    assert emb[0, 0] == 1.0 and bias[0] == -1.0
    ref_emb = np.zeros((3, 2), np.float32)
    ref_bias = np.zeros(1, np.float32)
    _pure.apply([(ref_emb, ref_bias), (ref_emb.T, ref_bias)], words, 0.5)
    assert np.array_equal(emb, ref_emb) and np.array_equal(bias, ref_bias)


def test_apply_words_inside_a_parameter_are_read_as_they_were():
    # the words are the memory of the array they update: the compiled twin read each word
    # after earlier words had changed it, past the check (indices out of range)
    fast, pure = _run_both_in_subprocess(
        """
        def run(codec):
            params = np.zeros(64, np.float32)
            words = params.view(np.uint32)
            words[:] = (np.arange(64, dtype=np.uint32) + 1) % 64 << 1  # parameter 0
            codec.apply([(params, np.zeros(1, np.float32))], words, 0.5)
            return params
        """
    )
    assert fast == pure and fast[0] == "ok"


# --- hostile arrays: one table, both twins ------------------------------------------------


def _ro(arr):
    arr = np.array(arr)
    arr.flags.writeable = False
    return arr


class _SizeLiar(np.ndarray):
    """Claims far more elements than it holds."""

    @property
    def size(self):
        return 2**21

    @property
    def shape(self):
        return (2**21,)

    def reshape(self, *args, **kwargs):
        return np.zeros(2**21, self.dtype)


class _NineLiar(np.ndarray):
    """Claims the shape (9,), whatever it holds."""

    @property
    def shape(self):
        return (9,)


class _NdimLiar(np.ndarray):
    """A 2-D array claiming to be 1-D."""

    @property
    def ndim(self):
        return 1


class _ClassLiar:
    """Not an array, but claims to be one."""

    __class__ = np.ndarray  # type: ignore[assignment]
    dtype = np.dtype(np.float32)
    size = 4


def _model(*arrays, bias=None):
    return [(a, np.zeros(2, np.float32) if bias is None else bias) for a in arrays]


def _self_overlapping(n=5, dtype=np.float32):
    """A writeable 1-D array whose n elements are all one memory location."""
    return np.lib.stride_tricks.as_strided(np.full(1, 3.0, dtype), (n,), (0,))


def _apply(params, words, tau=0.5):
    def run(codec):
        model = params()
        codec.apply(model, words() if callable(words) else words, tau)
        return [a for pair in model for a in pair]

    return run


def _compress(residuals, tau=0.5, **kw):
    def run(codec):
        model = residuals()
        words = codec.compress(model, tau, **kw)
        return words, [a for pair in model for a in pair]

    return run


def _apply_words(*fields):
    return np.array(_pure.pack(*fields))


W0 = _apply_words([0, 0, 0], [1, 1, 0], [0, 3, 1], [0, 1, 0])  # layer 0 w[0], w[3], b[1]

HOSTILE = {
    # pack: dtypes, layouts, lengths, limits
    "pack float": (lambda c: c.pack([0.5], [0], [0], [0]), EncodeError),
    "pack object": (lambda c: c.pack(np.array([1], dtype=object), [0], [0], [0]), EncodeError),
    "pack complex": (lambda c: c.pack([0], [0], np.array([1j]), [0]), EncodeError),
    "pack strings": (lambda c: c.pack(["1"], [0], [0], [0]), EncodeError),
    "pack datetime": (
        lambda c: c.pack(np.array(["2020-01-01"], "datetime64[D]"), [0], [0], [0]),
        EncodeError,
    ),
    "pack ragged": (lambda c: c.pack([[1, 2], [1]], [0], [0], [0]), EncodeError),
    "pack 0-d": (lambda c: c.pack(np.array(3), [0], [0], [0]), EncodeError),
    "pack 2-d": (lambda c: c.pack(np.zeros((2, 2), int), [0], [0], [0]), EncodeError),
    "pack lengths": (lambda c: c.pack([0, 1], [0, 1], [0], [0, 1]), EncodeError),
    "pack empty": (lambda c: c.pack([], [], [], []), "ok"),
    "pack empty typed": (
        lambda c: c.pack(*(np.zeros(0, d) for d in (np.int8, bool, np.uint64, np.int64))),
        "ok",
    ),
    "pack layer 512": (lambda c: c.pack([512], [0], [0], [0]), EncodeError),
    "pack layer 2**40": (lambda c: c.pack([2**40], [0], [0], [0]), EncodeError),
    "pack layer uint64 max": (
        lambda c: c.pack(np.array([2**64 - 1], np.uint64), [0], [0], [0]),
        EncodeError,
    ),
    "pack layer int64 min": (
        lambda c: c.pack(np.array([-(2**63)], np.int64), [0], [0], [0]),
        EncodeError,
    ),
    "pack index 2**21": (lambda c: c.pack([0], [0], [2**21], [0]), EncodeError),
    "pack index 2**32 + 1": (
        lambda c: c.pack([0], [0], np.array([2**32 + 1], np.uint64), [0]),
        EncodeError,
    ),
    "pack sign 2": (lambda c: c.pack([0], [0], [0], [2]), EncodeError),
    "pack limits": (lambda c: c.pack([511, 0], [1, 0], [2**21 - 1, 0], [1, 0]), "ok"),
    "pack strided, reversed, zero stride, read-only": (
        lambda c: c.pack(
            np.arange(20, dtype=np.int16)[::4],
            np.broadcast_to(np.uint8(1), (5,)),
            np.arange(5, dtype=np.int64)[::-1],
            _ro(np.zeros(5, np.uint8)),
        ),
        "ok",
    ),
    "pack big-endian": (
        lambda c: c.pack(
            np.arange(3, dtype=">i8"), [1, 0, 1], [7, 8, 9], np.array([0, 1, 0], ">u2")
        ),
        "ok",
    ),
    "pack one array four times": (lambda c: c.pack(*[np.ones(4, np.uint8)] * 4), "ok"),
    "pack threads 2**70": (lambda c: c.pack([1], [0], [2], [1], threads=2**70), "ok"),
    "unpack threads 2**70": (
        lambda c: c.unpack(np.arange(5, dtype=np.uint32), threads=2**70),
        "ok",
    ),
    "compress threads 2**70": (_compress(lambda: _model(np.ones(3)), threads=2**70), "ok"),
    "pack matrix": (lambda c: c.pack(np.matrix([[1, 2]]), [0, 0], [0, 0], [0, 0]), EncodeError),
    "pack subclass": (
        lambda c: c.pack(np.arange(4).view(_NdimLiar), [0] * 4, [0] * 4, [0] * 4),
        "ok",
    ),
    # unpack / to_wire / from_wire
    "unpack float": (lambda c: c.unpack(np.zeros(2)), EncodeError),
    "unpack object": (lambda c: c.unpack(np.array([1, 2], dtype=object)), EncodeError),
    "unpack negative": (lambda c: c.unpack(np.array([3, -1], np.int64)), EncodeError),
    "unpack past u32": (lambda c: c.unpack(np.array([2**32], np.uint64)), EncodeError),
    "unpack 2-d": (lambda c: c.unpack(np.zeros((2, 2), np.uint32)), EncodeError),
    "unpack empty": (lambda c: c.unpack(np.zeros(0, np.uint32)), "ok"),
    "unpack every bit": (lambda c: c.unpack(np.array([0, 2**32 - 1, 0x80000001], np.uint32)), "ok"),
    "unpack strided big-endian read-only": (
        lambda c: c.unpack(_ro(np.arange(40, dtype=">u4")[::-3])),
        "ok",
    ),
    "unpack zero stride": (lambda c: c.unpack(np.broadcast_to(np.uint32(0xFFFFFFFF), (70,))), "ok"),
    "unpack out lying about its shape": (
        lambda c: c.unpack(
            np.zeros(9, np.uint32),
            out=(
                np.empty(9, np.uint16),
                np.empty(9, bool),
                np.empty(9, np.uint32),
                np.empty(1, np.uint8).view(_SizeLiar),
            ),
        ),
        ValueError,
    ),
    "unpack out claiming the words' length": (
        lambda c: c.unpack(
            np.full(9, 0xFFFFFFFF, np.uint32),
            out=(
                np.empty(9, np.uint16),
                np.empty(1, bool).view(_NineLiar),
                np.empty(9, np.uint32),
                np.empty(9, np.uint8),
            ),
        ),
        ValueError,
    ),
    "unpack out claiming to be an array": (
        lambda c: c.unpack(
            np.zeros(4, np.uint32),
            out=(np.empty(4, np.uint16), np.empty(4, bool), _ClassLiar(), np.empty(4, np.uint8)),
        ),
        TypeError,
    ),
    "unpack out is the words": (
        lambda c: (
            lambda w: c.unpack(
                w, out=(np.empty(4, np.uint16), np.empty(4, bool), w, np.empty(4, np.uint8))
            )
        )(np.zeros(4, np.uint32)),
        ValueError,
    ),
    "unpack out matrix": (
        lambda c: c.unpack(
            np.arange(3, dtype=np.uint32),
            out=(
                np.empty(3, np.uint16),
                np.empty(3, bool),
                np.matrix(np.empty(3, np.uint32)),
                np.empty(3, np.uint8),
            ),
        ),
        ValueError,
    ),
    "to_wire object": (lambda c: c.to_wire(np.array([None])), EncodeError),
    "to_wire negative": (lambda c: c.to_wire([-1]), EncodeError),
    "to_wire strided big-endian": (lambda c: c.to_wire(np.arange(9, dtype=">u4")[::-2]), "ok"),
    "from_wire partial word": (lambda c: c.from_wire(bytes(7)), DecodeError),
    "from_wire read-only view": (lambda c: c.from_wire(memoryview(bytes(8)), copy=False), "ok"),
    "check_handshake position -4": (lambda c: c.check_handshake(bytes(16), -4), IndexError),
    "check_handshake position past the end": (
        lambda c: c.check_handshake(bytes(16), 17),
        IndexError,
    ),
    "check_handshake position at the end": (
        lambda c: c.check_handshake(bytes(16), 16),
        DecodeError,
    ),
    "decode_prefix position -1": (lambda c: c.decode_prefix(bytes(16), -1), IndexError),
    "check_handshake position 2**70": (lambda c: c.check_handshake(bytes(16), 2**70), IndexError),
    "decode_prefix position -2**70": (lambda c: c.decode_prefix(bytes(16), -(2**70)), IndexError),
    # compress: model arrays
    "compress int array": (_compress(lambda: _model(np.ones(3, np.int32))), TypeError),
    "compress object array": (
        _compress(lambda: _model(np.array([1.0, 2.0], dtype=object))),
        TypeError,
    ),
    "compress complex array": (_compress(lambda: _model(np.ones(2, complex))), TypeError),
    "compress read-only": (_compress(lambda: _model(_ro(np.ones(3)))), ValueError),
    "compress not an array": (_compress(lambda: _model([1.0, 2.0])), TypeError),
    "compress claims to be an array": (_compress(lambda: _model(_ClassLiar())), TypeError),
    "compress not pairs": (_compress(lambda: [(np.ones(2),)]), TypeError),
    "compress not a model": (_compress(lambda: 7), TypeError),
    "compress 513 layers": (
        _compress(lambda: [(np.ones(1), np.ones(1)) for _ in range(513)]),
        EncodeError,
    ),
    "compress 2**21 + 1 elements": (
        _compress(lambda: _model(np.ones(2**21 + 1, np.float32))),
        EncodeError,
    ),
    "compress tau inf in float32": (
        _compress(lambda: _model(np.ones(2, np.float32)), 1e39),
        EncodeError,
    ),
    "compress tau nan": (_compress(lambda: _model(np.ones(2)), float("nan")), EncodeError),
    "compress tau negative": (_compress(lambda: _model(np.ones(2)), -1.0), EncodeError),
    "compress tau None": (_compress(lambda: _model(np.ones(2)), None), EncodeError),
    "compress NaN and inf": (
        _compress(
            lambda: _model(
                np.array([np.nan, np.inf, -np.inf, -np.nan, 0.5, -0.5, 1e-45], np.float32)
            )
        ),
        "ok",
    ),
    "compress NaN and inf float64, 2 threads": (
        _compress(
            lambda: _model(np.tile(np.array([np.nan, np.inf, -np.inf, 3.0]), 70_000)), threads=2
        ),
        "ok",
    ),
    "compress empty arrays": (
        _compress(
            lambda: _model(np.zeros(0, np.float32), np.zeros((3, 0)), bias=np.zeros(0, np.float16))
        ),
        "ok",
    ),
    "compress empty model": (_compress(lambda: []), "ok"),
    "compress 0-d arrays": (_compress(lambda: _model(np.array(2.0), bias=np.array(-3.0))), "ok"),
    "compress fortran, strided, reversed": (
        _compress(
            lambda: _model(
                np.asfortranarray(np.arange(12.0).reshape(3, 4)),
                np.arange(20.0)[::3],
                bias=np.arange(6.0, dtype=np.float32)[::-1],
            )
        ),
        "ok",
    ),
    "compress float16, longdouble, big-endian": (
        _compress(
            lambda: _model(
                np.arange(6, dtype=np.float16),
                np.arange(6, dtype=np.longdouble),
                bias=np.arange(4, dtype=">f4"),
            )
        ),
        "ok",
    ),
    "compress one array twice": (
        _compress(lambda: (lambda a: _model(a, a))(np.arange(-3.0, 3.0))),
        "ok",
    ),
    "compress transposed twin": (
        _compress(lambda: (lambda a: _model(a, a.T))(np.arange(-3.0, 3.0).reshape(2, 3))),
        "ok",
    ),
    "compress overlapping slices": (
        _compress(lambda: (lambda a: _model(a[:5], a[3:], bias=a[::2]))(np.arange(-4.0, 4.0))),
        "ok",
    ),
    "compress float16 view of float32": (
        _compress(lambda: (lambda a: _model(a, a.view(np.float16)))(np.full(4, 2.0, np.float32))),
        "ok",
    ),
    "compress self-overlapping 1-d": (_compress(lambda: _model(_self_overlapping())), "ok"),
    "compress self-overlapping 2-d": (
        _compress(lambda: _model(np.lib.stride_tricks.as_strided(np.arange(4.0), (3, 3), (8, 8)))),
        "ok",
    ),
    "compress matrix": (
        _compress(lambda: _model(np.matrix(np.arange(16.0, dtype=np.float32).reshape(4, 4)))),
        "ok",
    ),
    "compress size liar": (
        _compress(lambda: _model(np.full(3, 2.0, np.float32).view(_SizeLiar))),
        "ok",
    ),
    "compress ndim liar": (_compress(lambda: _model(np.full((4, 4), 2.0).view(_NdimLiar))), "ok"),
    # apply: words
    "apply float words": (_apply(lambda: _model(np.zeros(4)), np.zeros(2)), EncodeError),
    "apply object words": (
        _apply(lambda: _model(np.zeros(4)), np.array([0], dtype=object)),
        EncodeError,
    ),
    "apply negative words": (_apply(lambda: _model(np.zeros(4)), [-1]), EncodeError),
    "apply words past u32": (_apply(lambda: _model(np.zeros(4)), [2**32]), EncodeError),
    "apply 2-d words": (
        _apply(lambda: _model(np.zeros(4)), np.zeros((1, 1), np.uint32)),
        EncodeError,
    ),
    "apply no words": (_apply(lambda: _model(np.zeros(4)), np.zeros(0, np.uint32)), "ok"),
    "apply words strided big-endian read-only": (
        _apply(lambda: _model(np.zeros(4)), lambda: _ro(np.repeat(W0, 2).astype(">u4")[::2])),
        "ok",
    ),
    "apply word layer 511 of 1": (_apply(lambda: _model(np.zeros(4)), [0xFF800000]), DecodeError),
    "apply word index 2**21 - 1": (
        _apply(lambda: _model(np.zeros(4)), [(2**21 - 1) << 1]),
        DecodeError,
    ),
    "apply word of an empty array": (_apply(lambda: _model(np.zeros(0)), [0]), DecodeError),
    "apply every key, all bits set": (
        _apply(
            lambda: _model(np.zeros(4)),
            np.arange(0, 2**32, 2**22, dtype=np.uint64).astype(np.uint32) | 0x3FFFFF,
        ),
        DecodeError,
    ),
    # apply: model arrays and tau
    "apply int array": (_apply(lambda: _model(np.zeros(4, np.int64)), W0), TypeError),
    "apply object array": (_apply(lambda: _model(np.zeros(4, dtype=object)), W0), TypeError),
    "apply read-only": (_apply(lambda: _model(_ro(np.zeros(4))), W0), ValueError),
    "apply claims to be an array": (_apply(lambda: _model(_ClassLiar()), W0), TypeError),
    "apply tau inf in float32": (
        _apply(lambda: _model(np.zeros(4, np.float32)), W0, 1e39),
        EncodeError,
    ),
    "apply tau 0 in float16": (
        _apply(lambda: _model(np.zeros(4, np.float16)), W0, 1e-9),
        EncodeError,
    ),
    "apply tau string": (_apply(lambda: _model(np.zeros(4)), W0, "x"), EncodeError),
    "apply NaN and inf": (
        _apply(lambda: _model(np.array([np.nan, np.inf, -np.inf, -0.0], np.float32)), W0),
        "ok",
    ),
    "apply 0-d, fortran, strided, reversed": (
        _apply(
            lambda: [
                (np.asfortranarray(np.arange(8.0).reshape(2, 4)), np.arange(4.0)[::-2]),
                (np.array(1.0), np.zeros(0)),
            ],
            _apply_words([0, 0, 1, 0], [1, 0, 1, 1], [5, 1, 0, 5], [0, 1, 1, 0]),
        ),
        "ok",
    ),
    "apply float16, longdouble, big-endian": (
        _apply(
            lambda: [
                (np.zeros(4, np.float16), np.zeros(2, np.longdouble)),
                (np.zeros(4, ">f8"), np.zeros(2, np.float32)),
            ],
            _apply_words([0, 0, 1, 1, 1], [1, 0, 1, 0, 1], [3, 1, 3, 1, 3], [0, 1, 1, 0, 1]),
        ),
        "ok",
    ),
    "apply one array twice": (
        _apply(
            lambda: (lambda a: _model(a, a))(np.zeros(4, np.float32)),
            _apply_words([0, 1, 1, 0], [1, 1, 1, 1], [2, 2, 2, 2], [0, 0, 1, 0]),
        ),
        "ok",
    ),
    "apply transposed twin": (
        _apply(
            lambda: (lambda a: _model(a, a.T, bias=a[0]))(np.zeros((2, 3))),
            _apply_words([1, 0, 1, 0], [1, 1, 0, 0], [1, 3, 1, 0], [0, 0, 0, 1]),
        ),
        "ok",
    ),
    "apply float16 view of float32": (
        _apply(
            lambda: (lambda a: _model(a, a.view(np.float16)))(np.zeros(2, np.float32)),
            _apply_words([1, 0, 1], [1, 1, 1], [1, 0, 3], [0, 0, 0]),
        ),
        "ok",
    ),
    "apply self-overlapping 1-d": (
        _apply(
            lambda: _model(_self_overlapping()),
            _apply_words([0, 0, 0], [1, 1, 1], [0, 4, 2], [0, 0, 1]),
        ),
        "ok",
    ),
    "apply matrix": (
        _apply(
            lambda: _model(np.matrix(np.zeros((4, 4), np.float32))),
            _apply_words([0, 0], [1, 1], [5, 15], [0, 1]),
        ),
        "ok",
    ),
    "apply size liar, index past the array": (
        _apply(
            lambda: _model(np.zeros(3, np.float32).view(_SizeLiar)),
            _apply_words([0], [1], [2**20], [0]),
        ),
        DecodeError,
    ),
    "apply ndim liar": (
        _apply(lambda: _model(np.zeros((4, 4)).view(_NdimLiar)), _apply_words([0], [1], [13], [0])),
        "ok",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_same_outcome_from_both_twins(name):
    run, expected = HOSTILE[name]
    pure = _outcome(run, _pure)  # fresh inputs for each twin
    assert pure[0] == expected, pure
    assert _outcome(run, _fast()) == pure  # (skipped under WIREKIT_PURE=1)


def test_subclasses_give_what_their_plain_arrays_give(y2_codec):
    # a subclass's overrides change nothing: the kernels use the array's real memory layout
    plain = np.arange(-8.0, 8.0, dtype=np.float32).reshape(4, 4)
    for sub in (np.matrix(plain), plain.view(_NdimLiar), plain.view(_SizeLiar)):
        mine, ref = np.array(plain), np.array(plain)
        holder = mine.view(type(sub)) if type(sub) is not np.matrix else np.asmatrix(mine)
        words = y2_codec.compress([(holder, np.zeros(1))], 2.5)
        assert np.array_equal(words, _pure.compress([(ref, np.zeros(1))], 2.5))
        assert np.array_equal(mine, ref)
        y2_codec.apply([(holder, np.zeros(1))], words, 2.5)
        _pure.apply([(ref, np.zeros(1))], words, 2.5)
        assert np.array_equal(mine, ref)


def test_self_overlapping_array_is_worked_on_in_a_copy(y2_codec):
    # five elements, one float: each kernel sees five distinct 3.0s, the last store wins
    arr = _self_overlapping()
    words = y2_codec.compress([(arr, np.zeros(0))], 2.0)
    assert words.tolist() == [(i << 1) | 1 for i in range(5)]  # parameter 0, +tau
    assert arr.tolist() == [1.0] * 5
    y2_codec.apply([(arr, np.zeros(0))], words[:3], 0.25)
    assert arr.tolist() == [1.0] * 5  # element 4 was not updated, and it is stored last
    y2_codec.apply([(arr, np.zeros(0))], words[3:], 0.25)
    assert arr.tolist() == [1.25] * 5


# --- arrays sharing memory, generated -------------------------------------------------------


@st.composite
def shared_models(draw):
    """Layers whose arrays are views of one or two buffers: the same array twice,
    transposes, overlapping slices, reversed and strided views, other dtypes over the same
    bytes."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    base = np.array(
        draw(
            st.lists(st.sampled_from([0.0, 0.5, -1.5, 2.0, 3.25, -0.0]), min_size=24, max_size=24)
        ),
        dtype=dtype,
    )
    grid = base.reshape(4, 6)
    views = {
        "all": base,
        "grid": grid,
        "T": grid.T,
        "head": base[:10],
        "tail": base[6:],
        "odd": base[1::2],
        "rev": base[::-1],
        "cols": grid[:, 1:4],
        "half": base.view(np.float16)[:8] if dtype == np.float32 else base[:4],
        "swapped": base[:6].view(base.dtype.newbyteorder(">")),
    }
    names = st.sampled_from(sorted(views))
    layers = [(views[draw(names)], views[draw(names)]) for _ in range(draw(st.integers(1, 4)))]
    return base, layers


def _keys(layers):
    return [
        (k, w, pair[1 - w].size)
        for k, pair in enumerate(layers)
        for w in (0, 1)
        if pair[1 - w].size
    ]


@given(shared_models(), st.data())
def test_apply_on_shared_memory_equals_reference(shared, data):
    base, layers = shared
    valid = _keys(layers)
    picks = data.draw(st.lists(st.sampled_from(valid), max_size=30))
    words = [
        y2_word(k, w, data.draw(st.integers(0, size - 1)), data.draw(st.integers(0, 1)))
        for k, w, size in picks
    ]
    ref_base = base.copy()
    ref = _rebind(layers, base, ref_base)
    _fast().apply(layers, np.array(words, np.uint32), 0.25)
    _pure.apply(ref, np.array(words, np.uint32), 0.25)
    assert base.tobytes() == ref_base.tobytes()


@given(shared_models())
def test_compress_on_shared_memory_equals_reference(shared):
    base, layers = shared
    ref_base = base.copy()
    ref = _rebind(layers, base, ref_base)
    words = _fast().compress(layers, 0.75)
    assert np.array_equal(words, _pure.compress(ref, 0.75))
    assert base.tobytes() == ref_base.tobytes()


def _rebind(layers, base, other):
    """The same views as ``layers`` (of ``base``), over ``other``, a copy of ``base``."""
    start = base.__array_interface__["data"][0]

    def rebind(view):
        offset = view.__array_interface__["data"][0] - start
        return np.ndarray(view.shape, view.dtype, other.data, offset, view.strides)

    return [(rebind(w), rebind(b)) for w, b in layers]
