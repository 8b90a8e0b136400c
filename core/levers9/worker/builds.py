"""A build worker's side of a blueprint build: the order in, the image pushed, the layers it made reported.

A task of a ``build`` stub carries a build order (:mod:`levers9.blueprints.order`) instead of a
call's arguments. :class:`BuildTasks` runs it on the worker's own runtime: the Debian base from this
machine's base cache (:func:`levers9.builder.base.base_image`, built once per machine and recipe),
the steps the workspace built before taken from the registry into the node cache rather than run
again, the others run by :func:`levers9.builder.build.run_build` in containers of the runtime. Then
it pushes the image to the registry the order names (the controlplane's, which checks that this
worker holds a build of that workspace; an https:// one verified with the controlplane's CA when the
worker was given one, as the controlplane itself is) and answers with a JSON report: the manifest digest, the
image's size, and each step it built (key, op, layer digests), which the controlplane records.

Progress goes to the task's output as it happens, one line per step ("step 3/6 cached",
"step 4/6 run: pip install six") and each command's output indented under it, so the user who
started the build watches it.

Invariants: the build's secrets are the build stub's secret environment (decrypted onto this
session only) and reach only the steps that name them; a failed build pushes nothing and reports
the builder's message (the step, its command, its exit code, its last lines); the build's scratch
files are removed whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from levers9.blueprints.order import Order, read_order
from levers9.blueprints.spec import BuildSpec, Step
from levers9.builder.base import base_image
from levers9.builder.build import BaseImage, BuildEvent, BuildFailed, BuildResult, StepResult, run_build
from levers9.builder.layout import LAYER_GZIP, LAYER_TAR, Layer, blob_dir
from levers9.builder.steps import describe
from levers9.engine.image_sources import read_layout
from levers9.engine.images import ImageStore
from levers9.engine.node import NodeSettings, images_for
from levers9.hooks.errors import Levers9Error
from levers9.hooks.facade import Hooks
from levers9.hooks.types import RuntimeContext
from levers9.registry.auth import RegistryAuth
from levers9.registry.client import RegistryClient
from levers9.registry.pull import RegistryPuller, default_base_url
from levers9.registry.refs import parse_ref
from levers9.worker.calls import Call, Outcome, RemoteErrorInfo, StubSpec

__all__ = ["BUILD_CACHE_VARIABLE", "BuildTasks"]

log = logging.getLogger(__name__)

#: where a build worker keeps the Debian bases it built (shared by its builds, kept across restarts)
BUILD_CACHE_VARIABLE = "LEVERS9_BUILD_CACHE"
_LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


class BuildTasks:
    """Runs the build tasks placed on one worker (see the module docstring)."""

    def __init__(
        self,
        hooks: Hooks,
        runtime: RuntimeContext,
        *,
        state_dir: Path,
        credentials: Callable[[], RegistryAuth | None],
        ca_file: str | None = None,
    ) -> None:
        self.hooks = hooks
        self.runtime = runtime
        self.state_dir = state_dir
        self.credentials = credentials
        #: the controlplane's CA, which verifies its https:// registry relay (the order's push URL): the worker
        #: verifies the relay as it verifies the controlplane; None: the order's tls_verify (system CAs)
        self.ca_file = ca_file
        self.base_cache = Path(os.environ.get(BUILD_CACHE_VARIABLE) or state_dir.parent / "build-cache")
        #: builds running now (their step containers mount layers of the node cache)
        self.running = 0

    async def run(self, stub: StubSpec, call: Call, on_log: Callable[[str, bytes], None]) -> Outcome:
        loop = asyncio.get_running_loop()

        def say(text: str) -> None:
            """Task output, from the event loop or from a thread of the build (the outbox is the loop's)."""
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if here is loop:
                on_log(call.task_id, text.encode())
            else:
                loop.call_soon_threadsafe(on_log, call.task_id, text.encode())

        try:
            order = read_order(call.args)
        except ValueError as exc:
            return _failed(call, "InvalidBuildOrder", str(exc))
        work = Path(tempfile.mkdtemp(prefix="build-order-", dir=self._scratch()))
        self.running += 1
        try:
            report = await self._build(order, stub, call, work, say)
        except BuildFailed as exc:
            say(f"build failed: {exc}\n")
            return _failed(call, "BuildFailed", str(exc))
        except Levers9Error as exc:
            say(f"build failed: {exc}\n")
            return _failed(call, type(exc).__name__, str(exc))
        finally:
            self.running -= 1
            shutil.rmtree(work, ignore_errors=True)
        return Outcome(call.task_id, "complete", result=json.dumps(report).encode())

    def _verify(self, order: Order) -> bool | str:
        """How to verify the order's registry: the controlplane's CA when this worker has one, else as it says."""
        said = order.registry.get("tls_verify", True)
        return self.ca_file if self.ca_file is not None and said is not False else said

    def _scratch(self) -> Path:
        path = self.state_dir / "build-orders"
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    async def _build(
        self, order: Order, stub: StubSpec, call: Call, work: Path, say: Callable[[str], None]
    ) -> dict[str, Any]:
        spec = order.spec
        store = images_for(self.runtime, NodeSettings.of(self.runtime))
        registry = order.registry
        client = RegistryClient(str(registry["url"]), auth=self.credentials(), verify=self._verify(order))
        try:
            base, base_built = await asyncio.to_thread(self._base, spec, order, store, client, say, stub.secret_env)
            cached = await asyncio.to_thread(self._cached, spec, order, store, client)
            contents: dict[str, Path] = {}
            for digest, data in order.contents.items():
                path = work / f"{digest.removeprefix('sha256:')}.tar"
                path.write_bytes(data)
                contents[digest] = path
            total = len(spec.steps)

            def on_event(event: BuildEvent) -> None:
                say(_line(event, total))

            result = await run_build(
                spec,
                hooks=self.hooks,
                runtime=self.runtime,
                store=store,
                base=base,
                cached=cached,
                secrets=dict(stub.secret_env),
                content=lambda digest: contents[digest],
                on_event=on_event,
                out_dir=work / "image",
            )
            say(f"pushing the image to {registry['url']}/{registry['repository']}\n")
            digest, size = await asyncio.to_thread(_push, client, registry, result)
        finally:
            client.close()
        steps = [s for s in result.steps if s.key not in order.cached]
        made = [_recorded(s) for s in steps]
        if base_built is not None:
            made.insert(0, base_built)
        say(f"image {digest}: {len(result.ran)} steps run, {len(result.cached)} built before\n")
        return {"manifest_digest": digest, "size": size, "steps": made}

    def _base(
        self,
        spec: BuildSpec,
        order: Order,
        store: ImageStore,
        client: RegistryClient,
        say: Callable[[str], None],
        stub_secrets: Mapping[str, str],
    ) -> tuple[BaseImage, dict[str, Any] | None]:
        """The base to build on, and its record when this build made it (None: the workspace had it)."""
        base_key = order.keys[0]
        if spec.base.kind == "registry":
            return self._registry_base(spec, order, store, stub_secrets, say), (
                None
                if base_key in order.cached
                else {"key": base_key, "op": "base", "diff_id": None, "blob_digest": None, "size": None}
            )
        if spec.base.python_version is None:
            raise BuildUnsupported("a Debian base names its Python version (Blueprint(python_version=...))")
        say(f"step 0/{len(spec.steps)} base: Debian with Python {spec.base.python_version}\n")
        local = base_image(spec.base.python_version, self.base_cache)
        image = BaseImage.debian(local, store)
        recorded = order.cached.get(base_key)
        if recorded is None:
            (layer,) = image.layers
            return image, {
                "key": base_key,
                "op": "base",
                "diff_id": _hex(layer.diff_id),
                "blob_digest": _hex(layer.blob_digest or ""),
                "size": layer.blob_size,
            }
        if _hex(str(recorded.get("diff_id"))) == _hex(image.layers[0].diff_id):
            return image, None
        # built before from another machine's base (mmdebstrap's output differs between machines): the steps
        # after it were built on that one, so use it, from the registry
        layer = _fetch_layer(client, order, recorded, store)
        return BaseImage(
            layers=(layer,),
            env=image.env,
            cmd=image.cmd,
            workdir=image.workdir,
            architecture=image.architecture,
            created=image.created,
            history=image.history,
            apt_urls=image.apt_urls,
        ), None

    def _registry_base(
        self, spec: BuildSpec, order: Order, store: ImageStore, secrets: Mapping[str, str], say: Callable[[str], None]
    ) -> BaseImage:
        """A registry image as the base: its layers' blobs fetched into this machine's blob directory (they are
        pushed with the image, so it needs nothing of the registry it came from) and unpacked into the node cache.

        The controlplane's own registry is logged in to with this worker's credential (it holds a build of the
        workspace, whose images it may then read); another with the base's credentials, the values of the
        workspace secrets it names (a user name and a password, or a token alone).
        """
        ref = str(spec.base.ref)
        parsed = parse_ref(ref)
        ours = str(order.registry["url"]).split("://", 1)[-1].rstrip("/")
        if parsed.registry == ours:
            client = RegistryClient(str(order.registry["url"]), auth=self.credentials(), verify=self._verify(order))
        else:
            client = RegistryClient(default_base_url(parsed.registry), auth=_login(spec.base.credentials, secrets))
        say(f"step 0/{len(spec.steps)} base: {ref}\n")
        blobs = blob_dir(store.cache_dir)
        try:
            with RegistryPuller(client=lambda _: client) as puller, puller.open(ref) as layout:
                manifest = read_layout(ref, layout)
                if manifest.diff_ids is None or len(manifest.diff_ids) != len(manifest.layers):
                    raise BuildUnsupported(f"base {ref}: its config does not list a diff id for each layer")
                layers = []
                for blob, diff_id in zip(manifest.layers, manifest.diff_ids, strict=True):
                    hex_blob = blob.name.rsplit("/", 1)[-1]
                    path = blobs / hex_blob
                    if not path.exists():
                        scratch = blobs / f".pull-{hex_blob}"
                        with layout.open(blob.name) as src, open(scratch, "wb") as out:
                            shutil.copyfileobj(src, out, 1 << 20)
                        os.replace(scratch, path)
                    store.add_layer(path, diff_id)
                    with open(path, "rb") as head:
                        gzipped = head.read(2) == b"\x1f\x8b"
                    layers.append(
                        Layer(
                            diff_id=f"sha256:{diff_id}",
                            blob_digest=f"sha256:{hex_blob}",
                            blob_path=path,
                            blob_size=path.stat().st_size,
                            media_type=LAYER_GZIP if gzipped else LAYER_TAR,
                        )
                    )
        except Levers9Error as exc:
            if isinstance(exc, BuildUnsupported):
                raise
            raise BuildUnsupported(f"base {ref} could not be pulled: {exc}") from exc
        finally:
            client.close()
        config = manifest.config
        return BaseImage(
            layers=tuple(layers),
            env=config.env,
            cmd=config.cmd,
            workdir=config.workdir or "/",
            history=tuple({"created_by": f"levers9: base {ref}, layer {i + 1}"} for i in range(len(layers))),
        )

    def _cached(
        self, spec: BuildSpec, order: Order, store: ImageStore, client: RegistryClient
    ) -> dict[str, StepResult]:
        """The steps built before, their layers put in the node cache from the registry where they are not."""
        found: dict[str, StepResult] = {}
        for key, step in zip(order.keys[1:], spec.steps, strict=True):
            recorded = order.cached.get(key)
            if recorded is None:
                break
            layer = _fetch_layer(client, order, recorded, store) if recorded.get("diff_id") else None
            found[key] = _cached_step(key, step, layer)
        return found


class BuildUnsupported(Levers9Error):
    """The order asks for something this worker's builder cannot do yet; the message says what to use."""


def _login(names: tuple[str, ...], secrets: Mapping[str, str]) -> RegistryAuth | None:
    """The base registry's login from the workspace secrets it names: (user, password), or a token alone."""
    if not names:
        return None
    missing = [n for n in names if n not in secrets]
    if missing:
        raise BuildUnsupported(f"the base's credentials name secrets this build was not given: {', '.join(missing)}")
    if len(names) == 1:
        return RegistryAuth(username="token", password=secrets[names[0]])
    return RegistryAuth(username=secrets[names[0]], password=secrets[names[1]])


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def _line(event: BuildEvent, total: int) -> str:
    where = f"step {event.step}/{total}"
    if event.kind == "start":
        return f"{where} {event.text}\n"
    if event.kind == "cached":
        return f"{where} cached\n"
    if event.kind == "output":
        return f"    {event.text}\n"
    if event.kind == "done":
        return f"{where} done{': ' + event.text if event.text else ''}\n"
    return f"{event.text}\n"


def _fetch_layer(client: RegistryClient, order: Order, recorded: Mapping[str, Any], store: ImageStore) -> Layer:
    """The recorded layer, unpacked in the node cache (downloaded from the workspace's repository if it is not)."""
    diff_id, blob = _hex(str(recorded["diff_id"])), _hex(str(recorded["blob_digest"]))
    size = int(recorded.get("size") or 0)
    if store.layer_path(diff_id) is None:
        fd, scratch = tempfile.mkstemp(prefix=".pull-", suffix=".tar.gz", dir=store.cache_dir)
        try:
            with (
                os.fdopen(fd, "wb") as out,
                client.open_blob(str(order.registry["repository"]), f"sha256:{blob}") as src,
            ):
                shutil.copyfileobj(src, out, 1 << 20)
            store.add_layer(Path(scratch), diff_id)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(scratch)
    return Layer(diff_id=f"sha256:{diff_id}", blob_digest=f"sha256:{blob}", blob_path=None, blob_size=size)


def _cached_step(key: str, step: Step, layer: Layer | None) -> StepResult:
    return StepResult(
        key=key,
        op=step.op,
        created_by=describe(step),
        diff_id=layer.diff_id if layer else None,
        blob_digest=layer.blob_digest if layer else None,
        size=layer.blob_size if layer else None,
        env=step.env if step.op == "env" else (),
        workdir=step.args[0] if step.op == "workdir" else None,
    )


def _recorded(step: StepResult) -> dict[str, Any]:
    return {
        "key": step.key,
        "op": step.op,
        "diff_id": _hex(step.diff_id) if step.diff_id else None,
        "blob_digest": _hex(step.blob_digest) if step.blob_digest else None,
        "size": step.size,
    }


def _push(client: RegistryClient, registry: Mapping[str, Any], result: BuildResult) -> tuple[str, int]:
    """Push the layout's blobs the registry lacks, then its manifest under the order's tag; its digest and size."""
    repo, layout = str(registry["repository"]), result.layout
    index = json.loads((layout / "index.json").read_text())
    (descriptor,) = index["manifests"]
    manifest_bytes = (layout / "blobs" / "sha256" / _hex(descriptor["digest"])).read_bytes()
    manifest = json.loads(manifest_bytes)
    size = 0
    for blob in [manifest["config"], *manifest["layers"]]:
        size += int(blob["size"])
        path = layout / "blobs" / "sha256" / _hex(blob["digest"])
        if path.exists():
            client.push_blob(repo, blob["digest"], path, int(blob["size"]))
        elif not client.has_blob(repo, blob["digest"]):
            raise BuildUnsupported(f"layer {blob['digest']} is neither built here nor in {repo}: build again")
    digest = client.push_manifest(repo, str(registry["tag"]), manifest_bytes, str(descriptor["mediaType"]))
    return digest, size


def _failed(call: Call, kind: str, message: str) -> Outcome:
    return Outcome(call.task_id, "error", error=RemoteErrorInfo(kind, message))
