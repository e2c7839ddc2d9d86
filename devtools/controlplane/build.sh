#!/usr/bin/env bash
# Builds the local Kubernetes control plane from the Go module proxy, once, into a cache outside the repo:
#   kube-apiserver, kube-controller-manager, kube-scheduler, plus kubelet and kube-proxy for the e2e real node
#   (k8s.io/kubernetes, wrapper module kube/),
#   etcd (go.etcd.io/etcd/server/v3, wrapper module etcd/), kwok and kwokctl (sigs.k8s.io/kwok), and the real
#   node's pod sandbox process pause (module pause/, no dependencies).
# Binaries land in $SKIFF_CACHE/controlplane/<k8s version>/ (SKIFF_CACHE defaults to ~/.cache/skiff); each group
# is rebuilt only when its inputs (go.mod, go.sum, main.go, flags) change. Go's module and build caches live in
# $SKIFF_CACHE/go so a rebuild after an input change is incremental. Every step prints its time.
#
# Usage: build.sh            build what is missing, reuse the rest
#        build.sh --check    exit 0 when every binary is built and current, 1 otherwise (builds nothing)
#        build.sh --bin-dir  print the binary directory
# After a version bump in versions.env or a go.mod: run `go mod tidy` in that module, then this script.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}"
bin="$cache/controlplane/$K8S_VERSION"

case "${1:-}" in
  --bin-dir) echo "$bin"; exit 0 ;;
  --check|"") mode="${1:-build}" ;;
  *) echo "usage: $0 [--check|--bin-dir]" >&2; exit 2 ;;
esac

export GOCACHE="$cache/go/build" GOMODCACHE="$cache/go/mod" GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-buildvcs=false -mod=readonly"

# What upstream's build stamps into every binary; without it /version says v0.0.0 and kwokctl picks wrong flags.
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
version_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  version_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  version_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
kube_flags=(-trimpath -tags=selinux,notest,grpcnotrace -ldflags="-s -w$version_ldflags")
etcd_flags=(-trimpath -ldflags="-s -w")

# stamp NAME FILES...: a hash of a group's inputs, so an edited go.mod or flag triggers a rebuild.
stamp() {
  local name="$1"; shift
  { go version; printf '%s\n' "$K8S_VERSION" "$KWOK_VERSION" "${kube_flags[@]}" "${etcd_flags[@]}"; cat "$@"; } \
    | sha256sum | cut -c1-16 | sed "s/^/$name-/"
}
# current NAME STAMP BINARIES...: true when every binary exists and was built from these inputs.
current() {
  local name="$1" want="$2"; shift 2
  [[ -f "$bin/.stamp-$name" && "$(cat "$bin/.stamp-$name")" == "$want" ]] || return 1
  local b; for b in "$@"; do [[ -x "$bin/$b" ]] || return 1; done
}
# progress: turn `go build -v` package names into one line per 200 packages compiled.
progress() { awk '{ n++; if (n % 200 == 0) { printf "    ... %d packages\n", n; fflush() } } END { printf "    ... %d packages in total\n", n }'; }

step_start=0
begin() { step_start=$SECONDS; echo "==> $*"; }
done_step() { echo "    done in $(( (SECONDS - step_start) / 60 ))m$(( (SECONDS - step_start) % 60 ))s"; }

kube_stamp="$(stamp kube "$here"/kube/go.mod "$here"/kube/go.sum "$here"/kube/cmd/*/main.go)"
etcd_stamp="$(stamp etcd "$here"/etcd/go.mod "$here"/etcd/go.sum "$here"/etcd/main.go)"
kwok_stamp="$(stamp kwok "$here"/versions.env)"
pause_stamp="$(stamp pause "$here"/pause/go.mod "$here"/pause/main.go)"
kube_bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

if [[ "$mode" == "--check" ]]; then
  current kube "$kube_stamp" "${kube_bins[@]}" && current etcd "$etcd_stamp" etcd \
    && current kwok "$kwok_stamp" kwok kwokctl && current pause "$pause_stamp" pause && exit 0
  exit 1
fi

command -v go >/dev/null || { echo "build.sh: Go 1.26+ is required on PATH (https://go.dev/dl/)" >&2; exit 1; }
mkdir -p "$bin"
total_start=$SECONDS
echo "==> control plane $K8S_VERSION into $bin"

if current etcd "$etcd_stamp" etcd; then
  echo "==> etcd: cached"
else
  begin "etcd $(awk '/etcd\/server\/v3 /{print $NF}' "$here/etcd/go.mod"): download and compile"
  rm -f "$bin/.stamp-etcd"
  (cd "$here/etcd" && go build -v "${etcd_flags[@]}" -o "$bin/etcd" . 2>&1 | progress)
  echo "$etcd_stamp" > "$bin/.stamp-etcd"; done_step
fi

if current kwok "$kwok_stamp" kwok kwokctl; then
  echo "==> kwok, kwokctl: cached"
else
  begin "kwok, kwokctl $KWOK_VERSION: go install"
  rm -f "$bin/.stamp-kwok"
  # kwok has its own go.mod with no replace directives, so go install works from the proxy; stamp its version
  # where its release build does.
  GOFLAGS="-buildvcs=false" GOBIN="$bin" go install -v -trimpath \
    -ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION" 2>&1 | progress
  echo "$kwok_stamp" > "$bin/.stamp-kwok"; done_step
fi

if current pause "$pause_stamp" pause; then
  echo "==> pause: cached"
else
  begin "pause (the real node's pod sandbox process): compile"
  rm -f "$bin/.stamp-pause"
  (cd "$here/pause" && go build -v "${etcd_flags[@]}" -o "$bin/pause" . 2>&1 | progress)
  echo "$pause_stamp" > "$bin/.stamp-pause"; done_step
fi

if current kube "$kube_stamp" "${kube_bins[@]}"; then
  echo "==> ${kube_bins[*]}: cached"
else
  begin "${kube_bins[*]} $K8S_VERSION: download modules"
  (cd "$here/kube" && go mod download) && done_step
  # Cold: about 6.5 min on 2 cores (2,500 packages); after a go.mod or main.go edit only what changed compiles and
  # all five binaries are relinked from the build cache (about 1.5 min when two binaries are new, 10 s otherwise).
  begin "${kube_bins[*]} $K8S_VERSION: compile (cold: about 6.5 min on 2 cores)"
  rm -f "$bin/.stamp-kube"
  (cd "$here/kube" && go build -v "${kube_flags[@]}" -o "$bin/" ./cmd/... 2>&1 | progress)
  echo "$kube_stamp" > "$bin/.stamp-kube"; done_step
fi

"$bin/kube-apiserver" --version
echo "==> control plane ready in $bin ($(( (SECONDS - total_start) / 60 ))m$(( (SECONDS - total_start) % 60 ))s)"
