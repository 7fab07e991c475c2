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
`register` is the one place handlers are added, and it adds only event handlers.

kopf hands every event through its per-event machinery (a worker queue, body and patch wrappers, three
loggers, cause detection, handler selection) before the handler sees it: about a millisecond each here,
as much as a do-nothing kopf operator spends on a record. A first sync meets three events per record
where that operator meets one, two of them the echoes of our own writes (the status write on the Devices
watch, the sink object we created on its watch). `EchoFilter` answers those before kopf's machinery:
an event the reconciler recognises as carrying nothing newer than what it holds (the same test the
handlers make first) is counted and dropped there; everything else, DELETED events always, goes through
kopf as before. kopf offers no public hook ahead of its processing, so the filter wraps its watch
stream (`infinite_watch`: an echo recognisable on arrival costs kopf no queue and no per-object worker)
and its `process_resource_event` (an echo that arrived before its write's answer was settled waits in
the object's queue behind the handler that wrote, and is recognised there); both are looked up when the
operator starts its watchers. On a kopf without them, the operator runs unfiltered, only slower.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import kopf

from nodefabric_devicemanager import models
from nodefabric_operator import kopflog, sinks
from nodefabric_operator.reconcile import Reconciler

if TYPE_CHECKING:
    from nodefabric_operator.topology.shell import Projector  # imported only with --topology (cli)

log = logging.getLogger(__name__)


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


def startup(**_: Any) -> None:
    """kopf's own log records, cut to one line with our fields (see kopflog)."""
    kopflog.configure()


def cleanup(memo: Any, **_: Any) -> None:
    _reconciler(memo).close()


def _reconciler(memo: Any) -> Reconciler:
    rec: Reconciler = memo.reconciler
    return rec


async def on_devices(event: kopf.RawEvent, name: str, memo: Any, **_: Any) -> None:
    rec = _reconciler(memo)
    if event.get("type") == "DELETED":
        await rec.devices_deleted(name)
        return
    await rec.devices_event(event["object"])


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
    task: asyncio.Task[None] | None = getattr(memo, "topology_task", None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


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


Echo = Callable[[Mapping[str, Any]], bool]  # True: the event was an echo, counted and dropped


class EchoFilter:
    """Per resource, the reconciler's test for an event that brings nothing new (see the module's note)."""

    # By the identity of the settings the operator runs with (a dataclass: compared by value, unhashable),
    # each entry dropped when those settings go.
    _installed: dict[int, EchoFilter] = {}

    @classmethod
    def of(cls, settings: object) -> EchoFilter | None:
        return cls._installed.get(id(settings))

    def __init__(self, tests: Mapping[tuple[str, str], Echo]) -> None:
        self.tests = dict(tests)  # (group, plural) -> test

    def echo(self, resource: Any, raw_event: Mapping[str, Any]) -> bool:
        test = self.tests.get((str(getattr(resource, "group", "")), str(getattr(resource, "plural", ""))))
        if test is None or raw_event.get("type") == "DELETED":
            return False
        body = raw_event.get("object")
        return isinstance(body, Mapping) and test(body)

    def attach(self, settings: kopf.OperatorSettings) -> bool:
        """Filter the events of the operator run with `settings`; False when kopf cannot be hooked."""
        if not (
            _wrap("kopf._core.reactor.processing", "process_resource_event", _filtered_processing)
            and _wrap("kopf._cogs.clients.watching", "infinite_watch", _filtered_watch)
        ):
            log.warning("kopf offers no place to drop echoes of our own writes; every event is processed")
            return False
        EchoFilter._installed[id(settings)] = self
        weakref.finalize(settings, EchoFilter._installed.pop, id(settings), None)
        return True


def echo_filter(
    rec: Reconciler, sink: sinks.Sink, *, topology: bool = False, watch_nodes: bool = False
) -> EchoFilter:
    """The tests for what `register` watched with the same arguments. Nodes are left to kopf when the
    topology projector reads them too (it keeps its own account of every Node event)."""
    tests: dict[tuple[str, str], Echo] = {(models.GROUP, models.PLURAL): rec.devices_echo}
    if isinstance(sink, sinks.NodeSink) and not topology:
        tests["", "nodes"] = rec.echoes.echo
    elif isinstance(sink, sinks.NodeFeatureSink):
        tests[sinks.NFD_GROUP, sinks.NFD_PLURAL] = rec.echoes.echo
        if watch_nodes and not topology:
            tests["", "nodes"] = rec.on_node.echo
    return EchoFilter(tests)


def _wrap(module: str, name: str, wrap: Callable[[Any], Any]) -> bool:
    """Put `wrap(original)` in place of kopf's `module.name`, once per process; False when this kopf has
    no such thing (the operator then runs unfiltered)."""
    try:
        found = importlib.import_module(module)
    except ImportError:
        return False
    original = getattr(found, name, None)
    if original is None:
        return False
    if not getattr(original, "nodefabric_echo_filter", False):
        wrapper = wrap(original)
        wrapper.nodefabric_echo_filter = True
        setattr(found, name, wrapper)
    return True


def _filtered_processing(original: Callable[..., Awaitable[str | None]]) -> Callable[..., Any]:
    """The filter ahead of kopf's processing of each resource event: an echo that arrived before the
    write's answer was settled waited in the object's queue behind the handler that made the write, so
    it is recognised here."""

    async def process_resource_event(**kwargs: Any) -> str | None:
        found = EchoFilter.of(kwargs.get("settings"))
        if found is not None and found.echo(kwargs.get("resource"), kwargs.get("raw_event") or {}):
            return None  # nothing patched: kopf's worker waits for the next event of this object
        return await original(**kwargs)

    return process_resource_event


def _filtered_watch(original: Callable[..., AsyncGenerator[Any, None]]) -> Callable[..., Any]:
    """The filter on kopf's watch streams: an echo already recognisable when it arrives (its write's
    answer settled first) then costs kopf no queue, no per-object worker task."""

    async def infinite_watch(**kwargs: Any) -> AsyncIterator[Any]:
        found = EchoFilter.of(kwargs.get("settings"))
        resource = kwargs.get("resource")
        stream = original(**kwargs)
        async with contextlib.aclosing(stream):  # kopf's own clean-up runs when kopf closes ours
            async for event in stream:
                if found is not None and isinstance(event, Mapping) and found.echo(resource, event):
                    continue
                yield event

    return infinite_watch
