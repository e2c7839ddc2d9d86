"""Operator faults against a real control plane: the API server killed mid-reconcile, writes answered with 409
Conflict or a timeout, 100 InferenceModels at once and the idle traffic after them, Pod Security "restricted"
and Secret data kept out of the operator's log. Requests are counted from the API server's audit log."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from devtools.cluster import Kubectl, LocalControlPlane, eventually
from devtools.models import load_example, small_model

from e2e.faults import (
    AdmissionFaults,
    AuditLog,
    count_by_verb,
    count_by_verb_and_resource,
    secret_values,
)
from e2e.harness import (
    OperatorProcess,
    apply_and_interrupt,
    condition,
    running_operator,
    settled_canary_children,
    wait_model_ready,
)

MODELS = 100
READY_BOUND_S = 240  # measured 67 s on 2 shared cores (other engineers' tests running)
IDLE_WINDOW_S = 60
RESYNC_S = 60  # the operator's documented default (--resync-seconds)
# A resync reconcile of an unchanged model: LIST Deployments, Services, NetworkPolicies, Pods (4; the GRPCRoute
# list too where the Gateway API is served), the claim at most every 30 s, the model from its watch, no applies.
REQUESTS_PER_RECONCILE = 7


def _alive(operator: OperatorProcess) -> None:
    assert operator.process is not None
    assert operator.process.poll() is None, "the operator process exited"
    assert operator.starts == 1, "the operator was restarted"


def test_api_server_killed_mid_reconcile_operator_recovers_and_converges(
    kube: Kubectl, plane: LocalControlPlane, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    # Kill kube-apiserver the moment the first Deployment appears: the reconcile (one more Deployment, three
    # Services, the status) is under way.
    _, argv = apply_and_interrupt(
        kube, namespace, load_example("canary", namespace), lambda: plane.kill_component("kube-apiserver")
    )
    killed = time.monotonic()
    time.sleep(3)  # down long enough for every watch and request of the operator to fail
    plane.start_component("kube-apiserver", argv)
    eventually(
        lambda: kube.attempt("get", "--raw", "/readyz").returncode == 0,
        timeout=60,
        interval=0.2,
        what="kube-apiserver to be ready again",
    )
    back = time.monotonic()

    wait_model_ready(kube, namespace, "fraud-scorer")
    converged = time.monotonic()
    print(f"API server down {back - killed:.1f}s; the model Ready {converged - back:.1f}s after it was back")

    children = settled_canary_children(kube, namespace)
    assert all(d["metadata"]["generation"] == 1 for d in children["deployments"])
    _alive(operator)


def test_conflicts_and_timeouts_are_retried_with_backoff_not_a_tight_loop(
    kube: Kubectl, plane: LocalControlPlane, namespace: str, claims: list[str], operator: OperatorProcess
) -> None:
    audit = AuditLog(plane.audit_log)
    phase_s = 20.0
    with AdmissionFaults(kube, namespace, mode="conflict") as faults:
        since = audit.mark()
        kube.apply(load_example("cpu", namespace))
        time.sleep(phase_s)
        faults.mode = "timeout"
        time.sleep(phase_s)
        faults.mode = "allow"
        wait_model_ready(kube, namespace, "sample-cnn-cpu")
    conflicts, timeouts = faults.operator_calls("conflict"), faults.operator_calls("timeout")
    print(f"operator writes answered 409: {len(conflicts)}, timed out: {len(timeouts)} ({phase_s:.0f}s each)")
    # The API server really answered the operator's apply with 409, and with an error for the timeout.
    applies = [
        r
        for r in audit.requests(since)
        if r.from_operator and r.verb == "patch" and r.resource == "deployments" and r.name == "sample-cnn-cpu-v1"
    ]
    codes = sorted({r.code for r in applies})
    print(f"the API server's answers to the operator's applies of the Deployment: {codes}")
    assert 409 in codes, codes
    assert any(code >= 500 for code in codes), codes
    assert {200, 201} & set(codes), codes
    for calls in (conflicts, timeouts):
        assert calls, "the operator never tried during the fault"
        # Retried with backoff: the handler's 10 s delay plus the 10 s resync here, never a tight loop.
        assert len(calls) <= phase_s / 2, [round(c.at - calls[0].at, 1) for c in calls]
    _alive(operator)


@pytest.fixture
def idle_operator(kube: Kubectl, namespace: str, simulated_nodes: None, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator with the documented default resync period, so idle traffic is what users get."""
    with running_operator(kube, namespace, tmp_path / "operator.log", ("--resync-seconds", str(RESYNC_S))) as process:
        yield process


