"""GPUs through CDI (the Container Device Interface) where the host has a spec for them.

``nvidia-ctk cdi generate`` writes, for each GPU (by index and by uuid), the
device nodes, driver library mounts, environment and hooks a container needs.
Where such a spec exists it is the most precise description of what to hand
a container, so levers9 applies it instead of guessing device nodes and
relying on the legacy NVIDIA prestart hook (the spec's own environment sets
``NVIDIA_VISIBLE_DEVICES=void`` so that hook stays out of the way).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.hooks.errors import InvalidRequest
from levers9.hooks.types import GpuDevice

__all__ = ["CDI_DIRS", "GPU_KIND", "CdiSpecs", "apply_edits", "load_specs"]

CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
GPU_KIND = "nvidia.com/gpu"


@dataclass(frozen=True)
class CdiSpecs:
    """The CDI specs of one device kind found on this host."""

    kind: str
    #: containerEdits shared by every device of the kind
    common: tuple[dict[str, Any], ...]
    #: containerEdits per device name (index, uuid, ``all``)
    devices: dict[str, dict[str, Any]]

    def edits_for(self, gpus: Sequence[GpuDevice]) -> list[dict[str, Any]]:
        """The edits that give a container exactly ``gpus``, looked up by uuid first, then by index."""
        edits = list(self.common)
        for gpu in gpus:
            found = self.devices.get(gpu.uuid) or self.devices.get(str(gpu.index))
            if found is None:
                known = ", ".join(sorted(self.devices))
                raise InvalidRequest(
                    f"the host's CDI spec for {self.kind} has no device {gpu.uuid} (index {gpu.index}); it has: {known}"
                )
            edits.append(found)
        return edits


def load_specs(dirs: Iterable[Path] = CDI_DIRS, kind: str = GPU_KIND) -> CdiSpecs | None:
    """The host's CDI specs for ``kind`` (YAML or JSON files in the CDI directories), or None when there are none."""
    import yaml

    common: list[dict[str, Any]] = []
    devices: dict[str, dict[str, Any]] = {}
    for directory in dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                text = path.read_text()
                data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
            except (OSError, ValueError, yaml.YAMLError):
                continue  # a broken spec for another device must not stop GPUs being handed out
            if not isinstance(data, dict) or data.get("kind") != kind:
                continue
            if isinstance(data.get("containerEdits"), dict):
                common.append(data["containerEdits"])
            for device in data.get("devices") or []:
                if isinstance(device, dict) and isinstance(device.get("name"), str):
                    devices[device["name"]] = device.get("containerEdits") or {}
    return CdiSpecs(kind, tuple(common), devices) if devices else None


def _node(entry: dict[str, Any], root: Path) -> dict[str, Any] | None:
    path = entry.get("path")
    if not isinstance(path, str):
        return None
    major, minor, kind = entry.get("major"), entry.get("minor"), entry.get("type", "c")
    if major is None or minor is None:
        try:
            st = os.stat(root / (entry.get("hostPath") or path).lstrip("/"))
        except OSError:
            return None  # not on this host: the runtime could not create it either
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    return {
        "path": path,
        "type": kind,
        "major": major,
        "minor": minor,
        "fileMode": entry.get("fileMode", 0o666),
        "uid": 0,
        "gid": 0,
    }


def apply_edits(config: dict[str, Any], edits: Sequence[dict[str, Any]], *, root: Path = Path("/")) -> None:
    """Apply CDI containerEdits to an OCI config in place: environment, device nodes, mounts and hooks."""
    process, linux = config["process"], config["linux"]
    env = {item.split("=", 1)[0]: item for item in process["env"]}
    devices = {d["path"]: d for d in linux.get("devices", [])}
    allowed = linux["resources"].setdefault("devices", [])
    mounts = {m["destination"]: m for m in config["mounts"]}
    hooks: dict[str, list[dict[str, Any]]] = config.setdefault("hooks", {})
    for edit in edits:
        for item in edit.get("env") or []:
            env[item.split("=", 1)[0]] = item
        for entry in edit.get("deviceNodes") or []:
            node = _node(entry, root)
            if node is not None and node["path"] not in devices:
                devices[node["path"]] = node
                allowed.append(
                    {
                        "allow": True,
                        "type": node["type"],
                        "major": node["major"],
                        "minor": node["minor"],
                        "access": "rwm",
                    }
                )
        for mount in edit.get("mounts") or []:
            mounts[mount["containerPath"]] = {
                "destination": mount["containerPath"],
                "type": "bind",
                "source": mount["hostPath"],
                "options": mount.get("options") or ["rbind", "ro"],
            }
        for hook in edit.get("hooks") or []:
            entry = {"path": hook["path"], "args": hook.get("args") or [hook["path"]]}
            if hook.get("env"):
                entry["env"] = hook["env"]
            hooks.setdefault(hook["hookName"], []).append(entry)
    process["env"] = list(env.values())
    linux["devices"] = list(devices.values())
    config["mounts"] = list(mounts.values())
    if not hooks:
        config.pop("hooks")
