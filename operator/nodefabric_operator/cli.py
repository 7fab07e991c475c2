"""`nodefabric operator`: publish node labels from Devices objects (kopf).

One active replica: kopf peering (a ClusterKopfPeering object, `--peering`) pauses every replica that
sees a peer of the same priority, so run one replica (a standby with a lower `--priority` takes over
when it goes), or `--standalone` where exactly one replica is guaranteed by other means.

Start-up problems (an unusable kubeconfig, an API server that cannot be reached or refuses us, the
Devices CRD not installed, a busy port) are one log line and exit status 2, before kopf starts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import kopf
import kubernetes
import yaml
from kubernetes.config.config_exception import ConfigException

from nodefabric_devicemanager import flags, yamldoc
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_devicemanager.shell import server as shell
from nodefabric_devicemanager.shell.errors import StartupError, first_line, refuse
from nodefabric_devicemanager.shell.flags import Listen, add_serving_arguments
from nodefabric_devicemanager.shell.server import IDLE_TIMEOUT_S
from nodefabric_devicemanager.shell.signals import stop_on_signals
from nodefabric_operator import events, handlers, labels, leader, prune, sinks, startup
from nodefabric_operator.intake import Intake
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.reconcile import DEFAULT_BACKOFFS, Reconciler
from nodefabric_operator.recorder import Recorder

if TYPE_CHECKING:
    # Imported when --topology asks for it: the topology package (and the extender modules it reads
    # the fabric with) costs 0.1-0.2 s of CPU to import, a tenth of a restart over 500 records.
    from nodefabric_operator.topology.shell import Projector, TopologyOptions

log = logging.getLogger(__name__)

SINKS = ("nodefeature", "node")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)


@dataclass(frozen=True)
class Options:
    sink: str = "nodefeature"
    namespace: str = "nodefabric"
    domain: str = labels.DEFAULT_DOMAIN
    kubeconfig: str | None = None
    metrics_port: int | None = None
    health_port: int | None = None
    bind_address: str = "0.0.0.0"
    idle_timeout: float = IDLE_TIMEOUT_S
    standalone: bool = False
    peering: str = "nodefabric"
    priority: int = 0
    backoffs: Sequence[float] = DEFAULT_BACKOFFS
    startup_timeout: float = 10.0
    topology: TopologyOptions | None = None  # None: no hierarchy check, no projections
    leader_elect: bool = False
    lease_name: str = "nodefabric-operator"
    lease_timing: tuple[float, float, float] = (15.0, 10.0, 2.0)  # duration, renew deadline, retry


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
    # Each port is off unless given; /healthz is served only on --health-port (the operator has no
    # /readyz: kopf peering, not a Service, decides which replica works).
    add_serving_arguments(parser, metrics_port=None, health_port=None, zero_is_off=False)
    parser.add_argument(
        "--idle-timeout",
        type=flags.seconds(most=3600),
        default=IDLE_TIMEOUT_S,
        help="seconds a metrics or health connection may go without a complete request (silent, or "
        "trickling its headers) before it is closed (default: %(default)g)",
    )
    parser.add_argument(
        "--standalone", action="store_true", help="no peering: the caller guarantees one replica"
    )
    parser.add_argument(
        "--peering", default="nodefabric", help="ClusterKopfPeering name (default: %(default)s)"
    )
    parser.add_argument("--priority", type=int, default=0, help="peering priority; the highest one runs")
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="run as one of several replicas: only the holder of a Lease in --namespace publishes, the "
        "others wait to take over (implies no kopf peering)",
    )
    parser.add_argument(
        "--lease-name",
        default="nodefabric-operator",
        help="--leader-elect: the Lease's name (default: %(default)s)",
    )
    parser.add_argument(
        "--prune",
        action="store_true",
        help="instead of running: take back what the operator published (delete its NodeFeatures, or "
        "remove its keys from Nodes), then exit (the chart's post-delete hook)",
    )
    parser.add_argument(
        "--prune-timeout",
        type=flags.seconds(most=3600),
        default=120.0,
        help="--prune: give up (exit 1) when things keep coming back this long (default: %(default)g s)",
    )
    parser.add_argument(
        "--prune-settle",
        type=flags.seconds(most=600, zero=True),
        default=5.0,
        help="--prune: seconds between passes; it ends after one that finds nothing (default: %(default)g)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=flags.seconds(most=3600, zero=True),
        default=10.0,
        help="how long to wait for the API server at start before exiting 2 (default: %(default)s s)",
    )
    topo = parser.add_argument_group(
        "topology (the checked hierarchy and its Kueue, KAI, Volcano projections)"
    )
    topo.add_argument(
        "--topology", action="store_true", help="watch Nodes, check the hierarchy, write the projections"
    )
    topo.add_argument(
        "--topology-targets",
        default="kueue,kai,volcano",
        help="targets allowed, each written only when its CRD is served (default: %(default)s)",
    )
    topo.add_argument(
        "--topology-levels",
        help="levels, tightest first, as a YAML/JSON list of {name, keys, title} (default: fabric, leaf, "
        "spine, core, zone, region)",
    )
    topo.add_argument(
        "--topology-level-keys",
        help="label keys replacing those of named levels, as a YAML/JSON mapping {level: [keys]}",
    )
    topo.add_argument("--topology-name", default="nodefabric", help="Kueue/KAI Topology name")
    topo.add_argument(
        "--topology-owner", help="ClusterRole owning every object written, so uninstalling removes them"
    )
    topo.add_argument(
        "--topology-debounce",
        type=flags.seconds(most=600, zero=True),
        default=2.0,
        help="quiet time after a Node change before a pass (default: %(default)s s)",
    )


def options(args: argparse.Namespace) -> Options:
    if args.sink == "nodefeature" and not labels.is_dns_label(args.namespace):
        raise StartupError(f"--namespace {args.namespace!r} is not a namespace name (a DNS label)")
    if args.leader_elect and (len(args.lease_name) > 253 or not _DNS_SUBDOMAIN.fullmatch(args.lease_name)):
        raise StartupError(f"--lease-name {args.lease_name!r} is not a Lease name (a DNS subdomain)")
    if not args.bind_address.strip():
        raise StartupError("--bind-address is empty: give an address (0.0.0.0 for every one)")
    return Options(
        sink=args.sink,
        namespace=args.namespace,
        domain=labels.check_domain(args.domain),
        kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        bind_address=args.bind_address,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name,
        idle_timeout=args.idle_timeout,
        standalone=args.standalone,
        peering=args.peering,
        priority=args.priority,
        startup_timeout=args.startup_timeout,
        topology=topology_options(args, labels.check_domain(args.domain)),
    )


def topology_options(args: argparse.Namespace, domain: str) -> TopologyOptions | None:
    if not args.topology:
        return None
    from nodefabric_operator.topology import levels as topology_levels
    from nodefabric_operator.topology.shell import TopologyOptions, parse_targets

    try:
        targets = parse_targets(args.topology_targets)
        if args.topology_levels is None:
            levels = topology_levels.default_levels(domain)
        else:
            levels = topology_levels.parse_levels(yamldoc.load(args.topology_levels))
        if args.topology_level_keys is not None:
            levels = topology_levels.with_keys(levels, yamldoc.load(args.topology_level_keys))
    except (ValueError, yaml.YAMLError) as err:
        raise StartupError(f"--topology: {first_line(err)}") from err
    if not labels.is_dns_label(args.topology_name):
        raise StartupError(f"--topology-name {args.topology_name!r} is not a DNS label")
    return TopologyOptions(
        levels=levels,
        targets=targets,
        name=args.topology_name,
        owner=args.topology_owner or None,
        debounce=args.topology_debounce,
    )


def make_sink(opts: Options, api: kubernetes.client.ApiClient, metrics: Metrics) -> sinks.Sink:
    if opts.sink == "node":
        return sinks.NodeSink(api, opts.domain, metrics)
    return sinks.NodeFeatureSink(api, opts.namespace, opts.domain, metrics)


def instance() -> str:
    """This replica, as Events name it: the pod (the chart passes POD_NAME), else the host."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def settings(opts: Options) -> kopf.OperatorSettings:
    out = kopf.OperatorSettings()
    # The operator posts its own Events (recorder.py); should kopf ever post one, it says who it is.
    out.posting.loggers = False
    out.posting.reporting_component = events.COMPONENT
    out.posting.reporting_instance = instance()
    out.posting.event_name_prefix = f"{events.COMPONENT}-"
    out.watching.server_timeout = 300
    out.persistence.diffbase_storage = handlers.NoDiffBase()  # only event handlers: no diffs to take
    if opts.sink == "nodefeature":
        # Only our namespace's NodeFeatures, filtered by the API server: nfd-worker keeps a larger one
        # per node in its own namespace, and listing those too would double what a restart reads.
        nodefeatures = (sinks.NFD_GROUP, sinks.NFD_PLURAL)
        out.watching.field_selectors[nodefeatures] = f"metadata.namespace={opts.namespace}"
        out.watching.label_selectors[nodefeatures] = sinks.NFD_NODE_NAME
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
    try:
        api = load_client(opts.kubeconfig)
    except (ConfigException, OSError, yaml.YAMLError, ValueError, TypeError, AttributeError) as err:
        # The client's kubeconfig loader lets a file of the wrong shape through as whatever it hit.
        raise StartupError(f"cannot use the kubeconfig: {first_line(err)}") from err
    try:
        if not await _reach(api, opts.startup_timeout, stop_flag):
            return  # stopped while waiting for it
        metrics = metrics or Metrics()
        sink = make_sink(opts, api, metrics)
        reconciler = Reconciler(
            api,
            sink,
            domain=opts.domain,
            metrics=metrics,
            recorder=Recorder(api, instance(), metrics),
            backoffs=opts.backoffs,
        )
        projector = _projector(opts, api, metrics)
        endpoints = shell.ProbeServer(
            Listen(opts.bind_address, opts.metrics_port, opts.health_port),
            metrics=metrics.exposition,
            live=lambda: health(reconciler),
            idle_timeout=opts.idle_timeout,
        )
        await endpoints.start()
        elector: leader.Elector | None = None
        watcher: asyncio.Future[None] | None = None
        try:
            if opts.leader_elect:
                elector = leader.Elector(
                    api, leader.LeaseConfig(opts.namespace, opts.lease_name, identity(), *opts.lease_timing)
                )
                if not await _lead(elector, stop_flag):
                    return  # stopped while standing by
            # Renewing from now on: the listings below may take longer than the lease lasts, and a
            # lease left unrenewed meanwhile would be taken by a standby while this replica publishes.
            halt, lost, watcher = _halting(stop_flag, elector)
            await startup.prime(reconciler, opts.sink, opts.namespace)
            if projector is not None:
                await startup.prime_topology(projector)
            registry, running, taken = _registry(reconciler, sink, opts, topology=projector is not None)
            log.info(
                "operator starting",
                extra={
                    "sink": opts.sink,
                    "namespace": opts.namespace,
                    "domain": opts.domain,
                    "standalone": opts.standalone,
                    "server": startup.server(api),
                },
            )
            await _kopf(
                taken,
                stop_flag,
                registry=registry,
                settings=running,
                clusterwide=True,
                standalone=opts.standalone or elector is not None,
                peering_name=None if opts.standalone or elector else opts.peering,
                priority=opts.priority,
                memo=kopf.Memo(reconciler=reconciler, projector=projector),
                stop_flag=halt,
                ready_flag=ready_flag,
            )
            if lost.is_set():
                raise LeadershipLost(f"lost the lease {opts.namespace}/{opts.lease_name}")
        finally:
            if watcher is not None:
                watcher.cancel()  # no renewal after this (and the elector refuses one in flight)
            await reconciler.aclose()  # kopf stopped: no write in flight (_kopf)
            if elector is not None:
                await asyncio.to_thread(elector.release)
            await endpoints.stop()
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _registry(
    reconciler: Reconciler, sink: sinks.Sink, opts: Options, *, topology: bool
) -> tuple[kopf.OperatorRegistry, kopf.OperatorSettings, Intake]:
    """The handlers and kopf's settings, with the intake that answers some events before kopf processes
    them (intake.py: echoes of our own writes, Devices events), for the operator run with those settings."""
    registry, running = kopf.OperatorRegistry(), settings(opts)
    watched = {"topology": topology, "watch_nodes": reconciler.watches_nodes}
    handlers.register(registry, sink, **watched)
    taken = handlers.intake(reconciler, sink, **watched)
    taken.attach(running)
    return registry, running, taken


