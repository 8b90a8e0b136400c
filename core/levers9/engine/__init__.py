"""Running containers: images, root filesystems, OCI bundles, networks and the per-container shim."""
