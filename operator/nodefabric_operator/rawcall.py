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
request CPU; the hook is called here at most once a second (the tokens it refreshes last minutes), and
at once when the API server answers 401, the request then sent once more: a credential that expired
inside that second (an exec plugin's token is refreshed only once expired) costs a retry, not a failed
reconcile.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import kubernetes
import urllib3
from kubernetes.client.rest import RESTResponse

from nodefabric_operator import wire

log = logging.getLogger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
REFRESH_S = 1.0  # how often the configuration's token refresh hook runs, at most
# To connect, and between two reads of the answer (read at each request). A stop waits for a write in
# flight through every cancel (inflight.settled): without a bound, a hung API server would hold it.
REQUEST_TIMEOUT_S = 60.0
# What cannot go in a header. A regular expression, not a Python test of each character: a service
# account's token is about 1 KB, checked on every request.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_refreshed: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
_refreshing = threading.Lock()


def status_of(err: BaseException) -> int:
    """The HTTP status of a refused request (ApiException and its per-status subclasses); 0 for anything
    else (no answer at all: a connection refused, a timeout)."""
    return int(getattr(err, "status", 0) or 0) if isinstance(err, kubernetes.client.ApiException) else 0


def status_body(err: kubernetes.client.ApiException) -> dict[str, Any]:
    """The Status object a refusal carries (its `details` name what was not found), {} when its body is
    none: not JSON, not an object, nested past the decoder's depth."""
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError, RecursionError):
        return {}
    return body if isinstance(body, dict) else {}


def authorization(config: Any, clock: Any = time.monotonic, *, now_due: bool = False) -> str | None:
    """The Authorization header's value, as `Configuration.get_api_key_with_prefix` gives it, with the
    refresh hook run at most once per REFRESH_S for this configuration (see the module's note), or at
    once when `now_due` (the API server refused the credential)."""
    if refresh_due(config, clock, now_due=now_due):
        config.refresh_api_key_hook(config)
    return credential(config)


def refresh_due(config: Any, clock: Any = time.monotonic, *, now_due: bool = False) -> bool:
    """Whether the configuration's refresh hook is to run now (noted as run: the caller runs it)."""
    if config.refresh_api_key_hook is None:
        return False
    with _refreshing:
        now = clock()
        due = now_due or now - _refreshed.get(config, -REFRESH_S) >= REFRESH_S
        if due:
            _refreshed[config] = now
    return due


def credential(config: Any) -> str | None:
    """The Authorization header's value as the configuration holds it now (no refresh)."""
    keys, prefixes = config.api_key, config.api_key_prefix
    key = keys.get("BearerToken", keys.get("authorization"))
    if not key:
        return None
    prefix = prefixes.get("BearerToken", prefixes.get("authorization"))
    value = f"{prefix} {key}" if prefix else str(key)
    if _CONTROL.search(value):
        # Refused here, before either client sees it: http.client's refusal quotes the whole header
        # (the token) in its message, aiohttp's says nothing of where the bad value came from.
        raise UnusableCredential(
            "the API credential holds a line break or another control character, so it cannot be sent "
            "(a token file ending in a newline?); fix the kubeconfig's token or the token file"
        )
    return value


class UnusableCredential(ValueError):
    """The configuration's credential cannot go in a header (its value is never in the message)."""


def send(
    api: kubernetes.client.ApiClient,
    method: str,
    path: str,
    params: Mapping[str, str],
    body: Any = None,
    *,
    content_type: str = JSON,
    query: Sequence[tuple[str, str | int]] = (),
    stopping: threading.Event | None = None,
    timeout: tuple[float, float] | None = None,
) -> bytes:
    """The answer's bytes; ApiException for an answer outside 2xx. `path` has `{name}` placeholders
    filled from `params` (each quoted whole, as the client quotes them), and `query` is its query
    string (quoted too). Not sent again once `stopping` is set (send_prepared). `timeout`: to connect,
    and between two reads of the answer (the leader lease's are shorter than its renew deadline);
    REQUEST_TIMEOUT_S for both when None."""
    url, headers, data = prepared(api, method, path, params, body, content_type=content_type, query=query)
    resend = wire.resendable(method, body, content_type)
    return send_prepared(api, method, url, headers, data, resend=resend, stopping=stopping, timeout=timeout)


