"""The process runtime's settings and report, and its warning that it isolates nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from pydantic import ValidationError

import levers9_process
from levers9.hooks.types import Isolation, RuntimeContext

Context = Callable[..., RuntimeContext]


def test_always_available_and_isolates_nothing(context: Context) -> None:
    report = levers9_process.levers9_runtime_capabilities(context("process"))
    assert report.available
    assert report.unavailable_reason is None
    assert report.isolation is Isolation.NONE
    assert report.gpu is True
    assert report.checkpoint is False
    assert report.checkpoint_reason == "the process runtime isolates nothing and cannot checkpoint"


def test_warns_once(context: Context, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(levers9_process, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="levers9.runtime.process"):
        for _ in range(3):
            levers9_process.levers9_runtime_capabilities(context("process"))
    warnings = [record for record in caplog.records if record.name == "levers9.runtime.process"]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "isolates nothing" in warnings[0].getMessage()


def test_settings_accept_nothing_unknown() -> None:
    assert levers9_process.levers9_runtime_settings() is levers9_process.ProcessSettings
    levers9_process.ProcessSettings.model_validate({})
    with pytest.raises(ValidationError):
        levers9_process.ProcessSettings.model_validate({"isolation": "namespaces"})
