#!/usr/bin/env bash
# Builds the switchyard container image without a Docker daemon or a registry, then runs it.
#
#   scripts/image.sh [--no-run]
#
# 1. base: libc6 and libgcc-s1 only (what the binary links: ldd shows libc, libm, libgcc_s),
#    extracted from Debian packages with mmdebstrap (--variant=extract: no shell, no dpkg, no
#    apt in the image), plus /etc/passwd and /etc/group naming UID/GID 65532 `nonroot`;
# 2. image: buildah from scratch, the base, the binary at /usr/local/bin/switchyard, user
#    65532:65532, entrypoint the binary, ports 8080 and 9090 (as the Dockerfile and the chart);
# 3. inspect: the image's user, entrypoint and files (no /bin/sh);
# 4. run (unless --no-run): podman as UID 65532 with a read-only root file system, the demo
#    configuration mounted read-only, `switchyard standalone` on a free loopback port, and the
#    official openai SDK (the venv of scripts/setup-venv.sh) gets a chat answer from it.
#
# The binary is $SWITCHYARD_IMAGE_BIN, by default target/release/switchyard when it exists,
# else target/debug/switchyard (build one first). Environment: SWITCHYARD_IMAGE (tag, default
# localhost/switchyard:dev), SWITCHYARD_IMAGE_SUITE (Debian suite of the base, default the
# host's), SWITCHYARD_IMAGE_MIRROR (default the host's first Debian apt source, else
# deb.debian.org). Needs root (or mmdebstrap's unshare mode), mmdebstrap, buildah, podman and
# runc (Debian packages; .ci/run installs them).
#
# On this CI machine (cgroup v1 with a cgroup2 mount holding a controller, "hybrid"), crun
# refuses to start containers and the RLIMIT_NPROC podman asks for by default cannot be set,
# so the run uses runc and explicit --ulimit values no higher than the current ones.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
run=1
[[ "${1:-}" == "--no-run" ]] && run=0

log() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for tool in mmdebstrap buildah podman; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (apt-get install $tool)"
done
bin="${SWITCHYARD_IMAGE_BIN:-}"
if [[ -z "$bin" ]]; then
    if [[ -x target/release/switchyard ]]; then bin=target/release/switchyard; else bin=target/debug/switchyard; fi
fi
[[ -x "$bin" ]] || die "no binary at $bin: cargo build -p switchyard (or set SWITCHYARD_IMAGE_BIN)"
tag="${SWITCHYARD_IMAGE:-localhost/switchyard:dev}"
suite="${SWITCHYARD_IMAGE_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")}"
mirror="${SWITCHYARD_IMAGE_MIRROR:-$( { grep -rhoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true; } | head -1 | tr -d ' ')}"
mirror="${mirror:-http://deb.debian.org/debian}"

work="$(mktemp -d)"
ctr=""
name="switchyard-image-check-$$"
cleanup() {
    [[ -n "$ctr" ]] && buildah rm "$ctr" >/dev/null 2>&1 || true
    podman rm -f "$name" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

log "base: libc6, libgcc-s1 from $mirror $suite (mmdebstrap --variant=extract)"
mmdebstrap --quiet --variant=extract --include=libc6,libgcc-s1 --format=tar \
    --customize-hook='rm -rf "$1"/etc/apt "$1"/var/lib/apt "$1"/var/cache/apt "$1"/var/log/apt' \
    --customize-hook='printf "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n" > "$1"/etc/passwd' \
    --customize-hook='printf "root:x:0:\nnonroot:x:65532:\n" > "$1"/etc/group' \
    --customize-hook='mkdir -p "$1"/tmp && chmod 1777 "$1"/tmp' \
    "$suite" "$work/base.tar" "$mirror"

log "image: $tag from scratch with $bin"
ctr="$(buildah from scratch)"
buildah add --quiet "$ctr" "$work/base.tar" / >/dev/null
buildah copy --quiet --chmod 0755 "$ctr" "$bin" /usr/local/bin/switchyard >/dev/null
buildah config --user 65532:65532 --entrypoint '["/usr/local/bin/switchyard"]' --cmd '--help' \
    --port 8080 --port 9090 --workingdir / \
    --label org.opencontainers.image.title=switchyard \
    --label org.opencontainers.image.source=https://github.com/switchyard \
    --label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
    "$ctr"
buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
ctr=""

log "inspect"
user="$(podman image inspect "$tag" --format '{{.Config.User}}')"
entry="$(podman image inspect "$tag" --format '{{json .Config.Entrypoint}}')"
size="$(podman image inspect "$tag" --format '{{.Size}}')"
[[ "$user" == "65532:65532" ]] || die "image user is '$user', not 65532:65532"
[[ "$entry" == '["/usr/local/bin/switchyard"]' ]] || die "entrypoint is $entry"
if tar tf "$work/base.tar" | grep -qE '(^|/)(bin|sbin)/(sh|bash|dash|busybox)$'; then
    die "the base has a shell"
fi
if tar tf "$work/base.tar" | grep -qE '(^|/)usr/bin/(dpkg|apt|apt-get)$'; then
    die "the base has a package manager"
fi
log "image $tag: user $user, entrypoint $entry, $((size / 1024 / 1024)) MiB; the base has no shell and no package manager"

[[ $run == 1 ]] || exit 0

nofile="$(ulimit -n)"
nproc="$(ulimit -u)"
[[ "$nproc" == unlimited ]] && nproc=65536
nproc=$((nproc > 4096 ? 4096 : nproc))
runtime=()
if command -v runc >/dev/null 2>&1; then runtime=(--runtime "$(command -v runc)"); fi
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log "run: podman, UID 65532, read-only root, standalone demo on 127.0.0.1:$port"
podman run -d --name "$name" "${runtime[@]}" --read-only --user 65532:65532 --network=host \
    --cap-drop=all --security-opt=no-new-privileges \
    --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" \
    -v "$root/config/demo:/demo:ro" \
    "$tag" standalone --manifests /demo --mocks /demo/mock/providers.yaml \
    --secrets-dir /demo/secrets --listen "127.0.0.1:$port" >/dev/null
for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
    [[ "$(podman inspect "$name" --format '{{.State.Running}}')" == true ]] || { podman logs "$name" >&2; die "the container exited"; }
    sleep 0.2
done
curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null || { podman logs "$name" >&2; die "no /healthz answer"; }
uid="$(podman top "$name" user | tail -1 | tr -d ' ')"
[[ "$uid" == 65532 || "$uid" == nonroot ]] || die "the process runs as '$uid', not 65532"
ro="$(podman inspect "$name" --format '{{.HostConfig.ReadonlyRootfs}}')"
[[ "$ro" == true ]] || die "root file system not read-only"

python="${SWITCHYARD_PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || die "no venv python at $python: run scripts/setup-venv.sh"
answer="$("$python" - "$port" <<'EOF'
import sys
import openai

client = openai.OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="sk-demo", max_retries=0)
reply = client.chat.completions.create(
    model="demo-chat", messages=[{"role": "user", "content": "hello from the image check"}]
)
text = reply.choices[0].message.content
assert text, f"empty answer: {reply}"
print(f"openai {openai.__version__}: model {reply.model}, {len(text)} characters: {text[:60]!r}")
EOF
)" || { podman logs "$name" >&2; die "the openai SDK got no answer"; }
log "container process user $uid (UID 65532), read-only root: $ro"
log "$answer"
echo "image check passed: $tag"