async def _kopf(taken: Intake, asked: asyncio.Event | threading.Event | None, **kwargs: Any) -> None:
    """kopf.operator until it stops, our lanes stopped with its workers each time: once the watches
    stopped (a lease lost, SIGTERM, a watched resource gone) nothing more is handled, a write in flight
    is answered before this returns (so before the lease is released), and what was pending comes back
    with the next listing. `asked`: the stop asked for from outside."""
    while True:
        try:
            await kopf.operator(**kwargs)
            return
        except Exception as err:
            if getattr(err, "status", None) != 404:
                raise
            if _stopping(asked):
                return  # stopped while kopf failed on a resource gone: a stop, not a failure
            gone = first_line(err)
        finally:
            await taken.close()
        # A CRD deleted under a watch (the Devices CRD reinstalled, NFD uninstalled): kopf re-opens the
        # watch before it learns the resource is gone, and fails whole on the 404. Started again, it
        # waits for the CRD; the reconciler keeps what it handled, so the relist costs no request per
        # record.
        log.warning("a watched resource disappeared, restarting the watches", extra={"error": gone})
        await asyncio.sleep(1)


def _projector(opts: Options, api: kubernetes.client.ApiClient, metrics: Metrics) -> Projector | None:
    if opts.topology is None:
        return None
    from nodefabric_operator.topology.shell import Projector

    return Projector(api, opts.topology, metrics, Recorder(api, instance(), metrics))


