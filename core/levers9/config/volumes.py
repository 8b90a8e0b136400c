"""The ``volumes:`` section of the config: where the file system that holds every volume keeps its data.

Volumes live on one JuiceFS file system per deployment (:mod:`levers9.volumes.juicefs`): its metadata in
a database (``metadata_url``) and its data in object storage (``storage`` and ``bucket``). With nothing
set, the metadata is an SQLite file and the data a directory, both in the data directory: right for
``levers9 up`` and a single controlplane whose workers run on its host. A deployment whose workers run
elsewhere names a metadata engine and an object store every replica and every direct-mounting worker can
reach (PostgreSQL or Redis; S3 or any store that speaks its API).

Credentials are never written here: ``metadata_password_env``, ``access_key_env`` and ``secret_key_env``
name environment variables of the controlplane that hold them.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["METADATA_SCHEMES", "VolumesConfig"]

#: the JuiceFS metadata engines levers9 supports, by URL scheme
METADATA_SCHEMES = ("sqlite3", "redis", "rediss", "unix", "postgres")
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class VolumesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metadata_url: str | None = Field(
        None,
        description="The JuiceFS metadata engine of the volumes' file system: postgres://USER@HOST:5432/DB, "
        "redis://HOST:6379/DB (with persistence: the metadata is the file system) or sqlite3:///PATH. Empty "
        "means sqlite3 in data_dir/volumes/meta.db, for a single controlplane whose workers share its host.",
    )
    metadata_password_env: str | None = Field(
        None,
        pattern=_ENV_NAME,
        description="The environment variable holding the metadata engine's password (kept out of the URL, so "
        "out of every process list).",
    )
    storage: Literal["file", "s3"] = Field(
        "file", description="Where file contents go: 'file' (a directory) or 's3' (S3 or an S3-compatible store)."
    )
    bucket: str | None = Field(
        None,
        description="storage file: a directory (default data_dir/volumes/data); storage s3: the bucket's URL, "
        "https://BUCKET.s3.REGION.amazonaws.com or http(s)://HOST:PORT/BUCKET for another store.",
    )
    access_key_env: str | None = Field(
        None, pattern=_ENV_NAME, description="storage s3: the environment variable holding the access key id."
    )
    secret_key_env: str | None = Field(
        None, pattern=_ENV_NAME, description="storage s3: the environment variable holding the secret access key."
    )
    name: str = Field(
        "levers9-volumes",
        pattern=r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$",
        description="The file system's name: the prefix of every object it stores in the bucket.",
    )

    @field_validator("metadata_url")
    @classmethod
    def _metadata_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in METADATA_SCHEMES:
            raise ValueError(
                f"{value!r} is not a metadata URL levers9 supports; expected one of "
                + ", ".join(f"{s}://" for s in METADATA_SCHEMES)
            )
        if re.match(r"^[a-z0-9]+://[^/@]*:[^/@]+@", value):
            raise ValueError(
                "metadata_url holds a password; name the environment variable that holds it in "
                "metadata_password_env instead (a URL is seen in process lists)"
            )
        return value

    @model_validator(mode="after")
    def _storage(self) -> VolumesConfig:
        if self.storage == "s3":
            if not self.bucket or not re.match(r"^https?://[^/\s]+", self.bucket):
                raise ValueError(
                    f"storage s3 needs bucket: the bucket's URL (https://BUCKET.s3.REGION.amazonaws.com or "
                    f"http(s)://HOST:PORT/BUCKET), got {self.bucket!r}"
                )
            if (self.access_key_env is None) != (self.secret_key_env is None):
                raise ValueError("access_key_env and secret_key_env go together; set both, or neither (IAM role)")
        elif self.bucket is not None and not self.bucket.startswith("/"):
            raise ValueError(f"storage file needs bucket to be an absolute directory path, got {self.bucket!r}")
        return self
