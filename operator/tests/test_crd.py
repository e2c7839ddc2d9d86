"""The CRD: structure, descriptions, CEL rules (evaluated with cel-python), examples valid, bad ones rejected."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from celpy import celtypes

from skiff_operator import kinds
from skiff_operator import spec as spec_module
from skiff_operator.spec import MAX_TASK_PATH, TASK_PATH, TASK_SUB_MODELS, OcrOptions, TaskName, parse_inference_model
from skiff_operator.spec.task import OCR_OPTIONS
from tests.conftest import crd_schema, example_paths, load_crd
from tests.fakes import defaulted

INVALID = yaml.safe_load((Path(__file__).parent / "invalid_examples.yaml").read_text())


# --- helpers: the parts of the API server's validation that Python can reproduce --------------------------


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every sub-schema with its path (items as [], map values as {})."""
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{key}" if path else key)
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def strict_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The structural schema as JSON Schema, rejecting unknown fields like kubectl's strict field validation."""
    result = copy.deepcopy(schema)
    for _, sub in walk(result):
        if "properties" in sub and not sub.get("x-kubernetes-preserve-unknown-fields"):
            sub.setdefault("additionalProperties", False)
    return result


def schema_errors(body: dict[str, Any]) -> list[jsonschema.ValidationError]:
    validator = jsonschema.Draft202012Validator(strict_json_schema(crd_schema()))
    return list(validator.iter_errors(body))


def cel_sum(values: celtypes.ListType) -> celtypes.IntType:
    """Kubernetes' CEL list library `sum()`, which cel-python lacks."""
    return celtypes.IntType(sum(int(value) for value in values))


def cel_is_sorted(values: celtypes.ListType) -> celtypes.BoolType:
    """Kubernetes' CEL list library `isSorted()`, which cel-python lacks."""
    items = list(values)
    return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(items)))


@cache
def cel_program(rule: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule), functions={"sum": cel_sum, "isSorted": cel_is_sorted})


def cel_failures(schema: dict[str, Any], value: Any) -> list[str]:
    """Messages of every x-kubernetes-validations rule that `value` (already defaulted) breaks."""
    failures = [
        rule["message"]
        for rule in schema.get("x-kubernetes-validations", [])
        if not bool(cel_program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)}))
    ]
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                failures += cel_failures(sub, value[key])
    if isinstance(value, list) and "items" in schema:
        for item in value:
            failures += cel_failures(schema["items"], item)
    return failures


def all_rules() -> list[dict[str, str]]:
    return [rule for _, sub in walk(crd_schema()) for rule in sub.get("x-kubernetes-validations", [])]


def error_field(error: jsonschema.ValidationError) -> str:
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    if error.validator == "required":
        missing = re.search(r"'([^']+)' is a required property", error.message)
        assert missing
        path += f".{missing.group(1)}"
    return path


# --- the CRD's shape ----------------------------------------------------------------------------------------


def test_crd_identity() -> None:
    crd = load_crd()
    assert crd["metadata"]["name"] == "inferencemodels.skiff.dev"
    assert crd["spec"]["group"] == kinds.GROUP
    assert crd["spec"]["scope"] == "Namespaced"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (kinds.KIND, kinds.PLURAL, ["im"])
    (version,) = crd["spec"]["versions"]
    assert version["name"] == kinds.VERSION
    assert version["served"] is True
    assert version["storage"] is True
    assert version["subresources"] == {"status": {}}


def test_every_field_has_a_description() -> None:
    missing = [path for path, sub in walk(crd_schema()) if path and not sub.get("description")]
    assert missing == ["metadata"]  # kubectl explain takes it from ObjectMeta


def test_root_metadata_schema_is_only_type_object() -> None:
    # The API server rejects a CRD whose root metadata schema says anything else (even a description).
    assert crd_schema()["properties"]["metadata"] == {"type": "object"}


def test_printer_columns_read_existing_status_fields() -> None:
    columns = load_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    default_columns = [c["name"] for c in columns if c.get("priority", 0) == 0]
    assert default_columns == ["Ready", "Versions", "Traffic", "Rollout", "Routing", "GPUs", "TLS", "Age"]
    status_fields = set(crd_schema()["properties"]["status"]["properties"])
    for column in columns:
        field = column["jsonPath"].split(".")[2].split("[")[0] if column["jsonPath"].startswith(".status") else None
        assert field is None or field in status_fields, column


