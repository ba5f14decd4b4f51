#!/usr/bin/env bash
# The image check (docs/deploy.md, "The image check"): build the CPU image with Podman
# from a local Debian base (no registry but PyPI and Debian's), answer the README's
# embeddings call from it twice, then remove what it made:
#   1. `vllm-srun serve` by the image's own command (MiniLM and Rampart, from the
#      mirror distributions inside it);
#   2. `vllm-sr serve MODEL --container-runtime podman` (the foreground engine container).
#
#   deploy/image-check.sh            # or: make image-check
#   deploy/image-check.sh --keep     # keep the built image
#   deploy/image-check.sh --replace  # IMAGE_CHECK_TAG may name an image already there
#
# It removes only what it made: images carrying its run's label (the image and its
# stages; never with -f: one another build now uses stays), its container, its folder.
#
# Settings (environment), defaults in brackets:
#   IMAGE_CHECK_TAG         the image built; one already there is refused without
#                           --replace [localhost/vllm-sr:image-check-<run>]
#   IMAGE_CHECK_BASE        the local base, passed as PYTHON_IMAGE; debootstrap makes it
#                           once and it is kept [localhost/vllm-sr-base:bookworm]
#   IMAGE_CHECK_WHEELS      a folder holding the torch wheel, mounted into the build
#                           (empty: none) [/opt/wheels]
#   IMAGE_CHECK_TORCH_INDEX the index torch and its dependencies come from [PyPI's with
#                           a wheel folder, else https://download.pytorch.org/whl/cpu]
#   IMAGE_CHECK_PORT        the host port both runs publish [18100]
#   IMAGE_CHECK_HEALTH_S    bound of each wait for /health 200, in seconds [600]
#   IMAGE_CHECK_MIRROR      the Debian mirror [http://deb.debian.org/debian]
#   IMAGE_CHECK_CA_DIR      extra CA certificates (*.crt) the base trusts, as this host
#                           does (empty: none) [/usr/local/share/ca-certificates]
#   VLLM_SR                 the vllm-sr command [.venv/bin/vllm-sr]
# Runs as root (debootstrap, rootful Podman) with podman, runc and curl installed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUN=$$-$(date +%s)                  # this run: its tag, label, container and folder
TAG=${IMAGE_CHECK_TAG:-localhost/vllm-sr:image-check-$RUN}
BASE=${IMAGE_CHECK_BASE:-localhost/vllm-sr-base:bookworm}
WHEELS=${IMAGE_CHECK_WHEELS-/opt/wheels}
TORCH_INDEX=${IMAGE_CHECK_TORCH_INDEX:-}
PORT=${IMAGE_CHECK_PORT:-18100}
HEALTH_S=${IMAGE_CHECK_HEALTH_S:-600}
MIRROR=${IMAGE_CHECK_MIRROR:-http://deb.debian.org/debian}
CA_DIR=${IMAGE_CHECK_CA_DIR-/usr/local/share/ca-certificates}
VLLM_SR=${VLLM_SR:-$ROOT/.venv/bin/vllm-sr}
MODEL=sentence-transformers/all-MiniLM-L6-v2
NAME=vllm-sr-image-check-$RUN       # step 3's container
ENGINE=vllm-sr-engine-$PORT         # the container vllm-sr names (frontend/deploy/container)
LABEL=vllm-sr-image-check=$RUN      # on every image this run's build makes
KEEP=0
REPLACE=0

for arg in "$@"; do
    case "$arg" in
        --keep) KEEP=1 ;;
        --replace) REPLACE=1 ;;
        *) echo "usage: $0 [--keep] [--replace]" >&2; exit 2 ;;
    esac
done

