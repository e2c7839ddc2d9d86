"""The automated rollout of spec.rollout as a pure state machine: from the rollout spec, the state kept in status,
the counters read this pass and the clock, decide the candidate's share, the next state and the Events to post.

Rules (each has a row in operator/tests/test_rollout.py):
- A rollout starts (step 1, its counters as the baseline) when none is recorded for this candidate and revision
  (its image and modelUri); a changed candidate or revision starts it again.
- abort: the candidate goes to 0% at once (RolledBack, reason Aborted), at any step and after promotion too;
  clearing abort starts the rollout again.
- paused: the share and the step stay; nothing is judged until paused is cleared.
- A step's numbers are the growth of the counters since the step started. A counter that went down (a pod
  restarted or left) makes the step start its window again; unreadable metrics wait.
- With enough candidate requests in the step (minRequests), an error ratio above maxErrorRatio rolls the candidate
  back at once, pause or not.
- A pause that has passed with fewer than minRequests candidate requests neither passes nor fails: the rollout
  waits at the step's share until they arrive.
- Once the step's pause has passed with enough requests: a candidate p99 above maxP99LatencyRatio x the stable
  p99 (when the stable versions also served minRequests) rolls it back; otherwise the step passes, and after the
  last step the candidate is promoted to 100%.
- Promoted and RolledBack are final for the candidate's revision (except abort, above).
- spec.rollout.shadow: the rollout starts at 0% (Shadowing): the stable pods copy a sample of their requests to the
  candidate and count the comparisons (skiff_shadow_requests_total); judge_shadow on their growth since the gate
  started decides: Waiting stays at 0%, Failed rolls back (ShadowDisagreed) with 0% ever given, Passed starts the
  first weighted step. paused holds the gate at 0%; a shadow counter that went down starts its window again.
- Service mode splits connections by pods: each step's weight is what whole pods give it (round_steps), and
  status.rollout.stepRounding and a Warning Event say so for every step where that is not the weight asked for,
  before the step starts (from the rollout's first pass, again whenever the rounding changes).
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from skiff_operator.conditions import (
    Condition,
    ConditionStatus,
    ConditionType,
    EventType,
    Reason,
    StatusCondition,
    StatusEvent,
)
from skiff_operator.observed import MetricsScrape
from skiff_operator.prometheus import Counts, quantile, subtract
from skiff_operator.routing import service_targets
from skiff_operator.shadow_gate import GateVerdict, ShadowCounts, ShadowStatus, judge_shadow
from skiff_operator.spec import InferenceModel, ModelUri, RolloutSpec, TrafficShare, Version
from skiff_operator.status import stamp_conditions
from skiff_operator.traffic import TOTAL, largest_remainder

P99 = 0.99
ROLLED_BACK = ConditionType.ROLLED_BACK  # the condition type: True with the numbers that failed


class Verdict(enum.StrEnum):
    PROGRESSING = "Progressing"
    WAITING = "Waiting"  # too few requests (or no readable metrics) to judge the step
    PAUSED = "Paused"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"


# The reasons status.rollout may carry (all members of status.Reason); anything else read back is unreadable.
ROLLOUT_REASONS = frozenset(
    {
        Reason.ROLLOUT_STARTED,
        Reason.IN_STEP,
        Reason.STEP_PASSED,
        Reason.LOW_TRAFFIC,
        Reason.METRICS_UNAVAILABLE,
        Reason.COUNTERS_RESET,
        Reason.ROLLOUT_PAUSED,
        Reason.PROMOTED,
        Reason.ERROR_RATIO_EXCEEDED,
        Reason.LATENCY_RATIO_EXCEEDED,
        Reason.ABORTED,
        Reason.WAITING_FOR_CAPACITY,
        Reason.SHADOWING,
        Reason.SHADOW_PASSED,
        Reason.SHADOW_DISAGREED,
    }
)


class Role(enum.StrEnum):
    CANDIDATE = "Candidate"
    STABLE = "Stable"


# Which transitions are worth an Event, and of which type (the others show in status only).
EVENTS: Mapping[Reason, tuple[EventType, Reason]] = {
    Reason.ROLLOUT_STARTED: (EventType.NORMAL, Reason.ROLLOUT_STARTED),
    Reason.STEP_PASSED: (EventType.NORMAL, Reason.ROLLOUT_STEP_PASSED),
    Reason.LOW_TRAFFIC: (EventType.NORMAL, Reason.ROLLOUT_LOW_TRAFFIC),
    Reason.ROLLOUT_PAUSED: (EventType.NORMAL, Reason.ROLLOUT_PAUSED_EVENT),
    Reason.PROMOTED: (EventType.NORMAL, Reason.ROLLOUT_PROMOTED),
    Reason.METRICS_UNAVAILABLE: (EventType.WARNING, Reason.ROLLOUT_METRICS_UNAVAILABLE),
    Reason.ERROR_RATIO_EXCEEDED: (EventType.WARNING, Reason.ROLLOUT_ERROR_RATIO_EXCEEDED),
    Reason.LATENCY_RATIO_EXCEEDED: (EventType.WARNING, Reason.ROLLOUT_LATENCY_RATIO_EXCEEDED),
    Reason.ABORTED: (EventType.WARNING, Reason.ROLLOUT_ABORTED),
    Reason.SHADOWING: (EventType.NORMAL, Reason.ROLLOUT_SHADOWING),
    Reason.SHADOW_PASSED: (EventType.NORMAL, Reason.ROLLOUT_SHADOW_PASSED),
    Reason.SHADOW_DISAGREED: (EventType.WARNING, Reason.ROLLOUT_SHADOW_DISAGREED),
}
ROLLED_BACK_REASONS = frozenset(
    {Reason.ERROR_RATIO_EXCEEDED, Reason.LATENCY_RATIO_EXCEEDED, Reason.ABORTED, Reason.SHADOW_DISAGREED}
)
# skiff_shadow_requests_total's results, in ShadowCounts' field order.
SHADOW_RESULTS = ("agreed", "disagreed", "dropped", "failed")
_FINAL = frozenset({Verdict.PROMOTED, Verdict.ROLLED_BACK})


@dataclass(frozen=True)
class Side:
    """One side of the comparison over the current step: the candidate, or the stable versions together."""

    role: Role
    versions: tuple[str, ...]
    requests: int = 0
    errors: int = 0
    p99_s: float | None = None

    @property
    def error_ratio(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class RolloutState:
    """Everything the rollout remembers between reconciles (kept in status.rollout)."""

    candidate: str
    revision: str
    step: int  # index into spec.rollout.steps; len(steps) once promoted
    step_started_at: datetime.datetime
    weight: int  # the candidate's share, percent
    verdict: Verdict
    reason: Reason
    message: str
    baseline: Mapping[Role, Counts] = field(default_factory=dict)
    analysis: tuple[Side, ...] = ()
    shadow: ShadowStatus | None = None  # spec.rollout.shadow's gate: Waiting while the candidate is shadowed
    shadow_baseline: ShadowCounts | None = None  # the stable pods' shadow counters when the gate started

    @property
    def shadowing(self) -> bool:
        """Whether the shadow gate still holds the candidate at 0% (copies compared, no weight yet)."""
        return self.shadow is not None and self.shadow.verdict is GateVerdict.WAITING


@dataclass(frozen=True)
class Observation:
    """The cumulative counters read this pass, per side; None when a side's metrics could not be read (why)."""

    candidate: Counts | None
    stable: Counts | None
    problem: str = ""
    # Autoscaling: why the candidate cannot take its next step's weight yet (the pods sized for it still start).
    capacity_short: str = ""