def send_prepared(
    api: kubernetes.client.ApiClient,
    method: str,
    url: str,
    headers: dict[str, str],
    data: bytes | None,
    *,
    resend: bool = False,
    stopping: threading.Event | None = None,
    timeout: tuple[float, float] | None = None,
) -> bytes:
    """`send` of a request already `prepared`; `resend`: whether it may be sent once more after its
    connection closed with no answer (wire.resendable); never once `stopping` is set (the operator
    stopping waits for this request, and nothing is sent after the stop: inflight.py)."""
    config = api.configuration
    token = authorization(config)
    try:
        return _sent(
            api, method, url, headers, data, token=token, resend=resend, stopping=stopping, timeout=timeout
        )
    except kubernetes.client.ApiException as err:
        if not wire.refresh_and_resend(status_of(err), config.refresh_api_key_hook is not None):
            raise
        if stopping is not None and stopping.is_set():
            raise
        refused = err
    # Refused inside the hook's second (a credential that expired meanwhile): refreshed now, sent once
    # more (wire.refresh_and_resend, as the loop's client does). A 401 is no transient error to the
    # callers, so without this it would fail the reconcile.
    token = authorization(config, now_due=True)
    if stopping is not None and stopping.is_set():
        # The stop came while the hook ran (an exec plugin's takes a while): the refusal stands.
        raise refused
    return _sent(
        api, method, url, headers, data, token=token, resend=resend, stopping=stopping, timeout=timeout
    )


def _sent(
    api: kubernetes.client.ApiClient,
    method: str,
    url: str,
    headers: dict[str, str],
    data: bytes | None,
    *,
    token: str | None,
    resend: bool,
    stopping: threading.Event | None,
    timeout: tuple[float, float] | None = None,
) -> bytes:
    """`_request`, sent once more when its connection closed with no answer and `resend` (wire.py),
    unless `stopping` is set by then."""
    try:
        return _request(api, method, url, headers, data, token=token, timeout=timeout)
    except (urllib3.exceptions.ProtocolError, urllib3.exceptions.MaxRetryError) as err:
        if not (resend and closed_unanswered(err)) or (stopping is not None and stopping.is_set()):
            raise
        log.debug("connection closed with no answer, sent once more", extra={"method": method})
    return _request(api, method, url, headers, data, token=token, timeout=timeout)


def closed_unanswered(err: BaseException) -> bool:
    """Whether urllib3's error says the connection closed (or was reset) before any answer came, as
    opposed to one never made (refused, a timeout: sending again at once would meet the same), or an
    answer begun and then cut off or garbled (AnswerBroken; http.client's BadStatusLine for what came in
    place of a status line): that request was read and answered, as the loop's client takes it too."""
    if isinstance(err, urllib3.exceptions.MaxRetryError):
        err = err.reason if err.reason is not None else err
    if not isinstance(err, urllib3.exceptions.ProtocolError) or isinstance(err, AnswerBroken):
        return False
    # urllib3's "Connection aborted.": the cause second. RemoteDisconnected (a close before a byte of
    # the answer) and a reset are OSErrors; a garbled status line is not.
    return any(isinstance(arg, OSError) for arg in err.args)


class AnswerBroken(urllib3.exceptions.ProtocolError):
    """The answer's head came, and its body was then cut off or garbled (urllib3's ProtocolError, read
    as it is by every caller: transient); never a reason to send the request again."""


def prepared(
    api: kubernetes.client.ApiClient,
    method: str,
    path: str,
    params: Mapping[str, str],
    body: Any = None,
    *,
    content_type: str = JSON,
    query: Sequence[tuple[str, str | int]] = (),
) -> tuple[str, dict[str, str], bytes | None]:
    """A request's URL, headers (no credential) and body, as `send` sends it (the loop's client too)."""
    config = api.configuration
    safe = config.safe_chars_for_path_param
    url = config.host + path.format_map({k: quote(str(v), safe=safe) for k, v in params.items()})
    if query:
        url += "?" + urlencode(list(query))
    headers = {**api.default_headers, "Accept": JSON, "Content-Type": content_type}
    if api.cookie:
        headers["Cookie"] = api.cookie
    data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
    return url, headers, data


