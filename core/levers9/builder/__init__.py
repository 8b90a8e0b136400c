"""The builder: what a build worker does to turn a blueprint into an OCI image.

:mod:`levers9.builder.base` makes the base layer (Debian from the configured
archive, with the Python a blueprint asks for) and keeps it in a cache on the
build machine. Steps run on it in containers and their changes become the
image's other layers. Nothing is pulled from Docker Hub: bases come from the
Debian archive, layers go to levers9's own registry.
"""

from __future__ import annotations
