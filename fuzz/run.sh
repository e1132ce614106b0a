#!/usr/bin/env bash
# Replay the fuzz corpora under AddressSanitizer, then fuzz every target for a short while.
# Fails (exit 1) on any crash, ASan report or fast/pure disagreement, naming the target and
# the saved reproducer.  Build first with fuzz/build.sh.
#
#   bash fuzz/run.sh                  # every target, FUZZ_TIME seconds each (default 20)
#   bash fuzz/run.sh mip_decode ...   # only these targets
#   FUZZ_TIME=0 bash fuzz/run.sh      # replay only
#
# Environment: FUZZ_VENV (default .fuzz-venv), FUZZ_TIME (seconds of fuzzing per target),
# FUZZ_MAX_LEN (largest input; default per target), FUZZ_WORK (default .fuzz-work: seeds,
# the corpus grown by this run, crash artefacts, logs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${FUZZ_VENV:-$ROOT/.fuzz-venv}
PY=$VENV/bin/python
TIME=${FUZZ_TIME:-20}
WORK=${FUZZ_WORK:-$ROOT/.fuzz-work}

[ -x "$PY" ] || { echo "fuzz/run.sh: no $VENV; run fuzz/build.sh first" >&2; exit 2; }

ASAN_LIB=$("$PY" -c 'import atheris, os; print(os.path.join(atheris.path(), "asan_with_fuzzer.so"))')
[ -f "$ASAN_LIB" ] || { echo "fuzz/run.sh: $ASAN_LIB missing" >&2; exit 2; }
# Python's own allocations are not instrumented: leak checks would only report noise.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1:abort_on_error=0}
export PYTHONHASHSEED=0
unset WIREKIT_PURE  # the point is to run the compiled twin against the pure one

if [ $# -gt 0 ]; then
    TARGETS=("$@")
else
    mapfile -t TARGETS < <("$PY" fuzz/fuzz.py --list)
    [ ${#TARGETS[@]} -gt 0 ] || { echo "fuzz/run.sh: could not list the targets" >&2; exit 2; }
fi

max_len() {
    case "$1" in
        zmtp_stream) echo "${FUZZ_MAX_LEN:-2048}" ;;  # StreamReader re-scans its buffer
        y2_kernels) echo "${FUZZ_MAX_LEN:-2048}" ;;
        y2_threads) echo "${FUZZ_MAX_LEN:-256}" ;;  # inputs are tiled to several chunks
        *) echo "${FUZZ_MAX_LEN:-4096}" ;;
    esac
}

rm -rf "$WORK/seeds"
mkdir -p "$WORK/seeds" "$WORK/artifacts" "$WORK/logs"
"$PY" fuzz/seeds.py "$WORK/seeds"

fuzz() {  # fuzz TARGET LOG ARGS...: run one libFuzzer session with the ASan runtime preloaded
    local target=$1 log=$2
    shift 2
    LD_PRELOAD=$ASAN_LIB "$PY" fuzz/fuzz.py "$target" -timeout=30 -rss_limit_mb=3072 \
        -artifact_prefix="$WORK/artifacts/$target-" "$@" > "$log" 2>&1
}

failed=()
for target in "${TARGETS[@]}"; do
    dirs=()
    for d in "fuzz/regressions/$target" "fuzz/corpus/$target" "$WORK/seeds/$target"; do
        [ -d "$d" ] && dirs+=("$d")
    done
    log=$WORK/logs/$target-replay.log
    if fuzz "$target" "$log" -runs=0 "${dirs[@]}"; then
        echo "replay $target: ok ($(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1))"
    else
        echo "replay $target: FAILED (log: $log)"
        tail -40 "$log"
        failed+=("$target")
        continue
    fi
    [ "$TIME" -gt 0 ] || continue
    grown=$WORK/corpus/$target
    mkdir -p "$grown"
    log=$WORK/logs/$target-fuzz.log
    if fuzz "$target" "$log" -max_total_time="$TIME" -max_len="$(max_len "$target")" \
        -print_final_stats=1 "$grown" "${dirs[@]}"; then
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
        echo "fuzz $target: ok, ${runs:-?} runs in ${TIME}s ($(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1))"
    else
        echo "fuzz $target: FAILED (log: $log; reproducer: $WORK/artifacts/$target-*)"
        tail -60 "$log"
        failed+=("$target")
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz/run.sh: failed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz/run.sh: all targets ok"
