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
