"""Posts the operator's Events the way client-go's recorder does for a cluster-scoped object.

The Event goes to the `default` namespace with an involvedObject that has no namespace: that is what
`kubectl describe devices n1` searches for (a field selector on the object's name, kind, uid and empty
namespace), and what the API server's validation asks of an Event about a cluster-scoped object. kopf's
own poster writes the operator's namespace into the involvedObject, so describe would never show them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import kubernetes

from nodefabric_operator import events
from nodefabric_operator.metrics import Metrics

log = logging.getLogger(__name__)

NAMESPACE = "default"  # where every Event about a cluster-scoped object lives


def event_body(
    involved: Mapping[str, Any], notice: events.Notice, instance: str, now: datetime
) -> dict[str, Any]:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        # A generateName must stay a DNS subdomain with the suffix added: "name." is refused (422).
        "metadata": {"generateName": f"{involved.get('name', 'devices')}-", "namespace": NAMESPACE},
        "involvedObject": {k: involved[k] for k in ("apiVersion", "kind", "name", "uid") if k in involved},
        "type": notice.type,
        "reason": notice.reason,
        "message": notice.message,
        "action": "PublishLabels",
        "source": {"component": events.COMPONENT},
        "reportingComponent": events.COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class Recorder:
    def __init__(self, api: kubernetes.client.ApiClient, instance: str, metrics: Metrics) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        self.instance = instance
        self.metrics = metrics

    def post(self, involved: Mapping[str, Any], notice: events.Notice) -> None:
        """One Event; a failure is logged, never raised: an Event is a courtesy, not the work."""
        body = event_body(involved, notice, self.instance, datetime.now(UTC))
        self.metrics.api_requests.labels(verb="create", resource="events").inc()
        try:
            # The client turns the mapping into its Event model (and refuses one it would not send).
            self.core.create_namespaced_event(NAMESPACE, cast(Any, body), _preload_content=False)
        except Exception as err:
            status = getattr(err, "status", None)
            log.warning(
                "could not post event",
                extra={
                    "reason": notice.reason,
                    "object": involved.get("name"),
                    "error": f"HTTP {status}" if status else type(err).__name__,
                },
            )
