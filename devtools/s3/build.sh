#!/usr/bin/env bash
# Builds SeaweedFS's `weed` (Apache-2.0), the S3-compatible server the model-delivery tests fetch s3:// models
# from, into $SKIFF_CACHE/seaweedfs/<stamp>/weed (SKIFF_CACHE defaults to ~/.cache/skiff). The version is pinned in
# go.mod (SeaweedFS publishes no semver module tags: a pseudo-version of 2026-11-09, `weed version` 4.53) with the
# hashes of every module in go.sum; the build is redone only when go.mod, go.sum, the flags or Go change. Go's
# module and build caches are the control plane's ($SKIFF_CACHE/go). Cold: about 12 min on 2 busy cores (about 5
# on 2 quiet ones: ~1,100 packages); then 0.1 s. MinIO is AGPL, so it is not used.
#
# Usage: build.sh          build unless current, print the binary
#        build.sh --check  exit 0 when the binary is current; builds nothing
#        build.sh --path   print where the binary is (or will be)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}"
flags=(-trimpath -ldflags="-s -w")
command -v go >/dev/null || { echo "s3/build.sh: Go 1.26+ is required on PATH (https://go.dev/dl/)" >&2; exit 1; }
stamp="$({ go version; printf '%s\n' "${flags[@]}"; cat "$here/go.mod" "$here/go.sum"; } | sha256sum | cut -c1-16)"
weed="$cache/seaweedfs/$stamp/weed"

case "${1:-}" in
  --path) echo "$weed"; exit 0 ;;
  --check) [[ -x "$weed" ]]; exit $? ;;
  "") ;;
  *) echo "usage: $0 [--check|--path]" >&2; exit 2 ;;
esac
if [[ -x "$weed" ]]; then echo "==> seaweedfs: current ($weed)"; exit 0; fi

export GOCACHE="$cache/go/build" GOMODCACHE="$cache/go/mod" GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="-buildvcs=false -mod=readonly"
start=$SECONDS
echo "==> seaweedfs (weed, the S3 server of the model-delivery tests): download and compile (cold: about 12 min on 2 busy cores, 5 on quiet ones)"
mkdir -p "$(dirname "$weed")"
(cd "$here" && go build -v "${flags[@]}" -o "$weed.partial" github.com/seaweedfs/seaweedfs/weed 2>&1 \
  | awk '{ n++; if (n % 200 == 0) { printf "    ... %d packages\n", n; fflush() } } END { printf "    ... %d packages in total\n", n }')
mv "$weed.partial" "$weed"
# Older builds of other inputs are not kept: 160 MB each.
find "$cache/seaweedfs" -mindepth 1 -maxdepth 1 -type d ! -name "$stamp" -exec rm -rf {} +
echo "==> seaweedfs ready in $(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s: $weed"
