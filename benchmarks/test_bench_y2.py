"""y2: pack, unpack, to_wire on 1 M words; compress and apply on a 10 M-parameter model;
Delta message decode.  "baseline" is wirekit's NumPy vectorized reference (``_pure``).

Each kernel is shown against its physical bound: the ``copy-same-bytes`` contender is a
plain C copy of the kernel's traffic (``benchmarks/membound.py``: it reads the bytes the
kernel reads, writes the bytes it writes, one thread, allocating its output as the kernel
does); ``compress``'s is ``read-once``, a C streaming sum over the residuals.  A
single-threaded kernel near 1.0× of it is at the memory bound; the default (threaded) call
may beat it.

Most rows time back-to-back calls.  The ``calls=2ms-apart`` rows sleep 2 ms (untimed) before
every call, as a training loop leaves gaps between its calls: wirekit's worker threads have
stopped spinning by then (they spin 0.25 ms after a call, then nap) and must notice the
work.  The compress rows copy the 40 MB model (untimed) before every call, a gap of several
ms too.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from membound import copy_traffic, read_once

from wirekit._fast import y2 as fast
from wirekit.y2 import _pure, spec
from wirekit.y2.messages import Delta

N_WORDS = 1_000_000
#: 10 layers of 1000 × 1000 weights and 1000 biases, float32: 10.01 M parameters.
LAYERS, ROWS, COLS = 10, 1000, 1000
TAU = 2.5  # with N(0, 1) residuals about 1.2 % of the elements emit a word

_rng = np.random.default_rng(2024)
FIELDS = (
    _rng.integers(0, 512, N_WORDS).astype(np.uint16),
    _rng.integers(0, 2, N_WORDS).astype(np.bool_),
    _rng.integers(0, 2**21, N_WORDS).astype(np.uint32),
    _rng.integers(0, 2, N_WORDS).astype(np.uint8),
)
WORDS = _pure.pack(*FIELDS)
WIRE = _pure.to_wire(WORDS)
RESIDUALS = [
    (
        _rng.normal(0, 1, (ROWS, COLS)).astype(np.float32),
        _rng.normal(0, 1, COLS).astype(np.float32),
    )
    for _ in range(LAYERS)
]
COMPRESSED = _pure.compress([tuple(a.copy() for a in p) for p in RESIDUALS], TAU)
#: ~1 M words addressing the model, in compress order (as a node receives them).
APPLY_WORDS = np.concatenate(
    [COMPRESSED, _pure.compress([tuple(a.copy() for a in p) for p in RESIDUALS], 1.0)]
)[:N_WORDS]
MODEL = [(np.zeros((ROWS, COLS), np.float32), np.zeros(COLS, np.float32)) for _ in range(LAYERS)]
SMALL_DELTA = _pure.encode(Delta(WORDS[:4096]))
#: pack's input bytes in one buffer: the bound reads them and writes a word array.
FIELD_BYTES = np.concatenate([f.view(np.uint8) for f in FIELDS])
UNPACKED_BYTES = sum(f.nbytes for f in FIELDS)


def _copy_bound(src: np.ndarray, out_bytes: int, out: np.ndarray | None = None) -> np.ndarray:
    """The traffic of a kernel reading ``src`` and writing ``out_bytes`` (into ``out``, or a
    new array as the kernels allocate theirs)."""
    dst = np.empty(out_bytes, np.uint8) if out is None else out
    copy_traffic(src, dst)
    return dst


def _fresh_residuals():
    return ([tuple(a.copy() for a in pair) for pair in RESIDUALS], TAU), {}


#: How the calls are spaced: back to back, or each after an untimed 2 ms sleep.
CALLS = {"back-to-back": 0.0, "2ms-apart": 0.002}


def _timed(benchmark, fn, args, calls):
    """``benchmark(fn, *args)``, or with ``calls="2ms-apart"`` each call after a sleep."""
    pause = CALLS[calls]
    if not pause:
        return benchmark(fn, *args)

    def setup():
        time.sleep(pause)
        return args, {}

    return benchmark.pedantic(fn, setup=setup, rounds=30, warmup_rounds=1)


# "fast" is the default call (threads=None: the available cores for inputs this large);
# "fast-1thread" pins one thread.  The baseline is single-threaded NumPy either way.
@pytest.mark.benchmark(group="y2 pack 1M words")
@pytest.mark.parametrize("calls", list(CALLS))
@pytest.mark.parametrize("who", ["fast", "fast-1thread", "baseline", "copy-same-bytes"])
def test_pack(benchmark, who, calls):
    if who == "copy-same-bytes":
        got = _timed(benchmark, _copy_bound, (FIELD_BYTES, WORDS.nbytes), calls)
        assert got.nbytes == WORDS.nbytes
        return
    fn = {
        "fast": fast.pack,
        "fast-1thread": lambda *fields: fast.pack(*fields, threads=1),
        "baseline": _pure.pack,
    }[who]
    assert np.array_equal(_timed(benchmark, fn, FIELDS, calls), WORDS)


def _unpack_out():
    return tuple(np.empty(N_WORDS, f.dtype) for f in FIELDS)


@pytest.mark.benchmark(group="y2 unpack 1M words")
@pytest.mark.parametrize("who", ["fast", "fast-1thread", "baseline", "copy-same-bytes"])
def test_unpack(benchmark, who):
    if who == "copy-same-bytes":
        assert benchmark(_copy_bound, WORDS, UNPACKED_BYTES).nbytes == UNPACKED_BYTES
        return
    fn = {
        "fast": fast.unpack,
        "fast-1thread": lambda words: fast.unpack(words, threads=1),
        "baseline": _pure.unpack,
    }[who]
    out = benchmark(fn, WORDS)
    assert all(np.array_equal(a, b) for a, b in zip(out, FIELDS, strict=True))


@pytest.mark.benchmark(group="y2 unpack 1M words into out=")
@pytest.mark.parametrize("calls", list(CALLS))
@pytest.mark.parametrize("who", ["fast", "fast-1thread", "baseline", "copy-same-bytes"])
def test_unpack_out(benchmark, who, calls):
    if who == "copy-same-bytes":
        dst = np.empty(UNPACKED_BYTES, np.uint8)
        assert _timed(benchmark, _copy_bound, (WORDS, UNPACKED_BYTES, dst), calls) is dst
        return
    fn = {
        "fast": fast.unpack,
        "fast-1thread": lambda words, out: fast.unpack(words, out=out, threads=1),
        "baseline": _pure.unpack,
    }[who]
    out = _unpack_out()
    got = _timed(benchmark, lambda words: fn(words, out=out), (WORDS,), calls)
    assert all(a is b for a, b in zip(got, out, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(out, FIELDS, strict=True))


@pytest.mark.benchmark(group="y2 to_wire 1M words")
@pytest.mark.parametrize("who", ["fast", "baseline", "copy-same-bytes"])
def test_to_wire(benchmark, who):
    if who == "copy-same-bytes":
        assert benchmark(_copy_bound, WORDS, len(WIRE)).nbytes == len(WIRE)
        return
    fn = {"fast": fast.to_wire, "baseline": _pure.to_wire}[who]
    assert benchmark(fn, WORDS) == WIRE


@pytest.mark.benchmark(group="y2 from_wire 1M words")
@pytest.mark.parametrize("who", ["fast", "baseline", "copy-same-bytes"])
def test_from_wire(benchmark, who):
    if who == "copy-same-bytes":
        wire = np.frombuffer(WIRE, np.uint8)
        assert benchmark(_copy_bound, wire, WORDS.nbytes).nbytes == WORDS.nbytes
        return
    fn = {"fast": fast.from_wire, "baseline": _pure.from_wire}[who]
    assert np.array_equal(benchmark(fn, WIRE), WORDS)


@pytest.mark.benchmark(group="y2 compress 10M params f32")
@pytest.mark.parametrize("who", ["fast", "fast-1thread", "baseline", "read-once"])
def test_compress(benchmark, who):
    if who == "read-once":  # the bound: one C pass reading the same fresh copies
        expected = read_once(a for pair in RESIDUALS for a in pair)

        def read_all(residuals, tau):
            return read_once(a for pair in residuals for a in pair)

        total = benchmark.pedantic(read_all, setup=_fresh_residuals, rounds=20, warmup_rounds=2)
        assert total == expected
        return
    fn = {
        "fast": fast.compress,  # threads=None: the available cores
        "fast-1thread": lambda residuals, tau: fast.compress(residuals, tau, threads=1),
        "baseline": _pure.compress,
    }[who]
    # Every round starts from the same residuals (the copy is not timed).
    words = benchmark.pedantic(fn, setup=_fresh_residuals, rounds=20, warmup_rounds=2)
    assert np.array_equal(words, COMPRESSED)


@pytest.mark.benchmark(group="y2 apply 1M words to 10M params")
@pytest.mark.parametrize("who", ["fast", "baseline"])
def test_apply(benchmark, who):
    fn = {"fast": fast.apply, "baseline": _pure.apply}[who]
    model = [tuple(a.copy() for a in pair) for pair in MODEL]
    benchmark(fn, model, APPLY_WORDS, 0.01)
    once = [tuple(a.copy() for a in pair) for pair in MODEL]
    fn(once, APPLY_WORDS, 0.01)
    expected = [tuple(a.copy() for a in pair) for pair in MODEL]
    _pure.apply(expected, APPLY_WORDS, 0.01)
    assert all(
        np.array_equal(a, b)
        for p, q in zip(once, expected, strict=True)
        for a, b in zip(p, q, strict=True)
    )


@pytest.mark.benchmark(group="y2 delta message decode 4k words")
@pytest.mark.parametrize("who", ["fast", "construct", "baseline"])
def test_delta_decode(benchmark, who):
    run = {
        "fast": lambda: fast.decode(SMALL_DELTA).words,
        "construct": lambda: spec.MESSAGE.parse(SMALL_DELTA).payload.words,
        "baseline": lambda: _pure.decode(SMALL_DELTA).words,
    }[who]
    words = benchmark(run)
    if who == "construct":
        words = [(w.param << 22) | (w.index << 1) | w.positive for w in words]
    assert np.array_equal(np.asarray(words, dtype=np.uint32), WORDS[:4096])
