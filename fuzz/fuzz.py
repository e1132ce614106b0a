"""Run one differential fuzz target under atheris (libFuzzer).

    python fuzz/fuzz.py TARGET [libFuzzer options] [CORPUS_DIR ...]
    python fuzz/fuzz.py TARGET -runs=0 DIR ...      # replay every file in DIR once
    python fuzz/fuzz.py --list                      # the target names

Targets are the functions of fuzz/differential.py.  wirekit's Python code (the pure twins, the
stream decoders) is instrumented for coverage here; the Cython twins are instrumented at
compile time by fuzz/build.sh, so use the interpreter of its .fuzz-venv with atheris's ASan
runtime preloaded (fuzz/run.sh does both).  A disagreement between the twins raises
AssertionError, which libFuzzer reports as a crash and saves (``-artifact_prefix``).
"""

from __future__ import annotations

import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _package_modules(package: str) -> list[str]:
    """The names of ``package`` and its modules (atheris excludes by exact name), found
    without importing them."""
    import importlib.util
    from pathlib import Path

    top, _, sub = package.partition(".")
    spec = importlib.util.find_spec(top)
    assert spec is not None and spec.submodule_search_locations
    folder = Path(spec.submodule_search_locations[0], *sub.split("."))
    return [package, *(f"{package}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__")]


def _load(name: str):
    """The target function, with wirekit's Python code instrumented for coverage."""
    import importlib
    import logging

    import atheris

    # The runtimes log every malformed message they drop: millions of lines under a fuzzer.
    logging.disable(logging.CRITICAL)
    # atheris keeps the result of every comparison it traces in instrumented code: for the
    # pure y2 kernels on y2_threads's large arrays (each `a > tau` a new array of a million
    # elements) that exhausts memory in minutes.  That target is steered by the compiled code.
    exclude = _package_modules("wirekit.y2") if name == "y2_threads" else []
    with atheris.instrument_imports(include=["wirekit", "differential"], exclude=exclude):
        import differential

        from wirekit import clipper, mip, y2, zmtp  # noqa: F401
        from wirekit._impl import twin
        from wirekit.clipper import _lane, _zio, session  # noqa: F401  (the pure Clipper lanes)
        from wirekit.mip import connection, dump, runtime  # noqa: F401  (the pure MIP twins)
        from wirekit.serve.dispatch import lane  # noqa: F401  (the dispatcher's pure lane)
        from wirekit.serve.record import journal, writer  # noqa: F401  (the store's writers)

        for proto in ("mip", "clipper", "y2", "zmtp"):
            twin(proto, "pure")
            twin(proto, "fast")
        for module in (
            "mipnet",
            "mipdump",
            "servelane",
            "clipperfront",
            "clippercontainer",
            "journal",
            "storewriter",
        ):
            importlib.import_module(f"wirekit._fast.{module}")
    return differential.TARGETS[name]


def main(argv: list[str]) -> None:
    from differential import TARGETS  # (imports no twin: --list works without the ASan runtime)

    if len(argv) >= 2 and argv[1] == "--list":
        print("\n".join(TARGETS))
        return
    if len(argv) < 2 or argv[1] not in TARGETS:
        names = ", ".join(TARGETS)
        raise SystemExit(f"usage: python fuzz/fuzz.py TARGET [libFuzzer options]; TARGET: {names}")
    import atheris

    # libFuzzer starts children (-merge, -fork) by running argv[0] through the shell: make
    # that this interpreter running this script on this target.
    command = " ".join(shlex.quote(a) for a in (sys.executable, os.path.abspath(argv[0]), argv[1]))
    atheris.Setup([command, *argv[2:]], _load(argv[1]))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
