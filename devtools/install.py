"""What a cluster needs before an InferenceModel: the CRD installed, the examples' claims Bound, the operator binary."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from devtools.cluster import REPO, Kubectl, eventually

CRD_PATH = REPO / "crds" / "skiff.dev_inferencemodels.yaml"
OPERATOR = str(Path(sys.executable).parent / "skiff-operator")


def create_model_claims(
    kube: Kubectl, namespace: str, claims: list[str], host_dirs: Mapping[str, Path] | None = None
) -> None:
    """A pre-bound PersistentVolume + PersistentVolumeClaim per claim, Bound, so pods that mount them schedule.
    A claim in `host_dirs` is that directory of the real node (devtools/node/); the others are never mounted.

    The volumes go first and the claims only once the volumes are Available: a claim that names a volume the
    PV controller has not seen yet waits for its periodic resync (15 s) instead of binding at once."""
    volumes = {claim: model_volume_name(namespace, claim) for claim in claims}
    host_dirs = host_dirs or {}
    kube.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume, "labels": {"skiff.dev/e2e-namespace": namespace}},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": (
                        {"path": str(host_dirs[claim]), "type": "Directory"}
                        if claim in host_dirs
                        else {"path": f"/var/lib/skiff-e2e/{volume}"}  # never mounted: kwok runs no kubelet
                    ),
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            }
            for claim, volume in volumes.items()
        ]
    )
    for volume in volumes.values():
        kube.run("wait", "--for=jsonpath={.status.phase}=Available", f"pv/{volume}", "--timeout=60s")
    kube.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "volumeName": volume,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
            for claim, volume in volumes.items()
        ]
    )
    for claim in claims:
        kube.run("wait", "--for=jsonpath={.status.phase}=Bound", f"pvc/{claim}", "-n", namespace, "--timeout=60s")


def model_volume_name(namespace: str, claim: str) -> str:
    return f"{namespace}-{claim}"[:63]


def install_crd(kube: Kubectl, field_manager: str = "skiff-e2e") -> None:
    """Applies crds/ and waits until it is Established and published in the OpenAPI document, which the API
    server does a few seconds later (until then `kubectl explain` cannot find it)."""
    kube.run("apply", "--server-side", f"--field-manager={field_manager}", "-f", str(CRD_PATH))
    # Right after an apply the condition list can still be empty, and `kubectl wait` then fails at once.
    eventually(
        lambda: (
            kube.attempt(
                "wait", "--for=condition=Established", "crd/inferencemodels.skiff.dev", "--timeout=10s"
            ).returncode
            == 0
        ),
        timeout=60,
        what="the CRD to be Established",
    )
    eventually(
        lambda: kube.attempt("explain", "inferencemodel.spec").returncode == 0,
        timeout=60,
        what="the CRD in the API server's OpenAPI document",
    )
