"""The worker: what runs containers on a machine for the controlplane."""
