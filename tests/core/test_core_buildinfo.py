"""`nodefabric_build_info` on every component's registry: one series per component, always 1."""

from __future__ import annotations

import importlib.metadata
import platform

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from nodefabric_devicemanager import buildinfo
from nodefabric_operator.metrics import Metrics


def sample(registry: CollectorRegistry, component: str) -> float | None:
    labels = {
        "component": component,
        "version": importlib.metadata.version("nodefabric"),
        "python_version": platform.python_version(),
    }
    return registry.get_sample_value("nodefabric_build_info", labels)


def test_the_operator_registry_carries_its_build():
    metrics = Metrics()
    assert sample(metrics.registry, "operator") == 1
    assert sample(Metrics().registry, "operator") == 1, "a second registry gets its own series"


def test_the_extender_registry_carries_its_build():
    from nodefabric_operator.extender.book import Book
    from nodefabric_operator.extender.service import Metrics as ExtenderMetrics

    registry = CollectorRegistry()
    ExtenderMetrics(registry, Book(ttl=60, cap=10))
    assert sample(registry, "extender") == 1


def test_node_side_components_share_the_default_registry_one_series_each():
    import nodefabric_deviceplugin.dra.metrics
    import nodefabric_deviceplugin.metrics  # noqa: F401

    buildinfo.register("agent")
    buildinfo.register("agent")  # again: a no-op, never a duplicate-metric error
    for component in ("agent", "deviceplugin", "dra"):
        assert sample(REGISTRY, component) == 1, component
    text = generate_latest(REGISTRY).decode()
    assert text.count("# TYPE nodefabric_build_info gauge") == 1, "one metric, not one per component"
