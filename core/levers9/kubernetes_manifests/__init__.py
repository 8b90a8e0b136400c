"""levers9 itself on Kubernetes: the manifests ``levers9 kubernetes manifests`` prints, and what they rely on.

* :mod:`~levers9.kubernetes_manifests.options`: what the operator decides
  (:class:`ManifestOptions`), checked with Kubernetes' syntax rules;
* :mod:`~levers9.kubernetes_manifests.permissions`: the API calls of the
  ``local_k8s`` provider, the one list the RBAC rules come from;
* :mod:`~levers9.kubernetes_manifests.pod_config`: the levers9 config file as
  the pods run it, and how the init container completes it from the Secrets;
* :mod:`~levers9.kubernetes_manifests.render`: :func:`render`, the objects;
* :mod:`~levers9.kubernetes_manifests.instructions`: the ``kubectl`` lines to
  run around them.

No Helm, no template language: the objects are Python dicts, dumped as YAML.
Nothing here talks to a cluster or imports the ``kubernetes`` client.
"""

from __future__ import annotations

from levers9.kubernetes_manifests.options import ManifestError, ManifestOptions
from levers9.kubernetes_manifests.render import render, to_yaml

__all__ = ["ManifestError", "ManifestOptions", "render", "to_yaml"]
