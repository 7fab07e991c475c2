"""The agent's API requests: read the Node, create / patch the Devices object and its status, watch it,
post an Event. One HTTP call each, over `api.Api`.

Blocking; the agent calls it from a worker thread. Every failure is turned into an `ApiFailure` that says
whether trying again can help, so the caller never guesses from a status code.
"""

from __future__ import annotations

import http
import logging
import random
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nodefabric_devicemanager.agent.api import Api, ApiError, Cancel
from nodefabric_devicemanager.models import GROUP, KIND, PLURAL, VERSION

log = logging.getLogger(__name__)

DEVICES_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
MERGE_PATCH = "application/merge-patch+json"
# Events about a cluster-scoped object live in "default", as the API server's own Node events do.
EVENT_NAMESPACE = "default"
COMPONENT = "nodefabric-agent"
# The API server ends a watch after timeoutSeconds; a random length spreads a fleet's reconnects.
WATCH_SECONDS = (300, 600)


class ApiFailure(Exception):
    """A request the API did not answer with success.

    kind: "conflict" (stale resourceVersion: re-read and decide again), "unavailable" (5xx, 429, no
    connection: back off and retry), "node_missing" (no Node to own the record), "gone" (a watch's
    resourceVersion is too old: list again), "rejected" (any other 4xx: retrying the same request cannot
    help; the next pass tries again)."""

    def __init__(self, kind: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.kind in ("conflict", "unavailable")


def classify(exc: ApiError) -> ApiFailure:
    status = exc.status
    if status == http.HTTPStatus.CONFLICT:
        return ApiFailure("conflict", str(exc), status)
    if status == http.HTTPStatus.GONE:
        return ApiFailure("gone", str(exc), status)
    if status in (0, http.HTTPStatus.TOO_MANY_REQUESTS) or status >= 500:
        return ApiFailure("unavailable", str(exc), status)
    return ApiFailure("rejected", str(exc), status)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: attempt n waits between half and all of min(cap, base * 2**n),
    so nodes that failed together do not all come back together."""

    base: float = 0.5
    cap: float = 30.0

    def delay(self, attempt: int) -> float:
        ceiling = min(self.cap, self.base * (2 ** min(attempt, 32)))
        return float(ceiling / 2 + random.uniform(0, ceiling / 2))


def owner_reference(node: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}


def _name(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def resource_version(obj: dict[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


class DevicesClient:
    """The requests one agent makes, each one HTTP call."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def _call(self, what: str, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return self.api.request(method, path, **kwargs)
        except ApiError as exc:
            failure = classify(exc)
            raise ApiFailure(failure.kind, f"{what}: {exc}", exc.status) from exc

    def node_uid(self, node: str) -> str:
        try:
            obj = self.api.request("GET", f"/api/v1/nodes/{_name(node)}")
        except ApiError as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:
                raise ApiFailure("node_missing", f"node {node} does not exist", 404) from exc
            raise ApiFailure(classify(exc).kind, f"read node {node}: {exc}", exc.status) from exc
        uid = (obj.get("metadata") or {}).get("uid")
        if not uid:
            raise ApiFailure("rejected", f"node {node} has no uid")
        return str(uid)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.api.request("GET", f"{DEVICES_PATH}/{_name(name)}")
        except ApiError as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:
                return None
            raise ApiFailure(classify(exc).kind, f"read devices {name}: {exc}", exc.status) from exc

    def list_one(self, name: str) -> tuple[dict[str, Any] | None, str]:
        """The object (None when absent) and the list's resourceVersion, the point a watch resumes from:
        an unchanged object's own resourceVersion may be older than the API server keeps history for."""
        listed = self._call(
            f"list devices {name}", "GET", DEVICES_PATH, query={"fieldSelector": f"metadata.name={name}"}
        )
        items = [
            i
            for i in listed.get("items") or []
            if isinstance(i, dict) and i.get("metadata", {}).get("name") == name
        ]
        return (items[0] if items else None), resource_version(listed)

    def create(self, name: str, spec: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {"name": name, "ownerReferences": [owner]},
            "spec": spec,
        }
        try:
            return self.api.request("POST", DEVICES_PATH, body=body)
        except ApiError as exc:
            if exc.status == http.HTTPStatus.CONFLICT:
                # AlreadyExists: another writer created it since our read; re-read and decide again.
                raise ApiFailure("conflict", f"create devices {name}: it already exists", 409) from exc
            raise ApiFailure(classify(exc).kind, f"create devices {name}: {exc}", exc.status) from exc

    def patch_spec(
        self,
        name: str,
        resource_version: str,
        spec: dict[str, Any] | None,
        owners: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """A merge patch preconditioned on resourceVersion; lists inside spec are replaced whole."""
        meta: dict[str, Any] = {"resourceVersion": resource_version}
        if owners is not None:
            meta["ownerReferences"] = owners
        body: dict[str, Any] = {"metadata": meta}
        if spec is not None:
            body["spec"] = spec
        return self._call(
            f"patch devices {name}",
            "PATCH",
            f"{DEVICES_PATH}/{_name(name)}",
            body=body,
            content_type=MERGE_PATCH,
        )

    def patch_status(
        self, name: str, resource_version: str, conditions: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Only status.conditions, preconditioned on resourceVersion: the list is replaced whole, so it must
        have been merged into the list this resourceVersion carries."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": {"conditions": conditions}}
        return self._call(
            f"patch devices {name} status",
            "PATCH",
            f"{DEVICES_PATH}/{_name(name)}/status",
            body=body,
            content_type=MERGE_PATCH,
        )

    def watch(self, name: str, since: str, cancel: Cancel | None = None) -> Iterator[dict[str, Any]]:
        """Events of the one object `name` after resourceVersion `since`, with bookmarks, until the API
        server ends the watch. Raises ApiFailure ("gone" when `since` is too old to resume from)."""
        seconds = random.randint(*WATCH_SECONDS)
        query = {
            "watch": "true",
            "fieldSelector": f"metadata.name={name}",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(seconds),
        }
        if since:
            query["resourceVersion"] = since
        try:
            for event in self.api.stream(DEVICES_PATH, query, timeout=seconds + 30, cancel=cancel):
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    code = int(status.get("code") or 0) if str(status.get("code") or "").isdigit() else 0
                    raise ApiError(code, f"watch devices {name}: {status.get('message') or status}")
                yield event
        except ApiError as exc:
            raise ApiFailure(classify(exc).kind, str(exc), exc.status) from exc

    def post_event(self, node: str, obj: dict[str, Any] | None, kind: str, reason: str, message: str) -> None:
        """A core/v1 Event on the node's Devices object, from this component (`kubectl describe` shows it)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta = (obj or {}).get("metadata") or {}
        involved = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": node}
        if meta.get("uid"):
            involved["uid"] = str(meta["uid"])
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{node}.", "namespace": EVENT_NAMESPACE},
            "involvedObject": involved,
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT, "host": node},
            "reportingComponent": COMPONENT,
            "reportingInstance": node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call(f"post event {reason}", "POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body=body)
