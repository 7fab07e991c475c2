"""The driver's API shell: this node's ResourceSlices (list, create, update, delete), its Node (for the
owner reference), and ResourceClaims (read only). Blocking; callers run it in a worker thread.

Built-in `resource.k8s.io/v1` objects are handled as plain dicts through the generic object API, so the
code does not depend on the client library's generated models for a young API group.
"""

from __future__ import annotations

import http
import logging
from typing import Any, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodefabric_deviceplugin.dra import claims, slices
from nodefabric_deviceplugin.dra.config import DriverConfig

log = logging.getLogger(__name__)

# A black-holed API server must not hold a sync, a prepare or a SIGTERM for long: (connect, read) seconds.
REQUEST_TIMEOUT = (3.0, 10.0)


class ApiError(Exception):
    """A request the API did not answer with success. `conflict`: re-read and decide again; `missing`:
    404; `unavailable`: 5xx, 429 or no connection (retry later); `rejected`: any other answer."""

    def __init__(self, kind: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


def _error(exc: Exception, what: str) -> ApiError:
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = f"{what}: HTTP {status} {exc.reason or ''}".rstrip()
        if status == http.HTTPStatus.CONFLICT:
            return ApiError("conflict", message, status)
        if status == http.HTTPStatus.NOT_FOUND:
            return ApiError("missing", message, status)
        if status in (0, http.HTTPStatus.TOO_MANY_REQUESTS) or status >= 500:
            return ApiError("unavailable", message, status)
        return ApiError("rejected", message, status)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return ApiError("unavailable", f"{what}: {exc}")
    raise exc


class DraApi:
    def __init__(self, api_client: client.ApiClient, config: DriverConfig) -> None:
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self.config = config

    def node_owner(self) -> dict[str, Any] | None:
        """The owner reference to this node (its slices go when it goes); None when the Node is gone."""
        node = self.config.node_name
        try:
            obj = self._core.read_node(node, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:
                return None
            raise _error(exc, f"read node {node}") from exc
        except Exception as exc:
            raise _error(exc, f"read node {node}") from exc
        uid = obj.metadata.uid if obj.metadata is not None else None
        if not uid:
            raise ApiError("rejected", f"node {node} has no uid")
        return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": str(uid)}

    def list_slices(self) -> list[dict[str, Any]]:
        """This driver's slices for this node. The field selector narrows the list on a real API server;
        the result is filtered again here, so a server that ignores the selector changes nothing."""
        selector = f"spec.nodeName={self.config.node_name},spec.driver={self.config.driver}"
        try:
            found = self._custom.list_cluster_custom_object(
                slices.GROUP,
                slices.VERSION,
                slices.PLURAL,
                field_selector=selector,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except Exception as exc:
            raise _error(exc, "list resourceslices") from exc
        items = found.get("items") if isinstance(found, dict) else None
        if not isinstance(items, list):
            raise ApiError("rejected", "list resourceslices: the answer has no items list")
        return [i for i in items if isinstance(i, dict) and slices.ours(i, self.config)]

    def create_slice(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        try:
            self._custom.create_cluster_custom_object(
                slices.GROUP, slices.VERSION, slices.PLURAL, body, _request_timeout=REQUEST_TIMEOUT
            )
        except Exception as exc:
            raise _error(exc, f"create resourceslice {name}") from exc

    def update_slice(self, body: dict[str, Any], resource_version: str) -> None:
        """A merge patch of the whole spec, preconditioned on the resourceVersion we compared with (the
        device list is replaced whole)."""
        name = body["metadata"]["name"]
        patch = {"metadata": {**body["metadata"], "resourceVersion": resource_version}, "spec": body["spec"]}
        try:
            self._custom.patch_cluster_custom_object(
                slices.GROUP, slices.VERSION, slices.PLURAL, name, patch, _request_timeout=REQUEST_TIMEOUT
            )
        except Exception as exc:
            raise _error(exc, f"update resourceslice {name}") from exc

    def delete_slice(self, name: str, resource_version: str) -> None:
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(resource_version=resource_version)
        )
        try:
            self._custom.delete_cluster_custom_object(
                slices.GROUP,
                slices.VERSION,
                slices.PLURAL,
                name,
                body=options,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:
                return  # already gone: what we wanted
            raise _error(exc, f"delete resourceslice {name}") from exc
        except Exception as exc:
            raise _error(exc, f"delete resourceslice {name}") from exc

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ResourceClaim; None when it does not exist."""
        try:
            obj = self._custom.get_namespaced_custom_object(
                claims.GROUP, claims.VERSION, namespace, claims.PLURAL, name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:
                return None
            raise _error(exc, f"read resourceclaim {namespace}/{name}") from exc
        except Exception as exc:
            raise _error(exc, f"read resourceclaim {namespace}/{name}") from exc
        return cast(dict[str, Any], obj)
