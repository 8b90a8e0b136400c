"""Metrics a plugin reports through its context: ``ctx.metrics.count(...)`` and ``ctx.metrics.gauge(...)``.

A plugin names a series (``api_calls``) and labels it as it likes; the series
is registered on the replica's own registry as ``levers9_plugin_<name>``
(``_total`` for counters) with the labels ``replica`` and ``plugin`` added, so
two plugins using one name never collide. Prometheus wants one label set per
series: the first call fixes it, and a later call with other label names is
dropped with one warning naming the plugin, the series and both label sets,
instead of raising into the plugin's hook. Names that Prometheus would refuse
are dropped the same way.
"""

from __future__ import annotations

import logging
import re
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge

from levers9.hooks.context import PluginMetrics

__all__ = ["PluginSeries"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class PluginSeries:
    """Every plugin's series on one registry; :meth:`for_plugin` is what ``Hooks.startup`` takes as ``metrics``."""

    def __init__(self, registry: CollectorRegistry, replica: str) -> None:
        self._registry = registry
        self._replica = replica
        self._lock = threading.Lock()  # hooks run on the plugins' own threads
        self._series: dict[str, tuple[Counter | Gauge, tuple[str, ...]]] = {}
        self._warned: set[tuple[str, str]] = set()

    def for_plugin(self, plugin: str) -> PluginMetrics:
        return _Reporter(self, plugin)

    def observe(self, plugin: str, kind: str, name: str, value: float, labels: dict[str, str]) -> None:
        if not _NAME.match(name) or not all(_NAME.match(key) for key in labels):
            self._warn(plugin, name, f"{name!r} or a label name ({', '.join(labels)}) is not a Prometheus name")
            return
        keys = tuple(sorted(labels))
        if {"replica", "plugin"} & set(keys):
            self._warn(plugin, name, "the labels replica and plugin are levers9's own")
            return
        full = f"levers9_plugin_{name}"
        with self._lock:
            found = self._series.get(f"{kind}:{full}")
            if found is None:
                cls = Counter if kind == "counter" else Gauge
                try:
                    metric = cls(
                        full,
                        f"Reported by plugins through their context ({kind}).",
                        ["replica", "plugin", *keys],
                        registry=self._registry,
                    )
                except ValueError as exc:  # the name is taken by another kind of series
                    self._warn(plugin, name, str(exc))
                    return
                found = self._series[f"{kind}:{full}"] = (metric, keys)
        metric, fixed = found
        if keys != fixed:
            self._warn(plugin, name, f"labels {list(keys)}, but the series was first reported with {list(fixed)}")
            return
        child = metric.labels(self._replica, plugin, *(labels[key] for key in keys))
        if isinstance(child, Counter):
            if value >= 0:
                child.inc(value)
            else:
                self._warn(plugin, name, f"a counter only goes up; got {value}")
        else:
            child.set(value)

    def _warn(self, plugin: str, name: str, why: str) -> None:
        if (plugin, name) not in self._warned:
            self._warned.add((plugin, name))
            log.warning("plugin %r: metric %r dropped: %s", plugin, name, why)


class _Reporter:
    def __init__(self, series: PluginSeries, plugin: str) -> None:
        self._series = series
        self._plugin = plugin

    def count(self, name: str, value: float = 1.0, **labels: str) -> None:
        self._series.observe(self._plugin, "counter", name, value, labels)

    def gauge(self, name: str, value: float, **labels: str) -> None:
        self._series.observe(self._plugin, "gauge", name, value, labels)