@dataclass(frozen=True)
class StepRounding:
    """Service mode: a step whose weight whole pods cannot give, and what they give (status.rollout.stepRounding)."""

    step: int  # index into spec.rollout.steps
    requested_percent: int
    effective_percent: int
    candidate_pods: int
    pods: int
    message: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "message",
            f"steps[{self.step}]: requested {self.requested_percent}%, effective {self.effective_percent}% "
            f"({self.candidate_pods} of {self.pods} pods)",
        )


@dataclass(frozen=True)
class RolloutDecision:
    state: RolloutState
    events: tuple[StatusEvent, ...] = ()
    rounding: tuple[StepRounding, ...] = ()  # Service mode: the steps whole pods round


def revision_of(version: Version) -> str:
    """What identifies the candidate's build: a new image, model or task starts the rollout again."""
    task = version.task
    return _model_revision(version) + ("" if task is None else f" task:{task.name} {task!r}")


def _model_revision(version: Version) -> str:
    fetched = version.fetched
    if fetched is not None:
        return f"{version.image} {fetched.uri}" + (f" sha256:{fetched.sha256}" if fetched.sha256 else "")
    packaged = version.packaged
    if packaged is not None:
        return f"{version.image} {packaged.uri}"
    uri = version.model_uri
    assert isinstance(uri, ModelUri)
    return f"{version.image} {uri.claim}/{uri.path}"


