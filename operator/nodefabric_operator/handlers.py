"""kopf handlers: thin, typed shells that hand each event to the Reconciler.

Only event-watching handlers are used (no on.create/on.update, timers or daemons): kopf then stores no
progress or diff-base annotations and adds no finalizers, so the only writes are the labels and the
status we own.

The sink objects are read once before kopf starts (Reconciler.prime), rather than through a kopf index:
kopf holds an indexed operator's handlers until every listed object was indexed, and each object's
worker waits on one shared condition woken once per object, which costs time quadratic in the fleet
(minutes of CPU at 5,000 records).

kopf builds a diff base (a deep copy of the body less its status) for every event it delivers, and
clears its progress marks from it, even for an operator with no change handlers, whose only consumer it
is. `NoDiffBase` builds nothing: a fifth of a first sync's CPU (three events per record) went there.
`register` is the one place handlers are added, and it adds only event handlers; `intake` says which of
their events are answered before kopf's per-event machinery (intake.py): echoes of our own writes, and
every Devices event when kopf can be hooked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import kopf

from nodefabric_devicemanager import models
from nodefabric_operator import kopflog, rawcall, sinks
from nodefabric_operator.intake import Echo, Intake, Key, Lanes
from nodefabric_operator.reconcile import Reconciler

if TYPE_CHECKING:
    from nodefabric_operator.topology.shell import Projector  # imported only with --topology (cli)

log = logging.getLogger(__name__)

# How long the stop waits for a topology pass's request in flight: the loop's own client bounds a write
# to this (aioclient); the pass's threaded requests carry no timeout of their own.
TOPOLOGY_STOP_WAIT_S = 2 * rawcall.REQUEST_TIMEOUT_S


class NoDiffBase(kopf.DiffBaseStorage):
    """The diff base of an operator without change handlers: nothing to build, fetch or store."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod the service account; elsewhere the kubeconfig named by KUBECONFIG (set from --kubeconfig)."""
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(
        **kwargs
    ) or kopf.login_with_kubeconfig(**kwargs)
    return info


async def startup(memo: Any, **_: Any) -> None:
    """kopf's own log records, cut to one line with our fields (see kopflog). kopf may be started again
    within one operator run (cli._kopf, after a watched resource's 404), each time after a cleanup that
    closed the reconciler: the wait for the namespace or the NodeFeature API goes on probing
    (nswait.NamespaceWait.reopen), retries are armed (Requeue.reopen) and sink events held back behind
    a publish handed over (SinkEchoes.reopen) again. A coroutine, on the loop, as cleanup is."""
    kopflog.configure()
    rec = _reconciler(memo)
    rec.requeue.reopen()
    rec.namespace.reopen()
    rec.echoes.reopen()


async def cleanup(memo: Any, **_: Any) -> None:
    # A coroutine, so that kopf runs it on the operator's event loop: a plain function runs in kopf's
    # worker thread, where the retries' timers and the first publications' count are not to be touched.
    _reconciler(memo).close()


def _reconciler(memo: Any) -> Reconciler:
    rec: Reconciler = memo.reconciler
    return rec


