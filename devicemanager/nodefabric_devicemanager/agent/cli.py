"""`nodefabric agent`: the DaemonSet process. Publishes this node's Devices record and, unless told not
to, serves the RDMA device-plugin resources from it in the same process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

import prometheus_client
from kubernetes.config.config_exception import ConfigException

from nodefabric_devicemanager.agent.core import Agent, AgentConfig
from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.agent.metrics import AgentMetrics
from nodefabric_devicemanager.agent.serve import Servers
from nodefabric_devicemanager.agent.uevents import UeventWatch
from nodefabric_devicemanager.kubeclient import load_client

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_PASS_FAILED = 1
EXIT_USAGE = 2


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name; the Devices object is named after it (default: $NODE_NAME)",
    )
    parser.add_argument("--root", default="/", help="where the host's /sys and /dev are mounted (default: /)")
    parser.add_argument(
        "--interval", type=_positive, default=60.0, help="seconds between passes (default: 60)"
    )
    parser.add_argument(
        "--debounce",
        type=_positive,
        default=2.0,
        help="quiet seconds after a kernel uevent before a pass (default: 2)",
    )
    parser.add_argument(
        "--once", action="store_true", help="do one pass and exit: 0 when the record is up to date"
    )
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else $KUBECONFIG)"
    )
    parser.add_argument(
        "--bind-address", default="0.0.0.0", help="address for metrics and probes (default: 0.0.0.0)"
    )
    parser.add_argument(
        "--metrics-port", type=_port, default=9464, help="Prometheus /metrics port, 0 = off (default: 9464)"
    )
    parser.add_argument(
        "--health-port", type=_port, default=8081, help="/healthz and /readyz port, 0 = off (default: 8081)"
    )
    parser.add_argument(
        "--no-uevents", action="store_true", help="periodic passes only; ignore kernel uevents"
    )
    plugin = parser.add_argument_group("device plugin (served in-process from the agent's latest record)")
    plugin.add_argument("--no-device-plugin", action="store_true", help="do not serve the RDMA resources")
    plugin.add_argument(
        "--plugin-dir", default="/var/lib/kubelet/device-plugins", help="kubelet's device-plugin directory"
    )
    plugin.add_argument("--no-shared", action="store_true", help="do not serve device.<domain>/rdma.shared")
    plugin.add_argument(
        "--no-partitioned", action="store_true", help="do not serve device.<domain>/rdma.partitioned"
    )
    plugin.add_argument(
        "--shared-count", type=int, default=64, help="rdma.shared tokens per endpoint (default: 64)"
    )
    plugin.add_argument(
        "--domain", default="gpustack.ai", help="domain of the resource keys (default: gpustack.ai)"
    )
    _add_dra_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if not args.node_name:
        log.error("no node name: pass --node-name or set NODE_NAME (the downward API's spec.nodeName)")
        return EXIT_USAGE
    try:
        _dra_config(args)
    except ValueError as exc:
        log.error("invalid setting", extra={"error": str(exc)})
        return EXIT_USAGE
    if not os.path.isdir(args.root):
        log.error("the host root is not a directory", extra={"root": args.root})
        return EXIT_USAGE
    try:
        api_client = load_client(args.kubeconfig)
    except (ConfigException, OSError) as exc:
        log.error("cannot reach the kubernetes api", extra={"error": str(exc)})
        return EXIT_USAGE
    config = AgentConfig(node=args.node_name, root=args.root, interval=args.interval, debounce=args.debounce)
    agent = Agent(config, DevicesClient(api_client), metrics=AgentMetrics())
    try:
        if args.once:
            outcome = asyncio.run(agent.run_pass())
            return EXIT_OK if outcome.ok else EXIT_PASS_FAILED
        return asyncio.run(serve(agent, args))
    except ValueError as exc:  # a bad device-plugin setting (shared count, domain)
        log.error("invalid setting", extra={"error": str(exc)})
        return EXIT_USAGE
    finally:
        api_client.close()  # type: ignore[no-untyped-call]


def _plugin(agent: Agent, args: argparse.Namespace) -> Any:
    """The in-process device plugin fed by every pass, or None when it is turned off."""
    if args.no_device_plugin or args.serve == "dra":
        return None
    from nodefabric_deviceplugin.resources import PluginConfig
    from nodefabric_deviceplugin.server import DevicePluginManager
    from nodefabric_deviceplugin.source import RecordSource

    plugin_config = PluginConfig(
        domain=args.domain,
        shared_count=args.shared_count,
        shared=not args.no_shared,
        partitioned=not args.no_partitioned,
    )
    source = RecordSource()
    if args.serve == "both":
        from nodefabric_deviceplugin.dra.devices import device_plugin_share

        # Beside the DRA driver (whole functions) the device plugin serves only the VFs.
        agent.subscribe(lambda spec: source.update(device_plugin_share(spec) or spec))
    else:
        agent.subscribe(source.update)
    return DevicePluginManager(source, agent.host, config=plugin_config, plugin_dir=args.plugin_dir)


# --- the DRA driver (--serve dra|both) ---------------------------------------------------------------------


def _add_dra_arguments(parser: argparse.ArgumentParser) -> None:
    from nodefabric_deviceplugin.dra.flags import add_driver_arguments

    dra = parser.add_argument_group(
        "DRA driver rdma.<domain> (served in-process beside or instead of the plugin)"
    )
    dra.add_argument(
        "--serve",
        choices=["deviceplugin", "dra", "both"],
        default="deviceplugin",
        help="kubelet APIs to serve: the device plugin, the DRA driver, or both (DRA then offers the whole"
        " functions and the device plugin the VFs, so no endpoint is offered twice; default: deviceplugin)",
    )
    add_driver_arguments(dra, prefix="dra-")


def _dra_config(args: argparse.Namespace) -> Any:
    """The DRA driver's configuration, or None when it is not served. Raises ValueError."""
    if args.serve == "deviceplugin":
        return None
    if args.serve == "both" and args.no_device_plugin:
        raise ValueError("--serve both and --no-device-plugin contradict each other (use --serve dra)")
    from nodefabric_deviceplugin.dra.flags import config_from

    # Beside the device plugin the driver offers the whole functions; the VFs are the device plugin's.
    return config_from(args, functions=("pf",)) if args.serve == "both" else config_from(args)


