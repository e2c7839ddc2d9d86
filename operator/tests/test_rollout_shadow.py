"""The rollout's shadow gate on a fake clock: the candidate stays at 0% while the stable pods' copies are compared,
a low agreement rolls it back with 0% ever given, a high one starts the first weighted step; the gate's state travels
through status.rollout (and so across an operator restart); the stable pods read the gate's settings from the
ConfigMap while it holds, and {} otherwise."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
from typing import Any

from cryptography import x509

from skiff_operator.conditions import Reason
from skiff_operator.plan import next_split
from skiff_operator.prometheus import Counts
from skiff_operator.rollout import Observation, Verdict, decide_rollout
from skiff_operator.spec import parse_inference_model
from skiff_operator.spec.shadow import CompareMode, Comparison, Shadow
from tests.fakes import GATEWAYS, FakeCluster, TLSFakeCluster, canary_body, condition, deployment
from tests.test_reconcile_rollout import ROLLOUT as RECONCILED_ROLLOUT
from tests.test_reconcile_rollout import Body, ok, step, weights
from tests.test_rollout import ROLLOUT, T0, counts, read_back, written

SHADOW = Shadow(ratio=0.5, min_samples=100, min_agreement=0.99, outputs=(("label", Comparison(CompareMode.EXACT)),))
SHADOWED = dataclasses.replace(ROLLOUT, shadow=SHADOW)


def stable(agreed: int, disagreed: int = 0, dropped: int = 0, failed: int = 0, candidate: str = "v2") -> Counts:
    """The stable side's counters with its shadow counters for `candidate`."""
    numbers = {"agreed": agreed, "disagreed": disagreed, "dropped": dropped, "failed": failed}
    return dataclasses.replace(counts(500), shadow={f"{candidate}/{k}": v for k, v in numbers.items()})


def run(ticks: list[tuple[float, Counts | None]], stored: Any = None) -> list[tuple[Any, ...]]:
    """(verdict, reason, weight, ROLLOUT column, [event reasons]) after each tick, through status and back."""
    results = []
    for seconds, stable_counts in ticks:
        decision = decide_rollout(
            SHADOWED,
            read_back(stored),
            Observation(counts(0), stable_counts, "" if stable_counts else "connection refused"),
            revision="r1",
            stable=("v1",),
            now=T0 + datetime.timedelta(seconds=seconds),
        )
        stored = written(decision.state, len(SHADOWED.steps))
        state = decision.state
        summary = stored["summary"]
        results.append((state.verdict, state.reason, state.weight, summary, [e.reason for e in decision.events]))
    return results


def test_the_candidate_stays_at_0_percent_until_enough_answers_agree_then_takes_its_first_step() -> None:
    results = run([(0, stable(40, 1)), (5, stable(90, 1)), (10, stable(139, 1)), (15, stable(240, 1))])
    assert results[0] == (Verdict.PROGRESSING, Reason.SHADOWING, 0, "shadow 0.00% of 0 Progressing",
                          ["RolloutShadowing"])  # fmt: skip
    assert results[1][:4] == (Verdict.PROGRESSING, Reason.SHADOWING, 0, "shadow 100.00% of 50 Progressing")
    # 99 agreed of 99 compared since the gate started: still below minSamples
    assert results[2][:3] == (Verdict.PROGRESSING, Reason.SHADOWING, 0)
    assert results[3] == (Verdict.PROGRESSING, Reason.SHADOW_PASSED, 10, "1/2 Progressing", ["RolloutShadowPassed"])


def test_a_candidate_whose_answers_differ_is_rolled_back_having_never_had_any_weight() -> None:
    results = run(
        [(0, stable(0)), (5, stable(10, 50)), (10, stable(10, 95, dropped=7, failed=2)), (15, stable(10, 99))]
    )
    weights = [r[2] for r in results]
    assert weights == [0, 0, 0, 0]
    assert results[2] == (Verdict.ROLLED_BACK, Reason.SHADOW_DISAGREED, 0, "shadow 9.52% of 105 RolledBack",
                          ["RolloutShadowDisagreed"])  # fmt: skip
    assert results[3][:3] == (Verdict.ROLLED_BACK, Reason.SHADOW_DISAGREED, 0)  # final for this revision


