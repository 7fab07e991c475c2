"""The `nodefabric` console script: one subcommand per job, each in the module that owns it.

Subcommand modules are imported only when chosen, so `nodefabric inventory` on a node never pays for
kopf or grpc. Each module exposes `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

from nodefabric_devicemanager import logs

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "inventory": (
        "nodefabric_devicemanager.commands.inventory",
        "read this host and print its Devices record",
    ),
    "preflight": (
        "nodefabric_devicemanager.commands.preflight",
        "one verdict per RDMA endpoint of this host",
    ),
    "pick": ("nodefabric_devicemanager.commands.pick", "choose the best-connected set of free GPUs"),
    "agent": ("nodefabric_devicemanager.agent.cli", "publish this node's Devices record (DaemonSet)"),
    "deviceplugin": ("nodefabric_deviceplugin.cli", "serve the RDMA device-plugin resources to kubelet"),
    "draplugin": ("nodefabric_deviceplugin.dra.cli", "serve RDMA endpoints as a DRA driver"),
    "slices": ("nodefabric_deviceplugin.dra.slices_cli", "print the ResourceSlices this host would publish"),
    "labels": ("nodefabric_operator.labels_cli", "print the node labels a Devices record yields"),
    "operator": ("nodefabric_operator.cli", "publish node labels from Devices objects (kopf)"),
    "extender": ("nodefabric_operator.extender.cli", "serve the kube-scheduler extender"),
    "crd": ("nodefabric_operator.crd_apply", "apply (or print) this version's Devices CRD: the upgrade hook"),
    "demo": ("nodefabric_operator.demo.main", "run the whole product on an embedded default"),
}


class Command(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, Command | None]:
    parser = argparse.ArgumentParser(
        prog="nodefabric", description="Kubernetes device manager for GPU clusters"
    )
    parser.add_argument("--log-format", choices=["text", "json"], default="text")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if a in COMMANDS), None)
    command: Command | None = None
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == chosen:
            command = cast(Command, importlib.import_module(module))
            command.add_arguments(p)
    return parser, command


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, command = build_parser(argv)
    args = parser.parse_args(argv)
    logs.configure(json_output=args.log_format == "json", level=args.log_level)
    assert command is not None  # argparse already refused an unknown or missing command
    return command.run(args)


if __name__ == "__main__":
    sys.exit(main())
