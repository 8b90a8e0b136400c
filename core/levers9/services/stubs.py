"""What a stub is: the settings a function, job, queue, endpoint or box is defined with, validated once.

A stub never changes once stored (changed code or settings make a new one), so
its parsed :class:`StubSettings` can be cached by id for as long as a process
lives. Every invalid setting is an :class:`InvalidStub` naming the field and
what it accepts.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from levers9 import stub_bounds as bounds
from levers9.blueprints.order import BUILD_KIND
from levers9.gpu.preference import GpuRequest, parse_gpu

__all__ = [
    "BUILD_KIND",
    "CALLED_KINDS",
    "KINDS",
    "USER_KINDS",
    "BucketSetting",
    "InvalidStub",
    "StubSettings",
    "VolumeSetting",
]

#: the kinds users define
USER_KINDS = ("function", "job", "endpoint", "queue", "box")
KINDS = (*USER_KINDS, BUILD_KIND)
#: kinds whose calls are sent one by one to a worker (SDK calls, queue items, job runs, builds)
CALLED_KINDS = ("function", "job", "queue", BUILD_KIND)


class InvalidStub(ValueError):
    """A stub definition that can never run; the message names the field and what is accepted."""


#: directories a volume may not be mounted on or over: the container needs them as its image made them
_SYSTEM_DIRS = ("proc", "sys", "dev", "opt", "etc", "usr", "bin", "sbin", "lib", "lib64", "run", "boot")


class BucketSetting(BaseModel):
    """A cloud bucket's settings: ``access_key`` and ``secret_key`` name workspace secrets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    read_only: bool = False
    force_path_style: bool = False
    access_key: str = ""
    secret_key: str = ""
    endpoint: str = Field("", pattern=r"^(https?://[^/\s]+.*)?$")
    region: str = Field("", max_length=64)


class VolumeSetting(BaseModel):
    """A volume or cloud bucket a stub's containers mount; a volume's id is resolved when the stub is defined."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=63)
    mount_path: str
    volume_id: str = ""
    bucket: BucketSetting | None = None

    @field_validator("mount_path")
    @classmethod
    def _mount_path(cls, value: str) -> str:
        parts = [p for p in value.split("/") if p not in ("", ".")]
        if not value.startswith("/") or ".." in parts or not parts or parts[0] in _SYSTEM_DIRS:
            raise ValueError(
                f"{value!r} is not a path a volume can be mounted at: an absolute path below a directory of its "
                f"own (/data/weights, /mnt/weights), not / or below /{', /'.join(_SYSTEM_DIRS)}"
            )
        return "/" + "/".join(parts)


class StubSettings(BaseModel):
    """A stub's configuration as stored in SQL; validated once, when the stub is defined."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "function"
    app: str = "default"
    name: str = Field(min_length=bounds.NAME_LENGTH_MIN, max_length=bounds.NAME_LENGTH_MAX)
    image: str = "host"
    cpu_millicores: int = Field(125, ge=bounds.CPU_MILLICORES_MIN, le=bounds.CPU_MILLICORES_MAX)
    memory_mib: int = Field(128, ge=bounds.MEMORY_MIB_MIN, le=bounds.MEMORY_MIB_MAX)
    gpu: tuple[str, ...] = ()
    gpu_count: int = Field(0, ge=0)
    fallback_after_s: float | None = Field(None, ge=0)
    retries: int = Field(0, ge=bounds.RETRIES_MIN, le=bounds.RETRIES_MAX)
    timeout_s: float = Field(0.0, ge=0)
    secrets: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    keep_warm_s: float = Field(60.0, ge=bounds.KEEP_WARM_S_MIN, le=bounds.KEEP_WARM_S_MAX)
    #: checkpoint the first container once its start-up is done; later ones restore from it
    checkpoint_enabled: bool = False
    python_version: str = ""
    #: sha256 of the handler, so changed code makes a new stub
    handler_sha256: str = ""
    #: endpoints and boxes: containers kept however idle; None: 0 for an endpoint, 1 for a box
    min_containers: int | None = Field(None, ge=bounds.MIN_CONTAINERS_MIN, le=bounds.MIN_CONTAINERS_MAX)
    max_containers: int = Field(4, ge=bounds.MAX_CONTAINERS_MIN, le=bounds.MAX_CONTAINERS_MAX)
    tasks_per_container: int = Field(1, ge=bounds.TASKS_PER_CONTAINER_MIN, le=bounds.TASKS_PER_CONTAINER_MAX)
    public: bool = False
    interface: str = Field("function", pattern="^(function|asgi)$")
    ports: tuple[int, ...] = ()
    max_pending: int = Field(1000, ge=bounds.MAX_PENDING_MIN, le=bounds.MAX_PENDING_MAX)
    start_timeout_s: float = Field(120.0, gt=bounds.START_TIMEOUT_S_ABOVE, le=bounds.START_TIMEOUT_S_MAX)
    #: volumes and cloud buckets the containers mount
    volumes: tuple[VolumeSetting, ...] = ()

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [p for p in value if not 1 <= p <= 65535]
        if bad:
            raise ValueError(f"ports must be TCP ports from 1 to 65535, got {bad}")
        return value

    @model_validator(mode="after")
    def _serving(self) -> StubSettings:
        if self.kind == "box" and not self.ports:
            raise ValueError("a box needs ports=[...]: the ports its server listens on, which the gateway proxies")
        if self.min_containers is not None and self.min_containers > self.max_containers:
            raise ValueError(f"min_containers ({self.min_containers}) is above max_containers ({self.max_containers})")
        if self.public and self.kind != "endpoint":
            raise ValueError(f"public: only endpoints can be public, not a {self.kind}")
        paths = [v.mount_path for v in self.volumes]
        for i, path in enumerate(paths):
            for other in paths[:i]:
                if path == other or path.startswith(other + "/") or other.startswith(path + "/"):
                    raise ValueError(f"volumes: two volumes mount at or below {min(path, other, key=len)}")
        if self.checkpoint_enabled and self.kind in ("endpoint", "box"):
            raise ValueError(
                f"checkpoint: {'an endpoint' if self.kind == 'endpoint' else 'a box'} cannot be checkpointed yet "
                "(a checkpointed container starts without "
                "a network, and the gateway reaches it over one); checkpoint a function instead"
            )
        return self

    @property
    def floor(self) -> int:
        """Containers kept running however idle: a box runs while deployed, an endpoint scales to zero."""
        if self.min_containers is not None:
            return self.min_containers
        return 1 if self.kind == "box" else 0

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {value!r}")
        return value

    def gpu_request(self) -> GpuRequest:
        """The placement GPU preference; raises InvalidStub naming the field on a bad GPU spec."""
        try:
            return parse_gpu(
                list(self.gpu) or None,
                self.gpu_count or None,
                fallback_after=self.fallback_after_s,
            )
        except (ValueError, TypeError) as exc:
            raise InvalidStub(f"gpu: {exc}") from None
