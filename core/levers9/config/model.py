"""The operator's config file, as pydantic models.

One file holds everything an operator decides: where state lives, which ports
to listen on, which plugins may load, and the pools. Each model forbids unknown
keys so a typo is an error, not a silently ignored setting. A pool's
``settings`` are validated later by the provider plugin that owns them (see
:mod:`levers9.config.load`), because only the plugin knows its own schema.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from levers9.addresses import is_loopback
from levers9.config.fields import Port
from levers9.config.quantities import format_bytes, parse_bytes, parse_memory_mib
from levers9.config.redis_url import parse as parse_redis_url
from levers9.config.replica_address import ReplicaAddress
from levers9.config.replica_name import ReplicaName
from levers9.config.storage_url import parse_storage_url
from levers9.config.volumes import VolumesConfig
from levers9.hooks.agent_providers import AGENT_PROVIDERS
from levers9.payloads import DEFAULT_MAX_PAYLOAD_BYTES, MAX_CAP_BYTES, MIN_CAP_BYTES
from levers9.quantities import SIZE_PATTERN

POOL_NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")

#: a number, or a string such as 16GiB: what the schema tells editors a size may be
_SIZE_SCHEMA = WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": SIZE_PATTERN}]}
)
MemoryMiB = Annotated[int, BeforeValidator(parse_memory_mib), _SIZE_SCHEMA]
#: a size in bytes, written as a number of bytes or as 512MiB, 1GiB (binary units; see levers9.quantities)
Bytes = Annotated[int, BeforeValidator(parse_bytes), _SIZE_SCHEMA]

#: bounds of ``limits.max_payload_bytes`` (see levers9.payloads)
MIN_PAYLOAD_BYTES = MIN_CAP_BYTES
MAX_PAYLOAD_BYTES = MAX_CAP_BYTES
#: the least ``limits.max_task_log_bytes``: room for a traceback and the marker that says what was dropped
MIN_TASK_LOG_BYTES = 64 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def default_home() -> Path:
    """The user's levers9 directory: ``$LEVERS9_HOME`` or ``~/.levers9``."""
    return Path(os.environ.get("LEVERS9_HOME") or Path.home() / ".levers9").expanduser()


class StateConfig(_Strict):
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL of the database; empty means SQLite in the data directory. "
        "For several controlplane replicas use PostgreSQL: postgresql+psycopg://user@host/levers9",
    )
    redis_url: str | None = Field(
        None,
        description="Redis URL: redis://[USER:PASSWORD@]HOST:6379/DB, rediss://... (TLS, ?ca_file=...), "
        "unix:///path, or redis+sentinel://[USER:PASSWORD@]HOST:26379,HOST2:26379/SERVICE[/DB] (the primary "
        "found and followed through Sentinel; rediss+sentinel:// for TLS); see docs/config.md. "
        "Empty means an embedded one, only for a single controlplane: a private redis-server child in data_dir "
        "when the binary is installed, else an "
        "in-process one (LEVERS9_EMBEDDED_REDIS=memory forces that).",
    )
    secret_key_file: str | None = Field(
        None,
        description="File holding the key that encrypts secrets at rest (one Fernet key per line, the first "
        "encrypts, the rest still decrypt, for rotation). Empty means secret.key in the data directory, "
        "created on first start. LEVERS9_SECRET_KEY (comma-separated keys) overrides both.",
    )
    # read when the file is loaded, into database_url / redis_url (levers9.config.external): None once loaded
    database_url_file: str | None = Field(None, description="File holding database_url, instead of it.")
    redis_url_file: str | None = Field(None, description="File holding redis_url, instead of it.")

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[a-z][a-z0-9+]*://", value):
            raise ValueError(f"{value!r} is not a database URL; expected sqlite:///PATH or postgresql+psycopg://...")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_redis_url(value)  # a RedisUrlError (a ValueError) names the URL, its passwords hidden, and FORMS
        return value


