"""The contract kit's boot check for container providers: run the container a provider started, and judge it.

A container provider (a marketplace of pods, say) passes a machine no user
data: it starts :func:`levers9.bootstrap.container_spec`'s
:class:`~levers9.bootstrap.BootstrapContainer` (image, command, plain
``env``, and ``secret_env`` stored as the cloud's secret). The kit asks the
provider's test for the container it started
(:meth:`ProviderContract.container_spec`, read back from the fake cloud the
way its API reports a pod, the secret resolved) and runs it the way
:mod:`levers9.testing.boot` runs user data:

* :func:`check_spec` first: the image is the bootstrap's ``worker_image``,
  and the join token is in ``secret_env`` only (never in ``env`` or the
  command, which a marketplace shows to anyone who can list the pod);
* :func:`boot_container` runs the image with the spec's command and
  environment (``env`` and ``secret_env``, given through the Docker API, on
  no command line) in the Docker at ``docker_host``, on the host's network
  (the stand-in controlplane listens on ``127.0.0.1``) with no port
  published, and waits for a worker to register with the stand-in
  controlplane (:mod:`levers9.testing.registrar`). A container that exits
  ends the wait at once: the failure gives its exit code and the tail of its
  log, not the full timeout;
* :func:`check_reachable`: a pod publishes no port, so nothing can dial in
  unless the provider says how. The listed machine must say
  ``provider_data["reachable"] = False`` (the controlplane then has the
  worker open a tunnel), or list an ``address`` at which the worker's
  reachability port really answers its nonce.

The image is the one the test gives (the ``levers9_worker_image`` fixture)
or, by default, this installation's worker image built into that Docker by
:func:`worker_image` (``levers9 worker-image build``: offline, reused when
nothing changed), once per process and Docker host.

Invariants: every container :func:`boot_container` starts is removed (forced)
before it returns, whatever happened; the containers carry the label
:data:`KIT_LABEL`. Failures are ``pytest.fail`` naming the provider and what
to fix; no Docker at ``docker_host`` (or no Docker SDK) is a failure that says
how to give the kit one.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import socket
import tempfile
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from levers9.bootstrap import BootstrapContainer
from levers9.hooks.types import Machine, WorkerBootstrap
from levers9.testing.registrar import Registrar, Registration

if TYPE_CHECKING:
    import docker

__all__ = ["KIT_LABEL", "boot_container", "check_reachable", "check_spec", "docker_client", "worker_image"]

#: the label of every container the kit's boot starts
KIT_LABEL = "levers9.contract-kit"
#: how many lines of a failed container's log a failure shows
LOG_TAIL = 40
#: how long dialling a listed address for the worker's reachability check may take (the controlplane's probe: 1 s)
DIAL_TIMEOUT_S = 1.0

_images: dict[str, str] = {}
_images_lock = threading.Lock()


def docker_client(docker_host: str) -> docker.DockerClient:
    """A Docker SDK client for ``docker_host`` that answers, or a failure saying how to give the kit a Docker."""
    try:
        import docker
    except ImportError:
        pytest.fail("the container boot needs the Docker SDK (levers9's agent extra): pip install 'docker>=7'")
    try:
        client = docker.DockerClient(base_url=docker_host, timeout=60)
        client.ping()
    except Exception as exc:
        pytest.fail(
            f"the container boot needs Docker, and none answers at {docker_host} ({exc}); start Docker, set "
            "DOCKER_HOST, or override the levers9_docker_host fixture (levers9.testing.dockerd.private_dockerd "
            "starts a private one)"
        )
    return client


def worker_image(docker_host: str) -> str:
    """This installation's worker image in the Docker at ``docker_host``, built on first use; answers its tag."""
    from levers9.images.rootfs import ImageError
    from levers9.images.worker import build_image

    with _images_lock:
        if docker_host not in _images:
            cache = Path(tempfile.mkdtemp(prefix="levers9-kit-image-cache-"))
            atexit.register(shutil.rmtree, cache, True)
            try:
                _images[docker_host] = build_image(docker_host, None, cache).tag
            except ImageError as exc:
                pytest.fail(
                    f"the container boot could not build the worker image (levers9 worker-image build) in the "
                    f"Docker at {docker_host}: {exc}; or give one with the levers9_worker_image fixture"
                )
        return _images[docker_host]


def check_spec(provider: str, spec: object, bootstrap: WorkerBootstrap) -> BootstrapContainer:
    """Fail unless ``spec`` runs the bootstrap's worker image with the join token in ``secret_env`` only."""
    if not isinstance(spec, BootstrapContainer):
        pytest.fail(
            f"provider {provider!r}: container_spec(machine) answered {type(spec).__name__}; answer the "
            "levers9.bootstrap.BootstrapContainer the provider started (image, command, env, secret_env), "
            "as the fake cloud reports the container"
        )
    if spec.image != bootstrap.worker_image:
        pytest.fail(
            f"provider {provider!r}: the container runs image {spec.image!r}, not request.bootstrap.worker_image "
            f"{bootstrap.worker_image!r}; start levers9.bootstrap.container_spec(request.bootstrap) as it is"
        )
    shown = [f"env[{name!r}]" for name, value in spec.env.items() if bootstrap.token in value]
    shown += ["the command"] if any(bootstrap.token in part for part in spec.command) else []
    if shown:
        pytest.fail(
            f"provider {provider!r}: the join token is in {' and '.join(shown)} of the container, which anyone "
            "who can list the pod sees; keep it in secret_env (store it as the cloud's secret), as "
            "levers9.bootstrap.container_spec gives it"
        )
    if bootstrap.token not in spec.secret_env.values():
        pytest.fail(
            f"provider {provider!r}: the container's secret_env does not carry the join token (it has "
            f"{sorted(spec.secret_env) or 'nothing'}); expose container_spec's secret_env to the container as "
            "variables (LEVERS9_TOKEN)"
        )
    return spec


