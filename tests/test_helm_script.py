"""devtools/controlplane/helm.sh picks helm: its cache, else helm on PATH only when `helm version` is the pinned one."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from devtools.helm import HELM_SCRIPT

PINNED = re.search(r"^HELM_VERSION=(\S+)$", HELM_SCRIPT.read_text(), re.MULTILINE)


def fake_helm(folder: Path, version: str) -> Path:
    """A `helm` that answers `helm version --template {{.Version}}` like the real one."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "helm"
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def helm_sh(*args: str, cache: Path, path_dirs: list[Path]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SKIFF_CACHE": str(cache), "PATH": os.pathsep.join([*map(str, path_dirs), "/usr/bin:/bin"])}
    return subprocess.run(["bash", str(HELM_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30)


@pytest.fixture
def version() -> str:
    assert PINNED is not None
    return PINNED.group(1)


def test_helm_on_path_with_the_pinned_version_is_used(tmp_path: Path, version: str) -> None:
    on_path = fake_helm(tmp_path / "bin", version)
    assert helm_sh("--check", cache=tmp_path / "cache", path_dirs=[tmp_path / "bin"]).returncode == 0
    assert helm_sh("--path", cache=tmp_path / "cache", path_dirs=[tmp_path / "bin"]).stdout.strip() == str(on_path)


def test_helm_on_path_with_another_version_is_not(tmp_path: Path, version: str) -> None:
    fake_helm(tmp_path / "bin", "v3.19.0")
    assert helm_sh("--check", cache=tmp_path / "cache", path_dirs=[tmp_path / "bin"]).returncode == 1
    found = helm_sh("--path", cache=tmp_path / "cache", path_dirs=[tmp_path / "bin"]).stdout.strip()
    assert found == str(tmp_path / "cache" / "helm" / version / "helm")


def test_the_cached_helm_comes_first(tmp_path: Path, version: str) -> None:
    cached = fake_helm(tmp_path / "cache" / "helm" / version, version)
    fake_helm(tmp_path / "bin", version)
    assert helm_sh("--path", cache=tmp_path / "cache", path_dirs=[tmp_path / "bin"]).stdout.strip() == str(cached)