say() { printf 'image-check: %s\n' "$*"; }
fail() { printf 'image-check: FAILED: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# --- Preflight -------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || fail "run as root: debootstrap and rootful Podman need it (sudo $0)"
for tool in podman curl python3; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (apt-get install $tool)"
done
[ -x "$VLLM_SR" ] || fail "no vllm-sr at $VLLM_SR: run make install, or set VLLM_SR"
if [ -n "$WHEELS" ]; then
    # The base's Python is Debian bookworm's 3.11: another wheel would be passed over
    # for PyPI's torch (the CUDA build, gigabytes).
    compgen -G "$WHEELS/torch-2.13.0*-cp311-*.whl" >/dev/null ||
        fail "no torch 2.13.0 cp311 wheel in IMAGE_CHECK_WHEELS=$WHEELS (set it empty to take torch from IMAGE_CHECK_TORCH_INDEX)"
    TORCH_INDEX=${TORCH_INDEX:-https://pypi.org/simple}
fi
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/"; then
    fail "something already answers on 127.0.0.1:$PORT: stop it or set IMAGE_CHECK_PORT"
fi
if [ "$REPLACE" = 0 ] && podman image exists "$TAG"; then
    fail "an image $TAG is already there and this run did not build it: pass --replace to tag over it (it stays, untagged), or set IMAGE_CHECK_TAG to another"
fi

START=$(now)
WORK=$(mktemp -d "/tmp/vllm-sr-image-check-$RUN.XXXXXX")
VLLM_SR_PID=
BUILD_PID=
SHOW_PID=
ENGINE_STARTED=0
BUILT=0

# Stops a background job that leads its own process group (set -m), the group with it.
stop_group() {
    local pid=$1
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 10); do kill -0 "$pid" 2>/dev/null || return 0; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
}

# Removes the images this run's build made (its label), without -f: a pass per layer
# of children at most (removing an image removes its parents nothing else uses).
remove_built() {
    local made before left removed
    before=$(podman images -a -q --no-trunc --filter "label=$LABEL" | wc -l)
    for _ in 1 2 3 4 5 6 7 8; do
        made=$(podman images -a -q --no-trunc --filter "label=$LABEL")
        [ -n "$made" ] || break
        local id
        for id in $made; do podman rmi "$id" >/dev/null 2>&1 || true; done
    done
    left=$(podman images -a -q --no-trunc --filter "label=$LABEL" | wc -l)
    removed=$((before - left))
    if [ "$left" = 0 ]; then
        [ "$removed" = 0 ] || say "removed the $removed images this run built (the image and its stages)"
    else
        say "removed $removed images this run built; $left in use elsewhere stay (podman images -a --filter label=$LABEL)"
    fi
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    [ -n "$BUILD_PID" ] && stop_group "$BUILD_PID"
    [ -n "$SHOW_PID" ] && { kill "$SHOW_PID" 2>/dev/null || true; }
    if [ -n "$VLLM_SR_PID" ] && kill -0 "$VLLM_SR_PID" 2>/dev/null; then
        kill -TERM "$VLLM_SR_PID" 2>/dev/null || true
        for _ in $(seq 30); do kill -0 "$VLLM_SR_PID" 2>/dev/null || break; sleep 1; done
        kill -KILL "$VLLM_SR_PID" 2>/dev/null || true
    fi
    podman rm -f --ignore "$NAME" >/dev/null 2>&1 || true
    if [ "$ENGINE_STARTED" = 1 ]; then podman rm -f --ignore "$ENGINE" >/dev/null 2>&1 || true; fi
    if [ "$KEEP" = 1 ]; then
        [ "$BUILT" = 1 ] && say "kept the image $TAG (podman rmi $TAG removes it)"
    else
        remove_built
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Podman's settings for this script's builds and runs (vllm-sr's included): runc
# (crun refuses cgroups in hybrid mode) and rlimits within this host's hard limits
# (raising them needs CAP_SYS_RESOURCE; an nproc above half of pid_max was refused too).
limit() { local hard; hard=$(ulimit "$1"); [ "$hard" = unlimited ] && hard=$2; echo $((hard < $2 ? hard : $2)); }
NOFILE=$(limit -Hn 65536)
NPROC=$(limit -Hu 16384)
export CONTAINERS_CONF=$WORK/containers.conf
{
    echo '[containers]'
    echo "default_ulimits = [\"nofile=$NOFILE:$NOFILE\", \"nproc=$NPROC:$NPROC\"]"
    echo '[engine]'
    command -v runc >/dev/null && echo 'runtime = "runc"'
} >"$CONTAINERS_CONF"

# Waits for /health 200 on the port while `$2` (a command) says the server lives;
# `$3` (a command) shows its log on failure.
wait_healthy() {
    local what=$1 alive=$2 show_log=$3 started
    started=$(now)
    while :; do
        if [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 \
            "http://127.0.0.1:$PORT/health" || true)" = 200 ]; then
            say "$what: healthy $(since "$started") s after the start"
            return
        fi
        if ! $alive; then
            $show_log >&2 || true
            fail "$what ended before /health answered 200 (its log above)"
        fi
        if awk -v s="$(since "$started")" -v m="$HEALTH_S" 'BEGIN { exit !(s > m) }'; then
            $show_log >&2 || true
            fail "$what: /health not 200 within ${HEALTH_S}s (log above; IMAGE_CHECK_HEALTH_S raises the bound)"
        fi
        sleep 1
    done
}

# The README's first call; the answer must hold one embedding of 8 floats.
embed() {
    local what=$1 answer seconds
    answer=$WORK/answer.json
    seconds=$(curl -s -o "$answer" -w '%{time_total}' --max-time 120 \
        "http://127.0.0.1:$PORT/v1/embeddings" -H 'content-type: application/json' \
        -d "{\"model\": \"$MODEL\", \"input\": \"A semantic router picks the model\", \"dimensions\": 8}") ||
        fail "$what: the embeddings call failed (curl exit $?)"
    python3 - "$answer" <<'EOF' || fail "$what: the embeddings answer is not 8 floats: $(head -c 600 "$answer")"
import json, sys
vector = json.load(open(sys.argv[1]))["data"][0]["embedding"]
assert len(vector) == 8 and all(isinstance(x, float) for x in vector), vector
print("image-check:   embedding[:3] =", [round(x, 4) for x in vector[:3]])
EOF
    say "$what: first answer in $(awk -v s="$seconds" 'BEGIN { printf "%.0f", s * 1000 }') ms (8 floats)"
}

# --- 1. The base image: Debian bookworm's Python 3.11 (the torch wheel is cp311) --------
if podman image exists "$BASE"; then
    say "base $BASE: present (podman rmi $BASE makes it again)"
else
    command -v debootstrap >/dev/null || fail "debootstrap is not installed (apt-get install debootstrap)"
    say "base $BASE: debootstrap bookworm from $MIRROR"
    t=$(now)
    debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
        bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
        tail -n 20 "$WORK/debootstrap.log" >&2
        fail "debootstrap failed (log above): check that $MIRROR is reachable (IMAGE_CHECK_MIRROR)"
    }
    # This host's own CAs (a TLS-intercepting proxy's, say) so pip in the build trusts
    # what this machine trusts.
    if compgen -G "$CA_DIR/*.crt" >/dev/null; then
        cp "$CA_DIR"/*.crt "$WORK/rootfs/usr/local/share/ca-certificates/"
        chroot "$WORK/rootfs" update-ca-certificates >"$WORK/ca.log" 2>&1 || {
            cat "$WORK/ca.log" >&2
            fail "update-ca-certificates in the base failed (IMAGE_CHECK_CA_DIR= skips the host's CAs)"
        }
        say "base $BASE: with this host's CAs from $CA_DIR: $(cd "$CA_DIR" && echo ./*.crt)"
    fi
    rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/*
    tar -C "$WORK/rootfs" -c . | podman import -q --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' - "$BASE" >/dev/null || fail "podman import of the base failed"
    rm -rf "$WORK/rootfs"
    say "base $BASE: made in $(since "$t") s"
fi

# --- 2. The CPU image ------------------------------------------------------------------
# ACCELERATOR given explicitly: Podman 4.3's buildah resolves `FROM torch-${ACCELERATOR}`
# to the stage only for a --build-arg, not for the ARG's default (buildah issue 4312).
build_args=(--build-arg ACCELERATOR=cpu --build-arg "PYTHON_IMAGE=$BASE"
    --build-arg "TORCH_INDEX_CPU=$TORCH_INDEX")
if [ -n "$WHEELS" ]; then
    build_args+=(-v "$WHEELS:/wheels:ro" --build-arg TORCH_FIND_LINKS=/wheels)
fi
say "build $TAG (steps below; the whole log is kept only on failure)"
t=$(now)
# In the background and its own process group (set -m), so that SIGTERM or Ctrl-C
# stops it at once (bash runs a trap only once a foreground command ends). The host's
# network: pip reaches PyPI as this machine does. --label marks every stage's image.
: >"$WORK/build.log"
set -m
podman build --network host "${build_args[@]}" --label "$LABEL" --iidfile "$WORK/iid" \
    -t "$TAG" -f "$ROOT/Dockerfile" "$ROOT" >"$WORK/build.log" 2>&1 &
BUILD_PID=$!
set +m
{
    tail -n +1 --pid="$BUILD_PID" -f "$WORK/build.log" |
        grep --line-buffered -oE '^(\[[0-9/]+\] )?(STEP [0-9]+/[0-9]+: (FROM|RUN)|COMMIT).{0,110}' || true
} &
SHOW_PID=$!
code=0
wait "$BUILD_PID" || code=$?
BUILD_PID=
wait "$SHOW_PID" || true
if [ "$code" != 0 ] || [ ! -s "$WORK/iid" ]; then
    log=/tmp/vllm-sr-image-check-build-$RUN.log
    cp "$WORK/build.log" "$log"
    tail -n 30 "$WORK/build.log" >&2
    fail "podman build failed, exit $code (log above; whole log in $log)"
fi
BUILT=1
grep '^Successfully installed' "$WORK/build.log" | grep -oE ' torch-[^ ]+' |
    sed 's/^ /image-check:   installed /' || true
say "build: $(since "$t") s, $(podman image inspect --format '{{.Size}}' "$TAG" |
    awk '{ printf "%.2f GB", $1 / 1e9 }')"

# --- 3. vllm-srun serve, the image's own command ----------------------------------------
say "run $TAG (its CMD: vllm-srun serve MiniLM and Rampart) on 127.0.0.1:$PORT"
podman run -d --name "$NAME" -p "127.0.0.1:$PORT:8100" "$TAG" >/dev/null ||
    fail "podman run $TAG failed (is port $PORT free? IMAGE_CHECK_PORT picks another)"
image_alive() { [ "$(podman container inspect -f '{{.State.Running}}' "$NAME" 2>/dev/null)" = true ]; }
image_log() { podman logs --tail 40 "$NAME"; }
wait_healthy "vllm-srun serve (image CMD)" image_alive image_log
embed "vllm-srun serve (image CMD)"
t=$(now)
podman stop -t 30 "$NAME" >/dev/null || fail "podman stop $NAME failed"
podman rm "$NAME" >/dev/null || fail "podman rm $NAME failed"
say "vllm-srun serve (image CMD): stopped and removed in $(since "$t") s"

# --- 4. vllm-sr serve MODEL: the engine container, in the foreground ---------------------
mkdir -p "$WORK/cache"
say "run $VLLM_SR serve $MODEL --container-runtime podman --image $TAG --image-pull-policy never --port $PORT"
VLLM_SR_ENGINE_CACHE_DIR=$WORK/cache "$VLLM_SR" serve "$MODEL" --container-runtime podman \
    --image "$TAG" --image-pull-policy never --port "$PORT" >"$WORK/vllm-sr.log" 2>&1 &
VLLM_SR_PID=$!
ENGINE_STARTED=1
engine_alive() { kill -0 "$VLLM_SR_PID" 2>/dev/null; }
engine_log() { tail -n 40 "$WORK/vllm-sr.log"; }
wait_healthy "vllm-sr serve (engine container)" engine_alive engine_log
embed "vllm-sr serve (engine container)"
t=$(now)
kill -TERM "$VLLM_SR_PID"
for _ in $(seq 60); do engine_alive || break; sleep 1; done
engine_alive && fail "vllm-sr did not stop within 60 s of SIGTERM"
code=0
wait "$VLLM_SR_PID" || code=$?
VLLM_SR_PID=
[ "$code" = 0 ] || { engine_log >&2; fail "vllm-sr exited $code after SIGTERM (expected 0; log above)"; }
left=$(podman ps -a -q --filter "name=^$ENGINE\$")
[ -z "$left" ] || fail "container $ENGINE remains after vllm-sr stopped (podman rm -f $ENGINE)"
say "vllm-sr serve (engine container): SIGTERM, exit 0, no container left, in $(since "$t") s"
grep -m1 '^vllm-sr: engine container on' "$WORK/vllm-sr.log" | sed 's/^/image-check:   /' || true

say "PASSED in $(since "$START") s"
