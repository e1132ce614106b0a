"""The README's quick start, on a fresh clone, as a new user runs it (issue 29): after its
install, everything run from the checkout gets the compiled twins -- ``python -m wirekit``,
``python -c``, the README's Python examples, ``wirekit serve --with-backends`` and each of
its backends -- and the benchmarks agree to run.

Before, the quick start was ``pip install .``: Python started in the checkout imported the
checkout's uncompiled ``wirekit/`` folder (``wirekit.IMPLEMENTATION == "pure"``, a
``FastPathMissing`` warning per twin, 20 of them from the headline demo's backends), and the
benchmarks refused to run.

The clone is of this repository's committed ``HEAD`` (what CI tests is a fresh clone too);
the install is the README's own command, read from its quick start, in a new virtualenv.
It compiles the twins (a minute or two on CI's 2 cores); the test runs once, on the
compiled run of the suite (the pure run, ``WIREKIT_PURE=1``, skips it: it compiles nothing).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from support.ports import free_port

from wirekit._impl import pure_requested

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: seconds for the clone's install (compiling the twins on a busy machine included)
INSTALL_TIMEOUT = 1200
TIMEOUT = 60.0

pytestmark = pytest.mark.skipif(
    pure_requested(), reason="the pure run: the quick start's install compiles the twins"
)


def readme_block(heading: str, language: str) -> str:
    """The first ``language`` code block of the README section under ``heading`` (a ``##`` or
    ``###`` heading)."""
    text = README.read_text(encoding="utf-8")
    start = re.search(rf"\n##+ {re.escape(heading)}\n", text)
    assert start, f"README: no section {heading!r}"
    section = text[start.start() :]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"README: no {language} block under {heading!r}"
    return match.group(1)


def quick_start_install() -> tuple[str, str]:
    """The quick start's first line, split at ``&&``: the install, then the first command."""
    first = readme_block("Quick start", "sh").splitlines()[0]
    install, _, then = first.partition("&&")
    assert install.strip().startswith("pip install"), first
    return install.strip(), then.strip()


class Clone:
    """A fresh clone and its new virtualenv, the quick start's install done in it."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "wirekit"
        self.venv = base / "venv"
        subprocess.run(
            ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(self.dir)],
            check=True, timeout=300,
        )  # fmt: skip
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True, timeout=300)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("WIREKIT_", "PYTHON", "VIRTUAL_ENV"))
        }
        env["VIRTUAL_ENV"] = str(self.venv)
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), env.get("PATH", "")])
        self.env = env

    def run(
        self, command: str | list[str], timeout: float = TIMEOUT
    ) -> subprocess.CompletedProcess:
        """``command`` (a shell line, or argv) in the clone's root, in its virtualenv."""
        return subprocess.run(
            command, shell=isinstance(command, str), cwd=self.dir, env=self.env,
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Clone:
    """A fresh clone, the README's quick start install run in it (and its first command)."""
    if shutil.which("git") is None:
        pytest.fail("git is needed to clone the repository")
    made = Clone(tmp_path_factory.mktemp("quickstart"))
    install, then = quick_start_install()
    done = made.run(install, timeout=INSTALL_TIMEOUT)
    assert done.returncode == 0, (install, done.stdout[-3000:], done.stderr[-3000:])
    first = made.run(then)
    assert first.returncode == 0, first.stderr
    no_fallback(first.stderr)
    assert "inference request" in first.stdout  # the bundled MIP session, decoded
    return made


def no_fallback(stderr: str) -> None:
    """Nothing fell back to the pure path (the warning every fallback gives)."""
    assert "FastPathMissing" not in stderr, stderr
    assert "compiled twin" not in stderr, stderr


def test_python_run_from_the_checkout_gets_the_compiled_twins(clone):
    probe = (
        "import wirekit, os; from wirekit import clipper, mip, y2, zmtp; "
        "print(wirekit.IMPLEMENTATION, [m.IMPLEMENTATION for m in (clipper, mip, y2, zmtp)],"
        " os.path.dirname(wirekit.__file__))"
    )
    done = clone.run(["python", "-W", "error", "-c", probe])
    assert done.returncode == 0, done.stderr
    implementation, *_, package = done.stdout.split()
    assert implementation == "fast"
    assert done.stdout.count("'fast'") == 4
    assert Path(package) == clone.dir / "wirekit"  # the checkout's own folder, compiled
    done = clone.run(["python", "-W", "error", "-m", "wirekit", "decode", "--proto", "mip",
                      "samples/mip-session.bin"])  # fmt: skip
    assert done.returncode == 0, done.stderr
    no_fallback(done.stderr)


def test_the_readmes_python_examples_run_from_the_checkout_compiled(clone, tmp_path):
    example = tmp_path / "codecs.txt"
    example.write_text(readme_block("Codecs", "python"))
    check = tmp_path / "check.txt"
    check.write_text(">>> import wirekit\n>>> wirekit.IMPLEMENTATION\n'fast'\n")
    for block in (example, check):
        done = clone.run(["python", "-W", "error", "-m", "doctest", str(block)])
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_benchmarks_agree_to_run_after_the_quick_start(clone):
    # the benchmarks' guard (benchmarks/conftest.py) with their runner: pytest and
    # pytest-benchmark, from the test-core extra's own requirements (no reinstall)
    install_runner = (
        "import importlib.metadata as md, subprocess, sys; "
        "reqs = [r.split(';')[0] for r in md.requires('wirekit') if 'test-core' in r]; "
        "subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', *reqs], check=True)"
    )
    done = clone.run(["python", "-c", install_runner], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    done = clone.run(
        ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "benchmarks/test_bench_mip.py"],
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout


TWINS_HANDLER = '''\
"""A handler that says which wirekit its backend runs (tests/test_quickstart.py)."""
import os

import wirekit


def twins(batch):
    where = os.path.dirname(wirekit.__file__)
    return [[{"implementation": wirekit.IMPLEMENTATION, "package": where}] for _ in batch]
'''


def test_the_headline_demo_runs_compiled_backends_from_the_checkout(clone):
    # samples/serve-deployment.json as it is, but on free ports (the machine is shared) and
    # with m1's backends answering which wirekit they run
    samples = clone.dir / "samples"
    doc = json.loads((samples / "serve-deployment.json").read_text())
    doc["listen"]["http_port"] = free_port()
    for model in doc["models"].values():
        model["port"] = free_port()
    for node in doc["nodes"]:
        node["ports"] = [p and free_port() for p in node["ports"]]
    doc["models"]["m1"]["handler"] = "which_twins:twins"
    (samples / "which_twins.py").write_text(TWINS_HANDLER)
    config = samples / "quickstart-deployment.json"
    config.write_text(json.dumps(doc))
    proc = subprocess.Popen(
        ["wirekit", "serve", "--config", str(config.relative_to(clone.dir)), "--with-backends"],
        cwd=clone.dir, env=clone.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    err: list[str] = []
    drain = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    drain.start()
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(TIMEOUT * 2)
        ready = json.loads(line[0]) if line and line[0] else {}
        assert ready.get("event") == "ready", "".join(err)
        assert len(ready["backends"]) == 5
        url = f"http://127.0.0.1:{ready['http']}/v1/models/m1:predict"
        seen = []
        for _ in range(8):  # m1 has three backends; the quota draw spreads these
            body = json.dumps({"inputs": [["which"]] * 4}).encode()
            with urllib.request.urlopen(url, data=body, timeout=TIMEOUT) as response:
                seen += [out[0] for out in json.loads(response.read())["outputs"]]
        assert {answer["implementation"] for answer in seen} == {"fast"}
        assert {Path(answer["package"]) for answer in seen} == {clone.dir / "wirekit"}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
        drain.join(TIMEOUT)
        proc.stdout.close()
        proc.stderr.close()
    no_fallback("".join(err))
    # what the demo wrote beside its config (store.path is the config file's directory's),
    # is nothing git offers to commit
    assert (clone.dir / "samples" / "requests.db").is_file()
    status = clone.run(["git", "status", "--porcelain", "--untracked-files=all"])
    assert status.returncode == 0, status.stderr
    assert "requests.db" not in status.stdout, status.stdout


def test_an_uncompiled_source_tree_says_so_in_its_warning(tmp_path):
    # what a user who ran `pip install .` meets in the checkout: the warning names the folder
    # and how to get its compiled twins
    checkout = tmp_path / "checkout"
    shutil.copytree(
        ROOT / "wirekit", checkout / "wirekit", ignore=shutil.ignore_patterns("*.so", "*.c")
    )
    shutil.copy(ROOT / "setup.py", checkout)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WIREKIT_", "PYTHONPATH"))}
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import wirekit; print(wirekit.IMPLEMENTATION)"],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pure"
    assert "FastPathMissing" in done.stderr
    assert f"the source tree {checkout / 'wirekit'}, not built" in done.stderr
    assert f"`pip install -e .` in {checkout}" in done.stderr
