"""The driver's API shell: this node's ResourceSlices (list, watch, create, update, delete), its Node (for
the owner reference), and ResourceClaims (read only). One HTTP call each over `nodeclient.Api`, the node
side's light client (the agent's, without the `kubernetes` package's 36 MiB); failures are its
`ApiFailure`. Blocking; callers run it in a worker thread.
"""

from __future__ import annotations

import http
import logging
from collections.abc import Iterator
from typing import Any

from nodefabric_devicemanager.nodeclient import (
    Api,
    ApiFailure,
    Cancel,
    node_uid,
    owner_reference,
    path_name,
    resource_version,
    watch,
)
from nodefabric_deviceplugin.dra import claims, slices
from nodefabric_deviceplugin.dra.config import DriverConfig

log = logging.getLogger(__name__)

SLICES_PATH = f"/apis/{slices.GROUP}/{slices.VERSION}/{slices.PLURAL}"
MERGE_PATCH = "application/merge-patch+json"


def claim_path(namespace: str, name: str) -> str:
    return (
        f"/apis/{claims.GROUP}/{claims.VERSION}/namespaces/{path_name(namespace)}/{claims.PLURAL}/"
        f"{path_name(name)}"
    )


class DraApi:
    def __init__(self, api: Api, config: DriverConfig) -> None:
        self.api = api
        self.config = config

    def node_owner(self) -> dict[str, Any] | None:
        """The owner reference to this node (its slices go when it goes); None when the Node is gone."""
        uid = node_uid(self.api, self.config.node_name)
        return None if uid is None else owner_reference(self.config.node_name, uid)

    @property
    def selector(self) -> str:
        """This node's slices of this driver. A resource.k8s.io/v1 API server selects by both fields, and
        refuses (400) a field it cannot select by rather than ignoring it, so answers are not filtered
        again here."""
        return f"spec.nodeName={self.config.node_name},spec.driver={self.config.driver}"

    def list_slices(self) -> tuple[list[dict[str, Any]], str]:
        """This driver's slices for this node, and the list's resourceVersion (where a watch resumes)."""
        found = self.api.call(
            "list resourceslices", "GET", SLICES_PATH, query={"fieldSelector": self.selector}
        )
        items = found.get("items")
        if not isinstance(items, list):
            raise ApiFailure("rejected", "list resourceslices: the answer has no items list")
        return [i for i in items if isinstance(i, dict)], resource_version(found)

    def watch_slices(self, since: str, cancel: Cancel | None = None) -> Iterator[dict[str, Any]]:
        """Events of this node's slices after resourceVersion `since`, until the API server ends the watch.
        Raises ApiFailure ("gone": `since` is older than the server's history; list again)."""
        return watch(self.api, SLICES_PATH, "watch resourceslices", self.selector, since=since, cancel=cancel)

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """The slice as created. A 409 (AlreadyExists) is a "conflict": the publisher lists and decides
        again."""
        return self.api.call(
            f"create resourceslice {body['metadata']['name']}", "POST", SLICES_PATH, body=body
        )

    def update_slice(self, body: dict[str, Any], version: str) -> dict[str, Any]:
        """The slice as updated by a merge patch of the whole spec, preconditioned on the resourceVersion
        we compared with (the device list is replaced whole)."""
        name = body["metadata"]["name"]
        patch = {"metadata": {**body["metadata"], "resourceVersion": version}, "spec": body["spec"]}
        return self.api.call(
            f"update resourceslice {name}",
            "PATCH",
            f"{SLICES_PATH}/{path_name(name)}",
            body=patch,
            content_type=MERGE_PATCH,
        )

    def delete_slice(self, name: str, version: str) -> None:
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"resourceVersion": version},
        }
        try:
            self.api.call(
                f"delete resourceslice {name}", "DELETE", f"{SLICES_PATH}/{path_name(name)}", body=options
            )
        except ApiFailure as exc:
            if exc.status != http.HTTPStatus.NOT_FOUND:
                raise
            # Already gone: what we wanted.

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ResourceClaim; None when it does not exist."""
        return self.api.read(f"read resourceclaim {namespace}/{name}", claim_path(namespace, name))
