"""skaffold.yaml: valid against skaffold's own v4beta14 JSON schema (check-jsonschema), and pointing at real
Dockerfiles, the chart's real values and dev models the CRD accepts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from devtools.helm import CRD_SOURCE, REPO, Helm

SKAFFOLD = REPO / "skaffold.yaml"
CHECK_JSONSCHEMA = str(Path(sys.executable).parent / "check-jsonschema")


def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(SKAFFOLD.read_text())
    return loaded


def check(schema: Path, document: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHECK_JSONSCHEMA, "--schemafile", str(schema), str(document)], capture_output=True, text=True, timeout=60
    )


def test_valid_against_the_v4beta14_schema(skaffold_schema: Path) -> None:
    assert config()["apiVersion"] == "skaffold/v4beta14"
    done = check(skaffold_schema, SKAFFOLD)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_catches_a_typo(skaffold_schema: Path, tmp_path: Path) -> None:
    broken = config()
    broken["deploy"]["helm"]["releases"][0]["chartPth"] = broken["deploy"]["helm"]["releases"][0].pop("chartPath")
    path = tmp_path / "skaffold.yaml"
    path.write_text(yaml.safe_dump(broken))
    done = check(skaffold_schema, path)
    assert done.returncode != 0
    assert "chartPth" in done.stdout


def test_builds_both_images_from_their_dockerfiles() -> None:
    artifacts = {a["image"]: a for a in config()["build"]["artifacts"]}
    assert set(artifacts) == {"ghcr.io/skiff-dev/skiff-operator", "ghcr.io/skiff-dev/skiff-runtime"}
    for artifact in artifacts.values():
        assert (REPO / artifact["context"] / artifact["docker"]["dockerfile"]).is_file()


def test_deploys_the_chart_with_the_built_operator_image(helm: Helm) -> None:
    release = config()["deploy"]["helm"]["releases"][0]
    assert (REPO / release["chartPath"] / "Chart.yaml").is_file()
    templates = release["setValueTemplates"]
    assert templates["image.repository"] == "{{.IMAGE_REPO_ghcr_io_skiff_dev_skiff_operator}}"
    assert templates["image.tag"] == "{{.IMAGE_TAG_ghcr_io_skiff_dev_skiff_operator}}"
    # Every key is a value the chart's schema accepts (it rejects unknown keys).
    rendered = helm.template(
        *(f'{key}="{"DEBUG" if key.endswith("logLevel") else "x"}"' for key in templates if key != "image.pullPolicy")
    )
    assert 'image: "x:x"' in rendered


RUNTIME_DOCKERFILES = {"cpu": "runtime/Dockerfile", "gpu": "runtime/Dockerfile.gpu"}


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_profiles_select_the_runtime_dockerfile_and_a_dev_model(profile: str) -> None:
    found = {p["name"]: p for p in config()["profiles"]}[profile]
    runtime_index = [a["image"] for a in config()["build"]["artifacts"]].index("ghcr.io/skiff-dev/skiff-runtime")
    assert found["patches"] == [
        {
            "op": "replace",
            "path": f"/build/artifacts/{runtime_index}/docker/dockerfile",
            "value": RUNTIME_DOCKERFILES[profile],
        }
    ]
    assert (REPO / RUNTIME_DOCKERFILES[profile]).is_file()
    (model_file,) = found["manifests"]["rawYaml"]
    assert_dev_model(model_file, gpu=profile == "gpu")


def assert_dev_model(model_file: str, *, gpu: bool) -> None:
    model = yaml.safe_load((REPO / model_file).read_text())
    # skaffold rewrites the runtime image in InferenceModels (resourceSelector) to the tag it built.
    assert model["spec"]["runtime"]["image"] == "ghcr.io/skiff-dev/skiff-runtime"
    allow = config()["resourceSelector"]["allow"]
    assert {
        "groupKind": "InferenceModel.skiff.dev",
        "image": [".spec.runtime.image", ".spec.versions.*.image"],
    } in allow
    schema = yaml.safe_load(CRD_SOURCE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.validate(model, schema)
    assert (int(model["spec"]["resources"].get("gpu", 0)) > 0) == gpu


def test_the_docker_builder_is_the_default_and_builds_the_gpu_runtime() -> None:
    artifacts = {a["image"]: a for a in config()["build"]["artifacts"]}
    assert all("docker" in a for a in artifacts.values())
    assert artifacts["ghcr.io/skiff-dev/skiff-runtime"]["docker"]["dockerfile"] == "runtime/Dockerfile.gpu"


def test_buildah_profile_builds_both_images_with_the_image_script_and_pushes() -> None:
    """No Docker: skaffold's custom builder runs scripts/images.sh (as `make images` does), which must push."""
    found = {p["name"]: p for p in config()["profiles"]}["buildah"]
    assert found["build"]["local"]["push"] is True
    artifacts = {a["image"]: a for a in found["build"]["artifacts"]}
    assert set(artifacts) == {a["image"] for a in config()["build"]["artifacts"]}
    dockerfiles = {
        "ghcr.io/skiff-dev/skiff-operator": "operator/Dockerfile",
        "ghcr.io/skiff-dev/skiff-runtime": "runtime/Dockerfile",
    }
    for image, artifact in artifacts.items():
        assert artifact["custom"]["buildCommand"] == "bash scripts/images.sh skaffold"
        # skaffold watches what the Dockerfile copies, the same inputs the script hashes.
        assert artifact["custom"]["dependencies"] == {"dockerfile": {"path": dockerfiles[image]}}
        assert (REPO / artifact["context"] / dockerfiles[image]).is_file()
    script = (REPO / "scripts" / "images.sh").read_text()
    assert "skaffold) skaffold_build ;;" in script
    assert '"${PUSH_IMAGE:-false}" == true' in script
    (model_file,) = found["manifests"]["rawYaml"]
    assert_dev_model(model_file, gpu=False)
