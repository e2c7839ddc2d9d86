"""The BackendTLSPolicies and their CA ConfigMap: one policy per routed version Service, verifying against the
model's CA for a name every Skiff certificate carries, valid against the vendored Gateway API CRD."""

from __future__ import annotations

import jsonschema
import pytest
import yaml
from devtools.vendor import gateway_api_crd

from skiff_operator.render.backend_tls import render_backend_ca_config_map, render_backend_tls_policies
from skiff_operator.spec import InferenceModel, parse_inference_model
from skiff_operator.tls import tls_dns_names
from tests.conftest import stored_body

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture
def model() -> InferenceModel:
    body = stored_body(
        {
            "apiVersion": "skiff.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": "fraud", "namespace": "ml"},
            "spec": {
                "versions": [
                    {"name": "v1", "modelUri": "pvc://models/a"},
                    {"name": "v2", "modelUri": "pvc://models/b"},
                ],
                "traffic": [{"version": "v1", "percent": 90}, {"version": "v2", "percent": 10}],
                "tls": {"mode": "SelfSigned"},
                "routing": {"gateways": [{"name": "public"}]},
            },
        }
    )
    return parse_inference_model(body)


def test_one_policy_per_routed_version_targets_its_grpc_port(model: InferenceModel) -> None:
    policies = render_backend_tls_policies(model, {"v2": 10, "v1": 90, "old": 0})
    assert [p["metadata"]["name"] for p in policies] == ["fraud-old", "fraud-v1", "fraud-v2"]
    assert [p["metadata"]["labels"]["skiff.dev/version"] for p in policies] == ["old", "v1", "v2"]
    v1 = policies[1]
    assert v1["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert v1["metadata"]["ownerReferences"][0]["controller"] is True
    assert v1["spec"]["targetRefs"] == [{"group": "", "kind": "Service", "name": "fraud-v1", "sectionName": "grpc"}]
    assert v1["spec"]["validation"] == {
        "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "fraud-backend-ca"}],
        "hostname": "fraud-v1.ml.svc",
    }


def test_the_hostname_is_a_name_in_the_certificate(model: InferenceModel) -> None:
    sans = set(tls_dns_names(model))
    for policy in render_backend_tls_policies(model, {"v1": 90, "v2": 10}):
        assert policy["spec"]["validation"]["hostname"] in sans


def test_the_config_map_holds_the_ca_bundle_only(model: InferenceModel) -> None:
    config_map = render_backend_ca_config_map(model, CA)
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["name"] == "fraud-backend-ca"
    assert config_map["data"] == {"ca.crt": CA.decode()}


def test_policies_validate_against_the_gateway_api_schema(model: InferenceModel) -> None:
    crd = yaml.safe_load(gateway_api_crd("backendtlspolicies").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    assert version["served"] is True
    for policy in render_backend_tls_policies(model, {"v1": 90, "v2": 10}):
        jsonschema.validate(policy, version["schema"]["openAPIV3Schema"])