def _dra(agent: Agent, args: argparse.Namespace) -> Any:
    """The in-process DRA driver fed by every pass, or None when it is not served."""
    config = _dra_config(args)
    if config is None:
        return None
    from nodefabric_deviceplugin.dra.driver import DraDriver
    from nodefabric_deviceplugin.dra.kube import DraApi
    from nodefabric_deviceplugin.source import RecordSource

    source = RecordSource()
    agent.subscribe(source.update)
    return DraDriver(config, source, agent.host, DraApi(load_client(args.kubeconfig), config))


async def serve(agent: Agent, args: argparse.Namespace, stop: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or `stop`): passes, uevents, metrics and probes, the device plugin."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    plugin = _plugin(agent, args)
    dra = _dra(agent, args)
    servers = Servers()
    watch = UeventWatch(agent.trigger)
    tasks: list[asyncio.Task[None]] = []
    try:
        await servers.start(
            host=args.bind_address,
            metrics_port=args.metrics_port,
            health_port=args.health_port,
            registries=(agent.metrics.registry, prometheus_client.REGISTRY),
            live=agent.liveness,
            ready=agent.readiness,
        )
        if not args.no_uevents:
            watch.start(loop)
        log.info(
            "agent started",
            extra={
                "node": agent.config.node,
                "root": agent.host.root,
                "interval_s": agent.config.interval,
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
                extra={"node": agent.config.node, "part": task.get_name(), "error": repr(exc)},
            )
        stop.set()
        log.info("stopping", extra={"node": agent.config.node})
        _, pending = await asyncio.wait(tasks, timeout=5)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return EXIT_PASS_FAILED if failed else EXIT_OK
    finally:
        watch.stop(loop)
        await servers.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)
        log.info("stopped", extra={"node": agent.config.node})


__all__ = ["add_arguments", "run", "serve"]
