"""``levers9 down``: stop the `levers9 up` of this levers9 home, as Ctrl-C in its terminal would."""

from __future__ import annotations

import os
import signal
import time

import typer

from levers9.cli.output import failed, out

__all__ = ["down"]


def down(
    timeout: float = typer.Option(
        120.0, "--timeout", help="Seconds to wait for it to stop its machines and exit before giving up."
    ),
) -> None:
    """Stop the `levers9 up` running for this levers9 home ($LEVERS9_HOME, else ~/.levers9): SIGTERM, as Ctrl-C
    does, then wait while it stops its pools' machines (unless it runs with --keep-machines)."""
    from levers9.cli import up_state
    from levers9.config.model import default_home

    home = default_home()
    state = up_state.read(home)
    if state is None:
        out.print(f"no levers9 up is running for {home}", markup=False, highlight=False)
        return
    out.print(f"stopping levers9 up (pid {state.pid}, {state.http}) ...", markup=False, highlight=False)
    try:
        os.kill(state.pid, signal.SIGTERM)
    except ProcessLookupError:
        out.print("it had stopped already", markup=False, highlight=False)
        return
    except PermissionError:
        raise failed(f"levers9 up (pid {state.pid}) runs as another user: stop it as that user") from None
    deadline = time.monotonic() + timeout
    while up_state.read(home) is not None:
        if time.monotonic() > deadline:
            raise failed(
                f"levers9 up (pid {state.pid}) did not stop within {timeout:g} s; its terminal or log says what it "
                f"is waiting for (kill -9 {state.pid} leaves its machines running)"
            )
        time.sleep(0.2)
    out.print("levers9 up stopped", markup=False, highlight=False)
