"""Pool settings of the ``oci`` provider (Oracle Cloud Infrastructure).

Credentials stay where the OCI SDK keeps them: an SDK config file and profile
(which point at the API signing key), or instance / resource principals.
Only pydantic, :mod:`levers9.config.fields` and :mod:`levers9.clouds.settings`
(whose ``CloudSettings`` holds the region rule below, the same for every
cloud) are imported; the ``oci`` SDK is imported by the hooks that call it.

The region is not a setting: a pool's ``region`` (or ``regions``) is the single
source (left out, the SDK profile's region), and ``settings.region`` is refused
with a message that says so. The pool's regions are checked to look like OCI
region identifiers with the validation context config loading passes
(``{"pool": name, "regions": [...]}``); without it (a unit test, the JSON
schema) that check is skipped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, HttpUrl, ValidationInfo, field_validator

from levers9.clouds.settings import CloudSettings
from levers9.config.fields import EnvVarName, UniqueList, pattern

#: OCI region identifiers: us-ashburn-1, eu-frankfurt-1, us-gov-ashburn-1, ap-tokyo-1
_REGION = re.compile(r"^[a-z]+(-[a-z]+)+-[0-9]+$")
#: availability domain names carry a tenancy-specific prefix: 'Uocm:PHX-AD-1'
_AVAILABILITY_DOMAIN = re.compile(r"^[A-Za-z0-9]+:[A-Z0-9-]+-AD-[0-9]+$")
#: VM.GPU.A10.1, BM.GPU.H100.8, BM.GPU4.8, VM.Standard.E5.Flex
_SHAPE = re.compile(r"^(VM|BM)\.[A-Za-z0-9]+(\.[A-Za-z0-9-]+)*$")  # BM.GPU.A100-v2.8 has a dash

#: freeform tag keys levers9 sets itself
RESERVED_TAG_PREFIX = "levers9-"


def _ocid(*types: str) -> AfterValidator:
    """Validate an OCID of one of ``types``: ``ocid1.<type>.<realm>.[region].<unique id>``."""
    pattern = re.compile(
        r"^ocid1\.(" + "|".join(re.escape(t) for t in types) + r")\.[a-z0-9]+\.[a-z0-9-]*(\.[a-z0-9-]*)?\.[a-z0-9]+$"
    )

    def check(value: str) -> str:
        if not pattern.match(value):
            kinds = " or ".join(f"ocid1.{t}..." for t in types)
            raise ValueError(f"{value!r} is not an OCID of the right kind ({kinds})")
        return value

    return AfterValidator(check)


def _check_tags(value: dict[str, str]) -> dict[str, str]:
    for key, tag_value in value.items():
        if not 1 <= len(key) <= 100:
            raise ValueError(f"freeform tag key {key!r} must be 1-100 characters")
        if len(tag_value) > 256:
            raise ValueError(f"the value of tag {key!r} is longer than 256 characters")
        if key.startswith(RESERVED_TAG_PREFIX):
            raise ValueError(f"tag key {key!r} uses the prefix {RESERVED_TAG_PREFIX!r}, which levers9 reserves")
    return value


AvailabilityDomain = Annotated[str, pattern(_AVAILABILITY_DOMAIN, "an availability domain name", "Uocm:PHX-AD-1")]
Shape = Annotated[str, pattern(_SHAPE, "an OCI shape name", "BM.GPU.H100.8")]


class ShapeConfig(BaseModel):
    """Size of a flexible shape (``*.Flex``); fixed GPU shapes take none."""

    model_config = ConfigDict(extra="forbid")

    ocpus: float = Field(gt=0, le=512, description="OCPUs of each worker instance.")
    memory_in_gbs: float | None = Field(
        None, gt=0, le=8192, description="Memory in GB; left out, the shape's default for that many OCPUs."
    )


class OciSettings(CloudSettings):
    """Settings of a pool whose workers are OCI compute instances started with LaunchInstance."""

    model_config = ConfigDict(extra="forbid")
    region_form = (_REGION, "an OCI region identifier", "us-ashburn-1")

    auth: Literal["api_key", "security_token", "instance_principal", "resource_principal"] = Field(
        "api_key",
        description="How to authenticate: 'api_key' or 'security_token' read config_file/profile; "
        "'instance_principal' and 'resource_principal' use the identity of the controlplane's host.",
    )
    config_file: Path = Field(
        Path("~/.oci/config"),
        description="OCI SDK config file; its profile names the user, tenancy and key_file.",
    )
    profile: str = Field("DEFAULT", min_length=1, description="Profile of config_file to use.")
    key_file: Path | None = Field(
        None,
        description="Path of the API signing key, overriding the profile's key_file (a path, never the key).",
    )
    pass_phrase_env: EnvVarName | None = Field(
        None,
        description="Name of the environment variable holding the signing key's pass phrase, if encrypted.",
    )
    compartment_id: Annotated[str, _ocid("compartment", "tenancy")] = Field(
        description="Compartment the workers are launched and listed in (ocid1.compartment... or the "
        "tenancy's OCID for the root compartment)."
    )
    availability_domains: UniqueList[AvailabilityDomain] = Field(
        default_factory=list,
        description="Availability domains to launch in, for example ['Uocm:US-ASHBURN-AD-1']; empty, "
        "every domain of the region.",
    )
    subnet_id: Annotated[str, _ocid("subnet")] = Field(
        description="Subnet of the workers' primary VNIC (ocid1.subnet...); it needs a route out to the controlplane."
    )
    assign_public_ip: bool | None = Field(
        None, description="Give the workers a public IP; left out, the subnet's default."
    )
    image_id: Annotated[str, _ocid("image")] = Field(
        description="Image the workers boot (ocid1.image...), with the NVIDIA driver for GPU shapes."
    )
    shapes: UniqueList[Shape] = Field(
        default_factory=list,
        description="Restrict offers to these shapes, for example ['BM.GPU.H100.8', 'VM.GPU.A10.1']; "
        "empty, every shape with GPUs matching the pool.",
    )
    shape_config: ShapeConfig | None = Field(
        None, description="OCPUs and memory for flexible ('.Flex') shapes; not allowed for fixed shapes only."
    )
    boot_volume_gib: int = Field(200, ge=50, le=32768, description="Boot volume size in GB (OCI allows 50 to 32768).")
    ssh_authorized_keys_file: Path | None = Field(
        None, description="File of public SSH keys to install for debugging; left out, none."
    )
    freeform_tags: Annotated[dict[str, str], AfterValidator(_check_tags)] = Field(
        default_factory=dict,
        description="Extra freeform tags; keys starting with 'levers9-' are reserved for levers9's own "
        "'levers9-machine-id' and 'levers9-pool'.",
    )
    service_endpoint: HttpUrl | None = Field(
        None, description="Compute API endpoint override, for tests and private endpoints."
    )

    @field_validator("key_file", "pass_phrase_env")
    @classmethod
    def _signing_key_auth_only(cls, value: Any, info: ValidationInfo) -> Any:
        auth = info.data.get("auth")
        if value is not None and auth in ("instance_principal", "resource_principal"):
            raise ValueError(f"{info.field_name} does not apply with auth {auth!r}")
        return value

    @field_validator("shape_config")
    @classmethod
    def _flex_only(cls, value: ShapeConfig | None, info: ValidationInfo) -> ShapeConfig | None:
        shapes: list[str] = info.data.get("shapes", [])
        if value is not None and shapes and not any(s.endswith(".Flex") for s in shapes):
            raise ValueError("shape_config applies only to flexible ('.Flex') shapes, and none is listed")
        return value
