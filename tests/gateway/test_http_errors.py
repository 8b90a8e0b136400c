"""The one table of error types the gateway and the serving containers answer with."""

from __future__ import annotations

import re

import pytest

from levers9.runner.http_errors import ERROR_TYPES, error_body
from levers9.services.errors import ERRORS


def test_every_type_is_snake_case_and_the_rest_apis_domain_types_keep_their_status() -> None:
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", kind) for kind in ERROR_TYPES), ERROR_TYPES
    for _, status, kind in ERRORS:  # the REST API's domain errors, which the gateway passes on
        assert ERROR_TYPES.get(kind) == status, kind


def test_a_type_outside_the_table_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown error type 'InvalidJSON'"):
        error_body("InvalidJSON", "an older name")
    assert error_body("invalid_json", "not JSON") == b'{"error": {"type": "invalid_json", "message": "not JSON"}}'
