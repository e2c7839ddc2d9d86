"""ownership: an object's controller read from its ownerReferences, occupants, and the NameConflict message."""

from __future__ import annotations

from skiff_operator.observed import Holder, Occupant, StoredSecret, controller_of, occupant
from skiff_operator.ownership import name_conflict_message, refused_secret_message

UID = "uid-1"


def owned(uid: str, controller: bool = True) -> dict[str, object]:
    ref = {
        "apiVersion": "skiff.dev/v1alpha1",
        "kind": "InferenceModel",
        "name": "m",
        "uid": uid,
        "controller": controller,
    }
    return {"metadata": {"name": "x", "ownerReferences": [ref]}}


def test_controller_of_reads_only_the_controller_reference() -> None:
    assert controller_of(owned(UID)) == Holder("InferenceModel", "m", UID)
    assert controller_of(owned(UID, controller=False)) == Holder()
    assert controller_of({"metadata": {"name": "x"}}) == Holder()


def test_an_occupant_is_an_object_another_or_no_controller_holds() -> None:
    assert occupant("Service", owned(UID), UID) is None
    assert occupant("Service", owned("other"), UID) == Occupant("Service", "x", Holder("InferenceModel", "m", "other"))
    assert occupant("Service", owned(UID, controller=False), UID) == Occupant("Service", "x", Holder())


def test_the_message_names_each_object_and_its_controller() -> None:
    taken = [Occupant("Service", "a", Holder()), Occupant("Deployment", "a-b", Holder("InferenceModel", "a", "u"))]
    message = name_conflict_message(taken)
    assert message.startswith("Service/a exists and it has no controller")
    assert "; Deployment/a-b exists and it is controlled by InferenceModel a." in message
    assert "rename the model" in message


def test_service_account_token_secrets_are_refused_others_are_not() -> None:
    token = StoredSecret({"token": b"t"}, type="kubernetes.io/service-account-token")
    assert "never mounts service-account tokens" in (refused_secret_message(token, "spec.x") or "")
    assert refused_secret_message(StoredSecret({}, type="kubernetes.io/tls"), "spec.x") is None
