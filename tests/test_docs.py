"""Every ```python block of README.md and specs/*.md runs, as written.

How the blocks are found and run (keep the markdown to these rules):

- A block is a fence line ```` ```python ```` up to the next ```` ``` ```` (found by
  tests/docblocks.py, which tests/test_readme_shell.py shares for the shell blocks).  Other
  fences (``json``, plain) are data and are left alone.
- Each block runs on its own, in a fresh interpreter and a fresh namespace: every block of the
  README and the specs reads as a self-contained snippet (its own imports), so none may lean
  on an earlier one.
- A block whose lines start with ``>>>`` is a doctest: its outputs are checked
  (``ELLIPSIS`` and ``NORMALIZE_WHITESPACE`` on).  Any other block is executed as a script and
  must finish without an exception.
- A block that cannot run here (it needs several ``torch.distributed`` processes, say) is
  marked on the line just before its fence with ``<!-- not run: REASON -->`` (invisible on
  GitHub).  Those are skipped with their reason, listed by :func:`test_not_run_blocks`, and
  their number is pinned there, so a new one is a deliberate choice.  An unmarked block that
  fails, fails the suite.
- Each block runs in a subprocess with ``-W error`` (as pytest's ``filterwarnings = error``)
  and a timeout, so a snippet that hangs (a server that never stops) fails instead of
  blocking the suite, and whatever it started ends with its process.  The subprocess inherits
  the environment, so the blocks run on the compiled twins and again with ``WIREKIT_PURE=1``
  when the whole suite does (CI runs it both ways).  Servers in snippets listen on loopback,
  port 0.
"""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path

import pytest
from docblocks import DOCS, PYTHON, ROOT, Block, code_blocks, find_block

TIMEOUT = 120.0  # seconds per block: generous for a loaded 2-core machine; a hang fails


def python_blocks(path: Path) -> list[Block]:
    return code_blocks(path, PYTHON)


BLOCKS = [block for path in DOCS for block in python_blocks(path)]
NOT_RUN = [block for block in BLOCKS if block.not_run]
EXPECTED_NOT_RUN = 1  # README: the y2 DDP hook (needs torch.distributed processes)


def run_block(path: str, line: int) -> int:
    """Run one block in this process (the subprocess side); return an exit status."""
    block = find_block(Path(path).resolve(), line, PYTHON)
    if block.is_doctest:
        test = doctest.DocTestParser().get_doctest(block.code, {}, block.name, path, line - 1)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        runner.run(test)
        return 1 if runner.failures else 0
    exec(compile(block.code, f"{block.name}", "exec"), {"__name__": "__docs__"})
    return 0


def test_blocks_found():
    # README (codecs, errors, MIP sync and asyncio, Clipper codec and runtimes, ZMTP, y2, the
    # y2 DDP hook) and specs/clipper.md's doctest; a parser that finds nothing fails here.
    assert len(BLOCKS) >= 10
    assert {b.path.name for b in BLOCKS} >= {"README.md", "clipper.md"}


def test_not_run_blocks():
    listing = "\n".join(f"{b.name}: {b.not_run}" for b in NOT_RUN)
    print(f"{len(NOT_RUN)} of {len(BLOCKS)} python blocks not run:\n{listing}")
    assert len(NOT_RUN) == EXPECTED_NOT_RUN, listing
    assert all(len(b.not_run or "") > 10 for b in NOT_RUN), listing


RUN = [b for b in BLOCKS if not b.not_run]


@pytest.mark.parametrize("block", RUN, ids=[b.name for b in RUN])
def test_block_runs(block: Block):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-W", "error", __file__, str(block.path), str(block.line)],
        cwd=ROOT,  # as a user in the checkout: samples/... paths work
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, f"{block.name} failed:\n{proc.stdout}\n{proc.stderr}"


if __name__ == "__main__":
    sys.exit(run_block(sys.argv[1], int(sys.argv[2])))
