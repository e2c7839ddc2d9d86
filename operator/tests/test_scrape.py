"""scrape: which pods the rollout scrape reads (an owner chain to the version's Deployment uid, never a name prefix),
and the closed set of words a failed read says."""

from __future__ import annotations

from typing import Any

import pytest

from skiff_operator.scrape import (
    MAX_PAGE_BYTES,
    Refusal,
    ScrapeFailure,
    deployment_uids,
    metrics_targets,
)

MODEL_UID = "model-uid"
WANTED = {"v1": "v1", "v2": "v2"}


def deployment(name: str, version: str, uid: str, owner_uid: str = MODEL_UID) -> dict[str, Any]:
    owner = {"kind": "InferenceModel", "name": "demo", "uid": owner_uid, "controller": True}
    labels = {"skiff.dev/model": "demo", "skiff.dev/version": version}
    return {"metadata": {"name": name, "uid": uid, "labels": labels, "ownerReferences": [owner]}}


def replica_set(name: str, uid: str, deployment_uid: str, *, kind: str = "Deployment") -> dict[str, Any]:
    owner = {"kind": kind, "name": name.rsplit("-", 1)[0], "uid": deployment_uid, "controller": True}
    return {"metadata": {"name": name, "uid": uid, "ownerReferences": [owner]}}


def pod(
    name: str, version: str, rs_uid: str = "rs-v1", rs_name: str = "demo-v1-5d8f7", **status: Any
) -> dict[str, Any]:
    owner = {"kind": "ReplicaSet", "name": rs_name, "uid": rs_uid, "controller": True}
    return {
        "metadata": {"name": name, "labels": {"skiff.dev/version": version}, "ownerReferences": [owner]},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "containerStatuses": [{"name": "runtime", "started": True}],
            **status,
        },
    }


REPLICA_SETS = [replica_set("demo-v1-5d8f7", "rs-v1", "dep-v1"), replica_set("demo-v2-7c9d", "rs-v2", "dep-v2")]
UIDS = {"v1": "dep-v1", "v2": "dep-v2"}


def test_a_look_alike_replica_set_with_the_right_name_prefix_and_labels_is_not_read() -> None:
    # Someone made a ReplicaSet named like the version's (demo-v1-<anything>) with the model's labels; its pods carry
    # the right labels too. Its owner is a Deployment, but not the version's (another uid), or none at all.
    look_alike = replica_set("demo-v1-x", "rs-fake", "dep-of-someone-else")
    orphan = {"metadata": {"name": "demo-v1-y", "uid": "rs-orphan"}}
    not_a_deployment = replica_set("demo-v1-z", "rs-z", "dep-v1", kind="StatefulSet")
    replica_sets = [*REPLICA_SETS, look_alike, orphan, not_a_deployment]
    pods = [
        pod("real", "v1"),
        pod("fake", "v1", rs_uid="rs-fake", rs_name="demo-v1-x"),
        pod("orphaned", "v1", rs_uid="rs-orphan", rs_name="demo-v1-y"),
        pod("wrong-kind", "v1", rs_uid="rs-z", rs_name="demo-v1-z"),
        pod("unlisted-rs", "v1", rs_uid="rs-never-listed", rs_name="demo-v1-5d8f7"),
    ]
    assert metrics_targets(pods, replica_sets, UIDS, WANTED) == [("v1", "real", "10.0.0.1")]


def test_a_pod_of_one_versions_replica_set_labelled_as_another_version_is_not_read() -> None:
    # v2's label, but v1's ReplicaSet: the chain reaches v1's Deployment, not v2's.
    assert metrics_targets([pod("mislabelled", "v2", rs_uid="rs-v1")], REPLICA_SETS, UIDS, WANTED) == []
    assert metrics_targets([pod("right", "v2", rs_uid="rs-v2")], REPLICA_SETS, UIDS, WANTED) == [
        ("v2", "right", "10.0.0.1")
    ]


def test_only_started_running_pods_of_the_wanted_versions_with_an_ip_are_read() -> None:
    deleting = pod("d", "v1")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    bare = pod("bare", "v1")
    del bare["metadata"]["ownerReferences"]
    pods = [
        pod("b", "v2", rs_uid="rs-v2", podIP="fd00::2"),
        pod("a", "v1"),
        pod("pending", "v1", phase="Pending"),
        pod("no-ip", "v1", podIP=None),
        pod("starting", "v1", containerStatuses=[{"name": "runtime", "started": False}]),
        pod("no-status-yet", "v1", containerStatuses=None),
        pod("other", "v9"),
        deleting,
        bare,
    ]
    assert metrics_targets(pods, REPLICA_SETS, UIDS, WANTED) == [("v1", "a", "10.0.0.1"), ("v2", "b", "fd00::2")]


def test_a_version_without_an_observed_deployment_has_no_targets() -> None:
    assert metrics_targets([pod("a", "v1")], REPLICA_SETS, {"v2": "dep-v2"}, WANTED) == []


def test_the_versions_deployment_uid_is_the_one_the_model_controls_under_the_versions_name() -> None:
    names = {"v1": "demo-v1", "v2": "demo-v2"}
    listed = [
        deployment("demo-v1", "v1", "dep-v1"),
        deployment("demo-v2", "v2", "dep-v2"),
        deployment("demo-v1-copy", "v1", "dep-copy"),  # the model's labels, another name
        deployment("demo-v2", "v2", "dep-foreign", owner_uid="someone-else"),  # the name, another controller
    ]
    assert deployment_uids(listed, names, MODEL_UID) == {"v1": "dep-v1", "v2": "dep-v2"}
    assert deployment_uids(listed[3:], names, MODEL_UID) == {}


@pytest.mark.parametrize(
    ("refusal", "said"),
    [
        (Refusal(ScrapeFailure.PAGE_TOO_LARGE), f"metrics page over {MAX_PAGE_BYTES} bytes"),
        (Refusal(ScrapeFailure.COMPRESSED), "compressed reply refused"),
        (Refusal(ScrapeFailure.REDIRECT), "redirect refused"),
        (Refusal(ScrapeFailure.HTTP_STATUS, 500), "HTTP 500"),
        (Refusal(ScrapeFailure.TIMED_OUT), "timed out"),
        (Refusal(ScrapeFailure.NOT_PROMETHEUS), "not Prometheus text"),
    ],
)
def test_a_failed_read_says_one_of_the_operators_own_phrases(refusal: Refusal, said: str) -> None:
    assert str(refusal) == said


def test_every_failure_has_a_phrase() -> None:
    assert all(str(Refusal(failure, 404)) for failure in ScrapeFailure)
