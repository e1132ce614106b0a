#!/usr/bin/env bash
# Build wirekit for fuzzing: a separate virtualenv (.fuzz-venv) holding atheris and a wirekit
# whose Cython extensions are compiled by clang with AddressSanitizer and libFuzzer's coverage
# instrumentation (-fsanitize=address,fuzzer-no-link), so the fuzzer sees the branches inside
# the compiled code and ASan stops at the first bad read or write.  The normal install (.venv,
# the in-place .so files) is never touched: the extensions are built in .fuzz-build/.
#
#   bash fuzz/build.sh            # needs clang (Debian: apt-get install clang)
#
# Environment: FUZZ_VENV (default .fuzz-venv), CLANG (default clang), ATHERIS_VERSION
# (default 3.0.0, built from source).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${FUZZ_VENV:-$ROOT/.fuzz-venv}
CLANG=${CLANG:-clang}

command -v "$CLANG" > /dev/null || {
    echo "fuzz/build.sh: $CLANG not found (Debian: apt-get install clang)" >&2
    exit 2
}

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY=$VENV/bin/python
"$PY" -m pip install --quiet --upgrade pip
# The build tools and wirekit's runtime dependencies.
"$PY" -m pip install --quiet "setuptools>=69" "Cython>=3.0" "numpy>=1.24" \
    "construct>=2.10,<2.11" "pyzmq>=25"
# atheris built from source against this clang: only then does it make asan_with_fuzzer.so
# (the ASan runtime with libFuzzer linked in, preloaded by fuzz/run.sh); its wheel has none.
if ! (cd / && "$PY" -c 'import atheris, os, sys; sys.exit(not os.path.exists(
        os.path.join(atheris.path(), "asan_with_fuzzer.so")))' 2> /dev/null); then
    CLANG_BIN=$(command -v "$CLANG") "$PY" -m pip install --quiet --force-reinstall \
        --no-binary atheris "atheris==${ATHERIS_VERSION:-3.0.0}"
fi

# A copy of the sources to build from, so the instrumented .c/.so never land in the work tree.
BUILD=$ROOT/.fuzz-build
rm -rf "$BUILD"
mkdir -p "$BUILD"
cp -r setup.py pyproject.toml README.md wirekit "$BUILD"/
find "$BUILD/wirekit" \( -name '*.so' -o -name '*.c' -o -name '__pycache__' \) -prune \
    -exec rm -rf {} +

SAN="-fsanitize=address,fuzzer-no-link -fno-omit-frame-pointer -g"
(
    cd "$BUILD"
    CC=$CLANG CXX=${CLANG}++ LDSHARED="$CLANG -shared" \
        CFLAGS="$SAN" CXXFLAGS="$SAN" LDFLAGS="-fsanitize=address,fuzzer-no-link" \
        "$PY" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall .
)

# Check (from outside the work tree, so the installed copy is imported): the extensions carry
# ASan and coverage instrumentation, and atheris has its ASan runtime.
(cd / && "$PY" -) <<'PY'
import glob, os, subprocess, wirekit
fast = os.path.join(os.path.dirname(wirekit.__file__), "_fast")
for so in sorted(glob.glob(os.path.join(fast, "*.so"))):
    syms = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True,
                          text=True, check=True).stdout
    ok = "__asan_" in syms and "__sanitizer_cov" in syms
    print(f"{'instrumented' if ok else 'NOT INSTRUMENTED'}: {os.path.basename(so)}")
    if not ok:
        raise SystemExit(1)
import atheris
asan = os.path.join(atheris.path(), "asan_with_fuzzer.so")
if not os.path.exists(asan):
    raise SystemExit(f"{asan} is missing: atheris was not built against this clang")
PY
echo "fuzz/build.sh: built into $VENV"
