"""The driver's API shell: this node's ResourceSlices (list, create, update, delete), its Node (for the
owner reference), and ResourceClaims (read only). One HTTP call each over `nodeclient.Api`, the node
side's light client (the agent's, without the `kubernetes` package's 36 MiB); failures are its
`ApiFailure`. Blocking; callers run it in a worker thread.
"""

from __future__ import annotations

import http
import logging
from typing import Any

from nodefabric_devicemanager.nodeclient import Api, ApiFailure, node_uid, owner_reference, path_name
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

    def list_slices(self) -> list[dict[str, Any]]:
        """This driver's slices for this node. The field selector narrows the list on a real API server;
        the result is filtered again here, so a server that ignores the selector changes nothing."""
        selector = f"spec.nodeName={self.config.node_name},spec.driver={self.config.driver}"
        found = self.api.call("list resourceslices", "GET", SLICES_PATH, query={"fieldSelector": selector})
        items = found.get("items")
        if not isinstance(items, list):
            raise ApiFailure("rejected", "list resourceslices: the answer has no items list")
        return [i for i in items if isinstance(i, dict) and slices.ours(i, self.config)]

    def create_slice(self, body: dict[str, Any]) -> None:
        # A 409 (AlreadyExists) is a "conflict": the publisher lists again and decides again.
        self.api.call(f"create resourceslice {body['metadata']['name']}", "POST", SLICES_PATH, body=body)

    def update_slice(self, body: dict[str, Any], resource_version: str) -> None:
        """A merge patch of the whole spec, preconditioned on the resourceVersion we compared with (the
        device list is replaced whole)."""
        name = body["metadata"]["name"]
        patch = {"metadata": {**body["metadata"], "resourceVersion": resource_version}, "spec": body["spec"]}
        self.api.call(
            f"update resourceslice {name}",
            "PATCH",
            f"{SLICES_PATH}/{path_name(name)}",
            body=patch,
            content_type=MERGE_PATCH,
        )

    def delete_slice(self, name: str, resource_version: str) -> None:
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"resourceVersion": resource_version},
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