class TlsConfig(_Strict):
    """The controlplane's certificate: every listener (gRPC, HTTP, metrics) serves TLS with it.

    The files are read again when they change, so a renewed certificate needs no restart.
    """

    cert_file: str = Field(description="PEM certificate chain of this replica (leaf first).")
    key_file: str = Field(description="PEM private key of the certificate; readable by the server only.")
    ca_file: str | None = Field(
        None,
        description="PEM CA bundle that signed the certificate, handed to the workers and agents this replica "
        "starts so they can verify it; empty means they use the system trust store.",
    )


class ListenConfig(_Strict):
    host: str = Field("127.0.0.1", description="Address the controlplane binds; 0.0.0.0 for every interface.")
    replica_name: ReplicaName | None = Field(
        None, description="This replica's name, the same across restarts (metrics, logs); empty: the host name."
    )
    grpc_port: Port = Field(1993, description="gRPC: SDK, CLI, workers and agents.")
    http_port: Port = Field(1994, description="HTTP: REST under /api/v1 and the gateway.")
    metrics_port: Port = Field(9090, description="Prometheus metrics.")
    tls: TlsConfig | None = Field(None, description="Serve every listener over TLS with this certificate.")
    plaintext: bool = Field(
        False,
        description="Serve plain text on a non-loopback host without TLS. Tokens then cross the network in "
        "clear: only for a network that is private end to end.",
    )
    advertise: list[str] = Field(
        default_factory=list,
        description="The controlplane addresses workers and agents dial, every replica's or a load balancer's "
        "(grpc://host:port, grpcs://host:port); empty means $LEVERS9_ADVERTISE_URL, else this host.",
    )
    advertise_http: str | None = Field(
        None,
        description="The HTTP listener's address as workers and people reach it (http(s)://host[:port]), where "
        "it is not the first listen.advertise host with listen.http_port (an ingress, a load balancer on 443). "
        "Built images are named by its host: changing it renames them.",
    )
    replica_address: ReplicaAddress | None = Field(
        None,
        description="HOST:PORT the other replicas reach this one's gRPC listener at (to relay gateway requests "
        "through the tunnels it holds); per replica, so usually $LEVERS9_REPLICA_ADDRESS. Empty: listen.host "
        "(the host's name for 0.0.0.0 or ::) with listen.grpc_port.",
    )
    max_connections: int | None = Field(
        None,
        ge=1,
        description="Connections the HTTP listener (REST, the gateway, health) holds at most; at the cap a "
        "connection that has not sent a request head is evicted for a new one, else the new one is refused "
        "(503). Empty: derived from the process's file descriptor limit (docs/config.md).",
    )
    max_connections_per_client: int | None = Field(
        None,
        ge=0,
        description="Of those, from one client address at most (503 beyond); 0 turns this off, for a "
        "controlplane behind a load balancer or proxy (every connection then has its address). Empty: an eighth "
        "of max_connections.",
    )
    grpc_max_connections: int | None = Field(
        None,
        ge=1,
        description="Connections the gRPC listener (workers, agents, SDK and CLI clients) holds at most; one more "
        "is closed at once. Empty: derived from the file descriptor limit like max_connections.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="An HTTP request's head must arrive whole this long after its first byte, and a gRPC "
        "connection finish its handshake; else the connection is closed (HTTP: after a 408).",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="The longest pause in an HTTP request's body; past it, 408 and closed."
    )
    keep_alive_s: float = Field(
        5.0, gt=0, le=3600, description="An HTTP connection idle this long between requests is closed."
    )

    @field_validator("advertise_http")
    @classmethod
    def _http_address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urllib.parse.urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
            raise ValueError(
                f"{value!r} is not an HTTP listener's address; accepted: http(s)://host[:port], "
                "e.g. https://levers9.example.com"
            )
        try:
            parts.port  # noqa: B018 - raises on a port that is not one
        except ValueError as exc:
            raise ValueError(f"{value!r}: {exc}; accepted: http(s)://host[:port], the port 1-65535") from None
        return f"{parts.scheme}://{parts.netloc}"

    @model_validator(mode="after")
    def _distinct(self) -> ListenConfig:
        ports = {"grpc_port": self.grpc_port, "http_port": self.http_port, "metrics_port": self.metrics_port}
        if len(set(ports.values())) != len(ports):
            raise ValueError(f"the listeners need three different ports, got {ports}")
        return self


