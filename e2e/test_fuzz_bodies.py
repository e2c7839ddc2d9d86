"""Random InferenceModel bodies (devtools.fuzz, the parser's unit-fuzz generator; seeded, the seed printed) applied
with kubectl to the real API server while the operator subprocess works: each is refused by the API server (the
CRD's schema and CEL) or reconciled with a Ready condition (InvalidSpec when the parser refuses it); a healthy model
created before stays Ready, an edit to it made mid-fuzz lands, a model created after becomes Ready, and the operator
never exits or logs a traceback. Replay a run with SKIFF_FUZZ_SEED=<seed>."""

from __future__ import annotations

import collections
import json
import os
import random
import time
from typing import Any

import pytest
from devtools.cluster import Kubectl, eventually
from devtools.fuzz import place, sample_members
from devtools.models import load_example

from e2e.harness import OperatorProcess, condition, wait_model_ready

BODIES = 60
MAX_DEPTH = 2_000  # random nesting up to past the 1,500 that once ended the operator's watch
MODEL_URI = "pvc://models/sample-cnn/v1"
SPEC_ERRORS = {"InvalidSpec", "InvalidModelUri", "UnsupportedModelUri"}


NESTED = "\u0000nested\u0000"  # where the nested text goes (json.dumps itself recurses)


def fuzz_body(namespace: str, name: str, member: tuple[str, str | None, Any], rng: random.Random) -> str:
    """A small valid model with one drawn member written into its spec, as JSON text; one in four nests the drawn
    value 1..MAX_DEPTH objects deep."""
    spec: dict[str, Any] = {"versions": [{"name": "v1", "modelUri": MODEL_URI, "replicas": 1}],
                            "resources": {"cpu": "100m", "memory": "256Mi"}}  # fmt: skip
    field, inner, value = member
    depth = rng.randint(1, MAX_DEPTH) if rng.random() < 0.25 else 0
    place(spec, (field, inner, NESTED if depth else value))
    body = {"apiVersion": "skiff.dev/v1alpha1", "kind": "InferenceModel",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}  # fmt: skip
    text = json.dumps(body)
    return text.replace(json.dumps(NESTED), '{"x":' * depth + json.dumps(value) + "}" * depth) if depth else text


def reconciled(kube: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    """The Ready condition once the operator has written status for the model's current generation."""
    model = kube.get("im", name, "-n", namespace)
    if model.get("status", {}).get("observedGeneration") != model["metadata"]["generation"]:
        return None
    try:
        return condition(model, "Ready")
    except KeyError:
        return None


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_random_bodies_are_refused_or_reconciled_and_healthy_models_keep_reconciling(
    kube: Kubectl, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    seed = int(os.environ.get("SKIFF_FUZZ_SEED", str(time.time_ns() % 2**32)))
    print(f"fuzz seed: {seed} (replay: SKIFF_FUZZ_SEED={seed})")
    rng = random.Random(seed)
    before = load_example("cpu", namespace)
    before["spec"]["resources"] = {"cpu": "100m", "memory": "256Mi"}
    kube.apply(before)
    wait_model_ready(kube, namespace, "sample-cnn-cpu")

    accepted: list[str] = []
    refused = 0
    started = time.monotonic()
    for index, member in enumerate(sample_members(BODIES, seed)):
        name = f"fuzz-{index}"
        text = fuzz_body(namespace, name, member, rng)
        # Every other body without strict field validation: unknown fields are pruned, so more bodies get stored.
        validate = "--validate=strict" if index % 2 else "--validate=false"
        result = kube.attempt("apply", validate, "-f", "-", stdin=text)
        if result.returncode == 0:
            accepted.append(name)
        else:
            refused += 1
            assert "NotFound" in kube.attempt("get", "im", name, "-n", namespace).stderr, result.stderr
        if index == BODIES // 2:  # the edit to the healthy model, mid-fuzz
            edit = {"spec": {"versions": [{"name": "v1", "modelUri": MODEL_URI, "replicas": 3}]}}
            kube.run("patch", "im", "sample-cnn-cpu", "-n", namespace, "--type=merge", "-p", json.dumps(edit))
    applied_s = time.monotonic() - started

    after = load_example("cpu", namespace)
    after["metadata"]["name"] = "after-fuzz"
    after["spec"]["resources"] = {"cpu": "100m", "memory": "256Mi"}
    kube.apply(after)
    eventually(
        lambda: kube.get("deployment", "sample-cnn-cpu-v1", "-n", namespace)["spec"]["replicas"] == 3 or None,
        timeout=90,
        what="the mid-fuzz edit to reach the Deployment",
    )
    wait_model_ready(kube, namespace, "after-fuzz")
    wait_model_ready(kube, namespace, "sample-cnn-cpu")

    reasons: collections.Counter[str] = collections.Counter()
    for name in accepted:
        ready = eventually(lambda n=name: reconciled(kube, namespace, n), timeout=90, what=f"{name} to be reconciled")
        reasons[ready["reason"]] += 1
        if ready["reason"] in SPEC_ERRORS:
            assert ready["status"] == "False"
    print(f"{BODIES} bodies in {applied_s:.1f} s: {refused} refused by the API server, {len(accepted)} accepted; "
          f"Ready reasons: {dict(reasons)}")  # fmt: skip
    assert operator.process is not None
    assert operator.process.poll() is None, operator.log()[-3000:]
    assert operator.starts == 1
    log = operator.log()
    assert "Traceback" not in log, log[-5000:]
    assert "RecursionError" not in log