def stable_versions(rollout: RolloutSpec, traffic: Sequence[TrafficShare]) -> tuple[str, ...]:
    return tuple(s.version for s in traffic if s.version != rollout.candidate and s.percent > 0)


def rollout_traffic(rollout: RolloutSpec, traffic: Sequence[TrafficShare], weight: int) -> tuple[TrafficShare, ...]:
    """The desired split while rolling out: the candidate gets `weight`, the stable versions share the rest in the
    proportions spec.traffic gives them; versions spec.traffic gives nothing keep nothing."""
    stable = {s.version: float(s.percent) for s in traffic if s.version != rollout.candidate}
    shares = largest_remainder(stable, TOTAL - weight)
    order = [s.version for s in traffic]
    if rollout.candidate not in order:
        order.append(rollout.candidate)
    return tuple(TrafficShare(name, weight if name == rollout.candidate else shares.get(name, 0)) for name in order)


def decide_rollout(
    rollout: RolloutSpec,
    previous: RolloutState | None,
    observed: Observation,
    *,
    revision: str,
    stable: Sequence[str],
    now: datetime.datetime,
) -> RolloutDecision:
    """One evaluation of the rollout; the same inputs give the same answer, so a second pass in one reconcile
    changes nothing."""
    fresh = (
        previous is None
        or (previous.candidate, previous.revision) != (rollout.candidate, revision)
        or (previous.reason is Reason.ABORTED and not rollout.abort)
    )
    if fresh or previous is None:
        state = _start(rollout, observed, revision, now)
        if rollout.abort or rollout.paused:  # nothing to judge yet, but a hold or an abort applies at once
            state = _next_state(rollout, state, observed, tuple(stable), now)
        return RolloutDecision(state, _events(None, state))
    state = _next_state(rollout, previous, observed, tuple(stable), now)
    return RolloutDecision(state, _events(previous, state))


