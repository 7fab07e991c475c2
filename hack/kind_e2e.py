#!/usr/bin/env python3
"""The parts of hack/kind-e2e.sh that are easier to get right in Python, and are tested here
(tests/chart/test_chart_kind_e2e.py) although the end-to-end itself needs Docker and kind.

    PYTHONPATH=devicemanager python3 hack/kind_e2e.py host DIR
        Lay out a fixture host (the builder's gpu8 scenario: 8 GPUs, 5 ConnectX NICs with RDMA, NUMA
        nodes 0 and 1) under DIR, to be mounted into a kind worker as the agent's host root. Every
        directory and file is made readable by all, whatever the umask: the agent runs as uid 0 with every
        capability dropped (no CAP_DAC_OVERRIDE), so it is not their owner in the permission check.

    python3 hack/kind_e2e.py placement PODS.json NODES.json --domain gpustack.ai --size 8
        Check that the group's pods (kubectl get pods -o json) are all bound, each carries the
        extender's decision, its text names one location for them all, and every pod's
        node (kubectl get nodes -o json) is in that location. Exit 1 with the reason otherwise.

    python3 hack/kind_e2e.py devnodes DIR
        Print "NAME MAJOR MINOR" for each node under DIR/dev/infiniband (the fixture's are plain files),
        the numbers from the tree's sysfs (rdma_cm, which has none there: misc 10:58). The script makes
        these character devices in each kind worker, where the container runtime looks for what a
        device-plugin grant or a CDI spec names.

    python3 hack/kind_e2e.py gate PLACEMENTGROUP.json PODS.json NODES.json --size 8
        Check a group admitted through the scheduling gate: the PlacementGroup is Admitted and AllBound
        with `size` members; every pod names the default scheduler, lost the gate, was pinned to the node
        its member was assigned (required node affinity), carries the decision, is Running there; and all
        are on nodes of one zone (the PlacementGroup's location when its level is zone).

    python3 hack/kind_e2e.py slices SLICES.json --driver rdma.gpustack.ai --node N --count 5
        Check that the driver publishes COUNT devices in node N's pool (kubectl get resourceslices -o json).

    python3 hack/kind_e2e.py dra CLAIM.json POD.json SLICES.json --driver rdma.gpustack.ai --hca H --dev D
        Check a ResourceClaim's allocation: one device, of DRIVER, from the pool of the pod's node, the
        claim reserved for the pod; the container's NCCL_IB_HCA (H) names that device's rdmaDevice, and
        its /dev/infiniband listing (D, whitespace-separated) holds exactly one verbs device.

Only the standard library and, for `host`, the fixture builder from the source tree.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

SCENARIO = "gpu8"


def host(directory: Path) -> None:
    from nodefabric_devicemanager.testing.scenarios import SCENARIOS

    SCENARIOS[SCENARIO](directory)
    readable_by_all(directory)


def readable_by_all(directory: Path) -> None:
    """a+r on files, a+rx on directories (chmod -R a+rX); symbolic links are left alone, as chmod leaves
    them (their mode means nothing on Linux, and following one could leave the tree)."""
    for root, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            extra = 0o555 if stat.S_ISDIR(st.st_mode) else 0o444
            os.chmod(path, stat.S_IMODE(st.st_mode) | extra)
    os.chmod(directory, stat.S_IMODE(os.stat(directory).st_mode) | 0o555)


def level_keys(domain: str) -> dict[str, str]:
    """The label each level's location is read from, as the chart configures the extender by default
    (the first key of each level)."""
    return {
        "fabric": f"feature.{domain}/fabric.domain",
        "network-group": f"topology.{domain}/network-group",
        "zone": "topology.kubernetes.io/zone",
        "region": "topology.kubernetes.io/region",
    }


TITLES = {"fabric domain": "fabric", "network group": "network-group", "zone": "zone", "region": "region"}
WHERE = re.compile(
    r"(?:go to|goes to|widened to) (any location|(fabric domain|network group|zone|region) (\S+?))(?=[ ;(]|$)"
)


def where_decided(text: str) -> tuple[str, str | None]:
    """(level, location) the extender's decision text names ("... go to zone eu-a of region eu ...");
    the extender writes no claim any more, so the words people read are what the check reads."""
    found = WHERE.search(text.replace("\n", " "))
    if found is None:
        raise AssertionError(f"the decision names no location: {text!r}")
    if found.group(1) == "any location":
        return "any", None
    return TITLES[found.group(2)], found.group(3)


def placement(pods: list[dict[str, Any]], nodes: list[dict[str, Any]], domain: str, size: int) -> list[str]:
    """One line per pod on success; raises AssertionError naming the first thing that is wrong."""
    labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes}
    keys = level_keys(domain)
    decision_key = f"placement.{domain}/decision"
    if len(pods) != size:
        raise AssertionError(f"{len(pods)} pods, not {size}")
    given: set[tuple[str, str | None]] = set()
    lines = []
    for pod in pods:
        name, node = pod["metadata"]["name"], pod["spec"].get("nodeName")
        notes = pod["metadata"].get("annotations") or {}
        if not node:
            raise AssertionError(f"{name} is not bound to a node")
        if decision_key not in notes:
            raise AssertionError(f"{name} carries no {decision_key}: the extender did not decide it")
        level, location = where_decided(str(notes[decision_key]))
        given.add((level, location))
        if level != "any":
            got = labels.get(node, {}).get(keys[level])
            if got != location:
                raise AssertionError(
                    f"{name} is on {node} ({keys[level]}={got}), but the extender said {level} {location}"
                )
        lines.append(f"{name}: {node}, {level} {location}")
    if len(given) != 1:
        raise AssertionError(f"the group was given several locations: {sorted(given, key=str)}")
    return lines


ZONE = "topology.kubernetes.io/zone"
# rdma_cm is a misc device with a dynamic minor; the fixture's sysfs has no entry for it.
RDMA_CM = ("rdma_cm", 10, 58)


def devnodes(directory: Path) -> list[tuple[str, int, int]]:
    """(name, major, minor) of each node the fixture host has under dev/infiniband."""
    dev = directory / "dev" / "infiniband"
    if not dev.is_dir():
        raise ValueError(f"{dev} is not a directory: not a fixture host")
    out = []
    for path in sorted(dev.iterdir()):
        if path.name == RDMA_CM[0]:
            out.append(RDMA_CM)
            continue
        number = directory / "sys" / "class" / "infiniband_verbs" / path.name / "dev"
        try:
            major, _, minor = number.read_text().strip().partition(":")
            out.append((path.name, int(major), int(minor)))
        except (OSError, ValueError) as exc:
            raise ValueError(f"no device number for {path.name} in {number}: {exc}") from exc
    if not out:
        raise ValueError(f"{dev} is empty")
    return out


def _conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c.get("type", ""): c.get("status", "") for c in (obj.get("status") or {}).get("conditions") or []}


def pinned(spec: dict[str, Any], node: str) -> bool:
    """Every required node-affinity term names the node (matchFields metadata.name In [node]): how the
    admission narrows a pod before it removes the gate."""
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = affinity.get("nodeSelectorTerms") or []
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    return bool(terms) and all(pin in (t.get("matchFields") or []) for t in terms)


def gate(
    group: dict[str, Any], pods: list[dict[str, Any]], nodes: list[dict[str, Any]], domain: str, size: int
) -> list[str]:
    """One line per pod on success; raises AssertionError naming the first thing that is wrong."""
    zones = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(ZONE) for n in nodes}
    name, status = group["metadata"]["name"], group.get("status") or {}
    conditions = _conditions(group)
    for condition in ("Admitted", "AllBound"):
        if conditions.get(condition) != "True":
            raise AssertionError(f"PlacementGroup {name} is not {condition}: {conditions}")
    if status.get("size") != size:
        raise AssertionError(f"PlacementGroup {name} has size {status.get('size')}, not {size}")
    assigned = {m["pod"]: m.get("node", "") for m in status.get("members") or []}
    if len(assigned) != size or not all(assigned.values()):
        raise AssertionError(f"PlacementGroup {name} assigns {assigned}, not {size} pods each to a node")
    live = [p for p in pods if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
    if sorted(p["metadata"]["name"] for p in live) != sorted(assigned):
        raise AssertionError(
            f"the pods {sorted(p['metadata']['name'] for p in live)} are not the members {sorted(assigned)}"
        )
    lines: list[str] = []
    seen: set[str] = set()
    for pod in live:
        pod_name, spec = pod["metadata"]["name"], pod["spec"]
        node = spec.get("nodeName")
        if node != assigned[pod_name]:
            raise AssertionError(
                f"{pod_name} is on {node}, but PlacementGroup {name} assigned {assigned[pod_name]}"
            )
        if (spec.get("schedulerName") or "default-scheduler") != "default-scheduler":
            raise AssertionError(f"{pod_name} names the scheduler {spec['schedulerName']}, not the stock one")
        gates = [g.get("name") for g in spec.get("schedulingGates") or []]
        if f"placement.{domain}/group" in gates:
            raise AssertionError(f"{pod_name} still carries the scheduling gate placement.{domain}/group")
        if not pinned(spec, node):
            raise AssertionError(
                f"{pod_name} was not pinned to {node} by the admission (required node affinity)"
            )
        if f"placement.{domain}/decision" not in (pod["metadata"].get("annotations") or {}):
            raise AssertionError(f"{pod_name} carries no placement.{domain}/decision")
        if pod.get("status", {}).get("phase") != "Running":
            raise AssertionError(f"{pod_name} is {pod.get('status', {}).get('phase')}, not Running")
        zone = zones.get(node)
        if not zone:
            raise AssertionError(f"{pod_name}'s node {node} has no {ZONE} label")
        seen.add(zone)
        lines.append(f"{pod_name}: {node}, {ZONE}={zone}")
    if len(seen) != 1:
        raise AssertionError(f"the group spans the zones {sorted(seen)}")
    if status.get("level") == "zone" and status.get("location") not in seen:
        raise AssertionError(
            f"PlacementGroup {name} says zone {status.get('location')}, the pods are in {sorted(seen)}"
        )
    return lines


def _pool_devices(slices: list[dict[str, Any]], driver: str, node: str) -> dict[str, dict[str, Any]]:
    """The devices the driver publishes in node's pool, by name (a pool may span several slices)."""
    out: dict[str, dict[str, Any]] = {}
    for item in slices:
        spec = item.get("spec") or {}
        if (
            spec.get("driver") == driver
            and spec.get("nodeName") == node
            and (spec.get("pool") or {}).get("name") == node
        ):
            for device in spec.get("devices") or []:
                out[device["name"]] = device
    return out