class PluginsConfig(_Strict):
    allow: list[str] | None = Field(
        None,
        description="Only these plugins load (entry-point names); absent means every installed plugin. "
        "LEVERS9_PLUGINS_ALLOW (comma-separated) replaces it.",
    )
    block: list[str] = Field(
        default_factory=list,
        description="These plugins never load. LEVERS9_PLUGINS_BLOCK adds to it.",
    )
    strict: bool = Field(
        False,
        description="Refuse to start when any plugin fails to load (LEVERS9_PLUGINS_STRICT=1 does the same).",
    )
    hook_timeout_s: float = Field(
        30.0, gt=0, description="Deadline for one plugin hook call, in seconds, counted from when the hook starts."
    )
    provider_threads: int = Field(
        4, ge=1, le=256, description="Threads of each provider plugin; its calls beyond that wait for a free one."
    )
    threads: dict[str, int] = Field(
        default_factory=dict, description="Threads of one plugin, by plugin name, instead of the default."
    )
    unhealthy_after: int = Field(
        3,
        ge=1,
        description="A provider whose hooks time out this many times in a row is unhealthy: its pools "
        "are skipped, one probe call at a time excepted, until it answers again.",
    )
    probe_every_s: float = Field(
        30.0, ge=0, description="How often one call is let through to an unhealthy provider to see if it is back."
    )

    @field_validator("threads")
    @classmethod
    def _threads(cls, value: dict[str, int]) -> dict[str, int]:
        for name, count in value.items():
            if not 1 <= count <= 256:
                raise ValueError(f"plugins.threads.{name} must be 1 to 256, got {count}")
        return value


class SchedulerConfig(_Strict):
    unavailable_ttl_s: float = Field(
        180.0,
        gt=0,
        description="After a provider says it has no capacity or quota for an offer (instance type, region, "
        "zone), that offer is skipped for this long and the pool's next offer, then the next pool, is tried "
        "at once. A pool without offers, or one whose provider refused for another reason (credentials, "
        "permissions), is skipped whole for this long.",
    )
    max_wait_s: float = Field(
        900.0,
        gt=0,
        description="A request that could be placed nowhere for this long fails, listing every pool and GPU "
        "type tried and why each failed.",
    )
    retry_initial_s: float = Field(1.0, gt=0, description="First wait before asking providers again.")
    retry_max_s: float = Field(60.0, gt=0, description="Waits between retries double up to this.")
    worker_keepalive_s: float = Field(
        30.0, gt=0, description="A worker that has not been heard from for this long is dead; its work is requeued."
    )
    register_timeout_s: float = Field(
        600.0,
        gt=0,
        description="A machine whose worker has not registered this long after it was provisioned is "
        "terminated and its record removed.",
    )
    provision_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Deadline for one provider call that starts a machine; past it the next choice is tried.",
    )
    reconcile_interval_s: float = Field(
        60.0, gt=0, description="How often each pool's machines are compared with the provider's own listing."
    )
    batch_size: int = Field(256, ge=1, le=10_000, description="Requests placed per round trip to Redis.")
    worker_queue: int = Field(
        256,
        ge=0,
        le=1024,
        description="Calls a worker may hold waiting in its own queue beyond what it runs at once, so the next "
        "starts the moment one ends. Only CPU-only calls wait there, only when no worker has room, and only "
        "when expected to start within queue_wait_s; 0 turns queueing off.",
    )
    queue_wait_s: float = Field(
        1.0,
        ge=0,
        description="A call waits in a worker's queue only when it is expected to start there within this long: "
        "its function's measured mean duration times the calls ahead of it, shared among the calls the worker "
        "runs at once. A function whose mean call is longer than this (or not measured yet) is never queued, and "
        "no queue forms on a worker running one of its calls.",
    )
    offers_ttl_s: float = Field(
        60.0,
        gt=0,
        description="How long a pool's offers (instance types, zones, prices) are used before the provider is "
        "asked again; they are refreshed in the background, and a failed refresh keeps the last answer.",
    )
    pool_order: Literal["price", "config"] = Field(
        "price",
        description="Which of several pools of equal priority that can take a call gets a new machine first: "
        "price starts the one whose cheapest offer costs least per GPU-hour (per hour for a CPU pool; pools "
        "without a known price last, in config order); config keeps the order of the pools in this file. "
        "A pool's priority ranks it above price either way.",
    )
    worker_image: str | None = Field(
        None,
        description="The worker image machines that run containers boot (ghcr.io/levers9/worker:0.1.0); empty "
        "means they install this controlplane's levers9 version with pip.",
    )

    @model_validator(mode="after")
    def _backoff(self) -> SchedulerConfig:
        if self.retry_initial_s > self.retry_max_s:
            raise ValueError(f"retry_initial_s ({self.retry_initial_s}) is above retry_max_s ({self.retry_max_s})")
        return self


