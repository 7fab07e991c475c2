"""`nodefabric draplugin`: run the DRA driver standalone, reading the host itself.

Inside `nodefabric agent` the same driver runs fed by the agent's record; this command serves a node
without the agent (or for debugging): it reads the host at --root every --interval seconds, publishes the
node's ResourceSlices and serves kubelet until SIGTERM or SIGINT. With --metrics-port it serves /metrics,
/healthz and /readyz there (the probes on --health-port instead when given). Start-up problems are one
log line ("draplugin cannot start") and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from nodefabric_devicemanager import flags, hostpoll, nodeclient
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.shell import flags as shell_flags
from nodefabric_devicemanager.shell import server
from nodefabric_devicemanager.shell.errors import StartupError, refuse
from nodefabric_devicemanager.shell.flags import Listen, add_serving_arguments
from nodefabric_devicemanager.shell.signals import stop_on_signals
from nodefabric_deviceplugin.dra.config import DEFAULT_DOMAIN, DriverConfig
from nodefabric_deviceplugin.dra.driver import DraDriver
from nodefabric_deviceplugin.dra.flags import add_driver_arguments, config_from
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_deviceplugin.dra.publish import DEFAULT_RESYNC_S
from nodefabric_deviceplugin.dra.standalone import poll_record
from nodefabric_deviceplugin.source import RecordSource

log = logging.getLogger(__name__)

COMMAND = "draplugin"
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
    add_serving_arguments(parser, metrics_port=0)


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from(args)
        if not os.path.isdir(args.root):
            raise StartupError(f"the host root {args.root} is not a directory")
        where = shell_flags.listen(args)
        try:
            api = nodeclient.load(args.kubeconfig, user_agent=USER_AGENT)
        except nodeclient.ConfigError as exc:
            raise StartupError(f"cannot reach the kubernetes api: {exc}") from exc
    except ValueError as exc:  # StartupError, and the checks of the driver's configuration
        return refuse(log, COMMAND, exc)
    server.no_created_series()
    try:
        return asyncio.run(serve(args, config, api, where))
    except StartupError as exc:  # a metrics or probe port that cannot be bound
        return refuse(log, COMMAND, exc)
    finally:
        api.close()


async def serve(args: argparse.Namespace, config: DriverConfig, api: nodeclient.Api, where: Listen) -> int:
    """Serve until SIGTERM or SIGINT: the host polled into the record, the driver's sockets and slices,
    /metrics and the probes (ready once kubelet registered the driver)."""
    stop = asyncio.Event()
    host = HostRoot.at(args.root)
    source = RecordSource()
    driver = DraDriver(config, source, host, DraApi(api, config), resync=args.resync)
    with stop_on_signals(stop, node=config.node_name):
        async with server.ProbeServer(
            where, metrics=server.exposition(), live=server.alive, ready=server.readiness(driver.readiness)
        ):
            log.info(
                "DRA driver starting",
                extra={
                    "driver": config.driver,
                    "node": config.node_name,
                    "root": args.root,
                    "cdi_dir": config.cdi_dir,
                },
            )
            await hostpoll.serve_beside(
                poll_record(source, host, interval=args.interval, stop=stop), driver.run(stop), stop
            )
    return 0
