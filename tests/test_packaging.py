"""What a package index shows, and the wheel builds, agree with each other: the Pythons that
``requires-python`` admits are those the classifiers name, cibuildwheel builds and
``scripts/build-wheels.sh`` builds and tests (CI runs that script); both test a wheel with
the same codec and command-line tests; the license file is there.  (The wheels themselves
are built, repaired, installed without a compiler and tested by that script, not here.)"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
BUILD_WHEELS = (ROOT / "scripts" / "build-wheels.sh").read_text()


def supported_pythons() -> list[str]:
    """The 3.x versions requires-python admits, up to the newest CI has (3.13)."""
    (lowest,) = re.fullmatch(r">=3\.(\d+)", PROJECT["requires-python"]).groups()
    return [f"3.{minor}" for minor in range(int(lowest), 14)]


def test_the_classifiers_name_the_supported_pythons():
    named = [
        c.removeprefix("Programming Language :: Python :: ")
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert named == supported_pythons()


def test_cibuildwheel_and_the_script_build_the_supported_pythons():
    selectors = PYPROJECT["tool"]["cibuildwheel"]["build"].split()
    assert selectors == [f"cp{v.replace('.', '')}-*" for v in supported_pythons()]
    (default,) = re.findall(r"versions=\(([\d. ]+)\)", BUILD_WHEELS)
    assert default.split() == supported_pythons()


def test_cibuildwheel_and_the_script_run_the_same_tests():
    (listed,) = re.findall(r"TESTS=\(([^)]*)\)", BUILD_WHEELS)
    script_tests = listed.split()
    command = PYPROJECT["tool"]["cibuildwheel"]["test-command"][-1]
    cibuildwheel_tests = [
        word.removeprefix("{project}/") for word in shlex.split(command) if word.endswith(".py")
    ]
    assert cibuildwheel_tests == script_tests
    for test in script_tests:
        assert (ROOT / test).is_file(), test
    # with the test-core extra alone
    assert PYPROJECT["tool"]["cibuildwheel"]["test-extras"] == ["test-core"]
    assert "test-core" in PROJECT["optional-dependencies"]


def test_the_license_file_is_there():
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
