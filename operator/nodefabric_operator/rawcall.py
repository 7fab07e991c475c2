"""One request through a kubernetes ApiClient without its generated API classes.

The ApiClient still does what matters: the kubeconfig's or service account's auth (a refreshed token
included), TLS, the connection pool. What the generated calls add costs CPU on every request of a
first sync and buys the operator nothing: a pydantic `validate_call` of every argument (and of an
Event's whole body, rebuilt as a `CoreV1Event`), and, for `CoreV1Api`, 0.7 s of CPU to import. The
answer is raised as the generated calls raise it (ApiException and its per-status subclasses), so every
caller's handling of 404, 409 and 422 is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import kubernetes

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


def status_of(err: BaseException) -> int:
    """The HTTP status of a refused request (ApiException and its per-status subclasses); 0 for anything
    else (no answer at all: a connection refused, a timeout)."""
    return int(getattr(err, "status", 0) or 0) if isinstance(err, kubernetes.client.ApiException) else 0


def send(
    api: kubernetes.client.ApiClient,
    method: str,
    path: str,
    params: Mapping[str, str],
    body: Any = None,
    *,
    content_type: str = JSON,
    query: Sequence[tuple[str, str | int]] = (),
) -> bytes:
    """The answer's bytes; ApiException for an answer outside 2xx. `path` has `{name}` placeholders
    filled from `params` (quoted by the client), and `query` is its query string (quoted too)."""
    request = api.param_serialize(
        method=method,
        resource_path=path,
        path_params=dict(params),
        query_params=list(query),
        header_params={"Accept": JSON, "Content-Type": content_type},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request)
    data: bytes = response.read()  # type: ignore[no-untyped-call]
    if not 200 <= response.status <= 299:
        raise kubernetes.client.ApiException.from_response(http_resp=response, body=None, data=None)
    return data


def json_object(data: bytes) -> dict[str, Any]:
    """An answer read as a JSON object (what the generated custom-object calls return); ValueError if the
    API server answered anything else."""
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError(f"the API server answered a {type(obj).__name__}, not an object")
    return obj
