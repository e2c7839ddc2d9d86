"""The task extension point: run_task drives a task's steps with engines, and refuses a task it cannot serve."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from skiff_runtime.errors import InferenceFailed, InvalidInput, ModelLoadError
from skiff_runtime.tasks.task import Engine, ModelCall, Steps, TaskInputError, run_task, run_together
from skiff_runtime.tensors import Array


class Doubler:
    """Calls `twice` then `plus1` on its input: outputs x * 2 + 1, and how many calls it made."""

    name = "doubler"
    models = ("twice", "plus1")

    def steps(self, inputs: Mapping[str, Array]) -> Steps:
        if "x" not in inputs:
            raise TaskInputError("send x")
        doubled = yield ModelCall("twice", {"in": inputs["x"]})
        done = yield ModelCall("plus1", {"in": doubled["out"]})
        return {"y": done["out"]}


class Stray(Doubler):
    name = "stray"

    def steps(self, inputs: Mapping[str, Array]) -> Steps:
        yield ModelCall("elsewhere", dict(inputs))
        return {}


def engines(calls: list[str], sizes: list[int] | None = None) -> dict[str, Engine]:
    def twice(inputs: Mapping[str, Array]) -> dict[str, Array]:
        calls.append("twice")
        if sizes is not None:
            sizes.append(len(inputs["in"]))
        return {"out": inputs["in"] * 2}

    def plus1(inputs: Mapping[str, Array]) -> dict[str, Array]:
        calls.append("plus1")
        return {"out": inputs["in"] + 1}

    return {"twice": twice, "plus1": plus1}


def test_run_task_sends_each_call_its_engines_outputs() -> None:
    calls: list[str] = []
    out = run_task(Doubler(), {"x": np.array([1.0, 5.0], np.float32)}, engines(calls))
    np.testing.assert_array_equal(out["y"], [3.0, 11.0])
    assert calls == ["twice", "plus1"]


def test_refused_input_runs_no_engine() -> None:
    calls: list[str] = []
    with pytest.raises(TaskInputError, match="send x"):
        run_task(Doubler(), {"z": np.zeros(1)}, engines(calls))
    assert calls == []


def test_a_task_input_error_is_invalid_input_and_a_value_error() -> None:
    assert issubclass(TaskInputError, InvalidInput)  # every transport maps it to INVALID_ARGUMENT
    assert issubclass(TaskInputError, ValueError)


def test_a_missing_engine_is_refused_before_the_task_runs() -> None:
    calls: list[str] = []
    partial = {"twice": engines(calls)["twice"]}
    with pytest.raises(ModelLoadError, match=r"no engine for \['plus1'\]"):
        run_task(Doubler(), {"x": np.zeros(1)}, partial)
    assert calls == []


def test_a_call_to_a_sub_model_the_task_does_not_name_fails() -> None:
    with pytest.raises(InferenceFailed, match="'elsewhere'"):
        run_task(Stray(), {"x": np.zeros(1)}, engines([]))


def test_run_together_merges_calls_of_one_shape_and_keeps_each_requests_rows() -> None:
    calls: list[str] = []
    sizes: list[int] = []
    requests = [
        {"x": np.array([1.0, 2.0], np.float32)},
        {"z": np.zeros(1, np.float32)},  # refused: its neighbours still run
        {"x": np.array([10.0], np.float32)},
        {"x": np.array([[1.0, 1.0]], np.float32)},  # another shape past the batch axis: its own call
    ]
    first, refused, third, other = run_together(Doubler(), requests, engines(calls, sizes))
    assert isinstance(refused, TaskInputError)
    assert isinstance(first, dict)
    assert isinstance(third, dict)
    assert isinstance(other, dict)
    np.testing.assert_array_equal(first["y"], [3.0, 5.0])
    np.testing.assert_array_equal(third["y"], [21.0])
    np.testing.assert_array_equal(other["y"], [[3.0, 3.0]])
    assert sorted(sizes) == [1, 3]  # the two 1-D requests shared one call of 3 rows
    assert calls.count("twice") == 2


def test_run_together_splits_merged_calls_at_max_batch() -> None:
    sizes: list[int] = []
    requests = [{"x": np.array([float(i)], np.float32)} for i in range(5)]
    outcomes = run_together(Doubler(), requests, engines([], sizes), max_batch=2)
    assert sizes == [2, 2, 1]
    assert [float(o["y"][0]) for o in outcomes if isinstance(o, dict)] == [1.0, 3.0, 5.0, 7.0, 9.0]


def test_run_together_runs_a_sub_model_named_alone_once_per_request_and_merges_the_rest() -> None:
    calls: list[str] = []
    sizes: list[int] = []
    requests = [{"x": np.array([float(i)], np.float32)} for i in range(3)]
    outcomes = run_together(Doubler(), requests, engines(calls, sizes), alone=("twice",))
    assert sizes == [1, 1, 1]  # "twice" ran each request's call by itself
    assert calls.count("plus1") == 1  # "plus1" still merged the three requests' calls
    assert [float(o["y"][0]) for o in outcomes if isinstance(o, dict)] == [1.0, 3.0, 5.0]
