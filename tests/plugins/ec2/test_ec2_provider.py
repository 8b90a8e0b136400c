"""The ``ec2`` provider beyond the contract kit: offers, EC2's errors, idempotent launches, listing, check.

Every test runs the real boto3 against the fake EC2 (moto's real catalog behind
the fault proxy, :mod:`tests.fakes.ec2_cloud`); errors are injected at the
wire, never by patching the SDK. Each test uses a provider object of its own;
they share the session's describe answers (moto lists its instance types in
seconds), except the tests that count or fault describe calls, whose provider
has a cache of its own.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from levers9.bootstrap import cloud_init
from levers9.gpu.catalog import CATALOG
from levers9.hooks.errors import (
    AuthenticationFailed,
    InsufficientCapacity,
    InvalidRequest,
    PermissionDenied,
    Throttled,
)
from levers9.hooks.types import (
    Availability,
    GpuOffer,
    Machine,
    MachineState,
    Pool,
)
from levers9_ec2.launch import MACHINE_ID_TAG, POOL_TAG, run_instances_params
from levers9_ec2.machines import state_of
from levers9_ec2.prices import catalog
from levers9_ec2.provider import Ec2Provider
from levers9_ec2.settings import Ec2Settings
from tests.fakes.ec2_cloud import FakeEc2
from tests.plugins.ec2.conftest import AMI, KEY_ID_ENV, SECRET, make_pool
from tests.plugins.provision import provision_request

#: where moto's catalog sells p5.48xlarge (8 H100) in us-east-1
P5_ZONES = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e", "us-east-1f"]


def first_offer(provider: Ec2Provider, pool: Pool) -> GpuOffer:
    offers = provider.levers9_gpu_offers(pool)
    assert offers, "no offers"
    return offers[0]


def of_machine(fake: FakeEc2, machine_id: str) -> list[Any]:
    return [i for i in fake.instances() if i.tags.get(MACHINE_ID_TAG) == machine_id]


# --------------------------------------------------------------------------- offers


def test_offers_come_from_the_real_catalog(provider: Ec2Provider, ec2_settings: dict[str, Any]) -> None:
    offers = provider.levers9_gpu_offers(make_pool(ec2_settings))
    assert [o.zone for o in offers] == P5_ZONES
    expected_price = catalog().price("us-east-1", "p5.48xlarge")
    assert expected_price is not None
    for offer in offers:
        assert offer.instance_type == "p5.48xlarge"
        assert (offer.gpu, offer.gpu_count, offer.gpu_memory_mib) == ("H100", 8, CATALOG["H100"].memory_mib)
        assert offer.region == "us-east-1"
        assert offer.cpu_millicores == 192_000
        assert offer.memory_mib == 2048 * 1024
        assert offer.availability is Availability.UNKNOWN
        assert offer.spot is False
        assert offer.price_per_hour == expected_price


def test_offers_map_gpu_types_and_counts(provider: Ec2Provider, ec2_settings: dict[str, Any]) -> None:
    """One A10G is g5.xlarge..g5.16xlarge (and no 4-GPU g5); cheapest-priced first, then fewer vCPUs."""
    offers = provider.levers9_gpu_offers(make_pool(ec2_settings, gpu="A10G", gpu_count=1))
    types = sorted({o.instance_type for o in offers if o.instance_type})
    assert types == ["g5.16xlarge", "g5.2xlarge", "g5.4xlarge", "g5.8xlarge", "g5.xlarge"]
    assert offers[0].instance_type == "g5.xlarge"
    assert all(o.gpu == "A10G" and o.gpu_count == 1 for o in offers)
    assert all(o.price_per_hour is None for o in offers)  # not in the shipped catalog: unpriced, still offered
    four = provider.levers9_gpu_offers(make_pool(ec2_settings, gpu="A10G", gpu_count=4))
    assert {o.instance_type for o in four} == {"g5.12xlarge", "g5.24xlarge"}
    g5_12 = [o for o in four if o.instance_type == "g5.12xlarge"]
    assert {o.price_per_hour for o in g5_12} == {catalog().price("us-east-1", "g5.12xlarge")}
    assert four[0].instance_type == "g5.12xlarge"  # priced before unpriced


def test_offers_cover_every_region_of_the_pool(provider: Ec2Provider, ec2_settings: dict[str, Any]) -> None:
    offers = provider.levers9_gpu_offers(make_pool(ec2_settings, regions=["us-west-2", "us-east-1"]))
    regions = [o.region or "" for o in offers]
    assert set(regions) == {"us-west-2", "us-east-1"}
    assert regions == sorted(regions, key=lambda r: ["us-west-2", "us-east-1"].index(r))  # the pool's order
    assert all(o.zone and o.zone.startswith(o.region or "?") for o in offers)


def test_a_cpu_pool_gets_no_offers(provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2) -> None:
    assert provider.levers9_gpu_offers(make_pool(ec2_settings, gpu=None, gpu_count=0)) == []
    assert fake_ec2.calls("DescribeInstanceTypes") == 0


def test_zones_are_narrowed_by_settings(provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2) -> None:
    zones = provider.levers9_gpu_offers(make_pool({**ec2_settings, "availability_zones": ["us-east-1c", "us-east-1e"]}))
    assert [o.zone for o in zones] == ["us-east-1c", "us-east-1e"]
    subnets = fake_ec2.client().describe_subnets(Filters=[{"Name": "availability-zone", "Values": ["us-east-1d"]}])
    subnet = subnets["Subnets"][0]["SubnetId"]
    by_subnet = provider.levers9_gpu_offers(make_pool({**ec2_settings, "subnet_ids": [subnet]}))
    assert [o.zone for o in by_subnet] == ["us-east-1d"]
    only = provider.levers9_gpu_offers(make_pool({**ec2_settings, "instance_types": ["p4d.24xlarge"]}))
    assert only == []  # 8 A100 40GB, not H100


def test_spot_offers_are_priced_from_the_spot_history(
    provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    spot = provider.levers9_gpu_offers(make_pool({**ec2_settings, "market": "spot"}))
    assert [o.zone for o in spot] == P5_ZONES
    assert all(o.spot for o in spot)
    assert {o.price_per_hour for o in spot} == {0.00001}  # what moto's spot price history says
    assert fake_ec2.calls("DescribeSpotPriceHistory") == 1
    preemptible = provider.levers9_gpu_offers(make_pool(ec2_settings, preemptible=True))
    assert all(o.spot for o in preemptible)
    on_demand = provider.levers9_gpu_offers(make_pool({**ec2_settings, "market": "on-demand"}, preemptible=True))
    assert not any(o.spot for o in on_demand)


def test_describe_answers_are_cached(
    fresh_provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    pool = make_pool(ec2_settings)
    with ThreadPoolExecutor(4) as pool_of_threads:
        answers = list(pool_of_threads.map(lambda _: fresh_provider.levers9_gpu_offers(pool), range(8)))
    assert all(a == answers[0] for a in answers)
    # the type listing is paginated (moto: a few pages); it was walked once, as were the offerings
    pages = fake_ec2.calls("DescribeInstanceTypes")
    assert pages >= 1
    assert fake_ec2.calls("DescribeInstanceTypeOfferings") == 1
    fresh_provider.levers9_gpu_offers(pool)
    assert fake_ec2.calls("DescribeInstanceTypes") == pages


def test_offers_fail_with_typed_errors(
    fresh_provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    fake_ec2.fail("DescribeInstanceTypes", "AuthFailure", message="AWS was not able to validate the credentials")
    with pytest.raises(AuthenticationFailed) as caught:
        fresh_provider.levers9_gpu_offers(make_pool(ec2_settings))
    assert caught.value.code == "AuthFailure"
    assert "pool 'train'" in str(caught.value)
    assert "us-east-1" in str(caught.value)


# --------------------------------------------------------------------------- provision


def test_provision_launches_the_offer(provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2) -> None:
    pool = make_pool({**ec2_settings, "tags": {"team": "ml"}, "root_volume_gib": 300})
    offer = provider.levers9_gpu_offers(pool)[2]
    request = provision_request(pool, offer)
    machine = provider.levers9_provision(request)
    assert machine.machine_id == request.machine_id
    assert (machine.region, machine.zone, machine.instance_type) == ("us-east-1", offer.zone, "p5.48xlarge")
    assert machine.provider_data == {"region": "us-east-1", "zone": offer.zone}
    assert machine.state is MachineState.PENDING
    (found,) = of_machine(fake_ec2, request.machine_id)
    assert found.id == machine.provider_id
    assert found.tags == {
        MACHINE_ID_TAG: request.machine_id,
        POOL_TAG: "train",
        "Name": f"levers9-{request.machine_id}",
        "team": "ml",
    }
    # the bootstrap as it is, with the worker told to show its instance's identity (test_ec2_identity.py)
    shown = {**request.bootstrap.environment, "LEVERS9_MACHINE_IDENTITY": "ec2"}
    assert found.user_data == cloud_init(request.bootstrap.model_copy(update={"environment": shown}))
    assert fake_ec2.calls("RunInstances") == 1
    described = fake_ec2.client().describe_instances(InstanceIds=[machine.provider_id])
    instance = described["Reservations"][0]["Instances"][0]
    assert instance["MetadataOptions"]["HttpTokens"] == "required"
    assert instance["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert [m["DeviceName"] for m in instance["BlockDeviceMappings"]] == ["/dev/xvda"]  # the AMI's root device
    volume_id = instance["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
    volume = fake_ec2.client().describe_volumes(VolumeIds=[volume_id])["Volumes"][0]
    assert volume["Size"] == 300


def test_provision_picks_a_subnet_of_the_offers_zone(
    provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    subnets = fake_ec2.client().describe_subnets()["Subnets"]
    chosen = {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}
    pool = make_pool({**ec2_settings, "subnet_ids": [chosen["us-east-1b"], chosen["us-east-1c"]]})
    offers = provider.levers9_gpu_offers(pool)
    assert [o.zone for o in offers] == ["us-east-1b", "us-east-1c"]
    machine = provider.levers9_provision(provision_request(pool, offers[1]))
    assert machine.zone == "us-east-1c"
    described = fake_ec2.client().describe_instances(InstanceIds=[machine.provider_id])
    assert described["Reservations"][0]["Instances"][0]["SubnetId"] == chosen["us-east-1c"]


def test_provision_spot(provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2) -> None:
    pool = make_pool({**ec2_settings, "market": "spot", "max_spot_price": 40.0})
    offer = first_offer(provider, pool)
    assert offer.spot
    machine = provider.levers9_provision(provision_request(pool, offer))
    described = fake_ec2.client().describe_instances(InstanceIds=[machine.provider_id])
    assert described["Reservations"][0]["Instances"][0].get("InstanceLifecycle") == "spot"


def test_throttling_says_when_to_retry(provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2) -> None:
    pool = make_pool(ec2_settings)
    fake_ec2.fail_run_instances("RequestLimitExceeded", times=1)
    request = provision_request(pool, first_offer(provider, pool))
    with pytest.raises(Throttled) as caught:
        provider.levers9_provision(request)
    assert caught.value.retry_after is not None
    assert caught.value.retry_after > 0
    machine = provider.levers9_provision(request)  # the core's retry, later: the fault was for one call only
    assert [i.id for i in of_machine(fake_ec2, request.machine_id)] == [machine.provider_id]


def test_a_sold_out_zone_fails_only_its_offers(
    provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    pool = make_pool(ec2_settings)
    offers = provider.levers9_gpu_offers(pool)
    fake_ec2.fail_run_instances("InsufficientInstanceCapacity", zone=offers[0].zone, instance_type="p5.48xlarge")
    with pytest.raises(InsufficientCapacity):
        provider.levers9_provision(provision_request(pool, offers[0]))
    machine = provider.levers9_provision(provision_request(pool, offers[1]))
    assert machine.zone == offers[1].zone


def test_a_lost_answer_is_asked_again_with_the_same_token(
    provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    pool = make_pool(ec2_settings)
    request = provision_request(pool, first_offer(provider, pool))
    fake_ec2.timeout_after_create(times=1)
    machine = provider.levers9_provision(request)
    assert fake_ec2.calls("RunInstances") == 2
    assert [i.id for i in of_machine(fake_ec2, request.machine_id)] == [machine.provider_id]


def test_provision_is_idempotent_per_machine_id(
    provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    pool = make_pool(ec2_settings)
    request = provision_request(pool, first_offer(provider, pool))
    first = provider.levers9_provision(request)
    again = provider.levers9_provision(request)
    assert again.provider_id == first.provider_id
    assert len(of_machine(fake_ec2, request.machine_id)) == 1


def test_no_answer_at_all_is_throttled(provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2) -> None:
    pool = make_pool(ec2_settings)
    request = provision_request(pool, first_offer(provider, pool))
    fake_ec2.timeout_after_create(times=10)
    with pytest.raises(Throttled) as caught:
        provider.levers9_provision(request)
    assert caught.value.code == "ConnectionClosedError"
    assert fake_ec2.calls("RunInstances") == 3  # LAUNCH_ATTEMPTS, all with the same token
    assert len(of_machine(fake_ec2, request.machine_id)) == 1  # still one instance: the core's retry finds it


def test_an_unknown_ami_is_an_invalid_request(provider: Ec2Provider, ec2_settings: dict[str, Any]) -> None:
    pool = make_pool({**ec2_settings, "ami": "ami-0badbadbadbadbad0"})
    with pytest.raises(InvalidRequest) as caught:
        provider.levers9_provision(provision_request(pool, first_offer(provider, pool)))
    assert caught.value.code == "InvalidAMIID.NotFound"
    assert "ami-0badbadbadbadbad0" in str(caught.value)


def test_unset_key_variable_names_it_not_its_value(
    provider: Ec2Provider, ec2_settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = make_pool(ec2_settings)
    monkeypatch.delenv(KEY_ID_ENV)
    with pytest.raises(AuthenticationFailed) as caught:
        provider.levers9_gpu_offers(pool)
    assert KEY_ID_ENV in str(caught.value)
    assert SECRET not in str(caught.value)


# --------------------------------------------------------------------------- the request itself


def _settings(**values: Any) -> Ec2Settings:
    return Ec2Settings.model_validate({"ami": AMI, **values})


def test_public_ip_moves_subnet_and_groups_into_the_interface(ec2_settings: dict[str, Any]) -> None:
    pool = make_pool(ec2_settings)
    settings = _settings(
        public_ip=True,
        security_group_ids=["sg-0123456789abcdef0"],
        iam_instance_profile="levers9-worker",
        key_name="debug",
    )
    params = run_instances_params(
        provision_request(pool, None, "m-1"),
        settings,
        instance_type="p5.48xlarge",
        zone="us-east-1a",
        subnet_id="subnet-0123456789abcdef0",
        root_device="/dev/xvda",
        spot=False,
    )
    assert "SubnetId" not in params
    assert "SecurityGroupIds" not in params
    assert "Placement" not in params
    assert params["NetworkInterfaces"] == [
        {
            "DeviceIndex": 0,
            "AssociatePublicIpAddress": True,
            "DeleteOnTermination": True,
            "SubnetId": "subnet-0123456789abcdef0",
            "Groups": ["sg-0123456789abcdef0"],
        }
    ]
    assert params["IamInstanceProfile"] == {"Name": "levers9-worker"}
    assert params["KeyName"] == "debug"
    assert (params["MinCount"], params["MaxCount"], params["ClientToken"]) == (1, 1, "m-1")
    assert "InstanceMarketOptions" not in params


def test_ssm_image_spot_and_placement() -> None:
    settings = Ec2Settings.model_validate(
        {
            "ami_ssm_parameter": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
            "market": "spot",
            "max_spot_price": 30.5,
            "iam_instance_profile": "arn:aws:iam::123456789012:instance-profile/levers9-worker",
        }
    )
    pool = Pool(name="p", provider="ec2", runtime="process", gpu="H100", gpu_count=8, settings=settings)
    params = run_instances_params(
        provision_request(pool, None, "m-2"),
        settings,
        instance_type="p5.48xlarge",
        zone="us-east-1b",
        subnet_id=None,
        root_device="/dev/sda1",
        spot=True,
    )
    assert params["ImageId"].startswith("resolve:ssm:/aws/service/deeplearning/")
    assert params["Placement"] == {"AvailabilityZone": "us-east-1b"}
    assert params["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
            "MaxPrice": "30.5",
        },
    }
    assert params["IamInstanceProfile"] == {"Arn": "arn:aws:iam::123456789012:instance-profile/levers9-worker"}
    assert [spec["ResourceType"] for spec in params["TagSpecifications"]] == ["instance", "volume"]
    assert params["BlockDeviceMappings"][0]["DeviceName"] == "/dev/sda1"
    assert params["BlockDeviceMappings"][0]["Ebs"] == {
        "VolumeSize": 200,
        "VolumeType": "gp3",
        "DeleteOnTermination": True,
    }
    assert base64.b64encode(params["UserData"].encode())  # text: boto3 base64-encodes it


# --------------------------------------------------------------------------- terminate, list


def test_terminate_twice_and_unknown_ids_succeed(
    provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    pool = make_pool(ec2_settings)
    machine = provider.levers9_provision(provision_request(pool, first_offer(provider, pool)))
    provider.levers9_terminate(pool, machine)
    provider.levers9_terminate(pool, machine)
    (found,) = [i for i in fake_ec2.instances() if i.id == machine.provider_id]
    assert found.gone
    for unknown in ("i-0123456789abcdef0", "not-an-instance-id"):
        provider.levers9_terminate(
            pool, Machine(provider_id=unknown, pool=pool.name, provider_data={"region": "us-east-1"})
        )


def test_terminate_goes_to_the_machines_own_region(
    provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    pool = make_pool(ec2_settings, regions=["us-east-1", "us-west-2"])
    west = next(o for o in provider.levers9_gpu_offers(pool) if o.region == "us-west-2")
    machine = provider.levers9_provision(provision_request(pool, west))
    assert machine.provider_data["region"] == "us-west-2"
    provider.levers9_terminate(pool, machine)
    (found,) = [i for i in fake_ec2.instances() if i.id == machine.provider_id]
    assert found.region == "us-west-2"
    assert found.gone


def test_terminate_errors_are_typed(provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2) -> None:
    pool = make_pool(ec2_settings)
    fake_ec2.fail("TerminateInstances", "UnauthorizedOperation", message="You are not authorized (encoded: xyz)")
    with pytest.raises(PermissionDenied) as caught:
        provider.levers9_terminate(pool, Machine(provider_id="i-0123456789abcdef0", pool=pool.name, region="us-east-1"))
    assert "encoded: xyz" in str(caught.value)


def test_listing_filters_by_pool_and_maps_states(
    provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    ours = make_pool(ec2_settings, name="ours")
    theirs = make_pool(ec2_settings, name="theirs")
    running = provider.levers9_provision(provision_request(ours, first_offer(provider, ours)))
    stopped = provider.levers9_provision(provision_request(ours, first_offer(provider, ours)))
    gone = provider.levers9_provision(provision_request(ours, first_offer(provider, ours)))
    other = provider.levers9_provision(provision_request(theirs, first_offer(provider, theirs)))
    fake_ec2.stop_instance(stopped.provider_id)
    provider.levers9_terminate(ours, gone)
    listed = {m.provider_id: m for m in provider.levers9_list_machines(ours)}
    assert set(listed) == {running.provider_id, stopped.provider_id}
    assert listed[running.provider_id].state in (MachineState.PENDING, MachineState.RUNNING)
    assert listed[running.provider_id].machine_id == running.machine_id
    assert listed[running.provider_id].provider_data == running.provider_data
    assert listed[stopped.provider_id].state is MachineState.FAILED
    assert "stopped" in (listed[stopped.provider_id].reason or "")
    assert [m.provider_id for m in provider.levers9_list_machines(theirs)] == [other.provider_id]


def test_spot_interruption_is_preempted() -> None:
    interrupted = {
        "State": {"Name": "shutting-down"},
        "InstanceLifecycle": "spot",
        "StateReason": {"Code": "Server.SpotInstanceTermination", "Message": "Server.SpotInstanceTermination: ..."},
    }
    assert state_of(interrupted)[0] is MachineState.PREEMPTED
    assert state_of({"State": {"Name": "shutting-down"}})[0] is MachineState.STOPPING
    assert state_of({"State": {"Name": "stopping"}})[0] is MachineState.STOPPING
    assert state_of({"State": {"Name": "pending"}}) == (MachineState.PENDING, None)
    state, reason = state_of({"State": {"Name": "stopped"}, "StateReason": {"Message": "Client.UserInitiatedShutdown"}})
    assert state is MachineState.FAILED
    assert reason == "instance stopped: Client.UserInitiatedShutdown"


# --------------------------------------------------------------------------- check


def test_check_accepts_working_keys(provider: Ec2Provider, ec2_settings: dict[str, Any]) -> None:
    check = provider.levers9_check(make_pool(ec2_settings))
    assert check.ok, check
    assert f"keys from ${KEY_ID_ENV}" in check.message
    assert "arn:aws:" in check.message
    assert "us-east-1" in check.message
    assert SECRET not in check.message


def test_check_explains_an_unset_variable(
    provider: Ec2Provider, ec2_settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch, fake_ec2: FakeEc2
) -> None:
    monkeypatch.delenv(KEY_ID_ENV)
    check = provider.levers9_check(make_pool(ec2_settings))
    assert not check.ok
    assert KEY_ID_ENV in check.message
    assert check.hint
    assert "export" in check.hint
    assert fake_ec2.calls("GetCallerIdentity") == 0


def test_check_reports_rejected_keys_without_secrets(
    provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    fake_ec2.fail("GetCallerIdentity", "InvalidClientTokenId", message="The security token included is invalid.")
    check = provider.levers9_check(make_pool(ec2_settings))
    assert not check.ok
    assert "InvalidClientTokenId" in check.message
    assert check.hint
    assert "aws sts get-caller-identity" in check.hint
    assert SECRET not in check.message + check.hint


def test_check_reports_a_missing_permission(
    provider: Ec2Provider, ec2_settings: dict[str, Any], fake_ec2: FakeEc2
) -> None:
    fake_ec2.fail("DescribeInstanceTypeOfferings", "UnauthorizedOperation")
    check = provider.levers9_check(make_pool(ec2_settings))
    assert not check.ok
    assert check.hint
    assert "ec2:DescribeInstanceTypeOfferings" in check.hint


# --------------------------------------------------------------------------- the plugin as installed


def test_importing_the_plugin_does_not_import_boto3() -> None:
    code = "import levers9_ec2, sys; assert 'boto3' not in sys.modules and 'botocore' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_clients_are_shared_between_threads(provider: Ec2Provider, ec2_settings: dict[str, Any]) -> None:
    settings = Ec2Settings.model_validate(ec2_settings)
    barrier = threading.Barrier(6)

    def make() -> Any:
        barrier.wait()
        return provider.clients.ec2(settings, "train", "us-east-1")

    with ThreadPoolExecutor(6) as threads:
        clients = list(threads.map(lambda _: make(), range(6)))
    assert all(c is clients[0] for c in clients)
    assert provider.clients.ec2(settings, "train", "us-east-1", launch=True) is not clients[0]
    assert (
        provider.clients.ec2(settings, "train", "us-east-1", launch=True).meta.config.retries["total_max_attempts"] == 1
    )


def test_check_with_a_profile_and_without_any_credentials(
    provider: Ec2Provider, fake_ec2: FakeEc2, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A named profile of the shared files works; an unknown one, or no credentials at all, is explained."""
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[levers9-test]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = {SECRET}\n"
    )
    config = tmp_path / "config"
    config.write_text("")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    base = {"ami": AMI, "endpoint_url": fake_ec2.url}
    good = provider.levers9_check(make_pool({**base, "profile": "levers9-test"}))
    assert good.ok, good
    assert "profile 'levers9-test'" in good.message
    unknown = provider.levers9_check(make_pool({**base, "profile": "nope"}))
    assert not unknown.ok
    assert unknown.hint
    assert "'nope'" in unknown.hint
    credentials.write_text("")
    bare = provider.levers9_check(make_pool(base))
    assert not bare.ok
    assert "NoCredentialsError" in bare.message
    assert bare.hint
    assert "access_key_id_env" in bare.hint
