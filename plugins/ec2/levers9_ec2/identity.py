"""The EC2 instance identity: fetched on the worker from IMDSv2, checked on the controlplane before a join token is spent.

Why: the join token travels in the instance's user data, which anyone allowed
``ec2:DescribeInstanceAttribute`` in the account (and any process on the
instance) can read. Binding the token to the instance makes a copied token
useless anywhere else: the worker must also show the instance identity
document that EC2 signs for that very instance.

On the worker (``levers9_machine_identity``, :func:`fetch_identity`): IMDSv2
only, as the launch requires (``HttpTokens=required``): ``PUT
/latest/api/token`` with a TTL header, then ``GET
/latest/dynamic/instance-identity/document`` and ``.../signature`` with the
token. The service is ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (boto3's variable)
or ``http://169.254.169.254``. Standard library only, so any worker can ask.
The metadata service may not answer in a boot's first seconds: it is asked
again for :data:`FETCH_BUDGET_S`, then a ``ProviderError`` says what failed.

On the controlplane (``levers9_verify_identity``, :func:`verify_identity`):
the document must be JSON whose ``instanceId`` is the machine's provider id and
whose ``region`` is the machine's region, and the signature must be the
base64 RSA PKCS#1 v1.5 SHA-256 signature over the document's exact bytes,
checked with AWS's published certificate of that region
(``certificates.json``, see :data:`CERTIFICATES`) or with the pool's
``identity_certificate_file`` (any certificate in the file may match). Any
mismatch raises ``IdentityRejected`` naming it; nothing is fetched from AWS.

Limits, said in docs/clouds.md: the document carries no nonce, so whoever can
read it on the instance can show it again with the token; that is the same
trust boundary as the user data on the instance itself. The check proves the
instance, not the process: it does not replace TLS to the controlplane.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
import time
from importlib import resources
from pathlib import Path
from typing import Any

from levers9.hooks.errors import IdentityRejected, ProviderError
from levers9.hooks.types import Machine, MachineIdentity

__all__ = [
    "CERTIFICATES",
    "DEFAULT_ENDPOINT",
    "ENDPOINT_ENV",
    "FETCH_BUDGET_S",
    "IDENTITY_PLUGIN",
    "certificate_for",
    "fetch_identity",
    "load_certificates",
    "verify_identity",
]

#: the name a worker's LEVERS9_MACHINE_IDENTITY carries to reach this plugin's levers9_machine_identity
IDENTITY_PLUGIN = "ec2"
ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
DEFAULT_ENDPOINT = "http://169.254.169.254"
#: how long the worker keeps asking a metadata service that does not answer (yet)
FETCH_BUDGET_S = 30.0
#: one request's timeout
REQUEST_TIMEOUT_S = 2.0
TOKEN_TTL_S = 300
DOCUMENT_PATH = "/latest/dynamic/instance-identity/document"
SIGNATURE_PATH = "/latest/dynamic/instance-identity/signature"

#: AWS's per-region RSA certificates for the base64 signature, shipped with the plugin (see its "source")
CERTIFICATES = "certificates.json"


# ----------------------------------------------------------------------------- on the worker


def fetch_identity(endpoint: str | None = None, *, budget_s: float = FETCH_BUDGET_S) -> MachineIdentity:
    """This instance's identity document and signature from IMDSv2 (see the module docstring).

    :raises ProviderError: the metadata service did not answer within ``budget_s`` or refused the token.
    """
    base = (endpoint or os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).rstrip("/")
    deadline = time.monotonic() + budget_s
    wait = 0.2
    while True:
        try:
            token = _ask(base, "/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
            headers = {"X-aws-ec2-metadata-token": token}
            document = _ask(base, DOCUMENT_PATH, "GET", headers)
            signature = _ask(base, SIGNATURE_PATH, "GET", headers)
            return MachineIdentity(document=document, signature="".join(signature.split()))
        except (OSError, ValueError) as exc:
            if time.monotonic() + wait > deadline:
                raise ProviderError(
                    f"the instance metadata service at {base} gave no identity document within {budget_s:g} s "
                    f"({exc}); the instance must allow IMDSv2 (HttpEndpoint enabled), and {ENDPOINT_ENV} name it "
                    "where it is not the default",
                    code="InstanceIdentityUnavailable",
                ) from None
            time.sleep(wait)
            wait = min(wait * 2, 2.0)


def _ask(base: str, path: str, method: str, headers: dict[str, str]) -> str:
    # imported here: only a worker asks; the controlplane, which loads this plugin too, never does
    import urllib.error
    import urllib.request

    request = urllib.request.Request(base + path, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
            return str(answer.read().decode())
    except urllib.error.HTTPError as exc:
        raise ValueError(f"{method} {path} answered HTTP {exc.code}") from None


# ----------------------------------------------------------------------------- on the controlplane


@functools.cache
def load_certificates() -> dict[str, str]:
    """AWS's RSA certificate of each region (PEM), as the plugin ships them."""
    text = resources.files("levers9_ec2").joinpath(CERTIFICATES).read_text()
    certificates: dict[str, str] = json.loads(text)["certificates"]
    return certificates


