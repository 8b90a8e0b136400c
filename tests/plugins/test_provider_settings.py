"""The settings schema of every built-in provider plugin (its ``levers9_provider_settings`` hook).

For each provider: the minimal config an operator would write validates, a full
production-like config validates, typical mistakes are rejected with an error
located at the offending field, and credentials can only be given as references
(environment variable names, file paths, profiles), never as values.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Any

import pluggy
import pytest
from pydantic import BaseModel, ValidationError

import levers9_agent_machine
import levers9_attached_cluster
import levers9_ec2
import levers9_lambda_labs
import levers9_local
import levers9_local_k8s
import levers9_oci
from levers9.hooks import spec
from levers9.hooks.markers import PROJECT

#: each provider's plugin object, as its entry point names it (``levers9_<name>:plugin``)
PLUGINS: dict[str, Any] = {
    "local": levers9_local.plugin,
    "local_k8s": levers9_local_k8s.plugin,
    "attached_cluster": levers9_attached_cluster.plugin,
    "ec2": levers9_ec2.plugin,
    "oci": levers9_oci.plugin,
    "lambda_labs": levers9_lambda_labs.plugin,
    "agent_machine": levers9_agent_machine.plugin,
}
PACKAGES = {
    "local": levers9_local,
    "local_k8s": levers9_local_k8s,
    "attached_cluster": levers9_attached_cluster,
    "ec2": levers9_ec2,
    "oci": levers9_oci,
    "lambda_labs": levers9_lambda_labs,
    "agent_machine": levers9_agent_machine,
}

COMPARTMENT = "ocid1.compartment.oc1..aaaaaaaaba3pv6wkcr4jqae5f15p2b2m2yt2j6rx32uzr4h25vqstifsfdsq"
TENANCY = "ocid1.tenancy.oc1..aaaaaaaaba3pv6wkcr4jqae5f15p2b2m2yt2j6rx32uzr4h25vqstifsfdsq"
SUBNET = "ocid1.subnet.oc1.iad.aaaaaaaa5kmqyjvdp3ypzmxtmkm5yjq6hkx2y7kkrezvj2cxslfk5cd3lu6q"
IMAGE = "ocid1.image.oc1.iad.aaaaaaaat2x3bcmz3lxcw3xehbyqqrx2yyyhyk3dr5ggmjcb5r4h4sbhqx4q"
IMAGE_REF = "registry.example.com/levers9/worker:0.1.0"

#: the least an operator must write for each provider
MINIMAL: dict[str, dict[str, Any]] = {
    "local": {},
    "local_k8s": {"worker_image": IMAGE_REF},
    "attached_cluster": {"cluster": "acme-prod", "worker_image": IMAGE_REF},
    "ec2": {"ami": "ami-0123456789abcdef0"},
    "oci": {"compartment_id": COMPARTMENT, "subnet_id": SUBNET, "image_id": IMAGE},
    "lambda_labs": {"ssh_key_names": ["ops"]},
    "agent_machine": {"worker_image": IMAGE_REF},
}

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

#: a production-like config using most fields
FULL: dict[str, dict[str, Any]] = {
    "local": {
        "worker_command": ["/opt/levers9/bin/levers9", "worker", "--log-level", "debug"],
        "state_dir": "/var/lib/levers9/local",
        "visible_gpus": [0, 1, 2, 3],
        "stop_grace_s": 30,
    },
    "local_k8s": {
        "namespace": "levers9-workers",
        "kubeconfig": "in-cluster",
        "worker_image": "ghcr.io/levers9/worker@sha256:" + "a" * 64,
        "service_account": "levers9-worker",
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "gpu"},
        "tolerations": [
            GPU_TOLERATION,
            {
                "key": "dedicated",
                "operator": "Equal",
                "value": "ml",
                "effect": "NoExecute",
                "toleration_seconds": 60,
            },
        ],
        "gpu_resource_name": "nvidia.com/gpu",
        "image_pull_secrets": ["regcred"],
        "priority_class_name": "gpu-high",
        "active_deadline_seconds": 86400,
        "ttl_seconds_after_finished": 600,
        "privileged": True,
    },
    "attached_cluster": {
        "cluster": "acme-prod",
        "namespace": "ml",
        "worker_image": "localhost:5000/levers9/worker:dev",
        "service_account": "levers9",
        "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
        "tolerations": [GPU_TOLERATION],
        "gpu_resource_name": "amd.com/gpu",
        "image_pull_secrets": ["regcred"],
        "order_timeout_s": 60,
    },
    "ec2": {
        "availability_zones": ["us-west-2a", "us-west-2b"],
        "instance_types": ["p5.48xlarge", "g6e.xlarge", "p4de.24xlarge"],
        "ami_ssm_parameter": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04"
        "/latest/ami-id",
        "subnet_ids": ["subnet-0123456789abcdef0", "subnet-89abcdef"],
        "security_group_ids": ["sg-0123456789abcdef0"],
        "public_ip": False,
        "key_name": "ops-2024",
        "iam_instance_profile": "arn:aws:iam::123456789012:instance-profile/levers9-worker",
        "market": "spot",
        "max_spot_price": 40.5,
        "root_volume_gib": 500,
        "tags": {"team": "ml", "cost-center": "4711"},
        "endpoint_url": "http://localhost:5000",
        "access_key_id_env": "LEVERS9_AWS_ACCESS_KEY_ID",
        "secret_access_key_env": "LEVERS9_AWS_SECRET_ACCESS_KEY",
        "session_token_env": "LEVERS9_AWS_SESSION_TOKEN",
    },
    "oci": {
        "config_file": "/etc/levers9/oci/config",
        "profile": "LEVERS9",
        "key_file": "/etc/levers9/oci/key.pem",
        "pass_phrase_env": "OCI_KEY_PASS_PHRASE",
        "compartment_id": TENANCY,
        "availability_domains": ["Uocm:US-ASHBURN-AD-1", "Uocm:US-ASHBURN-AD-2"],
        "subnet_id": SUBNET,
        "assign_public_ip": False,
        "image_id": IMAGE,
        "shapes": ["BM.GPU.H100.8", "VM.Standard.E5.Flex"],
        "shape_config": {"ocpus": 8, "memory_in_gbs": 64},
        "boot_volume_gib": 1024,
        "ssh_authorized_keys_file": "/etc/levers9/oci/authorized_keys",
        "freeform_tags": {"team": "ml"},
        "service_endpoint": "http://127.0.0.1:12000",
    },
    "lambda_labs": {
        "api_key_env": "LEVERS9_LAMBDA_KEY",
        "api_url": "http://localhost:8080/api/v1",
        "instance_types": ["gpu_8x_h100_sxm5", "gpu_1x_a10"],
        "ssh_key_names": ["ops"],
        "file_system_names": ["datasets"],
        "image_family": "lambda-stack-22-04",
        "request_timeout_s": 10,
    },
    "agent_machine": {
        "worker_image": IMAGE_REF,
        "max_workers_per_machine": 8,
        "docker_network_mode": "host",
        "docker_host": "unix:///run/docker.sock",
        "gpu_runtime": "none",
        "heartbeat_timeout_s": 30,
        "ssh": {
            "user": "ubuntu",
            "port": 2222,
            "key_file": "~/.ssh/levers9_ed25519",
            "known_hosts_file": "/etc/levers9/known_hosts",
            "jump": {"host": "bastion.example.com", "port": 22, "user": "jump"},
            "sudo": True,
            "connect_timeout_s": 5,
        },
    },
}

#: (provider, changes to its minimal config, where the error must be reported)
INVALID: list[tuple[str, dict[str, Any], tuple[str | int, ...]]] = [
    # local
    ("local", {"stop_grace_s": -1}, ("stop_grace_s",)),
    ("local", {"worker_command": []}, ("worker_command",)),
    ("local", {"worker_command": ["levers9", ""]}, ("worker_command",)),
    ("local", {"visible_gpus": [0, 0]}, ("visible_gpus",)),
    ("local", {"visible_gpus": [-1]}, ("visible_gpus", 0)),
    ("local", {"max_workers": 2}, ("max_workers",)),  # the pool's own field, not a setting
    # local_k8s
    ("local_k8s", {"namespace": "Levers9_Workers"}, ("namespace",)),
    ("local_k8s", {"worker_image": "Not An Image"}, ("worker_image",)),
    (
        "local_k8s",
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "In"}]},
        ("tolerations", 0, "operator"),
    ),
    ("local_k8s", {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, ("tolerations", 0)),
    ("local_k8s", {"tolerations": [{"operator": "Equal", "value": "v"}]}, ("tolerations", 0)),
    (
        "local_k8s",
        {"tolerations": [{"key": "k", "effect": "NoSchedule", "toleration_seconds": 5}]},
        ("tolerations", 0),
    ),
    ("local_k8s", {"tolerations": [{"key": "k", "effect": "Evict"}]}, ("tolerations", 0, "effect")),
    ("local_k8s", {"tolerations": [{"key": "k", "operatr": "Exists"}]}, ("tolerations", 0, "operatr")),
    ("local_k8s", {"node_selector": {"bad key!": "x"}}, ("node_selector",)),
    ("local_k8s", {"node_selector": {"gpu": "-bad-"}}, ("node_selector",)),
    ("local_k8s", {"gpu_resource_name": "gpu"}, ("gpu_resource_name",)),
    ("local_k8s", {"gpu_resource_name": "kubernetes.io/gpu"}, ("gpu_resource_name",)),
    ("local_k8s", {"image_pull_secrets": ["RegCred"]}, ("image_pull_secrets", 0)),
    ("local_k8s", {"active_deadline_seconds": 0}, ("active_deadline_seconds",)),
    ("local_k8s", {"kubeconfig": "  "}, ("kubeconfig",)),
    # attached_cluster
    ("attached_cluster", {"cluster": "Acme Prod"}, ("cluster",)),
    (
        "attached_cluster",
        {"tolerations": [{"key": "k", "operator": "NotIn"}]},
        ("tolerations", 0, "operator"),
    ),
    ("attached_cluster", {"order_timeout_s": 0}, ("order_timeout_s",)),
    ("attached_cluster", {"kubeconfig": "~/.kube/config"}, ("kubeconfig",)),
    # ec2
    ("ec2", {"ami": "ami-xyz"}, ("ami",)),
    ("ec2", {"instance_types": ["p5"]}, ("instance_types", 0)),
    ("ec2", {"instance_types": ["p5.48xlarge", "p5.48xlarge"]}, ("instance_types",)),
    ("ec2", {"subnet_ids": ["subnet-123"]}, ("subnet_ids", 0)),
    ("ec2", {"security_group_ids": ["sg_0123456789abcdef0"]}, ("security_group_ids", 0)),
    ("ec2", {"root_volume_gib": -10}, ("root_volume_gib",)),
    ("ec2", {"root_volume_gib": 4}, ("root_volume_gib",)),
    ("ec2", {"market": "reserved"}, ("market",)),
    ("ec2", {"market": "on-demand", "max_spot_price": 3.0}, ("max_spot_price",)),
    ("ec2", {"max_spot_price": -1}, ("max_spot_price",)),
    ("ec2", {"tags": {"levers9:pool": "x"}}, ("tags",)),
    ("ec2", {"tags": {"aws:createdBy": "x"}}, ("tags",)),
    ("ec2", {"endpoint_url": "not a url"}, ("endpoint_url",)),
    ("ec2", {"iam_instance_profile": "arn:aws:iam::12:role/x"}, ("iam_instance_profile",)),
    ("ec2", {"spot": True}, ("spot",)),
    # oci
    ("oci", {"compartment_id": "ocid1.subnet.oc1..aaaaaaaa"}, ("compartment_id",)),
    ("oci", {"compartment_id": "compartment-1"}, ("compartment_id",)),
    ("oci", {"subnet_id": IMAGE}, ("subnet_id",)),
    ("oci", {"image_id": "ami-0123456789abcdef0"}, ("image_id",)),
    ("oci", {"availability_domains": ["AD-1"]}, ("availability_domains", 0)),
    ("oci", {"shapes": ["H100x8"]}, ("shapes", 0)),
    ("oci", {"shapes": ["BM.GPU.H100.8"], "shape_config": {"ocpus": 4}}, ("shape_config",)),
    ("oci", {"shape_config": {"ocpus": 0}}, ("shape_config", "ocpus")),
    ("oci", {"boot_volume_gib": -1}, ("boot_volume_gib",)),
    ("oci", {"boot_volume_gib": 40000}, ("boot_volume_gib",)),
    ("oci", {"auth": "password"}, ("auth",)),
    ("oci", {"auth": "instance_principal", "key_file": "/k.pem"}, ("key_file",)),
    ("oci", {"freeform_tags": {"levers9-pool": "x"}}, ("freeform_tags",)),
    ("oci", {"compartment": COMPARTMENT}, ("compartment",)),
    # lambda_labs
    ("lambda_labs", {"ssh_key_names": []}, ("ssh_key_names",)),
    ("lambda_labs", {"ssh_key_names": ["a", "b"]}, ("ssh_key_names",)),
    ("lambda_labs", {"instance_types": ["H100"]}, ("instance_types", 0)),
    ("lambda_labs", {"file_system_names": ["a", "b"]}, ("file_system_names",)),
    ("lambda_labs", {"api_url": "http://cloud.lambda.ai/api/v1"}, ("api_url",)),
    ("lambda_labs", {"request_timeout_s": 0}, ("request_timeout_s",)),
    # agent_machine
    ("agent_machine", {"max_workers_per_machine": 0}, ("max_workers_per_machine",)),
    ("agent_machine", {"worker_image": "has spaces:1"}, ("worker_image",)),
    ("agent_machine", {"docker_network_mode": "none"}, ("docker_network_mode",)),
    ("agent_machine", {"docker_network_mode": "container:other"}, ("docker_network_mode",)),
    ("agent_machine", {"gpu_runtime": "amd"}, ("gpu_runtime",)),
    ("agent_machine", {"heartbeat_timeout_s": 1}, ("heartbeat_timeout_s",)),
    ("agent_machine", {"docker_host": "/var/run/docker.sock"}, ("docker_host",)),
    ("agent_machine", {"ssh": {"port": 0}}, ("ssh", "port")),
    ("agent_machine", {"ssh": {"port": 65536}}, ("ssh", "port")),
    ("agent_machine", {"ssh": {"user": "Root User"}}, ("ssh", "user")),
    ("agent_machine", {"ssh": {"jump": {"host": "bastion..example"}}}, ("ssh", "jump", "host")),
    ("agent_machine", {"ssh": {"jump": {"host": "300.1.2.3"}}}, ("ssh", "jump", "host")),
    ("agent_machine", {"ssh": {"jump": {"host": "bastion", "port": -22}}}, ("ssh", "jump", "port")),
]

#: (provider, changes to its minimal config, where the error must be reported): credentials given as values
SECRETS_AS_VALUES: list[tuple[str, dict[str, Any], tuple[str | int, ...]]] = [
    ("local", {"token": "abc"}, ("token",)),
    ("local_k8s", {"token": "eyJhbGciOi"}, ("token",)),
    ("local_k8s", {"image_pull_secrets": ['{"auths": {"r.example.com": {}}}']}, ("image_pull_secrets", 0)),
    ("attached_cluster", {"agent_token": "l9a_abc"}, ("agent_token",)),
    ("ec2", {"access_key_id": "AKIAIOSFODNN7EXAMPLE"}, ("access_key_id",)),
    ("ec2", {"secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}, ("secret_access_key",)),
    (
        "ec2",
        {"access_key_id_env": "AKIAIOSFODNN7EXAMPLE", "secret_access_key_env": "AWS_SECRET_ACCESS_KEY"},
        ("access_key_id_env",),
    ),
    (
        "ec2",
        {
            "access_key_id_env": "AWS_ACCESS_KEY_ID",
            "secret_access_key_env": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        },
        ("secret_access_key_env",),
    ),
    ("oci", {"key_content": "-----BEGIN PRIVATE KEY-----"}, ("key_content",)),
    ("oci", {"pass_phrase": "hunter2"}, ("pass_phrase",)),
    ("oci", {"pass_phrase_env": "hunter 2"}, ("pass_phrase_env",)),
    ("lambda_labs", {"api_key": "secret_ops_0123456789abcdef"}, ("api_key",)),
    ("lambda_labs", {"api_key_env": "secret_ops_0123456789abcdef.0123456789abcdef"}, ("api_key_env",)),
    ("lambda_labs", {"api_key_env": "my key"}, ("api_key_env",)),
    ("agent_machine", {"ssh": {"password": "hunter2"}}, ("ssh", "password")),
    (
        "agent_machine",
        {"ssh": {"private_key": "-----BEGIN OPENSSH PRIVATE KEY-----"}},
        ("ssh", "private_key"),
    ),
]


def settings_model(provider: str) -> type[BaseModel]:
    model = PLUGINS[provider].levers9_provider_settings()
    assert isinstance(model, type)
    assert issubclass(model, BaseModel)
    return model


def validate(provider: str, **changes: Any) -> BaseModel:
    return settings_model(provider).model_validate({**MINIMAL[provider], **changes})


def error_locs(excinfo: pytest.ExceptionInfo[ValidationError]) -> list[tuple[str | int, ...]]:
    return [tuple(error["loc"]) for error in excinfo.value.errors()]


def all_models(model: type[BaseModel]) -> Iterator[type[BaseModel]]:
    """``model`` and every model nested in its fields (tolerations, ssh, shape_config...)."""
    yield model
    for field in model.model_fields.values():
        stack: list[Any] = [field.annotation]
        while stack:
            annotation = stack.pop()
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                yield from all_models(annotation)
            stack.extend(getattr(annotation, "__args__", ()))


# --------------------------------------------------------------------------- the hook itself


def test_hook_levers9_provider_settings() -> None:
    """Every provider's hook returns a pydantic model that forbids unknown keys."""
    assert set(PLUGINS) == {
        "local",
        "local_k8s",
        "attached_cluster",
        "ec2",
        "oci",
        "lambda_labs",
        "agent_machine",
    }
    for name, plugin in PLUGINS.items():
        hook: Callable[[], type[BaseModel]] = plugin.levers9_provider_settings
        assert hasattr(hook, f"{PROJECT}_impl"), f"{name}: levers9_provider_settings is not marked @hookimpl"
        model = hook()
        assert isinstance(model, type), name
        assert issubclass(model, BaseModel), name
        assert model.model_config.get("extra") == "forbid", name
        assert hook() is model, f"{name}: the hook must return the same model every time"


