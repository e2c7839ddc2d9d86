"""Finds the third-party data files tests need: the Gateway API v1.6.1 CRDs and the skaffold v4beta14 schema.

They are not committed. Looked for, in order: an explicit environment variable; `shared/vendor-data` next to
the checkout or next to any folder above it; `/work/shared/vendor-data`. The Gateway API CRDs have one more
source that needs no local copy: the `sigs.k8s.io/gateway-api` module from the Go module proxy (its
`config/crd/standard/` files are byte-identical to the vendored ones), cached under $SKIFF_CACHE/go/mod.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GATEWAY_API_VERSION = "v1.6.1"
GATEWAY_API_MODULE = "sigs.k8s.io/gateway-api"
SKAFFOLD_SCHEMA = Path("skaffold-schema-v4beta14") / "v4beta14.json"


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "skiff"
    return Path(os.environ.get("SKIFF_CACHE") or default)


def vendor_dirs() -> list[Path]:
    """Candidate `vendor-data` folders, most specific first (existing ones only)."""
    candidates: list[Path] = []
    if os.environ.get("SKIFF_VENDOR_DATA"):
        candidates.append(Path(os.environ["SKIFF_VENDOR_DATA"]))
    candidates += [parent / "shared" / "vendor-data" for parent in REPO.parents]
    candidates.append(Path("/work/shared/vendor-data"))
    return [c for c in dict.fromkeys(candidates) if c.is_dir()]


def skaffold_schema() -> Path | None:
    if os.environ.get("SKIFF_SKAFFOLD_SCHEMA"):
        return Path(os.environ["SKIFF_SKAFFOLD_SCHEMA"])
    return next((d / SKAFFOLD_SCHEMA for d in vendor_dirs() if (d / SKAFFOLD_SCHEMA).is_file()), None)


def _gateway_api_from_go_proxy() -> Path | None:
    env = {**os.environ, "GOMODCACHE": str(cache_dir() / "go" / "mod"), "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    try:
        result = subprocess.run(
            ["go", "mod", "download", "-json", f"{GATEWAY_API_MODULE}@{GATEWAY_API_VERSION}"],
            capture_output=True, text=True, timeout=300, env=env, cwd=str(cache_dir().parent),
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in result.stdout.splitlines():
        if '"Dir":' in line:
            folder = Path(line.split('"Dir":', 1)[1].strip().strip('",')) / "config" / "crd" / "standard"
            return folder if folder.is_dir() else None
    return None


def gateway_api_dir() -> Path | None:
    """A folder holding `gateway.networking.k8s.io_*.yaml` (standard channel, v1.6.1)."""
    if os.environ.get("SKIFF_GATEWAY_API_DIR"):
        return Path(os.environ["SKIFF_GATEWAY_API_DIR"])
    name = f"gateway-api-{GATEWAY_API_VERSION}"
    local = next((d / name for d in vendor_dirs() if (d / name).is_dir()), None)
    return local or _gateway_api_from_go_proxy()
