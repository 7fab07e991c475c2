"""`nodefabric agent`: the DaemonSet process. Publishes this node's Devices record and serves kubelet
from it in the same process: the RDMA device-plugin resources, the DRA driver, or both (`--serve`).

Start-up problems (a bad flag value, an unusable plugin directory, a busy port, credentials that cannot
be loaded) are one log line ("agent cannot start") and exit 2. SIGTERM stops it within
`shell.signals.STOP_GRACE_S` seconds, whatever a worker thread is stuck in.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
from collections.abc import Callable

import prometheus_client

from nodefabric_devicemanager import buildinfo, flags, logs, names, nodeclient
from nodefabric_devicemanager.agent import heap, wiring
from nodefabric_devicemanager.agent.core import Agent, AgentConfig, Reader, default_reader
from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.agent.metrics import AgentMetrics
from nodefabric_devicemanager.agent.uevents import UeventWatch
from nodefabric_devicemanager.models import ACCELERATORS_ENUMERATED, INTERFACES_ENUMERATED
from nodefabric_devicemanager.shell import flags as shell_flags
from nodefabric_devicemanager.shell import server as shell_server
from nodefabric_devicemanager.shell.errors import StartupError, refuse
from nodefabric_devicemanager.shell.flags import add_serving_arguments
from nodefabric_devicemanager.shell.probe import Probe
from nodefabric_devicemanager.shell.signals import stop_on_signals

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_PASS_FAILED = 1
# A connection to the metrics or probe port that sends no complete request within this long is closed.
IDLE_TIMEOUT_S = 5.0
# The parts are told to stop, and waited for this long before being cancelled.
_PART_STOP_S = 3.0
_seconds = flags.seconds(most=7 * 24 * 3600.0)
COMMAND = "agent"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name; the Devices object is named after it (default: $NODE_NAME)",
    )
    parser.add_argument("--root", default="/", help="where the host's /sys and /dev are mounted (default: /)")
    parser.add_argument(
        "--driver-root",
        default=os.environ.get("NVIDIA_DRIVER_ROOT", ""),
        help="where the NVIDIA driver is mounted, to load NVML from (/run/nvidia/driver under the GPU "
        "Operator; default: $NVIDIA_DRIVER_ROOT, else the library search path)",
    )
    parser.add_argument(
        "--interval",
        type=_seconds,
        default=60.0,
        help="seconds between link refreshes: RDMA port state and interface operstate (default: 60)",
    )
    parser.add_argument(
        "--walk-interval",
        type=_seconds,
        default=600.0,
        help="seconds between full walks of the host when no kernel uevent asked for one (default: 600)",
    )
    parser.add_argument(
        "--read-timeout",
        type=_seconds,
        default=60.0,
        help="a host read still running after this many seconds fails the pass (default: 60)",
    )
    parser.add_argument(
        "--debounce",
        type=_seconds,
        default=2.0,
        help="quiet seconds after a kernel uevent before the walk (default: 2)",
    )
    parser.add_argument(
        "--once", action="store_true", help="walk once, publish, exit: 0 when the record is up to date"
    )
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else $KUBECONFIG)"
    )
    add_serving_arguments(parser, metrics_port=9464, health_port=8081)
    parser.add_argument(
        "--no-uevents", action="store_true", help="no walks on kernel uevents; periodic passes only"
    )
    plugin = parser.add_argument_group("device plugin (served in-process from the agent's latest record)")
    plugin.add_argument("--no-device-plugin", action="store_true", help="do not serve the RDMA resources")
    wiring.add_plugin_arguments(plugin)  # no grpc: flags and checks only
    dra = parser.add_argument_group(
        "DRA driver rdma.<domain> (served in-process beside or instead of the plugin)"
    )
    dra.add_argument(
        "--serve",
        choices=wiring.SERVE,
        default="deviceplugin",
        help="kubelet APIs to serve: the device plugin, the DRA driver, or both (DRA then offers the whole"
        " functions and the device plugin the VFs, so no endpoint is offered twice; default: deviceplugin)",
    )
    wiring.add_driver_arguments(dra)


# --- start-up checks ---------------------------------------------------------------------------------


def reader_for(driver_root: str) -> Reader:
    """The host reader, loading NVML from `driver_root` when one is given (as `inventory --driver-root`)."""
    if not driver_root:
        return default_reader
    from nodefabric_devicemanager import inventory

    return functools.partial(inventory.read, driver_root=driver_root)


def _check(args: argparse.Namespace) -> wiring.Serving:
    """What the node serves to kubelet: the device plugin's and the DRA driver's settings (None for one
    not served). Raises StartupError."""
    if not args.node_name:
        raise StartupError(
            "no node name: pass --node-name or set NODE_NAME (the downward API's spec.nodeName)"
        )
    if not names.dns_subdomain(args.node_name):
        raise StartupError(f"--node-name {args.node_name!r} is not a Kubernetes node name (a DNS subdomain)")
    if not os.path.isdir(args.root):
        raise StartupError(f"--root {args.root} is not a directory")
    if args.driver_root and not os.path.isdir(args.driver_root):
        raise StartupError(f"--driver-root {args.driver_root} is not a directory")
    try:
        return wiring.serving(args)
    except wiring.ConfigError as exc:
        raise StartupError(str(exc)) from exc


def run(args: argparse.Namespace) -> int:
    logs.default_fields(node=args.node_name)
    try:
        serving = _check(args)
        shell_flags.listen(args)  # an empty --bind-address
        api = nodeclient.load(args.kubeconfig)
    except ValueError as exc:  # StartupError, nodeclient.ConfigError
        return refuse(log, COMMAND, exc, node=args.node_name)
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    buildinfo.register("agent")
    heap.one_arena()  # before any of the agent's threads start (see heap.py)
    metrics = AgentMetrics()
    metrics.count_api(api)
    config = AgentConfig(
        node=args.node_name,
        root=args.root,
        interval=args.interval,
        walk_interval=args.walk_interval,
        read_timeout=args.read_timeout,
        debounce=args.debounce,
        watch=not args.once,
    )
    agent = Agent(config, DevicesClient(api), reader=reader_for(args.driver_root), metrics=metrics)
    try:
        if args.once:
            outcome = asyncio.run(agent.run_pass())
            # A part of the host that could not be enumerated is a failed pass for --once (as for
            # `inventory`), even though the record was published with what could be read.
            unread = {INTERFACES_ENUMERATED, ACCELERATORS_ENUMERATED} & set(outcome.degraded)
            return EXIT_OK if outcome.ok and not unread else EXIT_PASS_FAILED
        return asyncio.run(serve(agent, args, serving))
    except StartupError as exc:  # a port that cannot be bound: in use, or an address not on this node
        return refuse(log, COMMAND, exc, node=args.node_name)
    except OSError as exc:  # the uevent socket, or another start-up resource this host refuses
        return refuse(log, COMMAND, exc.strerror or exc, node=args.node_name)
    finally:
        api.close()


# --- the long-running process --------------------------------------------------------------------------


def _ready(agent: Agent, servers: wiring.NodeServers) -> Callable[[], Probe]:
    """The agent's readiness, and that of the kubelet-facing servers in process (the device plugin, the
    DRA driver): kubelet accepted each."""

    def ready() -> Probe:
        probe = agent.readiness()
        if not probe.ok:
            return probe
        for server in (servers.plugin, servers.dra):
            if server is not None:
                ok, message = server.readiness()  # from memory, no I/O: safe on the event loop
                if not ok:
                    return Probe(False, str(message))
        return probe

    return ready


async def serve(
    agent: Agent,
    args: argparse.Namespace,
    serving: wiring.Serving,
    stop: asyncio.Event | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (or `stop`): passes, uevents, metrics and probes, the device plugin and
    the DRA driver."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    node = agent.config.node
    servers = wiring.build(agent, serving)
    plugin, dra = servers.plugin, servers.dra
    probes = shell_server.ProbeServer(
        shell_flags.listen(args),
        metrics=shell_server.exposition(agent.metrics.registry, prometheus_client.REGISTRY),
        live=agent.liveness,
        ready=_ready(agent, servers),
        # On the host network these ports are reachable from the node's network: silent clients go sooner.
        idle_timeout=IDLE_TIMEOUT_S,
    )
    watch = UeventWatch(agent.trigger)
    tasks: list[asyncio.Task[None]] = []
    with stop_on_signals(stop, node=node):
        # Before anything runs: a port that cannot be bound is a start-up error (exit 2).
        await probes.start()
        try:
            if not args.no_uevents:
                watch.start(loop)
            log.info(
                "agent started",
                extra={
                    "node": node,
                    "root": agent.host.root,
                    "interval_s": agent.config.interval,
                    "walk_interval_s": agent.config.walk_interval,
                    "device_plugin": plugin is not None,
                    "dra_driver": dra is not None,
                },
            )
            tasks.append(asyncio.create_task(agent.run(stop), name="agent-passes"))
            if plugin is not None:
                tasks.append(asyncio.create_task(plugin.run(stop), name="device-plugin"))
            if dra is not None:
                tasks.append(asyncio.create_task(dra.run(stop), name="dra-driver"))
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            failed = [t for t in tasks if t.done()]
            for task in failed:
                exc = None if task.cancelled() else task.exception()
                log.error(
                    "a part of the agent ended on its own; stopping so the pod restarts",
                    extra={"node": node, "part": task.get_name(), "error": repr(exc)},
                )
            stop.set()
            _, pending = await asyncio.wait(tasks, timeout=_PART_STOP_S) if tasks else (set(), set())
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return EXIT_PASS_FAILED if failed else EXIT_OK
        finally:
            watch.stop(loop)
            await probes.stop()
            log.info("stopped", extra={"node": node})


__all__ = ["add_arguments", "run", "serve"]
