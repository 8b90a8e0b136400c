"""Checkpoints of warm containers: where they are stored, the node's cache of them, and taking and restoring one.

- :mod:`~levers9.checkpoint.record`: a checkpoint's record (standard library only; SQL stores it);
- :mod:`~levers9.checkpoint.storage`: the checkpoint store, a directory or an S3 bucket named by URL;
- :mod:`~levers9.checkpoint.node_cache`: each node's local copies, least recently used out first;
- :mod:`~levers9.checkpoint.publish`: publishing an image with its record, and fetching one for a start;
- :mod:`~levers9.checkpoint.boot`: starting a container from its stub's checkpoint, or cold and then
  taking one;
- :mod:`~levers9.checkpoint.snapshot`: taking a checkpoint once the handler has loaded;
- :mod:`~levers9.checkpoint.restore`: restoring into a prepared container, cold when none is usable.

The worker uses this package; it reads a runtime's cgroup location from its
capabilities, never from the OCI engine.
"""
