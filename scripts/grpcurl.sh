#!/usr/bin/env bash
# Builds grpcurl (github.com/fullstorydev/grpcurl, pinned below) from the Go module proxy once, into
# $SKIFF_CACHE/grpcurl/<version>/ (SKIFF_CACHE defaults to ~/.cache/skiff), sharing the control plane's Go caches;
# prints the binary's path. Cold: about 5 min on 2 busy cores; afterwards instant. Used by the reflection tests.
set -euo pipefail

GRPCURL_VERSION=v1.9.3
cache="${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}"
bin="$cache/grpcurl/$GRPCURL_VERSION"
if [[ ! -x "$bin/grpcurl" ]]; then
  command -v go >/dev/null || { echo "grpcurl.sh: go is not on PATH; install Go 1.26 (see README)" >&2; exit 1; }
  echo "==> building grpcurl $GRPCURL_VERSION into $bin (once; a few minutes cold)" >&2
  started=$SECONDS
  GOCACHE="$cache/go/build" GOMODCACHE="$cache/go/mod" GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
    GOBIN="$bin" go install -trimpath "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION" >&2
  echo "==> grpcurl built in $((SECONDS - started))s" >&2
fi
echo "$bin/grpcurl"
