"""The commands an operator runs around the manifests: the Secrets first, then apply and watch the rollout.

:func:`setup_commands` writes them for one set of options. They name files
that hold the values (``--from-file``), so no URL, password or key is typed on
a command line, where the shell's history would keep it.
"""

from __future__ import annotations

from levers9.kubernetes_manifests.options import ManifestOptions
from levers9.kubernetes_manifests.pod_config import SECRET_KEY_KEY, URL_KEY
from levers9.kubernetes_manifests.render import NAME

__all__ = ["setup_commands"]


def setup_commands(options: ManifestOptions, manifests: str) -> list[str]:
    """Shell lines, comments included: create the namespace and Secrets, apply ``manifests``, wait for the pods."""
    ns = options.namespace
    lines = [
        "# 1. The namespace and the Secrets the pods read; each file holds one value and stays on your machine.",
        f"kubectl create namespace {ns}",
        "#    database-url: postgresql+psycopg://USER:PASSWORD@HOST:5432/levers9",
        f"kubectl -n {ns} create secret generic {options.database_secret} --from-file={URL_KEY}=database-url",
        "#    redis-url: redis://:PASSWORD@HOST:6379/0 (rediss:// for TLS)",
        f"kubectl -n {ns} create secret generic {options.redis_secret} --from-file={URL_KEY}=redis-url",
        "#    secret.key: the Fernet key that encrypts workspace secrets; the same for every replica, back it up",
        "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())' > secret.key",
        f"kubectl -n {ns} create secret generic {options.secret_key_secret} --from-file={SECRET_KEY_KEY}=secret.key",
    ]
    if options.tls_secret is not None:
        ca = " --from-file=ca.crt=ca.crt" if options.tls_ca else ""
        lines += [
            "#    the certificate must name the Services (levers9-grpc.NAMESPACE.svc, ...) and any external address",
            f"kubectl -n {ns} create secret generic {options.tls_secret} --from-file=tls.crt=server.crt "
            f"--from-file=tls.key=server.key{ca}",
        ]
    for extra in options.image_pull_secrets:
        lines.append(
            f"kubectl -n {ns} create secret generic {extra} --type=kubernetes.io/dockerconfigjson "
            "--from-file=.dockerconfigjson=$HOME/.docker/config.json"
        )
    lines += [
        "# 2. The manifests, then wait until every replica is ready.",
        f"kubectl apply -f {manifests}",
        f"kubectl -n {ns} rollout status deployment/{NAME}",
    ]
    return lines
