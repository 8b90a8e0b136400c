"""The ``oci`` provider beyond the contract: offers, the launch call, errors at the wire, listing, auth, check.

Every test drives :class:`levers9_oci.provider.OciProvider` (the object the
hooks delegate to) with the real SDK against the fake region of
:mod:`tests.fakes.oci_cloud`; failures are injected in the fake's answers,
never in the SDK.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from levers9.bootstrap import cloud_init
from levers9.hooks.errors import (
    AuthenticationFailed,
    InsufficientCapacity,
    InvalidRequest,
    PermissionDenied,
    ProviderError,
    QuotaExceeded,
    Throttled,
)
from levers9.hooks.types import Availability, Machine, MachineState, Pool
from levers9_oci.provider import LAUNCH_ATTEMPTS, MACHINE_TAG, POOL_TAG, OciProvider
from tests.fakes.oci_cloud import API_VERSION, FakeOci
from tests.fakes.oci_tenancy import (
    AD1,
    AD2,
    COMPARTMENT,
    IMAGE,
    REGION,
    SUBNET,
    OciCredentials,
    fingerprint,
    write_config,
)
from tests.fixtures.ports import free_port
from tests.plugins.provision import provision_request

MakePool = Callable[..., Pool]


def provision(provider: OciProvider, pool: Pool, machine_id: str | None = None) -> Machine:
    offers = provider.levers9_gpu_offers(pool) if pool.gpu else []
    return provider.levers9_provision(provision_request(pool, offers[0] if offers else None, machine_id))


# ---------------------------------------------------------------------- offers


def test_offers_come_from_the_recorded_shapes_per_domain(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    fake_oci.page_size = 3  # 11 recorded shapes: four pages per domain
    offers = provider.levers9_gpu_offers(make_pool(gpu="A10", gpu_count=1))
    assert [(o.instance_type, o.zone) for o in offers] == [("VM.GPU.A10.1", AD1), ("VM.GPU.A10.1", AD2)]
    for offer in offers:
        assert (offer.gpu, offer.gpu_count, offer.region) == ("A10", 1, REGION)
        assert offer.cpu_millicores == 30_000  # 15 OCPUs are 30 vCPUs
        assert offer.memory_mib == 240 * 1024
        assert offer.gpu_memory_mib == 24_576
        assert offer.price_per_hour == 1.27  # the shipped catalog's (test_oci_prices.py)
        assert offer.availability is Availability.AVAILABLE
    assert fake_oci.calls("ListAvailabilityDomains") == 1
    assert fake_oci.calls("ListShapes") == 8


def test_offers_keep_the_pools_gpu_count_and_shapes(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    two = provider.levers9_gpu_offers(make_pool(gpu="A10", gpu_count=2))
    assert {o.instance_type for o in two} == {"VM.GPU.A10.2"}
    h100 = provider.levers9_gpu_offers(make_pool(gpu="H100", gpu_count=8, shapes=["BM.GPU.H200.8"]))
    assert h100 == []
    pinned = provider.levers9_gpu_offers(make_pool(gpu="A10", gpu_count=1, availability_domains=[AD2]))
    assert [o.zone for o in pinned] == [AD2]
    assert fake_oci.calls("ListAvailabilityDomains") == 2  # not asked for the pinned pool


def test_a_cpu_pool_has_no_offers(provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci) -> None:
    assert provider.levers9_gpu_offers(make_pool(gpu=None)) == []
    assert fake_oci.calls("ListShapes") == 0


def test_each_region_of_the_pool_gets_its_own_offers(provider: OciProvider, make_pool: MakePool) -> None:
    offers = provider.levers9_gpu_offers(make_pool(regions=[REGION, "us-phoenix-1"]))
    assert [o.region for o in offers] == [REGION, REGION, "us-phoenix-1", "us-phoenix-1"]


def test_the_capacity_report_marks_a_sold_out_domain(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    fake_oci.capacity("VM.GPU.A10.1", AD2, "OUT_OF_HOST_CAPACITY")
    offers = {o.zone: o.availability for o in provider.levers9_gpu_offers(make_pool())}
    assert offers == {AD1: Availability.AVAILABLE, AD2: Availability.UNAVAILABLE}
    assert fake_oci.calls("CreateComputeCapacityReport") == 2


def test_a_failed_capacity_report_leaves_availability_unknown(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    fake_oci.fail("CreateComputeCapacityReport", 500, "InternalServerError", "Internal error")
    offers = provider.levers9_gpu_offers(make_pool())
    assert len(offers) == 2
    assert {o.availability for o in offers} == {Availability.UNKNOWN}


def test_listing_shapes_throttled_is_throttled(provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci) -> None:
    fake_oci.rate_limit("ListShapes", times=1, retry_after=7)
    with pytest.raises(Throttled) as caught:
        provider.levers9_gpu_offers(make_pool())
    assert caught.value.code == "TooManyRequests"
    assert caught.value.retry_after == 7
    assert fake_oci.calls("ListShapes") == 1  # no SDK retry


# ---------------------------------------------------------------------- provision


def test_launch_sends_what_the_pool_says(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci, tmp_path: Path
) -> None:
    keys = tmp_path / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOCI test@levers9\n")
    pool = make_pool(
        "gpu-a10", freeform_tags={"team": "ml"}, ssh_authorized_keys_file=str(keys), assign_public_ip=False
    )
    offer = provider.levers9_gpu_offers(pool)[0]
    request = provision_request(pool, offer)
    machine = provider.levers9_provision(request)

    assert machine.provider_id.startswith("ocid1.instance.")
    assert machine.machine_id == request.machine_id
    assert (machine.region, machine.zone, machine.instance_type) == (REGION, AD1, "VM.GPU.A10.1")
    assert machine.provider_data == {"region": REGION, "compartment_id": COMPARTMENT, "availability_domain": AD1}
    assert machine.state is MachineState.PENDING
    body = fake_oci.launch_body(machine.provider_id)
    assert body["availabilityDomain"] == AD1
    assert body["compartmentId"] == COMPARTMENT
    assert body["shape"] == "VM.GPU.A10.1"
    assert "shapeConfig" not in body or body["shapeConfig"] is None
    assert body["sourceDetails"] == {"sourceType": "image", "imageId": IMAGE, "bootVolumeSizeInGBs": 200}
    assert body["createVnicDetails"] == {"subnetId": SUBNET, "assignPublicIp": False}
    assert body["displayName"] == f"levers9-{request.machine_id}"
    assert body["freeformTags"] == {"team": "ml", MACHINE_TAG: request.machine_id, POOL_TAG: "gpu-a10"}
    assert base64.b64decode(body["metadata"]["user_data"]).decode() == cloud_init(request.bootstrap)
    assert body["metadata"]["ssh_authorized_keys"] == keys.read_text().strip()
    assert body.get("preemptibleInstanceConfig") is None
    (held,) = fake_oci.instances()
    assert held.user_data == cloud_init(request.bootstrap)


def test_a_preemptible_pool_launches_preemptible_instances(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    machine = provision(provider, make_pool(preemptible=True))
    assert fake_oci.launch_body(machine.provider_id)["preemptibleInstanceConfig"] == {
        "preemptionAction": {"type": "TERMINATE", "preserveBootVolume": False}
    }


def test_a_flex_shape_gets_the_pools_shape_config(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    pool = make_pool("cpu", gpu=None, shapes=["VM.Standard.E4.Flex"], shape_config={"ocpus": 4, "memory_in_gbs": 32})
    machine = provider.levers9_provision(provision_request(pool, None))
    assert machine.instance_type == "VM.Standard.E4.Flex"
    assert machine.zone == AD1  # the region's first domain
    assert fake_oci.launch_body(machine.provider_id)["shapeConfig"] == {"ocpus": 4.0, "memoryInGBs": 32.0}


def test_a_pool_without_offer_or_shape_is_an_invalid_request(provider: OciProvider, make_pool: MakePool) -> None:
    with pytest.raises(InvalidRequest, match=r"settings\.shapes"):
        provider.levers9_provision(provision_request(make_pool("cpu", gpu=None), None))


LAUNCH_ERRORS = [
    (500, "InternalError", "Out of host capacity.", InsufficientCapacity),
    (400, "LimitExceeded", "The limit for gpu-a10-count is reached", QuotaExceeded),
    (400, "QuotaExceeded", "Quota gpu-a10-count exceeded in the compartment", QuotaExceeded),
    (429, "TooManyRequests", "Too many requests", Throttled),
    (500, "InternalServerError", "Internal server error", Throttled),
    (503, "ServiceUnavailable", "The service is unavailable", Throttled),
    (
        401,
        "NotAuthenticated",
        "The required information to complete authentication was not provided",
        AuthenticationFailed,
    ),
    (403, "NotAuthorized", "Not authorized to launch instances", PermissionDenied),
    (400, "InvalidParameter", "Shape is not valid", InvalidRequest),
    (400, "MissingParameter", "subnetId is required", InvalidRequest),
    (400, "CannotParseRequest", "The request is incorrectly formatted", InvalidRequest),
    (400, "RelatedResourceNotAuthorizedOrNotFound", "Subnet not found", InvalidRequest),
    (404, "NotAuthorizedOrNotFound", "Compartment not found", InvalidRequest),
]


@pytest.mark.parametrize(
    ("status", "code", "message", "error"), LAUNCH_ERRORS, ids=[f"{s}-{c}" for s, c, _, _ in LAUNCH_ERRORS]
)
def test_launch_errors_become_typed_errors_in_one_call(
    provider: OciProvider,
    make_pool: MakePool,
    fake_oci: FakeOci,
    status: int,
    code: str,
    message: str,
    error: type[ProviderError],
) -> None:
    pool = make_pool("gpu-a10")
    offer = provider.levers9_gpu_offers(pool)[1]
    fake_oci.fail_launch(status, code, message, shape="VM.GPU.A10.1", domain=AD2)
    with pytest.raises(ProviderError) as caught:
        provider.levers9_provision(provision_request(pool, offer))
    assert type(caught.value) is error
    assert caught.value.code == code
    text = str(caught.value)
    for name in ("gpu-a10", REGION, "VM.GPU.A10.1", AD2, message):
        assert name in text
    assert fake_oci.calls("LaunchInstance") == 1  # no SDK retry, whatever the status
    assert fake_oci.instances() == []


def test_throttling_carries_retry_after(provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci) -> None:
    pool = make_pool()
    offer = provider.levers9_gpu_offers(pool)[0]
    fake_oci.rate_limit("LaunchInstance", times=1, retry_after=3)
    with pytest.raises(Throttled) as caught:
        provider.levers9_provision(provision_request(pool, offer))
    assert caught.value.retry_after == 3
    assert provider.levers9_provision(provision_request(pool, offer)).provider_id  # the next call goes through


def test_out_of_host_capacity_fails_in_exactly_one_launch_call(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    pool = make_pool(availability_domains=[AD2])
    fake_oci.capacity(None, AD2, "OUT_OF_HOST_CAPACITY")
    (offer,) = provider.levers9_gpu_offers(pool)
    assert offer.availability is Availability.UNAVAILABLE
    with pytest.raises(InsufficientCapacity) as caught:
        provider.levers9_provision(provision_request(pool, offer))
    assert caught.value.code == "InternalError"
    assert fake_oci.calls("LaunchInstance") == 1


def test_a_lost_launch_answer_is_resent_with_the_same_token(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    pool = make_pool()
    offer = provider.levers9_gpu_offers(pool)[0]
    fake_oci.drop_launch_response(times=1)
    request = provision_request(pool, offer)
    machine = provider.levers9_provision(request)
    assert fake_oci.calls("LaunchInstance") == 2
    (held,) = fake_oci.instances()
    assert held.id == machine.provider_id
    assert held.tags[MACHINE_TAG] == request.machine_id


def test_a_launch_never_answered_is_throttled_and_the_cores_retry_finds_the_same_instance(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    pool = make_pool()
    offer = provider.levers9_gpu_offers(pool)[0]
    fake_oci.drop_launch_response(times=LAUNCH_ATTEMPTS)
    request = provision_request(pool, offer)
    with pytest.raises(Throttled):
        provider.levers9_provision(request)
    assert fake_oci.calls("LaunchInstance") == LAUNCH_ATTEMPTS
    machine = provider.levers9_provision(request)  # the core's retry, same machine id
    (held,) = fake_oci.instances()
    assert held.id == machine.provider_id


def test_provisioning_the_same_machine_twice_starts_one_instance(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    pool = make_pool()
    offer = provider.levers9_gpu_offers(pool)[0]
    request = provision_request(pool, offer)
    first = provider.levers9_provision(request)
    second = provider.levers9_provision(request)
    assert first.provider_id == second.provider_id
    assert len(fake_oci.instances()) == 1


def test_a_retry_token_reused_for_other_parameters_or_a_terminated_instance_is_invalid(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    pool = make_pool()
    first, second = provider.levers9_gpu_offers(pool)
    request = provision_request(pool, first)
    machine = provider.levers9_provision(request)
    with pytest.raises(InvalidRequest) as caught:
        provider.levers9_provision(request.model_copy(update={"offer": second}))  # same machine id, another domain
    assert caught.value.code == "Conflict"
    provider.levers9_terminate(pool, machine)
    with pytest.raises(InvalidRequest) as caught:
        provider.levers9_provision(request)
    assert caught.value.code == "InvalidatedRetryToken"
    assert len(fake_oci.instances()) == 1


def test_provisions_from_many_threads_at_once_each_start_one_instance(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    pool = make_pool()
    offer = provider.levers9_gpu_offers(pool)[0]
    requests = [provision_request(pool, offer) for _ in range(6)]
    machines: list[Machine] = []
    errors: list[BaseException] = []

    def start(request: Any) -> None:
        try:
            machines.append(provider.levers9_provision(request))
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(r,)) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert {m.machine_id for m in machines} == {r.machine_id for r in requests}
    assert {i.tags[MACHINE_TAG] for i in fake_oci.instances()} == {r.machine_id for r in requests}
    assert {m.machine_id for m in provider.levers9_list_machines(pool)} == {r.machine_id for r in requests}


def test_an_unreachable_api_is_throttled(provider: OciProvider, make_pool: MakePool) -> None:
    pool = make_pool(service_endpoint=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(Throttled) as caught:
        provider.levers9_list_machines(pool)
    assert caught.value.code in ("RequestException", "ConnectTimeout")
    with pytest.raises(Throttled):
        provider.levers9_provision(
            provision_request(
                make_pool(
                    service_endpoint=pool.settings.service_endpoint, shapes=["VM.GPU.A10.1"], availability_domains=[AD1]
                ),
                None,
            )
        )


# ---------------------------------------------------------------------- terminate


def test_terminating_twice_and_unknown_ids_succeed(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    pool = make_pool()
    machine = provision(provider, pool)
    provider.levers9_terminate(pool, machine)
    (held,) = fake_oci.instances()
    assert held.gone
    assert fake_oci.terminations(machine.provider_id) == [
        {"preserveBootVolume": "false", "preserveDataVolumesCreatedAtLaunch": "false"}
    ]
    provider.levers9_terminate(pool, machine)  # TERMINATED: 409 IncorrectState, which is success here
    unknown = machine.model_copy(update={"provider_id": "ocid1.instance.oc1.iad.aaaaaaaanotthere"})
    provider.levers9_terminate(pool, unknown)  # 404 NotAuthorizedOrNotFound
    assert fake_oci.calls("TerminateInstance") == 3
    provider.levers9_terminate(pool, machine.model_copy(update={"provider_id": "not-an-ocid"}))
    assert fake_oci.calls("TerminateInstance") == 3


def test_terminate_uses_the_machines_own_region(provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci) -> None:
    machine = provision(provider, make_pool())
    elsewhere = make_pool(regions=["us-phoenix-1"])  # the pool moved on; the machine stays where it was started
    provider.levers9_terminate(elsewhere, machine)
    assert fake_oci.instances()[0].gone
    assert {c.region for c in provider.clients.made()} == {REGION}


def test_terminate_denied_is_permission_denied(provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci) -> None:
    pool = make_pool()
    machine = provision(provider, pool)
    fake_oci.fail("TerminateInstance", 403, "NotAuthorized", "Not authorized to terminate", times=1)
    with pytest.raises(PermissionDenied) as caught:
        provider.levers9_terminate(pool, machine)
    assert caught.value.code == "NotAuthorized"
    assert machine.provider_id in str(caught.value)


# ---------------------------------------------------------------------- list


def test_listing_filters_by_pool_tag_over_pages_and_drops_terminated(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci
) -> None:
    mine, other = make_pool("mine"), make_pool("other")
    kept = [provision(provider, mine) for _ in range(3)]
    for _ in range(2):
        provision(provider, other)
    provider.levers9_terminate(mine, kept[0])
    fake_oci.page_size = 2
    before = fake_oci.calls("ListInstances")
    listed = {m.provider_id: m for m in provider.levers9_list_machines(mine)}
    assert fake_oci.calls("ListInstances") - before == 3  # five instances, two a page
    assert set(listed) == {m.provider_id for m in kept[1:]}
    for machine in kept[1:]:
        found = listed[machine.provider_id]
        assert found.machine_id == machine.machine_id
        assert found.state is MachineState.RUNNING
        assert found.provider_data == machine.provider_data
        assert (found.region, found.zone, found.instance_type) == (REGION, machine.zone, "VM.GPU.A10.1")


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("PROVISIONING", MachineState.PENDING),
        ("STARTING", MachineState.PENDING),
        ("RUNNING", MachineState.RUNNING),
        ("STOPPING", MachineState.STOPPING),
        ("TERMINATING", MachineState.STOPPING),
        ("STOPPED", MachineState.FAILED),
    ],
)
def test_listing_maps_lifecycle_states(
    provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci, state: str, expected: MachineState
) -> None:
    pool = make_pool()
    machine = provision(provider, pool)
    fake_oci.set_state(machine.provider_id, state)
    (found,) = provider.levers9_list_machines(pool)
    assert found.state is expected
    assert (found.reason is not None) == (expected is MachineState.FAILED)


def test_a_preempted_instance_leaves_the_listing(provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci) -> None:
    pool = make_pool(preemptible=True)
    machine = provision(provider, pool)
    fake_oci.set_state(machine.provider_id, "TERMINATED")
    assert provider.levers9_list_machines(pool) == []


def test_listing_in_an_unknown_compartment_is_an_invalid_request(provider: OciProvider, make_pool: MakePool) -> None:
    pool = make_pool(compartment_id="ocid1.compartment.oc1..aaaaaaaanosuchcompartment")
    with pytest.raises(InvalidRequest) as caught:
        provider.levers9_list_machines(pool)
    assert caught.value.code == "NotAuthorizedOrNotFound"


# ---------------------------------------------------------------------- authentication


def other_key_config(tmp_path: Path, name: str, *, same_fingerprint: str | None = None) -> Path:
    """A config whose key the fake does not know (or, with ``same_fingerprint``, claims a known keyId)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_file = tmp_path / f"{name}.pem"
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return write_config(tmp_path / f"{name}.config", key_file, same_fingerprint or fingerprint(key.public_key()))


