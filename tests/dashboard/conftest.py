"""The dashboard's unit tests run on the controlplane tests' real Services and HTTP app (tests/controlplane)."""

from tests.controlplane.conftest import api, services

__all__ = ["api", "services"]