async def _reach(
    api: kubernetes.client.ApiClient, timeout: float, stop_flag: asyncio.Event | threading.Event | None
) -> bool:
    """The API server reached and serving the Devices CRD (startup.check_api, in a thread); False when
    stopped first. Raises StartupError."""
    log.debug("checking the API server", extra={"server": startup.server(api)})
    return await asyncio.to_thread(startup.check_api, api, timeout, lambda: _stopping(stop_flag))


def health(reconciler: Reconciler) -> shell.Probe:
    """/healthz: what the reconciler holds, as JSON (always 200: a loop that answers is alive)."""
    return shell.Probe(True, json.dumps(dict(reconciler.health()), sort_keys=True), "application/json")


def run_prune(opts: Options, *, timeout: float, settle: float) -> int:
    """`--prune`: what the sink holds of ours, taken back (prune.py); 2 for an unusable kubeconfig."""
    try:
        api = load_client(opts.kubeconfig)
    except (ConfigException, OSError, yaml.YAMLError, ValueError, TypeError, AttributeError) as err:
        log.error("prune cannot start", extra={"error": f"cannot use the kubeconfig: {first_line(err)}"})
        return 2
    try:
        if opts.sink == "node":
            return prune.run(
                lambda: prune.node_labels(api, opts.domain),
                "node labels",
                timeout=timeout,
                settle=settle,
                sleep=time.sleep,
            )
        return prune.run(
            lambda: prune.nodefeatures(api, opts.namespace),
            f"nodefeatures in {opts.namespace}",
            timeout=timeout,
            settle=settle,
            sleep=time.sleep,
        )
    finally:
        api.close()  # type: ignore[no-untyped-call]


