"""What the tests on the real node share: a namespace whose models live in a directory the node's pods mount (a
hostPath volume behind the claim "models"), and InferenceModels placed on the node with the imported image."""

from __future__ import annotations

from pathlib import Path

from devtools.cluster import Kubectl, eventually
from devtools.install import create_model_claims, model_volume_name
from devtools.node.real_node import RealNode

from e2e.harness import RESTRICTED

CLAIM = "models"


def create_real_namespace(kube: Kubectl, real_node: RealNode, namespace: str) -> Path:
    """The namespace (Pod Security "restricted") and its claim "models", Bound to a fresh directory on the node;
    returns that directory, where the test exports its models. delete_real_namespace removes both."""
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {RESTRICTED: "restricted", "skiff.dev/e2e": "true"}},
        }
    )
    eventually(lambda: kube.get_or_none("serviceaccount", "default", namespace), timeout=60, what="serviceaccount")
    models = real_node.shared_dir(namespace)
    create_model_claims(kube, namespace, [CLAIM], host_dirs={CLAIM: models})
    return models


def delete_real_namespace(kube: Kubectl, namespace: str) -> None:
    kube.run("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")
    kube.run("delete", "persistentvolume", model_volume_name(namespace, CLAIM), "--wait=false", "--ignore-not-found")
