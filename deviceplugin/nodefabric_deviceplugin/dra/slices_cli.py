"""`nodefabric slices`: print the ResourceSlices a host would publish, as `labels` prints labels.

    nodefabric slices --root / --node-name gpu-7 [-o json|yaml] [--domain gpustack.ai]
    nodefabric slices -f devices.yaml [--node-name gpu-7]        # from a Devices object instead

From a host, the link layers are read there too; from a Devices object (`kubectl get devices NODE -o
yaml`) they are unknown and left out. The slices are shown as a first publication writes them
(generation 1, no owner reference).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import pydantic
import yaml

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.commands import document, output
from nodefabric_devicemanager.commands import inventory as inventory_command
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import Devices, DevicesSpec
from nodefabric_deviceplugin.dra.config import DEFAULT_DOMAIN, DriverConfig
from nodefabric_deviceplugin.dra.devices import pool_devices, published
from nodefabric_deviceplugin.dra.linklayer import link_layers
from nodefabric_deviceplugin.dra.slices import desired_slices, resource_slice

PROG = "nodefabric slices"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--root", default=None, help="read this host root (default /)")
    source.add_argument(
        "-f", "--filename", help="a Devices object (JSON or YAML, - for stdin) instead of a host"
    )
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="the node (default: $NODE_NAME, else the Devices object's name)",
    )
    parser.add_argument(
        "--domain", default=DEFAULT_DOMAIN, help=f"the driver is rdma.<domain> (default {DEFAULT_DOMAIN})"
    )
    parser.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")


def slice_list(spec: DevicesSpec, config: DriverConfig, layers: dict[str, str]) -> dict[str, Any]:
    desired = desired_slices(spec, config, layers) or []
    return {"apiVersion": "v1", "kind": "List", "items": [resource_slice(d, 1) for d in desired]}


def run(args: argparse.Namespace) -> int:
    devices: Devices | None = None
    if args.filename:
        try:
            devices = document.load_devices(args.filename)
        except (ValueError, RecursionError, yaml.YAMLError, pydantic.ValidationError) as exc:
            # One line, whatever the parser's message looks like (pydantic's spans several).
            print(output.one_line(f"{PROG}: cannot read {args.filename}: {exc}"), file=sys.stderr)
            return 2
    node = args.node_name or (devices.metadata.name if devices is not None else "")
    if not node:
        print(f"{PROG}: no node name: pass --node-name (or set NODE_NAME)", file=sys.stderr)
        return 2
    try:
        config = DriverConfig(node_name=node, domain=args.domain)
    except ValueError as exc:
        print(output.one_line(f"{PROG}: {exc}"), file=sys.stderr)
        return 2
    layers: dict[str, str] = {}
    if devices is not None:
        spec = devices.spec
    else:
        root = "/" if args.root is None else args.root
        if inventory_command.refused_root(PROG, root):
            return 2
        host = HostRoot.at(root)
        reading = inventory.read(host)
        if reading.interfaces is None:
            why = next((c.message for c in reading.conditions if c.status == "False"), "unknown")
            print(
                output.one_line(f"{PROG}: could not enumerate this host's interfaces, so no slices: {why}"),
                file=sys.stderr,
            )
            return 1
        spec = reading.spec()
        layers = link_layers(host, [d.endpoint.rdma_device for d in published(pool_devices(spec))])
    doc = slice_list(spec, config, layers)
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        print(yaml.safe_dump(doc, sort_keys=False), end="")
    return 0
