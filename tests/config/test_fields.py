"""The shared building blocks of plugin settings models (:mod:`levers9.config.fields`)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from levers9.config import fields
from levers9.config.fields import EnvVarName, ImageRef, UniqueList, env_var_name, image_ref, pattern, unique

AWS_KEY_ID = re.compile(r"^(AKIA|ASIA)[A-Z0-9]{12,}$")

Zone = Annotated[str, pattern(r"[a-z]{2}-[a-z]+-[0-9][a-z]", "a zone", "eu-west-1a")]


class Settings(BaseModel):
    """A plugin's settings model, written the way the built-in providers write theirs."""

    model_config = ConfigDict(extra="forbid")

    zones: UniqueList[Zone] = Field(default_factory=list, description="Zones.")
    gpus: UniqueList[Annotated[int, Field(ge=0)]] | None = Field(None, description="GPU indices.")
    token_env: EnvVarName | None = Field(None, description="Variable holding a token.")
    key_id_env: Annotated[str, env_var_name(AWS_KEY_ID, "an access key")] | None = Field(
        None, description="Variable holding an access key id."
    )
    image: ImageRef | None = Field(None, description="Worker image.")


def errors(**data: Any) -> list[tuple[tuple[str | int, ...], str]]:
    with pytest.raises(ValidationError) as excinfo:
        Settings.model_validate(data)
    return [(tuple(error["loc"]), error["msg"]) for error in excinfo.value.errors()]


# --------------------------------------------------------------------------- unique


def test_unique_returns_the_list_unchanged() -> None:
    value = ["b", "a", "c"]
    assert unique(value) is value
    assert unique([]) == []


def test_unique_names_the_first_repeat() -> None:
    with pytest.raises(ValueError, match=r"^entries must not repeat: 'b'$"):
        unique(["a", "b", "b", "a"])
    with pytest.raises(ValueError, match=r"^entries must not repeat: 3$"):
        unique([1, 3, 2, 3])


def test_unique_compares_unhashable_entries_by_equality() -> None:
    assert unique([{"a": 1}, {"a": 2}]) == [{"a": 1}, {"a": 2}]
    with pytest.raises(ValueError, match=r"\{'a': 1\}"):
        unique([{"a": 1}, {"a": 1}])


def test_unique_list_in_a_model() -> None:
    assert Settings(zones=["eu-west-1a", "eu-west-1b"]).zones == ["eu-west-1a", "eu-west-1b"]
    assert errors(zones=["eu-west-1a", "eu-west-1a"]) == [
        (("zones",), "Value error, entries must not repeat: 'eu-west-1a'")
    ]
    assert errors(gpus=[0, 1, 0]) == [(("gpus",), "Value error, entries must not repeat: 0")]
    assert Settings(gpus=None).gpus is None


def test_unique_list_checks_each_entry_first() -> None:
    """A malformed entry is reported at its index, before any repeat of it is."""
    (loc, message), *_ = errors(zones=["eu-west", "eu-west"])
    assert loc == ("zones", 0)
    assert "is not a zone" in message
    assert errors(gpus=[-1])[0][0] == ("gpus", 0)


def test_unique_list_says_so_in_the_json_schema() -> None:
    properties = Settings.model_json_schema()["properties"]
    assert properties["zones"]["uniqueItems"] is True
    assert properties["zones"]["description"] == "Zones."
    gpus_array = next(option for option in properties["gpus"]["anyOf"] if option.get("type") == "array")
    assert gpus_array["uniqueItems"] is True


# --------------------------------------------------------------------------- pattern


@pytest.mark.parametrize("regex", [r"[a-z]+-[0-9]+", re.compile(r"^[a-z]+-[0-9]+$")])
def test_pattern_takes_a_string_or_a_compiled_regex(regex: str | re.Pattern[str]) -> None:
    check = pattern(regex, "a region", "us-1").func
    assert check("us-1") == "us-1"
    with pytest.raises(ValueError, match=r"^'US-1' is not a region \(for example 'us-1'\)$"):
        check("US-1")


