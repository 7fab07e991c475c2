"""The driver's path flags, shared by `nodefabric draplugin` and the agent (which prefixes them "dra-"
beside its device-plugin flags), and the start-up checks of their directories. No gRPC here: the agent's
parser must not pull it in."""

from __future__ import annotations

import argparse

from nodefabric_deviceplugin.dra.config import (
    DEFAULT_CDI_DIR,
    DEFAULT_PLUGIN_DIR,
    DEFAULT_REGISTRY_DIR,
    FUNCTION_TYPES,
    DriverConfig,
)
from nodefabric_deviceplugin.selection import Selection, load
from nodefabric_deviceplugin.startup import check_dir


def add_driver_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, prefix: str = "") -> None:
    parser.add_argument(
        f"--{prefix}plugin-dir",
        dest="dra_plugin_dir",
        default=DEFAULT_PLUGIN_DIR,
        help=f"kubelet's plugin directory: the DRA socket is <dir>/<driver>/dra.sock ({DEFAULT_PLUGIN_DIR})",
    )
    parser.add_argument(
        f"--{prefix}registry-dir",
        dest="dra_registry_dir",
        default=DEFAULT_REGISTRY_DIR,
        help=f"kubelet's plugin-registration directory (default {DEFAULT_REGISTRY_DIR})",
    )
    parser.add_argument(
        f"--{prefix}cdi-dir",
        dest="dra_cdi_dir",
        default=DEFAULT_CDI_DIR,
        help=f"where CDI specs are written (default {DEFAULT_CDI_DIR})",
    )
    if not prefix:  # the agent's own --rdma-selectors (the device plugin's) serves both
        parser.add_argument(
            "--rdma-selectors",
            default=None,
            metavar="FILE",
            help="YAML file of endpoint selectors, as the device plugin's: whole functions are offered as "
            "`exclusive` selects them, VFs as `partitioned` does (default: every one)",
        )


def config_from(args: argparse.Namespace, functions: tuple[str, ...] = FUNCTION_TYPES) -> DriverConfig:
    """The driver's configuration from the parsed flags (node name and domain included), its directories
    created and checked writable. Raises ValueError with a one-line reason."""
    if not args.node_name:
        raise ValueError("no node name: pass --node-name or set NODE_NAME (the downward API's spec.nodeName)")
    config = DriverConfig(
        node_name=args.node_name,
        domain=args.domain,
        plugin_dir=args.dra_plugin_dir,
        registry_dir=args.dra_registry_dir,
        cdi_dir=args.dra_cdi_dir,
        functions=functions,
        selection=load(selectors) if (selectors := getattr(args, "rdma_selectors", None)) else Selection(),
    )
    # Checked now, so an unusable one is one line and exit 2, not a server that retries its bind forever.
    check_dir(config.socket_dir, "the DRA socket directory")
    check_dir(config.registry_dir, "the plugin-registration directory")
    check_dir(config.cdi_dir, "the CDI directory")
    return config
