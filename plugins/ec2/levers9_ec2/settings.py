"""Pool settings of the ``ec2`` provider.

Credentials are never values here: the pool names an AWS profile, or the
environment variables that hold an access key, or nothing at all (the default
credential chain: instance role, SSO, environment). Only pydantic,
:mod:`levers9.config.fields` and :mod:`levers9.clouds.settings` (whose
``CloudSettings`` holds the region rule below, the same for every cloud) are
imported.

The region is not a setting: a pool's ``region`` (or ``regions``) is the single
source, and ``settings.region`` is refused with a message that says so. What
depends on the region (each availability zone must be a zone of one of the
pool's regions, each region must look like an AWS region) is checked with the
pool's regions that config loading passes as the validation context
(``{"pool": name, "regions": [...]}``); validated without that context (a unit
test, the JSON schema) those checks are skipped, never guessed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, ConfigDict, Field, HttpUrl, ValidationInfo, field_validator, model_validator

from levers9.clouds.settings import CloudSettings
from levers9.config.fields import UniqueList, context_regions, env_var_name, pattern, pool_field

#: what an AWS access key id looks like (long-term AKIA..., temporary ASIA...)
_ACCESS_KEY_ID = re.compile(r"^(AKIA|ASIA|AIDA|AROA)[A-Z0-9]{12,}$")
#: commercial, GovCloud, China and ISO partitions: us-east-1, us-gov-west-1, cn-north-1, us-isob-east-1
_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]+$")
_AMI_ID = re.compile(r"^ami-([0-9a-f]{8}|[0-9a-f]{17})$")
_SUBNET_ID = re.compile(r"^subnet-([0-9a-f]{8}|[0-9a-f]{17})$")
_SG_ID = re.compile(r"^sg-([0-9a-f]{8}|[0-9a-f]{17})$")
_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
_SSM_PARAMETER = re.compile(r"^/?[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")
_INSTANCE_PROFILE = re.compile(
    r"^([\w+=,.@-]{1,128}|arn:aws[a-z-]*:iam::[0-9]{12}:instance-profile/([\w+=,.@-]+/)*[\w+=,.@-]{1,128})$"
)

#: tag keys levers9 sets itself; an operator's tags may not override them
RESERVED_TAG_PREFIX = "levers9:"


def _check_tags(value: dict[str, str]) -> dict[str, str]:
    if len(value) > 40:
        raise ValueError("at most 40 extra tags (EC2 allows 50 per resource and levers9 sets its own)")
    for key, tag_value in value.items():
        if not 1 <= len(key) <= 128:
            raise ValueError(f"tag key {key!r} must be 1-128 characters")
        if len(tag_value) > 256:
            raise ValueError(f"the value of tag {key!r} is longer than 256 characters")
        if key.lower().startswith("aws:"):
            raise ValueError(f"tag key {key!r} uses the prefix 'aws:', which AWS reserves")
        if key.startswith(RESERVED_TAG_PREFIX):
            raise ValueError(f"tag key {key!r} uses the prefix {RESERVED_TAG_PREFIX!r}, which levers9 reserves")
    return value


def zone_of_region(zone: str, region: str) -> bool:
    """``us-east-1a`` of ``us-east-1``; Local and Wavelength Zones too: ``us-east-1-bos-1a``, ``us-east-1-wl1-atl-wlz-1``."""
    suffix = zone[len(region) :] if zone.startswith(region) else ""
    return re.fullmatch(r"[a-z]{1,2}|-[a-z0-9-]*[a-z0-9]", suffix) is not None


EnvName = Annotated[str, env_var_name(_ACCESS_KEY_ID, "an access key")]
InstanceType = Annotated[str, pattern(_INSTANCE_TYPE, "an EC2 instance type", "p5.48xlarge")]
SubnetId = Annotated[str, pattern(_SUBNET_ID, "a subnet id", "subnet-0123456789abcdef0")]
SecurityGroupId = Annotated[str, pattern(_SG_ID, "a security group id", "sg-0123456789abcdef0")]


class Ec2Settings(CloudSettings):
    """Settings of a pool whose workers are EC2 instances started with RunInstances."""

    model_config = ConfigDict(extra="forbid")
    region_form = (_REGION, "an AWS region", "us-east-1")

    availability_zones: UniqueList[str] = Field(
        default_factory=list,
        description="Availability zones to offer and launch in, for example ['us-east-1a'], each a zone of one "
        "of the pool's regions; empty, every zone the subnets cover.",
    )
    instance_types: UniqueList[InstanceType] = Field(
        default_factory=list,
        description="Restrict offers to these instance types, for example ['p5.48xlarge', 'g6e.xlarge']; "
        "empty, every type with GPUs matching the pool.",
    )
    ami: Annotated[str, pattern(_AMI_ID, "an AMI id", "ami-0123456789abcdef0")] | None = Field(
        None,
        description="AMI the workers boot (NVIDIA driver and container toolkit installed). Give this "
        "or ami_ssm_parameter.",
    )
    ami_ssm_parameter: (
        Annotated[
            str,
            pattern(
                _SSM_PARAMETER,
                "an SSM parameter name",
                "/aws/service/deeplearning/ami/x86_64/<ami-type>/latest/ami-id",
            ),
        ]
        | None
    ) = Field(
        None,
        max_length=2048,
        description="SSM parameter holding the AMI id, resolved at launch (ImageId 'resolve:ssm:<name>'), "
        "e.g. a Deep Learning AMI's '/aws/service/deeplearning/ami/<arch>/<ami-type>/latest/ami-id'.",
    )
    subnet_ids: UniqueList[SubnetId] = Field(
        default_factory=list,
        description="Subnets to launch into, one or more per zone; the workers need outbound access to the "
        "controlplane (NAT or public IP). Empty, the region's default VPC.",
    )
    security_group_ids: UniqueList[SecurityGroupId] = Field(
        default_factory=list,
        description="Security groups of the workers; workers only dial out, so no inbound rule is needed.",
    )
    public_ip: bool | None = Field(
        None, description="Give the workers a public IPv4 address; left out, the subnet's default."
    )
    key_name: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description="Name of an existing EC2 key pair for SSH debugging (its name, never key material); "
        "left out, no SSH key.",
    )
    iam_instance_profile: (
        Annotated[str, pattern(_INSTANCE_PROFILE, "an instance profile name or ARN", "levers9-worker")] | None
    ) = Field(None, description="Instance profile (name or ARN) the workers run with.")
    market: Literal["on-demand", "spot"] | None = Field(
        None,
        description="'spot' or 'on-demand'; left out, spot when the pool is marked preemptible, else on-demand.",
    )
    max_spot_price: float | None = Field(
        None,
        gt=0,
        description="Highest spot price to pay, US dollars per instance-hour; left out, up to the on-demand "
        "price. Only for spot.",
    )
    root_volume_gib: int = Field(
        200,
        ge=8,
        le=65536,
        description="Size of the root EBS volume in GiB (images and checkpoints live there).",
    )
    root_volume_type: Literal["gp3", "gp2", "io1", "io2"] = Field("gp3", description="EBS type of the root volume.")
    tags: Annotated[dict[str, str], AfterValidator(_check_tags)] = Field(
        default_factory=dict,
        description="Extra tags for instances and volumes (cost allocation). Keys starting with 'levers9:' "
        "are reserved for levers9's own 'levers9:machine-id' and 'levers9:pool'.",
    )
    instance_identity: Literal["required", "off"] = Field(
        "required",
        description="required: a worker joins only by also showing its instance's identity document, signed by "
        "AWS and read from the instance metadata service (IMDSv2), for the very instance its join token was made "
        "for, so a token copied from the user data is refused anywhere else; off: the token alone admits the "
        "worker (images whose worker cannot reach the metadata service).",
    )
    identity_certificate_file: Path | None = Field(
        None,
        description="PEM file of the certificate(s) that verify identity documents' base64 (RSA-SHA256) "
        "signatures, instead of AWS's certificate of the instance's region that the plugin ships (for a region "
        "newer than the plugin, or after AWS rotates a certificate). Read on the controlplane.",
    )
    endpoint_url: HttpUrl | None = Field(
        None, description="EC2 endpoint override, for tests (moto) and VPC interface endpoints."
    )
    profile: str | None = Field(
        None,
        min_length=1,
        description="Named profile of the AWS shared config and credentials files. Exclusive with the *_env "
        "fields; with neither, the default credential chain (instance role, SSO, environment) is used.",
    )
    access_key_id_env: EnvName | None = Field(
        None,
        description="Name of the environment variable holding the access key id (the name, not the key).",
    )
    secret_access_key_env: EnvName | None = Field(
        None,
        description="Name of the environment variable holding the secret access key (the name, not the key).",
    )
    session_token_env: EnvName | None = Field(
        None, description="Name of the environment variable holding a session token, for temporary keys."
    )

    @field_validator("availability_zones")
    @classmethod
    def _zones_in_region(cls, value: list[str], info: ValidationInfo) -> list[str]:
        regions = context_regions(info)
        if not regions:  # no context, or a pool that names no region: the zones are checked at launch
            return value
        for zone in value:
            if not any(zone_of_region(zone, region) for region in regions):
                listing = ", ".join(repr(r) for r in regions)
                raise ValueError(
                    f"availability zone {zone!r} is not a zone of the pool's region(s) {listing}; "
                    f"add its region to {pool_field(info, 'regions')} or drop the zone"
                )
        return value

    @field_validator("identity_certificate_file")
    @classmethod
    def _certificates(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        from cryptography import x509

        try:
            found = x509.load_pem_x509_certificates(value.read_bytes())
        except OSError as exc:
            raise ValueError(f"cannot read {value}: {exc.strerror}") from None
        except ValueError:
            raise ValueError(f"{value} holds no PEM certificate (-----BEGIN CERTIFICATE-----)") from None
        if not found:
            raise ValueError(f"{value} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        return value

    @field_validator("max_spot_price")
    @classmethod
    def _spot_only(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and info.data.get("market") == "on-demand":
            raise ValueError("max_spot_price is only meaningful with spot instances")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.ami is None) == (self.ami_ssm_parameter is None):
            raise ValueError("give exactly one of 'ami' and 'ami_ssm_parameter'")
        if (self.access_key_id_env is None) != (self.secret_access_key_env is None):
            raise ValueError("give both access_key_id_env and secret_access_key_env, or neither")
        if self.session_token_env is not None and self.access_key_id_env is None:
            raise ValueError("session_token_env needs access_key_id_env and secret_access_key_env")
        if self.profile is not None and self.access_key_id_env is not None:
            raise ValueError("give either 'profile' or the *_env credential variables, not both")
        return self
