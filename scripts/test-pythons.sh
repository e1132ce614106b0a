#!/usr/bin/env bash
# wirekit on every Python that pyproject.toml's requires-python promises, besides the one the
# whole suite runs on (scripts/test.sh): CI (`.ci/run`) runs this after it.
#
# For each version: a fresh clone of this checkout's HEAD, a new virtualenv, a plain
# `pip install .` (no extra: the compiled twins built and installed, as a user gets them),
# then, as that user meets them:
#   * the README's main job, `wirekit decode --proto mip samples/mip-session.bin`;
#   * the compiled twins loaded (WIREKIT_REQUIRE_FAST=1: a fallback to the pure path fails),
#     and site-packages holding the twins but not the generated C;
#   * `wirekit serve check` of the sample (it needs no extra);
# and then the codec and command-line tests, with only the `test-core` extra, against the
# installed package (the clone's own wirekit/ folder is moved aside, so nothing can import
# its uncompiled tree).
#
# Usage: bash scripts/test-pythons.sh [VERSION...]   (default: 3.10 3.12 3.13)
# A version is looked for under pyenv ($PYENV_ROOT/versions/VERSION.*), then as pythonVERSION
# on PATH.  A missing one fails under CI=true (CI's machines have them under pyenv); elsewhere
# it is skipped, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

versions=("$@")
((${#versions[@]})) || versions=(3.10 3.12 3.13)
TESTS=(tests/test_mip_codec.py tests/test_clipper_codec.py tests/test_y2_codec.py
    tests/test_zmtp_codec.py tests/test_oip_mapping.py tests/test_oip_vectors.py tests/test_impl.py
    tests/test_cli.py tests/test_cli_imports.py)

work=$(mktemp -d "${TMPDIR:-/tmp}/wirekit-pythons.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The interpreter of Python VERSION, or nothing.
find_python() {
    local version=$1 candidate
    for candidate in \
        $(compgen -G "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version.*/bin/python$version" | sort -V) \
        "$(command -v "python$version" || true)"; do
        if [ -n "$candidate" ] && "$candidate" -c \
            "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$version'.split('.'))))" \
            > /dev/null 2>&1; then
            echo "$candidate"
            return
        fi
    done
}

fail() {
    echo "test-pythons: Python $version: $*" >&2
    exit 1
}

for version in "${versions[@]}"; do
    python=$(find_python "$version")
    if [ -z "$python" ]; then
        if [ "${CI:-}" = true ]; then
            fail "not found (under ${PYENV_ROOT:-$HOME/.pyenv}/versions or as python$version)"
        fi
        echo "test-pythons: Python $version not found: skipped" >&2
        continue
    fi
    started=$SECONDS
    echo "test-pythons: Python $version ($python)"
    clone="$work/py$version"
    git clone --quiet --no-hardlinks "$repo" "$clone"
    "$python" -m venv "$clone/.venv"
    venv="$clone/.venv/bin"
    (
        cd "$clone"
        # a user's environment: no wirekit variables, the virtualenv first on PATH
        unset WIREKIT_PURE WIREKIT_REQUIRE_FAST PYTHONPATH
        export PATH="$venv:$PATH" VIRTUAL_ENV="$clone/.venv"
        python -m pip install --quiet --upgrade pip
        # the build's own chatter (setuptools' notices) shown only when the install fails
        python -m pip install --quiet . > pip-install.log 2>&1 ||
            { tail -n 60 pip-install.log >&2; fail "pip install . failed"; }

        # the main job, as the README gives it, on the compiled twins
        WIREKIT_REQUIRE_FAST=1 wirekit decode --proto mip samples/mip-session.bin > decoded.txt ||
            fail "wirekit decode --proto mip samples/mip-session.bin failed"
        grep -q "inference request" decoded.txt || fail "wirekit decode printed no request"
        (cd / && WIREKIT_REQUIRE_FAST=1 python - "$version") << 'EOF' || fail "compiled twins"
import pathlib, sys
import wirekit
from wirekit import clipper, mip, y2, zmtp
found = {m.__name__: m.IMPLEMENTATION for m in (wirekit, clipper, mip, y2, zmtp)}
assert set(found.values()) == {"fast"}, found
fast = pathlib.Path(wirekit.__file__).parent / "_fast"
assert "site-packages" in str(fast), fast
built = sorted(p.name.split(".")[0] for p in fast.glob("*.so"))
sources = sorted(p.stem for p in fast.glob("*.pyx"))
assert built == sources, (built, sources)
assert not list(fast.glob("*.c")), "the generated C was installed"
print(f"  Python {sys.argv[1]}: {len(built)} compiled twins loaded from {fast}")
EOF
        wirekit serve check --config samples/serve-deployment.json > /dev/null ||
            fail "wirekit serve check (JSON, no extra) failed"

        # the codec and command-line tests, on the installed package
        mv wirekit wirekit.uninstalled
        python - << 'EOF' > test-core.txt
import importlib.metadata as md
for req in md.requires("wirekit") or []:
    if 'extra == "test-core"' in req:
        print(req.split(";")[0])
EOF
        xargs python -m pip install --quiet < test-core.txt
        pytest -q -p no:cacheprovider "${TESTS[@]}" || fail "tests failed"
    )
    echo "test-pythons: Python $version passed in $((SECONDS - started)) s"
done
