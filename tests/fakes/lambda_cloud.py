"""A fake Lambda Cloud API v1: an HTTP server on 127.0.0.1 speaking the documented API, for the real httpx client.

Written from the Cloud API reference (its OpenAPI document, v1), so the
``lambda_labs`` plugin runs unchanged against it, in the test process or from a
``levers9 server`` subprocess: everything goes over HTTP, under
``http://127.0.0.1:<port>/api/v1`` (:attr:`LambdaCloud.url`).

What it answers, as the reference says:

* ``GET /instance-types`` (the recorded real answer in
  ``tests/data/gpu/lambda_instance_types.json``, with the capacity per (type,
  region) this fake holds: :meth:`LambdaCloud.set_capacity`), ``GET /instances``,
  ``GET /instances/{id}``, ``POST /instance-operations/launch``,
  ``POST /instance-operations/terminate``, ``GET /ssh-keys``, ``GET /file-systems``;
* a success is ``{"data": ...}``, a failure ``{"error": {"code", "message", "suggestion"}}``;
* auth: ``Authorization: Bearer <key>`` (or Basic ``<key>:``), else 401 ``global/invalid-api-key``;
* launch validates its body like the API: the three required fields, no unknown
  field, a known region, exactly one SSH key (an unknown one: 404
  ``global/object-does-not-exist``), filesystems that exist and are in the
  launch's region (else 400 ``instance-operations/launch/file-system-in-wrong-region``),
  a name of at most 64 characters, tags whose keys match ``^[a-z][a-z0-9-:]+$``
  (55 characters) and values of at most 128, plain-text ``user_data`` of at
  most 1 MB, ``image`` as ``{"family"}`` or ``{"id"}``; a region without
  capacity for the type is 400 ``instance-operations/launch/insufficient-capacity``;
* an instance is ``booting`` for ``boot_delay_s`` (0: ``active`` at once), then
  ``active``; terminate makes it ``terminating`` for ``terminate_delay_s``, then
  ``terminated`` (still listed, as ``terminated``); an unknown id is 404
  ``global/object-does-not-exist``; ``user_data`` is write-only, never in an answer;
* rate limits, per API key, as documented ("generally limited to one request
  per second"; launches "one request per 12 seconds"): more than
  ``requests_per_s`` sustained is 429, with ``request_burst`` requests let
  through at once (the reference does not say how bursts count); a launch
  sooner than ``launch_interval_s`` after the previous one is 429. Both carry
  ``Retry-After`` in whole seconds. The reference documents no body for a 429:
  the fake's code ``global/rate-limited`` is its own, so clients must key on
  the status. :meth:`LambdaCloud.set_rate_limits` shortens or switches them
  off (None) for tests that are not about them.

Fault injection: :meth:`fail_request` / :meth:`fail_launch` (the next ``times``
calls answer an error; None: until :meth:`clear_faults`), :meth:`refuse_launch`
(a documented error code at its status, :data:`STATUS`),
:meth:`drop_launch_response` (the launch happens, the client gets a reset
connection or no answer until its timeout), :meth:`set_status` (``unhealthy``,
``preempted``). :meth:`calls` counts requests per path (every request that
reached the server, refused or not); :meth:`call_log` stamps (``time.time()``)
each request as it arrives and each answer as it is sent, for ``bench/clouds.py``; :meth:`launch_bodies` returns the launch
requests as sent; :meth:`instances` returns every instance as a
:class:`~tests.fakes.CloudInstance` with its tags and user data
(``running`` while ``active``, ``gone`` once ``terminating``).

Invariants: all state is behind one lock; :meth:`stop` ends the server thread
and releases any held connection; nothing is written to disk.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import re
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Literal

from tests.fakes import CloudInstance
from tests.fakes.local_server import LocalServer

__all__ = ["DEFAULT_API_KEY", "DEFAULT_SSH_KEY", "STATUS", "LambdaCloud"]

RECORDED_TYPES = Path(__file__).resolve().parents[1] / "data" / "gpu" / "lambda_instance_types.json"
DEFAULT_API_KEY = "secret_levers9-fake_0123456789abcdef"
DEFAULT_SSH_KEY = "levers9-test"
PREFIX = "/api/v1"
#: the regions the reference lists (PublicRegionCode)
REGIONS = (
    "europe-central-1",
    "asia-south-1",
    "australia-east-1",
    "me-west-1",
    "asia-northeast-1",
    "asia-northeast-2",
    "us-east-1",
    "us-west-2",
    "us-west-1",
    "us-south-1",
    "us-west-3",
    "us-midwest-1",
    "us-east-2",
    "us-south-2",
    "us-south-3",
    "us-east-3",
    "us-midwest-2",
)
_LAUNCH_FIELDS = {
    "region_name",
    "instance_type_name",
    "ssh_key_names",
    "file_system_names",
    "file_system_mounts",
    "hostname",
    "name",
    "image",
    "user_data",
    "tags",
    "firewall_rulesets",
}
_TAG_KEY = re.compile(r"^[a-z][a-z0-9-:]+$")
_HOSTNAME = re.compile(r"^[a-z0-9][0-9a-z-]{0,62}$")
_USER_DATA_MAX = 1024 * 1024
_UNSET: Any = object()


#: the HTTP status the Cloud API reference gives each documented error code (``global/rate-limited`` is this
#: fake's own name for the bodiless 429)
STATUS: dict[str, int] = {
    "instance-operations/launch/insufficient-capacity": 400,
    "instance-operations/launch/file-system-in-wrong-region": 400,
    "instance-operations/launch/file-systems-not-supported": 400,
    "global/quota-exceeded": 400,
    "global/invalid-parameters": 400,
    "ssh-keys/key-in-use": 400,
    "global/invalid-api-key": 401,
    "global/account-inactive": 403,
    "global/invalid-address": 403,
    "global/object-does-not-exist": 404,
    "global/rate-limited": 429,
    "global/unknown": 500,
}


class _Refused(Exception):
    """An error answer: status, code, message, suggestion."""

    def __init__(self, status: int, code: str, message: str, suggestion: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.suggestion = status, code, message, suggestion
        self.retry_after: int | None = None


def _invalid(message: str) -> _Refused:
    return _Refused(400, "global/invalid-parameters", message, "Check the request body against the API reference.")


@dataclass
class _Fault:
    method: str
    path: str
    status: int
    code: str
    message: str
    suggestion: str | None
    times: int | None
    retry_after: int | None


@dataclass
class _Instance:
    id: str
    name: str
    region: str
    instance_type: str
    ssh_key_names: list[str]
    file_system_names: list[str]
    tags: list[dict[str, str]]
    user_data: str
    hostname: str | None
    ip: str
    launched_at: float
    forced_status: str | None = None
    terminate_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class LambdaCloud:
    """The fake; use as a context manager (or :meth:`start` / :meth:`stop`). See the module docstring."""

    def __init__(
        self,
        *,
        api_key: str = DEFAULT_API_KEY,
        ssh_keys: tuple[str, ...] = (DEFAULT_SSH_KEY,),
        requests_per_s: float | None = 1.0,
        request_burst: int = 5,
        launch_interval_s: float | None = 12.0,
        boot_delay_s: float = 0.0,
        terminate_delay_s: float = 0.0,
        recorded: Path = RECORDED_TYPES,
    ) -> None:
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.api_keys = {api_key}
        self.requests_per_s = requests_per_s
        self.request_burst = request_burst
        self.launch_interval_s = launch_interval_s
        self.boot_delay_s = boot_delay_s
        self.terminate_delay_s = terminate_delay_s
        types = json.loads(recorded.read_text())["data"]
        self._types: dict[str, dict[str, Any]] = {name: item["instance_type"] for name, item in types.items()}
        self._capacity: dict[str, set[str]] = {
            name: {r["name"] for r in item["regions_with_capacity_available"]} for name, item in types.items()
        }
        self._region_names: dict[str, str] = {
            r["name"]: r["description"] for item in types.values() for r in item["regions_with_capacity_available"]
        }
        self._ssh_keys = {name: f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA{name} levers9-fake" for name in ssh_keys}
        self._file_systems: dict[str, str] = {}
        self._instances: dict[str, _Instance] = {}
        self._faults: list[_Fault] = []
        self._drops: list[tuple[int, Literal["reset", "timeout"], float]] = []
        self._calls: Counter[tuple[str, str]] = Counter()
        self._log: list[tuple[float, str, str]] = []
        self._launch_bodies: list[Any] = []
        self._buckets: dict[str, _Bucket] = {}
        self._last_launch: dict[str, float] = {}
        self._server: LocalServer | None = None
        self.port = 0
        #: answer instances without their ``tags`` (as answers of the API did before launch tags existed)
        self.omit_tags = False

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """The API's base URL, for the plugin's ``api_url`` setting."""
        return f"http://127.0.0.1:{self.port}{PREFIX}"

    def start(self) -> LambdaCloud:
        self._server = LocalServer(_handler(self), name="fake-lambda-cloud", poll_interval=0.05)
        self.port = self._server.port
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.close()
        self._server = None

    def __enter__(self) -> LambdaCloud:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ what tests set

    def set_rate_limits(
        self,
        *,
        requests_per_s: float | None = _UNSET,
        request_burst: int = _UNSET,
        launch_interval_s: float | None = _UNSET,
    ) -> None:
        """Change the limits (None switches one off); the per-key clocks start afresh."""
        with self._lock:
            if requests_per_s is not _UNSET:
                self.requests_per_s = requests_per_s
            if request_burst is not _UNSET:
                self.request_burst = request_burst
            if launch_interval_s is not _UNSET:
                self.launch_interval_s = launch_interval_s
            self._buckets.clear()
            self._last_launch.clear()

    def set_capacity(self, instance_type: str, regions: list[str] | set[str] | tuple[str, ...]) -> None:
        """The regions where ``instance_type`` has capacity from now on (empty: nowhere)."""
        with self._lock:
            if instance_type not in self._types:
                raise KeyError(f"no instance type {instance_type!r} in the recorded data")
            self._capacity[instance_type] = set(regions)

    def add_file_system(self, name: str, region: str) -> None:
        with self._lock:
            self._file_systems[name] = region

    def add_api_key(self, key: str) -> None:
        with self._lock:
            self.api_keys.add(key)

    def fail_request(
        self,
        method: str,
        path: str,
        status: int,
        code: str,
        message: str,
        *,
        times: int | None = None,
        retry_after: int | None = None,
        suggestion: str | None = None,
    ) -> None:
        """Answer the next ``times`` requests ``method path`` (path below ``/api/v1``) with this error."""
        with self._lock:
            self._faults.append(_Fault(method, path, status, code, message, suggestion, times, retry_after))

    def fail_launch(
        self,
        status: int,
        code: str,
        message: str,
        *,
        times: int | None = None,
        retry_after: int | None = None,
        suggestion: str | None = None,
    ) -> None:
        """Answer the next ``times`` launches (None: every launch until :meth:`clear_faults`) with this error."""
        self.fail_request(
            "POST",
            "/instance-operations/launch",
            status,
            code,
            message,
            times=times,
            retry_after=retry_after,
            suggestion=suggestion,
        )

    def refuse_launch(
        self, code: str, message: str | None = None, *, times: int | None = None, suggestion: str | None = None
    ) -> None:
        """Answer the next ``times`` launches with the documented error ``code`` at its status (:data:`STATUS`)."""
        self.fail_launch(
            STATUS[code], code, message or f"injected {code} (fake Lambda)", times=times, suggestion=suggestion
        )

    def drop_launch_response(
        self, times: int = 1, *, how: Literal["reset", "timeout"] = "reset", hold_s: float = 10.0
    ) -> None:
        """The next ``times`` valid launches start their instance, but the client gets no answer.

        ``reset``: the connection is closed at once (a reset); ``timeout``: it is held silent for ``hold_s``
        (or until :meth:`stop`) so the client's read timeout fires first.
        """
        with self._lock:
            self._drops.append((times, how, hold_s))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._drops.clear()

    def set_status(self, instance_id: str, status: str) -> None:
        """Force an instance's status (``unhealthy``, ``preempted``...); terminate still overrides it."""
        with self._lock:
            self._instances[instance_id].forced_status = status

    def terminate_all(self) -> None:
        """Terminate every instance at once (test clean-up)."""
        with self._lock:
            now = time.monotonic()
            for instance in self._instances.values():
                if instance.terminate_at is None:
                    instance.terminate_at = now - self.terminate_delay_s

    # ------------------------------------------------------------------ what tests read

    def calls(self, path: str, method: str | None = None) -> int:
        """How many requests for ``path`` (below ``/api/v1``, e.g. ``/instance-operations/launch``) arrived."""
        with self._lock:
            return sum(n for (m, p), n in self._calls.items() if p == path and (method is None or m == method))

    def call_log(self) -> list[tuple[float, str, str]]:
        """``(time.time(), "METHOD /path", detail)`` for each request that arrived (detail ``request``) and each
        answer sent (``response <status> <error code or "ok">``; ``dropped`` for a launch whose answer was lost),
        paths below ``/api/v1``, in time order."""
        with self._lock:
            return sorted(self._log)

    def note(self, stamp: float, op: str, detail: str) -> None:
        with self._lock:
            self._log.append((stamp, op, detail))

    def launch_bodies(self) -> list[Any]:
        """The body of every launch request that got past auth, rate limits and injected faults, in order."""
        with self._lock:
            return copy.deepcopy(self._launch_bodies)

    def instances(self) -> list[CloudInstance]:
        with self._lock:
            return [self._view(i) for i in self._instances.values()]

    def instance(self, instance_id: str) -> CloudInstance:
        with self._lock:
            return self._view(self._instances[instance_id])

    def _view(self, instance: _Instance) -> CloudInstance:
        status = self._status(instance)
        return CloudInstance(
            id=instance.id,
            state=status,
            running=status == "active",
            gone=status in ("terminating", "terminated"),
            user_data=instance.user_data,
            tags={t["key"]: t["value"] for t in instance.tags},
            instance_type=instance.instance_type,
            region=instance.region,
        )

    # ------------------------------------------------------------------ the API (called with the lock held)

    def _status(self, instance: _Instance) -> str:
        now = time.monotonic()
        if instance.terminate_at is not None:
            return "terminated" if now >= instance.terminate_at + self.terminate_delay_s else "terminating"
        if instance.forced_status is not None:
            return instance.forced_status
        return "active" if now >= instance.launched_at + self.boot_delay_s else "booting"

    def _region(self, name: str) -> dict[str, str]:
        return {"name": name, "description": self._region_names.get(name, name)}

    def _instance_json(self, instance: _Instance) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "id": instance.id,
            "name": instance.name,
            "ip": instance.ip,
            "private_ip": "10.0." + instance.ip.split(".", 2)[2],
            "status": self._status(instance),
            "ssh_key_names": list(instance.ssh_key_names),
            "file_system_names": list(instance.file_system_names),
            "region": self._region(instance.region),
            "instance_type": copy.deepcopy(self._types[instance.instance_type]),
            "hostname": instance.hostname or instance.ip.replace(".", "-"),
            "is_reserved": False,
            "tags": [dict(t) for t in instance.tags],
        }
        if self.omit_tags:
            del answer["tags"]
        return answer

    def _authenticate(self, header: str | None) -> str:
        key = None
        if header and header.startswith("Bearer "):
            key = header[len("Bearer ") :].strip()
        elif header and header.startswith("Basic "):
            raw = header[len("Basic ") :].strip()
            try:
                decoded = base64.b64decode(raw, validate=True).decode()
            except ValueError:
                decoded = raw
            key = decoded.removesuffix(":")
        if key is None or key not in self.api_keys:
            raise _Refused(
                401,
                "global/invalid-api-key",
                "API key was invalid, expired, or deleted.",
                "Check your API key or create a new one, then try again.",
            )
        return key

    def _rate_limit(self, key: str, method: str, path: str) -> None:
        now = time.monotonic()
        if self.requests_per_s is not None:
            bucket = self._buckets.setdefault(key, _Bucket(float(self.request_burst), now))
            bucket.tokens = min(float(self.request_burst), bucket.tokens + (now - bucket.stamp) * self.requests_per_s)
            bucket.stamp = now
            if bucket.tokens < 1.0:
                refused = _Refused(429, "global/rate-limited", "Too many requests.", "Slow down and try again.")
                refused.retry_after = max(1, math.ceil((1.0 - bucket.tokens) / self.requests_per_s))
                raise refused
            bucket.tokens -= 1.0
        if method == "POST" and path == "/instance-operations/launch" and self.launch_interval_s is not None:
            last = self._last_launch.get(key)
            if last is not None and now - last < self.launch_interval_s:
                refused = _Refused(
                    429, "global/rate-limited", "Too many launch requests.", "Launch at most once every 12 seconds."
                )
                refused.retry_after = max(1, math.ceil(self.launch_interval_s - (now - last)))
                raise refused
            self._last_launch[key] = now

    def _fault(self, method: str, path: str) -> None:
        for fault in self._faults:
            if fault.method == method and fault.path == path:
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                refused = _Refused(fault.status, fault.code, fault.message, fault.suggestion)
                refused.retry_after = fault.retry_after
                raise refused

    def _take_drop(self) -> tuple[Literal["reset", "timeout"], float] | None:
        if not self._drops:
            return None
        times, how, hold = self._drops[0]
        if times <= 1:
            self._drops.pop(0)
        else:
            self._drops[0] = (times - 1, how, hold)
        return how, hold

    def _launch(self, body: Any) -> _Instance:
        if not isinstance(body, dict):
            raise _invalid("The request body must be a JSON object.")
        unknown = sorted(set(body) - _LAUNCH_FIELDS)
        if unknown:
            raise _invalid(f"Unknown field(s): {', '.join(unknown)}.")
        for required in ("region_name", "instance_type_name", "ssh_key_names"):
            if required not in body:
                raise _invalid(f"Missing required field '{required}'.")
        region, type_name, ssh = body["region_name"], body["instance_type_name"], body["ssh_key_names"]
        if region not in REGIONS:
            raise _invalid(f"'{region}' is not a region.")
        if not isinstance(type_name, str):
            raise _invalid("instance_type_name must be a string.")
        if not isinstance(ssh, list) or len(ssh) != 1 or not isinstance(ssh[0], str):
            raise _invalid("Exactly one SSH key must be specified in ssh_key_names.")
        file_systems = body.get("file_system_names", [])
        if not isinstance(file_systems, list) or not all(isinstance(f, str) for f in file_systems):
            raise _invalid("file_system_names must be a list of strings.")
        name = body.get("name", "")
        if not isinstance(name, str) or len(name) > 64:
            raise _invalid("name must be a string of at most 64 characters.")
        hostname = body.get("hostname")
        if hostname is not None and (not isinstance(hostname, str) or not _HOSTNAME.match(hostname)):
            raise _invalid("hostname is not a valid hostname.")
        image = body.get("image")
        if image is not None and not (
            isinstance(image, dict)
            and len(image) == 1
            and next(iter(image)) in ("family", "id")
            and isinstance(next(iter(image.values())), str)
        ):
            raise _invalid('image must be {"family": <name>} or {"id": <id>}.')
        user_data = body.get("user_data", "")
        if not isinstance(user_data, str) or len(user_data.encode()) > _USER_DATA_MAX:
            raise _invalid("user_data must be plain text of at most 1MB.")
        tags = body.get("tags", [])
        if not isinstance(tags, list):
            raise _invalid("tags must be a list.")
        for tag in tags:
            if (
                not isinstance(tag, dict)
                or set(tag) != {"key", "value"}
                or not isinstance(tag["key"], str)
                or not isinstance(tag["value"], str)
                or not _TAG_KEY.match(tag["key"])
                or len(tag["key"]) > 55
                or len(tag["value"]) > 128
            ):
                raise _invalid(f"Invalid tag {tag!r}: keys match ^[a-z][a-z0-9-:]+$ (55 at most), values 128 at most.")
        if type_name not in self._types:
            raise _Refused(404, "global/object-does-not-exist", f"Instance type '{type_name}' does not exist.")
        if ssh[0] not in self._ssh_keys:
            raise _Refused(
                404,
                "global/object-does-not-exist",
                f"SSH key '{ssh[0]}' does not exist.",
                "Add the key on the SSH keys page, or check its name.",
            )
        for fs in file_systems:
            if fs not in self._file_systems:
                raise _Refused(404, "global/object-does-not-exist", f"Filesystem '{fs}' does not exist.")
            if self._file_systems[fs] != region:
                raise _Refused(
                    400,
                    "instance-operations/launch/file-system-in-wrong-region",
                    f"Filesystem '{fs}' is in {self._file_systems[fs]}, not {region}.",
                    "Launch in the filesystem's region.",
                )
        if region not in self._capacity.get(type_name, set()):
            raise _Refused(
                400,
                "instance-operations/launch/insufficient-capacity",
                "Not enough capacity to fulfill launch request.",
                "Choose an instance type with more availability, or try again later.",
            )
        number = len(self._instances) + 1
        instance = _Instance(
            id=uuid.uuid4().hex,
            name=name,
            region=region,
            instance_type=type_name,
            ssh_key_names=list(ssh),
            file_system_names=list(file_systems),
            tags=[dict(t) for t in tags],
            user_data=user_data,
            hostname=hostname,
            ip=f"198.51.{number // 250}.{number % 250 + 1}",
            launched_at=time.monotonic(),
        )
        self._instances[instance.id] = instance
        return instance

    def _terminate(self, body: Any) -> list[dict[str, Any]]:
        ids = body.get("instance_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise _invalid("instance_ids must be a non-empty list of instance ids.")
        unknown = [i for i in ids if i not in self._instances]
        if unknown:
            raise _Refused(404, "global/object-does-not-exist", "Specified instance does not exist.")
        now = time.monotonic()
        for instance_id in ids:
            instance = self._instances[instance_id]
            if instance.terminate_at is None:
                instance.terminate_at = now
        return [self._instance_json(self._instances[i]) for i in ids]

    def _route(self, method: str, path: str, body: Any) -> Any:
        if method == "GET" and path == "/instance-types":
            return {
                name: {
                    "instance_type": copy.deepcopy(spec),
                    "regions_with_capacity_available": [self._region(r) for r in sorted(self._capacity[name])],
                }
                for name, spec in self._types.items()
            }
        if method == "GET" and path == "/instances":
            return [self._instance_json(i) for i in self._instances.values()]
        if method == "GET" and path.startswith("/instances/"):
            found = self._instances.get(path.removeprefix("/instances/"))
            if found is None:
                raise _Refused(404, "global/object-does-not-exist", "Specified instance does not exist.")
            return self._instance_json(found)
        if method == "POST" and path == "/instance-operations/launch":
            self._launch_bodies.append(copy.deepcopy(body))
            return {"instance_ids": [self._launch(body).id]}
        if method == "POST" and path == "/instance-operations/terminate":
            return {"terminated_instances": self._terminate(body)}
        if method == "GET" and path == "/ssh-keys":
            return [{"id": f"key-{n}", "name": n, "public_key": k} for n, k in sorted(self._ssh_keys.items())]
        if method == "GET" and path == "/file-systems":
            return [
                {
                    "id": f"fs-{n}",
                    "name": n,
                    "mount_point": f"/lambda/nfs/{n}",
                    "created": "2026-01-01T00:00:00Z",
                    "created_by": {"id": "user-1", "email": "ops@example.com", "status": "active"},
                    "is_in_use": any(n in i.file_system_names for i in self._instances.values()),
                    "region": self._region(r),
                }
                for n, r in sorted(self._file_systems.items())
            ]
        raise _Refused(404, "fake/no-such-route", f"No route {method} {PREFIX}{path}.")

    def handle(self, method: str, raw_path: str, auth: str | None, raw_body: bytes) -> tuple[int, dict[str, str], Any]:
        """One request: (status, headers, JSON answer); raises :class:`_Drop` when the answer must be lost."""
        path = raw_path.split("?", 1)[0]
        with self._lock:
            self._calls[(method, path.removeprefix(PREFIX))] += 1
            try:
                if not path.startswith(PREFIX + "/"):
                    raise _Refused(404, "fake/no-such-route", f"No route {method} {path}.")
                path = path.removeprefix(PREFIX)
                key = self._authenticate(auth)
                self._rate_limit(key, method, path)
                self._fault(method, path)
                try:
                    body = json.loads(raw_body) if raw_body else None
                except ValueError:
                    raise _invalid("The request body is not JSON.") from None
                data = self._route(method, path, body)
                if method == "POST" and path == "/instance-operations/launch":
                    drop = self._take_drop()
                    if drop is not None:
                        raise _Drop(*drop)
                return 200, {}, {"data": data}
            except _Refused as refused:
                headers = {"Retry-After": str(refused.retry_after)} if refused.retry_after is not None else {}
                error: dict[str, Any] = {"code": refused.code, "message": refused.message}
                if refused.suggestion:
                    error["suggestion"] = refused.suggestion
                return refused.status, headers, {"error": error}

    def hold(self, seconds: float) -> None:
        """Wait ``seconds`` or until the fake stops (a held connection)."""
        self._stopping.wait(seconds)


class _Drop(Exception):
    def __init__(self, how: Literal["reset", "timeout"], hold_s: float) -> None:
        super().__init__(how)
        self.how, self.hold_s = how, hold_s


def _handler(cloud: LambdaCloud) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "fake-lambda-cloud"

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def _serve(self) -> None:
            received = time.time()
            op = f"{self.command} {self.path.split('?', 1)[0].removeprefix(PREFIX)}"
            cloud.note(received, op, "request")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                status, headers, answer = cloud.handle(self.command, self.path, self.headers.get("Authorization"), raw)
            except _Drop as drop:
                cloud.note(time.time(), op, "dropped")
                if drop.how == "timeout":
                    cloud.hold(drop.hold_s)
                else:
                    # SO_LINGER 0: close with a reset, as a dropped connection looks to the client
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                return
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
            error = answer.get("error") if isinstance(answer, dict) else None
            cloud.note(time.time(), op, f"response {status} {error.get('code') if isinstance(error, dict) else 'ok'}")

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def do_PUT(self) -> None:
            self._serve()

        def do_DELETE(self) -> None:
            self._serve()

    return Handler


def running(**kwargs: Any) -> Iterator[LambdaCloud]:
    """A started fake for a fixture: ``yield from running(...)``; stopped afterwards."""
    cloud = LambdaCloud(**kwargs).start()
    try:
        yield cloud
    finally:
        cloud.stop()
