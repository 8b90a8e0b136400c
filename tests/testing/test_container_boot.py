"""The kit's container boot (levers9.testing.container_boot): what it refuses in a spec, how a failed boot is told,
and how a listed machine's reachability is judged.

Real Docker (the session's private dockerd) and the worker image of this
checkout; the reachability check dials a real listener on 127.0.0.1.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator

import pytest

from levers9.bootstrap import BootstrapContainer, container_spec
from levers9.hooks.types import Machine, MachineState, WorkerBootstrap
from levers9.images.worker import BuildResult
from levers9.testing.container_boot import KIT_LABEL, boot_container, check_reachable, check_spec
from levers9.testing.registrar import Registrar, Registration
from tests.fixtures.dockerd import Dockerd

Failed = pytest.fail.Exception


def _bootstrap(url: str = "grpc://127.0.0.1:1993", image: str = "levers9/worker:0.1.0") -> WorkerBootstrap:
    return WorkerBootstrap(
        controlplane_url=url,
        token=f"contract-{uuid.uuid4().hex}",
        machine_id=f"m-{uuid.uuid4().hex[:12]}",
        pool="pods",
        levers9_version="0.1.0",
        worker_image=image,
    )


def _machine(bootstrap: WorkerBootstrap, **fields: object) -> Machine:
    return Machine.model_validate(
        {
            "provider_id": "pod-1",
            "machine_id": bootstrap.machine_id,
            "pool": "pods",
            "state": MachineState.RUNNING,
            **fields,
        }
    )


def _registration(port: int = 0, nonce: str = "") -> Registration:
    return Registration(
        token="t",
        machine_id="m",
        pool="pods",
        version="0.1.0",
        hostname="h",
        worker_id="w",
        probe_port=port,
        probe_nonce=nonce,
    )


def test_the_spec_levers9_renders_passes() -> None:
    bootstrap = _bootstrap()
    assert check_spec("pods", container_spec(bootstrap), bootstrap).image == bootstrap.worker_image


def test_a_join_token_in_the_plain_environment_is_refused() -> None:
    bootstrap = _bootstrap()
    spec = container_spec(bootstrap)
    leaky = spec.model_copy(update={"env": {**spec.env, "LEVERS9_TOKEN": bootstrap.token}})
    with pytest.raises(Failed, match=r"join token is in env\['LEVERS9_TOKEN'\].*keep it in secret_env"):
        check_spec("pods", leaky, bootstrap)
    on_the_command = spec.model_copy(update={"command": ["levers9", "worker", "--token", bootstrap.token]})
    with pytest.raises(Failed, match="join token is in the command"):
        check_spec("pods", on_the_command, bootstrap)


def test_another_image_or_no_secret_or_no_spec_is_refused() -> None:
    bootstrap = _bootstrap()
    spec = container_spec(bootstrap)
    with pytest.raises(Failed, match=r"runs image 'busybox', not request\.bootstrap\.worker_image"):
        check_spec("pods", spec.model_copy(update={"image": "busybox"}), bootstrap)
    with pytest.raises(Failed, match="secret_env does not carry the join token"):
        check_spec("pods", spec.model_copy(update={"secret_env": {}}), bootstrap)
    with pytest.raises(Failed, match=r"answered dict; answer the levers9\.bootstrap\.BootstrapContainer"):
        check_spec("pods", spec.model_dump(), bootstrap)


def test_a_container_that_exits_ends_the_wait_with_its_code_and_log(
    dockerd: Dockerd, worker_image: BuildResult
) -> None:
    """The timeout is far beyond the test's own: only the container's exit can end the wait."""
    with Registrar() as standin:
        bootstrap = _bootstrap(standin.url, worker_image.tag)
        broken = BootstrapContainer(
            image=worker_image.tag,
            command=["python3", "-c", "import sys; print('no GPU driver on this host', file=sys.stderr); sys.exit(3)"],
            env={},
            secret_env={"LEVERS9_TOKEN": bootstrap.token},
        )
        found, output = boot_container("pods", _machine(bootstrap), broken, dockerd.host, bootstrap, standin, 3600)
    assert found is None
    assert "the container exited with code 3" in output
    assert "no GPU driver on this host" in output
    assert not [c for c in dockerd.containers() if KIT_LABEL in c["labels"]], "the kit's container was left behind"


def test_the_rendered_spec_boots_a_worker(dockerd: Dockerd, worker_image: BuildResult) -> None:
    with Registrar() as standin:
        bootstrap = _bootstrap(standin.url, worker_image.tag)
        found, output = boot_container(
            "pods", _machine(bootstrap), container_spec(bootstrap), dockerd.host, bootstrap, standin, 120
        )
    assert found is not None, output
    assert (found.token, found.machine_id) == (bootstrap.token, bootstrap.machine_id)
    assert found.probe_port > 0
    assert found.probe_nonce
    assert not [c for c in dockerd.containers() if KIT_LABEL in c["labels"]]


@pytest.fixture
def nonce_listener() -> Iterator[tuple[int, str]]:
    """A port on 127.0.0.1 answering a nonce to each connection, as a worker's reachability port does."""
    nonce = uuid.uuid4().hex
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)  # accept() wakes to see the stop
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.sendall(nonce.encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], nonce
    finally:
        stop.set()
        server.close()
        thread.join(5)


def test_a_machine_declared_unreachable_passes() -> None:
    machine = _machine(_bootstrap(), provider_data={"reachable": False})
    check_reachable("pods", machine, _registration(4242, "n"))


def test_an_undeclared_machine_without_an_address_fails() -> None:
    with pytest.raises(Failed, match=r"no address and without provider_data\['reachable'\] = False"):
        check_reachable("pods", _machine(_bootstrap()), _registration(4242, "n"))


def test_an_address_that_answers_the_nonce_passes(nonce_listener: tuple[int, str]) -> None:
    port, nonce = nonce_listener
    check_reachable("pods", _machine(_bootstrap(), address="127.0.0.1"), _registration(port, nonce))
    check_reachable(
        "pods",
        _machine(_bootstrap(), address="127.0.0.1", provider_data={"reachable": True}),
        _registration(port, nonce),
    )


def test_an_address_that_does_not_answer_the_nonce_fails(nonce_listener: tuple[int, str]) -> None:
    port, _ = nonce_listener
    machine = _machine(_bootstrap(), address="127.0.0.1")
    with pytest.raises(Failed, match=r"listed at 127.0.0.1, where its worker's port \d+ does not answer"):
        check_reachable("pods", machine, _registration(port, "another-nonce"))


def test_reachable_must_be_a_boolean() -> None:
    machine = _machine(_bootstrap(), provider_data={"reachable": "no"})
    with pytest.raises(Failed, match=r"provider_data\['reachable'\] = 'no'; it must be True, False or absent"):
        check_reachable("pods", machine, _registration(4242, "n"))
