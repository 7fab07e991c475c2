"""The agent's API requests: read the Node, create / patch the Devices object and its status, watch it,
post an Event. One HTTP call each, over `nodeclient.Api`.

Blocking; the agent calls it from a worker thread. Every failure is turned into an `ApiFailure` that says
whether trying again can help, so the caller never guesses from a status code.
"""

from __future__ import annotations

import http
import logging
from collections.abc import Iterator
from typing import Any

from nodefabric_devicemanager import events, nodeclient
from nodefabric_devicemanager.models import GROUP, KIND, PLURAL, VERSION
from nodefabric_devicemanager.nodeclient import (
    Api,
    ApiFailure,
    Cancel,
    metadata,
    node_uid,
    path_name,
    resource_version,
)

log = logging.getLogger(__name__)

DEVICES_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
MERGE_PATCH = "application/merge-patch+json"
# Events about a cluster-scoped object live in "default", as the API server's own Node events do.
EVENT_NAMESPACE = "default"
COMPONENT = "nodefabric-agent"


class DevicesClient:
    """The requests one agent makes, each one HTTP call."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def node_uid(self, node: str) -> str:
        uid = node_uid(self.api, node)
        if uid is None:
            raise ApiFailure("node_missing", f"node {node} does not exist", 404)
        return uid

    def get(self, name: str) -> dict[str, Any] | None:
        return self.api.read(f"read devices {name}", f"{DEVICES_PATH}/{path_name(name)}")

    def list_one(self, name: str) -> tuple[dict[str, Any] | None, str]:
        """The object (None when absent) and the list's resourceVersion, the point a watch resumes from:
        an unchanged object's own resourceVersion may be older than the API server keeps history for."""
        listed = self.api.call(
            f"list devices {name}", "GET", DEVICES_PATH, query={"fieldSelector": f"metadata.name={name}"}
        )
        items = [
            i for i in listed.get("items") or [] if isinstance(i, dict) and metadata(i).get("name") == name
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
            return self.api.call(f"create devices {name}", "POST", DEVICES_PATH, body=body)
        except ApiFailure as exc:
            if exc.status == http.HTTPStatus.CONFLICT:
                # AlreadyExists: another writer created it since our read; re-read and decide again.
                raise ApiFailure("conflict", f"create devices {name}: it already exists", 409) from exc
            raise

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
        return self.api.call(
            f"patch devices {name}",
            "PATCH",
            f"{DEVICES_PATH}/{path_name(name)}",
            body=body,
            content_type=MERGE_PATCH,
        )

    def patch_status(
        self,
        name: str,
        resource_version: str,
        conditions: list[dict[str, Any]] | None,
        summary: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """status.conditions and the agent's summary fields, preconditioned on resourceVersion: the list
        is replaced whole, so it must have been merged into the list this resourceVersion carries."""
        status: dict[str, Any] = dict(summary or {})
        if conditions is not None:
            status["conditions"] = conditions
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return self.api.call(
            f"patch devices {name} status",
            "PATCH",
            f"{DEVICES_PATH}/{path_name(name)}/status",
            body=body,
            content_type=MERGE_PATCH,
        )

    def watch(self, name: str, since: str, cancel: Cancel | None = None) -> Iterator[dict[str, Any]]:
        """Events of the one object `name` after resourceVersion `since`, with bookmarks, until the API
        server ends the watch. Raises ApiFailure ("gone" when `since` is too old to resume from)."""
        return nodeclient.watch(
            self.api,
            DEVICES_PATH,
            f"watch devices {name}",
            f"metadata.name={name}",
            since=since,
            cancel=cancel,
        )

    def post_event(self, node: str, obj: dict[str, Any] | None, kind: str, reason: str, message: str) -> None:
        """A core/v1 Event on the node's Devices object, from this component (`kubectl describe` shows it)."""
        meta = metadata(obj)
        involved = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": node}
        if meta.get("uid"):
            involved["uid"] = str(meta["uid"])
        body = events.body(
            involved,
            namespace=EVENT_NAMESPACE,
            type_=kind,
            reason=reason,
            message=message,
            component=COMPONENT,
            instance=node,
            host=node,
        )
        self.api.call(
            f"post event {reason}", "POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body=body
        )
