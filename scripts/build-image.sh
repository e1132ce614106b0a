#!/usr/bin/env bash
# The image `wirekit serve k8s` names (the Dockerfile), built and run on a machine with no
# container registry and no package index inside a container build, as CI's are.  CI
# (`.ci/run`) runs it once scripts/build-wheels.sh has built the wheels.
#
#   1. Debian's Docker engine (`docker.io`) and `mmdebstrap`, installed when missing (root);
#      a `dockerd` of this script's own (its state in a fresh directory, removed at the end),
#      which leaves the host's network alone: no iptables rules, no bridge; the containers
#      run with no network at all (`--network none`), builds included;
#   2. the base image, made from Debian's packages (`mmdebstrap`: bookworm, python3 and its
#      venv module, passwd) and imported (`docker import`);
#   3. the wheelhouse: wirekit's wheel for the base's Python (from scripts/build-wheels.sh's
#      output) and the wheels of the `serve`, `pg` and `uvloop` extras (`pip wheel`, here,
#      from PyPI);
#   4. `docker build --build-arg BASE=...` of the Dockerfile, with the wheelhouse;
#   5. in the image, what the manifests run (scripts/image_check.py): the dispatcher with its
#      config, admin token and probes, the backends; /healthz, /readyz, a prediction through
#      the dispatcher, the admin API with and without the token;
#   6. the image's size.
# Everything it starts (dockerd and its containers) is stopped when it ends, however.
#
# Usage: bash scripts/build-image.sh [WHEELHOUSE]   (default: dist/, scripts/build-wheels.sh's)
# Environment: WIREKIT_IMAGE_ROOT, where dockerd keeps its state (default /var/lib/wirekit-image:
# overlay2 needs a file system such as ext4, not an overlay); WIREKIT_IMAGE_SUITE, the Debian
# release of the base (default bookworm: Python 3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
wheels=$(cd "${1:-dist}" && pwd)
suite=${WIREKIT_IMAGE_SUITE:-bookworm}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image=wirekit:$version
base=local/wirekit-base:$suite
say() { echo "build-image: $*"; }
fail() {
    echo "build-image: $*" >&2
    exit 1
}

if [ "$(id -u)" != 0 ]; then
    fail "needs root (dockerd, mmdebstrap)"
fi
missing=()
command -v dockerd > /dev/null || missing+=(docker.io)
command -v mmdebstrap > /dev/null || missing+=(mmdebstrap)
if ((${#missing[@]})); then
    started=$SECONDS
    # waiting for another apt-get to finish (scripts/test.sh's, beside it in CI), if need be
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        "${missing[@]}" > /dev/null
    say "installed ${missing[*]} in $((SECONDS - started)) s"
fi

# --- a Docker engine of our own -------------------------------------------------------------
mkdir -p "${WIREKIT_IMAGE_ROOT:-/var/lib/wirekit-image}"
state=$(mktemp -d "${WIREKIT_IMAGE_ROOT:-/var/lib/wirekit-image}/run.XXXXXX")
work=$(mktemp -d "${TMPDIR:-/tmp}/wirekit-image.XXXXXX")
export DOCKER_HOST=unix://$state/docker.sock DOCKER_BUILDKIT=0 DOCKER_CLI_HINTS=false
stop() {
    if [ -f "$state/dockerd.pid" ]; then
        pid=$(cat "$state/dockerd.pid")
        # its containers first (none should be left), then the engine, then its state
        docker ps --all --quiet | xargs --no-run-if-empty docker rm --force --volumes > /dev/null 2>&1 || true
        kill "$pid" 2> /dev/null || true
        for _ in $(seq 60); do kill -0 "$pid" 2> /dev/null || break; sleep 0.5; done
    fi
    # overlay mounts under the state are gone with dockerd; anything left is unmounted first
    grep -o " $state/[^ ]*" /proc/mounts | sort -r | xargs --no-run-if-empty -n1 umount -l 2> /dev/null || true
    rm -rf "$state" "$work"
}
trap stop EXIT
started=$SECONDS
dockerd --iptables=false --ip-masq=false --ip-forward=false --bridge=none \
    --data-root "$state/data" --exec-root "$state/exec" --pidfile "$state/dockerd.pid" \
    --host "$DOCKER_HOST" > "$state/dockerd.log" 2>&1 &
for _ in $(seq 120); do docker version > /dev/null 2>&1 && break; sleep 0.5; done
docker version > /dev/null 2>&1 || { tail -n 20 "$state/dockerd.log" >&2; fail "dockerd did not start"; }
say "dockerd $(docker version --format '{{.Server.Version}}') up in $((SECONDS - started)) s"

# --- the base, from Debian's packages -------------------------------------------------------
started=$SECONDS
# no documentation, manual pages or translations: an image runs, nobody reads in it
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,passwd,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    "$suite" "$work/rootfs.tar"
docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$work/rootfs.tar" "$base" > /dev/null
rm "$work/rootfs.tar"
python=$(docker run --rm --network none "$base" python3 -c \
    'import sys; print("%d.%d" % sys.version_info[:2])')
say "base $base (Debian $suite, Python $python) in $((SECONDS - started)) s"

# --- the wheelhouse: wirekit's wheel for that Python, its extras' wheels --------------------
started=$SECONDS
wheel=$(compgen -G "$wheels/wirekit-$version-cp${python/./}-*manylinux*.whl" || true)
[ -n "$wheel" ] || fail "no wirekit wheel for Python $python in $wheels: run scripts/build-wheels.sh"
host_python=$(compgen -G "${PYENV_ROOT:-$HOME/.pyenv}/versions/$python.*/bin/python$python" | sort -V | tail -n 1 || true)
[ -n "$host_python" ] || host_python=$(command -v "python$python") ||
    fail "no Python $python here to gather the wheelhouse with"
context=$work/context
mkdir -p "$context/wheelhouse" "$context/samples"
cp Dockerfile "$context/"
cp samples/tiny_model.py "$context/samples/"
"$host_python" -m venv "$work/pip"
"$work/pip/bin/python" -m pip install --quiet --upgrade pip
# wheels only: what has no wheel for this platform would need a compiler in the image
"$work/pip/bin/python" -m pip wheel --quiet --only-binary=:all: --wheel-dir "$context/wheelhouse" \
    "$wheel[serve,pg,uvloop]" > "$work/wheelhouse.log" 2>&1 ||
    { tail -n 40 "$work/wheelhouse.log" >&2; fail "gathering the wheelhouse failed"; }
say "wheelhouse: $(ls "$context/wheelhouse" | wc -l) wheels, $(du -sh "$context/wheelhouse" | cut -f1) in $((SECONDS - started)) s"

# --- the image ------------------------------------------------------------------------------
started=$SECONDS
# the classic builder: Debian 12's engine has BuildKit, but the client would need buildx for it
# (its deprecation notice shown only with the build's output, when the build fails)
docker build --network none --build-arg "BASE=$base" --tag "$image" "$context" > "$work/build.log" 2>&1 ||
    { tail -n 40 "$work/build.log" >&2; fail "docker build failed"; }
say "image $image built in $((SECONDS - started)) s"

# --- run as the manifests run it ------------------------------------------------------------
started=$SECONDS
python3 scripts/image_check.py "$image" --config "$repo/samples/serve-deployment.json"
say "ran as the manifests run it in $((SECONDS - started)) s"

size=$(docker image inspect --format '{{.Size}}' "$image")
base_size=$(docker image inspect --format '{{.Size}}' "$base")
say "image $image: $((size / 1000000)) MB ($((base_size / 1000000)) MB of it the base: Debian $suite, Python $python)"
