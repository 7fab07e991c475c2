"""`nodefabric operator`: publish node labels from Devices objects (kopf).

One active replica: kopf peering (a ClusterKopfPeering object, `--peering`) pauses every replica that
sees a peer of the same priority, so run one replica (a standby with a lower `--priority` takes over
when it goes), or `--standalone` where exactly one replica is guaranteed by other means.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import kopf
import kubernetes
from kubernetes.config.config_exception import ConfigException

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator import handlers, labels, sinks
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.reconcile import DEFAULT_BACKOFFS, Reconciler

log = logging.getLogger(__name__)

SINKS = ("nodefeature", "node")


@dataclass(frozen=True)
class Options:
    sink: str = "nodefeature"
    namespace: str = "nodefabric"
    domain: str = labels.DEFAULT_DOMAIN
    kubeconfig: str | None = None
    metrics_port: int | None = None
    health_port: int | None = None
    standalone: bool = False
    peering: str = "nodefabric"
    priority: int = 0
    backoffs: Sequence[float] = DEFAULT_BACKOFFS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sink",
        choices=SINKS,
        default="nodefeature",
        help="nodefeature: one NFD NodeFeature per node (default); node: the Node's own labels (no NFD)",
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "nodefabric"),
        help="namespace of the NodeFeature objects (default: $POD_NAMESPACE or %(default)s)",
    )
    parser.add_argument("--domain", default=labels.DEFAULT_DOMAIN, help="label domain (default: %(default)s)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    parser.add_argument("--health-port", type=int, help="serve the liveness probe /healthz on this port")
    parser.add_argument(
        "--standalone", action="store_true", help="no peering: the caller guarantees one replica"
    )
    parser.add_argument(
        "--peering", default="nodefabric", help="ClusterKopfPeering name (default: %(default)s)"
    )
    parser.add_argument("--priority", type=int, default=0, help="peering priority; the highest one runs")


def options(args: argparse.Namespace) -> Options:
    return Options(
        sink=args.sink,
        namespace=args.namespace,
        domain=labels.check_domain(args.domain),
        kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        standalone=args.standalone,
        peering=args.peering,
        priority=args.priority,
    )


def make_sink(opts: Options, api: kubernetes.client.ApiClient) -> sinks.Sink:
    if opts.sink == "node":
        return sinks.NodeSink(api, opts.domain)
    return sinks.NodeFeatureSink(api, opts.namespace, opts.domain)


def post_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message)


def settings() -> kopf.OperatorSettings:
    out = kopf.OperatorSettings()
    out.posting.loggers = False  # only the label-change Events we post; not every log line
    out.watching.server_timeout = 300
    return out


async def serve(
    opts: Options,
    *,
    metrics: Metrics | None = None,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run the operator until `stop_flag` is set (or forever)."""
    if opts.kubeconfig:
        os.environ["KUBECONFIG"] = opts.kubeconfig  # kopf's kubeconfig login reads it at login time
    api = load_client(opts.kubeconfig)
    sink = make_sink(opts, api)
    metrics = metrics or Metrics()
    reconciler = Reconciler(
        api, sink, domain=opts.domain, metrics=metrics, post_event=post_event, backoffs=opts.backoffs
    )
    metrics_server = metrics.serve(opts.metrics_port) if opts.metrics_port else None
    registry = kopf.OperatorRegistry()
    handlers.register(registry, sink)
    log.info(
        "operator starting",
        extra={
            "sink": opts.sink,
            "namespace": opts.namespace,
            "domain": opts.domain,
            "standalone": opts.standalone,
        },
    )
    try:
        await kopf.operator(
            registry=registry,
            settings=settings(),
            clusterwide=True,
            standalone=opts.standalone,
            peering_name=None if opts.standalone else opts.peering,
            priority=opts.priority,
            liveness_endpoint=f"http://0.0.0.0:{opts.health_port}/healthz" if opts.health_port else None,
            memo=kopf.Memo(reconciler=reconciler),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        api.close()  # type: ignore[no-untyped-call]


def run(args: argparse.Namespace) -> int:
    try:
        opts = options(args)
    except labels.InvalidDomain as err:
        log.error("invalid arguments", extra={"error": str(err)})
        return 2
    try:
        asyncio.run(serve(opts))
    except ConfigException as err:
        log.error("operator cannot start", extra={"error": str(err)})
        return 2
    return 0
