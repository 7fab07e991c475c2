"""`nodefabric_build_info{component,version,python_version} 1`: which build each component runs, the
Prometheus convention for joining a version onto any other series (`* on(instance) group_left(version)`).

One module every component imports (the agent, the device plugin, the DRA driver, the operator, the
extender): it depends on nothing of ours, so no layer contract is crossed.
"""

from __future__ import annotations

import importlib.metadata
import platform
import threading
import weakref

from prometheus_client import REGISTRY, CollectorRegistry, Gauge

NAME = "nodefabric_build_info"
_gauges: weakref.WeakKeyDictionary[CollectorRegistry, Gauge] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def version() -> str:
    """The installed distribution's version ("unknown" when run from sources that were not installed)."""
    try:
        return importlib.metadata.version("nodefabric")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def register(component: str, registry: CollectorRegistry = REGISTRY) -> None:
    """Set the component's series to 1 on `registry`. Components sharing one process and registry (the
    agent with its in-process device plugin and DRA driver) share one metric, one series each; calling it
    again is a no-op."""
    with _lock:
        gauge = _gauges.get(registry)
        if gauge is None:
            gauge = Gauge(
                NAME,
                "Which nodefabric build this component runs; always 1.",
                ["component", "version", "python_version"],
                registry=registry,
            )
            _gauges[registry] = gauge
    gauge.labels(component, version(), platform.python_version()).set(1)
