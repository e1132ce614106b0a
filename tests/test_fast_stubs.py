"""Every compiled twin ships a type stub (issue 41): ``wirekit/_fast/<name>.pyi`` beside each
``<name>.pyx``, installed with the package.  That each stub matches its built module (names,
parameters, defaults) is checked by ``mypy.stubtest`` in CI (``scripts/stubtest.sh``)."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
FAST = ROOT / "wirekit" / "_fast"


def test_every_compiled_twin_has_a_stub():
    twins = {p.stem for p in FAST.glob("*.pyx")}
    stubs = {p.stem for p in FAST.glob("*.pyi")}
    assert twins, "no .pyx found"
    assert twins - stubs == set(), f"compiled twins without a stub: {sorted(twins - stubs)}"
    assert stubs - twins == set(), f"stubs of no compiled twin: {sorted(stubs - twins)}"


def test_the_stubs_and_py_typed_are_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    data = config["tool"]["setuptools"]["package-data"]["wirekit"]
    assert "py.typed" in data
    assert "_fast/*.pyi" in data
    assert (ROOT / "wirekit" / "py.typed").is_file()
