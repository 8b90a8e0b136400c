"""Pulling registry images into a worker's layer cache: the puller an image store is given.

The engine's :class:`~levers9.engine.images.ImageStore` owns the cache (diff-id
keyed layers, locks, atomic renames, digest checks, records); it never imports
this package. A worker gives it a :class:`RegistryPuller`, which answers three
questions about a ref: is it a registry ref (:meth:`RegistryPuller.accepts`),
which manifest digest does it pin (:meth:`RegistryPuller.pinned`, with no
request), and what is in it (:meth:`RegistryPuller.open`: one manifest
request, then a :class:`RegistryLayout`). The layout shows the registry's
image as an OCI image layout: ``index.json`` names the manifest the ref
resolved to, ``blobs/sha256/<hex>`` reads manifests (through the manifests
endpoint), configs and layers (through the blobs endpoint). So the store reads
it with the same code as a layout directory, and asks only for what its cache
lacks: a layer it has is never downloaded, an image it recorded by digest is
never asked for at all.

Invariants: every manifest and blob is checked against its digest as it is
read (:mod:`levers9.registry.client`); only loopback registries
(``localhost``, ``127.0.0.0/8``, ``[::1]``) and those named ``insecure`` are
spoken to over plain HTTP, every other over HTTPS, as Docker does; one client
per registry, closed by :meth:`RegistryPuller.close`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import ipaddress
import json
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import IO

from levers9.registry.auth import RegistryAuth
from levers9.registry.client import INDEX_TYPES, OCI_INDEX, RegistryClient
from levers9.registry.errors import InvalidRefError, RegistryError
from levers9.registry.refs import ImageRef, check_digest, parse_ref

__all__ = ["RegistryLayout", "RegistryPuller", "default_base_url"]

_LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'
_CONFIG_LIMIT = 16 << 20


def default_base_url(registry: str, insecure: Collection[str] = ()) -> str:
    """``http://`` for a loopback registry or one in ``insecure``, ``https://`` for any other."""
    host = registry.rsplit(":", 1)[0] if not registry.endswith("]") else registry
    host = host.strip("[]")
    loopback = host == "localhost"
    with contextlib.suppress(ValueError):
        loopback = loopback or ipaddress.ip_address(host).is_loopback
    return f"{'http' if loopback or registry in insecure else 'https'}://{registry}"


class RegistryLayout:
    """One registry image seen as an OCI image layout (see the module docstring); made by :meth:`RegistryPuller.open`."""

    def __init__(
        self, puller: RegistryPuller, client: RegistryClient, ref: ImageRef, manifest: bytes, media_type: str
    ) -> None:
        self._puller = puller
        self._client = client
        self._repo = ref.repository
        self._manifests: dict[str, bytes | None] = {}
        #: the digest of the manifest (or index) the ref resolved to
        self.digest = self._remember(manifest)
        entry = {"mediaType": media_type, "digest": self.digest, "size": len(manifest)}
        self._index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}).encode()

    def exists(self, name: str) -> bool:
        return name in ("oci-layout", "index.json") or self._digest(name) is not None

    def read(self, name: str) -> bytes:
        if name == "oci-layout":
            return _LAYOUT
        if name == "index.json":
            return self._index
        digest = self._required(name)
        if digest in self._manifests:
            cached = self._manifests[digest]
            if cached is not None:
                return cached
            data, _, _ = self._client.get_manifest(self._repo, digest)
            self._remember(data)
            return data
        return self._client.read_blob(self._repo, digest, _CONFIG_LIMIT)

    def open(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        return self._open_layer(self._required(name))

    @contextlib.contextmanager
    def _open_layer(self, digest: str) -> Iterator[IO[bytes]]:
        with self._client.open_blob(self._repo, digest) as stream:
            self._puller.layers_downloaded += 1
            yield io.BufferedReader(stream, 1 << 20)

    def _remember(self, manifest: bytes) -> str:
        """Keep a manifest read; when it is an index, note its entries as manifests (read by the manifests API)."""
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        self._manifests[digest] = manifest
        try:
            doc = json.loads(manifest)
        except ValueError:
            return digest
        if isinstance(doc, dict) and (doc.get("mediaType") in INDEX_TYPES or "manifests" in doc):
            for entry in doc.get("manifests") or []:
                child = entry.get("digest") if isinstance(entry, dict) else None
                if isinstance(child, str) and child not in self._manifests:
                    self._manifests[child] = None  # fetched when the store picks it
        return digest

    def _digest(self, name: str) -> str | None:
        prefix = "blobs/sha256/"
        if not name.startswith(prefix):
            return None
        try:
            return check_digest("sha256:" + name[len(prefix) :])
        except InvalidRefError:
            return None

    def _required(self, name: str) -> str:
        digest = self._digest(name)
        if digest is None:
            raise RegistryError(
                f"no such file {name!r} in the image (only blobs/sha256/<hex> are read from a registry)",
                registry=self._client.registry,
                operation="read image",
                repository=self._repo,
            )
        return digest


class RegistryPuller:
    """Reads registry refs for an :class:`~levers9.engine.images.ImageStore` (see the module docstring).

    ``credentials`` maps ``host[:port]`` to its login; ``insecure`` names registries spoken to over
    plain HTTP beyond the loopback ones; ``client`` replaces how a registry's client is made (tests,
    or a worker with its own TLS settings).
    """

    def __init__(
        self,
        *,
        credentials: Mapping[str, RegistryAuth] | None = None,
        insecure: Collection[str] = (),
        verify: bool | str = True,
        timeout: float = 60.0,
        client: Callable[[str], RegistryClient] | None = None,
    ) -> None:
        self._credentials = dict(credentials or {})
        self._insecure = frozenset(insecure)
        self._verify = verify
        self._timeout = timeout
        self._make = client
        self._clients: dict[str, RegistryClient] = {}
        #: layer blobs opened for download (a layer found in the cache is not)
        self.layers_downloaded = 0

    def accepts(self, ref: str) -> bool:
        try:
            parse_ref(ref)
        except InvalidRefError:
            return False
        return True

    def pinned(self, ref: str) -> str | None:
        return parse_ref(ref).digest

    @contextlib.contextmanager
    def open(self, ref: str) -> Iterator[RegistryLayout]:
        parsed = parse_ref(ref)
        client = self.client(parsed.registry)
        manifest, media_type, _ = client.get_manifest(parsed.repository, parsed.reference)
        yield RegistryLayout(self, client, parsed, manifest, media_type)

    def client(self, registry: str) -> RegistryClient:
        """The one client of ``registry`` (``host[:port]``), made on first use."""
        found = self._clients.get(registry)
        if found is None:
            if self._make is not None:
                found = self._make(registry)
            else:
                found = RegistryClient(
                    default_base_url(registry, self._insecure),
                    auth=self._credentials.get(registry),
                    verify=self._verify,
                    timeout=self._timeout,
                )
            self._clients[registry] = found
        return found

    def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()

    def __enter__(self) -> RegistryPuller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
