"""Which implementation is active, and how WIREKIT_PURE chooses it."""

from __future__ import annotations

import doctest
import importlib
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import wirekit
from wirekit import _impl, mip


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", True),
        ("true", True),
        (" YES ", True),
        ("on", True),
        ("0", False),
        ("", False),
        ("no", False),
    ],
)
def test_pure_requested_reads_one_variable(value, expected):
    assert _impl.pure_requested({"WIREKIT_PURE": value}) is expected
    assert _impl.pure_requested({}) is False


def test_the_fast_path_is_active_in_this_run():
    # A build that silently failed must not pass as green.
    if _impl.pure_requested():
        assert wirekit.IMPLEMENTATION == "pure"
    else:
        assert wirekit.IMPLEMENTATION == "fast"
        assert mip.encode is _impl.twin("mip", "fast").encode


FAST_DIR = Path(wirekit.__file__).parent / "_fast"


@pytest.mark.parametrize("name", sorted(p.stem for p in FAST_DIR.glob("*.pyx")))
def test_every_compiled_twin_loads_in_a_compiled_run(name):
    # Every .pyx must be built and importable: CI's compiled run may not pass on a pure path
    # that a failed build or a missing library selected quietly.
    if _impl.pure_requested():
        assert _impl.load_fast(name) is None
    else:
        assert _impl.load_fast(name) is importlib.import_module(f"wirekit._fast.{name}")


def test_runtimes_run_on_their_compiled_twins_in_a_compiled_run():
    from wirekit import clipper, y2, zmtp
    from wirekit.clipper import _lane, _zio
    from wirekit.mip import connection

    expected = "pure" if _impl.pure_requested() else "fast"
    for module in (mip, clipper, y2, zmtp, _zio, _lane, connection):
        assert expected == module.IMPLEMENTATION, module.__name__


def _implementation_in_subprocess(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "WIREKIT_PURE"}
    if env_value is not None:
        env["WIREKIT_PURE"] = env_value
    code = "import wirekit, wirekit.mip as m; print(wirekit.IMPLEMENTATION, m.IMPLEMENTATION)"
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_wirekit_pure_forces_the_pure_path():
    assert _implementation_in_subprocess("1") == "pure pure"


def test_pure_path_decodes_like_the_fast_path():
    wire = mip.encode(mip.Inference.request([[mip.Item.text("x")]]))
    assert _impl.twin("mip", "pure").decode(wire) == _impl.twin("mip", "fast").decode(wire)


def test_twin_rejects_unknown_implementation():
    with pytest.raises(ValueError, match="impl must be"):
        _impl.twin("mip", "turbo")


def test_facade_docstring_examples_run():
    failures, tried = doctest.testmod(mip, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0


def test_every_fallback_to_the_pure_path_warns(monkeypatch):
    """Issue 14: one way to pick an implementation, and no silent pure path -- a twin that
    is not built, or that a runtime cannot use, warns FastPathMissing (once per reason)."""
    monkeypatch.delenv("WIREKIT_PURE", raising=False)
    monkeypatch.delenv(_impl.REQUIRE_ENV_VAR, raising=False)
    monkeypatch.setattr(_impl, "_loaded", {})
    monkeypatch.setattr(_impl, "_warned", set())
    with pytest.warns(_impl.FastPathMissing, match=r"wirekit\._fast\.nosuchtwin is not used"):
        assert _impl.select("nosuchtwin", mip) is mip
    with pytest.warns(_impl.FastPathMissing, match="libzmq not found"):
        _impl.fallback("zio", "libzmq not found")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _impl.fallback("zio", "libzmq not found")  # the same fallback again: warned once
        assert _impl.select("nosuchtwin", mip) is mip


def test_select_declines_the_compiled_twin_silently_when_pure_is_asked(monkeypatch):
    monkeypatch.setenv("WIREKIT_PURE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _impl.select("servelane", mip) is mip


def test_the_dispatcher_picks_its_lane_through_the_selector():
    from wirekit.serve.dispatch import lane as pure_lane
    from wirekit.serve.dispatch.dispatcher import Dispatcher

    d = Dispatcher({}, None, {}, None, None, None)
    assert d.lane is _impl.select("servelane", pure_lane)
    assert d.lane is (pure_lane if _impl.pure_requested() else _impl.twin("servelane", "fast"))


def test_a_fallback_raises_where_the_compiled_twins_are_required(monkeypatch, tmp_path):
    """Issue 21: a benchmark run (which sets WIREKIT_REQUIRE_FAST for itself and every process
    it starts) cannot silently measure the pure path of an uncompiled source tree."""
    monkeypatch.delenv("WIREKIT_PURE", raising=False)
    monkeypatch.setenv(_impl.REQUIRE_ENV_VAR, "1")
    monkeypatch.setattr(_impl, "_loaded", {})
    with pytest.raises(_impl.FastPathRequired, match="nosuchtwin is not used"):
        _impl.select("nosuchtwin", mip)
    # ... and in a process started from an uncompiled copy of the package
    tree = tmp_path / "checkout"
    shutil.copytree(Path(wirekit.__file__).parent, tree / "wirekit",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))  # fmt: skip
    code = "from wirekit import mip; mip.encode"
    env = {**os.environ, _impl.REQUIRE_ENV_VAR: "1"}
    env.pop("WIREKIT_PURE", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode != 0 and "FastPathRequired" in proc.stderr
    env.pop(_impl.REQUIRE_ENV_VAR)
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode != 0 and "FastPathMissing" in proc.stderr  # loud even without it
