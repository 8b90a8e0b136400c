"""Container images levers9 builds itself, offline: the worker image (:mod:`levers9.images.worker`).

Nothing here pulls from a registry or downloads a package: an image is a root
filesystem assembled from what is installed on this machine
(:mod:`levers9.images.rootfs`) and loaded with ``docker import``. The Docker
SDK is imported inside the functions that talk to Docker, never here.
"""

from __future__ import annotations
