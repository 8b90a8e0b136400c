"""Blueprints: what an image is built from, as pure data the SDK, the controlplane and the builder share.

- :mod:`~levers9.blueprints.spec`: the build spec (a base and ordered steps), its canonical JSON and
  validation, and the content keys of its layers;
- :mod:`~levers9.blueprints.context`: the local files a copy step adds, as a deterministic tar and its digest;
- :mod:`~levers9.blueprints.dockerfile`: the subset of Dockerfile instructions a blueprint can be read from.

``spec`` does no I/O; ``context`` and ``dockerfile`` read only the local files they are pointed at.
Nothing here imports above ``hooks``.
"""
