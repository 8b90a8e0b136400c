"""The ``oci`` provider: each worker is an Oracle Cloud Infrastructure compute instance.

OCI sells GPU machines as shapes (``BM.GPU.H100.8``, ``VM.GPU.A10.1``...) per
availability domain, launched into a compartment and subnet from an image. The
plugin lists shapes for offers (one per shape and domain, availability from a
compute capacity report), launches with LaunchInstance carrying levers9's
freeform tags and a cloud-init user_data that starts the worker, and turns
"Out of host capacity" into InsufficientCapacity so the scheduler moves on.

The settings are the identifiers an OCI operator must supply (compartment,
subnet, image OCIDs, availability domains; the region is the pool's own
``region``, never a setting) and how to authenticate, which is always the OCI
SDK's own mechanism: a config file and profile pointing at the signing key, a
session's security token, or instance/resource principals.

The plugin is one object, :data:`plugin`, an
:class:`~levers9_oci.provider.OciProvider` whose ``levers9_*`` methods are
the hooks (what each does is said there, how errors map in
:mod:`levers9_oci.errors`, how clients are made and shared between threads
in :mod:`levers9_oci.clients`). The ``oci`` SDK is
never imported at module level: loading the plugin (``levers9`` starting)
does not import it; the first hook that calls OCI does. Importing the SDK
makes urllib3 warn that SOCKS proxies need PySocks (the SDK's vendored
requests probes for it); levers9 uses no SOCKS proxy, so that one warning is
silenced here rather than printed under every ``levers9 check``.
"""

from __future__ import annotations

import warnings

from levers9_oci.provider import OciProvider
from levers9_oci.settings import OciSettings, ShapeConfig

warnings.filterwarnings("ignore", message="SOCKS support in urllib3 requires")

__all__ = ["OciProvider", "OciSettings", "ShapeConfig", "plugin"]

#: the plugin the entry point names: its hooks, the SDK clients (per thread, settings and region), the context
plugin = OciProvider()
