"""`<component>_build_info`: which build of nodefabric each process runs, as a Prometheus gauge of 1.

Every component (the agent, the operator, the extender) registers one on its own registry, named after
its metric prefix, with the same labels, so one query finds a fleet running mixed versions during an
upgrade: `count by (version) (nodefabric_operator_build_info)`. A leaf: it imports nothing of ours, so
the node side and the cluster side may both use it under the layer contracts.
"""

from __future__ import annotations

import importlib.metadata
import platform

from prometheus_client import CollectorRegistry, Gauge


def version() -> str:
    """The installed package's version; "unknown" when run from a source tree never installed."""
    try:
        return importlib.metadata.version("nodefabric")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def register(registry: CollectorRegistry, prefix: str) -> Gauge:
    """`<prefix>_build_info{version, python_version} 1` on `registry`."""
    gauge = Gauge(
        f"{prefix}_build_info",
        "The nodefabric build this process runs (always 1): the package version and the Python version",
        ["version", "python_version"],
        registry=registry,
    )
    gauge.labels(version=version(), python_version=platform.python_version()).set(1)
    return gauge
