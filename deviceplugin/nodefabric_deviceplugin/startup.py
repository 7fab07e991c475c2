"""What is checked before anything is served, so a bad setting is one line and exit 2, not a traceback or
a plugin that retries a bind forever. `nodefabric deviceplugin` and `nodefabric agent` both call
`check_startup`; the settings themselves are checked when `PluginConfig` is built (shared count, domain).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from nodefabric_devicemanager import flags
from nodefabric_devicemanager.shell.errors import StartupError
from nodefabric_deviceplugin import selection
from nodefabric_deviceplugin.resources import DEFAULT_DOMAIN, DEFAULT_SHARED_COUNT, Family, PluginConfig

# sockaddr_un.sun_path is 108 bytes, one of them the terminating NUL.
MAX_SOCKET_PATH = 107
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


def socket_name(family: Family) -> str:
    return f"nodefabric-{family.value}.sock"


def utf8(path: str) -> bool:
    """Whether a path (non-UTF-8 bytes from the command line arrive as surrogates) encodes as UTF-8."""
    try:
        path.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_dir(path: str, what: str = "the plugin directory") -> None:
    """Create the directory `what` when missing; refuse one that cannot hold our files, saying why."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise StartupError(f"{what} {path} exists and is not a directory") from None
    except OSError as exc:
        raise StartupError(f"{what} {path} cannot be created: {exc.strerror or exc}") from None
    if not os.path.isdir(path):
        raise StartupError(f"{what} {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise StartupError(f"{what} {path} is not writable by this process")


def check_plugin_dir(plugin_dir: str, families: list[Family]) -> None:
    """Create the directory when missing; refuse one that cannot hold our sockets, saying why."""
    if not utf8(plugin_dir):
        # gRPC takes a socket's path as UTF-8: the first serve would raise, a traceback, not this line.
        raise StartupError(f"the plugin directory {plugin_dir!r} is not valid UTF-8, as gRPC needs")
    check_dir(plugin_dir)
    for family in families:
        path = os.path.join(plugin_dir, socket_name(family))
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise StartupError(
                f"the socket path {path} is {len(os.fsencode(path))} bytes; unix socket paths are "
                f"limited to {MAX_SOCKET_PATH}: use a shorter --plugin-dir"
            )


def check_startup(config: PluginConfig, plugin_dir: str) -> None:
    """Everything the plugin needs before it serves. Raises StartupError (a ValueError)."""
    check_plugin_dir(plugin_dir, config.families())


def add_plugin_arguments(parser: argparse.ArgumentParser | Any) -> None:
    """The device plugin's flags, the same on `nodefabric deviceplugin` and `nodefabric agent` (a parser
    or an argument group)."""
    parser.add_argument(
        "--plugin-dir",
        default=DEFAULT_PLUGIN_DIR,
        help=f"kubelet's device-plugin directory ({DEFAULT_PLUGIN_DIR})",
    )
    parser.add_argument("--no-shared", action="store_true", help="do not serve device.<domain>/rdma.shared")
    parser.add_argument(
        "--no-partitioned", action="store_true", help="do not serve device.<domain>/rdma.partitioned"
    )
    parser.add_argument(
        "--shared-count",
        type=flags.count,
        default=DEFAULT_SHARED_COUNT,
        metavar="N",
        help=f"rdma.shared tokens per whole-function endpoint (default {DEFAULT_SHARED_COUNT})",
    )
    parser.add_argument(
        "--domain", default=DEFAULT_DOMAIN, help=f"resource domain (default {DEFAULT_DOMAIN})"
    )
    parser.add_argument(
        "--rdma-selectors",
        default=None,
        metavar="FILE",
        help="YAML file of per-family endpoint selectors (exclusive, shared, partitioned) to dedicate "
        "NICs to one family; default: every whole function in both exclusive and shared",
    )


def config_from_args(args: argparse.Namespace) -> PluginConfig:
    """The settings those flags give, checked before anything is served. Raises StartupError (or the
    ValueError PluginConfig raises for a shared count or domain it refuses)."""
    selectors = getattr(args, "rdma_selectors", None)
    config = PluginConfig(
        domain=args.domain,
        shared_count=args.shared_count,
        shared=not args.no_shared,
        partitioned=not args.no_partitioned,
        selection=selection.load(selectors) if selectors else selection.Selection(),
    )
    check_startup(config, args.plugin_dir)
    return config
