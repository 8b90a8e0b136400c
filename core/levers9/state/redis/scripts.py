"""The Lua scripts behind every multi-key change, loaded once per client."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

NAMES = (
    "enqueue",
    "place",
    "finish",
    "finish_many",
    "take",
    "register",
    "heartbeat",
    "heartbeat_many",
    "remove",
    "reclaim",
    "drain",
    "cordon",
    "wake",
    "note",
    "with_work",
    "rows",
    "silent",
    "census",
    "orphan",
    "orphans_due",
    "sandbox_hold",
    "sandbox_release",
)


@cache
def source(name: str) -> str:
    """The script ``name`` with the shared prelude in front (scripts cannot call each other)."""
    lua = files(__package__).joinpath("lua")
    return lua.joinpath("common.lua").read_text() + "\n" + lua.joinpath(f"{name}.lua").read_text()


class Scripts:
    """The scripts registered on one client; calling one runs EVALSHA, falling back to EVAL once."""

    def __init__(self, redis: Redis, prefix: str) -> None:
        self.prefix = prefix
        self._scripts: dict[str, AsyncScript] = {name: redis.register_script(source(name)) for name in NAMES}

    async def __call__(self, name: str, *args: str | int | float) -> Any:
        return await self._scripts[name](keys=[], args=[self.prefix, *args])
