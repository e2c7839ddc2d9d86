#!/usr/bin/env bash
# Makes the project's virtual environment (.venv) from uv.lock; installs the pinned uv first when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.8
if command -v uv >/dev/null 2>&1 && [ "$(uv --version | awk '{print $2}')" = "$UV_VERSION" ]; then
  UV=uv
else
  UV=.cache/tools/bin/uv
  if [ ! -x "$UV" ]; then
    echo "==> installing uv $UV_VERSION into .cache/tools (one time)"
    python3 -m venv .cache/tools
    .cache/tools/bin/pip install -q "uv==$UV_VERSION" || {
      echo "error: could not install uv from PyPI; check network access to PyPI and retry" >&2; exit 1; }
  fi
fi
echo "==> syncing .venv from uv.lock (first run downloads Paddle, ~200 MB)"
"$UV" sync --frozen --extra dev --quiet
echo "==> .venv ready: $(.venv/bin/python --version)"
