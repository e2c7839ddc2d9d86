"""Random InferenceModel spec documents, one generator for the parser's unit fuzz and the real-cluster e2e fuzz."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

# Numbers at the limits the API server, Go's int64/float64 and the CRD's bounds meet.
LIMITS = st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**64, 1e308, -1e308, 5e-324])
TEXT = st.text(max_size=8) | st.sampled_from(["", "\u202e", "\ud7ff\U0001f600", "a" * 300, "../../x", "1e400"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | LIMITS | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
FIELDS = ["versions", "traffic", "runtime", "resources", "scheduling", "probes", "tls", "routing",
          "networkPolicy", "auth", "rollout"]  # fmt: skip

# A random document in one spec field, or one level down under a field's name: (field, inner field or None, value).
SPEC_MEMBER = st.tuples(st.sampled_from(FIELDS), st.sampled_from([None, *FIELDS]), JSON)


def place(spec: dict[str, Any], member: tuple[str, str | None, Any]) -> dict[str, Any]:
    """The spec with the drawn member written into it (the caller's dict is changed and returned)."""
    field, inner, value = member
    spec[field] = {inner: value} if inner is not None and not isinstance(value, list) else value
    return spec


def sample_members(count: int, seed_value: int) -> list[tuple[str, str | None, Any]]:
    """`count` spec members drawn from SPEC_MEMBER, the same ones for the same seed (no example database)."""
    drawn: list[tuple[str, str | None, Any]] = []

    @seed(seed_value)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(SPEC_MEMBER)
    def collect(member: tuple[str, str | None, Any]) -> None:
        drawn.append(member)

    collect()
    return drawn[:count]