def test_schema_is_structural() -> None:
    """The API server's structural rules that Python can check: a type everywhere, int-or-string done right."""
    for path, sub in walk(crd_schema()):
        if sub.get("x-kubernetes-int-or-string"):
            assert "type" not in sub, path
            assert sub["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert sub.get("type") in {"object", "array", "string", "integer", "boolean", "number"}, path
        assert not ("properties" in sub and "additionalProperties" in sub), path
        if sub.get("type") == "array":
            assert "items" in sub, path


def test_defaults_are_valid_for_their_schema() -> None:
    defaults = [(path, sub) for path, sub in walk(crd_schema()) if "default" in sub]
    assert len(defaults) >= 10
    for _, sub in defaults:
        jsonschema.validate(sub["default"], strict_json_schema(sub))


def test_arrays_and_strings_are_bounded_for_cel_cost() -> None:
    spec_schema = crd_schema()["properties"]["spec"]
    for path, sub in walk(spec_schema, "spec"):
        if sub.get("type") == "array":
            assert "maxItems" in sub, path
        if sub.get("type") == "string":
            assert "maxLength" in sub or "enum" in sub, path
        if sub.get("type") == "object" and "additionalProperties" in sub:
            assert "maxProperties" in sub, path


def test_every_cel_rule_compiles_and_has_a_message() -> None:
    rules = all_rules()
    assert len(rules) >= 10
    for rule in rules:
        cel_program(rule["rule"])
        assert rule["message"]
        assert not rule["message"].endswith(".")


def test_crd_defaults_match_the_parser_defaults() -> None:
    raw = {
        "metadata": {"name": "demo", "namespace": "ml"},
        "spec": {"versions": [{"name": "v1", "modelUri": "pvc://m"}]},
    }
    assert parse_inference_model(raw) == parse_inference_model(defaulted(raw))
    properties = crd_schema()["properties"]["spec"]["properties"]
    # No image default in the CRD: the operator's --default-runtime-image fills it (the image the chart installed).
    assert "default" not in properties["runtime"]["properties"]["image"]
    assert properties["resources"]["properties"]["gpuResourceName"]["default"] == spec_module.DEFAULT_GPU_RESOURCE


# --- examples -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", example_paths(), ids=lambda p: p.stem)
def test_example_is_valid(example: Path) -> None:
    body = defaulted(yaml.safe_load(example.read_text()))
    assert [e.message for e in schema_errors(body)] == []
    assert cel_failures(crd_schema(), body) == []
    parse_inference_model(body)


def test_there_are_at_least_ten_invalid_examples() -> None:
    assert len(INVALID) >= 10
    assert len({case["id"] for case in INVALID}) == len(INVALID)
    assert {case["check"] for case in INVALID} == {"cel", "schema"}


@pytest.mark.parametrize("case", [c for c in INVALID if c["check"] == "cel"], ids=lambda c: c["id"])
def test_invalid_example_fails_its_cel_rule(case: dict[str, Any]) -> None:
    assert case["message"] in {rule["message"] for rule in all_rules()}
    body = defaulted(case["object"])
    assert [e.message for e in schema_errors(body)] == [], "should pass the schema and fail only CEL"
    assert case["message"] in cel_failures(crd_schema(), body)


@pytest.mark.parametrize("case", [c for c in INVALID if c["check"] == "schema"], ids=lambda c: c["id"])
def test_invalid_example_fails_its_schema_check(case: dict[str, Any]) -> None:
    errors = schema_errors(defaulted(case["object"]))
    assert (case["field"], case["validator"]) in {(error_field(e), e.validator) for e in errors}


@pytest.mark.parametrize(
    ("uri", "valid"),
    [
        ("pvc://models/resnet/v1", True),
        ("pvc://models", True),
        ("pvc://my.claim/a/b/c", True),
        ("pvc://models/a..b", True),
        ("pvc://models/../x", False),
        ("pvc://Models/x", False),
        ("pvc://models//x", False),
        ("pvc://models/x/", False),
        ("s3://b/k", False),
        ("s3://models/resnet/v1", True),
        ("s3://models", True),
        ("s3://Models/x", False),
        ("s3://models/a/../x", False),
        ("s3://models/a/./x", False),
        ("https://models.example/resnet/v1.tar.gz", True),
        ("https://models.example:8443/m.tgz", True),
        ("https://u:p@models.example/m.tgz", False),
        ("https://models.example/m.tgz?X-Amz-Signature=x", False),
        ("http://models.example/m.tgz", False),
        ("oci://ghcr.io/acme/m:1", True),
        ("oci://10.0.0.5:5000/models/sample-cnn:v1", True),
        ("oci://ghcr.io/acme/m@sha256:" + "a" * 64, True),
        ("oci://ghcr.io/acme/m", False),
        ("oci://ghcr.io/Acme/m:1", False),
        ("oci://u:p@ghcr.io/acme/m:1", False),
        ("oci://ghcr.io/acme/m@sha256:abc", False),
        ("oci://ghcr.io/acme/m:1?x", False),
        ("file:///models", False),
        ("packaged://pp-ocrv4", True),
        ("packaged://pp-ocrv5", False),
        ("packaged://", False),
    ],
)
def test_model_uri_rules_agree_with_the_parser(uri: str, valid: bool) -> None:
    schema = crd_schema()["properties"]["spec"]["properties"]["versions"]["items"]["properties"]["modelUri"]
    assert (cel_failures(schema, uri) == []) is valid
    if valid:
        spec_module.parse_model_uri(uri)
    else:
        with pytest.raises(spec_module.SpecError):
            spec_module.parse_model_uri(uri)


@pytest.mark.parametrize(
    ("resource", "valid"),
    [("nvidia.com/gpu", True), ("nvidia.com/mig-1g.10gb", True), ("amd.com/gpu", True), ("gpu", False), ("", False)],
)
def test_gpu_resource_name_rule(resource: str, valid: bool) -> None:
    schema = crd_schema()["properties"]["spec"]["properties"]["resources"]["properties"]["gpuResourceName"]
    assert (cel_failures(schema, resource) == []) is valid


def test_name_limits_keep_derived_names_within_63() -> None:
    body = defaulted(
        {
            "metadata": {"name": "a" * 42},
            "spec": {"versions": [{"name": "b" * 20, "modelUri": "pvc://m"}]},
        }
    )
    assert cel_failures(crd_schema(), body) == []
    assert schema_errors(body) == []
    body["metadata"]["name"] = "a" * 43
    assert cel_failures(crd_schema(), body) != []


# --- the shape a tenant can give a body ---------------------------------------------------------------------


def value_depth(schema: dict[str, Any]) -> int:
    """How many objects and lists deep a value this schema accepts can be (unbounded schemas have no answer)."""
    assert not schema.get("x-kubernetes-preserve-unknown-fields"), "an unbounded schema"
    children = [*schema.get("properties", {}).values()]
    if "items" in schema:
        children.append(schema["items"])
    if isinstance(schema.get("additionalProperties"), dict):
        children.append(schema["additionalProperties"])
    inner = max((value_depth(child) for child in children), default=0)
    return inner + 1 if schema.get("type") in {"object", "array"} else inner


def test_no_field_under_spec_preserves_unknown_fields() -> None:
    """An unknown field is refused (strict field validation) or pruned, never stored: no shape the operator
    has not read (a 1,500-deep document stopped every reconcile) reaches its watch."""
    spec = crd_schema()["properties"]["spec"]
    assert [path for path, sub in walk(spec, "spec") if "x-kubernetes-preserve-unknown-fields" in sub] == []
    assert value_depth(spec) <= 12  # spec > scheduling > affinity: the deepest path is the Pod API's own


def test_affinity_is_as_deep_as_the_pod_api_and_the_parser_allows() -> None:
    affinity = crd_schema()["properties"]["spec"]["properties"]["scheduling"]["properties"]["affinity"]
    assert value_depth(affinity) == spec_module.MAX_AFFINITY_DEPTH
    assert set(affinity["properties"]) == {"nodeAffinity", "podAffinity", "podAntiAffinity"}


def test_maps_and_quantities_a_tenant_writes_are_bounded() -> None:
    spec = crd_schema()["properties"]["spec"]
    for path, sub in walk(spec, "spec"):
        if sub.get("x-kubernetes-int-or-string"):
            assert sub.get("maxLength") == spec_module.MAX_QUANTITY_LENGTH, path
        if isinstance(sub.get("additionalProperties"), dict):  # keys have no schema: a CEL rule bounds them
            rules = [rule["rule"] for rule in sub.get("x-kubernetes-validations", [])]
            assert "self.all(k, size(k) <= 317)" in rules, path


AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100", "h100"]}],
                 "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]}
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}
        ],
    },
    "podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname",
             "namespaces": ["team-a"], "namespaceSelector": {"matchExpressions": [
                 {"key": "team", "operator": "In", "values": ["a"]}]}}
        ]
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"skiff.dev/model": "demo"}},
                                                "topologyKey": "kubernetes.io/hostname",
                                                "matchLabelKeys": ["pod-template-hash"]}}
        ]
    },
}  # fmt: skip


