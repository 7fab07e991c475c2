"""`nodefabric deviceplugin`: serve the RDMA resources standalone, reading the host itself.

Inside `nodefabric agent` the same servers run fed by the agent's record; this command is for debugging
a node without the API server: it reads the host at --root every --interval seconds and serves until
SIGTERM or SIGINT. With --metrics-port it also serves /metrics, /healthz and /readyz on that port.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from nodefabric_devicemanager import flags
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_deviceplugin import probes
from nodefabric_deviceplugin.resources import PluginConfig
from nodefabric_deviceplugin.server import DevicePluginManager
from nodefabric_deviceplugin.source import RecordSource, poll_host
from nodefabric_deviceplugin.startup import add_plugin_arguments, config_from_args

log = logging.getLogger(__name__)

EXIT_USAGE = 2
# SIGTERM to exit: the servers stop at once (grace None) and a host read stuck in its thread is left to
# die with the process, so the command ends within about a second whatever the host does.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default="/", help="the host's root as mounted here (default /)")
    add_plugin_arguments(parser)
    parser.add_argument(
        "--interval",
        type=flags.seconds(),
        default=10.0,
        metavar="SECONDS",
        help="host re-read interval (default 10)",
    )
    parser.add_argument(
        "--bind-address", default="0.0.0.0", help="address of the metrics and probe port (default 0.0.0.0)"
    )
    parser.add_argument(
        "--metrics-port",
        type=flags.port,
        default=0,
        metavar="PORT",
        help="serve /metrics, /healthz and /readyz here (0: off)",
    )


async def serve(args: argparse.Namespace, config: PluginConfig, stop: asyncio.Event) -> int:
    host = HostRoot.at(args.root)
    source = RecordSource()
    manager = DevicePluginManager(source, host, config=config, plugin_dir=args.plugin_dir)
    http = None
    if args.metrics_port:
        try:
            http = await probes.serve(args.bind_address, args.metrics_port, manager.readiness)
        except OSError as exc:
            log.error(
                "cannot serve metrics and probes",
                extra={
                    "address": f"{args.bind_address}:{args.metrics_port}",
                    "why": exc.strerror or str(exc),
                },
            )
            return EXIT_USAGE
    poller = asyncio.create_task(poll_host(source, host, interval=args.interval, stop=stop))
    try:
        await manager.run(stop)
    finally:
        stop.set()
        await poller
        if http is not None:
            await http.cleanup()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        if not os.path.isdir(args.root):
            raise ValueError(f"the host root {args.root} is not a directory")
        config = config_from_args(args)
    except ValueError as exc:
        log.error("cannot start", extra={"why": str(exc)})
        return EXIT_USAGE
    probes.no_created_series()

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info(
            "device plugin starting",
            extra={"root": args.root, "plugin_dir": args.plugin_dir, "domain": args.domain},
        )
        return await serve(args, config, stop)

    return asyncio.run(main())
