"""Benchmarks measure the compiled twins, or say loudly that they do not.

A run is only worth quoting when the wirekit it imports -- in this process and in every
server process it starts -- has its compiled twins.  Running from a checkout's root after a
non-editable install imports the uncompiled source tree instead; so does every subprocess
started from there.  Hence:

* ``WIREKIT_REQUIRE_FAST=1`` is set for this process and inherited by every process it
  starts: a twin that does not load raises instead of silently running the pure path;
* every compiled twin is imported here, before any benchmark, so a bad install stops the run
  at once with the reason;
* what was measured is written into the JSON report (``machine_info["wirekit"]``), and
  ``ratios.py`` prints it above the table.

``WIREKIT_PURE=1`` measures the pure path on purpose; the report then says ``pure``.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

import wirekit
from wirekit import _impl

FAST_DIR = Path(wirekit.__file__).parent / "_fast"
TWINS = sorted(p.stem for p in FAST_DIR.glob("*.pyx")) or sorted(
    p.name.split(".")[0] for p in FAST_DIR.glob("*.so")
)


def _measured() -> dict[str, object]:
    pure = _impl.pure_requested()
    return {
        "twins": "pure" if pure else "compiled",
        "package": str(Path(wirekit.__file__).parent),
        "loaded": [] if pure else TWINS,
    }


def pytest_configure(config: pytest.Config) -> None:
    if _impl.pure_requested():
        return
    os.environ[_impl.REQUIRE_ENV_VAR] = "1"
    missing = []
    for name in TWINS:
        try:
            importlib.import_module(f"wirekit._fast.{name}")
        except ImportError as exc:
            missing.append(f"{name}: {exc}")
    if missing or not TWINS:
        raise pytest.UsageError(
            f"benchmarks: the compiled twins of the wirekit imported from "
            f"{Path(wirekit.__file__).parent} did not load ({'; '.join(missing) or 'none'}). "
            "Build them (pip install -e .), or run from outside an uncompiled checkout; "
            "WIREKIT_PURE=1 measures the pure path on purpose."
        )


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    machine_info["wirekit"] = _measured()
