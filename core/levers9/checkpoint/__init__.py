"""Checkpoints of warm containers: where they are stored, the node's cache of them, and taking and restoring one.

- :mod:`~levers9.checkpoint.storage`: the checkpoint store (a directory or an
  object store named by URL), the node cache that keeps images local, and
  publishing an image with its record;
- :mod:`~levers9.checkpoint.snapshot`: taking a checkpoint of a container once
  its handler has loaded;
- :mod:`~levers9.checkpoint.restore`: starting a container from a checkpoint,
  or cold when none is usable.
"""