def slices(items: list[dict[str, Any]], driver: str, node: str, count: int) -> list[str]:
    devices = _pool_devices(items, driver, node)
    if len(devices) != count:
        raise AssertionError(f"{driver} publishes {len(devices)} devices in the pool of {node}, not {count}")
    return sorted(devices)


def dra(
    claim: dict[str, Any],
    pod: dict[str, Any],
    items: list[dict[str, Any]],
    *,
    driver: str,
    hca: str,
    dev: str,
) -> list[str]:
    """The claim's allocation and what its container sees; raises AssertionError naming what is wrong."""
    name, status = claim["metadata"]["name"], claim.get("status") or {}
    node = pod["spec"].get("nodeName")
    if not node:
        raise AssertionError(f"{pod['metadata']['name']} is not bound to a node")
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    if len(results) != 1:
        raise AssertionError(f"ResourceClaim {name} is allocated {len(results)} devices, not 1: {results}")
    result = results[0]
    if result.get("driver") != driver:
        raise AssertionError(f"ResourceClaim {name} is allocated by {result.get('driver')}, not {driver}")
    if result.get("pool") != node:
        raise AssertionError(
            f"ResourceClaim {name}'s device is from the pool {result.get('pool')}, not the pod's node {node}"
        )
    reserved = {r.get("uid") for r in status.get("reservedFor") or []}
    if pod["metadata"].get("uid") not in reserved:
        raise AssertionError(f"ResourceClaim {name} is not reserved for {pod['metadata']['name']}")
    device = _pool_devices(items, driver, node).get(result.get("device", ""))
    if device is None:
        raise AssertionError(f"{result.get('device')} is not a device {driver} publishes on {node}")
    rdma = ((device.get("attributes") or {}).get("rdmaDevice") or {}).get("string")
    if hca.strip() != f"={rdma}":
        raise AssertionError(
            f"the container's NCCL_IB_HCA is {hca.strip()!r}, not '={rdma}' ({result['device']})"
        )
    verbs = [entry for entry in dev.split() if entry.startswith("uverbs")]
    if len(verbs) != 1:
        raise AssertionError(f"the container has the verbs devices {verbs}, not exactly one")
    where = f"{driver} {node}/{result['device']} ({rdma})"
    return [f"{name}: {where}, NCCL_IB_HCA={hca.strip()}, /dev/infiniband/{verbs[0]}"]