@pytest.mark.parametrize("value", ["us-1\n", "us-1x", "_us-1"])
def test_pattern_matches_the_whole_value(value: str) -> None:
    """A trailing newline, a suffix or a prefix fails, even where ``$`` or ``match`` would let it through."""
    for regex in (r"[a-z]+-[0-9]+", r"^[a-z]+-[0-9]+$"):
        with pytest.raises(ValueError, match="is not a region"):
            pattern(regex, "a region", "us-1").func(value)


def test_pattern_in_a_model_reports_the_value_and_an_example() -> None:
    assert errors(zones=["EU-WEST-1A"]) == [
        (("zones", 0), "Value error, 'EU-WEST-1A' is not a zone (for example 'eu-west-1a')")
    ]


# --------------------------------------------------------------------------- env_var_name


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "_private", "lower_case", "X", "A1_2"])
def test_env_var_names_are_accepted(name: str) -> None:
    assert Settings(token_env=name).token_env == name
    assert Settings(key_id_env=name).key_id_env == name


@pytest.mark.parametrize(
    "value", ["1PASSWORD", "my key", "MY-KEY", "", "NAME\n", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"]
)
def test_other_values_are_refused_without_being_repeated(value: str) -> None:
    [(loc, message)] = errors(token_env=value)
    assert loc == ("token_env",)
    assert "not an environment variable name" in message
    assert "not repeated here" in message
    if value.strip():
        assert value.strip() not in message


def test_a_pasted_secret_is_recognised_and_not_repeated() -> None:
    """An access key id is a valid variable name by syntax; ``secret_looks_like`` is what catches it."""
    key = "AKIAIOSFODNN7EXAMPLE"
    assert Settings(token_env=key).token_env == key  # EnvVarName alone cannot tell
    [(loc, message)] = errors(key_id_env=key)
    assert loc == ("key_id_env",)
    assert message == (
        "Value error, this looks like an access key itself; give the NAME of the environment variable that holds it"
    )
    assert key not in message


def test_secret_looks_like_is_searched_and_may_be_a_string() -> None:
    check = env_var_name("secret_", "a Lambda API key").func
    assert check("LAMBDA_API_KEY") == "LAMBDA_API_KEY"
    with pytest.raises(ValueError, match="looks like a Lambda API key itself"):
        check("secret_ops_0123")
    with pytest.raises(ValueError, match="looks like a Lambda API key itself"):
        check("MY_secret_KEY")  # unanchored: found anywhere
    with pytest.raises(ValueError, match="looks like a secret itself"):  # the default word
        env_var_name(r"^tok_").func("tok_1")


# --------------------------------------------------------------------------- image references


@pytest.mark.parametrize(
    "image",
    [
        "worker",
        "levers9/worker:0.1.0",
        "registry.example.com/levers9/worker:0.1.0",
        "localhost:5000/levers9/worker:dev",
        "ghcr.io/levers9/worker@sha256:" + "a" * 64,
        "ghcr.io/levers9/worker:1.0@sha256:" + "0" * 64,
    ],
)
def test_image_references_are_accepted(image: str) -> None:
    assert image_ref(image) == image
    assert Settings(image=image).image == image


@pytest.mark.parametrize(
    "image",
    ["Not An Image", "levers9/Worker", "worker:", "worker@sha256:abc", "worker:0.1.0\n", "-worker"],
)
def test_malformed_image_references_are_refused(image: str) -> None:
    [(loc, message)] = errors(image=image)
    assert loc == ("image",)
    assert message == (
        f"Value error, {image!r} is not a container image reference like 'registry.example.com/levers9/worker:0.1.0'"
    )


# --------------------------------------------------------------------------- the module itself


def test_fields_imports_only_the_standard_library_and_pydantic() -> None:
    """Plugins import this module when they load, so it must not pull in an SDK or the server."""
    tree = ast.parse(Path(fields.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports: they would reach into levers9"
            assert node.module
            imported.add(node.module.partition(".")[0])
    assert imported - {"pydantic"} <= set(sys.stdlib_module_names)