def test_an_unknown_key_is_authentication_failed(provider: OciProvider, make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool(config_file=str(other_key_config(tmp_path, "stranger")))
    with pytest.raises(AuthenticationFailed) as caught:
        provider.levers9_gpu_offers(pool)
    assert caught.value.code == "NotAuthenticated"


def test_a_bad_signature_is_authentication_failed(
    provider: OciProvider, make_pool: MakePool, tmp_path: Path, oci_credentials: OciCredentials, fake_oci: FakeOci
) -> None:
    """The keyId is the known one, but the request is signed by another key: the signature does not verify."""
    pool = make_pool(
        config_file=str(other_key_config(tmp_path, "forger", same_fingerprint=oci_credentials.fingerprint))
    )
    with pytest.raises(AuthenticationFailed) as caught:
        provider.levers9_list_machines(pool)
    assert caught.value.code == "NotAuthenticated"
    assert fake_oci.calls("ListInstances") == 1


def test_the_fake_refuses_unsigned_requests(fake_oci: FakeOci) -> None:
    url = f"{fake_oci.url}/{API_VERSION}/instances?compartmentId={COMPARTMENT}"
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(url, timeout=10)
    assert caught.value.code == 401
    assert caught.value.headers["opc-request-id"]
    assert json.loads(caught.value.read())["code"] == "NotAuthenticated"


def test_unreadable_credentials_are_authentication_failed_naming_the_file(
    provider: OciProvider, make_pool: MakePool, tmp_path: Path, oci_credentials: OciCredentials
) -> None:
    missing = tmp_path / "no-such-config"
    with pytest.raises(AuthenticationFailed, match=re.escape(str(missing))):
        provider.levers9_gpu_offers(make_pool(config_file=str(missing)))
    with pytest.raises(AuthenticationFailed, match="no profile 'PROD'"):
        provider.levers9_gpu_offers(make_pool(profile="PROD"))
    gone_key = tmp_path / "gone.pem"
    with pytest.raises(AuthenticationFailed, match=re.escape(str(gone_key))):
        provider.levers9_gpu_offers(make_pool(key_file=str(gone_key)))
    with pytest.raises(AuthenticationFailed, match=r"\$OCI_TEST_PASS_PHRASE_UNSET"):
        provider.levers9_gpu_offers(make_pool(pass_phrase_env="OCI_TEST_PASS_PHRASE_UNSET"))
    not_a_key = tmp_path / "not-a-key.pem"
    not_a_key.write_text("hello\n")
    with pytest.raises(AuthenticationFailed, match=re.escape(str(not_a_key))):
        provider.levers9_gpu_offers(make_pool(key_file=str(not_a_key)))


def test_an_encrypted_key_reads_its_pass_phrase_from_the_named_variable(
    provider: OciProvider,
    make_pool: MakePool,
    tmp_path: Path,
    oci_credentials: OciCredentials,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    locked = tmp_path / "locked.pem"
    locked.write_bytes(
        oci_credentials.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"open sesame"),
        )
    )
    monkeypatch.setenv("OCI_TEST_PASS_PHRASE", "open sesame")
    pool = make_pool(key_file=str(locked), pass_phrase_env="OCI_TEST_PASS_PHRASE")
    assert len(provider.levers9_gpu_offers(pool)) == 2


