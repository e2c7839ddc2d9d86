"""Level-based reconcile against a real control plane: drift is undone, the garbage collector removes the
children of a deleted model, and an operator killed mid-reconcile converges on restart with no duplicates."""

from __future__ import annotations

from typing import Any

from devtools.cluster import Kubectl, eventually
from devtools.models import load_example

from e2e.harness import (
    CHILD_KINDS,
    OperatorProcess,
    apply_and_interrupt,
    model_children,
    settled_canary_children,
    wait_model_ready,
)


def test_deleted_deployment_is_recreated(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    kube.apply(load_example("cpu", namespace))
    wait_model_ready(kube, namespace, "sample-cnn-cpu")
    old_uid = kube.get("deployment", "sample-cnn-cpu-v1", "-n", namespace)["metadata"]["uid"]

    kube.run("delete", "deployment", "sample-cnn-cpu-v1", "-n", namespace, "--wait=true")

    def recreated() -> dict[str, Any] | None:
        found = kube.get_or_none("deployment", "sample-cnn-cpu-v1", namespace)
        return found if found and found["metadata"]["uid"] != old_uid else None

    restored = eventually(recreated, timeout=60, what="the operator to recreate the Deployment")
    assert restored["spec"]["replicas"] == 2
    wait_model_ready(kube, namespace, "sample-cnn-cpu")


def test_edited_replicas_are_restored(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    kube.apply(load_example("cpu", namespace))
    wait_model_ready(kube, namespace, "sample-cnn-cpu")

    kube.run("scale", "deployment", "sample-cnn-cpu-v1", "-n", namespace, "--replicas=5")

    eventually(
        lambda: kube.get("deployment", "sample-cnn-cpu-v1", "-n", namespace)["spec"]["replicas"] == 2,
        timeout=60,
        what="replicas to return to the spec's 2",
    )
    eventually(
        lambda: len(kube.items("pods", namespace, "skiff.dev/model=sample-cnn-cpu")) == 2,
        timeout=60,
        what="the extra pods to go",
    )
    wait_model_ready(kube, namespace, "sample-cnn-cpu")


def test_deleting_the_model_removes_every_child_through_the_garbage_collector(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    kube.apply(load_example("canary", namespace))
    wait_model_ready(kube, namespace, "fraud-scorer")
    before = model_children(kube, namespace, "fraud-scorer")
    assert [len(before[kind]) for kind in CHILD_KINDS] == [2, 2, 3, 4]
    # Stop the operator first: what deletes the children is the garbage collector, not a handler.
    operator.stop()

    kube.run("delete", "inferencemodel", "fraud-scorer", "-n", namespace, "--wait=true", timeout=120)

    eventually(
        lambda: not any(model_children(kube, namespace, "fraud-scorer").values()),
        timeout=90,
        what="the garbage collector to delete every child",
    )


def test_operator_killed_mid_reconcile_converges_without_duplicates(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    # Watch for the first Deployment and SIGKILL the operator the moment it appears: the rest of the reconcile
    # (more Deployments and Services, the status) has not happened yet.
    first, _ = apply_and_interrupt(kube, namespace, load_example("canary", namespace), operator.kill)
    at_kill = model_children(kube, namespace, "fraud-scorer")
    print(f"killed after {first}; children then: { {k: len(v) for k, v in at_kill.items()} }")
    model = kube.get("inferencemodel", "fraud-scorer", "-n", namespace)
    assert "conditions" not in model.get("status", {}), "the operator finished before it was killed"

    operator.start()
    wait_model_ready(kube, namespace, "fraud-scorer")

    children = settled_canary_children(kube, namespace)
    for deployment in children["deployments"]:
        # Re-applying the same manifests after the restart is a no-op: no new generation, no rollout.
        assert deployment["metadata"]["generation"] == 1, deployment["metadata"]["name"]
        managers = {m["manager"] for m in deployment["metadata"]["managedFields"] if m["operation"] == "Apply"}
        assert managers == {"skiff-operator"}
    for kind in ("deployments", "services"):
        for child in children[kind]:
            assert len(child["metadata"]["ownerReferences"]) == 1
