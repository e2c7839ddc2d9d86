"""The user's cluster is used only when named in $SKIFF_E2E_KUBECONFIG; an ambient $KUBECONFIG is ignored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from devtools.cluster import REPO, Kubectl, user_kubeconfig

USER_CONFIG = """apiVersion: v1
kind: Config
clusters: [{name: prod, cluster: {server: "https://prod.example.com:6443"}}]
users: [{name: admin, user: {token: secret}}]
contexts: [{name: prod, context: {cluster: prod, user: admin}}]
current-context: prod
"""


def test_an_ambient_kubeconfig_is_not_a_cluster_for_the_tests(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(USER_CONFIG)
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.delenv("SKIFF_E2E_KUBECONFIG", raising=False)
    assert user_kubeconfig() is None
    monkeypatch.setenv("SKIFF_E2E_KUBECONFIG", str(config))
    assert user_kubeconfig() == config


def test_tools_a_test_starts_do_not_see_the_ambient_kubeconfig() -> None:
    """Set by the root conftest.py: kubectl without an explicit kubeconfig has no cluster at all."""
    assert os.environ["KUBECONFIG"] == os.devnull
    view = subprocess.run([Kubectl(Path(os.devnull)).binary, "config", "view", "--minify"], capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert "prod.example.com" not in view.stdout + view.stderr


def test_a_pytest_run_with_kubeconfig_set_reaches_no_cluster_of_the_user(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(USER_CONFIG)
    env = {k: v for k, v in os.environ.items() if k != "SKIFF_E2E_KUBECONFIG"} | {"KUBECONFIG": str(config)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_kubeconfig.py::test_tools_a_test_starts_do_not_see_the_ambient_kubeconfig"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
