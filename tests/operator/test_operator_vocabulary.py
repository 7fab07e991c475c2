"""The vocabulary: one leaf spelling every name, and `--domain` moving every name built from the domain.

A component that spelt `gpustack.ai` itself instead of asking the vocabulary would keep writing the
default domain under another `--domain`; these tests ask each component for the names it writes.
"""

from __future__ import annotations

import ast
from pathlib import Path

from operator_records import devices, gpu, group, nic, nvlink

from nodefabric_devicemanager import vocabulary
from nodefabric_devicemanager.models import Devices
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.resources import Family, PluginConfig
from nodefabric_operator import labels, sinks
from nodefabric_operator.admission.webhook import WebhookConfig
from nodefabric_operator.extender import decisions
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.topology.levels import default_levels

OTHER = "example.com"


def test_the_vocabulary_imports_nothing_of_ours() -> None:
    tree = ast.parse(Path(vocabulary.__file__).read_text())
    imported = [
        n.module or "" if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    ]
    assert not [m for m in imported if m.startswith("nodefabric")], imported


def _names_written_under(domain: str) -> dict[str, list[str]]:
    record: Devices = devices(
        interfaces=[nic()],
        groups=[group("nvidia", gpu(0, fabric=nvlink(clique=1)), gpu(1, fabric=nvlink(clique=1)))],
    )
    extender = ExtenderConfig(domain=domain)
    plugin = PluginConfig(domain=domain)
    webhook = WebhookConfig(placement=extender)
    return {
        "node labels": list(labels.compute(record, domain).labels),
        "managed-labels annotation": [sinks.managed_annotation(domain)],
        "extender level keys": [k for lv in extender.levels for k in lv.keys],
        "topology level keys": [k for lv in default_levels(domain) for k in lv.keys],
        "pod annotations": [extender.annotation_prefix, decisions.key(extender)],
        "scheduling gate": [webhook.gate],
        "device plugin resources": [plugin.resource_name(f) for f in Family],
        "DRA driver": [DriverConfig(node_name="gpu-7", domain=domain).driver],
    }


def test_every_name_built_from_the_domain_moves_with_it() -> None:
    for what, names in _names_written_under(OTHER).items():
        assert names, what
        assert not [n for n in names if vocabulary.DOMAIN in n], what
        assert all(OTHER in n for n in names if "nodefabric" in n or n.startswith(("feature.", "placement.")))


def test_the_default_names_are_the_vocabularys() -> None:
    names = _names_written_under(vocabulary.DOMAIN)
    assert vocabulary.fabric_domain_key() in names["node labels"]
    assert (
        names["extender level keys"][0] == names["topology level keys"][0] == vocabulary.fabric_domain_key()
    )
    assert names["scheduling gate"] == [vocabulary.scheduling_gate()] == ["placement.gpustack.ai/group"]
    assert names["DRA driver"] == [vocabulary.dra_driver()] == ["rdma.gpustack.ai"]
    assert names["device plugin resources"] == [
        "device.gpustack.ai/rdma",
        "device.gpustack.ai/rdma.shared",
        "device.gpustack.ai/rdma.partitioned",
    ]
    assert (vocabulary.DEVICES_GROUP, vocabulary.PLACEMENT_GROUP) == (
        "worker.gpustack.ai",
        "placement.gpustack.ai",
    )
