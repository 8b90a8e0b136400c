"""The one table of error types the gateway and the serving containers answer with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from levers9.gateway.upstream import MAX_REQUEST_BYTES
from levers9.runner.http_errors import ERROR_TYPES, TOO_LARGE, error_body
from levers9.runner.serving import MAX_BODY_BYTES
from levers9.services.errors import ERRORS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_type_is_snake_case_and_the_rest_apis_domain_types_keep_their_status() -> None:
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", kind) for kind in ERROR_TYPES), ERROR_TYPES
    for _, status, kind in ERRORS:  # the REST API's domain errors, which the gateway passes on
        assert ERROR_TYPES.get(kind) == status, kind


def test_a_type_outside_the_table_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown error type 'InvalidJSON'"):
        error_body("InvalidJSON", "an older name")
    assert error_body("invalid_json", "not JSON") == b'{"error": {"type": "invalid_json", "message": "not JSON"}}'


def test_the_readme_states_the_gateways_body_cap_and_its_answer() -> None:
    """The README's 1 GiB payloads are the SDK's; what it says of plain HTTP is the gateway's own cap and status."""
    text = " ".join(README.read_text().split())
    stated = re.search(
        r"request body over (\d+) MiB is answered `(\d{3})` with `\{\"error\": \{\"type\": \"(\w+)\"", text
    )
    assert stated, "README.md no longer states the gateway's HTTP body cap"
    mib, status, kind = int(stated[1]), int(stated[2]), stated[3]
    assert mib * 1024 * 1024 == MAX_REQUEST_BYTES == MAX_BODY_BYTES  # the container's own cap is the same
    assert (kind, status) == (TOO_LARGE, ERROR_TYPES[TOO_LARGE])
