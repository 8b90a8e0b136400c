"""The ``ec2`` plugin binds a machine's join token to its instance: IMDSv2 on the worker, the signature on the controlplane.

The worker side runs the plugin's real HTTP client against the fake metadata
service (:mod:`tests.fakes.imds`, IMDSv2 with tokens); the controlplane side
runs the plugin's verification through the core's facade, with the fake's
certificate as the pool's ``identity_certificate_file``, and checks that each
way a shown identity can be wrong is refused, naming what was wrong. A
document and signature recorded from a real instance (``tests/data/ec2``)
verify with the certificate the plugin ships for its region, so the procedure
is AWS's and not only the fake's.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import ValidationError

from levers9.bootstrap import cloud_init
from levers9.hooks.errors import IdentityRejected, ProviderError
from levers9.hooks.facade import Hooks
from levers9.hooks.manager import PluginSet
from levers9.hooks.types import Machine, MachineIdentity, MachineState
from levers9.testing.provider_contract import run as hooks_run
from levers9_ec2.identity import fetch_identity, load_certificates, verify_identity
from levers9_ec2.launch import run_instances_params
from levers9_ec2.provider import Ec2Provider
from levers9_ec2.settings import Ec2Settings
from tests.fakes import CloudInstance
from tests.fakes.imds import FakeImds, make_signer
from tests.fixtures.ec2_boot import imds
from tests.plugins.ec2.conftest import AMI, make_pool
from tests.plugins.provision import provision_request

INSTANCE = CloudInstance(
    id="i-0abc1234def567890",
    state="running",
    running=True,
    gone=False,
    instance_type="p5.48xlarge",
    region="us-east-1",
    zone="us-east-1a",
)

__all__ = ["imds"]


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    plugins = PluginSet()
    plugins.add("ec2", Ec2Provider())
    made = Hooks(plugins)
    yield made
    made.close()


def machine(instance_id: str = INSTANCE.id, region: str = "us-east-1") -> Machine:
    return Machine(
        provider_id=instance_id,
        machine_id="m-1",
        pool="train",
        state=MachineState.RUNNING,
        region=region,
        zone=f"{region}a",
        provider_data={"region": region},
    )


def identity_of(imds: FakeImds, instance: CloudInstance = INSTANCE) -> MachineIdentity:
    return fetch_identity(imds.endpoint(instance), budget_s=5)


def test_hook_levers9_machine_identity(hooks: Hooks, imds: FakeImds, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's hook asks IMDSv2 (a token first) where AWS_EC2_METADATA_SERVICE_ENDPOINT says."""
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint(INSTANCE))
    identity = hooks_run(hooks.machine_identity("ec2"))
    assert identity.document == imds.document(INSTANCE.id)
    assert json.loads(identity.document)["instanceId"] == INSTANCE.id
    assert "\n" not in identity.signature
    assert base64.b64decode(identity.signature, validate=True)
    asked = [(method, path.split("/", 2)[2], status) for method, path, status in imds.requests]
    assert asked == [
        ("PUT", "latest/api/token", 200),
        ("GET", "latest/dynamic/instance-identity/document", 200),
        ("GET", "latest/dynamic/instance-identity/signature", 200),
    ]


def test_a_metadata_service_that_does_not_answer_is_a_clear_error(imds: FakeImds) -> None:
    unknown = f"http://127.0.0.1:{imds.port}/i-0000000000000000f"  # the fake answers 404 for it
    with pytest.raises(ProviderError) as info:
        fetch_identity(unknown, budget_s=0.5)
    assert info.value.code == "InstanceIdentityUnavailable"
    assert "HTTP 404" in str(info.value)
    assert "AWS_EC2_METADATA_SERVICE_ENDPOINT" in str(info.value)


def test_the_metadata_service_refuses_requests_without_a_session_token(imds: FakeImds) -> None:
    import urllib.error
    import urllib.request

    url = imds.endpoint(INSTANCE) + "/latest/dynamic/instance-identity/document"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=5)
    assert info.value.code == 401


def test_hook_levers9_verify_identity(hooks: Hooks, imds: FakeImds, tmp_path: Path) -> None:
    """The instance's own signed document is accepted; every way of being wrong is refused, saying which."""
    pool = make_pool({"ami": AMI, "identity_certificate_file": str(imds.certificate_file)})
    shown = identity_of(imds)
    assert hooks_run(hooks.verify_identity(pool, machine(), shown)) is True

    def refused(identity: MachineIdentity | None, match: str, target: Machine | None = None) -> None:
        with pytest.raises(IdentityRejected, match=match):
            hooks_run(hooks.verify_identity(pool, target or machine(), identity))

    refused(None, "showed no instance identity document")
    # another instance's genuine document, shown with this machine's token
    other = CloudInstance(**{**INSTANCE.__dict__, "id": "i-0fff1234def567890"})
    refused(identity_of(imds, other), "names EC2 instance 'i-0fff1234def567890', not 'i-0abc1234def567890'")
    # the right document for a machine of another region
    refused(shown, "of region 'us-east-1', the machine is in 'us-west-2'", machine(region="us-west-2"))
    # the document edited after signing: the signature no longer matches
    tampered = shown.document.replace('"privateIp" : "10.0.0.10"', '"privateIp" : "10.0.0.99"')
    assert tampered != shown.document
    refused(MachineIdentity(document=tampered, signature=shown.signature), "does not verify")
    # signed by someone else's key
    key, _ = make_signer(tmp_path, "thief")
    forger = FakeImds.__new__(FakeImds)
    forger.key = key
    refused(MachineIdentity(document=shown.document, signature=forger.sign(shown.document)), "does not verify")
    refused(MachineIdentity(document=shown.document, signature="%%%"), "not base64")
    refused(MachineIdentity(document=shown.document, signature=""), "without its signature")
    refused(MachineIdentity(document="[1, 2]", signature=shown.signature), "not a JSON object")
    # AWS's own certificate (no file set) does not verify the fake's signature: nothing falls back to accepting
    aws = make_pool({"ami": AMI})
    with pytest.raises(IdentityRejected, match="AWS's us-east-1 certificate"):
        hooks_run(hooks.verify_identity(aws, machine(), shown))
    # a pool that opts out binds nothing
    off = make_pool({"ami": AMI, "instance_identity": "off"})
    assert hooks_run(hooks.verify_identity(off, machine(), None)) is True


