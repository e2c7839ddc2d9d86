#!/usr/bin/env bash
# Builds, archives and pushes Skiff's container images with no Docker daemon and no registry to pull from:
#   base      a Debian bookworm minbase with python3, python3-venv, ca-certificates and libgomp1 (mmdebstrap, from
#             the host's apt sources), imported as localhost/skiff-base:bookworm
#   runtime   runtime/Dockerfile (CPU Paddle) FROM that base   -> localhost/skiff-runtime:<version>-<inputs>
#   operator  operator/Dockerfile FROM that base                -> localhost/skiff-operator:<version>-<inputs>
# with `buildah bud --isolation chroot --network host`, into a containers-storage under the skiff cache
# ($SKIFF_CACHE, default ~/.cache/skiff: containers/storage, never /var), plus an OCI archive of each image,
# $SKIFF_CACHE/images/<name>-<inputs>.oci.tar. <inputs> is the hash of what the image is built from (the
# Dockerfile, every file it COPYs, the base image id, the build arguments): checkouts with different sources get
# different tags and archives, side by side in one cache, and a test imports exactly its own. An image is rebuilt
# only when no archive for its inputs exists; the newest $SKIFF_IMAGES_KEEP (default 4) archives of each image are
# kept, older ones (and their tags) pruned. The plain <version> tag names the last build (for a quick
# `podman run`); every step prints its time. The host's CA bundle ($SSL_CERT_FILE or
# $PIP_CERT) is passed as the build secret skiff-ca: mounted for the steps that download, never in a layer.
#
# Usage: images.sh [build]              build what changed (base, runtime, operator), reuse the rest
#        images.sh base                 build only the base image (when its inputs changed)
#        images.sh check                exit 0 when buildah, podman, skopeo, mmdebstrap and runc are installed
#        images.sh push REGISTRY        copy both images (this checkout's inputs) to
#                                       docker://REGISTRY/skiff-{runtime,operator}:<version>
#        images.sh inputs               print each image's input hash (what decides a rebuild)
#        images.sh prune                remove all but the newest $SKIFF_IMAGES_KEEP archives (and tags) of each image
#        images.sh env                  print the paths and names the tests use (KEY=VALUE lines; the image names
#                                       and archives of this checkout's inputs, so run it after a build)
#        images.sh skaffold             skaffold's custom builder: builds $IMAGE, pushes it when $PUSH_IMAGE=true
# Environment: SKIFF_CACHE, SKIFF_IMAGES_KEEP, SKIFF_APT_SOURCES (a .sources/.list file for bookworm instead of the host's),
#              SKOPEO_FLAGS (extra flags for `skopeo copy` on push, e.g. --dest-tls-verify=false).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -1)"
store="$cache/containers"
archives="$cache/images"
base_image="localhost/skiff-base:bookworm"
keep="${SKIFF_IMAGES_KEEP:-4}"
base_packages="python3,python3-venv,ca-certificates,libgomp1"
tools=(buildah podman skopeo mmdebstrap runc)
storage_flags=(--root "$store/storage" --runroot "$store/run" --storage-driver overlay)
storage_ref="containers-storage:[overlay@$store/storage+$store/run]"

# Settings the tools read: podman here needs runc (crun 1.8 refuses the hybrid cgroup layout), explicit rlimits and
# no systemd; written under the cache and passed with CONTAINERS_CONF, never into /etc.
containers_conf="$store/containers.conf"
write_containers_conf() {
  mkdir -p "$store/storage" "$store/run" "$store/tmp" "$archives"
  cat >"$containers_conf.new" <<'EOF'
# Written by scripts/images.sh; used through CONTAINERS_CONF by the image builds and tests.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  mv "$containers_conf.new" "$containers_conf"
}
export CONTAINERS_CONF="$containers_conf" TMPDIR="$store/tmp"

step_start=0
begin() { step_start=$SECONDS; echo "==> $*"; }
done_step() { echo "    done in $(( (SECONDS - step_start) / 60 ))m$(( (SECONDS - step_start) % 60 ))s"; }
fail() { echo "error: $*" >&2; exit 1; }