def _next_state(
    rollout: RolloutSpec, state: RolloutState, observed: Observation, stable: tuple[str, ...], now: datetime.datetime
) -> RolloutState:
    steps = len(rollout.steps)
    if rollout.abort:
        if state.reason is Reason.ABORTED:
            return state
        where = "after promotion" if state.verdict is Verdict.PROMOTED else f"at step {_step_label(state, steps)}"
        return _rolled_back(
            state, Reason.ABORTED, f"spec.rollout.abort is set: {rollout.candidate} rolled back to 0% {where}"
        )
    if state.verdict in _FINAL:
        return state
    if state.shadowing:
        return _shadow_gate(rollout, state, observed, now)
    # Steps edited mid-rollout: stay within them, at the share the current step now asks for.
    index = min(state.step, steps - 1)
    state = replace(state, step=index, weight=rollout.steps[index].weight)
    if rollout.paused:
        where = f"{state.weight}% (step {_step_label(state, steps)})"
        message = f"spec.rollout.paused is set: {rollout.candidate} stays at {where}"
        return replace(state, verdict=Verdict.PAUSED, reason=Reason.ROLLOUT_PAUSED, message=message)
    if observed.candidate is None or observed.stable is None:
        message = f"cannot read the metrics to judge step {_step_label(state, steps)}: {observed.problem or 'no data'}"
        return replace(state, verdict=Verdict.WAITING, reason=Reason.METRICS_UNAVAILABLE, message=message)
    candidate = subtract(observed.candidate, state.baseline.get(Role.CANDIDATE, Counts()))
    stable_delta = subtract(observed.stable, state.baseline.get(Role.STABLE, Counts()))
    if candidate is None or stable_delta is None:
        message = (
            f"a metrics counter went down (a pod restarted or left); step {_step_label(state, steps)} "
            "counts again from now"
        )
        baseline = {Role.CANDIDATE: observed.candidate, Role.STABLE: observed.stable}
        return replace(state, baseline=baseline, verdict=Verdict.WAITING, reason=Reason.COUNTERS_RESET, message=message)
    analysis = rollout.analysis
    sides = (
        _side(Role.CANDIDATE, (rollout.candidate,), candidate, analysis.error_codes),
        _side(Role.STABLE, stable, stable_delta, analysis.error_codes),
    )
    state = replace(state, analysis=sides)
    mine, theirs = sides
    numbers = _numbers(sides)
    if mine.requests >= analysis.min_requests and mine.error_ratio > analysis.max_error_ratio:
        message = (
            f"error ratio {mine.error_ratio:.4f} > maxErrorRatio {analysis.max_error_ratio:g} at step "
            f"{_step_label(state, steps)} ({state.weight}%); {rollout.candidate} rolled back to 0%: {numbers}"
        )
        return _rolled_back(state, Reason.ERROR_RATIO_EXCEEDED, message)
    pause_s = rollout.steps[state.step].pause_s
    left = pause_s - (now - state.step_started_at).total_seconds()
    if left > 0:
        message = f"step {_step_label(state, steps)} at {state.weight}%, {left:.0f}s of its pause left: {numbers}"
        return replace(state, verdict=Verdict.PROGRESSING, reason=Reason.IN_STEP, message=message)
    if mine.requests < analysis.min_requests:
        message = (
            f"{rollout.candidate} served {mine.requests} of the {analysis.min_requests} requests step "
            f"{_step_label(state, steps)} needs; waiting at {state.weight}%"
        )
        return replace(state, verdict=Verdict.WAITING, reason=Reason.LOW_TRAFFIC, message=message)
    if theirs.requests >= analysis.min_requests and mine.p99_s is not None and theirs.p99_s:
        ratio = mine.p99_s / theirs.p99_s
        if ratio > analysis.max_p99_latency_ratio:
            message = (
                f"p99 latency ratio {ratio:.2f} > maxP99LatencyRatio {analysis.max_p99_latency_ratio:g} at step "
                f"{_step_label(state, steps)} ({state.weight}%); {rollout.candidate} rolled back to 0%: {numbers}"
            )
            return _rolled_back(state, Reason.LATENCY_RATIO_EXCEEDED, message)
    if observed.capacity_short:
        message = f"step {_step_label(state, steps)} passed; waiting at {state.weight}%: {observed.capacity_short}"
        return replace(state, verdict=Verdict.WAITING, reason=Reason.WAITING_FOR_CAPACITY, message=message)
    return _passed(rollout, state, observed, now, numbers)


def _start(rollout: RolloutSpec, observed: Observation, revision: str, now: datetime.datetime) -> RolloutState:
    weight = rollout.steps[0].weight
    state = RolloutState(
        candidate=rollout.candidate,
        revision=revision,
        step=0,
        step_started_at=now,
        weight=weight,
        verdict=Verdict.PROGRESSING,
        reason=Reason.ROLLOUT_STARTED,
        message=f"rolling out {rollout.candidate}: step 1/{len(rollout.steps)} at {weight}%",
        baseline=_baseline(observed),
    )
    if rollout.shadow is None:
        return state
    gate = judge_shadow(rollout.shadow, ShadowCounts(), rollout.candidate)  # the gate first, at 0%
    return replace(
        state,
        weight=0,
        reason=Reason.SHADOWING,
        message=f"rolling out {rollout.candidate}: shadowed first at 0% ({gate.message})",
        shadow=gate,
        shadow_baseline=shadow_counts(observed.stable, rollout.candidate),
    )


def shadow_counts(stable: Counts | None, candidate: str) -> ShadowCounts:
    """The stable pods' shadow counters for `candidate` (zero where none were read)."""
    if stable is None:
        return ShadowCounts()
    return ShadowCounts(*(stable.shadow_of(candidate, result) for result in SHADOW_RESULTS))


def _shadow_growth(now: ShadowCounts, before: ShadowCounts) -> ShadowCounts | None:
    """The counters' growth; None when one went down (a stable pod restarted or left)."""
    grown = [getattr(now, r) - getattr(before, r) for r in SHADOW_RESULTS]
    return None if any(value < 0 for value in grown) else ShadowCounts(*grown)


