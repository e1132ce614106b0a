"""The torch extra is pinned to the version these machines install from a local wheel, and CI
installs it and refuses to skip the y2 DDP tests."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_torch_extra_is_pinned_exactly():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # any other version, or a range, downloads several GB on the CI machines
    assert project["optional-dependencies"]["torch"] == ["torch==2.13.0"]


def test_ci_installs_torch_and_requires_its_tests():
    run = (ROOT / ".ci" / "run").read_text()
    assert "export WIREKIT_REQUIRE_TORCH=1" in run
    assert "\nbash scripts/test.sh\n" in run
    # the README's test command, which .ci/run runs, installs the torch extra first
    script = (ROOT / "scripts" / "test.sh").read_text()
    install = script.index("\npython -m pip install -e '.[test,torch]'\n")
    # then the whole suite (its first run may carry options, e.g. where benchmarks write)
    assert script.index("\npython -m pytest", install) > install
    readme = (ROOT / "README.md").read_text()
    assert "```sh\npip install -e '.[serve]' && wirekit decode" in readme
    assert "\nbash scripts/test.sh\n```" in readme
