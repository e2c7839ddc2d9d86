#!/usr/bin/env bash
# Builds Prometheus (Apache-2.0) from its Go module, the server the observability e2e test scrapes the real node
# with, into $SKIFF_CACHE/prometheus/<stamp>/prometheus (SKIFF_CACHE defaults to ~/.cache/skiff). Debian's
# `prometheus` package (2.42) is built without Kubernetes service discovery, which a ServiceMonitor needs, so the
# upstream module is built instead: version pinned in go.mod (v0.316.0 is Prometheus 3.16.0) with every module's
# hash in go.sum, and only the Kubernetes and file discovery compiled in (build tags remove_all_sd,
# enable_kubernetes_sd). Redone only when go.mod, go.sum, the flags or Go change. Go's module and build caches are
# the control plane's ($SKIFF_CACHE/go). Cold: about 4 min on 2 busy cores (about 3 min measured, the module cache warm); then 0.1 s.
#
# Usage: build.sh          build unless current, print the binary
#        build.sh --check  exit 0 when the binary is current; builds nothing
#        build.sh --path   print where the binary is (or will be)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}"
version=3.16.0  # go.mod pins v0.316.0, its Go module version
flags=(-trimpath -ldflags="-s -w -X github.com/prometheus/common/version.Version=$version" -tags=remove_all_sd,enable_kubernetes_sd)
command -v go >/dev/null || { echo "prometheus-go/build.sh: Go 1.26+ is required on PATH (https://go.dev/dl/)" >&2; exit 1; }
stamp="$({ go version; printf '%s\n' "${flags[@]}"; cat "$here/go.mod" "$here/go.sum"; } | sha256sum | cut -c1-16)"
binary="$cache/prometheus/$stamp/prometheus"

case "${1:-}" in
  --path) echo "$binary"; exit 0 ;;
  --check) [[ -x "$binary" ]]; exit $? ;;
  "") ;;
  *) echo "usage: $0 [--check|--path]" >&2; exit 2 ;;
esac
if [[ -x "$binary" ]]; then echo "==> prometheus: current ($binary)"; exit 0; fi

export GOCACHE="$cache/go/build" GOMODCACHE="$cache/go/mod" GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-buildvcs=false -mod=readonly"
start=$SECONDS
echo "==> prometheus (the observability test's scraper): download and compile (cold: about 4 min on 2 busy cores)"
mkdir -p "$(dirname "$binary")"
(cd "$here" && go build -v "${flags[@]}" -o "$binary.partial" github.com/prometheus/prometheus/cmd/prometheus 2>&1 \
  | awk '{ n++; if (n % 200 == 0) { printf "    ... %d packages\n", n; fflush() } } END { printf "    ... %d packages in total\n", n }')
mv "$binary.partial" "$binary"
find "$cache/prometheus" -mindepth 1 -maxdepth 1 -type d ! -name "$stamp" -exec rm -rf {} +
echo "==> prometheus ready in $(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s: $binary"
