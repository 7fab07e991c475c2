"""`nodefabric extender`: serve the kube-scheduler extender.

Nobody but kube-scheduler may reach the verbs: they listen on 127.0.0.1 (the chart runs the extender
beside kube-scheduler in one pod), or on another address only with TLS that verifies the client's
certificate. Start-up problems are one log line ("extender cannot start") and exit status 2. /metrics,
/healthz and /readyz are served on --bind-address:--metrics-port as well (the probes on --health-port
instead when given).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import ipaddress
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from kubernetes import client
from kubernetes import config as _kube_config

from nodefabric_devicemanager import flags
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_devicemanager.shell import flags as shell_flags
from nodefabric_devicemanager.shell import server as shell
from nodefabric_devicemanager.shell.errors import StartupError, refuse
from nodefabric_devicemanager.shell.flags import add_serving_arguments
from nodefabric_devicemanager.shell.signals import stop_on_signals
from nodefabric_operator.extender.cache import Cache, SnapshotError
from nodefabric_operator.extender.config import ConfigError, ExtenderConfig, load_config
from nodefabric_operator.extender.events import KubePublisher
from nodefabric_operator.extender.server import (
    IN_FLIGHT_BODIES,
    MAX_BODY,
    READ_TIMEOUT_S,
    SERVING,
    Serving,
    health,
    make_app,
    ready,
    runner,
    tls_context,
)
from nodefabric_operator.extender.service import Extender
from nodefabric_operator.extender.watch import Watcher

log = logging.getLogger(__name__)
kube_config: Any = _kube_config  # untyped in the client
COMMAND = "extender"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML configuration (levels, label keys, defaults)")
    parser.add_argument(
        "--address",
        default="127.0.0.1",
        help="address of filter/prioritize (default 127.0.0.1; any other needs --tls-client-ca)",
    )
    parser.add_argument(
        "--port", type=flags.port, default=8888, help="port of filter/prioritize (default 8888)"
    )
    add_serving_arguments(parser, metrics_port=0)
    parser.add_argument(
        "--nodes-file",
        type=Path,
        help="static cache: a JSON/YAML List of Node (and Pod, PodGroup) objects instead of watching the API",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    parser.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, help="private key of --tls-cert (PEM)")
    parser.add_argument(
        "--tls-client-ca",
        type=Path,
        help="accept only clients whose certificate this CA bundle signed (PEM); needs --tls-cert",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=flags.count,
        default=MAX_BODY,
        help=f"largest request body accepted (default {MAX_BODY})",
    )
    parser.add_argument(
        "--max-in-flight-bytes",
        type=flags.count,
        default=None,
        help="bytes of request bodies read at once; past them a request is answered 503 "
        f"(default {IN_FLIGHT_BODIES} x --max-request-bytes)",
    )
    parser.add_argument(
        "--read-timeout",
        type=flags.seconds(),
        default=READ_TIMEOUT_S,
        help=f"seconds to receive a request body before dropping it (default {READ_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--unhealthy-after",
        type=flags.seconds(),
        default=120.0,
        help="seconds a broken node or pod watch is tolerated before /healthz fails (default 120)",
    )


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def check(args: argparse.Namespace) -> str | None:
    """The flags' combination, or what is wrong with it."""
    if (args.tls_cert is None) != (args.tls_key is None):
        return "--tls-cert and --tls-key go together"
    if args.tls_client_ca is not None and args.tls_cert is None:
        return "--tls-client-ca needs --tls-cert and --tls-key"
    if not _loopback(args.address) and args.tls_client_ca is None:
        return (
            f"--address {args.address} would let any pod that reaches it steer placement: listen on "
            "127.0.0.1 beside kube-scheduler, or verify clients with --tls-cert, --tls-key and "
            "--tls-client-ca"
        )
    if args.max_request_bytes < 1024:
        return f"--max-request-bytes must be at least 1024, got {args.max_request_bytes}"
    if args.max_in_flight_bytes is not None and args.max_in_flight_bytes < args.max_request_bytes:
        return (
            f"--max-in-flight-bytes must hold one body (--max-request-bytes, {args.max_request_bytes}), "
            f"got {args.max_in_flight_bytes}"
        )
    return None


def serving_app(
    cfg: ExtenderConfig,
    cache: Cache,
    api: client.ApiClient | None,
    *,
    watch: bool,
    serving: Serving | None = None,
    unhealthy_after: float = 120.0,
) -> tuple[web.Application, Extender]:
    """The extender as deployed: verdicts written through `api`, and (with `watch`) its cache fed by
    list+watch, whose broken feeds fail /healthz after `unhealthy_after` seconds."""
    extender = Extender(cfg, cache)
    if api is not None:
        extender.publisher = KubePublisher(client.CoreV1Api(api), extender.metrics.registry)
    serving = serving or Serving()
    if api is None or not watch:
        return make_app(extender, serving), extender
    watcher = Watcher(cache, extender.book, api)
    serving = dataclasses.replace(serving, health=lambda: watcher.problems(unhealthy_after))
    app = make_app(extender, serving)

    async def watching(_: web.Application) -> AsyncIterator[None]:
        watcher.start(asyncio.get_running_loop())
        yield
        watcher.stop()

    app.cleanup_ctx.append(watching)
    return app, extender


async def _serve(
    app: web.Application,
    probes: shell.ProbeServer,
    args: argparse.Namespace,
    tls: ssl.SSLContext | None,
) -> int:
    verbs = runner(app)
    stop = asyncio.Event()
    with stop_on_signals(stop):
        try:
            await verbs.setup()
            try:
                await web.TCPSite(verbs, args.address, args.port, ssl_context=tls).start()
            except OSError as exc:
                raise StartupError(f"cannot listen: {exc}") from exc
            await probes.start()
        except StartupError as exc:
            await verbs.cleanup()
            return refuse(log, COMMAND, exc)
        log.info(
            "extender listening",
            extra={
                "address": args.address,
                "port": args.port,
                "metrics_port": args.metrics_port or None,
                "tls": tls is not None,
                "client_certificates": args.tls_client_ca is not None,
                "cache": str(args.nodes_file) if args.nodes_file else "watch",
            },
        )
        await stop.wait()
        await probes.stop()
        await verbs.cleanup()
    return 0


def run(args: argparse.Namespace) -> int:
    problem = check(args)
    if problem:
        return refuse(log, COMMAND, problem)
    try:
        where = shell_flags.listen(args)
        cfg = load_config(args.config)
        cache = Cache(cfg)
        if args.nodes_file is not None:
            cache.load_file(args.nodes_file)
        api = load_client(args.kubeconfig) if args.nodes_file is None or args.kubeconfig is not None else None
        tls = tls_context(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    except (
        ConfigError,
        SnapshotError,
        kube_config.ConfigException,
        OSError,
        ssl.SSLError,
        ValueError,
    ) as exc:
        return refuse(log, COMMAND, exc)
    serving = Serving(
        max_body=args.max_request_bytes,
        read_timeout=args.read_timeout,
        max_in_flight=args.max_in_flight_bytes,
    )
    app, extender = serving_app(
        cfg, cache, api, watch=args.nodes_file is None, serving=serving, unhealthy_after=args.unhealthy_after
    )
    probes = shell.ProbeServer(
        where,
        metrics=shell.exposition(extender.metrics.registry),
        live=health(app[SERVING]),
        ready=ready(extender),
    )
    return asyncio.run(_serve(app, probes, args, tls))