def _name(machine: Machine) -> str:
    safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in machine.provider_id)[:40]
    return f"levers9-kit-{safe}-{uuid.uuid4().hex[:6]}"


def _ended(container: Any) -> bool:
    try:
        container.reload()
    except Exception:
        return True  # removed: it is not running
    return container.status in ("exited", "dead")


def _what_happened(container: Any) -> str:
    """The container's state, exit code and log tail, for a failure message."""
    with contextlib.suppress(Exception):
        container.reload()
    state = container.attrs.get("State") or {}
    try:
        tail = container.logs(tail=LOG_TAIL).decode(errors="replace").rstrip() or "(nothing)"
    except Exception as exc:
        tail = f"(its log could not be read: {exc})"
    if container.status in ("exited", "dead"):
        how = f"exited with code {state.get('ExitCode')}" + (f" ({state['Error']})" if state.get("Error") else "")
    else:
        how = f"is {container.status}"
    return f" (container boot: the container {how}); the last lines of its log:\n{tail}"


def boot_container(
    provider: str,
    machine: Machine,
    spec: BootstrapContainer,
    docker_host: str,
    bootstrap: WorkerBootstrap,
    standin: Registrar,
    timeout: float,
) -> tuple[Registration | None, str]:
    """Run ``spec`` as ``machine``'s container and wait for its worker; the registration and, when none, why."""
    import docker

    client = docker_client(docker_host)
    try:
        try:
            container = client.containers.run(
                spec.image,
                spec.command,
                name=_name(machine),
                environment={**spec.env, **spec.secret_env},
                network_mode="host",
                labels={KIT_LABEL: provider, "levers9.machine-id": bootstrap.machine_id},
                detach=True,
            )
        except docker.errors.ImageNotFound:
            pytest.fail(
                f"provider {provider!r}: the container's image {spec.image!r} is not in the Docker at "
                f"{docker_host}; the kit runs the worker image it gave the bootstrap"
            )
        except docker.errors.APIError as exc:
            pytest.fail(f"provider {provider!r}: Docker could not start the container {spec.command}: {exc}")
        try:
            found = standin.wait_for(
                bootstrap.token, bootstrap.machine_id, timeout, stop_early=lambda: _ended(container)
            )
            output = "" if found else _what_happened(container)
        finally:
            with contextlib.suppress(Exception):
                container.remove(force=True)
    finally:
        client.close()
    return found, output


def _answers(address: str, port: int, nonce: str) -> bool:
    """Whether ``address:port`` answers ``nonce`` within :data:`DIAL_TIMEOUT_S`, as the controlplane's probe asks."""
    try:
        with socket.create_connection((address, port), timeout=DIAL_TIMEOUT_S) as conn:
            conn.settimeout(DIAL_TIMEOUT_S)
            answer = b""
            while len(answer) < len(nonce):
                chunk = conn.recv(len(nonce) - len(answer))
                if not chunk:
                    break
                answer += chunk
    except OSError:
        return False
    return answer == nonce.encode()


def check_reachable(provider: str, listed: Machine, found: Registration) -> None:
    """Fail unless the listed machine says it cannot be dialled, or its listed address really can be."""
    declared = listed.provider_data.get("reachable")
    if declared is False:
        return
    advice = (
        "a container booted with no port published (as a marketplace pod is) cannot be dialled: set "
        "provider_data['reachable'] = False for such machines, so the controlplane has the worker open a tunnel "
        "instead of dialling it (docs/plugins.md §3 Machine, and §6 'Container clouds')"
    )
    if declared is not None and declared is not True:
        pytest.fail(
            f"provider {provider!r}: machine {listed.provider_id} has provider_data['reachable'] = {declared!r}; "
            f"it must be True, False or absent. {advice}"
        )
    if not found.probe_port:
        return  # the worker offered no port: the controlplane takes it as reachable and dials nothing first
    if not listed.address:
        pytest.fail(
            f"provider {provider!r}: machine {listed.provider_id} is listed with no address and without "
            f"provider_data['reachable'] = False; {advice}"
        )
    if not _answers(listed.address, found.probe_port, found.probe_nonce):
        pytest.fail(
            f"provider {provider!r}: machine {listed.provider_id} is listed at {listed.address}, where its "
            f"worker's port {found.probe_port} does not answer; {advice}"
        )
