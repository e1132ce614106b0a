"""The documentation site builds with no warning (issue 41): ``mkdocs build --strict``.

mkdocs.yml builds docs/ (with specs/, SECURITY.md and fuzz/README.md through symlinks) and
the API reference from the docstrings (mkdocstrings); under ``--strict`` every warning fails
the build, broken internal links and anchors included (mkdocs.yml's ``validation``).  The
``docs`` extra brings MkDocs; the ``test`` extra includes it, so the suite runs this.  It
runs once, on the compiled run of the suite (the site does not depend on the twins).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wirekit._impl import pure_requested

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 300.0  # seconds: about 20 on a loaded 2-core machine

pytestmark = pytest.mark.skipif(
    pure_requested(), reason="the pure run: the site was built by the compiled run"
)


def test_site_builds_strict(tmp_path: Path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr}"
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "specs" / "mip" / "index.html").is_file()
    api = (tmp_path / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "DecodeError" in api  # the reference was generated from the docstrings


def test_every_page_is_in_the_nav():
    """A page of docs/ or specs/ left out of mkdocs.yml's nav is built but hard to find."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.name for p in (ROOT / "docs").glob("*.md")] + [
        f"specs/{p.name}" for p in (ROOT / "specs").glob("*.md")
    ]
    missing = [page for page in pages if f": {page}\n" not in nav]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"
