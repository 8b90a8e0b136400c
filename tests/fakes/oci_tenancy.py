"""The test tenancy a fake OCI region serves: its identifiers, and an API key with its SDK config file.

Shared by the ``oci`` plugin's tests, the end-to-end cloud test and
``bench/clouds.py``: :func:`make_credentials` writes a signing key (0600) and an
OCI SDK config file naming it into a directory; the fake
(:class:`tests.fakes.oci_cloud.FakeOci`) is told the public half with
``add_key(credentials.key_id, credentials.private_key.public_key())`` and
refuses any request not signed by it. The OCIDs are well-formed test values.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

__all__ = [
    "AD1",
    "AD2",
    "COMPARTMENT",
    "IMAGE",
    "REGION",
    "SUBNET",
    "TENANCY",
    "UNKNOWN_IMAGE",
    "USER",
    "OciCredentials",
    "fingerprint",
    "make_credentials",
    "write_config",
]

TENANCY = "ocid1.tenancy.oc1..aaaaaaaatenancy0test"
USER = "ocid1.user.oc1..aaaaaaaauser0test"
COMPARTMENT = "ocid1.compartment.oc1..aaaaaaaacompartment0test"
SUBNET = "ocid1.subnet.oc1.iad.aaaaaaaasubnet0test"
IMAGE = "ocid1.image.oc1.iad.aaaaaaaaimage0test"
#: an image the fake does not know: launches naming it answer 400 RelatedResourceNotAuthorizedOrNotFound
UNKNOWN_IMAGE = "ocid1.image.oc1.iad.aaaaaaaanosuchimage"
REGION = "us-ashburn-1"
AD1 = "Uocm:US-ASHBURN-AD-1"
AD2 = "Uocm:US-ASHBURN-AD-2"


@dataclass(frozen=True)
class OciCredentials:
    """The test's API key: its files, its fingerprint and the keyId the SDK signs with."""

    config_file: Path
    key_file: Path
    fingerprint: str
    private_key: rsa.RSAPrivateKey

    @property
    def key_id(self) -> str:
        return f"{TENANCY}/{USER}/{self.fingerprint}"


def fingerprint(public_key: rsa.RSAPublicKey) -> str:
    """OCI's API key fingerprint: the MD5 of the DER public key, as colon-separated hex pairs."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashlib.md5(der).hexdigest()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def write_config(path: Path, key_file: Path, print_: str, *, profile: str = "DEFAULT", extra: str = "") -> Path:
    path.write_text(
        f"[{profile}]\nuser={USER}\nfingerprint={print_}\nkey_file={key_file}\ntenancy={TENANCY}\n"
        f"region={REGION}\n{extra}"
    )
    return path


def make_credentials(directory: Path, private_key: rsa.RSAPrivateKey | None = None) -> OciCredentials:
    """A signing key (a new one unless given) and an SDK config file naming it, written into ``directory``."""
    key = private_key or rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_file = directory / "oci_api_key.pem"
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_file.chmod(0o600)
    print_ = fingerprint(key.public_key())
    return OciCredentials(write_config(directory / "oci_config", key_file, print_), key_file, print_, key)
