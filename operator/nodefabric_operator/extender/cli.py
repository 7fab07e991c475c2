"""`nodefabric extender`: serve the kube-scheduler extender."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from kubernetes import client
from kubernetes import config as _kube_config

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.extender.cache import Cache, SnapshotError
from nodefabric_operator.extender.config import ConfigError, ExtenderConfig, load_config
from nodefabric_operator.extender.events import KubeEvents
from nodefabric_operator.extender.server import make_app, tls_context
from nodefabric_operator.extender.service import Extender
from nodefabric_operator.extender.watch import Watcher

log = logging.getLogger(__name__)
kube_config: Any = _kube_config  # untyped in the client


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML configuration (levels, label keys, defaults)")
    parser.add_argument("--address", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8888, help="port to listen on (default 8888)")
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


def serving_app(
    cfg: ExtenderConfig, cache: Cache, api: client.ApiClient | None, *, watch: bool
) -> web.Application:
    """The extender as deployed: Events through `api`, and (with `watch`) its cache fed by list+watch."""
    events = KubeEvents(client.CoreV1Api(api)) if api is not None else None
    extender = Extender(cfg, cache, events=events)
    app = make_app(extender)
    if api is not None and watch:
        watcher = Watcher(cache, extender.book, api)

        async def watching(_: web.Application) -> AsyncIterator[None]:
            watcher.start(asyncio.get_running_loop())
            yield
            watcher.stop()

        app.cleanup_ctx.append(watching)
    return app


def run(args: argparse.Namespace) -> int:
    if (args.tls_cert is None) != (args.tls_key is None):
        log.error("--tls-cert and --tls-key go together")
        return 2
    try:
        cfg = load_config(args.config)
        cache = Cache(cfg)
        if args.nodes_file is not None:
            cache.load_file(args.nodes_file)
        api = load_client(args.kubeconfig) if args.nodes_file is None or args.kubeconfig is not None else None
        ssl_ctx = tls_context(args.tls_cert, args.tls_key) if args.tls_cert else None
    except (ConfigError, SnapshotError, kube_config.ConfigException, OSError) as exc:
        log.error("extender cannot start", extra={"error": str(exc)})
        return 2

    app = serving_app(cfg, cache, api, watch=args.nodes_file is None)
    log.info(
        "extender listening",
        extra={
            "address": args.address,
            "port": args.port,
            "tls": ssl_ctx is not None,
            "cache": str(args.nodes_file) if args.nodes_file else "watch",
            "nodes": len(cache.nodes),
        },
    )
    web.run_app(app, host=args.address, port=args.port, ssl_context=ssl_ctx, print=None, access_log=None)
    return 0
