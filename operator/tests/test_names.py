"""names: derived object names stay within 63 characters, hash-truncated when they would not."""

from __future__ import annotations

import re

import pytest

from skiff_operator import names

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize(
    ("model", "version", "expected"),
    [
        ("resnet", "v1", "resnet-v1"),
        ("a" * 42, "b" * 20, "a" * 42 + "-" + "b" * 20),  # the CRD's limits: fits exactly, no hash
    ],
)
def test_short_names_are_joined_unchanged(model: str, version: str, expected: str) -> None:
    assert names.deployment_name(model, version) == expected
    assert names.version_service_name(model, version) == expected


@pytest.mark.parametrize(
    ("model", "version"),
    [
        ("m" * 63, "v1"),  # cut names use all 63 characters unless a "-" would end the head
        ("m" * 60, "canary"),
        ("model-with-dashes-" * 4, "v" * 20),
        ("m" * 53 + "-" * 1, "x" * 20),
    ],
)
def test_long_names_are_hash_truncated_to_63(model: str, version: str) -> None:
    name = names.deployment_name(model, version)
    assert len(name) <= names.MAX_NAME_LENGTH
    assert DNS1035.match(name), name
    assert re.search(r"-[0-9a-f]{8}$", name)
    assert names.deployment_name(model, version) == name  # deterministic


def test_truncated_names_differ_when_only_the_tail_differs() -> None:
    model = "m" * 60
    assert names.deployment_name(model, "v1") != names.deployment_name(model, "v2")


def test_model_service_is_named_after_the_model() -> None:
    assert names.model_service_name("resnet") == "resnet"


def test_labels_carry_model_and_version_within_63() -> None:
    labels = names.object_labels("m" * 70, "v1")
    assert labels[names.MODEL_LABEL] == names.fit_name("m" * 70)
    assert labels[names.VERSION_LABEL] == "v1"
    assert labels["app.kubernetes.io/managed-by"] == "skiff-operator"
    assert all(len(value) <= 63 for value in labels.values())


def test_selector_without_version_selects_the_whole_model() -> None:
    assert names.selector_labels("resnet") == {names.MODEL_LABEL: "resnet"}


def test_cut_name_uses_all_63_characters() -> None:
    assert len(names.fit_name("m" * 63, "v1")) == 63