async def _lead(elector: leader.Elector, stop_flag: asyncio.Event | threading.Event | None) -> bool:
    """Stand by until this replica holds the lease (True) or it is stopped (False); a refusal of the
    Lease (RBAC) is a start-up error."""
    try:
        return await elector.acquire(lambda: _stopping(stop_flag))
    except kubernetes.client.ApiException as err:
        cfg = elector.cfg
        raise StartupError(
            f"cannot take the lease {cfg.namespace}/{cfg.name}: {leader.refusal(err)}"
        ) from err


class LeadershipLost(RuntimeError):
    """The lease could not be renewed: this replica stopped publishing (exit 1, the pod restarts)."""


def identity() -> str:
    """This replica in the Lease: the pod, and a random part (a restarted pod is another candidate)."""
    return f"{instance()}_{uuid.uuid4().hex[:8]}"


def _halting(
    stop_flag: asyncio.Event | threading.Event | None, elector: leader.Elector | None
) -> tuple[asyncio.Event | threading.Event | None, asyncio.Event, asyncio.Future[None] | None]:
    """kopf's stop flag: the caller's, or (leading) one also set when the lease is lost. `lost` tells
    which happened; the task renewing the lease comes back to be cancelled when the operator stops."""
    lost = asyncio.Event()
    if elector is None:
        return stop_flag, lost, None
    halt = asyncio.Event()

    async def watch() -> None:
        holding = asyncio.ensure_future(elector.hold())
        try:
            while not _stopping(stop_flag):
                if holding.done():
                    lost.set()
                    break
                await asyncio.sleep(0.2)
        finally:
            holding.cancel()
            halt.set()

    return halt, lost, asyncio.ensure_future(watch())


def _stopping(flag: asyncio.Event | threading.Event | None) -> bool:
    return flag is not None and flag.is_set()


# The collector's thresholds while the operator serves (CPython's are 700, 10, 10). A first sync holds a
# parsed record, a view and kopf's state per Devices object, and every 70,000 allocations a collection
# traversed them all: 11% of a first sync's CPU over 2,000 records (0.44 s, five full collections of 60-90
# ms). Almost nothing the operator makes is cyclic (refcounting frees it), so collecting 14x less often
# costs a few MiB at most and left 0.16 s of collection.
GC_THRESHOLDS = (10_000, 20, 20)


def run(args: argparse.Namespace) -> int:
    try:
        opts = options(args)
    except (labels.InvalidDomain, StartupError) as err:
        log.error("invalid arguments", extra={"error": str(err)})
        return 2
    if getattr(args, "prune", False):
        return run_prune(opts, timeout=args.prune_timeout, settle=args.prune_settle)
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        asyncio.run(_main(opts))
    except StartupError as err:  # a busy port (shell.server.PortUnavailable) is one too
        return refuse(log, "operator", first_line(err))
    except LeadershipLost:
        return 1  # said when it was lost; the pod restarts and stands by
    except KeyboardInterrupt:  # Ctrl-C before the loop ran (kopf stops cleanly after)
        return 130
    return 0


async def _main(opts: Options) -> None:
    """The operator under the shell's signals: SIGTERM during the start-up checks or while standing by
    for the lease stops it (within STOP_GRACE_S, whatever a check is stuck in). While kopf runs, kopf
    owns SIGTERM and SIGINT and stops itself."""
    stop = asyncio.Event()
    with stop_on_signals(stop):
        await serve(opts, stop_flag=stop)