async def on_devices(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Reached where kopf could not be hooked, and for a Devices event the lanes do not take (one
    without a name); every other Devices event goes to the lanes (intake.py)."""
    await devices(_reconciler(memo), event)


async def devices(rec: Reconciler, event: Mapping[str, Any]) -> None:
    body = event["object"]
    if event.get("type") == "DELETED":
        await rec.devices_deleted(str(body["metadata"]["name"]))
        return
    await rec.devices_event(body)


async def on_sink_object(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    rec = _reconciler(memo)
    if event.get("type") == "DELETED":
        await rec.sink_deleted(event["object"])
        return
    await rec.sink_event(event["object"])


def _projector(memo: Any) -> Projector:
    proj: Projector = memo.projector
    return proj


async def topology_start(memo: Any, **_: Any) -> None:
    """The topology loop runs beside kopf's workers; kopf cancels it when the operator stops."""
    memo.topology_task = asyncio.create_task(_projector(memo).run(), name="topology")


async def topology_stop(memo: Any, **_: Any) -> None:
    """The loop cancelled, and waited for: a pass in its worker thread sends nothing more and its request
    in flight is answered (Projector.stopping) before kopf stops, so before the lease is released (cli).
    Bounded: a request that never ends does not hold the stop for ever."""
    task: asyncio.Task[None] | None = getattr(memo, "topology_task", None)
    if task is not None:
        task.cancel()
        done, _pending = await asyncio.wait({task}, timeout=TOPOLOGY_STOP_WAIT_S)
        if not done:
            log.warning(
                "the topology pass's request in flight is still unanswered, stopping without it",
                extra={"waited_s": TOPOLOGY_STOP_WAIT_S},
            )


async def on_node_topology(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    _projector(memo).node_event(event.get("type"), event["object"])


async def on_node(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Nodes, watched beside a NodeFeature sink only to say whether nfd-master applied the labels."""
    rec = _reconciler(memo)
    if event.get("type") == "DELETED":
        rec.node_deleted(event["object"])
        return
    await rec.node_event(event["object"])


def register(
    registry: kopf.OperatorRegistry, sink: sinks.Sink, *, topology: bool = False, watch_nodes: bool = False
) -> None:
    kopf.on.login(registry=registry)(login)
    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.event(models.GROUP, models.VERSION, models.PLURAL, registry=registry)(on_devices)
    if isinstance(sink, sinks.NodeSink):
        kopf.on.event("", "v1", "nodes", registry=registry)(on_sink_object)
    elif isinstance(sink, sinks.NodeFeatureSink):
        ours = sink.namespace

        def in_our_namespace(namespace: str | None, **_: Any) -> bool:
            return namespace == ours  # nfd-worker keeps its own NodeFeature per node elsewhere

        # Not filtered by the node-name label nfd-master selects by: one of ours stripped of it (which takes
        # our labels off the node) must reach the drift check, which tags it again.
        where: dict[str, Any] = {"when": in_our_namespace}
        nodefeatures = (sinks.NFD_GROUP, sinks.NFD_VERSION, sinks.NFD_PLURAL)
        kopf.on.event(*nodefeatures, registry=registry, **where)(on_sink_object)
        if watch_nodes:
            kopf.on.event("", "v1", "nodes", registry=registry)(on_node)
    if topology:
        # The hierarchy is read from the Node watch alone: no request per Devices record.
        kopf.on.startup(registry=registry)(topology_start)
        kopf.on.cleanup(registry=registry)(topology_stop)
        kopf.on.event("", "v1", "nodes", registry=registry)(on_node_topology)


def intake(rec: Reconciler, sink: sinks.Sink, *, topology: bool = False, watch_nodes: bool = False) -> Intake:
    """What of the resources `register` watched with the same arguments is answered ahead of kopf: the
    echo tests per resource, and the Devices events, which go to lanes of ours. Nodes are left to kopf
    when the topology projector reads them too (it keeps its own account of every Node event)."""
    tests: dict[Key, Echo] = {(models.GROUP, models.PLURAL): rec.devices_echo}
    if isinstance(sink, sinks.NodeSink) and not topology:
        tests["", "nodes"] = rec.echoes.echo
    elif isinstance(sink, sinks.NodeFeatureSink):
        tests[sinks.NFD_GROUP, sinks.NFD_PLURAL] = rec.echoes.echo
        if watch_nodes and not topology:
            tests["", "nodes"] = rec.on_node.echo
    lanes = Lanes(
        lambda event: devices(rec, event),
        models.PLURAL,
        forget=rec.devices_gone,
        replaced=rec.metrics.skipped.labels(resource=models.PLURAL).inc,
        held=lambda: list(rec.ledger.records),
    )
    # A sink object deleted while no watch was open: its deletion handled as the watch's would be.
    gone = Lanes(lambda event: rec.sink_deleted(event["object"]), sink.name, held=rec.view.names)
    sink_key = ("", "nodes") if isinstance(sink, sinks.NodeSink) else (sinks.NFD_GROUP, sinks.NFD_PLURAL)
    return Intake(tests, {(models.GROUP, models.PLURAL): lanes}, {sink_key: gone})
