"""The checkpoint storage URL an operator writes (``checkpoints.storage_url``), parsed once.

Config validation and the worker's storage both read it through
:func:`parse_storage_url`, so a typo fails when the config is loaded, with the
accepted forms, and the worker never meets a form config let through.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

__all__ = ["ACCEPTED", "S3_OPTIONS", "StorageUrl", "parse_storage_url"]

ACCEPTED = (
    "nothing (the default directory), an absolute path (/var/lib/levers9/checkpoints), "
    "file:///absolute/path, or s3://bucket/prefix?endpoint_url=http://host:port&region=us-east-1"
)
S3_OPTIONS = frozenset({"endpoint_url", "region"})


@dataclass(frozen=True)
class StorageUrl:
    """A directory (``bucket`` None, ``path`` absolute) or an S3 bucket and key prefix (``path``)."""

    path: str
    bucket: str | None = None
    endpoint_url: str | None = None
    region: str | None = None


def parse_storage_url(url: str | None) -> StorageUrl | None:
    """None for the default directory; else the storage ``url`` names.

    :raises ValueError: not an accepted form; the message quotes the URL and lists what is accepted.
    """
    if not url:
        return None
    if url.startswith("/"):
        return StorageUrl(url)
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or parts.query:
            raise ValueError(f"checkpoint storage {url!r}: a file URL needs an absolute path, file:///path")
        return StorageUrl(parts.path)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"checkpoint storage {url!r} names no bucket; expected s3://bucket/prefix")
        options = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
        unknown = sorted(set(options) - S3_OPTIONS)
        if unknown:
            raise ValueError(
                f"checkpoint storage {url!r}: unknown option(s) {', '.join(unknown)}; "
                f"accepted: {', '.join(sorted(S3_OPTIONS))}"
            )
        for option, values in options.items():
            if len(values) != 1 or not values[0]:
                raise ValueError(f"checkpoint storage {url!r}: give {option} exactly once, with a value")
        return StorageUrl(
            parts.path,
            bucket=parts.netloc,
            endpoint_url=options.get("endpoint_url", [None])[0],
            region=options.get("region", [None])[0],
        )
    raise ValueError(f"checkpoint storage {url!r} is not understood; expected {ACCEPTED}")
