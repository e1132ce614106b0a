"""Every file a shell block of README.md, docs/*.md or specs/*.md names is in the checkout
(issue 41).

A reader copies a block into a terminal at the checkout's root; a file it names that is not
there fails for them, whatever the test that runs the block prepared.  So the shell blocks
(found by tests/docblocks.py, run by tests/test_readme_shell.py in a plain copy of the
checkout) are scanned for the files they name, and each must exist:

- a path-like word (letters, digits, ``_.-/``) that ends in one of :data:`FILE_SUFFIXES`, or
  that starts with a folder of the checkout (``samples/``, ``docs/`` ...);
- the module of a ``--handler MODULE:FUNCTION`` (a file of the checkout, ``samples/x.py`` for
  ``samples.x``, or a module of ``wirekit``).

What a block itself writes (``-w my-session.pcapng``, ``--junit conform.xml``) is listed in
:data:`OUTPUTS`, each with the reason; blocks marked ``not run`` are scanned too, except the
words of :data:`PLACEHOLDERS` (what a reader substitutes: their own implementation).
"""

from __future__ import annotations

import re
import shlex

import pytest
from docblocks import DOCS, ROOT, SHELL, Block, code_blocks

FILE_SUFFIXES = (
    ".pcapng", ".pcap", ".bin", ".zmtp", ".png", ".json", ".toml", ".py", ".cfg", ".yml",
    ".yaml", ".db", ".y2", ".xml", ".lua", ".md", ".sh", ".joblib", ".txt", ".proto",
)  # fmt: skip
#: top-level folders of the checkout: a word starting with one is a path too
FOLDERS = ("samples/", "docs/", "specs/", "tests/", "benchmarks/", "scripts/", "examples/",
           "deploy/", "fuzz/", "wirekit/")  # fmt: skip

#: files the blocks write themselves (each in the block that names it)
OUTPUTS = {
    "bench.json",  # the benchmarks' --benchmark-json output, read by ratios.py next
    # the store the sample deployment writes (its store.path, beside the config), read by
    # serve stats
    "samples/requests.db",
    "my-session.pcapng",  # docs/decode.md: wirekit record -w, the reader's own recording
    "run.y2",  # docs/y2.md, specs/y2.md: the y2 client's --report
    "conform.xml",  # docs/conform.md: --junit output
    "mip.lua",  # the dissector's -o output (wirekit dissector)
    "samples/mlserver/iris/model.joblib",  # docs/serve.md: train_iris.py writes it
    "net.json",  # specs/y2.md: the shaped benchmark's --json output
    "net.md",  # specs/y2.md: and its --markdown table
}
#: words of not-run blocks that stand for the reader's own files
PLACEHOLDERS = {
    "my_container.py",  # docs/conform.md: your Clipper container, started by conform
    "deployment.json",  # your own deployment config (docs/serve.md)
    "deployment.toml",  # the same, in TOML (specs/k8s.md)
    "mymodels:m1",  # specs/controller.md: your own model's handler, in a cgroup
}

_PATHLIKE = re.compile(r"^[\w./-]+$")


def _words(code: str) -> list[str]:
    """The words of a block's commands (comments dropped, continuations joined)."""
    words: list[str] = []
    for line in code.replace("\\\n", " ").splitlines():
        try:
            words += shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote in a comment, say: split on spaces
            words += line.split("#", 1)[0].split()
    return words


def _handler_exists(spec: str) -> bool:
    module = spec.partition(":")[0]
    path = module.replace(".", "/")
    return (ROOT / f"{path}.py").is_file() or (ROOT / path / "__init__.py").is_file()


def named_files(block: Block) -> list[str]:
    """The files a block names that are not in the checkout, nor written nor placeholders."""
    missing: list[str] = []
    words = _words(block.code)
    for k, word in enumerate(words):
        value = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
        if block.not_run and value in PLACEHOLDERS:
            continue
        if k and words[k - 1] == "--handler":
            if not _handler_exists(value):
                missing.append(f"--handler {value}")
            continue
        if not _PATHLIKE.match(value) or value.startswith(("-", "http", "tcp", "/")):
            continue
        if not (value.endswith(FILE_SUFFIXES) or value.startswith(FOLDERS)):
            continue
        if value in OUTPUTS:
            continue
        if not (ROOT / value).exists():
            missing.append(value)
    return missing


BLOCKS = [block for path in DOCS for block in code_blocks(path, SHELL)]


def test_blocks_scanned():
    assert {b.path.name for b in BLOCKS} >= {"README.md", "decode.md", "serve.md", "k8s.md"}
    # the scanner sees the bundled capture the README decodes
    readme = [b for b in BLOCKS if b.path.name == "README.md"]
    assert any("samples/mip-session.pcapng" in _words(b.code) for b in readme)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_block_names_only_files_in_the_checkout(block: Block):
    missing = named_files(block)
    assert not missing, (
        f"{block.name} names files that are not in the checkout: {missing} (bundle them, or "
        "list a file the block writes itself in OUTPUTS with the reason)"
    )


def test_the_scanner_catches_a_made_up_file():
    fake = Block(ROOT / "README.md", 1, "sh", "wirekit decode cap.pcapng  # a capture\n", None)
    assert named_files(fake) == ["cap.pcapng"]
    fake = Block(
        ROOT / "README.md", 1, "sh", "wirekit clipper container --handler pkg.mod:f\n", None
    )
    assert named_files(fake) == ["--handler pkg.mod:f"]