check_tools() {
  local missing=() t
  for t in "${tools[@]}"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
  if ((${#missing[@]})); then
    echo "missing: ${missing[*]}; install them (Debian/Ubuntu, as root): apt-get install -y ${tools[*]}" >&2
    return 1
  fi
}

# The apt sources the base is made from: $SKIFF_APT_SOURCES, else the host's enabled sources files.
apt_sources() {
  if [[ -n "${SKIFF_APT_SOURCES:-}" ]]; then
    [[ -f "$SKIFF_APT_SOURCES" ]] || fail "SKIFF_APT_SOURCES=$SKIFF_APT_SOURCES is not a file"
    echo "$SKIFF_APT_SOURCES"; return
  fi
  local f found=()
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -s "$f" ]] && grep -qE '^[^#]*\bbookworm\b' "$f" && found+=("$f")
  done
  ((${#found[@]})) || fail "no apt source for Debian bookworm on this host; set SKIFF_APT_SOURCES to a .sources \
or .list file naming a bookworm mirror (e.g. 'deb http://deb.debian.org/debian bookworm main')"
  printf '%s\n' "${found[@]}"
}

image_id() {
  buildah "${storage_flags[@]}" images --noheading --no-trunc --format '{{.ID}}' "$1" 2>/dev/null | head -1
}

# The base (one for every checkout: its inputs are the host's apt sources): current when its last build had these
# inputs and the image is still there.
current() {
  local stamp="$archives/$1.inputs"
  [[ -f "$stamp" && "$(cut -d' ' -f1 "$stamp")" == "$2" ]] || return 1
  [[ "$(image_id "$3")" == "$(cut -d' ' -f2 "$stamp")" ]]
}
record() { echo "$2 $(image_id "$3")" >"$archives/$1.inputs"; }

build_base() {
  local listed sources; listed="$(apt_sources)"; mapfile -t sources <<<"$listed"
  local mmdebstrap_flags=(--variant=minbase "--include=$base_packages"
    --aptopt='APT::Install-Recommends "false"' --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*')
  local hash; hash="$({ mmdebstrap --version; printf '%s\n' "${mmdebstrap_flags[@]}"; cat "${sources[@]}"; } \
    | sha256sum | cut -c1-16)"
  if current base "$hash" "$base_image"; then echo "==> base $base_image: current"; return; fi
  begin "base $base_image: mmdebstrap bookworm minbase + ${base_packages//,/ } (from ${sources[*]}; ~2 min)"
  local tar="$store/tmp/base.tar"
  mmdebstrap --quiet "${mmdebstrap_flags[@]}" bookworm "$tar" "${sources[@]}" || fail "mmdebstrap failed; check \
that the mirrors in ${sources[*]} are reachable (or set SKIFF_APT_SOURCES) and rerun: make images"
  podman "${storage_flags[@]}" import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' "$tar" "$base_image" >/dev/null
  rm -f "$tar"
  record base "$hash" "$base_image"
  done_step
}

# The context paths a Dockerfile COPYs (not --from=another stage).
copied_paths() {
  sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$1" | awk 'toupper($1) == "COPY" || toupper($1) == "ADD" {
    if ($0 ~ /--from=/) next
    n = 0; for (i = 2; i <= NF; i++) if ($i !~ /^--/) p[++n] = $i
    for (i = 1; i < n; i++) print p[i] }'
}

# The CA bundle build steps trust: the host's, with a marker line so a test can prove it stays out of the image.
build_ca() {
  local src="${SSL_CERT_FILE:-${PIP_CERT:-}}" ca="$store/tmp/build-ca.crt"
  [[ -n "$src" && -f "$src" ]] || return 0
  { echo "# skiff-build-ca: mounted for the build only, never copied into an image"; cat "$src"; } >"$ca"
  echo "$ca"
}

build_args=(--build-arg "BASE=$base_image")

# input_hash DOCKERFILE: the build arguments, the base image id, the Dockerfile and every file it COPYs (less what
# .dockerignore drops from those trees: bytecode).
input_hash() {
  local paths; mapfile -t paths < <(cd "$repo" && copied_paths "$1")
  { printf '%s\n' "${build_args[@]}" "$(image_id "$base_image")"; cat "$repo/$1";
    cd "$repo" && find "${paths[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z \
      | xargs -0 sha256sum; } | sha256sum | cut -c1-16
}

# keyed_tag NAME HASH / archive NAME HASH: the tag and the archive of NAME built from inputs HASH.
keyed_tag() { echo "localhost/skiff-$1:$version-$2"; }
archive() { echo "$archives/$1-$2.oci.tar"; }
dockerfile_of() { case "$1" in runtime) echo runtime/Dockerfile ;; operator) echo operator/Dockerfile ;; esac; }

# build_image NAME: buildah bud unless this checkout's inputs were built already, then the OCI archive (written
# aside and renamed, so a reader never sees half of one), then the old archives pruned.
build_image() {
  local name="$1" dockerfile; dockerfile="$(dockerfile_of "$1")"
  cd "$repo"
  local hash; hash="$(input_hash "$dockerfile")"
  local tag; tag="$(keyed_tag "$name" "$hash")"
  local tar; tar="$(archive "$name" "$hash")"
  if [[ -s "$tar" && -n "$(image_id "$tag")" ]]; then
    touch "$tar"  # the newest are kept: this one is in use
    echo "==> $name $tag: current ($tar)"
    return
  fi
  if [[ -z "$(image_id "$tag")" ]]; then
    local ca mounts=(); ca="$(build_ca)"
    [[ -n "$ca" ]] && mounts=(--secret "id=skiff-ca,src=$ca")
    begin "$name $tag: buildah bud -f $dockerfile (inputs $hash)"
    buildah "${storage_flags[@]}" bud --isolation chroot --network host --layers --pull=false \
      "${mounts[@]}" "${build_args[@]}" -f "$dockerfile" -t "$tag" -t "localhost/skiff-$name:$version" . 2>&1 \
      | sed -u 's/^/    /' || fail "buildah bud -f $dockerfile failed at the step shown above; fix it (network: \
PyPI must be reachable) and rerun: make images"
    done_step
  fi
  begin "$name: OCI archive $tar"
  rm -f "$tar.partial"
  skopeo copy --quiet "$storage_ref$tag" "oci-archive:$tar.partial:$tag" \
    || fail "could not write $tar (disk space?); rerun: make images"
  mv "$tar.partial" "$tar"
  echo "    $(du -m "$tar" | cut -f1) MiB compressed, $(image_size "$tag") MB uncompressed"
  done_step
  prune "$name"
}

# prune NAME: all but the newest $keep archives of NAME removed, with their tags (the layers other tags share stay).
prune() {
  local old hash
  while read -r old; do
    hash="${old##*/$1-}"; hash="${hash%.oci.tar}"
    echo "==> pruning $1 inputs $hash (keeping the newest $keep): $old"
    rm -f "$old"
    buildah "${storage_flags[@]}" rmi "$(keyed_tag "$1" "$hash")" >/dev/null 2>&1 || true
  done < <(find "$archives" -maxdepth 1 -name "$1-*.oci.tar" -printf '%T@ %p\n' | sort -rn | tail -n "+$((keep + 1))" \
    | cut -d' ' -f2-)
}

image_size() { podman "${storage_flags[@]}" image inspect --format '{{.Size}}' "$1" | awk '{printf "%d", $1 / 1e6}'; }

# One build at a time per cache: another `make images` (or a test session) waits for this one, then finds its
# images current.
lock() {
  exec 9>"$store/build.lock"
  flock -n 9 || { echo "==> waiting for another scripts/images.sh using $store"; flock 9; }
}

build_all() {
  check_tools || exit 1
  local started=$SECONDS
  write_containers_conf
  lock
  build_base
  build_image runtime
  build_image operator
  echo "==> images ready in $((SECONDS - started))s: $(keyed runtime), $(keyed operator) (storage: $store/storage)"
}

# keyed NAME: this checkout's tag for NAME.
keyed() { keyed_tag "$1" "$(cd "$repo" && input_hash "$(dockerfile_of "$1")")"; }

push() {
  local registry="${1:-}"
  [[ -n "$registry" ]] || fail "no registry; run: make push REGISTRY=host[:port]/namespace"
  [[ "$registry" != *://* ]] || fail "REGISTRY=$registry: give host[:port]/namespace, without a scheme"
  local name
  for name in runtime operator; do
    local tag dest="$registry/skiff-$name:$version"; tag="$(keyed "$name")"
    [[ -n "$(image_id "$tag")" ]] || fail "$tag (this checkout's $name) is not built; run: make images"
    begin "push $tag -> docker://$dest"
    # shellcheck disable=SC2086
    skopeo copy ${SKOPEO_FLAGS:-} "$storage_ref$tag" "docker://$dest" || fail "push to $dest failed; \
log in with 'skopeo login ${registry%%/*}', or pass SKOPEO_FLAGS=--dest-tls-verify=false for a plain-HTTP registry"
    done_step
  done
  cat <<EOF
==> pushed. Install with these images:
    helm install skiff charts/skiff -n skiff-system --create-namespace \\
      --set image.repository=$registry/skiff-operator --set image.tag=$version \\
      --set-json 'watchNamespaces=["default"]'
    Models that name no spec.runtime.image then run $registry/skiff-runtime:$version (chart value runtimeImage).
EOF
}

# skaffold's custom builder contract: build the image $IMAGE names, tag it so, push it when $PUSH_IMAGE=true.
skaffold_build() {
  [[ -n "${IMAGE:-}" ]] || fail "IMAGE is not set; this mode is run by skaffold (skaffold build -p buildah)"
  build_all
  local source
  case "$IMAGE" in
    *skiff-runtime*) source="$(keyed runtime)" ;;
    *skiff-operator*) source="$(keyed operator)" ;;
    *) fail "IMAGE=$IMAGE names neither skiff-runtime nor skiff-operator" ;;
  esac
  buildah "${storage_flags[@]}" tag "$source" "$IMAGE"
  if [[ "${PUSH_IMAGE:-false}" == true ]]; then
    # shellcheck disable=SC2086
    skopeo copy ${SKOPEO_FLAGS:-} "$storage_ref$IMAGE" "docker://$IMAGE"
  else
    echo "==> $IMAGE is in $store/storage (not pushed: PUSH_IMAGE=${PUSH_IMAGE:-unset}); use --default-repo to push"
  fi
}

case "${1:-build}" in
  build) build_all ;;
  base) check_tools || exit 1; write_containers_conf; lock; build_base ;;
  check) check_tools && echo "ok: ${tools[*]}" ;;
  push) check_tools || exit 1; write_containers_conf; push "${2:-}" ;;
  skaffold) skaffold_build ;;
  prune) write_containers_conf; lock; prune runtime; prune operator ;;
  inputs) echo "runtime $(input_hash runtime/Dockerfile)"; echo "operator $(input_hash operator/Dockerfile)" ;;
  env)
    write_containers_conf
    runtime_hash="$(cd "$repo" && input_hash runtime/Dockerfile)"
    operator_hash="$(cd "$repo" && input_hash operator/Dockerfile)"
    printf '%s\n' "CACHE=$cache" "STORAGE_ROOT=$store/storage" "RUN_ROOT=$store/run" \
      "CONTAINERS_CONF=$containers_conf" "ARCHIVES=$archives" "BASE_IMAGE=$base_image" \
      "RUNTIME_IMAGE=$(keyed_tag runtime "$runtime_hash")" "RUNTIME_ARCHIVE=$(archive runtime "$runtime_hash")" \
      "OPERATOR_IMAGE=$(keyed_tag operator "$operator_hash")" \
      "OPERATOR_ARCHIVE=$(archive operator "$operator_hash")" ;;
  *) echo "usage: $0 [build|base|check|push REGISTRY|inputs|prune|env|skaffold]" >&2; exit 2 ;;
esac
