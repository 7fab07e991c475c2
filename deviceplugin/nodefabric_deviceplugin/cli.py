"""`nodefabric deviceplugin`: serve the RDMA resources standalone, reading the host itself.

Inside `nodefabric agent` the same servers run fed by the agent's record; this command is for debugging
a node without the API server: it reads the host at --root every --interval seconds and serves until
SIGTERM or SIGINT. With --metrics-port it also serves /metrics, /healthz and /readyz on that port (the
probes on --health-port instead when given). Start-up problems are one log line and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from nodefabric_devicemanager import flags, hostpoll
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.shell import flags as shell_flags
from nodefabric_devicemanager.shell import server
from nodefabric_devicemanager.shell.errors import StartupError, refuse
from nodefabric_devicemanager.shell.flags import add_serving_arguments
from nodefabric_devicemanager.shell.signals import stop_on_signals
from nodefabric_deviceplugin.resources import PluginConfig
from nodefabric_deviceplugin.server import DevicePluginManager
from nodefabric_deviceplugin.source import RecordSource, poll_host
from nodefabric_deviceplugin.startup import add_plugin_arguments, config_from_args

log = logging.getLogger(__name__)

COMMAND = "deviceplugin"
# SIGTERM to exit: the servers stop at once (grace None) and a host read stuck in its thread is left to
# die with the process (shell.signals ends it STOP_GRACE_S after the signal at the latest).


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
    add_serving_arguments(parser, metrics_port=0)


async def serve(args: argparse.Namespace, config: PluginConfig, stop: asyncio.Event) -> int:
    host = HostRoot.at(args.root)
    source = RecordSource()
    manager = DevicePluginManager(source, host, config=config, plugin_dir=args.plugin_dir)
    # Bound before anything is served: a busy port is a start-up error (StartupError).
    async with server.ProbeServer(
        shell_flags.listen(args),
        metrics=server.exposition(),
        live=server.alive,
        ready=server.readiness(manager.readiness),
    ):
        await hostpoll.serve_beside(
            poll_host(source, host, interval=args.interval, stop=stop), manager.run(stop), stop
        )
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        if not os.path.isdir(args.root):
            raise StartupError(f"the host root {args.root} is not a directory")
        shell_flags.listen(args)  # an empty --bind-address
        config = config_from_args(args)
    except ValueError as exc:  # StartupError, and what PluginConfig refuses
        return refuse(log, COMMAND, exc)
    server.no_created_series()

    async def main() -> int:
        stop = asyncio.Event()
        with stop_on_signals(stop):
            log.info(
                "device plugin starting",
                extra={"root": args.root, "plugin_dir": args.plugin_dir, "domain": args.domain},
            )
            return await serve(args, config, stop)

    try:
        return asyncio.run(main())
    except StartupError as exc:  # a metrics or probe port that cannot be bound
        return refuse(log, COMMAND, exc)