@functools.cache
def _keys_of(pem: str) -> tuple[Any, ...]:
    from cryptography import x509

    found = x509.load_pem_x509_certificates(pem.encode())
    return tuple(c.public_key() for c in found)


def certificate_for(region: str, certificate_file: Path | None) -> str | None:
    """The PEM that verifies documents of ``region``: the pool's file when it names one, else AWS's shipped one."""
    if certificate_file is not None:
        return Path(certificate_file).read_text()
    return load_certificates().get(region)


def verify_identity(
    machine: Machine, identity: MachineIdentity | None, region: str, certificate_file: Path | None = None
) -> dict[str, Any]:
    """The identity document, once shown to be EC2's for ``machine`` in ``region``; else ``IdentityRejected``."""
    instance = machine.provider_id
    if identity is None:
        raise IdentityRejected(
            f"the worker showed no instance identity document for EC2 instance {instance}; the ec2 plugin's boot "
            "script sets LEVERS9_MACHINE_IDENTITY=ec2, and the worker must reach the instance metadata service"
        )
    try:
        document = json.loads(identity.document)
    except ValueError:
        raise IdentityRejected("the instance identity document is not JSON") from None
    if not isinstance(document, dict):
        raise IdentityRejected("the instance identity document is not a JSON object")
    if document.get("instanceId") != instance:
        raise IdentityRejected(
            f"the instance identity document names EC2 instance {document.get('instanceId')!r}, not {instance!r}"
        )
    if document.get("region") != region:
        raise IdentityRejected(
            f"the instance identity document is of region {document.get('region')!r}, the machine is in {region!r}"
        )
    try:
        signature = base64.b64decode("".join(identity.signature.split()), validate=True)
    except (binascii.Error, ValueError):
        raise IdentityRejected("the instance identity signature is not base64") from None
    if not signature:
        raise IdentityRejected("the instance identity document came without its signature")
    try:
        pem = certificate_for(region, certificate_file)
    except OSError as exc:
        raise IdentityRejected(f"identity_certificate_file {certificate_file}: {exc.strerror}") from None
    if pem is None:
        raise IdentityRejected(
            f"the plugin ships no AWS certificate for region {region!r}; set the pool's identity_certificate_file "
            "to the region's RSA certificate from https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/regions-certs.html"
        )
    if not any(_signed_by(key, signature, identity.document.encode()) for key in _keys_of(pem)):
        where = f"identity_certificate_file {certificate_file}" if certificate_file else f"AWS's {region} certificate"
        raise IdentityRejected(f"the instance identity document's signature does not verify with {where}")
    return document


def _signed_by(key: Any, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    if not isinstance(key, rsa.RSAPublicKey):
        return False
    try:
        key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        return False
    return True
