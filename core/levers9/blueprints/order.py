"""A build order: what the controlplane sends the worker that builds a blueprint, as the build task's argument.

It is a tar archive: ``order.json`` and, for each copy step, ``content/<sha256 hex>.tar`` (the
deterministic tar of the files it adds, as the SDK made it; :mod:`levers9.blueprints.context`).
``order.json`` holds the format's ``version``, the build ``spec`` (:meth:`BuildSpec.to_json
<levers9.blueprints.spec.BuildSpec.to_json>` text), its ``keys``, the ``cached`` steps (key ->
``op``, ``diff_id``, ``blob_digest``, ``size``: what the workspace built before, which the worker
takes from the registry instead of running), and the ``registry`` block (``url``, ``repository``,
``tag``, ``tls_verify``) the image goes to.

Invariants: the order holds secret names, never values (they travel as every stub's secrets do), and
:func:`read_order` checks the archive's shape (only those members, each a plain file, the version
known) and that the keys are the spec's own; it raises ValueError naming what is wrong.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from levers9.blueprints.spec import BlueprintError, BuildSpec, keys

__all__ = ["BUILD_KIND", "ORDER_VERSION", "Order", "read_order", "write_order"]

#: the kind of the controlplane's own stubs whose tasks are build orders (users cannot define it)
BUILD_KIND = "build"
#: the order's format, in order.json
ORDER_VERSION = 1


@dataclass(frozen=True)
class Order:
    spec: BuildSpec
    keys: tuple[str, ...]
    #: key -> {"op", "diff_id", "blob_digest", "size"} of the steps built before
    cached: Mapping[str, Mapping[str, Any]]
    #: {"url", "repository", "tag", "tls_verify"}
    registry: Mapping[str, Any]
    #: content digest ("sha256:<hex>") -> the deterministic tar of a copy step's files
    contents: Mapping[str, bytes]


def write_order(
    spec: BuildSpec,
    all_keys: tuple[str, ...],
    cached: Mapping[str, Any],
    contents: Mapping[str, bytes],
    *,
    registry: Mapping[str, Any],
) -> bytes:
    order = {
        "version": ORDER_VERSION,
        "spec": spec.to_json(),
        "keys": list(all_keys),
        "cached": dict(cached),
        "registry": dict(registry),
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        members = [("order.json", json.dumps(order, sort_keys=True).encode())]
        members += [(f"content/{d.removeprefix('sha256:')}.tar", data) for d, data in sorted(contents.items())]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def read_order(data: bytes) -> Order:
    """The order in ``data``; ValueError naming what is wrong when it is malformed."""
    raw: dict[str, Any] | None = None
    contents: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                stream = tar.extractfile(member) if member.isfile() else None
                if stream is None:
                    raise ValueError(f"the build order's member {member.name!r} is not a file")
                if member.name == "order.json":
                    raw = json.loads(stream.read())
                elif member.name.startswith("content/") and member.name.endswith(".tar"):
                    contents["sha256:" + member.name[len("content/") : -len(".tar")]] = stream.read()
                else:
                    raise ValueError(f"the build order has an unexpected member {member.name!r}")
    except (tarfile.TarError, json.JSONDecodeError) as exc:
        raise ValueError(f"the build order is not a tar archive with order.json: {exc}") from None
    if not isinstance(raw, dict) or raw.get("version") != ORDER_VERSION:
        raise ValueError(f"the build order has no order.json of version {ORDER_VERSION}")
    try:
        spec = BuildSpec.from_json(raw["spec"])
        all_keys = tuple(raw["keys"])
        cached, registry = raw["cached"], raw["registry"]
    except (KeyError, TypeError, BlueprintError) as exc:
        raise ValueError(f"the build order's order.json is malformed: {exc}") from None
    if all_keys != keys(spec):
        raise ValueError("the build order's keys are not its spec's")
    if not isinstance(cached, dict) or not isinstance(registry, dict) or not set(cached) <= set(all_keys):
        raise ValueError("the build order's cached steps or registry are malformed")
    return Order(spec=spec, keys=all_keys, cached=cached, registry=registry, contents=contents)