def _shadow_gate(
    rollout: RolloutSpec, state: RolloutState, observed: Observation, now: datetime.datetime
) -> RolloutState:
    """One pass of the shadow gate: the candidate stays at 0% until judge_shadow passes or fails it."""
    shadow = rollout.shadow
    if shadow is None:  # spec.rollout.shadow removed mid-gate: the steps start now, as without a gate
        return _start(rollout, observed, state.revision, now)
    state = replace(state, weight=0)
    if rollout.paused:
        message = f"spec.rollout.paused is set: {rollout.candidate} stays shadowed at 0%"
        return replace(state, verdict=Verdict.PAUSED, reason=Reason.ROLLOUT_PAUSED, message=message)
    if observed.stable is None:
        message = f"cannot read the stable pods' shadow counters: {observed.problem or 'no data'}; waiting at 0%"
        return replace(state, verdict=Verdict.WAITING, reason=Reason.METRICS_UNAVAILABLE, message=message)
    current = shadow_counts(observed.stable, rollout.candidate)
    since = _shadow_growth(current, state.shadow_baseline or ShadowCounts())
    if since is None:
        message = "a shadow counter went down (a stable pod restarted or left); the gate counts again from now"
        return replace(
            state, shadow_baseline=current, verdict=Verdict.WAITING, reason=Reason.COUNTERS_RESET, message=message
        )
    gate = judge_shadow(shadow, since, rollout.candidate)
    state = replace(state, shadow=gate)
    if gate.verdict is GateVerdict.FAILED:
        return _rolled_back(state, Reason.SHADOW_DISAGREED, gate.message)
    if gate.verdict is GateVerdict.WAITING:
        return replace(state, verdict=Verdict.PROGRESSING, reason=Reason.SHADOWING, message=gate.message)
    first = _start(replace(rollout, shadow=None), observed, state.revision, now)  # the first step starts now
    message = f"{gate.message}; {rollout.candidate} now at {first.weight}% (step 1/{len(rollout.steps)})"
    return replace(
        first, reason=Reason.SHADOW_PASSED, message=message, shadow=gate, shadow_baseline=state.shadow_baseline
    )


def _passed(
    rollout: RolloutSpec, state: RolloutState, observed: Observation, now: datetime.datetime, numbers: str
) -> RolloutState:
    steps = len(rollout.steps)
    done = f"step {_step_label(state, steps)} at {state.weight}% passed ({numbers})"
    following = state.step + 1
    if following >= steps:
        verdict, reason, weight = Verdict.PROMOTED, Reason.PROMOTED, TOTAL
        message = f"{done}; {rollout.candidate} promoted to 100%"
    else:
        verdict, reason, weight = Verdict.PROGRESSING, Reason.STEP_PASSED, rollout.steps[following].weight
        message = f"{done}; {rollout.candidate} now at {weight}% (step {following + 1}/{steps})"
    return replace(
        state,
        step=following,
        step_started_at=now,
        weight=weight,
        verdict=verdict,
        reason=reason,
        message=message,
        baseline=_baseline(observed),
    )


def _rolled_back(state: RolloutState, reason: Reason, message: str) -> RolloutState:
    return replace(state, weight=0, verdict=Verdict.ROLLED_BACK, reason=reason, message=message)


def _baseline(observed: Observation) -> dict[Role, Counts]:
    return {Role.CANDIDATE: observed.candidate or Counts(), Role.STABLE: observed.stable or Counts()}


def _side(role: Role, versions: tuple[str, ...], delta: Counts, error_codes: frozenset[str]) -> Side:
    return Side(role, versions, delta.requests, delta.errors(error_codes), quantile(P99, delta.buckets))


def _numbers(sides: Sequence[Side]) -> str:
    return "; ".join(
        f"{','.join(s.versions) or 'none'}: {s.requests} requests, error ratio {s.error_ratio:.4f}, p99 {_ms(s.p99_s)}"
        for s in sides
    )


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f}ms"


def _step_label(state: RolloutState, steps: int) -> str:
    return f"{min(state.step + 1, steps)}/{steps}"


def _events(previous: RolloutState | None, state: RolloutState) -> tuple[StatusEvent, ...]:
    """An Event when the reason or the step changes, for the reasons in EVENTS (its type and Event reason)."""
    if previous is not None and (previous.reason, previous.step) == (state.reason, state.step):
        return ()
    event = EVENTS.get(state.reason)
    if event is None:
        return ()
    kind, reason = event
    return (StatusEvent(kind, reason, state.message),)


