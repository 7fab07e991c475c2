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
        extender's decision, they were all given one location (the claim annotation), and every pod's
        node (kubectl get nodes -o json) is in that location. Exit 1 with the reason otherwise.

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    h = sub.add_parser("host", help="lay out a fixture host tree")
    h.add_argument("directory", type=Path)
    p = sub.add_parser("placement", help="check a group's placement against the extender's claims")
    p.add_argument("pods", type=Path)
    p.add_argument("nodes", type=Path)
    p.add_argument("--domain", default="gpustack.ai")
    p.add_argument("--size", type=int, required=True)
    args = parser.parse_args()
    if args.command == "host":
        host(args.directory)
        return 0
    pods = json.loads(args.pods.read_text())["items"]
    nodes = json.loads(args.nodes.read_text())["items"]
    try:
        lines = placement(pods, nodes, args.domain, args.size)
    except (AssertionError, KeyError, ValueError) as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
