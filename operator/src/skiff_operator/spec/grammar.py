"""Kubernetes' grammars as the operator checks them: object and namespace names, quantities and durations."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from skiff_operator.conditions import Reason
from skiff_operator.errors import SpecError

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Kubernetes' own grammar for object names (DNS-1123 subdomain) and namespaces (DNS-1123 label); `fullmatch`
# only (Python's `$` also matches before a trailing newline).
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
MAX_OBJECT_NAME_LENGTH = 253  # a DNS-1123 subdomain: Secrets, claims, ConfigMaps, most objects
MAX_NAMESPACE_LENGTH = 63
_PVC_URI = re.compile(r"^pvc://(?P<claim>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)(?P<path>(/[^/]+)*)$")
# Fetched modelUris, as the fetch step (skiff_runtime.fetch.source) reads them; the CRD's CEL rules are the same.
_S3_URI = re.compile(r"s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?P<prefix>/[^?#]*)?")
_HTTPS_URI = re.compile(r"https://[^/?#@\s]+(/[^?#\s]*)?")
# The OCI distribution spec's reference grammar, as skiff_runtime.fetch.source.OCI_REFERENCE reads it.
_OCI_URI = re.compile(
    r"oci://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?"
    r"/[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}|@sha256:[0-9a-f]{64})"
)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_S3_ENDPOINT = re.compile(r"https?://[^/?#@\s]+/?")
_S3_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_DURATION = re.compile(r"^(?:(?P<h>[0-9]+)h)?(?:(?P<m>[0-9]+)m)?(?:(?P<s>[0-9]+)s)?$")
# Kubernetes' quantity grammar as its parser reads it (resource.ParseQuantity): an exponent is an integer.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
_BINARY_SI = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
MAX_QUANTITY_LENGTH = 64  # the CRD's maxLength: a quantity is a few characters
# The largest quantity Kubernetes holds without losing it: its milli-units must fit an int64 (MilliValue).
MAX_QUANTITY = Decimal(2**63 - 1) / 1000
# The deepest affinity the Pod API has (affinity > podAffinity > preferred... > [] > podAffinityTerm > labelSelector
# > matchExpressions > [] > values) is 9 containers; the CRD's typed schema cannot hold more.
MAX_AFFINITY_DEPTH = 9


def is_object_name(value: object) -> bool:
    """Whether `value` is a DNS-1123 subdomain of at most 253 characters, the name of a Secret or a claim: no '/',
    no '..', nothing that could move a request path out of its collection."""
    return (
        isinstance(value, str)
        and len(value) <= MAX_OBJECT_NAME_LENGTH
        and _DNS1123_SUBDOMAIN.fullmatch(value) is not None
    )


def is_namespace_name(value: object) -> bool:
    """Whether `value` is a DNS-1123 label of at most 63 characters, the name of a namespace."""
    return isinstance(value, str) and len(value) <= MAX_NAMESPACE_LENGTH and _DNS1123_LABEL.fullmatch(value) is not None


def parse_duration(value: Any, where: str) -> int:
    """'1h30m', '2m', '45s' -> seconds."""
    match = _DURATION.match(value) if isinstance(value, str) and value else None
    if match is None or not any(match.groups()):
        raise SpecError(Reason.INVALID_SPEC, f"{where} must be a duration such as 30s, 2m or 1h30m (got {value!r})")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def _shown(value: str, limit: int = 80) -> str:
    """A user's string for a message: quoted, and cut short (a message carries no tenant's novel)."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def parse_quantity(text: str, where: str) -> Decimal:
    """A Kubernetes quantity ("2", "500m", "2k", "1.5Gi", "1e3") as an exact number; SpecError when Kubernetes
    would refuse it, or it is negative or too large for Kubernetes to hold (MAX_QUANTITY)."""
    match = _QUANTITY.fullmatch(text) if len(text) <= MAX_QUANTITY_LENGTH else None
    if match is None:
        raise SpecError(Reason.INVALID_SPEC, f"{where} {_shown(text)} must be a quantity such as 2, 500m, 2k or 4Gi")
    if match["sign"] == "-":
        raise SpecError(Reason.INVALID_SPEC, f"{where} {_shown(text)} must not be negative")
    number = Decimal(match["number"])
    if match["binary"]:
        value = number * _BINARY_SI[match["binary"]]
    else:
        exponent = int(match["exponent"]) if match["exponent"] else _DECIMAL_SI.get(match["decimal"] or "", 0)
        # Decided on the exponent before any arithmetic: 1e999999999 costs nothing to refuse.
        if number and exponent + number.adjusted() > 19:
            raise SpecError(Reason.INVALID_SPEC, f"{where} {_shown(text)} is larger than Kubernetes can hold")
        value = number.scaleb(max(exponent, -30)) if number else Decimal(0)
    if value > MAX_QUANTITY:
        raise SpecError(Reason.INVALID_SPEC, f"{where} {_shown(text)} is larger than Kubernetes can hold")
    return value
