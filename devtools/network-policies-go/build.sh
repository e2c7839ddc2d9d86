#!/usr/bin/env bash
# Builds SIG Network's NetworkPolicy engine kube-network-policies (Apache-2.0) from its Go module, the
# implementation the real node enforces NetworkPolicy with, into $SKIFF_CACHE/network-policies/<stamp>/
# kube-network-policies (SKIFF_CACHE defaults to ~/.cache/skiff). Version pinned with its module hash (the go.sum
# line of sigs.k8s.io/kube-network-policies v0.8.0, checked before building; the module's own go.sum pins every
# dependency), plus two patches: nfqueue-xt.patch (the e2e machines' kernels have no nftables queue expression, so
# the engine's `queue` rules become the iptables NFQUEUE target run through nft_compat, the same verdict) and
# host-process.patch (flags --server, --certificate-authority, --client-certificate, --client-key: the real node
# runs it as a host process with the kubelet's credentials, where the engine knew only the in-cluster
# configuration; no new dependency). Redone only when the version, the hash, a patch, the flags or Go change. Go's module and build caches are the
# control plane's ($SKIFF_CACHE/go). Cold: 27 min measured on 2 cores at a load average of 16-27 (2.6 min of CPU;
# docs/e2e.md); then 0.06 s.
#
# Usage: build.sh          build unless current, print the binary
#        build.sh --check  exit 0 when the binary is current; builds nothing
#        build.sh --path   print where the binary is (or will be)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}"
module=sigs.k8s.io/kube-network-policies
version=v0.8.0
sum="h1:dzecRNzdmg+VmHEQWTIjxnCgf412J+8CKHqbKgCiWkk="
flags=(-trimpath -ldflags="-s -w")
command -v go >/dev/null || { echo "network-policies-go/build.sh: Go 1.26+ is required on PATH (https://go.dev/dl/)" >&2; exit 1; }
stamp="$({ go version; echo "$module@$version $sum"; printf '%s\n' "${flags[@]}"; cat "$here"/*.patch; } | sha256sum | cut -c1-16)"
binary="$cache/network-policies/$stamp/kube-network-policies"

case "${1:-}" in
  --path) echo "$binary"; exit 0 ;;
  --check) [[ -x "$binary" ]]; exit $? ;;
  "") ;;
  *) echo "usage: $0 [--check|--path]" >&2; exit 2 ;;
esac
if [[ -x "$binary" ]]; then echo "==> kube-network-policies: current ($binary)"; exit 0; fi

export GOCACHE="$cache/go/build" GOMODCACHE="$cache/go/mod" GOTOOLCHAIN=local CGO_ENABLED=0
start=$SECONDS
echo "==> kube-network-policies $version (the real node's NetworkPolicy engine): download, patch, compile"
info="$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "$module@$version")"
got="$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")"
dir="$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info")"
if [[ "$got" != "$sum" ]]; then
  echo "network-policies-go/build.sh: $module@$version has hash '$got', expected $sum: refusing to build it" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$dir/." "$work/src" 2>/dev/null || { mkdir -p "$work/src" && cp -r "$dir/." "$work/src"; }
chmod -R u+w "$work/src"
for each in "$here"/*.patch; do (cd "$work/src" && patch -s -p1 < "$each"); done
mkdir -p "$(dirname "$binary")"
(cd "$work/src" && GOFLAGS="-buildvcs=false -mod=readonly" go build "${flags[@]}" -o "$binary.partial" ./cmd)
mv "$binary.partial" "$binary"
find "$cache/network-policies" -mindepth 1 -maxdepth 1 -type d ! -name "$stamp" -exec rm -rf {} +
echo "==> kube-network-policies ready in $(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s: $binary"
