#!/usr/bin/env bash
# The type stubs of the compiled twins (wirekit/_fast/*.pyi) checked against the built
# modules with mypy's stubtest: every name a module exports is in its stub, with the same
# parameters (names, kinds, defaults), and the stub names nothing the module lacks.  Every
# .pyx must have its .pyi (stubtest fails on a module without a stub).  The exceptions, only
# names Cython adds to every module, are in scripts/stubtest-allowlist.txt, each with its
# reason.
#
# Needs the compiled twins importable (after `pip install -e .`); CI (.ci/run) runs it after
# mypy.  Usage: bash scripts/stubtest.sh [PYTHON]   (default: python)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python}

modules=()
for pyx in wirekit/_fast/*.pyx; do
    name=$(basename "$pyx" .pyx)
    [ -f "wirekit/_fast/$name.pyi" ] || { echo "stubtest.sh: $pyx has no stub wirekit/_fast/$name.pyi" >&2; exit 1; }
    modules+=("wirekit._fast.$name")
done
# The twins must be the compiled ones: stubtest imports them (WIREKIT_PURE does not apply:
# these are the extension modules themselves).
"$python" -m mypy.stubtest --allowlist scripts/stubtest-allowlist.txt "${modules[@]}"