class CheckpointsConfig(_Strict):
    storage_url: str | None = Field(
        None,
        description="Where checkpoint images are kept for every node to restore from: a directory "
        "(/var/lib/levers9/checkpoints or file:///...), or s3://bucket/prefix (?endpoint_url=...&region=...). "
        "Empty means checkpoints/ in the data directory, which only this machine can read.",
    )
    cache_dir: str | None = Field(
        None,
        description="Each node's local copies; empty means checkpoint-cache/ beside each worker's state directory.",
    )
    cache_max: MemoryMiB = Field(
        20480, description="How much the node cache may hold before the least recently used images go (MiB or 20GiB)."
    )

    @field_validator("storage_url")
    @classmethod
    def _storage(cls, value: str | None) -> str | None:
        if value:
            parse_storage_url(value)  # raises with the accepted forms
        return value


class LimitsConfig(_Strict):
    max_payload_bytes: Bytes = Field(
        DEFAULT_MAX_PAYLOAD_BYTES,
        description="The largest argument or result payload of one call, in bytes or as 512MiB, 1GiB (binary "
        "units: 1GB = 1GiB); from 1MiB to 8GiB. A larger one is refused, saying this limit.",
    )
    max_task_log_bytes: Bytes = Field(
        8 * 1024 * 1024,
        description="Output (stdout and stderr) kept per task, in bytes or as 256KiB, 8MiB; at least 64KiB. "
        "The first part is kept, then one line saying how many bytes were dropped.",
    )

    @field_validator("max_payload_bytes")
    @classmethod
    def _payload(cls, value: int) -> int:
        if not MIN_PAYLOAD_BYTES <= value <= MAX_PAYLOAD_BYTES:
            raise ValueError(
                f"{format_bytes(value)} is out of range; it must be from {format_bytes(MIN_PAYLOAD_BYTES)} "
                f"to {format_bytes(MAX_PAYLOAD_BYTES)}"
            )
        return value

    @field_validator("max_task_log_bytes")
    @classmethod
    def _task_log(cls, value: int) -> int:
        if value < MIN_TASK_LOG_BYTES:
            raise ValueError(
                f"{format_bytes(value)} is too small; it must be at least {format_bytes(MIN_TASK_LOG_BYTES)}"
            )
        return value


def _gpu_type(value: object) -> object:
    if value is None or not isinstance(value, str):
        return value
    from levers9.gpu.catalog import UnknownGpuType, canonical

    try:
        return canonical(value)
    except UnknownGpuType as exc:
        raise ValueError(str(exc)) from None


