"""make_plan: what holds the children back, in which order, and the plan of a model that can run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skiff_operator.conditions import Problem, Reason
from skiff_operator.manifests import render_all
from skiff_operator.plan import Held, Observed, Plan, make_plan
from skiff_operator.routing import Mode
from skiff_operator.spec import TLSMode, parse_inference_model
from skiff_operator.tls import CASecret, ServerSecret, TLSObserved, TLSState
from tests.conftest import FIRST_PASS

Body = Callable[..., dict[str, Any]]
REFUSED = Problem(Reason.APPLY_FAILED, "persistentvolumeclaims is forbidden")


def test_a_tls_problem_holds_before_an_auth_problem(make_body: Body) -> None:
    body = make_body(tls={"mode": "Secret", "secretName": "mine"}, auth={"tokenSecretName": "tokens"})
    plan = make_plan(parse_inference_model(body), Observed(TLSObserved()), FIRST_PASS)
    assert isinstance(plan, Held)
    assert plan.problem.reason is Reason.TLS_SECRET_MISSING
    assert plan.tls is not None
    assert plan.tls.writes == ()  # the user's Secret is never written


def test_a_missing_token_secret_holds_the_children_but_tls_still_writes(make_body: Body) -> None:
    model = parse_inference_model(make_body(tls={"mode": "SelfSigned"}, auth={"tokenSecretName": "tokens"}))
    plan = make_plan(model, Observed(TLSObserved()), FIRST_PASS)
    assert isinstance(plan, Held)
    assert plan.problem.reason is Reason.AUTH_SECRET_MISSING
    assert plan.tls is not None
    assert [(type(w), w.name) for w in plan.tls.writes] == [(CASecret, "demo-tls-ca"), (ServerSecret, "demo-tls")]
    # The decision carries no manifest: render_all renders it, and a held plan renders only these.
    assert [m["metadata"]["name"] for m in render_all(plan)] == ["demo-tls-ca", "demo-tls"]


def test_a_refused_read_holds_before_spec_auth(make_body: Body) -> None:
    model = parse_inference_model(make_body(auth={"tokenSecretName": "tokens"}))
    assert make_plan(model, Observed(TLSObserved(), blocker=REFUSED), FIRST_PASS) == Held(
        REFUSED, TLSState(TLSMode.DISABLED), model
    )


def test_unreadable_tls_is_held_with_the_read_error(make_body: Body) -> None:
    refused = Problem(Reason.APPLY_FAILED, "secrets is forbidden")
    model = parse_inference_model(make_body())
    plan = make_plan(model, Observed(None, blocker=refused), FIRST_PASS)
    assert plan == Held(refused, None, model)
    assert render_all(plan) == []


def test_a_first_plan_routes_nothing_until_a_version_is_ready(make_body: Body) -> None:
    body = make_body(
        versions=[{"name": "v1", "modelUri": "pvc://models/a"}, {"name": "v2", "modelUri": "pvc://models/b"}],
        traffic=[{"version": "v1", "percent": 75}, {"version": "v2", "percent": 25}],
    )
    plan = make_plan(parse_inference_model(body), Observed(TLSObserved(), missing_claims=frozenset({"x"})), FIRST_PASS)
    assert isinstance(plan, Plan)
    assert plan.routing.choice.mode is Mode.SERVICE  # no Gateway API
    assert plan.headless_versions
    assert plan.missing_claims == {"x"}
    assert plan.routing.decision.applied == {"v1": 0, "v2": 0}  # no ready pod yet: each keeps 0%
    assert {v.name: v.replicas for v in plan.running.spec.versions} == {"v1": 1, "v2": 1}  # 2 pods at 75/25
    assert [(s.version, s.percent) for s in plan.running.spec.traffic] == [("v1", 75), ("v2", 25)]  # as desired
