"""Verdicts written to the Kubernetes API without blocking a decision: pod Events and pod annotations.

Every write runs in a worker thread; failures are logged and counted, never raised into a decision.
Writes waiting at once are bounded: beyond the bound a write is dropped (and counted) rather than
queued without end while the API server is slow. Events are shaped and spam-filtered (per involved
object) by the one Event writer every component shares (nodefabric_devicemanager.events).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter

from nodefabric_devicemanager import events

log = logging.getLogger(__name__)

COMPONENT = "nodefabric-extender"
MAX_PENDING = 1024


def event_body(
    pod: Mapping[str, Any],
    type_: str,
    reason: str,
    message: str,
    *,
    component: str = COMPONENT,
) -> dict[str, Any]:
    """An Event about `pod` (or any object: its apiVersion and kind are read, a Pod when absent)."""
    involved = involved_object(pod)
    return events.body(
        involved,
        namespace=involved["namespace"],
        type_=type_,
        reason=reason,
        message=message,
        component=component,
        instance=component,
    )


def involved_object(obj: Mapping[str, Any]) -> dict[str, str]:
    """The namespaced object an Event is about, as the Event names it (a Pod when the kind is absent)."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion") or "v1",
        "kind": obj.get("kind") or "Pod",
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", "default"),
        "uid": meta.get("uid", ""),
    }


def annotation_patch(pod: Mapping[str, Any], annotations: Mapping[str, str | None]) -> dict[str, Any]:
    """A JSON merge patch of the pod's annotations (None removes one). The uid makes it a precondition:
    a pod deleted and re-created under the same name since the decision is not patched."""
    meta = pod.get("metadata") or {}
    return {"metadata": {"uid": meta.get("uid"), "annotations": dict(annotations)}}


class KubePublisher:
    """Writes pod Events and the extender's pod annotations through the API."""

    def __init__(
        self,
        api: client.CoreV1Api,
        registry: CollectorRegistry | None = None,
        *,
        component: str = COMPONENT,
        metric: str = "nodefabric_extender_writes_failed",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.component = component
        self.writer = events.Writer(component, clock=clock)
        self.pending: set[asyncio.Task[None]] = set()
        self.failed = Counter(
            metric,
            "Pod Event and annotation writes that failed or were dropped, by kind (event, annotation).",
            ["kind"],
            registry=registry,
        )

    def event(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """One Event about `pod` (or a PlacementGroup), unless the spam filter holds that object's back."""
        about = involved_object(pod)
        if not self.writer.admit(f"{about['kind']}/{about['namespace']}/{about['name']}"):
            self.failed.labels("event").inc()
            log.debug("event dropped by the spam filter", extra={"reason": reason, "object": about["name"]})
            return
        body = event_body(pod, type_, reason, message, component=self.component)
        ns = body["metadata"]["namespace"]
        create: Any = self.api.create_namespaced_event  # takes the body as a plain dict too
        self._start("event", f"{ns}/{body['involvedObject']['name']}", lambda: create(ns, body))

    def annotate(self, pod: Mapping[str, Any], annotations: Mapping[str, str | None]) -> None:
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", "default"), meta.get("name", "")
        body = annotation_patch(pod, annotations)
        patch: Any = self.api.patch_namespaced_pod

        def write() -> Any:
            return patch(name, ns, body, _content_type="application/merge-patch+json")

        self._start("annotation", f"{ns}/{name}", write)

    def _start(self, kind: str, pod: str, call: Callable[[], Any]) -> None:
        if len(self.pending) >= MAX_PENDING:
            self.failed.labels(kind).inc()
            log.warning("API writes are backing up, dropped one", extra={"kind": kind, "pod": pod})
            return
        task = asyncio.get_running_loop().create_task(self._write(kind, pod, call))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _write(self, kind: str, pod: str, call: Callable[[], Any]) -> None:
        try:
            await asyncio.to_thread(call)
        except ApiException as exc:
            if exc.status == 404 and kind == "annotation":
                return  # the pod is gone: nothing to explain any more
            self.failed.labels(kind).inc()
            log.warning(f"could not write a pod {kind}", extra={"pod": pod, "status": exc.status})
        except Exception as exc:
            self.failed.labels(kind).inc()
            log.warning(f"could not write a pod {kind}", extra={"pod": pod, "error": str(exc)})

    async def drain(self) -> None:
        """Wait for every write started so far."""
        while self.pending:
            await asyncio.gather(*self.pending)