class PoolConfig(_Strict):
    provider: str = Field(description="The provider plugin that supplies this pool's workers (entry-point name).")
    runtime: str = Field("runc", description="The container runtime plugin workers use (runc, gvisor, process...).")
    gpu: Annotated[str | None, BeforeValidator(_gpu_type)] = Field(
        None, description="Canonical GPU type of every worker (see `levers9 gpu normalize`); empty for CPU."
    )
    gpu_count: int | None = Field(None, description="GPUs per worker machine: 1, 2, 4 or 8 (default 1 with a GPU).")
    cpu: float = Field(1.0, gt=0, description="CPU cores per worker.")
    memory: MemoryMiB = Field(2048, description="Memory per worker, in MiB or as 16GiB.")
    min_workers: int = Field(0, ge=0, description="Workers kept running even with no work.")
    max_workers: int = Field(10, ge=0, description="Never more workers than this.")
    priority: int = Field(0, description="Among pools offering the same GPU type, higher is tried first.")
    region: str | None = Field(
        None,
        description="The provider region the pool's machines start in, where the provider has regions; "
        "the same as regions: [REGION]. Set this or regions, not both.",
    )
    regions: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="Every region the pool may start machines in, in preference order: the planner asks the "
        "provider for offers in each and starts the first one free. Set this or region, not both.",
    )
    strategy: Literal["preference", "cheapest"] = Field(
        "preference",
        description="How the pool's offers are tried: preference keeps the provider's order (region order "
        "first); cheapest tries the lowest price per hour first, offers without a price last.",
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels work can select this pool by.")
    preemptible: bool = Field(False, description="Workers may be reclaimed (spot); work is retried elsewhere.")
    idle_timeout_s: float = Field(300.0, ge=0, description="An idle worker above min_workers is released after this.")
    cpu_work: bool = Field(
        False,
        description="Let CPU-only work run on this GPU pool's workers. Off by default so GPU machines stay "
        "free for the work that needs them.",
    )
    fallback: Any = Field(
        None,
        description="Not supported: where work may go is the request's choice (gpu=[...], fallback=['cpu']).",
        json_schema_extra={"deprecated": True},
    )
    settings: dict[str, Any] = Field(
        default_factory=dict, description="Provider settings, validated by the provider plugin's own schema."
    )
    runtime_settings: dict[str, Any] = Field(
        default_factory=dict, description="Runtime settings, validated by the runtime plugin's own schema."
    )
    builds: bool = Field(
        False,
        description="The pool's workers build blueprint images (in containers of its runtime: runc or gvisor). "
        "Builds go only to such pools; a pool may also take calls as usual.",
    )
    volume_access: Literal["direct", "controlplane"] | None = Field(
        None,
        description="How its workers reach volumes: 'direct' (they mount the volumes' file system, holding its "
        "credentials: machines the operator trusts that reach its metadata and object store) or 'controlplane' "
        "(each volume over the controlplane's WebDAV, with a token for it alone). Default: direct for the local "
        "provider, controlplane for every other; agent machines and attached clusters are never direct.",
    )
    sandboxes: int = Field(
        0,
        ge=0,
        le=1000,
        description="The most sandboxes (levers9.Sandbox) one worker of the pool runs at once; 0: none. Its "
        "workers then keep a tunnel open to the controlplane, which reaches their sandboxes through it. The pool's "
        "runtime must give containers their own filesystem: gvisor (the default for a pool with sandboxes, whose "
        "code nobody checked) or runc.",
    )
    sandboxes_warm: int = Field(
        0,
        ge=0,
        le=1000,
        description="Sandboxes each worker of the pool keeps started, their runner up and nothing run in them, for "
        "the next creates of the shape last asked there (image, Python, cpu, memory; no GPU, ports, volumes, "
        "network rules or snapshots): such a create takes one instead of starting a container. At most sandboxes; "
        "0: every create starts its own. Each holds an idle container's memory on its worker.",
    )
    workspace: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="Only this workspace's calls run on the pool (its name; made if new). Required of a pool whose "
        "runtime isolates nothing (process): calls sharing one could read each other's files and processes.",
    )

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            if not _LABEL_KEY.match(key):
                raise ValueError(
                    f"label key {key!r} is not valid; use letters, digits, '-', '_', '.' "
                    "with an optional DNS prefix (example.com/gpu-class)"
                )
        return labels

    @field_validator("fallback")
    @classmethod
    def _no_pool_fallback(cls, value: Any) -> None:
        if value is not None:
            raise ValueError(
                "pools take no fallback: sending work to hardware its author did not list would break the "
                "request's contract. List the alternatives in the request instead: "
                "gpu=['H100', 'L40S', 'cpu'] (or fallback=['cpu'], fallback_after=120)"
            )
        return None

    @model_validator(mode="after")
    def _counts(self) -> PoolConfig:
        if self.gpu is None:
            if self.gpu_count not in (None, 0):
                raise ValueError(f"gpu_count is {self.gpu_count} but the pool has no gpu type; set gpu: or drop it")
            self.gpu_count = 0
            if self.cpu_work:
                raise ValueError("cpu_work only applies to a GPU pool; a CPU pool always takes CPU work")
        else:
            if self.gpu_count is None:
                self.gpu_count = 1
            if self.gpu_count not in (1, 2, 4, 8):
                raise ValueError(
                    f"gpu_count must be 1, 2, 4 or 8 (the machine sizes providers sell), got {self.gpu_count}"
                )
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) is above max_workers ({self.max_workers})")
        if self.region is not None and self.regions:
            raise ValueError(
                f"region ({self.region!r}) and regions ({self.regions}) are both set; keep one: "
                f"region: X is the same as regions: [X]"
            )
        if self.volume_access == "direct" and self.provider in AGENT_PROVIDERS:
            raise ValueError(
                f"volume_access: direct would give the volumes' file system's credentials (every workspace's "
                f"volumes) to a {self.provider} machine, which another party runs; use controlplane (the default)"
            )
        if self.sandboxes and "runtime" not in self.model_fields_set:
            self.runtime = "gvisor"  # sandboxes run code nobody checked: gVisor unless the operator chose otherwise
        if self.sandboxes_warm > self.sandboxes:
            raise ValueError(
                f"sandboxes_warm is {self.sandboxes_warm}, above sandboxes ({self.sandboxes}): keep at most as many "
                "warm as a worker runs (sandboxes: 0 turns sandboxes off)"
            )
        if self.sandboxes and self.runtime == "process":
            raise ValueError(
                "sandboxes need a runtime that gives each container its own filesystem (runc, gvisor); the process "
                "runtime runs them on the worker's own files: set runtime: gvisor, or sandboxes: 0"
            )
        if len(set(self.regions)) != len(self.regions):
            repeated = sorted({r for r in self.regions if self.regions.count(r) > 1})
            raise ValueError(f"regions lists {', '.join(repeated)} more than once; list each region once")
        return self

    @property
    def region_list(self) -> list[str]:
        """The pool's regions in preference order, whichever of ``region`` and ``regions`` was set."""
        if self.regions:
            return list(self.regions)
        return [] if self.region is None else [self.region]