def _with_affinity(affinity: Any) -> dict[str, Any]:
    return defaulted(
        {
            "metadata": {"name": "demo"},
            "spec": {"versions": [{"name": "v1", "modelUri": "pvc://m"}], "scheduling": {"affinity": affinity}},
        }
    )


def test_the_pod_api_affinity_fields_are_accepted_and_passed_on() -> None:
    body = _with_affinity(AFFINITY)
    assert [e.message for e in schema_errors(body)] == []
    assert cel_failures(crd_schema(), body) == []
    affinity = parse_inference_model(body).spec.scheduling.affinity
    assert affinity is not None
    assert affinity.to_manifest() == AFFINITY


@pytest.mark.parametrize(
    "affinity",
    [
        {"nested": {"nested": {}}},  # unknown at the top
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"x": {}}]}}},
        {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "k", "x": [[[]]]}]}},
    ],
)
def test_affinity_fields_the_pod_api_lacks_are_refused(affinity: dict[str, Any]) -> None:
    errors = schema_errors(_with_affinity(affinity))
    assert "additionalProperties" in {e.validator for e in errors}


@pytest.mark.parametrize(
    ("path", "name"),
    [
        (("tls", "secretName"), "../../team-b/secrets/x"),
        (("tls", "clientCASecretName"), "../../team-b/secrets/x"),
        (("auth", "tokenSecretName"), "../../team-b/secrets/x"),
        (("tls", "secretName"), "x/../y"),
        (("tls", "secretName"), "UPPER"),
        (("scheduling", "runtimeClassName"), "a/b"),
        (("scheduling", "priorityClassName"), "a/b"),
    ],
)
def test_object_names_are_dns_names_in_the_crd_as_in_the_parser(path: tuple[str, str], name: str) -> None:
    """The CRD's pattern and the parser agree, and both take the allowed variant."""
    section, field = path
    schema = crd_schema()["properties"]["spec"]["properties"][section]["properties"][field]
    assert not re.fullmatch(schema["pattern"].strip("^$"), name)
    for good in ("team-a-tls", "team-a.tls.v2"):
        assert re.fullmatch(schema["pattern"].strip("^$"), good)


