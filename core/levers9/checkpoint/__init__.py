"""Checkpoints of warm containers: where they are stored, the node's cache of them, and taking and restoring one.

- :mod:`~levers9.checkpoint.record`: the checkpoint record and its status
  (standard library only; the database's store returns them too);
- :mod:`~levers9.checkpoint.storage`: the checkpoint store (a directory or an
  object store named by URL) and its keys;
- :mod:`~levers9.checkpoint.node_cache`: the node cache that keeps images local;
- :mod:`~levers9.checkpoint.publish`: publishing an image with its record,
  fetching one for a restore, and whether a dump would fit;
- :mod:`~levers9.checkpoint.snapshot`: taking a checkpoint of a container once
  its handler has loaded;
- :mod:`~levers9.checkpoint.restore`: starting a container from a checkpoint,
  or cold when none is usable;
- :mod:`~levers9.checkpoint.boot`: a warm container of a checkpointed stub,
  from start to the go signal.
"""
