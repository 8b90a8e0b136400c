"""The contract kit's boot check, apart from the kit's other promises: boot what a provider passed, and judge it.

:func:`boot_user_data` boots the user data a provider gave a machine through
:class:`~levers9.testing.cloud_boot.CloudBooter` (the harness end-to-end
tests boot a fake cloud's instances with), with what
:class:`BootPlatform` says the cloud gives the machine besides (a metadata
service), and waits for a worker to register with the stand-in controlplane.
:func:`check_registered` fails the kit's test, saying what to fix, when no
worker (or the wrong one) registered; :func:`check_identity_binds` checks,
for a provider that binds join tokens to machines, that the booted worker's
identity verifies for its machine and nothing verifies for another.

Each failure is ``pytest.fail`` naming the provider and what it must do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from levers9.hooks.errors import IdentityRejected
from levers9.hooks.facade import Hooks
from levers9.hooks.types import Machine, Pool, WorkerBootstrap
from levers9.testing.cloud_boot import CloudBooter
from levers9.testing.registrar import Registrar, Registration

__all__ = ["BootPlatform", "boot_user_data", "check_identity_binds", "check_registered", "run"]

T = TypeVar("T")


def run(awaitable: Awaitable[T]) -> T:
    """Run one awaitable to its end on a new event loop (the kit's tests are synchronous)."""

    async def _wrap() -> T:
        return await awaitable

    return asyncio.run(_wrap())


@dataclass(frozen=True)
class BootPlatform:
    """What :meth:`ProviderContract.boot_platform` says a booted machine gets: its processes' extra environment,
    and the host loopback ports (a fake metadata service's) it may reach besides the controlplane's."""

    environment: dict[str, str] = field(default_factory=dict)
    ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Booted:
    """The provisioned machine, as :class:`~levers9.testing.cloud_boot.CloudBooter` boots it: running, with its
    user data."""

    id: str
    user_data: str
    instance_type: str | None
    running: bool = True
    gone: bool = False


def _tail(token: str | None) -> str:
    return "no token" if not token else f"a token ending …{token[-6:]}"


def boot_user_data(
    provider: str,
    machine: Machine,
    user_data: str,
    platform: BootPlatform,
    bootstrap: WorkerBootstrap,
    standin: Registrar,
    timeout: float,
) -> tuple[Registration | None, str]:
    """Boot ``user_data`` as ``machine`` and wait for its worker; the registration and, when none, what it printed."""
    instance = _Booted(machine.provider_id, user_data, machine.instance_type)
    booter = CloudBooter(
        [lambda: [instance]],
        ports=[standin.port, *platform.ports],
        platform=lambda _: platform.environment,
        interval=0.1,
    )
    try:
        booter.step()
        if machine.provider_id in booter.bare:
            pytest.fail(
                f"provider {provider!r}: user_data(machine) is empty: pass "
                "levers9.bootstrap.cloud_init(request.bootstrap) to the machine as its user data"
            )
        if machine.provider_id in booter.refused:
            pytest.fail(
                f"provider {provider!r}: the user data it passed cannot be booted: "
                f"{booter.refused[machine.provider_id]}"
            )
        boot = booter.boots[machine.provider_id]
        found = standin.wait_for(bootstrap.token, bootstrap.machine_id, timeout, stop_early=lambda: not boot.alive())
        # the renderer the user data came from, and how the boot ended (its exit status) or that it still runs
        ended = boot.failure() or ("it ended" if not boot.alive() else "it still ran")
        output = (
            ""
            if found
            else f" (emulated boot of {boot.renderer}, {boot.isolation}; {ended}); what it printed:\n{boot.output()}"
        )
    finally:
        booter.stop()
    return found, output


def check_registered(
    provider: str,
    bootstrap: WorkerBootstrap,
    found: Registration | None,
    seen: list[Registration],
    output: str,
    timeout: float,
    how: str = "levers9.bootstrap.cloud_init or shell_script",
) -> None:
    """Fail unless a worker registered with exactly the bootstrap's token and machine id; ``how`` names the
    renderer the provider should have passed the bootstrap through."""
    if found is not None:
        return
    if seen:
        others = "; ".join(f"machine id {r.machine_id!r} with {_tail(r.token)}" for r in seen)
        pytest.fail(
            f"provider {provider!r}: a worker registered, but not with the bootstrap's machine id "
            f"{bootstrap.machine_id!r} and {_tail(bootstrap.token)}: {others}; pass request.bootstrap to the "
            f"machine as it is ({how}){output}"
        )
    pytest.fail(
        f"provider {provider!r}: no worker registered with the controlplane of request.bootstrap within "
        f"{timeout:g} s (or the boot ended first); a provisioned machine must start "
        f"`levers9 worker` from request.bootstrap ({how}){output}"
    )


def check_identity_binds(provider: str, hooks: Hooks, pool: Pool, machine: Machine, found: Registration) -> None:
    """Where the provider binds join tokens to machines, what the booted worker showed verifies for its own
    machine, and nothing verifies for another machine or with no identity shown."""
    if not hooks.binds_identity(provider):
        return
    stored = machine.model_copy(update={"machine_id": found.machine_id})
    try:
        run(hooks.verify_identity(pool, stored, found.identity))
    except IdentityRejected as exc:
        shown = "no identity" if found.identity is None else "an identity"
        pytest.fail(
            f"provider {provider!r}: the booted worker showed {shown} at Register, which the provider's "
            f"levers9_verify_identity refused for the machine it booted on: {exc}; its "
            "levers9_machine_identity must prove that machine (and boot_platform give the boot what it needs)"
        )
    for label, other, identity in (
        ("no identity", stored, None),
        (
            "another machine's",
            stored.model_copy(update={"provider_id": f"{machine.provider_id}-other"}),
            found.identity,
        ),
    ):
        try:
            run(hooks.verify_identity(pool, other, identity))
        except IdentityRejected:
            continue
        pytest.fail(
            f"provider {provider!r}: levers9_verify_identity accepted {label} identity for machine "
            f"{other.provider_id}; it must raise IdentityRejected unless the identity proves that very machine"
        )
