"""handlers: the kopf settings, and which handlers the glue registers (read through a recorder of kopf.on, not
kopf's private registry)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kopf
import pytest

from skiff_operator.controller import OperatorOptions
from skiff_operator.handlers import build_registry, configure_settings
from skiff_operator.kinds import GROUP, PLURAL, VERSION

Handler = Callable[..., Any]


class RecordingOn:
    """Stands in for kopf.on: records every registration (the decorator, its arguments and the function) and
    registers nothing. A decorator the glue must not use (create, update, resume, timer, daemon, ...) fails."""

    def __init__(self) -> None:
        self.registered: list[tuple[str, tuple[Any, ...], dict[str, Any], Handler]] = []

    def _decorator(self, name: str) -> Callable[..., Callable[[Handler], Handler]]:
        def decorator(*args: Any, **kwargs: Any) -> Callable[[Handler], Handler]:
            def record(fn: Handler) -> Handler:
                kwargs.pop("registry", None)
                self.registered.append((name, args, kwargs, fn))
                return fn

            return record

        return decorator

    def __getattr__(self, name: str) -> Callable[..., Callable[[Handler], Handler]]:
        if name not in ("login", "startup", "cleanup", "event"):
            raise AssertionError(f"the glue registered kopf.on.{name}: only event handlers keep kopf stateless")
        return self._decorator(name)


def test_settings_are_tuned() -> None:
    settings = kopf.OperatorSettings()
    configure_settings(settings, OperatorOptions(watch_server_timeout_s=120))
    assert settings.watching.server_timeout == 120
    assert settings.watching.client_timeout is not None
    assert settings.watching.client_timeout > settings.watching.server_timeout
    assert settings.posting.level >= 30  # only warnings and errors become Events


def test_only_event_handlers_are_registered_and_one_watch_of_models() -> None:
    """Event handlers keep no state on the object: kopf writes no progress or diff-base annotations and adds
    no finalizer, so the operator's writes are its own (the children, the status, Events). No kopf watch of
    children or Secrets: kopf filters labels client-side, after listing every one; children have label-selected
    watches of their own (controller.watch_children_forever), and Secrets are read by name on each reconcile."""
    on = RecordingOn()
    build_registry(OperatorOptions(), on=on)
    assert sorted(name for name, *_ in on.registered) == ["cleanup", "event", "login", "startup"]
    (event,) = [(args, kwargs) for name, args, kwargs, _ in on.registered if name == "event"]
    assert event == ((GROUP, VERSION, PLURAL), {"id": "model"})


def test_the_recorder_refuses_a_stateful_handler() -> None:
    """The recorder's refusal is what the test above leans on: a create handler would fail it."""
    with pytest.raises(AssertionError, match=r"kopf\.on\.create"):
        RecordingOn().create(GROUP, VERSION, PLURAL)


def test_kopf_logs_in_like_the_api_client() -> None:
    """Without a login handler kopf cannot reach any API server (found by the e2e suite)."""
    on = RecordingOn()
    build_registry(OperatorOptions(), on=on)
    assert [fn for name, _, _, fn in on.registered if name == "login"] == [kopf.login_via_async_client]


def test_a_fresh_registry_each_time() -> None:
    first, second = build_registry(OperatorOptions()), build_registry(OperatorOptions())
    assert isinstance(first, kopf.OperatorRegistry)
    assert first is not second