def test_hooks_register_against_the_spec() -> None:
    """pluggy accepts each plugin against the hook spec, and the hook answers through the manager."""
    for name, plugin in PLUGINS.items():
        pm = pluggy.PluginManager(PROJECT)
        pm.add_hookspecs(spec)
        pm.register(plugin, name=name)
        pm.check_pending()
        assert pm.hook.levers9_provider_settings() == [plugin.levers9_provider_settings()]


#: providers whose provisioning hooks have landed; the others declare settings only
PROVISIONING = {"local", "agent_machine", "ec2", "oci", "lambda_labs", "local_k8s", "attached_cluster"}
PROVIDER_HOOKS = {
    "levers9_provider_settings",
    "levers9_gpu_offers",
    "levers9_provision",
    "levers9_terminate",
    "levers9_list_machines",
}
#: hooks a provisioning provider may add to those: the spec marks them optional
OPTIONAL_PROVIDER_HOOKS = {
    "levers9_check",
    "levers9_startup",
    "levers9_shutdown",
    "levers9_verify_identity",
    "levers9_machine_identity",
}


def test_providers_implement_all_provider_hooks_or_only_settings() -> None:
    """Provisioning hooks arrive one provider at a time; until then they must be absent, not stubbed."""
    for name, plugin in PLUGINS.items():
        implemented = {attr for attr in dir(plugin) if hasattr(getattr(plugin, attr), f"{PROJECT}_impl")}
        if name in PROVISIONING:
            assert PROVIDER_HOOKS <= implemented <= PROVIDER_HOOKS | OPTIONAL_PROVIDER_HOOKS, name
        else:
            assert implemented == {"levers9_provider_settings"}, name