# -- the model-level entry points reconcile calls ------------------------------------------------------------------


def decide_model_rollout(
    model: InferenceModel,
    previous: RolloutStatus | None,
    scrape: MetricsScrape,
    now: datetime.datetime,
    capacity_short: str = "",
) -> RolloutDecision | None:
    """The rollout of `model` (None without spec.rollout), from the state in its status and this pass's scrape;
    `capacity_short`: why an autoscaled candidate may not take its next weight yet (empty: it may)."""
    rollout = model.spec.rollout
    if rollout is None:
        return None
    stable = stable_versions(rollout, model.spec.traffic)
    candidate, candidate_problem = scrape.side([rollout.candidate])
    stable_counts, stable_problem = scrape.side(stable)
    problem = "; ".join(p for p in (candidate_problem, stable_problem) if p)
    observed = Observation(candidate, stable_counts, problem, capacity_short)
    revision = revision_of(model.spec.version(rollout.candidate))
    state = rollout_state(previous) if previous is not None else None
    return decide_rollout(rollout, state, observed, revision=revision, stable=stable, now=now)


def round_steps(model: InferenceModel, traffic: Sequence[TrafficShare]) -> tuple[StepRounding, ...]:
    """Service mode: the steps whose weight is not what whole pods give the candidate, with what they give.
    `model` carries the replicas decided this pass (routing.service_targets apportions them at each step's split);
    `traffic` is spec.traffic as written (the stable versions' proportions)."""
    rollout = model.spec.rollout
    if rollout is None:
        return ()
    rounded = []
    for index, step in enumerate(rollout.steps):
        split = rollout_traffic(rollout, traffic, step.weight)
        pods = service_targets(replace(model, spec=replace(model.spec, traffic=split)))
        total, mine = sum(pods.values()), pods.get(rollout.candidate, 0)
        effective = round(TOTAL * mine / total) if total else 0
        if effective != step.weight:
            rounded.append(StepRounding(index, step.weight, effective, mine, total))
    return tuple(rounded)


def with_step_rounding(
    decision: RolloutDecision, rounding: Sequence[StepRounding], previous: Sequence[StepRounding]
) -> RolloutDecision:
    """The decision with the steps' rounding, and a Warning Event when it is new or changed since `previous` (the
    rounding in status): before the first step starts, and again after a change of replicas."""
    rounding = tuple(rounding)
    if not rounding or rounding == tuple(previous) or decision.state.verdict in _FINAL:
        return replace(decision, rounding=rounding)
    message = (
        "Service mode splits connections by whole pods, so steps get what the replicas give: "
        + "; ".join(r.message for r in rounding)
        + "; for exact steps route through a Gateway (spec.routing.gateways), or give the versions more replicas"
    )
    event = StatusEvent(EventType.WARNING, Reason.ROLLOUT_STEP_ROUNDED, message)
    return replace(decision, rounding=rounding, events=(*decision.events, event))


def with_rollout_traffic(model: InferenceModel, decision: RolloutDecision) -> InferenceModel:
    """The model with the rollout's split as its desired traffic (the CR's spec.traffic is not changed)."""
    rollout = model.spec.rollout
    if rollout is None:
        return model
    traffic = rollout_traffic(rollout, model.spec.traffic, decision.state.weight)
    return replace(model, spec=replace(model.spec, traffic=traffic))


def admit_scraper(model: InferenceModel, operator_namespace: str | None) -> InferenceModel:
    """With spec.rollout or autoscaling the operator reads the pods' metrics port itself, so its namespace joins the
    namespaces the NetworkPolicy admits to that port (out of cluster it is unknown, and nothing changes)."""
    policy = model.spec.network_policy
    scrapes = model.spec.rollout is not None or any(v.autoscaling is not None for v in model.spec.versions)
    if not scrapes or not operator_namespace or operator_namespace in policy.metrics_namespaces:
        return model
    namespaces = (*policy.metrics_namespaces, operator_namespace)
    return replace(model, spec=replace(model.spec, network_policy=replace(policy, metrics_namespaces=namespaces)))


