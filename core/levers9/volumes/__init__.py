"""Volumes: persistent files a workspace's containers share, on a distributed file system (issue 34).

- :mod:`~levers9.volumes.paths`: a volume's files, reached only beneath its root (openat2 RESOLVE_BENEATH);
- :mod:`~levers9.volumes.juicefs`: the JuiceFS file system the volumes live on: format, mount, unmount.
"""
