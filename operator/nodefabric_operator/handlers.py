"""kopf handlers: thin, typed shells that hand each event to the Reconciler.

Only event-watching handlers are used (no on.create/on.update, timers or daemons): kopf then stores no
progress or diff-base annotations and adds no finalizers, so the only writes are the labels and the
status we own. Every event, the initial listing after a restart included, recomputes from the whole
record and compares with the live objects; that is what makes reconciling twice write once and a restart
change nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from nodefabric_devicemanager import models
from nodefabric_operator import sinks
from nodefabric_operator.reconcile import Reconciler

log = logging.getLogger(__name__)


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod the service account; elsewhere the kubeconfig named by KUBECONFIG (set from --kubeconfig)."""
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(
        **kwargs
    ) or kopf.login_with_kubeconfig(**kwargs)
    return info


def _reconciler(memo: Any) -> Reconciler:
    rec: Reconciler = memo.reconciler
    return rec


async def on_devices(event: kopf.RawEvent, body: kopf.Body, name: str, memo: Any, **_: Any) -> None:
    rec = _reconciler(memo)
    if event.get("type") == "DELETED":
        await rec.forget(name)
        return
    await rec.reconcile(body)


async def on_sink_object(event: kopf.RawEvent, body: kopf.Body, name: str, memo: Any, **_: Any) -> None:
    """A watched sink object changed: repair it only if it drifted from what the record yields."""
    rec = _reconciler(memo)
    if event.get("type") == "DELETED":
        if isinstance(rec.sink, sinks.NodeFeatureSink) and name in rec.latest:
            log.info("nodefeature deleted while its devices record exists, recreating", extra={"node": name})
            await rec.refresh(name)
        return
    if name not in rec.latest:
        # Labels we wrote for a record we have not seen: it was deleted while the operator was down,
        # or withdrawing them failed. A NodeFeature goes with its owner; Node labels only go this way.
        _, owned = rec.sink.current(body)
        if owned:
            log.info("labels we wrote have no devices record in view, checking it", extra={"node": name})
            await rec.refresh(name)
        return
    if rec.drifted(name, body):
        log.info("labels drifted from the devices record, repairing", extra={"node": name})
        await rec.refresh(name)


def probe_reconciler(memo: Any, **_: Any) -> dict[str, int]:
    rec = _reconciler(memo)
    return {"nodes": len(rec.latest)}


def register(registry: kopf.OperatorRegistry, sink: sinks.Sink) -> None:
    kopf.on.login(registry=registry)(login)
    kopf.on.event(models.GROUP, models.VERSION, models.PLURAL, registry=registry)(on_devices)
    if isinstance(sink, sinks.NodeSink):
        kopf.on.event("", "v1", "nodes", registry=registry)(on_sink_object)
    elif isinstance(sink, sinks.NodeFeatureSink):
        ours = sink.namespace

        def in_our_namespace(namespace: str | None, **_: Any) -> bool:
            return namespace == ours  # nfd-worker keeps its own NodeFeature per node elsewhere

        kopf.on.event(
            sinks.NFD_GROUP,
            sinks.NFD_VERSION,
            sinks.NFD_PLURAL,
            registry=registry,
            labels={sinks.NFD_NODE_NAME: kopf.PRESENT},
            when=in_our_namespace,
        )(on_sink_object)
    kopf.on.probe(id="reconciler", registry=registry)(probe_reconciler)
