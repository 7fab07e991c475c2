"""Releasing an admitted group: each assigned, still gated member pinned to its node and our gate removed.
The stock kube-scheduler then binds them."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from nodefabric_operator.admission import pins, podview
from nodefabric_operator.admission.grouping import GroupView
from nodefabric_operator.admission.model import PlacementGroupStatus
from nodefabric_operator.admission.state import Tables

log = logging.getLogger(__name__)


class Releaser:
    def __init__(self, core: Any, tables: Tables, *, timeout: tuple[float, float]) -> None:
        self.core = core
        self.tables = tables
        self.timeout = timeout

    async def release(self, group: GroupView, status: PlacementGroupStatus) -> bool:
        """Pin each assigned, still gated member to its node and remove our gate. True when all went."""
        by_uid = {podview.uid(p): p for p in group.members}
        ok = True
        for m in status.members:
            pod = by_uid.get(m.uid)
            if pod is None or not m.node or not self.tables.gated(pod):
                continue
            ns, name = str(pod["metadata"].get("namespace")), m.pod
            try:
                for patch in (pins.pin_patch(pod, m.node), pins.ungate_patch(pod, self.tables.gate)):
                    if patch is None:
                        continue
                    resp = await asyncio.to_thread(
                        self.core.patch_namespaced_pod,
                        name,
                        ns,
                        patch,
                        _content_type="application/json-patch+json",
                        _preload_content=False,
                        _request_timeout=self.timeout,
                    )
                    # What we wrote is what the next pass reads, though the watch has not shown it yet: a
                    # second pin of a pod ungated since would be refused.
                    self.tables.upsert_pod(json.loads(resp.data))
                    pod = self.tables.pods[m.uid]
            except (ApiException, HTTPError) as exc:
                ok = False
                # 404: gone (the owner makes another); 422/409: changed under us, next pass reads it again;
                # HTTPError: no answer in time (the patch may have landed: the next pass reads the pod).
                log.warning(
                    "could not release an admitted pod",
                    extra={
                        "pod": f"{ns}/{name}",
                        "node": m.node,
                        "status": getattr(exc, "status", None),
                        "error": str(getattr(exc, "reason", None) or exc),
                    },
                )
        return ok
