"""`nodefabric deviceplugin`: serve the RDMA resources standalone, reading the host itself.

Inside `nodefabric agent` the same servers run fed by the agent's record; this command is for debugging
a node without the API server: it reads the host at --root every --interval seconds and serves until
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_deviceplugin.resources import DEFAULT_DOMAIN, DEFAULT_SHARED_COUNT, PluginConfig
from nodefabric_deviceplugin.server import DEFAULT_PLUGIN_DIR, DevicePluginManager
from nodefabric_deviceplugin.source import RecordSource, poll_host

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default="/", help="the host's root as mounted here (default /)")
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
        type=int,
        default=DEFAULT_SHARED_COUNT,
        metavar="N",
        help=f"rdma.shared tokens per whole-function endpoint (default {DEFAULT_SHARED_COUNT})",
    )
    parser.add_argument(
        "--domain", default=DEFAULT_DOMAIN, help=f"resource domain (default {DEFAULT_DOMAIN})"
    )
    parser.add_argument(
        "--interval", type=float, default=10.0, metavar="SECONDS", help="host re-read interval (default 10)"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=0, metavar="PORT", help="serve Prometheus metrics here (0: off)"
    )


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    config = PluginConfig(
        domain=args.domain,
        shared_count=args.shared_count,
        shared=not args.no_shared,
        partitioned=not args.no_partitioned,
    )
    host = HostRoot.at(args.root)
    source = RecordSource()
    manager = DevicePluginManager(source, host, config=config, plugin_dir=args.plugin_dir)
    poller = asyncio.create_task(poll_host(source, host, interval=args.interval, stop=stop))
    try:
        await manager.run(stop)
    finally:
        stop.set()
        await poller


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        log.error("the interval must be positive", extra={"interval": args.interval})
        return 2
    try:
        PluginConfig(domain=args.domain, shared_count=args.shared_count)
    except ValueError as exc:
        log.error("invalid configuration", extra={"why": str(exc)})
        return 2
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info(
            "device plugin starting",
            extra={"root": args.root, "plugin_dir": args.plugin_dir, "domain": args.domain},
        )
        await serve(args, stop)

    asyncio.run(main())
    return 0