class RegistryConfig(_Strict):
    """Where built images are stored: an OCI registry (CNCF distribution, or any that speaks its API)."""

    url: str | None = Field(
        None,
        description="Base URL of an OCI registry (https://registry.example.com, http://10.0.0.5:5000); empty "
        "means an embedded one, only for a single controlplane: Debian's docker-registry as a child process on "
        "127.0.0.1 with its storage in data_dir/registry.",
    )
    username: str | None = Field(None, description="User name for the registry's basic or token authentication.")
    password_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The environment variable holding the registry password (never the password itself).",
    )
    repository_prefix: str = Field(
        "levers9",
        pattern=r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$",
        description="Images go to PREFIX/<workspace id>/blueprints in the registry.",
    )
    tls_verify: bool | str = Field(
        True, description="Check the registry's TLS certificate: true, false, or the path of a CA bundle."
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+/?$", value):
            raise ValueError(
                f"{value!r} is not a registry URL; expected http(s)://HOST[:PORT], with no path "
                "(images are named under repository_prefix)"
            )
        return value.rstrip("/") if value is not None else None


class ImagesConfig(_Strict):
    """Which images stubs may name besides ``host``, blueprints and registry images pinned by digest."""

    local_dirs: list[Annotated[str, Field(pattern=r"^/")]] = Field(
        default_factory=list,
        description="Directories on the workers whose files and subdirectories stubs may name as images "
        "(docker save tarballs, OCI layouts, root filesystems). Empty: no path on a worker may be named; "
        "a path elsewhere is refused (image='/' would make a worker's own root filesystem the container's).",
    )


def _web_address(value: str, what: str) -> str:
    """``value`` as an http(s) base URL (no query or fragment); plain http only on a loopback host."""
    parts = urllib.parse.urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"{value!r} is not {what}; accepted: https://host[:port][/path]")
    try:
        parts.port  # noqa: B018 - raises on a port that is not one
    except ValueError as exc:
        raise ValueError(f"{value!r}: {exc}; accepted: https://host[:port][/path], the port 1-65535") from None
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError(
            f"{value!r} is plain http on a host other than loopback: sign-in would carry codes and cookies in "
            "clear; use https://"
        )
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


