"""`nodefabric draplugin`: run the DRA driver standalone, reading the host itself.

Inside `nodefabric agent` the same driver runs fed by the agent's record; this command serves a node
without the agent (or for debugging): it reads the host at --root every --interval seconds, publishes the
node's ResourceSlices and serves kubelet until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from nodefabric_devicemanager import flags, nodeclient
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_deviceplugin.dra.config import DEFAULT_DOMAIN
from nodefabric_deviceplugin.dra.driver import DraDriver
from nodefabric_deviceplugin.dra.flags import add_driver_arguments, config_from
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_deviceplugin.dra.publish import DEFAULT_RESYNC_S
from nodefabric_deviceplugin.dra.standalone import poll_record
from nodefabric_deviceplugin.source import RecordSource

log = logging.getLogger(__name__)

EXIT_USAGE = 2
USER_AGENT = "nodefabric-draplugin"
_seconds = flags.seconds(most=86400)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default="/", help="the host's root as mounted here (default /)")
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name: the pool and the slices' nodeName (default: $NODE_NAME)",
    )
    add_driver_arguments(parser)
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else $KUBECONFIG)"
    )
    parser.add_argument(
        "--domain", default=DEFAULT_DOMAIN, help=f"the driver is rdma.<domain> (default {DEFAULT_DOMAIN})"
    )
    parser.add_argument(
        "--interval",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="host re-read interval (default 10)",
    )
    parser.add_argument(
        "--resync",
        type=_seconds,
        default=DEFAULT_RESYNC_S,
        metavar="SECONDS",
        help=(
            "compare the ResourceSlices (as the watch last told them) with the record this often; costs no"
            f" API request (default {DEFAULT_RESYNC_S:g})"
        ),
    )
    parser.add_argument(
        "--metrics-port",
        type=flags.port,
        default=0,
        metavar="PORT",
        help="serve Prometheus metrics here (0: off)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"nodefabric draplugin: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not os.path.isdir(args.root):
        print(f"nodefabric draplugin: the host root {args.root} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    try:
        api = nodeclient.load(args.kubeconfig, user_agent=USER_AGENT)
    except nodeclient.ConfigError as exc:
        print(f"nodefabric draplugin: cannot reach the kubernetes api: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.metrics_port:
        from prometheus_client import start_http_server

        try:
            start_http_server(args.metrics_port)
        except OSError as exc:  # in use, or not ours to bind
            print(
                f"nodefabric draplugin: cannot serve metrics on port {args.metrics_port}: "
                f"{exc.strerror or exc}",
                file=sys.stderr,
            )
            api.close()
            return EXIT_USAGE

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        host = HostRoot.at(args.root)
        source = RecordSource()
        driver = DraDriver(config, source, host, DraApi(api, config), resync=args.resync)
        log.info(
            "DRA driver starting",
            extra={
                "driver": config.driver,
                "node": config.node_name,
                "root": args.root,
                "cdi_dir": config.cdi_dir,
            },
        )
        poller = asyncio.create_task(poll_record(source, host, interval=args.interval, stop=stop))
        try:
            await driver.run(stop)
        finally:
            stop.set()
            await poller

    try:
        asyncio.run(main())
    finally:
        api.close()
    return 0
