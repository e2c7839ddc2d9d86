#!/usr/bin/env bash
# Builds Jaeger 1.76.0 (Apache-2.0) from its Go module, the trace collector the tracing e2e test sends OTLP spans to
# and reads back through its query API, into $SKIFF_CACHE/jaeger/<stamp>/jaeger (SKIFF_CACHE defaults to
# ~/.cache/skiff). The version is pinned in go.mod (a `tool` line) with every module's hash in go.sum. Redone only
# when go.mod, go.sum, the flags or Go change. Go's module and build caches are the control plane's ($SKIFF_CACHE/go).
# Cold: see docs/observability.md for the measured time; then 0.1 s.
#
# Usage: build.sh          build unless current, print the binary
#        build.sh --check  exit 0 when the binary is current; builds nothing
#        build.sh --path   print where the binary is (or will be)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}"
version=1.76.0  # go.mod pins github.com/jaegertracing/jaeger v1.76.0
flags=(-trimpath -ldflags="-s -w")
command -v go >/dev/null || { echo "jaeger-go/build.sh: Go 1.26+ is required on PATH (https://go.dev/dl/)" >&2; exit 1; }
stamp="$({ go version; echo "$version"; printf '%s\n' "${flags[@]}"; cat "$here/go.mod" "$here/go.sum"; } | sha256sum | cut -c1-16)"
binary="$cache/jaeger/$stamp/jaeger"

case "${1:-}" in
  --path) echo "$binary"; exit 0 ;;
  --check) [[ -x "$binary" ]]; exit $? ;;
  "") ;;
  *) echo "usage: $0 [--check|--path]" >&2; exit 2 ;;
esac
if [[ -x "$binary" ]]; then echo "==> jaeger: current ($binary)"; exit 0; fi

export GOCACHE="$cache/go/build" GOMODCACHE="$cache/go/mod" GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-buildvcs=false -mod=readonly"
start=$SECONDS
echo "==> jaeger $version (the tracing test's collector): download and compile"
mkdir -p "$(dirname "$binary")"
(cd "$here" && go build -v "${flags[@]}" -o "$binary.partial" github.com/jaegertracing/jaeger/cmd/jaeger 2>&1 \
  | awk '{ n++; if (n % 200 == 0) { printf "    ... %d packages\n", n; fflush() } } END { printf "    ... %d packages in total\n", n }')
mv "$binary.partial" "$binary"
find "$cache/jaeger" -mindepth 1 -maxdepth 1 -type d ! -name "$stamp" -exec rm -rf {} +
echo "==> jaeger ready in $(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s: $binary"