def test_security_token_auth_signs_with_the_session_token(
    provider: OciProvider, make_pool: MakePool, tmp_path: Path, oci_credentials: OciCredentials, fake_oci: FakeOci
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("session-token-for-tests\n")
    config = write_config(
        tmp_path / "session.config",
        oci_credentials.key_file,
        oci_credentials.fingerprint,
        profile="SESSION",
        extra=f"security_token_file={token_file}\n",
    )
    pool = make_pool(auth="security_token", config_file=str(config), profile="SESSION")
    with pytest.raises(AuthenticationFailed):
        provider.levers9_gpu_offers(pool)  # the fake does not know the session yet
    fake_oci.add_key("ST$session-token-for-tests", oci_credentials.private_key.public_key())
    assert len(provider.levers9_gpu_offers(pool)) == 2


# ---------------------------------------------------------------------- check


def test_check_names_profile_region_and_domains(provider: OciProvider, make_pool: MakePool) -> None:
    check = provider.levers9_check(make_pool())
    assert check.ok
    assert "'DEFAULT'" in check.message
    assert REGION in check.message
    assert "2 availability domains" in check.message


def test_check_of_rejected_credentials_is_not_ok_with_a_hint(
    provider: OciProvider, make_pool: MakePool, tmp_path: Path
) -> None:
    config = other_key_config(tmp_path, "stranger")
    key_text = (tmp_path / "stranger.pem").read_text()
    check = provider.levers9_check(make_pool(config_file=str(config)))
    assert not check.ok
    assert check.hint is not None
    assert str(config) in check.hint
    assert "NotAuthenticated" in check.message or "authentication" in check.message.lower()
    body = key_text.splitlines()[1]
    assert body not in check.message
    assert body not in check.hint


def test_check_of_an_unreadable_config_is_not_ok(provider: OciProvider, make_pool: MakePool, tmp_path: Path) -> None:
    check = provider.levers9_check(make_pool(config_file=str(tmp_path / "missing")))
    assert not check.ok
    assert str(tmp_path / "missing") in check.message


def test_check_denied_by_policy_is_not_ok(provider: OciProvider, make_pool: MakePool, fake_oci: FakeOci) -> None:
    fake_oci.fail("ListAvailabilityDomains", 403, "NotAuthorized", "Not authorized", times=1)
    check = provider.levers9_check(make_pool())
    assert not check.ok
    assert check.hint is not None
    assert "policy" in check.hint


# ---------------------------------------------------------------------- clients and imports


def test_each_thread_gets_its_own_clients(provider: OciProvider, make_pool: MakePool) -> None:
    settings = make_pool().settings
    mine = provider.clients.get(settings, REGION)
    assert provider.clients.get(settings, REGION) is mine
    theirs: list[Any] = []
    thread = threading.Thread(target=lambda: theirs.append(provider.clients.get(settings, REGION)))
    thread.start()
    thread.join()
    assert theirs[0] is not mine
    assert theirs[0].compute is not mine.compute


def test_the_sdk_is_not_imported_with_the_plugin() -> None:
    code = (
        "import sys, levers9_oci, levers9_oci.provider, levers9_oci.clients, levers9_oci.errors, levers9_oci.offers\n"
        "assert 'oci' not in sys.modules, 'oci imported'\n"
        "print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
