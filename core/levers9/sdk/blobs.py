"""The SDK's side of moving big payloads in chunks; the helpers live in :mod:`levers9.proto.blobs`.

They are protocol helpers that the worker uses too (and the worker must not
import the SDK), so they live with the wire protocol; this module keeps the
SDK's name for them.
"""

from __future__ import annotations

from levers9.proto.blobs import Metadata, download, upload

__all__ = ["Metadata", "download", "upload"]
