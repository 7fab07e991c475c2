"""Which projection CRDs the API server serves (read again after a TTL), and the owner every projected
object is written with. Synchronous: the shell runs a pass in a worker thread."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import kubernetes

from nodefabric_operator.metrics import Metrics
from nodefabric_operator.rawcall import status_of
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.objects import brief

log = logging.getLogger(__name__)


class Discovery:
    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        metrics: Metrics,
        *,
        owner: str | None,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.metrics = metrics
        self.owner = owner
        self.ttl = ttl
        self.clock = clock
        self.served: dict[str, str | None] = {}  # target -> version served (None: not served)
        self._discovered_at: float | None = None
        self._owner_ref: dict[str, Any] | None = None
        self._owner_read = False
        self._owner_said = False  # its refusal logged

    def forget(self) -> None:
        self._discovered_at = None
        # The owner is read again too: deleted and created again (`helm upgrade --force`), it has a new uid,
        # and the garbage collector takes at once an object created naming the old one.
        self._owner_read = False

    def discover(self) -> None:
        now = self.clock()
        if self._discovered_at is not None and now - self._discovered_at < self.ttl:
            return
        kueue = next(
            (v for v in project.KUEUE_VERSIONS if self._serves(project.KUEUE_GROUP, v, "topologies")), None
        )
        kai = next(
            (v for v in project.KAI_VERSIONS if self._serves(project.KAI_GROUP, v, "topologies")), None
        )
        self.served = {
            project.KUEUE: kueue,
            project.KAI: kai,
            project.VOLCANO: project.VOLCANO_VERSION
            if self._serves(project.VOLCANO_GROUP, project.VOLCANO_VERSION, "hypernodes")
            else None,
            "report": report.VERSION if self._serves(report.GROUP, report.VERSION, report.PLURAL) else None,
        }
        self._discovered_at = now

    def _serves(self, group: str, version: str, plural: str) -> bool:
        self.metrics.api_requests.labels(verb="get", resource="discovery").inc()
        try:
            # Undecoded: the client's model would drop nothing we need, but costs a parse per resource.
            answer: Any = self.custom.get_api_resources(
                group, version, _preload_content=False, _request_timeout=10
            )
            data = json.loads(answer.data)
        except kubernetes.client.ApiException as err:
            if status_of(err) == 404:
                return False
            raise
        except ValueError:
            return False
        resources = data.get("resources") if isinstance(data, dict) else None
        return isinstance(resources, list) and any(
            isinstance(r, dict) and r.get("name") == plural for r in resources
        )

    @property
    def owner_ready(self) -> bool:
        """No owner asked for, or its uid read (or refused for good: then objects go unowned). Read once,
        a failure to read it again keeps what was read."""
        return not self.owner or self._owner_read or self._owner_ref is not None

    def read_owner(self) -> None:
        """The owner's uid, read at the first pass and again after `forget`. Refused (403) or missing (404)
        at the first read: said, and objects are written without it (uninstall then leaves them); later,
        the uid read before is kept (an owner gone is an uninstall: objects naming it are collected). Any
        other failure raises: nothing is written until it is first read, since an object created without
        its owner would stay unowned."""
        if self._owner_read or self.owner is None:
            return
        rbac = kubernetes.client.RbacAuthorizationV1Api(self.api)
        self.metrics.api_requests.labels(verb="get", resource="clusterroles").inc()
        try:
            role = rbac.read_cluster_role(self.owner)
        except kubernetes.client.ApiException as err:
            if status_of(err) not in (403, 404):
                raise
            self._owner_read = True
            if self._owner_ref is None and not self._owner_said:  # a uid read before is kept
                self._owner_said = True
                log.warning(
                    "cannot read the owner ClusterRole: projected objects will not be removed on uninstall",
                    extra={"owner": self.owner, "error": brief(err)},
                )
            return
        self._owner_ref = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "name": self.owner,
            "uid": role.metadata.uid if role.metadata else None,
        }
        self._owner_read = True

    def owned(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` with the owner reference, once read (unowned when there is none)."""
        if self._owner_ref is not None:
            body["metadata"]["ownerReferences"] = [dict(self._owner_ref)]
        return body
