"""Pod Events for placement decisions, written through the Kubernetes API without blocking a decision."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

log = logging.getLogger(__name__)

COMPONENT = "nodefabric-extender"
MAX_MESSAGE = 1024  # the API server refuses longer Event messages


def event_body(pod: Mapping[str, Any], type_: str, reason: str, message: str) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            # A generateName must be a DNS subdomain once a suffix is added: "pod." is refused (422).
            "generateName": f"{meta.get('name', 'pod')}-",
            "namespace": meta.get("namespace", "default"),
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", "default"),
            "uid": meta.get("uid", ""),
        },
        "type": type_,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class KubeEvents:
    """An EventSink writing core/v1 Events; each write runs in a worker thread, failures are logged."""

    def __init__(self, api: client.CoreV1Api) -> None:
        self.api = api
        self.pending: set[asyncio.Task[None]] = set()

    def emit(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        body = event_body(pod, type_, reason, message)
        task = asyncio.get_running_loop().create_task(self._write(body))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _write(self, body: dict[str, Any]) -> None:
        ns = body["metadata"]["namespace"]
        create: Any = self.api.create_namespaced_event  # takes the body as a plain dict too
        try:
            await asyncio.to_thread(create, ns, body)
        except Exception as exc:
            log.warning(
                "could not write a pod event",
                extra={"pod": f"{ns}/{body['involvedObject']['name']}", "error": str(exc)},
            )
