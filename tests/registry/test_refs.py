"""Image refs that name a registry: what parse_ref accepts, and how it refuses the rest (no Docker Hub)."""

from __future__ import annotations

import pytest

from levers9.registry.errors import InvalidRefError
from levers9.registry.refs import ImageRef, parse_ref

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("127.0.0.1:5000/app:v1", ImageRef("127.0.0.1:5000", "app", "v1", None)),
        (f"127.0.0.1:5000/team/app@{DIGEST}", ImageRef("127.0.0.1:5000", "team/app", None, DIGEST)),
        (f"ghcr.io/o/r/name:tag@{DIGEST}", ImageRef("ghcr.io", "o/r/name", "tag", DIGEST)),
        ("localhost/a.b_c__d-e", ImageRef("localhost", "a.b_c__d-e", None, None)),
        ("[::1]:5000/x:1", ImageRef("[::1]:5000", "x", "1", None)),
        ("Registry.Example:443/app", ImageRef("Registry.Example:443", "app", None, None)),
    ],
)
def test_refs_that_name_a_registry_are_split(ref: str, expected: ImageRef) -> None:
    assert parse_ref(ref) == expected
    assert str(parse_ref(ref)) == ref
    assert parse_ref(ref).reference == (expected.digest or expected.tag or "latest")


@pytest.mark.parametrize("ref", ["python:3.11", "library/debian", "debian", "team/app:v1", f"app@{DIGEST}"])
def test_a_ref_without_a_registry_host_is_refused_never_sent_to_docker_hub(ref: str) -> None:
    with pytest.raises(InvalidRefError, match=r"names no registry host.*never pulls from Docker Hub"):
        parse_ref(ref)


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("", "empty image ref"),
        ("127.0.0.1:5000/App:v1", "not a valid repository name"),
        ("127.0.0.1:5000/app:-bad", "tag '-bad' is not valid"),
        ("127.0.0.1:5000/app@sha512:" + "a" * 128, "is not a sha256 digest"),
        ("127.0.0.1:5000/app@sha256:ABC", "is not a sha256 digest"),
        ("127.0.0.1:5000/a//b", "not a valid repository name"),
    ],
)
def test_malformed_refs_say_what_is_wrong_and_what_is_accepted(ref: str, says: str) -> None:
    with pytest.raises(InvalidRefError, match=says) as caught:
        parse_ref(ref)
    assert isinstance(caught.value, ValueError)
    assert "host[:port]/repository" in str(caught.value) or "sha256:<64" in str(caught.value)
