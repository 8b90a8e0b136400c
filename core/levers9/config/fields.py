"""Building blocks for the settings models of provider plugins.

Every provider validates the same few kinds of value: the names of environment
variables that hold a credential, identifiers with a fixed syntax, lists whose
entries must be distinct, container images. Writing those rules once keeps the
messages an operator reads the same from one provider to the next, and spares a
plugin author (built-in or third-party) from re-deriving them, in particular the
rule that a credential pasted by mistake is never echoed into an error message,
since those end up in logs and terminals.

A plugin uses them inside ``Annotated``::

    from levers9.config.fields import EnvVarName, UniqueList, pattern

    Zone = Annotated[str, pattern(r"[a-z]{2}-[a-z]+-[0-9][a-z]", "a zone", "eu-west-1a")]

    class MySettings(BaseModel):
        zones: UniqueList[Zone] = Field(default_factory=list, description="...")
        api_key_env: EnvVarName = Field("MY_API_KEY", description="...")

This module imports only the standard library and pydantic, because plugins
import it when they load and must stay free of SDKs and of the server.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, Field, ValidationInfo

__all__ = [
    "ENV_VAR_NAME",
    "IMAGE_REF",
    "EnvVarName",
    "ImageRef",
    "Port",
    "UniqueList",
    "env_var_name",
    "image_ref",
    "pattern",
    "unique",
]

T = TypeVar("T")

#: what a POSIX shell accepts as a variable name
ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: a container image reference: ``[registry[:port]/]path[:tag][@sha256:digest]``, close to the grammar Docker parses
IMAGE_REF = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@sha256:[a-f0-9]{64})?"
)


def unique(value: list[T]) -> list[T]:
    """Refuse a list that holds the same entry twice.

    A repeat in config is nearly always a copy-and-paste slip where another
    entry was meant, so it is refused rather than quietly dropped, and the
    first repeat is named so it can be found in a long list. Entries are
    compared by equality, not hashed, so lists of unhashable values work too;
    lists in config are short enough for that.
    """
    for index, item in enumerate(value):
        if item in value[:index]:
            raise ValueError(f"entries must not repeat: {item!r}")
    return value


#: a list whose entries must be distinct; ``UniqueList[Region]`` validates each entry as a ``Region`` first.
#: The JSON schema says ``uniqueItems`` so editors flag a repeat before levers9 does.
UniqueList = Annotated[list[T], AfterValidator(unique), Field(json_schema_extra={"uniqueItems": True})]


def pattern(regex: re.Pattern[str] | str, what: str, example: str) -> AfterValidator:
    """Accept only strings that match ``regex`` as a whole.

    The error names the value, what was expected and one valid example, since
    an operator fixing a config needs a model to copy far more than a regular
    expression to decode. The whole string must match (``fullmatch``): with
    ``match`` and a ``$`` anchor, a value with a trailing newline (easy to get
    from a YAML block scalar) would pass. The value is repeated in the message,
    so do not use this for anything that may be a credential; see
    :func:`env_var_name`.
    """
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if compiled.fullmatch(value) is None:
            raise ValueError(f"{value!r} is not {what} (for example {example!r})")
        return value

    return AfterValidator(check)


def env_var_name(secret_looks_like: re.Pattern[str] | str | None = None, what: str = "a secret") -> AfterValidator:
    """Accept the name of an environment variable, for settings that point at a credential.

    Credentials are never values in levers9 config, only references to where
    they are kept, so the usual mistake is pasting the credential itself where
    its variable's name belongs. ``secret_looks_like`` (searched, so anchor it
    as needed) recognises that mistake for credentials with a recognisable
    form, such as AWS access key ids, which are otherwise valid variable names;
    ``what`` names such a credential in the error, e.g. ``"an access key"``.
    Neither error repeats the value: it may be the secret.
    """
    secret = re.compile(secret_looks_like) if secret_looks_like is not None else None

    def check(value: str) -> str:
        if secret is not None and secret.search(value):
            raise ValueError(f"this looks like {what} itself; give the NAME of the environment variable that holds it")
        if ENV_VAR_NAME.fullmatch(value) is None:
            raise ValueError(
                "not an environment variable name (letters, digits and _, not starting with a digit); give the "
                "variable's name, not its value, which is not repeated here"
            )
        return value

    return AfterValidator(check)


#: the name of an environment variable (holding a credential), for credentials with no recognisable form
EnvVarName = Annotated[str, env_var_name()]


def image_ref(value: str) -> str:
    """Accept a container image reference that a registry and Docker would accept.

    A malformed reference would otherwise be found only when a worker fails to
    pull its image, long after the config was loaded and far from it.
    """
    if IMAGE_REF.fullmatch(value) is None:
        raise ValueError(
            f"{value!r} is not a container image reference like 'registry.example.com/levers9/worker:0.1.0'"
        )
    return value


#: a container image reference, for example ``registry.example.com/levers9/worker:0.1.0``
ImageRef = Annotated[str, AfterValidator(image_ref)]

#: a TCP port number
Port = Annotated[int, Field(ge=1, le=65535)]


# --------------------------------------------------------------------------- a pool's regions, seen from provider settings
#
# A pool's ``region``/``regions`` is the single source of regions (provider settings have none). Config loading
# validates a pool's provider settings with the context ``{"pool": <name>, "regions": [...]}``, so a settings
# check that needs the regions (zones of a region, one region for a filesystem) reads them here. Without that
# context (a unit test, the JSON schema) those checks are skipped rather than guessed.


def context_regions(info: ValidationInfo) -> list[str] | None:
    """The pool's regions from the validation context config loading passes; None without that context."""
    context = info.context if isinstance(info.context, dict) else {}
    regions = context.get("regions")
    return [str(r) for r in regions] if isinstance(regions, list) else None


def pool_field(info: ValidationInfo, name: str) -> str:
    """``pools.<pool>.<name>``, with the pool's name when the validation context gives it."""
    context = info.context if isinstance(info.context, dict) else {}
    return f"pools.{context.get('pool') or '<name>'}.{name}"


#: the keys a provider's settings may never have: a pool's regions are pool fields
REGION_KEYS = ("region", "regions")


def region_moved(key: str, pool: str | None) -> str:
    """What an operator reads for ``settings.<key>`` (``region`` or ``regions``) of pool ``pool``, any provider's."""
    return (
        f"{key} moved: set pools.{pool or '<name>'}.region (or regions) instead; "
        "the pool's region is the single source every provider reads (docs/config.md, 'A pool')"
    )


def refuse_region_settings(data: Any, info: ValidationInfo) -> Any:
    """A ``model_validator(mode="before")`` body: ``region``/``regions`` in provider settings point to the pool.

    Config loading refuses those keys before any provider's model sees them (a third party's model, which
    forbids unknown keys, would say only ``unknown field``); this validator gives the same message when a
    built-in model is validated alone.
    """
    if isinstance(data, dict):
        moved = [key for key in REGION_KEYS if key in data]
        if moved:
            context = info.context if isinstance(info.context, dict) else {}
            raise ValueError(region_moved(moved[0], context.get("pool")))
    return data


def check_pool_regions(info: ValidationInfo, region: re.Pattern[str], what: str, example: str) -> None:
    """Each of the pool's regions must look like one of this provider's (``what``, for example ``example``)."""
    for name in context_regions(info) or []:
        if region.fullmatch(name) is None:
            raise ValueError(f"{pool_field(info, 'region')} {name!r} is not {what} (for example {example!r})")
