"""The agent's API shell: read the Node and the Devices object, create, patch spec, patch status.

Blocking (the `kubernetes` client); the agent calls it from a worker thread. Every failure is turned into
an `ApiFailure` that says whether trying again can help, so the caller never guesses from a status code.
"""

from __future__ import annotations

import http
import logging
import random
from dataclasses import dataclass
from typing import Any, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodefabric_devicemanager.models import GROUP, KIND, PLURAL, VERSION

log = logging.getLogger(__name__)

# A black-holed API server must not hold a pass (or a SIGTERM) for long: (connect, read) seconds.
REQUEST_TIMEOUT = (3.0, 10.0)


class ApiFailure(Exception):
    """A request the API did not answer with success.

    kind: "conflict" (stale resourceVersion: re-read and decide again), "unavailable" (5xx, 429, no
    connection: back off and retry), "node_missing" (no Node to own the record), "rejected" (any other
    4xx: retrying the same request cannot help; the next pass tries again)."""

    def __init__(self, kind: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.kind in ("conflict", "unavailable")


def classify(exc: BaseException, what: str) -> ApiFailure:
    if isinstance(exc, ApiFailure):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        detail = f"{what}: HTTP {status} {exc.reason or ''}".rstrip()
        if status == http.HTTPStatus.CONFLICT:
            return ApiFailure("conflict", detail, status)
        if status in (0, http.HTTPStatus.TOO_MANY_REQUESTS) or status >= 500:
            return ApiFailure("unavailable", detail, status)
        return ApiFailure("rejected", detail, status)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return ApiFailure("unavailable", f"{what}: {exc}")
    raise exc


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


class DevicesClient:
    """The requests one agent makes, each one HTTP call."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)

    def node_uid(self, node: str) -> str:
        try:
            obj = self._core.read_node(node, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:
                raise ApiFailure("node_missing", f"node {node} does not exist", 404) from exc
            raise classify(exc, f"read node {node}") from exc
        except Exception as exc:
            raise classify(exc, f"read node {node}") from exc
        uid = obj.metadata.uid if obj.metadata is not None else None
        if not uid:
            raise ApiFailure("rejected", f"node {node} has no uid")
        return str(uid)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            obj = self._custom.get_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:
                return None
            raise classify(exc, f"read devices {name}") from exc
        except Exception as exc:
            raise classify(exc, f"read devices {name}") from exc
        return cast(dict[str, Any], obj)

    def create(self, name: str, spec: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {"name": name, "ownerReferences": [owner]},
            "spec": spec,
        }
        try:
            obj = self._custom.create_cluster_custom_object(
                GROUP, VERSION, PLURAL, body, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == http.HTTPStatus.CONFLICT:
                # AlreadyExists: another writer created it since our read; re-read and decide again.
                raise ApiFailure("conflict", f"create devices {name}: it already exists", 409) from exc
            raise classify(exc, f"create devices {name}") from exc
        except Exception as exc:
            raise classify(exc, f"create devices {name}") from exc
        return cast(dict[str, Any], obj)

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
        try:
            obj = self._custom.patch_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, body, _request_timeout=REQUEST_TIMEOUT
            )
        except Exception as exc:
            raise classify(exc, f"patch devices {name}") from exc
        return cast(dict[str, Any], obj)

    def patch_status(
        self, name: str, resource_version: str, conditions: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Only status.conditions, preconditioned on resourceVersion: the list is replaced whole, so it must
        have been merged into the list this resourceVersion carries."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": {"conditions": conditions}}
        try:
            obj = self._custom.patch_cluster_custom_object_status(
                GROUP, VERSION, PLURAL, name, body, _request_timeout=REQUEST_TIMEOUT
            )
        except Exception as exc:
            raise classify(exc, f"patch devices {name} status") from exc
        return cast(dict[str, Any], obj)
