"""Volumes: persistent files a workspace's containers share, on a distributed file system (issue 34).

- :mod:`~levers9.volumes.paths`: a volume's files, reached only beneath its root (openat2 RESOLVE_BENEATH);
- :mod:`~levers9.volumes.juicefs`: the JuiceFS file system the volumes live on: format, mount, unmount;
- :mod:`~levers9.volumes.webdav`: a volume's files over WebDAV (the subset rclone mounts), atomic PUTs;
- :mod:`~levers9.volumes.rclone`: rclone mounts on a worker: a volume over WebDAV, a bucket over S3.
"""