def test_entry_points_name_the_plugins() -> None:
    """The entry-point name is the name a pool writes as its provider; it names the package's plugin object."""
    found = {ep.name: ep for ep in entry_points(group=PROJECT)}
    for name, package in PACKAGES.items():
        assert found[name].value == f"{package.__name__}:plugin"
        assert found[name].load() is PLUGINS[name]


def test_importing_plugins_imports_no_sdk() -> None:
    modules = " ".join(package.__name__ for package in PACKAGES.values())
    code = (
        f"import sys, {modules.replace(' ', ', ')}\n"
        "heavy = ['boto3', 'botocore', 'oci', 'kubernetes', 'docker', 'paramiko']\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


# --------------------------------------------------------------------------- valid settings


@pytest.mark.parametrize("provider", sorted(PLUGINS))
def test_minimal_settings_validate(provider: str) -> None:
    settings = validate(provider)
    # and round-trip: what the model dumps validates back to the same settings
    assert settings_model(provider).model_validate(settings.model_dump()) == settings


@pytest.mark.parametrize("provider", sorted(PLUGINS))
def test_full_settings_validate(provider: str) -> None:
    settings = settings_model(provider).model_validate(FULL[provider])
    assert settings_model(provider).model_validate(settings.model_dump()) == settings


@pytest.mark.parametrize("provider", sorted(PLUGINS))
def test_every_field_is_described(provider: str) -> None:
    for model in all_models(settings_model(provider)):
        for field_name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{field_name} has no description"


def test_defaults() -> None:
    local_k8s = validate("local_k8s")
    assert local_k8s.model_dump(include={"namespace", "gpu_resource_name", "privileged", "kubeconfig"}) == {
        "namespace": "levers9",
        "gpu_resource_name": "nvidia.com/gpu",
        "privileged": False,
        "kubeconfig": None,
    }
    lambda_labs = validate("lambda_labs")
    assert lambda_labs.model_dump(include={"api_key_env"}) == {"api_key_env": "LAMBDA_API_KEY"}
    assert str(lambda_labs.model_dump()["api_url"]) == "https://cloud.lambda.ai/api/v1"
    oci = validate("oci").model_dump()
    assert (str(oci["config_file"]), oci["profile"], oci["auth"]) == ("~/.oci/config", "DEFAULT", "api_key")
    agent = validate("agent_machine").model_dump()
    assert agent["heartbeat_timeout_s"] == 60
    assert agent["gpu_runtime"] == "nvidia"
    assert (agent["ssh"]["port"], agent["ssh"]["strict_host_key_checking"]) == (22, True)
    ec2 = validate("ec2").model_dump()
    assert (ec2["market"], ec2["root_volume_type"], ec2["profile"]) == (None, "gp3", None)


@pytest.mark.parametrize(
    ("provider", "changes"),
    [
        ("ec2", {"availability_zones": ["us-east-1-bos-1a"]}),
        ("ec2", {"ami": "ami-12345678"}),
        ("ec2", {"profile": "levers9-prod"}),
        ("ec2", {"market": "spot"}),
        ("ec2", {"max_spot_price": 12.0}),
        ("oci", {"auth": "instance_principal"}),
        ("oci", {"shape_config": {"ocpus": 2}}),
        ("lambda_labs", {"file_system_names": ["datasets"]}),
        ("lambda_labs", {"api_url": "https://cloud.lambdalabs.com/api/v1"}),
        ("local_k8s", {"kubeconfig": "/etc/levers9/kubeconfig", "context": "prod"}),
        ("local_k8s", {"tolerations": [{"operator": "Exists"}]}),
        ("local_k8s", {"worker_image": "worker"}),
        ("agent_machine", {"gpu_runtime": None}),
        ("agent_machine", {"docker_network_mode": "levers9_net"}),
        ("agent_machine", {"ssh": {"jump": {"host": "10.0.0.1"}}}),
        ("agent_machine", {"ssh": {"jump": {"host": "2001:db8::1"}}}),
        ("agent_machine", {"ssh": {"jump": {"host": "bastion"}}}),
    ],
)
def test_other_valid_values(provider: str, changes: dict[str, Any]) -> None:
    validate(provider, **changes)


def test_none_word_means_no_gpu_runtime() -> None:
    assert validate("agent_machine", gpu_runtime="none").model_dump()["gpu_runtime"] is None


# --------------------------------------------------------------------------- invalid settings


@pytest.mark.parametrize(
    ("provider", "changes", "loc"),
    INVALID,
    ids=[f"{provider}-{'.'.join(map(str, loc))}-{i}" for i, (provider, _, loc) in enumerate(INVALID)],
)
def test_invalid_value_is_rejected_at_its_field(
    provider: str, changes: dict[str, Any], loc: tuple[str | int, ...]
) -> None:
    with pytest.raises(ValidationError) as excinfo:
        validate(provider, **changes)
    assert loc in error_locs(excinfo)


@pytest.mark.parametrize("provider", sorted(PLUGINS))
def test_unknown_key_is_rejected(provider: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        validate(provider, regoin="us-east-1")
    assert ("regoin",) in error_locs(excinfo)
    assert excinfo.value.errors()[0]["type"] == "extra_forbidden"


@pytest.mark.parametrize(
    ("provider", "missing"),
    [
        ("local_k8s", "worker_image"),
        ("attached_cluster", "cluster"),
        ("attached_cluster", "worker_image"),
        ("oci", "compartment_id"),
        ("oci", "subnet_id"),
        ("oci", "image_id"),
        ("lambda_labs", "ssh_key_names"),
        ("agent_machine", "worker_image"),
    ],
)
def test_required_field(provider: str, missing: str) -> None:
    data = {key: value for key, value in MINIMAL[provider].items() if key != missing}
    with pytest.raises(ValidationError) as excinfo:
        settings_model(provider).model_validate(data)
    assert (missing,) in error_locs(excinfo)


@pytest.mark.parametrize(
    "changes",
    [
        {"ami": None},  # neither
        {"ami_ssm_parameter": "/aws/service/deeplearning/ami/x86_64/x/latest/ami-id"},  # both
    ],
)
def test_ec2_needs_exactly_one_image_source(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="exactly one of 'ami' and 'ami_ssm_parameter'"):
        validate("ec2", **changes)


# --------------------------------------------------------------------------- credentials are references only


@pytest.mark.parametrize(
    ("provider", "changes", "loc"),
    SECRETS_AS_VALUES,
    ids=[f"{provider}-{'.'.join(map(str, loc))}-{i}" for i, (provider, _, loc) in enumerate(SECRETS_AS_VALUES)],
)
def test_credentials_are_not_accepted_as_values(
    provider: str, changes: dict[str, Any], loc: tuple[str | int, ...]
) -> None:
    with pytest.raises(ValidationError) as excinfo:
        validate(provider, **changes)
    assert loc in error_locs(excinfo)


def test_credential_values_do_not_leak_into_error_messages() -> None:
    """A pasted key is refused without the message repeating it (errors end up in logs)."""
    with pytest.raises(ValidationError) as excinfo:
        validate("lambda_labs", api_key_env="secret_ops_0123456789abcdef")
    messages = " ".join(error["msg"] for error in excinfo.value.errors())
    assert "0123456789abcdef" not in messages
    with pytest.raises(ValidationError) as excinfo:
        validate("ec2", access_key_id_env="AKIAIOSFODNN7EXAMPLE", secret_access_key_env="AWS_SECRET_ACCESS_KEY")
    messages = " ".join(error["msg"] for error in excinfo.value.errors())
    assert "AKIAIOSFODNN7EXAMPLE" not in messages


def test_ec2_credential_references_are_consistent() -> None:
    with pytest.raises(ValidationError, match="both access_key_id_env and secret_access_key_env"):
        validate("ec2", access_key_id_env="AWS_ACCESS_KEY_ID")
    with pytest.raises(ValidationError, match="either 'profile' or the"):
        validate(
            "ec2",
            profile="prod",
            access_key_id_env="AWS_ACCESS_KEY_ID",
            secret_access_key_env="AWS_SECRET_ACCESS_KEY",
        )
    with pytest.raises(ValidationError, match="session_token_env needs"):
        validate("ec2", session_token_env="AWS_SESSION_TOKEN")


@pytest.mark.parametrize(
    ("provider", "changes"),
    [
        ("ec2", {"access_key_id_env": "AWS_ACCESS_KEY_ID", "secret_access_key_env": "AWS_SECRET_ACCESS_KEY"}),
        ("oci", {"key_file": "/run/secrets/oci.pem", "pass_phrase_env": "OCI_PASS"}),
        ("lambda_labs", {"api_key_env": "LAMBDA_CLOUD_KEY"}),
        ("agent_machine", {"ssh": {"key_file": "/run/secrets/id_ed25519"}}),
        ("local_k8s", {"image_pull_secrets": ["ghcr-pull"]}),
    ],
)
def test_credential_references_are_accepted(provider: str, changes: dict[str, Any]) -> None:
    validate(provider, **changes)


@pytest.mark.parametrize("provider", sorted(PLUGINS))
def test_json_schema_for_editors(provider: str) -> None:
    """``levers9 config schema`` publishes these models; they must render, closed, with descriptions."""
    schema = settings_model(provider).model_json_schema()
    assert schema["additionalProperties"] is False
    assert all("description" in prop for prop in schema["properties"].values())
