"""Every extra that wirekit's code and documentation tell a user to install exists (issue 29:
``_loop.py`` named a ``fast`` extra that pyproject.toml never had), and the message a user
meets when the uvloop loop is asked for without uvloop names one that does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)
#: how an extra is named: wirekit[a,b], '.[a,b]', "the ``a`` extra", "the `a` extra"
NAMED = (
    re.compile(r"wirekit\[([\w,-]+)\]"),
    re.compile(r"['\"]\.\[([\w,-]+)\]['\"]"),
    re.compile(r"the\s+`{1,2}([\w-]+)`{1,2}\s+extras?\b"),
)


def named_extras(text: str) -> set[str]:
    return {
        name.strip()
        for pattern in NAMED
        for match in pattern.finditer(text)
        for name in match.group(1).split(",")
    }


def test_every_extra_the_code_and_docs_name_exists():
    files = [
        *ROOT.glob("wirekit/**/*.py"),
        *ROOT.glob("*.md"),
        *ROOT.glob("specs/*.md"),
        *ROOT.glob("scripts/*.sh"),
        *ROOT.glob(".ci/*"),
        ROOT / "Dockerfile",
    ]
    named: dict[str, set[str]] = {}
    for path in files:
        if path.is_file():
            for extra in named_extras(path.read_text(encoding="utf-8")):
                named.setdefault(extra, set()).add(str(path.relative_to(ROOT)))
    assert {"serve", "uvloop"} <= set(named)  # the scan finds the ones we know of
    unknown = {extra: sorted(where) for extra, where in named.items() if extra not in EXTRAS}
    assert not unknown, f"extras named but not in pyproject.toml: {unknown}"


def test_asking_for_uvloop_without_it_names_the_extra_that_brings_it():
    # the real command line, in a Python where uvloop cannot be imported
    hide_uvloop = (
        "import runpy, sys; sys.modules['uvloop'] = None; "
        "runpy.run_module('wirekit', run_name='__main__', alter_sys=True)"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", hide_uvloop, "mip", "serve", "--loop", "uvloop",
         "--listen", "tcp://127.0.0.1:0", "--handler", "wirekit.mip.runtime:echo"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()  # one line: no warning of an unawaited coroutine
    assert "the uvloop event loop needs the 'uvloop' extra" in line
    (extra,) = named_extras(line)
    assert extra in EXTRAS
