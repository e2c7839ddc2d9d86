#!/usr/bin/env bash
# Makes Triton's perf_analyzer (PyPI `perf-analyzer`, pinned below with its hash) runnable on a Debian 12 host and
# prints the path of a `perf_analyzer` launcher. The wheel's binary needs glibc >= 2.38 and GLIBCXX_3.4.32 (Debian
# 12 has 2.36), so the launcher runs it with Debian 13 (trixie)'s own dynamic loader and libraries: libc6,
# libstdc++6, libgcc-s1, libssl3t64 and zlib1g extracted by `mmdebstrap --variant=extract` (~25 MB, no chroot and no
# container needed; the host's network and files as they are). Built once into
# $SKIFF_CACHE/perf_analyzer/<hash of this script, the apt sources and mmdebstrap's version>/ (SKIFF_CACHE defaults
# to ~/.cache/skiff): ~30 s cold, then instant.
# Environment: SKIFF_TRIXIE_SOURCES, a .sources/.list file naming a trixie mirror (default: the mirrors the host's
# apt sources use for bookworm, with suite trixie).
set -euo pipefail

WHEEL="perf-analyzer==2.60.0 --hash=sha256:23ef56b107ae9233e5cf09fbdf508dd9b936a52f1bae2f63f53c8117087b3f25"
PACKAGES="libc6,libstdc++6,libgcc-s1,libssl3t64,zlib1g"
cache="${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}/perf_analyzer"
fail() { echo "perf_analyzer.sh: $*" >&2; exit 1; }

# The trixie sources: $SKIFF_TRIXIE_SOURCES, else every mirror URI that the host's apt sources use for the suite
# `bookworm` itself (not -updates or -security), as one deb822 stanza for trixie.
trixie_sources() {
  if [[ -n "${SKIFF_TRIXIE_SOURCES:-}" ]]; then
    [[ -f "$SKIFF_TRIXIE_SOURCES" ]] || fail "SKIFF_TRIXIE_SOURCES=$SKIFF_TRIXIE_SOURCES is not a file"
    cat "$SKIFF_TRIXIE_SOURCES"; return
  fi
  local uris
  uris="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | awk '/^deb[ \t]/ { sub(/\[[^]]*\]/, ""); if ($3 == "bookworm") print $2 }
           /^$/ { if (suite) printf "%s", u; suite = 0; u = "" }
           /^URIs:/ { for (i = 2; i <= NF; i++) u = u $i "\n" }
           /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") suite = 1 }
           END { if (suite) printf "%s", u }' | sort -u | tr '\n' ' ')"
  [[ -n "${uris// }" ]] || fail "no apt source for Debian bookworm on this host to take a trixie mirror from; set \
SKIFF_TRIXIE_SOURCES to a file with a line like 'deb http://deb.debian.org/debian trixie main'"
  printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\n' "$uris"
  printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
}

command -v mmdebstrap >/dev/null || fail "mmdebstrap is not installed; as root: apt-get install -y mmdebstrap"
# The project's own uv (the dev extra in .venv, pinned in uv.lock), never whichever uv PATH has.
uv="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/uv"
[[ -x "$uv" ]] || fail "$uv is missing; run \`make setup\` (installs the dev extras, uv among them, into .venv)"
sources="$(trixie_sources)"
key="$({ cat "${BASH_SOURCE[0]}"; echo "$sources"; mmdebstrap --version; } | sha256sum | cut -c1-16)"
dir="$cache/$key"
if [[ ! -x "$dir/perf_analyzer" ]]; then
  echo "==> perf_analyzer: Debian 13 libraries ($PACKAGES) + ${WHEEL%% *} into $dir (once; ~30 s)" >&2
  started=$SECONDS
  rm -rf "$dir.partial" && mkdir -p "$dir.partial"
  echo "$sources" >"$dir.partial/trixie.sources"
  mmdebstrap --quiet --variant=extract "--include=$PACKAGES" --dpkgopt='path-exclude=/usr/share/*' \
    trixie "$dir.partial/root" "$dir.partial/trixie.sources" >&2 \
    || fail "mmdebstrap trixie failed; check that the mirror in $dir.partial/trixie.sources serves trixie (or set \
SKIFF_TRIXIE_SOURCES) and rerun"
  echo "$WHEEL" >"$dir.partial/requirements.txt"
  "$uv" pip install --quiet --target "$dir.partial/wheel" --python-platform x86_64-manylinux_2_38 --python-version 3.13 \
    --no-deps --require-hashes -r "$dir.partial/requirements.txt" >&2 || fail "could not install ${WHEEL%% *} from PyPI"
  cat >"$dir.partial/perf_analyzer" <<'EOF'
#!/bin/sh
# perf_analyzer under Debian 13's loader and libraries (written by scripts/perf_analyzer.sh).
here="$(dirname "$(readlink -f "$0")")"
lib="$here/root/usr/lib/x86_64-linux-gnu"
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$here/wheel/perf_analyzer/bin/perf_analyzer" "$@"
EOF
  chmod +x "$dir.partial/perf_analyzer"
  "$dir.partial/perf_analyzer" --version >&2 || fail "the built perf_analyzer does not start (see above)"
  rm -rf "$dir" && mv "$dir.partial" "$dir"
  echo "==> perf_analyzer ready in $((SECONDS - started))s ($(du -sh "$dir" | cut -f1))" >&2
fi
echo "$dir/perf_analyzer"
