"""The demo's topology section: the operator checks the fleet's hierarchy and writes the Kueue and KAI
Topology and the Volcano HyperNodes, which it prints."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import yaml

from nodefabric_operator.demo import targets
from nodefabric_operator.demo.kubeapi import RunningAPI
from nodefabric_operator.topology import report
from nodefabric_operator.topology.shell import TopologyOptions

KUEUE = "kueue.x-k8s.io/v1beta2/topologies"
KAI = "kai.scheduler/v1alpha1/topologies"
HYPERNODES = "topology.volcano.sh/v1alpha1/hypernodes"
REPORT = f"{report.GROUP}/{report.VERSION}/{report.PLURAL}"
LEAF = "network.topology.nvidia.com/leaf"  # what NVIDIA Topograph (up to v1.0) labels a node's leaf with
ZONE = "topology.kubernetes.io/zone"

OperatorRunning = Callable[..., contextlib.AbstractAsyncContextManager[None]]


def _items(k: RunningAPI, key: str) -> list[dict[str, Any]]:
    return sorted(k.api.store.select(key), key=lambda o: o["metadata"]["name"])


async def show_topology(
    k: RunningAPI, out: TextIO, operator_running: OperatorRunning, nodefeatures: str, namespace: str
) -> None:
    title = "7. Topology for other schedulers: Kueue, KAI, Volcano"
    out.write(f"\n=== {title} {'=' * max(0, 96 - len(title))}\n")  # as main._section writes it
    for name in (targets.KUEUE, targets.KAI, targets.VOLCANO):
        k.api.declare_crd(targets.load(name))
    k.api.declare_crd(report.crd())
    # What nfd-master does with the operator's NodeFeatures, and what Topograph adds: the leaf switch.
    nodes = _items(k, "v1/nodes")
    for node in nodes:
        name = node["metadata"]["name"]
        feature = k.api.stored(nodefeatures, name, namespace) or {}
        labels = {**node["metadata"].get("labels", {}), **feature.get("spec", {}).get("labels", {})}
        labels[LEAF] = f"leaf-{labels.get(ZONE, 'none')}"
        k.api.put_object("v1/nodes", {**node, "metadata": {**node["metadata"], "labels": labels}})

    async with operator_running(topology=TopologyOptions(debounce=0.1)):
        deadline = time.monotonic() + 30
        while not _written(k, len(nodes)):
            if time.monotonic() > deadline:
                raise RuntimeError("the operator did not write the topology projections within 30 s")
            await asyncio.sleep(0.05)

    status = _items(k, REPORT)[0]["status"]
    out.write(
        f"  FabricTopology {report.NAME}: {status['nodes']} nodes, levels projected: {status['projected']}, "
        f"violations: {status['violations']}\n\n"
    )
    (topology,) = _items(k, KUEUE)
    shown = {
        "apiVersion": topology["apiVersion"],
        "kind": topology["kind"],
        "metadata": {"name": topology["metadata"]["name"], "labels": topology["metadata"]["labels"]},
        "spec": topology["spec"],
    }
    out.write("  The Kueue Topology (the KAI Topology lists the same levels):\n")
    out.write("".join(f"    {line}\n" for line in yaml.safe_dump(shown, sort_keys=False).splitlines()))
    out.write("\n  The Volcano HyperNodes:\n")
    out.write(f"    {'NAME':50} {'TIER':>4}  {'TIERNAME':8}  MEMBERS\n")
    for hn in _items(k, HYPERNODES):
        spec = hn["spec"]
        out.write(
            f"    {hn['metadata']['name']:50} {spec['tier']:>4}  {spec['tierName']:8}  "
            f"{', '.join(_member(m) for m in spec['members'])}\n"
        )


def _written(k: RunningAPI, nodes: int) -> bool:
    got = _items(k, REPORT)
    return bool(
        got
        and got[0].get("status", {}).get("nodes") == nodes
        and _items(k, KUEUE)
        and _items(k, KAI)
        and any(h["metadata"]["name"].startswith("fabric.") for h in _items(k, HYPERNODES))
    )


def _member(m: Mapping[str, Any]) -> str:
    sel = m["selector"]
    if "exactMatch" in sel:
        return f"HyperNode {sel['exactMatch']['name']}"
    labels = ",".join(f"{k}={v}" for k, v in sel["labelMatch"].get("matchLabels", {}).items())
    absent = [e["key"] for e in sel["labelMatch"].get("matchExpressions", ())]
    return f"Nodes {labels}" + (f" without {', '.join(absent)}" if absent else "")