def summarize_rollout(
    model: InferenceModel,
    decision: RolloutDecision | None,
    conditions: Sequence[StatusCondition],
    *,
    previous_conditions: Sequence[StatusCondition],
    now: datetime.datetime,
) -> tuple[RolloutStatus | None, tuple[StatusCondition, ...]]:
    """status.rollout (None without spec.rollout) and `conditions` with RolledBack, True once rolled back."""
    if decision is None or model.spec.rollout is None:
        return None, tuple(conditions)
    state = decision.state
    rolled_back = state.verdict is Verdict.ROLLED_BACK
    condition = Condition(
        ROLLED_BACK, ConditionStatus.TRUE if rolled_back else ConditionStatus.FALSE, state.reason, state.message
    )
    stamped = stamp_conditions([condition], previous_conditions, model.ref.generation, now)
    kept = tuple(c for c in conditions if c.type != ROLLED_BACK)
    return rollout_status(state, len(model.spec.rollout.steps), decision.rounding), (*kept, *stamped)


# -- status.rollout: the state written to the CR and read back (skiff_operator.model_status renders and parses) ----


@dataclass(frozen=True)
class SideStatus:
    """One entry of status.rollout.analysis."""

    role: Role
    versions: str  # joined by commas
    requests: int
    errors: int
    error_ratio: float = field(init=False)  # errors / requests, 6 decimals
    p99_seconds: float | None = None  # None: no request in the step

    def __post_init__(self) -> None:
        object.__setattr__(self, "error_ratio", round(self.errors / self.requests, 6) if self.requests else 0.0)


@dataclass(frozen=True)
class BaselineStatus:
    """One entry of status.rollout.baseline: a side's cumulative counters when the step started."""

    role: Role
    codes: Mapping[str, int]
    buckets: Mapping[str, int]


@dataclass(frozen=True)
class RolloutStatus:
    """status.rollout: the RolloutState a restarted operator resumes from, and what kubectl shows of it."""

    candidate: str
    revision: str
    step: int
    steps: int
    step_started_at: datetime.datetime
    weight: int
    verdict: Verdict
    reason: Reason  # one of ROLLOUT_REASONS
    message: str
    summary: str = field(init=False)  # step and verdict, e.g. "2/4 Progressing"
    analysis: tuple[SideStatus, ...] = ()
    baseline: tuple[BaselineStatus, ...] = ()
    step_rounding: tuple[StepRounding, ...] = ()  # Service mode: the steps whole pods round (empty: none)
    shadow: ShadowStatus | None = None  # spec.rollout.shadow's gate (kubectl's ROLLOUT column shows its agreement)
    shadow_baseline: ShadowCounts | None = None

    def __post_init__(self) -> None:
        shadow = self.shadow
        if shadow is not None and shadow.verdict is not GateVerdict.PASSED:  # the gate: no step has started
            summary = f"shadow {shadow.agreement:.2%} of {shadow.samples} {self.verdict}"
        else:
            summary = f"{min(self.step + 1, self.steps)}/{self.steps} {self.verdict}"
        object.__setattr__(self, "summary", summary)


def rollout_status(state: RolloutState, steps: int, rounding: Sequence[StepRounding] = ()) -> RolloutStatus:
    return RolloutStatus(
        step_rounding=tuple(rounding),
        candidate=state.candidate,
        revision=state.revision,
        step=state.step,
        steps=steps,
        step_started_at=state.step_started_at,
        weight=state.weight,
        verdict=state.verdict,
        reason=state.reason,
        message=state.message,
        analysis=tuple(
            SideStatus(
                side.role,
                ",".join(side.versions),
                side.requests,
                side.errors,
                round(side.p99_s, 6) if side.p99_s is not None else None,
            )
            for side in state.analysis
        ),
        baseline=tuple(
            BaselineStatus(role, dict(counts.codes), dict(counts.buckets))
            for role, counts in sorted(state.baseline.items())
        ),
        shadow=state.shadow,
        shadow_baseline=state.shadow_baseline,
    )


def rollout_state(status: RolloutStatus) -> RolloutState:
    """The state a rollout resumes from. The last step's analysis is not carried: each step measures afresh."""
    return RolloutState(
        candidate=status.candidate,
        revision=status.revision,
        step=status.step,
        step_started_at=status.step_started_at,
        weight=status.weight,
        verdict=status.verdict,
        reason=status.reason,
        message=status.message,
        baseline={b.role: Counts(dict(b.codes), dict(b.buckets)) for b in status.baseline},
        shadow=status.shadow,
        shadow_baseline=status.shadow_baseline,
    )