class OidcConfig(_Strict):
    """An OpenID Connect issuer people sign in to the dashboard with (any standard one: its discovery document at
    ISSUER/.well-known/openid-configuration says the rest)."""

    issuer: str = Field(
        description="The issuer's URL, exactly as its ID tokens' iss claim names it (https://accounts.example.com)."
    )
    client_id: str = Field(min_length=1, max_length=512, description="The client id registered with the issuer.")
    client_secret: str | None = Field(
        None,
        repr=False,
        description="The client's secret (none: a public client, PKCE only); ${NAME} is replaced by the "
        "environment variable NAME.",
    )
    # read when the file is loaded, into client_secret (levers9.config.external): None once loaded
    client_secret_file: str | None = Field(None, description="File holding client_secret, instead of it.")
    scopes: str = Field(
        "openid email profile", description="Scopes asked for, space-separated; must include openid and email."
    )
    name: str = Field(
        "", max_length=64, description="What the sign-in button says (Sign in with NAME); empty: the issuer's host."
    )

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str) -> str:
        return _web_address(value, "an OpenID Connect issuer URL")

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, value: str) -> str:
        scopes = value.split()
        missing = [s for s in ("openid", "email") if s not in scopes]
        if missing:
            raise ValueError(
                f"{value!r} lacks {' and '.join(missing)}: sign-in needs an ID token (openid) with the "
                "person's email (email)"
            )
        return " ".join(scopes)

    @property
    def display_name(self) -> str:
        return self.name or (urllib.parse.urlsplit(self.issuer).hostname or self.issuer)


class AuthConfig(_Strict):
    """How people sign in to the dashboard: one-time links (always) and an OpenID Connect issuer (optional)."""

    public_url: str | None = Field(
        None,
        description="The dashboard's address as browsers reach it (https://levers9.example.com), for redirect "
        "URIs and sign-in links; empty: the address each request came to.",
    )
    oidc: OidcConfig | None = Field(None, description="An OpenID Connect issuer to sign in with; none: links only.")
    link_ttl_s: float = Field(
        900, gt=0, le=7 * 86_400, description="How long a one-time sign-in link works, in seconds (at most 7 days)."
    )

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        return None if value is None or not value.strip() else _web_address(value, "the dashboard's address")


class Config(_Strict):
    version: Literal[1] = Field(1, description="Config format version.")
    data_dir: str = Field(
        default_factory=lambda: str(default_home() / "data"),
        description="Where the embedded database, logs and checkpoints live.",
    )
    state: StateConfig = Field(default_factory=StateConfig)
    listen: ListenConfig = Field(default_factory=ListenConfig)
    plugins: PluginsConfig = Field(default_factory=PluginsConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    checkpoints: CheckpointsConfig = Field(default_factory=CheckpointsConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    pools: dict[Annotated[str, Field(pattern=POOL_NAME)], PoolConfig] = Field(
        default_factory=dict, description="Pools by name (lowercase letters, digits and '-')."
    )
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    images: ImagesConfig = Field(default_factory=ImagesConfig)
    volumes: VolumesConfig = Field(default_factory=VolumesConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig, description="How people sign in to the dashboard.")

    @property
    def database_url(self) -> str:
        return self.state.database_url or f"sqlite:///{Path(self.data_dir).expanduser() / 'levers9.db'}"
