#!/usr/bin/env bash
# The whole test suite, as the README's quick start gives it and CI (`.ci/run`) runs it:
# what the tests need, installed; then the suite on the compiled twins (a test fails if they
# did not load; the benchmarks run too, in a quick mode), then again on the pure-Python path
# alone (`WIREKIT_PURE=1`), runtimes and servers included -- msgpack's way.
#
# Run it in the Python environment you want wirekit installed in (a virtualenv, say).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages some tests use: tcpdump and tshark (tests/test_record.py,
# tests/test_dissector.py), PostgreSQL's server binaries (tests/pg_server.py starts a
# throwaway server on loopback from them for the shared-store tests), Prometheus with
# promtool (tests/test_serve_prometheus.py runs deploy/'s rules and dashboard queries in a
# real one) and Chromium (tests/test_serve_page.py opens `wirekit serve`'s live page in it,
# headless, driven over its DevTools protocol; under CI=true that test fails without it
# rather than skip) and iproute2 (benchmarks/test_bench_y2_shaped.py puts ranks in network
# namespaces behind tbf-shaped veths, as root; under CI it fails without).  Installed when
# missing, where this runs as root with apt-get; elsewhere those tests skip, and this says so
# first.
missing=()
command -v tcpdump > /dev/null 2>&1 || missing+=(tcpdump)
command -v tshark > /dev/null 2>&1 || missing+=(tshark)
compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null || missing+=(postgresql)
{ command -v prometheus && command -v promtool; } > /dev/null 2>&1 || missing+=(prometheus)
command -v chromium > /dev/null 2>&1 || missing+=(chromium)
{ command -v ip && command -v tc; } > /dev/null 2>&1 || missing+=(iproute2)
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    else
        echo "scripts/test.sh: not installed: ${missing[*]} (installing needs root and" \
            "apt-get); the tests that use them will skip" >&2
    fi
fi

# Clipper's own rpc.py of three eras (and pyzmq/numpy for a Python 2.7, when there is
# one), the real peers of tests/test_conform.py (skipped where GitHub cannot be reached).
scripts/fetch-clipper-rpc.sh
# The test extra (pytest, hypothesis, kubemo, pyzmq, psycopg, uvloop, ...) and the torch
# extra (torch==2.13.0, for the y2 DDP tests); the install compiles the Cython twins.
python -m pip install -e '.[test,torch]'
# The real model servers the OIP tests run wirekit against and beside (MLServer 1.7.1, KServe
# 0.21.0, pinned, with scikit-learn for the iris model), each in a virtualenv of its own
# under ~/.cache/wirekit-peers (about three minutes from PyPI the first time, then cached).
python tests/peer_venvs.py
# WIREKIT_BENCH_JSON (CI sets it): where the benchmarks' figures go, for benchmarks/ratios.py
python -m pytest ${WIREKIT_BENCH_JSON:+--benchmark-json="$WIREKIT_BENCH_JSON"}
WIREKIT_PURE=1 python -m pytest tests