def _request(
    api: kubernetes.client.ApiClient,
    method: str,
    url: str,
    headers: dict[str, str],
    data: bytes | None,
    *,
    token: str | None,
    timeout: tuple[float, float] | None = None,
) -> bytes:
    if token:
        headers = {**headers, "authorization": token}
    connect, read = timeout or (REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_S)
    try:
        raw = api.rest_client.pool_manager.request(
            method,
            url,
            body=data,
            headers=headers,
            preload_content=False,
            # REQUEST_TIMEOUT_S read now, not bound as a default: a test (or an embedder) may set it.
            timeout=urllib3.Timeout(connect=connect, read=read),
        )
    except urllib3.exceptions.SSLError as err:  # as the client's own request raises it
        raise kubernetes.client.ApiException(status=0, reason=f"{type(err).__name__}\n{err}") from err
    if raw.status < 200:
        # An interim answer (103 Early Hints from a proxy) that http.client, reading past a 100 only,
        # took for the answer: the real one follows unread on the connection, where the next request
        # would read it as its own. Closed with it; the request was read, so it is not sent again.
        _drop(raw)
        raise AnswerBroken(
            f"an interim answer ({raw.status}) where the answer was due: the connection is dropped"
        )
    response = RESTResponse(raw)
    answer = read_answer(raw)
    response.data = answer  # type: ignore[assignment]  # what its read() would keep
    if not 200 <= response.status <= 299:
        raise kubernetes.client.ApiException.from_response(http_resp=response, body=None, data=None)
    return answer


def read_answer(raw: urllib3.BaseHTTPResponse) -> bytes:
    """The body of an answer whose head was read (a urllib3 response not preloaded: this client's, or a
    generated call's made with `_preload_content=False`), read as this client reads every answer: a
    Content-Length that is no length, a body cut off or garbled, or an empty body with neither length nor
    chunks are AnswerBroken, a body past wire.MAX_ANSWER AnswerTooLarge, the connection closed unread."""
    said = raw.headers.get("Content-Length")
    if said is not None and raw.length_remaining is None and not raw.chunked:
        # A Content-Length that is no length ("1 0", a word, a negative): aiohttp refuses the head;
        # http.client would read up to a close a kept-alive connection never makes (the read timeout).
        _drop(raw)
        raise AnswerBroken(f"an answer whose Content-Length ({said[:40]!r}) is no length")
    # Neither a length nor chunks: a body up to the close, as an HTTP/1.0 proxy may send one. Or a head
    # cut off by the close (http.client takes whatever came for the whole head): then no body at all.
    unframed = raw.length_remaining is None and not raw.chunked
    try:
        answer = _body(raw)
    except urllib3.exceptions.ProtocolError as err:
        raise AnswerBroken(*err.args) from err
    if unframed and not answer:
        # Every answer of the API server, a refusal included, is an object: an empty one is a head cut
        # off (a 200 taken as written, a "404 Not Fo" as the record gone), refused as a broken one.
        raise AnswerBroken(
            f"an answer ({raw.status}) with no length and no body: its head cut off by a close?"
        )
    return answer


def _body(raw: urllib3.BaseHTTPResponse) -> bytes:
    """The answer's body, at most wire.MAX_ANSWER bytes of it (see wire.py); AnswerTooLarge beyond, the
    connection closed unread. Every byte read, the connection goes back to the pool."""
    size = raw.length_remaining  # urllib3's reading of Content-Length; None without one
    if wire.too_large(size):
        _drop(raw)
        raise wire.AnswerTooLarge(size)
    # Always a piece at a time, counted, never one read to the end: http.client reads up to the close
    # when it makes no length of the header (a negative one, a list), whatever urllib3 made of it. A
    # piece is no more than the length left when http.client knows it (nothing allocated beyond it).
    body = bytearray()
    while piece := raw.read(wire.CHUNK):
        body += piece
        if wire.too_large(len(body)):
            _drop(raw)
            raise wire.AnswerTooLarge()
    return bytes(body)


def _drop(raw: urllib3.BaseHTTPResponse) -> None:
    # Closed, not drained (the rest may never end); the pool opens a new connection in its place.
    raw.close()
    raw.release_conn()


def json_object(data: bytes) -> dict[str, Any]:
    """An answer read as a JSON object (what the generated custom-object calls return); ValueError if the
    API server answered anything else (one nested deeper than the decoder recurses included: its
    RecursionError, from a 200 KB answer of brackets, is no error any caller handles)."""
    try:
        obj = json.loads(data)
    except RecursionError as err:
        raise ValueError("the API server's answer is nested too deeply to read") from err
    except ValueError as err:  # not JSON (a proxy's HTML page), or not UTF-8: said so, not bare
        raise ValueError(f"the API server's answer is not JSON: {err}") from err
    if not isinstance(obj, dict):
        raise ValueError(f"the API server answered a {type(obj).__name__}, not an object")
    return obj
