#!/usr/bin/env bash
# Builds one pinned Go tool from the Go module proxy once, into $SKIFF_CACHE/<tool>/<version>/ (SKIFF_CACHE
# defaults to ~/.cache/skiff), sharing the control plane's Go caches, and prints the binary's path.
# Usage: scripts/gotool.sh grpcurl|grpc_health_probe. Cold: a few minutes on 2 busy cores; afterwards instant.
set -euo pipefail

# tool -> module path of its main package @ pinned version (the cache is keyed by tool and version)
declare -A PACKAGES=(
  [grpcurl]="github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3"
  [grpc_health_probe]="github.com/grpc-ecosystem/grpc-health-probe@v0.4.62"
)
tool="${1:-}"
package="${PACKAGES[$tool]:-}"
[[ -n "$package" ]] || { echo "gotool.sh: unknown tool '$tool'; pick one of: ${!PACKAGES[*]}" >&2; exit 2; }
version="${package##*@}"
module="${package%@*}"
cache="${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}"
bin="$cache/$tool/$version"
if [[ ! -x "$bin/$tool" ]]; then
  command -v go >/dev/null || { echo "gotool.sh: go is not on PATH; install Go 1.26 (see README)" >&2; exit 1; }
  echo "==> building $tool $version into $bin (once; a few minutes cold)" >&2
  started=$SECONDS
  GOCACHE="$cache/go/build" GOMODCACHE="$cache/go/mod" GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
    GOBIN="$bin.partial" go install -trimpath "$package" >&2
  built="$bin.partial/$(basename "$module")"  # go names the binary after the package's last path element
  [[ "$built" == "$bin.partial/$tool" ]] || mv "$built" "$bin.partial/$tool"
  mkdir -p "$(dirname "$bin")" && rm -rf "$bin" && mv "$bin.partial" "$bin"
  echo "==> $tool built in $((SECONDS - started))s" >&2
fi
echo "$bin/$tool"
