"""The ``wirekit`` command imports what the command run needs, and no more (issue 29): on
Python 3.10, ``wirekit decode`` after a plain ``pip install .`` died importing ``tomli`` (the
``serve`` extra's) because building the parser imported every command's module.  The run on
3.10 itself is CI's (``scripts/build-wheels.sh``); here the real command line, in a real
process, is asked what it imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MIP_SESSION = ROOT / "samples" / "mip-session.bin"
#: the modules of the other commands, and what only they need (extras among them)
OTHER_COMMANDS = {
    "decode": ("wirekit.serve", "wirekit.y2.commands", "wirekit.clipper.commands",
               "wirekit.mip.cli", "aiohttp", "prometheus_client", "tomli", "tomllib"),
    "mip": ("wirekit.serve", "wirekit.y2.commands", "wirekit.clipper.commands", "aiohttp",
            "tomli", "tomllib"),
}  # fmt: skip


#: ``python -m wirekit ARGV`` that writes, as it exits, every module it imported
RECORDING_WIREKIT = (
    "import atexit, runpy, sys\n"
    "out = sys.argv.pop(1)\n"
    "def record():\n"
    "    with open(out, 'w') as fh:\n"
    "        fh.write('\\n'.join(sorted(sys.modules)))\n"
    "atexit.register(record)\n"
    "runpy.run_module('wirekit', run_name='__main__', alter_sys=True)\n"
)


def imports_of(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``wirekit ARGV``; its result and every module it imported."""
    record = tmp_path / "modules.txt"
    done = subprocess.run(
        [sys.executable, "-c", RECORDING_WIREKIT, str(record), *argv],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    return done, set(record.read_text().split())


def loaded(modules: set[str], names: tuple[str, ...]) -> set[str]:
    return {m for m in modules for n in names if m == n or m.startswith(n + ".")}


def test_decode_imports_nothing_of_the_other_commands(tmp_path):
    done, modules = imports_of(tmp_path, "decode", "--proto", "mip", str(MIP_SESSION))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wirekit.mip.dump" in modules  # the watch sees the command's own imports
    assert loaded(modules, OTHER_COMMANDS["decode"]) == set()


def test_a_runtime_commands_help_imports_only_its_own_module(tmp_path):
    done, modules = imports_of(tmp_path, "mip", "serve", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wirekit.mip.cli" in modules
    assert loaded(modules, OTHER_COMMANDS["mip"]) == set()


@pytest.mark.parametrize("argv", [["--help"], ["no-such-command"]])
def test_the_whole_list_still_names_every_command(argv):
    done = subprocess.run(
        [sys.executable, "-m", "wirekit", *argv], capture_output=True, text=True, timeout=120,
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    text = done.stdout + done.stderr
    for command in ("decode", "record", "dissector", "mip", "clipper", "serve", "y2"):
        assert command in text
    assert done.returncode == (0 if argv == ["--help"] else 2)
