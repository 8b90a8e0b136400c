"""Pulling a stub's registry image into the runtime's node cache before its containers start.

A stub whose ``image`` names a registry (a blueprint's image: ``<controlplane host>/levers9/<workspace>/
blueprints@sha256:...``) is pulled here, once per worker, with :class:`~levers9.registry.pull.RegistryPuller`
into the image cache the runtime's engine reads (:func:`levers9.engine.node.images_for`): its layers go
to the diff-id cache (a layer any earlier image brought is not downloaded again) and the image is
recorded by its manifest digest, which is how the engine then resolves the ref with no network at all.
After a pull the cache is brought under the runtime's ``image_cache_max_bytes``, least recently used
layers first, keeping every layer an image of the worker's functions uses, and not while a build runs
(its step containers mount layers no function names).

Invariants: the worker's own credential (its id and token) goes only to the controlplane's registry,
the one ``RegisterResponse.registry_url`` names, over that URL's scheme; a ref naming any other
registry is pulled anonymously. Only refs pinned by digest are pulled (what the controlplane names
for a built image): a tag could move between two containers of one stub. A pull that fails raises
:class:`ImagePullFailed` naming the ref and why; the call fails with that message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from levers9.builder.layout import forget_blobs
from levers9.engine.images import ImageStore
from levers9.engine.node import NodeSettings, images_for
from levers9.hooks.errors import Levers9Error
from levers9.hooks.types import RuntimeContext
from levers9.registry.auth import RegistryAuth
from levers9.registry.client import RegistryClient
from levers9.registry.errors import InvalidRefError
from levers9.registry.pull import RegistryPuller, default_base_url
from levers9.registry.refs import parse_ref

__all__ = ["ImagePullFailed", "ImagePulls", "names_registry"]

log = logging.getLogger(__name__)


class ImagePullFailed(Levers9Error):
    """A stub's image could not be pulled; the message names the ref and why."""


def names_registry(ref: str) -> bool:
    """Whether ``ref`` names a registry image (rather than ``host`` or a path on the worker)."""
    if ref == "host" or ref.startswith(("/", ".", "~")):
        return False
    try:
        parse_ref(ref)
    except InvalidRefError:
        return False
    return True


class ImagePulls:
    """The registry images this worker has pulled into its runtime's cache, and pulling more."""

    def __init__(
        self,
        runtime: RuntimeContext,
        *,
        registry_url: str,
        credentials: Callable[[], RegistryAuth],
        ca_file: str | None = None,
        in_use: Callable[[], Iterable[str]] = tuple,
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        self.runtime = runtime
        self.registry_url = registry_url.rstrip("/")
        self.registry_host = self.registry_url.split("://", 1)[1] if "://" in self.registry_url else ""
        self.credentials = credentials
        #: the CA that verifies an https:// controlplane registry (the controlplane's own), else the system's
        self._verify: bool | str = ca_file or True
        self._pulled: set[str] = set()
        #: the image refs of the functions this worker holds (their layers are never evicted)
        self.in_use = in_use
        #: whether something else uses the cache's layers now (a build): no eviction then
        self.busy = busy
        self._lock = asyncio.Lock()

    def _client(self, registry: str) -> RegistryClient:
        return self.registry_client(registry)

    def registry_client(self, registry: str | None = None) -> RegistryClient:
        """A client of ``registry`` (``host[:port]``; None: the controlplane's), which the caller closes: the
        controlplane's logged in with this worker's credential, any other anonymous (see the module docstring)."""
        if registry is None or registry == self.registry_host:
            return RegistryClient(self.registry_url, auth=self.credentials(), verify=self._verify)
        return RegistryClient(default_base_url(registry))

    def _pull(self, ref: str) -> None:
        try:
            settings = NodeSettings.of(self.runtime)
        except ValueError:
            raise ImagePullFailed(f"image {ref!r}: runtime {self.runtime.name!r} runs no images") from None
        cache = images_for(self.runtime, settings).cache_dir
        with RegistryPuller(client=self._client) as puller:
            ImageStore(cache, puller=puller).resolve(ref)
        self._evict(ImageStore(cache), settings.image_cache_max_bytes, ref)

    def _evict(self, store: ImageStore, max_bytes: int, pulled: str) -> None:
        """Keep the cache under ``max_bytes``: least recently used layers first, never one an image of this
        worker's functions uses (nor the one just pulled), and not at all while a build uses the cache."""
        if not max_bytes or self.busy():
            return
        keep: set[Path] = set()
        for ref in {pulled, *self.in_use()}:
            if names_registry(ref):
                with contextlib.suppress(Levers9Error):
                    keep.update(store.resolve(ref).layers)  # recorded: no network
        report = store.prune(max_bytes, keep)
        forget_blobs(store.cache_dir, report.removed)  # a build's gzipped copies go with their layers
        if report.removed:
            log.info(
                "image cache: %d layers evicted, %d bytes now (limit %d)",
                len(report.removed),
                report.bytes_after,
                max_bytes,
            )

    async def ensure(self, ref: str) -> None:
        """Pull ``ref`` unless this worker has already; see the module docstring."""
        if ref in self._pulled or not names_registry(ref):
            return
        if parse_ref(ref).digest is None:
            raise ImagePullFailed(f"image {ref!r} names a tag, not a digest: only pinned images run (ref@sha256:...)")
        async with self._lock:  # one pull at a time: the layers of one image are unpacked once
            if ref in self._pulled:
                return
            try:
                await asyncio.to_thread(self._pull, ref)
            except ImagePullFailed:
                raise
            except Levers9Error as exc:
                raise ImagePullFailed(f"pulling image {ref!r} failed: {exc}") from exc
            self._pulled.add(ref)
            log.info("pulled image %s", ref)
