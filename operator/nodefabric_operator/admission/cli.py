"""`nodefabric placement`: admit whole groups by removing their scheduling gates (leader-elected).

Every replica serves the probes (and the mutating webhook, when built in and given a certificate); only the
replica holding the Lease `nodefabric-placement` admits. Start-up problems are one log line ("placement
cannot start") and exit status 2. /metrics, /healthz and /readyz are served on --bind-address:--metrics-port
(the probes on --health-port instead when given).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web
from kubernetes import config as _kube_config

from nodefabric_devicemanager import flags
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_devicemanager.shell import flags as shell_flags
from nodefabric_devicemanager.shell import server as shell
from nodefabric_devicemanager.shell.errors import StartupError, refuse
from nodefabric_devicemanager.shell.flags import add_serving_arguments
from nodefabric_devicemanager.shell.signals import stop_on_signals
from nodefabric_operator.admission.controller import Controller
from nodefabric_operator.admission.leader import LEASE_NAME, LeaderElector
from nodefabric_operator.admission.metrics import PlacementMetrics
from nodefabric_operator.admission.webhook import build_webhook_app, ssl_context
from nodefabric_operator.extender.config import ConfigError, ExtenderConfig, load_config
from nodefabric_operator.extender.server import runner

log = logging.getLogger(__name__)
kube_config: Any = _kube_config  # untyped in the client
COMMAND = "placement"
SERVICE_ACCOUNT_NS = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    parser.add_argument(
        "--config", type=Path, help="YAML configuration, the extender's file (levels, timeout)"
    )
    parser.add_argument(
        "--namespace",
        help="namespace of the Lease (default: $POD_NAMESPACE, the service account's, else nodefabric)",
    )
    parser.add_argument(
        "--identity", help="this replica's name in the Lease (default: $POD_NAME, else hostname and pid)"
    )
    parser.add_argument(
        "--lease-duration",
        type=flags.seconds(3600),
        default=15.0,
        help="seconds a silent leader keeps the Lease (default 15)",
    )
    add_serving_arguments(parser, metrics_port=8080)
    parser.add_argument(
        "--webhook-port",
        type=flags.port,
        default=9443,
        help="port of the mutating webhook (HTTPS; default 9443)",
    )
    parser.add_argument("--tls-cert-file", type=Path, help="the webhook's certificate (PEM)")
    parser.add_argument("--tls-private-key-file", type=Path, help="private key of --tls-cert-file (PEM)")
    parser.add_argument(
        "--unhealthy-after",
        type=flags.seconds(),
        default=120.0,
        help="seconds a broken watch is tolerated before /healthz fails (default 120)",
    )


def _namespace(args: argparse.Namespace) -> str:
    if args.namespace:
        return str(args.namespace)
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    try:
        return SERVICE_ACCOUNT_NS.read_text().strip() or "nodefabric"
    except OSError:
        return "nodefabric"


def check(args: argparse.Namespace) -> str | None:
    if (args.tls_cert_file is None) != (args.tls_private_key_file is None):
        return "--tls-cert-file and --tls-private-key-file go together"
    return None


def _health(controller: Controller, unhealthy_after: float) -> shell.ProbeFn:
    def probe() -> shell.Probe:
        problems = controller.watcher.problems(unhealthy_after)
        return shell.Probe(not problems, "\n".join(problems or ["ok"]) + "\n")

    return probe


def _ready(controller: Controller) -> shell.Probe:
    if controller.cache.synced:
        return shell.Probe(True, "ok\n")
    return shell.Probe(False, "node, pod and PlacementGroup caches not synced yet\n")


async def serve(
    cfg: ExtenderConfig,
    api: Any,
    args: argparse.Namespace,
    tls: ssl.SSLContext | None,
    stop: asyncio.Event | None = None,
) -> int:
    stop = stop or asyncio.Event()
    with stop_on_signals(stop):
        try:
            return await _serve(cfg, api, args, tls, stop)
        except StartupError as exc:
            return refuse(log, COMMAND, exc)


async def _serve(
    cfg: ExtenderConfig, api: Any, args: argparse.Namespace, tls: ssl.SSLContext | None, stop: asyncio.Event
) -> int:
    metrics = PlacementMetrics()
    identity = args.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    elector = LeaderElector(
        api,
        _namespace(args),
        identity,
        lease_s=max(1, int(args.lease_duration)),
        renew_s=max(0.5, args.lease_duration / 3),
    )
    controller = Controller(cfg, api, metrics=metrics, leading=lambda: elector.leading)
    probes = shell.ProbeServer(
        shell_flags.listen(args),
        metrics=shell.exposition(metrics.registry),
        live=_health(controller, args.unhealthy_after),
        ready=lambda: _ready(controller),
    )
    await probes.start()
    # The webhook serves on every replica (the API server calls any of them); only the leader admits.
    hook = runner(build_webhook_app(cfg)) if tls is not None else None
    try:
        if hook is not None:
            await hook.setup()
            try:
                await web.TCPSite(hook, "0.0.0.0", args.webhook_port, ssl_context=tls).start()
            except OSError as exc:
                raise StartupError(f"cannot listen: {exc}") from exc
        log.info(
            "placement started",
            extra={
                "identity": identity,
                "lease": f"{elector.namespace}/{LEASE_NAME}",
                "metrics_port": args.metrics_port or None,
                "webhook": args.webhook_port if hook is not None else None,
                "timeout_s": cfg.group_ready_timeout_seconds,
            },
        )

        async def wake_on_leading() -> None:
            while not stop.is_set():
                await elector.changed.wait()
                elector.changed.clear()
                metrics.leader.set(1 if elector.leading else 0)
                controller.wake.set()

        waker = asyncio.create_task(wake_on_leading())
        try:
            await asyncio.gather(elector.run(stop), controller.run(stop))
        finally:
            waker.cancel()
    finally:
        if hook is not None:
            await hook.cleanup()
        await probes.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    problem = check(args)
    if problem:
        return refuse(log, COMMAND, problem)
    try:
        shell_flags.listen(args)  # an empty --bind-address
        cfg = load_config(args.config)
        api = load_client(args.kubeconfig)
        # Follows the files as cert-manager or the chart rotates them.
        tls = ssl_context(args.tls_cert_file, args.tls_private_key_file) if args.tls_cert_file else None
    except (ConfigError, kube_config.ConfigException, OSError, ssl.SSLError, ValueError) as exc:
        return refuse(log, COMMAND, exc)
    return asyncio.run(serve(cfg, api, args, tls))