@pytest.mark.parametrize(
    ("quantity", "valid"),
    [("2k", True), ("500m", True), ("1.5Gi", True), ("1e3", True), ("+1", True), (".5", True), ("1.", True),
     ("-1", False), ("1e1.5", False), ("2K", False), ("1 ", False), ("", False)],
)  # fmt: skip
def test_the_quantity_pattern_agrees_with_the_parser(quantity: str, valid: bool) -> None:
    schema = crd_schema()["properties"]["spec"]["properties"]["resources"]["properties"]["cpu"]
    assert (re.fullmatch(schema["pattern"].strip("^$"), quantity) is not None) is valid
    if valid:
        spec_module.parse_quantity(quantity, "resources.cpu")
    else:
        with pytest.raises(spec_module.SpecError):
            spec_module.parse_quantity(quantity, "resources.cpu")


def test_the_task_options_bounds_are_the_parsers() -> None:
    """versions[].task.options: one CRD property per OcrOptions field, with the parser's type and bounds."""
    task = crd_schema()["properties"]["spec"]["properties"]["versions"]["items"]["properties"]["task"]
    options = task["properties"]["options"]["properties"]
    assert sorted(options) == sorted(bound.key for bound in OCR_OPTIONS.values())
    assert sorted(OCR_OPTIONS) == sorted(field.name for field in dataclasses.fields(OcrOptions))
    types = {bool: "boolean", int: "integer", float: "number"}
    for bound in OCR_OPTIONS.values():
        schema = options[bound.key]
        assert schema["type"] == types[bound.kind], bound.key
        assert (schema.get("minimum"), schema.get("maximum")) == (bound.minimum, bound.maximum), bound.key
    assert task["properties"]["name"]["enum"] == [t.value for t in TaskName]
    assert task["properties"]["models"]["required"] == list(TASK_SUB_MODELS[TaskName.OCR])
    for path in (task["properties"]["dictionary"], *task["properties"]["models"]["properties"].values()):
        assert path["maxLength"] == MAX_TASK_PATH
        assert path["pattern"] == f"^{TASK_PATH.pattern}$"


@pytest.mark.parametrize(
    ("path", "valid"),
    [("det", True), ("ocr/v4/det_infer", True), ("rec/keys.v1.txt", True), ("../det", False), ("/det", False),
     ("det/../x", False), (".hidden", False), ("det/", False), ("a" * 257, False)],
)  # fmt: skip
def test_task_paths_agree_with_the_parser(path: str, valid: bool) -> None:
    body = {"metadata": {"name": "ocr"}, "spec": {"versions": [
        {"name": "v1", "modelUri": "pvc://models/ocr", "task": {"name": "ocr", "dictionary": path}}]}}  # fmt: skip
    assert (schema_errors(defaulted(body)) == []) is valid
    if valid:
        assert parse_inference_model(body).spec.versions[0].task.dictionary == path  # type: ignore[union-attr]
    else:
        with pytest.raises(spec_module.SpecError, match="relative path inside the version's model directory"):
            parse_inference_model(body)