def test_the_gates_message_has_the_numbers_and_the_status_has_the_counts() -> None:
    decision = None
    stored = None
    for seconds, stable_counts in [(0, stable(5, 1)), (5, stable(15, 101, dropped=3, failed=1))]:
        decision = decide_rollout(SHADOWED, read_back(stored), Observation(counts(0), stable_counts), revision="r1",
                                  stable=("v1",), now=T0 + datetime.timedelta(seconds=seconds))  # fmt: skip
        stored = written(decision.state, 2)
    assert decision is not None
    assert stored["shadow"] == {
        "samples": 110, "agreed": 10, "agreement": 0.0909, "dropped": 3, "failed": 1, "verdict": "Failed",
        "message": "shadow agreement 0.0909 < minAgreement 0.99; v2 rolled back with 0% ever given: 10 of 110 "
        "compared answers agree (9.09%); 3 copies dropped (queue full), 1 failed",
    }  # fmt: skip
    assert stored["shadowBaseline"] == {"agreed": 5, "disagreed": 1, "dropped": 0, "failed": 0}
    assert decision.state.message == stored["shadow"]["message"]


def test_unreadable_stable_metrics_and_a_counter_reset_wait_at_0_percent() -> None:
    results = run([(0, stable(50)), (5, None), (10, stable(3)), (15, stable(60, 43))])
    assert [r[:3] for r in results[1:3]] == [
        (Verdict.WAITING, Reason.METRICS_UNAVAILABLE, 0),
        (Verdict.WAITING, Reason.COUNTERS_RESET, 0),  # a stable pod restarted: the gate counts from 3 again
    ]
    assert results[3][:3] == (Verdict.ROLLED_BACK, Reason.SHADOW_DISAGREED, 0)  # 57 of 100 since the reset


def test_paused_holds_the_gate_at_0_percent() -> None:
    paused = dataclasses.replace(SHADOWED, paused=True)
    decision = decide_rollout(paused, None, Observation(counts(0), stable(500)), revision="r1", stable=("v1",), now=T0)
    assert (decision.state.verdict, decision.state.weight, decision.state.shadowing) == (Verdict.PAUSED, 0, True)


def test_another_candidates_copies_are_not_counted() -> None:
    results = run([(0, stable(0)), (5, stable(500, candidate="v3"))])
    assert results[1][:4] == (Verdict.PROGRESSING, Reason.SHADOWING, 0, "shadow 0.00% of 0 Progressing")


SHADOW_ROLLOUT = {
    **RECONCILED_ROLLOUT,
    "shadow": {"ratio": 0.5, "minSamples": 100, "outputs": [{"name": "label", "mode": "Exact"}]},
}


