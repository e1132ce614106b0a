"""Fuzz findings replayed in the normal suite (no atheris needed).

Every file in ``fuzz/regressions/<target>/`` is an input the fuzzer once found a crash or a
fast/pure disagreement with; each goes through the very check the fuzzer runs
(``fuzz/differential.py``), which calls both twins and requires the same value or the same
error.  The seeds made from the golden vectors and samples (``fuzz/seeds.py``) are replayed
too, and the check itself is tested: a disagreement or a crash must not pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import differential
import pytest
import seeds

from wirekit._impl import pure_requested, twin
from wirekit.errors import DecodeError

REGRESSIONS = Path(__file__).resolve().parent.parent / "fuzz" / "regressions"

CASES = [
    pytest.param(target, data, id=f"{target}/{name}")
    for target in differential.TARGETS
    for name, data in differential.inputs(REGRESSIONS / target)
]
SEEDS = [
    pytest.param(target, data, id=f"{target}/{name}")
    for target in differential.TARGETS
    for name, data in seeds.seeds(target).items()
]


@pytest.fixture
def both_twins():
    if pure_requested():
        pytest.skip("WIREKIT_PURE=1: the differential check needs the Cython twin")


@pytest.mark.parametrize(("target", "data"), CASES)
def test_regression_input_same_outcome_from_both_twins(both_twins, target, data):
    differential.TARGETS[target](data)


@pytest.mark.parametrize(("target", "data"), SEEDS)
def test_seed_same_outcome_from_both_twins(both_twins, target, data):
    differential.TARGETS[target](data)


def test_every_target_has_seeds():
    assert {p.values[0] for p in SEEDS} == set(differential.TARGETS)


FAST = Path(__file__).resolve().parent.parent / "wirekit" / "_fast"


def test_every_compiled_module_is_fuzzed():
    # every Cython twin has a target, and the regressions replay every target's saved inputs
    assert set(differential.COMPILED) == set(differential.TARGETS)
    driven = {m for modules in differential.COMPILED.values() for m in modules}
    assert driven == {p.stem for p in FAST.glob("*.pyx")}


@pytest.mark.parametrize("target", sorted(differential.TARGETS))
def test_a_target_loads_the_compiled_modules_it_names(both_twins, target):
    # in a fresh interpreter: nothing of wirekit._fast is loaded until the target runs
    script = (
        "import json, sys, differential, seeds\n"
        "def fast(): return sorted(m for m in sys.modules if m.startswith('wirekit._fast.'))\n"
        "before = fast()\n"
        f"for data in seeds.seeds({target!r}).values():\n"
        f"    differential.TARGETS[{target!r}](data)\n"
        "print(json.dumps([before, fast()]))"
    )
    fuzz_dir = REGRESSIONS.parent
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=fuzz_dir,
        env={**os.environ, "PYTHONPATH": str(fuzz_dir)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    before, after = json.loads(out.strip().splitlines()[-1])
    assert before == []
    assert {f"wirekit._fast.{m}" for m in differential.COMPILED[target]} <= set(after)


def _with_fast(monkeypatch, protocol, **functions):
    """Make the checks see a 'fast' twin of ``protocol`` that is the pure one but for
    ``functions``."""
    real = twin

    def fake(proto, impl):
        module = real(proto, impl)
        if proto == protocol and impl == "fast":
            return SimpleNamespace(**{**vars(real(proto, "pure")), **functions})
        return module

    monkeypatch.setattr(differential, "twin", fake)


def test_a_different_value_is_a_disagreement(both_twins, monkeypatch):
    pure = twin("y2", "pure")
    _with_fast(monkeypatch, "y2", decode=lambda buf: pure.decode(bytes(buf)[:-4] + b"\0" * 4))
    data = seeds.seeds("y2_decode")["delta-edge"]
    with pytest.raises(differential.Disagreement, match=r"y2\.decode"):
        differential.y2_decode(data)


def test_a_different_error_offset_is_a_disagreement(both_twins, monkeypatch):
    def decode(buf):
        raise DecodeError("mip", "version", 1, "unsupported version 1 (expected 0)")

    _with_fast(monkeypatch, "mip", decode=decode)
    with pytest.raises(differential.Disagreement, match=r"mip\.decode"):
        differential.mip_decode(b"\x01\x01\x00\x00\x00\x00\x00\x00")


def test_a_lost_stream_event_is_a_disagreement(both_twins, monkeypatch):
    # A codec that consumes the bytes of its last event without handing the event out
    pure = twin("zmtp", "pure")

    def decode_events(buf, pos=0, phase=0, final=True, max_frame_size=None, **limits):
        events, end, phase, error = pure.decode_events(
            buf, pos, phase, final, max_frame_size, **limits
        )
        return events[:-1], end, phase, error

    _with_fast(monkeypatch, "zmtp", decode_events=decode_events)
    data = seeds.seeds("zmtp_stream")["messages-plan0"]
    with pytest.raises(differential.Disagreement, match="StreamReader"):
        differential.zmtp_stream(data)


def test_an_unexpected_exception_is_a_crash_not_an_outcome(both_twins, monkeypatch):
    def decode(frames, generation, direction):
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    _with_fast(monkeypatch, "clipper", decode=decode)
    with pytest.raises(ValueError, match="4300"):
        differential.clipper_decode(seeds.seeds("clipper_decode")["v3-heartbeat"])


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", ([], b"")),
        (b"\x00abc", ([b"abc"], b"abc")),
        (b"\x01\x01abcde", ([b"ab", b"cd", b"e"], b"abcde")),
        (b"\x02\x41\x80abcd", ([bytearray(b"ab"), memoryview(b"c"), bytearray(b"d")], b"abcd")),
    ],
)
def test_chunk_plans(data, expected):
    chunks, stream = differential._chunks(data)
    assert ([bytes(c) for c in chunks], stream) == ([bytes(c) for c in expected[0]], expected[1])
    assert [type(c) for c in chunks] == [type(c) for c in expected[0]]


def test_clipper_frames_round_trip():
    frames = [b"", b"\x03\x00\x00\x00", b"x" * 300]
    assert differential.clipper_frames(differential.frames_input(frames)) == frames
