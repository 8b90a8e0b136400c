"""One HTTP server on 127.0.0.1, on a free port, served by a thread: what every fake cloud and test file server runs.

:class:`LocalServer` binds (trying other free ports when one is taken between
picking and binding), serves ``handler`` on a daemon thread with a thread per
request, and :meth:`LocalServer.close` shuts it down, closes the socket and
joins the thread, so nothing of it is left once a test ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

from tests.fixtures.ports import free_port

__all__ = ["LocalServer"]


class LocalServer:
    """``handler`` served on ``127.0.0.1:<port>`` until :meth:`close`."""

    def __init__(self, handler: Callable[..., Any], *, name: str, poll_interval: float = 0.5) -> None:
        for _ in range(20):
            try:
                self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
                break
            except OSError:  # taken since it was picked: pick another
                continue
        else:
            raise OSError(f"no free port for {name}")
        self.server.daemon_threads = True
        self.port: int = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": poll_interval}, name=name, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)