async def test_the_stable_pods_read_the_gates_settings_while_it_holds_and_the_route_gives_the_candidate_nothing(
    make_body: Body,
) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(1))
    body = canary_body(make_body, 100, 0, routing={"gateways": GATEWAYS}, rollout=SHADOW_ROLLOUT)
    first = await step(body, cluster, 0, stable(0), ok(0))
    assert weights(cluster) == {"fraud-v1": 100, "fraud-v2": 0}
    content = json.loads(cluster.objects[("ConfigMap", "fraud-shadow")]["data"]["shadow.json"])
    assert content == {
        "candidate": "v2", "target": "fraud-v2.ml.svc:8001", "sources": ["v1"], "ratio": 0.5, "queueSize": 64,
        "timeoutSeconds": 10.0, "compare": {"mode": "Tolerance", "atol": 1e-05, "rtol": 0.0001, "topK": 1},
        "outputs": [{"name": "label", "mode": "Exact", "atol": 1e-05, "rtol": 0.0001, "topK": 1}],
    }  # fmt: skip
    for version in ("v1", "v2"):  # every version mounts it from the start: shadowing never restarts a pod
        pod = cluster.objects[("Deployment", f"fraud-{version}")]["spec"]["template"]["spec"]
        assert {"name": "shadow", "configMap": {"name": "fraud-shadow", "optional": True}} in pod["volumes"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["SKIFF_SHADOW_FILE"] == "/etc/skiff/shadow/shadow.json"
    # Once the API server gave the candidate's Service its virtual IP, the copies go there: no cluster DNS lookup.
    cluster.objects[("Service", "fraud-v2")]["spec"]["clusterIP"] = "10.96.0.7"
    await step(body, cluster, 1, stable(0), ok(0))
    content = json.loads(cluster.objects[("ConfigMap", "fraud-shadow")]["data"]["shadow.json"])
    assert content["target"] == "10.96.0.7:8001"
    template = copy.deepcopy(cluster.objects[("Deployment", "fraud-v1")]["spec"]["template"])
    assert body["status"]["rollout"]["summary"] == "shadow 0.00% of 0 Progressing"
    assert ("Normal", "RolloutShadowing") in [(e.type, e.reason) for e in first.events]

    passed = await step(body, cluster, 5, stable(100), ok(0))
    assert weights(cluster) == {"fraud-v1": 90, "fraud-v2": 10}
    assert cluster.objects[("ConfigMap", "fraud-shadow")]["data"]["shadow.json"] == "{}"
    assert cluster.objects[("Deployment", "fraud-v1")]["spec"]["template"] == template  # not rolled
    assert body["status"]["rollout"]["shadow"]["verdict"] == "Passed"
    assert ("Normal", "RolloutShadowPassed") in [(e.type, e.reason) for e in passed.events]


async def test_with_tls_the_copies_are_verified_for_the_candidates_service_name_by_the_mounted_ca(
    make_body: Body,
) -> None:
    cluster = TLSFakeCluster()
    cluster.gateway_api = True
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(1))
    body = canary_body(make_body, 100, 0, routing={"gateways": GATEWAYS}, rollout=SHADOW_ROLLOUT,
                       tls={"mode": "SelfSigned"})  # fmt: skip
    await step(body, cluster, 0, stable(0), ok(0))
    content = json.loads(cluster.objects[("ConfigMap", "fraud-shadow")]["data"]["shadow.json"])
    assert content["tls"] == {"serverName": "fraud-v2.ml.svc", "caFile": "/etc/skiff/tls/ca.crt"}
    pod = cluster.objects[("Deployment", "fraud-v1")]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["tls"] == "/etc/skiff/tls"  # the stable pod has the CA file the copies trust
    assert "ca.crt" in cluster.secret("fraud-tls")
    sans = cluster.certificate("fraud-tls").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "fraud-v2.ml.svc" in sans.get_values_for_type(x509.DNSName)  # the name the copies check


async def test_a_disagreeing_candidate_is_rolled_back_with_a_condition_and_a_warning(make_body: Body) -> None:
    cluster = FakeCluster()
    cluster.gateway_api = True
    cluster.deployment_states.update(v1=deployment(3), v2=deployment(1))
    body = canary_body(make_body, 100, 0, routing={"gateways": GATEWAYS}, rollout=SHADOW_ROLLOUT)
    await step(body, cluster, 0, stable(0), ok(0))
    failed = await step(body, cluster, 5, stable(3, 97), ok(0))
    assert weights(cluster) == {"fraud-v1": 100, "fraud-v2": 0}
    assert condition(body["status"], "RolledBack") == ("True", "ShadowDisagreed")
    warning = [e.message for e in failed.events if e.reason == "RolloutShadowDisagreed"]
    assert warning == [
        "shadow agreement 0.0300 < minAgreement 0.99; v2 rolled back with 0% ever given: 3 of 100 compared answers "
        "agree (3.00%); 0 copies dropped (queue full), 0 failed"
    ]
    assert cluster.objects[("ConfigMap", "fraud-shadow")]["data"]["shadow.json"] == "{}"
    assert body["status"]["rollout"]["summary"] == "shadow 3.00% of 100 RolledBack"


def test_while_the_gate_holds_autoscaling_readies_the_first_steps_split(make_body: Body) -> None:
    body = canary_body(make_body, 100, 0, routing={"gateways": GATEWAYS}, rollout=SHADOW_ROLLOUT)
    model = parse_inference_model(body)
    assert model.spec.rollout is not None
    holding = decide_rollout(model.spec.rollout, None, Observation(counts(0), stable(0)), revision="r1",
                             stable=("v1",), now=T0)  # fmt: skip
    assert holding.state.shadowing
    assert next_split(model, holding) == {"v1": 90, "v2": 10}  # step 1's, not step 2's
