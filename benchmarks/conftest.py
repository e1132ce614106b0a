"""Benchmarks compare, in one run, the Cython twin ("fast"), the construct reference
("construct") and the best plain-Python/NumPy baseline ("baseline") on the same input.

Each group has one benchmark per contender; ``python benchmarks/ratios.py bench.json`` turns
pytest-benchmark's JSON into the ratio table.  Timings are never asserted: CI machines are
shared and noisy.  What is asserted is that every contender computes the same result.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

# pytest imports tests/conftest.py and this file both under the module name "conftest", and
# the last one imported wins: tests that do `from conftest import load_codec` must find it
# here too when the benchmarks are collected in the same run.
import importlib.util

_spec = importlib.util.spec_from_file_location(
    "_wirekit_tests_conftest", Path(__file__).resolve().parent.parent / "tests" / "conftest.py"
)
_tests_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tests_conftest)
load_codec = _tests_conftest.load_codec