def test_the_launch_tells_the_worker_to_show_its_identity_unless_the_pool_opts_out() -> None:
    def user_data(settings: dict[str, Any]) -> str:
        pool = make_pool({"ami": AMI, **settings})
        params = run_instances_params(
            provision_request(pool, None),
            Ec2Settings.model_validate(pool.settings.model_dump()),
            instance_type="p5.48xlarge",
            zone=None,
            subnet_id=None,
            root_device="/dev/xvda",
            spot=False,
        )
        return str(params["UserData"])

    assert "LEVERS9_MACHINE_IDENTITY=ec2" in user_data({})
    assert "LEVERS9_MACHINE_IDENTITY" not in user_data({"instance_identity": "off"})
    request = provision_request(make_pool({"ami": AMI}), None)
    assert "LEVERS9_MACHINE_IDENTITY" not in cloud_init(request.bootstrap), "the request itself is not changed"


def test_an_identity_certificate_file_must_hold_a_certificate(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-cert.pem"
    bad.write_text("hello\n")
    with pytest.raises(ValidationError, match=r"(?s)identity_certificate_file.*holds no PEM certificate"):
        Ec2Settings.model_validate({"ami": AMI, "identity_certificate_file": str(bad)})
    with pytest.raises(ValidationError, match="cannot read"):
        Ec2Settings.model_validate({"ami": AMI, "identity_certificate_file": str(tmp_path / "missing.pem")})


def test_the_shipped_aws_certificates_are_rsa_certificates_of_every_commercial_region() -> None:
    certificates = load_certificates()
    for region in (
        "us-east-1",
        "us-east-2",
        "us-west-2",
        "eu-west-1",
        "eu-central-1",
        "ap-northeast-1",
        "ap-southeast-2",
        "sa-east-1",
        "ca-central-1",
        "us-gov-west-1",
        "cn-north-1",
    ):
        assert region in certificates, region
    for region, pem in certificates.items():
        found = x509.load_pem_x509_certificates(pem.encode())
        assert len(found) == 1, region
        assert isinstance(found[0].public_key(), rsa.RSAPublicKey), region
        assert "Amazon" in found[0].subject.rfc4514_string(), region


def test_check_says_when_a_region_has_no_certificate_to_verify_identities_with(
    provider: Ec2Provider, ec2_settings: dict[str, Any], imds: FakeImds
) -> None:
    regions = ["us-east-1", "us-isob-east-1"]  # the plugin ships no certificate of the ISO partition
    found = provider.levers9_check(make_pool(ec2_settings, regions=regions))
    assert not found.ok
    assert "no AWS identity certificate for us-isob-east-1" in found.message
    assert found.hint is not None
    assert "identity_certificate_file" in found.hint
    with_file = {**ec2_settings, "identity_certificate_file": str(imds.certificate_file)}
    assert provider.levers9_check(make_pool(with_file, regions=regions)).ok
    assert provider.levers9_check(make_pool({**ec2_settings, "instance_identity": "off"}, regions=regions)).ok


def test_a_real_document_signed_by_aws_verifies_with_the_shipped_certificate_of_its_region(tmp_path: Path) -> None:
    """A document and signature recorded from a real instance (tests/data/ec2): the procedure is AWS's own."""
    recorded = json.loads((Path(__file__).parents[2] / "data" / "ec2" / "identity_ap-southeast-2.json").read_text())
    shown = MachineIdentity(document=recorded["document"], signature=recorded["signature"])
    real = machine("i-0c5541936caf78c12", region="ap-southeast-2")
    (tmp_path / "ap-south-2.pem").write_text(load_certificates()["ap-south-2"])
    assert verify_identity(real, shown, "ap-southeast-2")["accountId"] == "189292791360"
    edited = MachineIdentity(document=shown.document.replace("t4g.small", "t4g.large"), signature=shown.signature)
    with pytest.raises(IdentityRejected, match="does not verify with AWS's ap-southeast-2 certificate"):
        verify_identity(real, edited, "ap-southeast-2")
    # each region has its own key: another region's certificate, given as the pool's file, does not verify it
    with pytest.raises(IdentityRejected, match="does not verify with identity_certificate_file"):
        verify_identity(real, shown, "ap-southeast-2", certificate_file=tmp_path / "ap-south-2.pem")
