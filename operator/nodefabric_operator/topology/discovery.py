"""Which projection CRDs the API server serves (read again after a TTL), and the owner every projected
object is written with. Synchronous: the shell runs a pass in a worker thread."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import kubernetes

from nodefabric_operator.metrics import Metrics
from nodefabric_operator.rawcall import status_of
from nodefabric_operator.topology import project, report
from nodefabric_operator.topology.objects import brief

log = logging.getLogger(__name__)

# What a Kubernetes API version looks like: anything else /apis says is not asked about (each is a request).
API_VERSION = re.compile(r"v[1-9][0-9]{0,8}(?:(?:alpha|beta)[1-9][0-9]{0,8})?")
MAX_VERSIONS = 16  # versions of one group asked about at most, whatever /apis lists

# target -> (group, the versions the writer knows, preferred first, resource)
KNOWN: dict[str, tuple[str, tuple[str, ...], str]] = {
    project.KUEUE: (project.KUEUE_GROUP, project.KUEUE_VERSIONS, "topologies"),
    project.KAI: (project.KAI_GROUP, project.KAI_VERSIONS, "topologies"),
    project.VOLCANO: (project.VOLCANO_GROUP, (project.VOLCANO_VERSION,), "hypernodes"),
}


def _versions(listed: list[Any]) -> list[str]:
    """A group's versions as /apis lists them, only those shaped as Kubernetes versions, MAX_VERSIONS
    at most."""
    named = (v.get("version") if isinstance(v, dict) else None for v in listed)
    return [v for v in named if isinstance(v, str) and API_VERSION.fullmatch(v)][:MAX_VERSIONS]


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
        # target -> the versions its CRD serves when none is one the writer knows (a release newer than it)
        self.unknown: dict[str, tuple[str, ...]] = {}
        self._discovered_at: float | None = None
        self._owner_ref: dict[str, Any] | None = None
        self._owner_read = False
        self._owner_said = False  # its refusal logged
        self._groups: dict[str, list[str]] | None = None  # group -> versions served, this discovery

    def forget(self) -> None:
        self._discovered_at = None
        # The owner is read again too: deleted and created again (`helm upgrade --force`), it has a new uid,
        # and the garbage collector takes at once an object created naming the old one.
        self._owner_read = False

    def discover(self) -> None:
        now = self.clock()
        if self._discovered_at is not None and now - self._discovered_at < self.ttl:
            return
        self._groups = None  # /apis, read only when a target's known versions are all unserved
        served: dict[str, str | None] = {}
        unknown: dict[str, tuple[str, ...]] = {}
        for target, (group, versions, plural) in KNOWN.items():
            served[target] = next((v for v in versions if self._serves(group, v, plural)), None)
            if served[target] is None:
                # A CRD served only in a version newer than this writer must not read as "not served".
                others = tuple(
                    v
                    for v in self._group_versions(group)
                    if v not in versions and self._serves(group, v, plural)
                )
                if others:
                    unknown[target] = others
        served["report"] = (
            report.VERSION if self._serves(report.GROUP, report.VERSION, report.PLURAL) else None
        )
        # Taken whole, so a discovery that fails half way leaves the last one standing.
        self.served, self.unknown = served, unknown
        self._discovered_at = now

    def _group_versions(self, group: str) -> list[str]:
        """The versions the API server serves of `group` (none when it serves no such group)."""
        if self._groups is None:
            self.metrics.api_requests.labels(verb="get", resource="discovery").inc()
            answer: Any = kubernetes.client.ApisApi(self.api).get_api_versions(
                _preload_content=False, _request_timeout=10
            )
            try:
                data = json.loads(answer.data)
            except (ValueError, RecursionError):
                data = None
            groups = data.get("groups") if isinstance(data, dict) else None
            self._groups = {
                str(g.get("name")): _versions(g["versions"])
                for g in (groups if isinstance(groups, list) else ())
                if isinstance(g, dict) and isinstance(g.get("versions"), list)
            }
        return self._groups.get(group, [])

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
        except (ValueError, RecursionError):
            return False
        resources = data.get("resources") if isinstance(data, dict) else None
        return isinstance(resources, list) and any(
            isinstance(r, dict) and r.get("name") == plural for r in resources
        )

    @property
    def owner_uid(self) -> str | None:
        """The owner's uid as last read: what proves an object ours beyond its label."""
        uid = self._owner_ref.get("uid") if self._owner_ref is not None else None
        return uid if isinstance(uid, str) and uid else None

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
