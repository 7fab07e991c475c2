"""Requests on the projection targets' cluster-scoped objects, each counted (api_requests, and
topology_writes for a write), with the one way an object we manage is written: its spec patched, or
created again when it was deleted since. Synchronous: the shell runs a pass in a worker thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import kubernetes
import urllib3

from nodefabric_devicemanager.nodeclient.objects import resource_version
from nodefabric_operator.apicall import Stopped
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.rawcall import status_of
from nodefabric_operator.topology import project


class NoVersion(ValueError):
    """An object of ours the API server answered without a resourceVersion string (a broken proxy or API
    server): it is not deleted, as a delete without that precondition could take someone else's."""


# What a failed request raises: retried by the shell with backoff.
API_ERRORS = (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError, NoVersion)


JSON_PATCH = "application/json-patch+json"


def go_on(stopping: threading.Event) -> None:
    """Stopped once the operator is stopping (the shell's cancel sets `stopping`, inflight.writing): a
    pass runs in a worker thread the cancel does not end, and each request it would send next would go
    out after the stop, and after the lease was released to a standby. Not one of API_ERRORS: no target
    catches it, the pass ends where it is."""
    if stopping.is_set():
        raise Stopped("the operator is stopping: the topology pass sends nothing more")


class NotOurs(Exception):
    """An object of the name we write that someone else holds: left alone."""


def _pointer(key: str) -> str:
    """`key` as one JSON-pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


_MANAGED_PATH = f"/metadata/labels/{_pointer(project.MANAGED_BY)}"


def name_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def brief(err: BaseException) -> str:
    """One short reason: `HTTP 503 Service Unavailable`, or the first line of anything else."""
    status = status_of(err)
    if status:
        return f"HTTP {status} {getattr(err, 'reason', '') or ''}".strip()
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]


def held_state(kind: str, name: str, finalizers: str) -> str:
    return f"{kind} {name} is being deleted, held by finalizers {finalizers}: written once it is gone"


class Objects:
    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        metrics: Metrics,
        served: Callable[[], dict[str, str | None]],
        owned: Callable[[dict[str, Any]], dict[str, Any]],
        stopping: threading.Event | None = None,
    ) -> None:
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.metrics = metrics
        self.stopping = stopping or threading.Event()  # checked before each request (go_on)
        self.served = served  # target -> version served, as discovery last read it
        self.owned = owned  # a body with the owner reference added
        # target -> what the server holds as far as we know (a target absent: read it again)
        self.known: dict[str, Any] = {}

    def gvp(self, target: str) -> tuple[str, str, str]:
        served = self.served()
        if target == project.KUEUE:
            return project.KUEUE_GROUP, served[target] or project.KUEUE_VERSIONS[0], "topologies"
        if target == project.KAI:
            return project.KAI_GROUP, served[target] or project.KAI_VERSIONS[-1], "topologies"
        return project.VOLCANO_GROUP, project.VOLCANO_VERSION, "hypernodes"

    def _call(self, verb: str, target: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        g, v, p = self.gvp(target)
        go_on(self.stopping)
        self.metrics.api_requests.labels(verb=verb, resource=p).inc()
        result = fn(g, v, p, *args, **kwargs)
        if verb in ("create", "patch", "delete"):
            self.metrics.topology_writes.labels(target=target, verb=verb).inc()
        return result

    def get(self, target: str, name: str) -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = self._call("get", target, self.custom.get_cluster_custom_object, name)
        except kubernetes.client.ApiException as err:
            if status_of(err) == 404:
                return None
            raise
        return got

    def items(self, target: str, **kwargs: Any) -> list[dict[str, Any]]:
        got = self._call("list", target, self.custom.list_cluster_custom_object, **kwargs)
        # An answer that is no list of objects (a proxy's page, a broken aggregated API) lists nothing:
        # never a TypeError out of the pass.
        found = got.get("items") if isinstance(got, dict) else None
        return [i for i in found if isinstance(i, dict)] if isinstance(found, list) else []

    def labelled(self, target: str) -> list[dict[str, Any]]:
        """The target's objects that carry our label (listed by it), each with a name."""
        selector = f"{project.MANAGED_BY}={project.MANAGER}"
        return [
            i for i in self.items(target, label_selector=selector) if project.is_managed(i) and name_of(i)
        ]

    def create(self, target: str, body: dict[str, Any]) -> str:
        """Created; the new object's resourceVersion (what a later delete of ours names as its
        precondition; "" for an answer without one)."""
        return resource_version(
            self._call("create", target, self.custom.create_cluster_custom_object, self.owned(body))
        )

    def update(self, target: str, name: str, body: dict[str, Any]) -> str:
        """Our object's spec written; created again (with its owner) when it was deleted since. NotOurs
        when the object of that name is someone else's now (ours deleted and another made since we
        read it): the patch tests our label first, so theirs is never written over. The object's
        resourceVersion."""
        patch: list[dict[str, Any]] = [{"op": "test", "path": _MANAGED_PATH, "value": project.MANAGER}]
        # Each top-level field of the spec set, as the merge patch of {"spec": ...} did.
        patch += [{"op": "add", "path": f"/spec/{_pointer(k)}", "value": v} for k, v in body["spec"].items()]
        try:
            return resource_version(
                self._call(
                    "patch",
                    target,
                    self.custom.patch_cluster_custom_object,
                    name,
                    patch,
                    _content_type=JSON_PATCH,
                )
            )
        except kubernetes.client.ApiException as err:
            status = status_of(err)
            if status == 404:
                return self.create(target, body)
            if status == 422:  # a failed test (or a spec the server refuses: then it is ours, raised)
                live = self.get(target, name)
                if live is not None and not project.is_managed(live):
                    raise NotOurs(
                        f"{self.gvp(target)[2]} {name} exists and is not managed by nodefabric"
                    ) from err
            raise

    def delete(self, target: str, name: str, version: str) -> None:
        """Deleted, only while the object is at resourceVersion `version` (the server answers 409 for
        another, or for another object made under the name); gone already is no failure. Every delete of
        ours names one: without it, a delete takes whatever holds the name."""
        if not version:
            raise NoVersion(f"{self.gvp(target)[2]} {name}: no resourceVersion to delete it at")
        pre = kubernetes.client.V1Preconditions(resource_version=version)
        try:
            self._call(
                "delete",
                target,
                self.custom.delete_cluster_custom_object,
                name,
                body=kubernetes.client.V1DeleteOptions(preconditions=pre),
            )
        except kubernetes.client.ApiException as err:
            if status_of(err) != 404:
                raise

    def delete_ours(
        self,
        target: str,
        name: str,
        version: str,
        ours: Callable[[dict[str, Any]], bool] = project.is_managed,
    ) -> bool:
        """Our object of that name deleted (or gone already): True. Never someone else's: the delete names
        the resourceVersion we last read or wrote it at, and where the object changed since (ours deleted
        and another made under the name, our label removed, or only its status written), or that version
        is unknown (""), it is read again and deleted at its new version only if `ours` still holds;
        someone else's is left alone: False. An object of ours read without a resourceVersion string
        raises NoVersion: a delete without a precondition would take theirs."""
        if version:
            try:
                self.delete(target, name, version)
                return True
            except kubernetes.client.ApiException as err:
                if status_of(err) != 409:
                    raise
        live = self.get(target, name)
        if live is None:
            return True
        if not ours(live):
            return False
        now = resource_version(live)
        if not now:
            raise NoVersion(
                f"{self.gvp(target)[2]} {name} read without a resourceVersion string: not deleted"
            )
        self.delete(target, name, now)
        return True
