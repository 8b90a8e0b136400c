"""What every container runtime on a worker shares: the image cache and the bridge.

Runtime settings models inherit :class:`NodeSettings`, so a pool can move its
containers to another bridge or subnet, and both runc and gVisor containers on
one worker draw addresses from the same allocation (its state is host-wide,
under ``/run/levers9``, not per runtime).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import TYPE_CHECKING, Self

from pydantic import BaseModel, Field, field_validator

if TYPE_CHECKING:
    from levers9.engine.images import ImageStore
    from levers9.engine.network import Bridge
    from levers9.hooks.types import RuntimeContext

__all__ = ["NETWORK_STATE", "NodeSettings", "bridge_for", "images_for"]

NETWORK_STATE = Path("/run/levers9/network")


class NodeSettings(BaseModel):
    bridge: str = Field("l9br0", description="The Linux bridge containers attach to (15 characters at most).")
    subnet: str = Field("10.209.0.0/16", description="Private subnet the bridge hands container addresses from.")
    image_cache: str | None = Field(
        None, description="Where unpacked image layers are kept; empty means images/ in the runtime's state dir."
    )
    image_cache_max_bytes: int = Field(
        20 * 1024**3,
        ge=0,
        description="The image cache's size the worker keeps it under after each pull, evicting the least "
        "recently used layers no image of its functions uses (0: no limit).",
    )

    @classmethod
    def of(cls, runtime: RuntimeContext) -> Self:
        """The pool's settings for this runtime, or the defaults when the pool gave none."""
        if isinstance(runtime.settings, cls):
            return runtime.settings
        if runtime.settings is None:
            return cls()
        return cls.model_validate(runtime.settings)

    @field_validator("bridge")
    @classmethod
    def _bridge(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,14}", value):
            raise ValueError(
                f"bridge {value!r} is not a valid interface name (a letter, then letters, digits, - or _, 15 at most)"
            )
        return value

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, value: str) -> str:
        try:
            net = ipaddress.ip_network(value)
        except ValueError as exc:
            raise ValueError(f"subnet {value!r} is not a network such as 10.209.0.0/16: {exc}") from None
        if not net.is_private or net.version != 4 or net.prefixlen > 28:
            raise ValueError(f"subnet {value!r} must be a private IPv4 network of /28 or larger")
        return str(net)


def images_for(runtime: RuntimeContext, settings: NodeSettings) -> ImageStore:
    from levers9.engine.images import ImageStore

    return ImageStore(Path(settings.image_cache) if settings.image_cache else Path(runtime.state_dir) / "images")


def bridge_for(settings: NodeSettings) -> Bridge:
    from levers9.engine.network import Bridge

    return Bridge(name=settings.bridge, subnet=settings.subnet, state_dir=NETWORK_STATE / settings.bridge)
