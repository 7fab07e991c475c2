"""Evicting a timed-out group's pods: through pods/eviction (a PodDisruptionBudget may say not now: the
pod stays listed on the PlacementGroup and is tried again on later passes), or, where the API server does
not serve eviction, a delete on the same uid."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from nodefabric_operator.admission.grouping import GroupView
from nodefabric_operator.admission.metrics import PlacementMetrics
from nodefabric_operator.admission.model import PlacementGroupStatus
from nodefabric_operator.admission.state import Tables
from nodefabric_operator.admission.writer import PlacementWriter, names_object

log = logging.getLogger(__name__)


class Evictor:
    def __init__(
        self,
        core: Any,
        tables: Tables,
        writer: PlacementWriter,
        metrics: PlacementMetrics,
        *,
        timeout: tuple[float, float],
    ) -> None:
        self.core = core
        self.timeout = timeout
        self.tables = tables
        self.writer = writer
        self.metrics = metrics

    async def evict_left(self, group: GroupView, status: PlacementGroupStatus) -> None:
        """Evict the timed-out group's pods still listed; keep listed only those still refused."""
        left = []
        for m in status.members:
            pod = self.tables.pods.get(m.uid)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                continue
            if not await self.evict(pod):
                left.append(m)
        if left != status.members:
            new = status.model_copy(deep=True)
            new.members = left
            await self.writer.write(group, self.tables.pg(group.spec)[0], new)

    async def evict(self, pod: Mapping[str, Any]) -> bool:
        """Evict (or, where eviction is not served, delete) the pod. False when it was refused for now."""
        meta = pod["metadata"]
        ns, name, uid = str(meta.get("namespace")), str(meta.get("name")), meta.get("uid")
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        try:
            await asyncio.to_thread(
                self.core.create_namespaced_pod_eviction, name, ns, body, _request_timeout=self.timeout
            )
            self.metrics.evictions.inc()
            return True
        except ApiException as exc:
            if exc.status != 404 or names_object(exc, name):
                if exc.status != 404:  # 429: a PodDisruptionBudget says not now; the next pass tries again
                    log.warning(
                        "could not evict a pod of a timed-out group",
                        extra={"pod": f"{ns}/{name}", "status": exc.status, "error": str(exc.reason)},
                    )
                    return False
                return True
        # A 404 naming no pod: this API server does not serve pods/eviction. Delete, on the same uid.
        log.warning("pods/eviction is not served; deleting instead", extra={"pod": f"{ns}/{name}"})
        try:
            await asyncio.to_thread(
                self.core.delete_namespaced_pod,
                name,
                ns,
                body={"preconditions": {"uid": uid}},
                _request_timeout=self.timeout,
            )
            self.metrics.evictions.inc()
        except ApiException as exc:
            if exc.status not in (404, 409):
                log.warning(
                    "could not delete a pod of a timed-out group",
                    extra={"pod": f"{ns}/{name}", "status": exc.status, "error": str(exc.reason)},
                )
                return False
        return True
