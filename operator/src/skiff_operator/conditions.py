"""The vocabulary of conditions and Events: condition types and statuses, Event types, the one Reason enum (every
condition, Event and SpecError reason is a member), and the values a reconcile decides them as."""

from __future__ import annotations

import datetime
import enum
from collections.abc import Sequence
from dataclasses import dataclass


class ConditionType(enum.StrEnum):
    """The types of status.conditions."""

    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    SPLIT_APPROXIMATED = "SplitApproximated"
    ROUTE_ACCEPTED = "RouteAccepted"
    ROLLED_BACK = "RolledBack"


class ConditionStatus(enum.StrEnum):
    """A condition's status, as Kubernetes writes it."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class EventType(enum.StrEnum):
    """A core/v1 Event's type."""

    NORMAL = "Normal"
    WARNING = "Warning"


READY = ConditionType.READY
PROGRESSING = ConditionType.PROGRESSING
DEGRADED = ConditionType.DEGRADED
CONDITION_TYPES = (READY, PROGRESSING, DEGRADED)


class Reason(enum.StrEnum):
    """Condition (and Event) reasons, one closed set for every module; docs/operator.md and docs/canary.md explain
    each."""

    ALL_VERSIONS_READY = "AllVersionsReady"
    ROLLING_OUT = "RollingOut"
    ROLLOUT_COMPLETE = "RolloutComplete"
    AS_EXPECTED = "AsExpected"
    SCALED_TO_ZERO = "ScaledToZero"
    REPLICAS_UNAVAILABLE = "ReplicasUnavailable"
    PVC_NOT_FOUND = "PVCNotFound"
    INSUFFICIENT_GPU = "InsufficientGPU"
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    CRASH_LOOP = "CrashLoopBackOff"
    GPU_UNAVAILABLE = "GPUUnavailable"  # the runtime exited: its GPU is not usable (its termination message says why)
    ROLLOUT_STUCK = "RolloutStuck"
    INVALID_SPEC = "InvalidSpec"
    INVALID_MODEL_URI = "InvalidModelUri"
    UNSUPPORTED_MODEL_URI = "UnsupportedModelUri"
    APPLY_FAILED = "ApplyFailed"
    MODEL_FETCH_FAILED = "ModelFetchFailed"  # a fetched modelUri: the fetch-model init container failed (model_fetch)
    # spec.tls (skiff_operator.tls)
    TLS_SECRET_MISSING = "TLSSecretMissing"  # noqa: S105 - a reason, not a password
    TLS_SECRET_INVALID = "TLSSecretInvalid"  # noqa: S105
    CERT_MANAGER_NOT_INSTALLED = "CertManagerNotInstalled"
    CERTIFICATE_PENDING = "CertificatePending"
    # ownership and what a model may reference (skiff_operator.ownership)
    NAME_CONFLICT = "NameConflict"
    SECRET_REFUSED = "SecretRefused"  # noqa: S105 - a reason, not a password
    # spec.auth (skiff_operator.auth)
    AUTH_SECRET_MISSING = "AuthSecretMissing"  # noqa: S105
    AUTH_SECRET_INVALID = "AuthSecretInvalid"  # noqa: S105
    # traffic (skiff_operator.traffic_status); TRAFFIC_SHIFTED and VERSION_DELETED are Event reasons
    CANARY_NOT_READY = "CanaryNotReady"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    DRAINING = "Draining"
    # spec.podTemplate (skiff_operator.render.pod_template): an Event reason
    POD_TEMPLATE_OVERRIDDEN = "PodTemplateOverridden"
    GATEWAY_API_MISSING = "GatewayAPIMissing"
    BACKEND_TLS_UNAVAILABLE = "BackendTLSUnavailable"  # Gateway mode with TLS: no BackendTLSPolicy can be made
    # SplitApproximated: whether whole pods can give spec.traffic (Service mode) or a route splits per request
    REPLICA_ROUNDING = "ReplicaRounding"
    REPLICAS_GIVE_SPLIT = "ReplicasGiveSplit"
    PER_REQUEST_SPLIT = "PerRequestSplit"
    TRAFFIC_SHIFTED = "TrafficShifted"
    VERSION_DELETED = "VersionDeleted"
    # autoscaling's Event when it changes a version's replicas (skiff_operator.autoscale; docs/autoscaling.md)
    SCALED = "Scaled"
    WAITING_FOR_CAPACITY = "WaitingForCapacity"  # status.rollout: the step passed, the candidate's pods still start
    # RouteAccepted, and Degraded when a gateway refuses the route (skiff_operator.route_status)
    ROUTE_ACCEPTED = "RouteAccepted"
    ROUTE_PENDING = "RoutePending"
    ROUTE_SETTLING = "RouteSettling"  # Ready only: accepted, the gateway's data plane given time to follow
    ROUTE_NOT_ACCEPTED = "RouteNotAccepted"
    ROUTE_REFS_NOT_RESOLVED = "RouteRefsNotResolved"
    # status.rollout, its Events and RolledBack (skiff_operator.rollout; docs/canary.md explains each)
    ROLLOUT_STARTED = "RolloutStarted"
    IN_STEP = "InStep"
    STEP_PASSED = "StepPassed"
    LOW_TRAFFIC = "LowTraffic"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    COUNTERS_RESET = "CountersReset"
    ROLLOUT_PAUSED = "Paused"
    PROMOTED = "Promoted"
    ERROR_RATIO_EXCEEDED = "ErrorRatioExceeded"
    LATENCY_RATIO_EXCEEDED = "LatencyRatioExceeded"
    ABORTED = "Aborted"
    SHADOWING = "Shadowing"  # spec.rollout.shadow's gate: copies compared, the candidate at 0%
    SHADOW_PASSED = "ShadowPassed"
    SHADOW_DISAGREED = "ShadowDisagreed"
    # Rollout Events (skiff_operator.rollout.EVENT_REASONS maps each status.rollout reason to one)
    ROLLOUT_STEP_PASSED = "RolloutStepPassed"
    ROLLOUT_LOW_TRAFFIC = "RolloutLowTraffic"
    ROLLOUT_PAUSED_EVENT = "RolloutPaused"
    ROLLOUT_PROMOTED = "RolloutPromoted"
    ROLLOUT_METRICS_UNAVAILABLE = "RolloutMetricsUnavailable"
    ROLLOUT_ERROR_RATIO_EXCEEDED = "RolloutErrorRatioExceeded"
    ROLLOUT_LATENCY_RATIO_EXCEEDED = "RolloutLatencyRatioExceeded"
    ROLLOUT_ABORTED = "RolloutAborted"
    ROLLOUT_SHADOWING = "RolloutShadowing"
    ROLLOUT_SHADOW_PASSED = "RolloutShadowPassed"
    ROLLOUT_SHADOW_DISAGREED = "RolloutShadowDisagreed"
    ROLLOUT_STEP_ROUNDED = "RolloutStepRounded"  # Service mode: whole pods cannot give a step's weight
    # TLS Events (skiff_operator.tls): what a client trusting the model's CA must know
    CERTIFICATE_ISSUED = "CertificateIssued"
    CERTIFICATE_RENEWED = "CertificateRenewed"
    CA_ROTATION_STARTED = "CARotationStarted"
    CA_ROTATED = "CARotated"


@dataclass(frozen=True)
class Problem:
    reason: Reason
    message: str


@dataclass(frozen=True)
class Condition:
    """A condition as a reconcile decides it, before it is stamped (`stamp_conditions`)."""

    type: ConditionType
    status: ConditionStatus
    reason: Reason
    message: str


@dataclass(frozen=True)
class StatusCondition:
    """One entry of status.conditions."""

    type: ConditionType | str  # read back from an older operator's status, possibly a type this one dropped
    status: ConditionStatus | str
    reason: Reason | str  # a Reason; read back from an older operator's status, possibly a word this one dropped
    message: str
    last_transition_time: datetime.datetime | None  # None: read back from a status without a readable time
    observed_generation: int = 0


@dataclass(frozen=True)
class StatusEvent:
    """A Kubernetes Event to post on the InferenceModel for a meaningful transition."""

    type: EventType
    reason: Reason
    message: str


def find_condition(conditions: Sequence[StatusCondition], kind: ConditionType) -> StatusCondition | None:
    return next((c for c in conditions if c.type == kind), None)
