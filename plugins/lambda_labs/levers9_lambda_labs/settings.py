"""Pool settings of the ``lambda_labs`` provider (Lambda Cloud API v1).

The API key never appears in config: the pool names the environment variable
that holds it. Only pydantic, :mod:`levers9.config.fields` and
:mod:`levers9.clouds.settings` (whose ``CloudSettings`` holds the region rule
below, the same for every cloud) are imported; the hooks talk to the API with
httpx.

The regions are not a setting: a pool's ``region`` (or ``regions``) is the
single source (none: any region that reports capacity), and ``settings.regions``
is refused with a message that says so. What depends on them (a filesystem
lives in one region, so ``file_system_names`` needs exactly one; each region
must look like a Lambda region) is checked with the validation context config
loading passes (``{"pool": name, "regions": [...]}``); without it (a unit
test, the JSON schema) those checks are skipped.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, ConfigDict, Field, HttpUrl, ValidationInfo, field_validator

from levers9.clouds.settings import CloudSettings
from levers9.config.fields import UniqueList, context_regions, env_var_name, pattern, pool_field

#: Cloud API keys start with 'secret_'
_API_KEY = re.compile(r"^secret_")
#: us-east-1, us-west-3, us-south-1, europe-central-1, asia-northeast-1, me-west-1
_REGION = re.compile(r"^[a-z]+(-[a-z]+)*-[0-9]+$")
#: gpu_1x_a10, gpu_8x_h100_sxm5, gpu_1x_gh200
_INSTANCE_TYPE = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)+$")
#: names of SSH keys and filesystems as the Lambda console shows them
_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}


def _check_api_url(value: HttpUrl) -> HttpUrl:
    if value.scheme != "https" and value.host not in _LOCAL_HOSTS:
        raise ValueError("api_url must use https (plain http is accepted only for localhost, in tests)")
    if value.query or value.fragment:
        raise ValueError("api_url must not carry a query or fragment")
    return value


Name = Annotated[str, pattern(_RESOURCE_NAME, "a Lambda resource name", "my-key")]


InstanceType = Annotated[str, pattern(_INSTANCE_TYPE, "a Lambda instance type", "gpu_8x_h100_sxm5")]


class LambdaLabsSettings(CloudSettings):
    """Settings of a pool whose workers are Lambda Cloud on-demand instances."""

    model_config = ConfigDict(extra="forbid")
    region_form = (_REGION, "a Lambda region", "us-east-1")

    api_key_env: Annotated[str, env_var_name(_API_KEY, "a Lambda API key")] = Field(
        "LAMBDA_API_KEY",
        description="Name of the environment variable holding the Cloud API key (the name, never the key).",
    )
    api_url: Annotated[HttpUrl, AfterValidator(_check_api_url)] = Field(
        HttpUrl("https://cloud.lambda.ai/api/v1"),
        description="Base URL of the Cloud API. The older https://cloud.lambdalabs.com/api/v1 is deprecated "
        "and redirects; override only for tests.",
    )
    instance_types: UniqueList[InstanceType] = Field(
        default_factory=list,
        description="Restrict offers to these instance types, for example ['gpu_8x_h100_sxm5']; empty, every "
        "type whose GPUs match the pool.",
    )
    ssh_key_names: UniqueList[Name] = Field(
        min_length=1,
        max_length=1,
        description="Name of an SSH key already registered with Lambda. The launch API requires exactly one, "
        "even though workers are started by user data, not SSH.",
    )
    file_system_names: UniqueList[Name] = Field(
        default_factory=list,
        max_length=1,
        description="Persistent filesystem to attach (at most one at launch); it lives in one region, so the "
        "pool must name exactly that region.",
    )
    image_family: str | None = Field(
        None,
        min_length=1,
        description="Lambda image family to boot; left out, Lambda's default image (Lambda Stack).",
    )
    request_timeout_s: float = Field(30.0, gt=0, le=300, description="Timeout of each API request, in seconds.")

    @field_validator("file_system_names")
    @classmethod
    def _one_region(cls, value: list[str], info: ValidationInfo) -> list[str]:
        regions = context_regions(info)
        if value and regions is not None and len(regions) != 1:
            raise ValueError(
                f"a filesystem lives in one region: with file_system_names, set {pool_field(info, 'region')} "
                f"to exactly that region (the pool names {len(regions)})"
            )
        return value