def _items(path: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(path.read_text())["items"]
    return items


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    h = sub.add_parser("host", help="lay out a fixture host tree")
    h.add_argument("directory", type=Path)
    p = sub.add_parser("placement", help="check a group's placement against the extender's decisions")
    p.add_argument("pods", type=Path)
    p.add_argument("nodes", type=Path)
    p.add_argument("--domain", default="gpustack.ai")
    p.add_argument("--size", type=int, required=True)
    d = sub.add_parser("devnodes", help="the device nodes a fixture host has, with their numbers")
    d.add_argument("directory", type=Path)
    g = sub.add_parser("gate", help="check a group admitted through the scheduling gate")
    g.add_argument("group", type=Path)
    g.add_argument("pods", type=Path)
    g.add_argument("nodes", type=Path)
    g.add_argument("--domain", default="gpustack.ai")
    g.add_argument("--size", type=int, required=True)
    s = sub.add_parser("slices", help="check the devices a DRA driver publishes in a node's pool")
    s.add_argument("slices", type=Path)
    s.add_argument("--driver", required=True)
    s.add_argument("--node", required=True)
    s.add_argument("--count", type=int, required=True)
    c = sub.add_parser("dra", help="check a ResourceClaim's allocation and what its container sees")
    c.add_argument("claim", type=Path)
    c.add_argument("pod", type=Path)
    c.add_argument("slices", type=Path)
    c.add_argument("--driver", required=True)
    c.add_argument("--hca", required=True)
    c.add_argument("--dev", required=True)
    args = parser.parse_args()
    if args.command == "host":
        host(args.directory)
        return 0
    try:
        if args.command == "devnodes":
            lines = [f"{n} {major} {minor}" for n, major, minor in devnodes(args.directory)]
        elif args.command == "gate":
            group = json.loads(args.group.read_text())
            lines = gate(group, _items(args.pods), _items(args.nodes), args.domain, args.size)
        elif args.command == "slices":
            lines = slices(_items(args.slices), args.driver, args.node, args.count)
        elif args.command == "dra":
            claim, pod = json.loads(args.claim.read_text()), json.loads(args.pod.read_text())
            lines = dra(claim, pod, _items(args.slices), driver=args.driver, hca=args.hca, dev=args.dev)
        else:
            lines = placement(_items(args.pods), _items(args.nodes), args.domain, args.size)
    except (AssertionError, KeyError, ValueError, TypeError, OSError) as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
