"""A pool's ``region``/``regions`` is the single source: providers keep no region settings of their own.

The ec2, oci and lambda_labs settings once had ``region`` (or ``regions``); an
operator who still writes it gets an error that points at the pool field, both
from the model and from ``load_config`` with the config file's line. What
depends on the region (EC2 zones, Lambda's one-region filesystems, the region's
syntax) is checked against the pool's regions that config loading passes as the
pydantic validation context, and skipped without that context.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import levers9_ec2
import levers9_lambda_labs
import levers9_oci
from levers9.config.load import ConfigError, load_config
from levers9.hooks.manager import PluginPolicy, load_plugins

COMPARTMENT = "ocid1.compartment.oc1..aaaaaaaaba3pv6wkcr4jqae5f15p2b2m2yt2j6rx32uzr4h25vqstifsfdsq"
SUBNET = "ocid1.subnet.oc1.iad.aaaaaaaa5kmqyjvdp3ypzmxtmkm5yjq6hkx2y7kkrezvj2cxslfk5cd3lu6q"
IMAGE = "ocid1.image.oc1.iad.aaaaaaaat2x3bcmz3lxcw3xehbyqqrx2yyyhyk3dr5ggmjcb5r4h4sbhqx4q"

MODELS: dict[str, type[BaseModel]] = {
    "ec2": levers9_ec2.plugin.levers9_provider_settings(),
    "oci": levers9_oci.plugin.levers9_provider_settings(),
    "lambda_labs": levers9_lambda_labs.plugin.levers9_provider_settings(),
}
MINIMAL: dict[str, dict[str, Any]] = {
    "ec2": {"ami": "ami-0123456789abcdef0"},
    "oci": {"compartment_id": COMPARTMENT, "subnet_id": SUBNET, "image_id": IMAGE},
    "lambda_labs": {"ssh_key_names": ["ops"]},
}


def validate(provider: str, pool_regions: list[str] | None, **changes: Any) -> BaseModel:
    """Validate ``provider``'s minimal settings with ``changes``, as config loading would for pool ``gpu``."""
    context = None if pool_regions is None else {"pool": "gpu", "regions": pool_regions}
    return MODELS[provider].model_validate({**MINIMAL[provider], **changes}, context=context)


def messages(excinfo: pytest.ExceptionInfo[ValidationError]) -> str:
    return " | ".join(str(e["msg"]) for e in excinfo.value.errors())


# --------------------------------------------------------------------------- the old settings point to the pool


@pytest.mark.parametrize(
    ("provider", "key", "value"),
    [
        ("ec2", "region", "us-east-1"),
        ("ec2", "regions", ["us-east-1"]),
        ("oci", "region", "us-ashburn-1"),
        ("lambda_labs", "regions", ["us-east-1", "us-west-1"]),
        ("lambda_labs", "region", "us-east-1"),
    ],
)
def test_region_setting_points_to_the_pool_field(provider: str, key: str, value: Any) -> None:
    with pytest.raises(ValidationError) as excinfo:
        validate(provider, ["us-east-1"], **{key: value})
    assert f"{key} moved: set pools.gpu.region (or regions) instead" in messages(excinfo)
    # without the context (a unit test of the model alone) the message still says where it went
    with pytest.raises(ValidationError) as excinfo:
        validate(provider, None, **{key: value})
    assert f"{key} moved: set pools.<name>.region (or regions) instead" in messages(excinfo)


@pytest.mark.parametrize("provider", sorted(MODELS))
def test_region_is_no_longer_a_field(provider: str) -> None:
    assert not {"region", "regions"} & set(MODELS[provider].model_fields)
    assert not {"region", "regions"} & set(MODELS[provider].model_json_schema()["properties"])


def test_config_file_error_names_the_line_and_the_pool_field(tmp_path: Path) -> None:
    path = tmp_path / "levers9.yaml"
    path.write_text(
        "pools:\n"
        "  h100:\n"
        "    provider: ec2\n"
        "    gpu: H100\n"
        "    region: us-east-1\n"
        "    settings:\n"
        "      region: us-east-1\n"
        "      ami: ami-0123456789abcdef0\n"
    )
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, plugins=load_plugins(PluginPolicy()))
    [issue] = excinfo.value.issues
    assert issue.line == 6  # the pool's settings mapping
    assert issue.path == "pools.h100.settings"
    assert "region moved: set pools." in issue.message
    assert ".region (or regions) instead" in issue.message
    assert str(issue).startswith(f"{path}:6: pools.h100.settings: region moved")


# --------------------------------------------------------------------------- checks against the pool's regions


def test_ec2_zones_must_be_in_a_pool_region() -> None:
    with pytest.raises(ValidationError) as excinfo:
        validate("ec2", ["us-east-1"], availability_zones=["us-west-2a"])
    assert ("availability_zones",) in [tuple(e["loc"]) for e in excinfo.value.errors()]
    assert "not a zone of the pool's region(s) 'us-east-1'" in messages(excinfo)
    assert "pools.gpu.regions" in messages(excinfo)
    # a pool of several regions may list zones of each; Local Zones count as their region's
    validate("ec2", ["us-east-1", "us-west-2"], availability_zones=["us-west-2a", "us-east-1b", "us-east-1-bos-1a"])
    validate("ec2", ["us-gov-west-1"], availability_zones=["us-gov-west-1a"])
    # no regions (every region) or no context: nothing to check the zones against here
    validate("ec2", [], availability_zones=["us-west-2a"])
    validate("ec2", None, availability_zones=["us-west-2a"])


@pytest.mark.parametrize(
    ("provider", "region", "what"),
    [
        ("ec2", "us-east", "is not an AWS region"),
        ("ec2", "US-EAST-1", "is not an AWS region"),
        ("oci", "ashburn", "is not an OCI region identifier"),
        ("lambda_labs", "US East", "is not a Lambda region"),
    ],
)
def test_pool_region_must_be_the_providers_kind(provider: str, region: str, what: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        validate(provider, ["us-east-1", region])
    assert f"pools.gpu.region {region!r} {what}" in messages(excinfo)


@pytest.mark.parametrize(
    ("provider", "region"),
    [
        ("ec2", "cn-north-1"),
        ("ec2", "ap-southeast-2"),
        ("oci", "us-gov-ashburn-1"),
        ("lambda_labs", "europe-central-1"),
    ],
)
def test_pool_regions_of_the_providers_kind_validate(provider: str, region: str) -> None:
    validate(provider, [region])


def test_lambda_filesystem_needs_exactly_one_pool_region() -> None:
    validate("lambda_labs", ["us-east-1"], file_system_names=["datasets"])
    for regions in ([], ["us-east-1", "us-west-1"]):
        with pytest.raises(ValidationError) as excinfo:
            validate("lambda_labs", regions, file_system_names=["datasets"])
        assert ("file_system_names",) in [tuple(e["loc"]) for e in excinfo.value.errors()]
        assert "set pools.gpu.region to exactly that region" in messages(excinfo)
