"""`nodefabric placement`: admit whole groups by removing their scheduling gates (leader-elected).

Every replica serves the probes (and the mutating webhook, when built in and given a certificate); only the
replica holding the Lease `nodefabric-placement` admits. Start-up problems are one line on stderr and exit
status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web
from kubernetes import config as _kube_config

from nodefabric_devicemanager import flags
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.admission.controller import Controller
from nodefabric_operator.admission.leader import LEASE_NAME, LeaderElector
from nodefabric_operator.admission.metrics import PlacementMetrics
from nodefabric_operator.admission.webhook import build_webhook_app, ssl_context
from nodefabric_operator.extender.config import ConfigError, ExtenderConfig, load_config
from nodefabric_operator.extender.server import runner
from nodefabric_operator.probes import add_probes

log = logging.getLogger(__name__)
kube_config: Any = _kube_config  # untyped in the client
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
    parser.add_argument(
        "--metrics-address",
        default="0.0.0.0",
        help="address of /metrics, /healthz, /readyz (default 0.0.0.0)",
    )
    parser.add_argument(
        "--metrics-port",
        type=flags.port,
        default=8080,
        help="port of /metrics, /healthz, /readyz (default 8080; 0: none)",
    )
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


async def serve(
    cfg: ExtenderConfig,
    api: Any,
    args: argparse.Namespace,
    tls: ssl.SSLContext | None,
    stop: asyncio.Event | None = None,
) -> int:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
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
    runners: list[web.AppRunner] = []
    if args.metrics_port:
        probe = add_probes(
            web.Application(),
            health=lambda: controller.watcher.problems(args.unhealthy_after),
            ready=lambda: (
                None if controller.cache.synced else "node, pod and PlacementGroup caches not synced yet"
            ),
            registry=lambda: metrics.registry,
        )
        runners.append(runner(probe))
    # The webhook serves on every replica (the API server calls any of them); only the leader admits.
    hook = build_webhook_app(cfg) if tls is not None else None
    if hook is not None:
        runners.append(runner(hook))
    try:
        for r in runners:
            await r.setup()
        if args.metrics_port:
            await web.TCPSite(runners[0], args.metrics_address, args.metrics_port).start()
        if hook is not None:
            await web.TCPSite(runners[-1], "0.0.0.0", args.webhook_port, ssl_context=tls).start()
    except OSError as exc:
        log.error("placement cannot start", extra={"error": f"cannot listen: {exc}"})
        for r in runners:
            await r.cleanup()
        return 2
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
        for r in reversed(runners):
            await r.cleanup()
    return 0


def run(args: argparse.Namespace) -> int:
    problem = check(args)
    if problem:
        log.error("placement cannot start", extra={"error": problem})
        return 2
    try:
        cfg = load_config(args.config)
        api = load_client(args.kubeconfig)
        # Follows the files as cert-manager or the chart rotates them.
        tls = ssl_context(args.tls_cert_file, args.tls_private_key_file) if args.tls_cert_file else None
    except (ConfigError, kube_config.ConfigException, OSError, ssl.SSLError) as exc:
        log.error("placement cannot start", extra={"error": str(exc)})
        return 2
    return asyncio.run(serve(cfg, api, args, tls))
