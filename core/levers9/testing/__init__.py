"""Test helpers for plugin authors: the provider contract suite and its pytest fixtures.

Usage, in a provider distribution's tests::

    from levers9.testing import ProviderContract

    class TestMyCloud(ProviderContract):
        provider = "mycloud"            # the entry-point name
        pool_settings = {"region": "eu-1", ...}
        failing_pool_settings = {...}   # settings under which provisioning must fail with a typed error

Every test of the suite then runs against the installed plugin, loaded through
the real plugin manager exactly as the controlplane loads it.
"""

from levers9.testing.provider_contract import ProviderContract

__all__ = ["ProviderContract"]
