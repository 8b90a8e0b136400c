"""A stopping replica ends its lasting streams at once (OpenStreams.stop), and leaves transfers to the grace.

The guards alone, on a real event loop: the end-to-end stop of a replica is tests/e2e/test_replica_stop.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import pytest

from levers9.services.revocation import OpenStreams, ReplicaStopping, TokenRevoked


async def _none_invalid(token_ids: Collection[str]) -> Collection[str]:
    return ()


async def test_stop_ends_lasting_streams_and_later_ones_but_not_transfers() -> None:
    streams = OpenStreams(_none_invalid)
    forever: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    transfer_done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def lasting() -> None:
        with streams.open("tok_a") as guard:
            await guard.wait(forever)

    async def transfer() -> str:
        with streams.open("tok_a", lasting=False) as guard:
            return await guard.wait(transfer_done)

    watch, upload = asyncio.create_task(lasting()), asyncio.create_task(transfer())
    await asyncio.sleep(0)  # both wait inside their guards
    assert streams.stop() == 1
    with pytest.raises(ReplicaStopping, match="controlplane replica stopping"):
        await asyncio.wait_for(watch, 5)
    assert not watch.cancelled()  # the stop's cancellation became the error, and nothing else was cancelled
    assert not upload.done()  # a transfer keeps going: it gets the gRPC listener's grace
    transfer_done.set_result("blob")
    assert await asyncio.wait_for(upload, 5) == "blob"
    # opened after the stop: ends at its first wait
    with streams.open("tok_b") as guard, pytest.raises(ReplicaStopping):
        await guard.wait(asyncio.sleep(3600))
    assert len(streams) == 0
    forever.cancel()


async def test_a_revoked_token_still_says_revoked_on_a_stopping_replica() -> None:
    streams = OpenStreams(_none_invalid)
    with streams.open("tok_a") as guard:
        streams.stop()
        streams.end(["tok_a"])
        # revoked wins: its holder must not dial another replica with that token
        with pytest.raises(TokenRevoked):
            await guard.wait(asyncio.sleep(3600))
