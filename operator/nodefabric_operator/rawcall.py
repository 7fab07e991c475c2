"""One request through a kubernetes ApiClient without its generated API classes.

The ApiClient still does what matters: the kubeconfig's or service account's auth (a refreshed token
included), TLS, the connection pool. What the generated calls add costs CPU on every request of a
first sync and buys the operator nothing: a pydantic `validate_call` of every argument (and of an
Event's whole body, rebuilt as a `CoreV1Event`), and, for `CoreV1Api`, 0.7 s of CPU to import. The
answer is raised as the generated calls raise it (ApiException and its per-status subclasses), so every
caller's handling of 404, 409 and 422 is unchanged.

The request is built here rather than by `ApiClient.param_serialize`, which walks the whole body once
to "sanitize" it and then asks for the token through the configuration's refresh hook: the kubeconfig
and in-cluster loaders' hook sets the configuration's host again on every call, and the client answers
that by reading every proxy variable of the environment. Together that was a quarter of a first sync's
request CPU; the hook is called here at most once a second (the tokens it refreshes last minutes).
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import kubernetes
import urllib3
from kubernetes.client.rest import RESTResponse

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
REFRESH_S = 1.0  # how often the configuration's token refresh hook runs, at most

_refreshed: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
_refreshing = threading.Lock()


def status_of(err: BaseException) -> int:
    """The HTTP status of a refused request (ApiException and its per-status subclasses); 0 for anything
    else (no answer at all: a connection refused, a timeout)."""
    return int(getattr(err, "status", 0) or 0) if isinstance(err, kubernetes.client.ApiException) else 0


def authorization(config: Any, clock: Any = time.monotonic) -> str | None:
    """The Authorization header's value, as `Configuration.get_api_key_with_prefix` gives it, with the
    refresh hook run at most once per REFRESH_S for this configuration (see the module's note)."""
    hook = config.refresh_api_key_hook
    if hook is not None:
        with _refreshing:
            now = clock()
            due = now - _refreshed.get(config, -REFRESH_S) >= REFRESH_S
            if due:
                _refreshed[config] = now
        if due:
            hook(config)
    keys, prefixes = config.api_key, config.api_key_prefix
    key = keys.get("BearerToken", keys.get("authorization"))
    if not key:
        return None
    prefix = prefixes.get("BearerToken", prefixes.get("authorization"))
    return f"{prefix} {key}" if prefix else str(key)


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
    filled from `params` (each quoted whole, as the client quotes them), and `query` is its query
    string (quoted too)."""
    config = api.configuration
    safe = config.safe_chars_for_path_param
    url = config.host + path.format_map({k: quote(str(v), safe=safe) for k, v in params.items()})
    if query:
        url += "?" + urlencode(list(query))
    headers = {**api.default_headers, "Accept": JSON, "Content-Type": content_type}
    if api.cookie:
        headers["Cookie"] = api.cookie
    token = authorization(config)
    if token:
        headers["authorization"] = token
    data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
    try:
        raw = api.rest_client.pool_manager.request(
            method, url, body=data, headers=headers, preload_content=False, timeout=None
        )
    except urllib3.exceptions.SSLError as err:  # as the client's own request raises it
        raise kubernetes.client.ApiException(status=0, reason=f"{type(err).__name__}\n{err}") from err
    response = RESTResponse(raw)
    answer: bytes = response.read()  # type: ignore[no-untyped-call]
    if not 200 <= response.status <= 299:
        raise kubernetes.client.ApiException.from_response(http_resp=response, body=None, data=None)
    return answer


def json_object(data: bytes) -> dict[str, Any]:
    """An answer read as a JSON object (what the generated custom-object calls return); ValueError if the
    API server answered anything else."""
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError(f"the API server answered a {type(obj).__name__}, not an object")
    return obj
