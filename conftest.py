"""Keeps every test away from the user's cluster: $KUBECONFIG points nowhere for the whole test session."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # A kubectl, helm or client a test starts without the kubeconfig of its own cluster then fails at once instead
    # of reaching the cluster the user's $KUBECONFIG names; tests reach a cluster of the user's only through
    # $SKIFF_E2E_KUBECONFIG (devtools/cluster.py).
    os.environ["KUBECONFIG"] = os.devnull
