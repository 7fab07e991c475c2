"""Benchmark: the topology check and its projections over a large fleet, and what one node change writes.

    .venv/bin/python hack/bench_topology.py [--nodes 5000]

Figures:
- Time of one pass's pure work over the fleet (nodefabric fabric domains of 18 nodes, Topograph leaf and
  spine tiers, two zones, one region): the nesting check, the Kueue and KAI Topology and every Volcano
  HyperNode, best of 5; the baseline, measured in the same run, is the copy of the fleet's level labels
  each pass starts with (touching every node once).
- Objects written per node change: the real Projector (the operator's shell) against the embedded
  Kubernetes API serving the three targets' CRDs and the FabricTopology CRD, one pass per change, the
  API's own count of create/patch/delete requests per resource.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from nodefabric_devicemanager import vocabulary
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.demo import targets
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.levels import default_levels
from nodefabric_operator.topology.nesting import check
from nodefabric_operator.topology.shell import Projector, TopologyOptions

FABRIC = vocabulary.fabric_domain_key()
LEAF = "network.topology.nvidia.com/leaf"
SPINE = "network.topology.nvidia.com/spine"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
HOST = "kubernetes.io/hostname"
DOMAIN_NODES, LEAF_DOMAINS, SPINE_LEAVES = 18, 2, 16
RESOURCES = {
    "kueue": "kueue.x-k8s.io/v1beta2/topologies",
    "kai": "kai.scheduler/v1alpha1/topologies",
    "volcano": "topology.volcano.sh/v1alpha1/hypernodes",
    "report": f"{report.GROUP}/{report.VERSION}/{report.PLURAL}",
}


def node_labels(i: int) -> dict[str, str]:
    domain = i // DOMAIN_NODES
    leaf = domain // LEAF_DOMAINS
    spine = leaf // SPINE_LEAVES
    return {
        HOST: f"gpu-{i}",
        FABRIC: f"nvl-{domain}",
        LEAF: f"leaf-{leaf}",
        SPINE: f"spine-{spine}",
        ZONE: f"zone-{'ab'[spine % 2]}",  # a spine lies inside one zone
        REGION: "region-1",
    }


def fleet_of(nodes: int) -> dict[str, dict[str, str]]:
    return {f"gpu-{i}": node_labels(i) for i in range(nodes)}


def best_of(fn: Callable[[], Any], repeat: int = 5) -> float:
    out = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - start)
    return out


def pure(nodes: int) -> None:
    fleet = fleet_of(nodes)
    levels = default_levels()

    def one_pass() -> None:
        h = check(levels, fleet)
        project.kueue_topology(h, "nodefabric", "v1beta2")
        project.kai_topology(h, "nodefabric")
        project.hypernodes(h, fleet)

    h = check(levels, fleet)
    hns = project.hypernodes(h, fleet)
    copy = best_of(lambda: {n: dict(labs) for n, labs in fleet.items()})
    check_s = best_of(lambda: check(levels, fleet))
    whole = best_of(one_pass)
    print(
        f"fleet: {nodes} nodes, projected {', '.join(lv.name for lv in h.projected)}, {len(hns)} HyperNodes"
    )
    print(f"  nesting check                    {check_s * 1000:8.1f} ms")
    print(f"  check + Kueue + KAI + HyperNodes {whole * 1000:8.1f} ms")
    print(
        f"  baseline: copy the level labels  {copy * 1000:8.1f} ms   (pass / baseline: {whole / copy:.1f}x)"
    )


def writes(k: RunningAPI) -> dict[str, int]:
    return {
        name: sum(k.count(m, key) for m in ("POST", "PATCH", "PUT", "DELETE"))
        for name, key in RESOURCES.items()
    }


async def per_change(nodes: int) -> None:
    crds = [
        targets.load(targets.KUEUE),
        targets.load(targets.KAI),
        targets.load(targets.VOLCANO),
        report.crd(),
    ]
    async with running_api(crds) as k:
        api = load_client(k.kubeconfig)
        proj = Projector(api, TopologyOptions(debounce=0), Metrics())
        fleet = fleet_of(nodes)
        started = time.perf_counter()
        await asyncio.to_thread(proj.reconcile, fleet)
        first = time.perf_counter() - started
        print(f"\nfirst pass against the embedded API: {first:.1f} s, writes {writes(k)}")
        last = nodes - 1
        changes: list[tuple[str, Callable[[dict[str, dict[str, str]]], None]]] = [
            ("a label no level reads changes", lambda f: f["gpu-0"].update({"example.com/x": "1"})),
            (
                "a node joins an existing domain",
                lambda f: f.update({"new-1": dict(f["gpu-0"], **{HOST: "new-1"})}),
            ),
            ("a node leaves (its domain stays)", lambda f: f.pop("new-1")),
            (
                "a node joins with a new fabric domain",
                lambda f: f.update({"new-2": dict(f["gpu-0"], **{HOST: "new-2", FABRIC: "nvl-new"})}),
            ),
            ("that node leaves (its domain goes)", lambda f: f.pop("new-2")),
            (
                "a fabric domain is split across leaves",
                lambda f: f["gpu-1"].update({LEAF: f[f"gpu-{last}"][LEAF]}),
            ),
            ("it nests again", lambda f: f["gpu-1"].update({LEAF: f["gpu-0"][LEAF]})),
        ]
        for what, change in changes:
            change(fleet)
            before = writes(k)
            started = time.perf_counter()
            await asyncio.to_thread(proj.reconcile, {n: dict(v) for n, v in fleet.items()})
            took = time.perf_counter() - started
            after = writes(k)
            delta = {name: after[name] - before[name] for name in after if after[name] != before[name]}
            total = sum(delta.values())
            print(f"  {what:42} {total:4} writes {delta or ''}  ({took * 1000:.0f} ms)")
        api.close()  # type: ignore[no-untyped-call]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    args = parser.parse_args()
    pure(args.nodes)
    asyncio.run(per_change(args.nodes))


if __name__ == "__main__":
    main()
