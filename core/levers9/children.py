"""Child processes a levers9 process supervises (its embedded Redis, its embedded registry): waiting for one to
end without polling, and saying how it ended.

Standard library only. :func:`wait_exited` returns once the child has exited and is reaped, woken by a pidfd
(Linux 5.3 and later) rather than a timer, and polls only where there is no pidfd; :func:`how_it_ended` is the
log's words for a return code.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

__all__ = ["POLL_S", "how_it_ended", "wait_exited"]

#: how often a child is polled where the kernel has no pidfd
POLL_S = 0.5


async def wait_exited(process: subprocess.Popen[bytes]) -> None:
    """Return once ``process`` has exited, reaped."""
    if process.poll() is not None:
        return
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
        while process.poll() is None:
            await asyncio.sleep(POLL_S)
        return
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        if process.poll() is None:  # it may have exited before the pidfd was opened
            await ended
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    process.wait()  # readable means exited: this reaps it without blocking


def how_it_ended(returncode: int | None) -> str:
    """How a child ended, for the log: 'was killed by SIGKILL', 'exited with status 1'."""
    if returncode is None:
        return "ended"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"