# The ready bound, the idle window and a resync, plus the control plane's start when this test runs first: more
# than the global 300 s on a loaded 2-core machine.
@pytest.mark.timeout(READY_BOUND_S + IDLE_WINDOW_S + RESYNC_S + 300)
def test_hundred_models_become_ready_then_an_idle_operator_only_watches(
    kube: Kubectl,
    plane: LocalControlPlane,
    namespace: str,
    claims: list[str],
    idle_operator: OperatorProcess,
) -> None:
    audit = AuditLog(plane.audit_log)
    started = time.monotonic()
    kube.apply([small_model(namespace, f"m{i:03d}") for i in range(MODELS)])

    def all_ready() -> int | None:
        models = kube.items("inferencemodels", namespace)
        ready = sum(1 for m in models if _is_ready(m))
        return ready if ready == MODELS else None

    eventually(all_ready, timeout=READY_BOUND_S, interval=2, what=f"all {MODELS} models Ready")
    took = time.monotonic() - started
    pods = kube.items("pods", namespace)
    print(f"{MODELS} models Ready in {took:.1f}s; {len(pods)} pods")
    # Pod Security "restricted" is enforced in this namespace, and admitted every runtime pod.
    labels = kube.get("namespace", namespace)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert len(pods) == MODELS
    assert all(p["status"]["phase"] == "Running" for p in pods)

    # Settle: the last pod events schedule reconciles 1 s later; wait for 5 s without an operator request.
    for _ in range(12):
        mark = audit.mark()
        time.sleep(5)
        if not [r for r in audit.requests(mark) if r.from_operator and r.verb != "watch"]:
            break
    since = audit.mark()
    time.sleep(IDLE_WINDOW_S)
    window = [r for r in audit.requests(since) if r.from_operator]
    by_verb = count_by_verb(window)
    by_resource = count_by_verb_and_resource(window)
    print(f"idle {IDLE_WINDOW_S}s, operator requests by verb: {by_verb}")
    print(f"by verb and resource: {by_resource}")

    # Idle, the only requests besides watches are the resync's (every RESYNC_S, documented): per model its
    # reconcile's reads (claim, CRDs, children) and nothing else: the children are unchanged since the operator's
    # own applies, so none is applied again, and the status is unchanged. A 60 s window holds one pass, two at most.
    non_watch = [r for r in window if r.verb != "watch"]
    passes = by_resource.get(("list", "services"), 0) / MODELS  # each reconcile lists the model's Services once
    print(f"resync passes in the window: {passes:.2f}; requests per model per pass: {len(non_watch) / MODELS:.1f}")
    assert passes <= IDLE_WINDOW_S // RESYNC_S + 1
    writes = {key for key in by_resource if key[0] not in ("get", "list", "watch")}
    assert not writes, writes
    assert len(non_watch) <= max(passes, 1) * MODELS * REQUESTS_PER_RECONCILE, by_resource
    # Each model's objects are touched at most once per pass: no retry loop, no reconcile storm.
    for (verb, resource), n in by_resource.items():
        if verb != "watch":
            assert n <= max(passes, 1) * MODELS * 2, (verb, resource, n)
    # Watches stay open (server timeout 300 s): none is re-established in the window.
    assert by_verb.get("watch", 0) <= 5, by_verb
    _alive(idle_operator)


def _is_ready(model: dict[str, Any]) -> bool:
    try:
        return bool(condition(model, "Ready")["status"] == "True")
    except KeyError:
        return False


def test_restricted_pod_security_is_enforced_and_no_secret_data_reaches_the_operator_log(
    kube: Kubectl, namespace: str, claims: list[str], simulated_nodes: None, tmp_path: Path
) -> None:
    # The namespace really enforces "restricted": a privileged pod is refused, the operator's pods are admitted.
    refused = kube.attempt(
        "run", "privileged", "-n", namespace, "--image=busybox", "--dry-run=server", "--privileged", "--", "true"
    )
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted' in refused.stderr, refused.stderr
    token = f"e2e-bearer-{time.time_ns()}"  # a Secret the operator has no business printing
    kube.run("create", "secret", "generic", "skiff-token", "-n", namespace, f"--from-literal=token={token}")
    # DEBUG: the most the operator ever logs, client libraries included.
    operator = OperatorProcess(kube, namespace, tmp_path / "operator.log", ("--log-level", "DEBUG"))
    operator.start()
    try:
        model = load_example("tls", namespace)  # spec.tls SelfSigned: the operator writes the key Secrets
        name = model["metadata"]["name"]
        kube.apply(model)
        wait_model_ready(kube, namespace, name)
        (pod,) = kube.items("pods", namespace, f"skiff.dev/model={name}")
        assert pod["status"]["phase"] == "Running"
        time.sleep(2)  # let a child event's reconcile (which reads the Secrets) run and log
    finally:
        operator.stop()
    log = operator.log().encode()
    values = dict(secret_values(kube, namespace))
    assert {f"{name}-tls/tls.key", f"{name}-tls-ca/ca.key", "skiff-token/token"} <= set(values), sorted(values)
    leaked = []
    for name, value in values.items():
        pieces = [value, base64.b64encode(value)]
        # PEM: any line of the base64 body (a logged, re-wrapped or truncated key still shows whole lines).
        pieces += [line for line in value.splitlines() if len(line) >= 32 and not line.startswith(b"-----")]
        if any(piece in log for piece in pieces):
            leaked.append(name)
    assert not leaked, f"Secret data in the operator log: {leaked}"
