#!/usr/bin/env bash
# Clipper's own Python model container, containers/python/rpc.py, at the three commits
# specs/clipper.md follows, into .cache/clipper-rpc/{2016,2017,v3}/rpc.py: the real peers
# tests/test_conform.py runs `wirekit conform clipper container` against (run unchanged;
# not part of wirekit).  The 2016 and 2017 files are Python 2 code: when a python2.7 is
# found, pyzmq and numpy for it go into .cache/py27 (else those two eras' tests skip).
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A COMMITS=([2016]=f5f76d05 [2017]=9f396e0e [v3]=9f25e3fc)
for era in "${!COMMITS[@]}"; do
    into=.cache/clipper-rpc/$era/rpc.py
    [ -s "$into" ] && continue
    mkdir -p "$(dirname "$into")"
    if ! curl -sSfL --max-time 30 -o "$into.part" \
        "https://raw.githubusercontent.com/ucbrise/clipper/${COMMITS[$era]}/containers/python/rpc.py"; then
        rm -f "$into.part"
        echo "scripts/fetch-clipper-rpc.sh: GitHub cannot be reached: the rpc.py tests will skip" >&2
        exit 0
    fi
    mv "$into.part" "$into"
done
py2=${WIREKIT_PYTHON2:-$(command -v python2.7 || true)}
if [ -z "$py2" ]; then
    py2=$(ls -d "$HOME"/.pyenv/versions/2.7*/bin/python2.7 2> /dev/null | tail -n 1 || true)
fi
if [ -n "$py2" ] && [ ! -d .cache/py27/zmq ]; then
    "$py2" -m pip install -q --target .cache/py27 "pyzmq<20" "numpy<1.17"
elif [ -z "$py2" ]; then
    echo "scripts/fetch-clipper-rpc.sh: no python2.7: the 2016/2017 rpc.py tests will skip" >&2
fi
