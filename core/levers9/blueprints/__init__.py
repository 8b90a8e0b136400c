"""Blueprints: what an image is built from, as pure data the SDK, the controlplane and the builder share.

- :mod:`~levers9.blueprints.spec`: the build spec (a base and ordered steps), its canonical JSON and
  validation, and the content keys of its layers;
- :mod:`~levers9.blueprints.dockerfile`: the subset of Dockerfile instructions a blueprint can be read from.

Nothing here does I/O beyond reading the files a Dockerfile names, and nothing imports above ``hooks``.
"""
