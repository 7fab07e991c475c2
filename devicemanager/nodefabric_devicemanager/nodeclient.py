"""The node side's connection to the Kubernetes API: kubeconfig or in-cluster credentials, JSON requests,
watches, and what a failed request means. The agent (its Devices object) and the DRA driver (its
ResourceSlices, the ResourceClaims it prepares) both speak through it, in one process or apart.

Why not the `kubernetes` package: importing it costs about 36 MiB of resident memory (it loads every API
model class), more than half of the agent's 64 MiB budget on a node, for the dozen requests the node side
makes. This module speaks those requests over the standard library's `http.client`. The cluster side
(operator, extender) keeps the `kubernetes` package through `kubeclient.py`.

What it reads from a kubeconfig: the current context's cluster (`server`, `certificate-authority[-data]`,
`insecure-skip-tls-verify`, `tls-server-name`) and user (`token`, `tokenFile`, `client-certificate[-data]`
with `client-key[-data]`). Credential plugins (`exec`, `auth-provider`) are refused with one line at
start: the agent runs on its service account in a cluster, and a plugin is a program we would run on
every node. In a cluster it uses the service account's token (re-read when the kubelet rotates it) and CA.

Every call blocks; callers run it on a worker thread with a deadline, so a hung API server never holds
a pass, a kubelet call or a SIGTERM.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http
import http.client
import json
import logging
import os
import random
import socket
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from nodefabric_devicemanager.backoff import Backoff as Backoff  # noqa: PLC0414 (re-exported)

log = logging.getLogger(__name__)

# A black-holed API server must not hold a request for long.
REQUEST_TIMEOUT_S = 10.0
# The largest response body or watch line accepted: a Devices object of an 8 PF x 128 VF node is 430 KiB.
MAX_BODY_BYTES = 32 * 1024 * 1024
# The API server ends a watch after timeoutSeconds; a random length spreads a fleet's reconnects.
WATCH_SECONDS = (300, 600)
# A watch open this long before it ended was healthy: the next one opens at once. One that ended sooner
# counts toward the backoff, as client-go's reflector paces its restarts.
WATCH_HEALTHY_AFTER_S = 5.0
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
USER_AGENT = "nodefabric-agent"
_RETRYABLE_SEND = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class ConfigError(ValueError):
    """The credentials cannot be loaded; the message is one line an operator can act on."""


class ApiError(Exception):
    """An HTTP answer other than 2xx. `status` 0: no answer at all (connection refused, timeout)."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class ApiFailure(Exception):
    """A request the API did not answer with success, and what trying again can do.

    kind: "conflict" (stale resourceVersion, or the object already exists: re-read and decide again),
    "unavailable" (5xx, 429, no connection: back off and retry), "gone" (a watch's resourceVersion is too
    old: list again), "rejected" (any other 4xx: retrying the same request cannot help). A caller may add
    kinds of its own for answers it expects (the agent's "node_missing")."""

    def __init__(self, kind: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.kind in ("conflict", "unavailable")


def classify(exc: ApiError, what: str = "") -> ApiFailure:
    """The failure `exc` is, its message prefixed with `what` the caller was doing."""
    status = exc.status
    message = f"{what}: {exc}" if what else str(exc)
    if status == http.HTTPStatus.CONFLICT:
        return ApiFailure("conflict", message, status)
    if status == http.HTTPStatus.GONE:
        return ApiFailure("gone", message, status)
    if status in (0, http.HTTPStatus.TOO_MANY_REQUESTS) or status >= 500:
        return ApiFailure("unavailable", message, status)
    return ApiFailure("rejected", message, status)


def path_name(name: str) -> str:
    """An object name as one path segment: a name the API server would refuse must not become a path."""
    return urllib.parse.quote(name, safe="")


def metadata(obj: Any) -> dict[str, Any]:
    """An object's metadata; {} when there is none, or the answer is not shaped like an object at all (a
    broken proxy or API server): one odd answer must cost that answer, never the loop reading it."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def resource_version(obj: Any) -> str:
    version = metadata(obj).get("resourceVersion")
    return version if isinstance(version, str) else ""


def owner_reference(node: str, uid: str) -> dict[str, Any]:
    """An owner reference to a Node: what is owned goes when the Node goes."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}


def node_uid(api: Api, node: str) -> str | None:
    """The uid of the Node `node`, read fresh (a Node deleted and registered again has a new one); None
    when it does not exist. Raises ApiFailure ("rejected" for an answer without a uid)."""
    obj = api.read(f"read node {node}", f"/api/v1/nodes/{path_name(node)}")
    if obj is None:
        return None
    uid = metadata(obj).get("uid")
    if not isinstance(uid, str) or not uid:
        raise ApiFailure("rejected", f"node {node} has no uid")
    return uid


@dataclass(frozen=True, slots=True)
class Credentials:
    """Where the API is and how to authenticate: what the kubeconfig or the service account said."""

    server: str
    ssl_context: ssl.SSLContext | None = None
    tls_server_name: str | None = None
    token: str | None = None
    token_file: str | None = None
    user_agent: str = USER_AGENT


class _TokenFile:
    """A bearer token file, re-read when it changes (projected service-account tokens rotate hourly)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._token = ""
        self._lock = threading.Lock()

    def get(self) -> str:
        with self._lock:
            try:
                st = os.stat(self.path)
                stamp = (st.st_ino, st.st_mtime_ns)
                if stamp != self._stamp:
                    with open(self.path, encoding="utf-8") as f:
                        self._token = f.read().strip()
                    self._stamp = stamp
            except OSError:
                pass  # keep the last token; the API's 401 will say what is wrong
            return self._token


class Cancel:
    """Ends watches from another thread: a blocked read cannot see a flag, so their sockets are shut."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._conns: set[http.client.HTTPConnection] = set()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._lock:
            self._set = True
            conns, self._conns = self._conns, set()
        for conn in conns:
            _shut(conn)

    def _add(self, conn: http.client.HTTPConnection) -> bool:
        with self._lock:
            if not self._set:
                self._conns.add(conn)
        return not self._set

    def _discard(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conns.discard(conn)


def _shut(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class Api:
    """One API server. Thread-safe: requests share one keep-alive connection, each watch has its own."""

    def __init__(self, credentials: Credentials) -> None:
        url = urllib.parse.urlsplit(credentials.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(f"the API server address is not an http(s) URL: {credentials.server!r}")
        self.credentials = credentials
        self.server = credentials.server
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        self._ssl = credentials.ssl_context
        if self._https and self._ssl is None:
            self._ssl = ssl.create_default_context()
        self._server_name = credentials.tls_server_name
        self._token: Callable[[], str] | None = None
        if credentials.token_file:
            self._token = _TokenFile(credentials.token_file).get
        elif credentials.token:
            token = credentials.token
            self._token = lambda: token
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._counter_lock = threading.Lock()
        self.bytes_received = 0  # response bytes (headers excluded): what the agent costs the API server
        self.requests = 0

    # --- connections ---------------------------------------------------------------------------------

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if not self._https:
            return http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        if self._server_name:
            # http.client names the host it dials in SNI and the hostname check; tls-server-name overrides.
            server_name = self._server_name
            context = self._ssl

            def connect() -> None:
                sock = socket.create_connection((self._host, self._port), timeout)
                assert context is not None
                conn.sock = context.wrap_socket(sock, server_hostname=server_name)

            conn.connect = connect  # type: ignore[method-assign]
        return conn

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self.credentials.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        token = self._token() if self._token is not None else ""
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _url(self, path: str, query: Mapping[str, str] | None) -> str:
        return self._prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")

    def _count(self, body_bytes: int) -> None:
        with self._counter_lock:
            self.requests += 1
            self.bytes_received += body_bytes

    def close(self) -> None:
        """Shut the request connection, without waiting for a request a stuck thread may still hold."""
        conn = self._conn
        if conn is not None:
            _shut(conn)

    # --- requests ------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> dict[str, Any]:
        """One JSON request. Raises ApiError for a non-2xx answer or none at all."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = self._headers(content_type if data is not None else None)
        url = self._url(path, query)
        with self._lock:
            for attempt in (0, 1):
                reused = self._conn is not None
                if self._conn is None:
                    self._conn = self._connect(timeout)
                conn = self._conn
                conn.timeout = timeout
                try:
                    conn.request(method, url, body=data, headers=headers)
                    resp = conn.getresponse()
                    raw = resp.read(MAX_BODY_BYTES + 1)
                except _RETRYABLE_SEND as exc:
                    self._drop()
                    # The server closed an idle keep-alive connection: the request never reached it.
                    if reused and attempt == 0:
                        continue
                    raise ApiError(0, f"{method} {path}: {exc}") from exc
                except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
                    self._drop()
                    raise ApiError(0, f"{method} {path}: {exc or type(exc).__name__}") from exc
                if resp.will_close or len(raw) > MAX_BODY_BYTES:
                    self._drop()
                break
        self._count(len(raw))
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(0, f"{method} {path}: answer larger than {MAX_BODY_BYTES} bytes")
        if not 200 <= resp.status < 300:
            raise _error(method, path, resp.status, raw)
        try:
            obj = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ApiError(0, f"{method} {path}: the answer is not JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise ApiError(0, f"{method} {path}: the answer is not a JSON object")
        return obj

    def call(self, what: str, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """`request`, its failure classified: raises ApiFailure whose message starts with `what`."""
        try:
            return self.request(method, path, **kwargs)
        except ApiError as exc:
            raise classify(exc, what) from exc

    def read(self, what: str, path: str) -> dict[str, Any] | None:
        """GET one object; None when it does not exist (404). Raises ApiFailure."""
        try:
            return self.request("GET", path)
        except ApiError as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:
                return None
            raise classify(exc, what) from exc

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def stream(
        self, path: str, query: Mapping[str, str], *, timeout: float, cancel: Cancel | None = None
    ) -> Iterator[dict[str, Any]]:
        """A watch: one JSON event per line until the server ends the stream or `cancel` is set.
        Raises ApiError."""
        conn = self._connect(timeout)
        try:
            try:
                conn.connect()
                if cancel is not None and not cancel._add(conn):
                    return
                conn.request("GET", self._url(path, query), headers=self._headers(None))
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
                if cancel is not None and cancel.is_set():
                    return
                raise ApiError(0, f"watch {path}: {exc or type(exc).__name__}") from exc
            if resp.status != 200:
                raw = resp.read(MAX_BODY_BYTES)
                self._count(len(raw))
                raise _error("watch", path, resp.status, raw)
            self._count(0)
            while cancel is None or not cancel.is_set():
                try:
                    line = resp.readline(MAX_BODY_BYTES + 1)
                except (OSError, http.client.HTTPException, ssl.SSLError, ValueError) as exc:
                    if cancel is not None and cancel.is_set():
                        return
                    raise ApiError(0, f"watch {path}: {exc or type(exc).__name__}") from exc
                if not line:
                    return  # the server ended the watch (its timeoutSeconds)
                self._count(len(line))
                if len(line) > MAX_BODY_BYTES:
                    raise ApiError(0, f"watch {path}: an event larger than {MAX_BODY_BYTES} bytes")
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError as exc:
                    raise ApiError(0, f"watch {path}: an event is not JSON ({exc})") from exc
                if isinstance(event, dict):
                    yield event
        finally:
            if cancel is not None:
                cancel._discard(conn)
            conn.close()


def watch(
    api: Api, path: str, what: str, field_selector: str, *, since: str, cancel: Cancel | None = None
) -> Iterator[dict[str, Any]]:
    """Events of the objects `field_selector` picks under `path`, after resourceVersion `since` (from now
    when empty), with bookmarks, until the API server ends the watch after a random 300-600 s. Raises
    ApiFailure ("gone" when `since` is older than the server keeps history for)."""
    seconds = random.randint(*WATCH_SECONDS)
    query = {
        "watch": "true",
        "fieldSelector": field_selector,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(seconds),
    }
    if since:
        query["resourceVersion"] = since
    try:
        for event in api.stream(path, query, timeout=seconds + 30, cancel=cancel):
            if event.get("type") == "ERROR":
                status = event.get("object")
                status = status if isinstance(status, dict) else {}
                code = int(status.get("code") or 0) if str(status.get("code") or "").isdigit() else 0
                raise ApiError(code, f"{what}: {status.get('message') or status}")
            yield event
    except ApiError as exc:
        raise classify(exc) from exc


class ResumableWatch:
    """Runs a watch for as long as asked, on a daemon thread (a silent API server holds a thread, never
    the event loop or a SIGTERM), resumed from the last resourceVersion it saw: a list's, an event's, a
    bookmark's, or a write's the owner reports (`resume_from`). `on_event(event)` is called on the event
    loop for every ADDED/MODIFIED/DELETED event whose object `keep` accepts; `relist()` (awaited) lists
    again when there is nothing to resume from (at start, and once after a 410 Gone) and sets `since`
    (left empty when the list failed: the watch backs off and asks again). A failed watch, an expired one
    and an event of an odd shape each cost one reconnect, never the watch itself."""

    def __init__(
        self,
        what: str,
        open_: Callable[[str, Cancel], Iterator[dict[str, Any]]],
        on_event: Callable[[dict[str, Any]], None],
        relist: Callable[[], Awaitable[Any]],
        *,
        keep: Callable[[dict[str, Any]], bool] = lambda obj: True,
        backoff: Backoff | None = None,
        healthy_after: float = WATCH_HEALTHY_AFTER_S,
    ) -> None:
        self.what = what
        self.open = open_
        self.on_event = on_event
        self.relist = relist
        self.keep = keep
        self.backoff = backoff or Backoff(base=1.0, cap=60.0)
        self.healthy_after = healthy_after
        self.since = ""  # the resourceVersion to resume from: the last list, event, bookmark or write
        self.connects = 0
        # The last attempt failed and no stream has worked since: the owner's copy may be going stale.
        self.failing = False
        self._cancel = Cancel()

    def resume_from(self, resource_version_: str) -> None:
        """Where the next watch starts (after a list or a write of the owner's)."""
        if resource_version_:
            self.since = resource_version_

    def _consume(self, loop: asyncio.AbstractEventLoop, since: str) -> str:
        """Blocking: stream events until the server ends the watch. Returns the last version seen."""
        last = since
        for event in self.open(since, self._cancel):
            obj = event.get("object")
            if not isinstance(obj, dict) or not metadata(obj):
                continue  # not an object: nothing in it can be kept or resumed from
            self.failing = False
            last = resource_version(obj) or last
            if event.get("type") == "BOOKMARK" or not self.keep(obj):
                continue
            loop.call_soon_threadsafe(self.on_event, event)
        return last

    def _start(self, since: str) -> asyncio.Future[str]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()

        def settle(result: str | None, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result or "")

        def body() -> None:
            try:
                result = self._consume(loop, since)
            except BaseException as exc:  # handed to the awaiting task, which decides
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                    loop.call_soon_threadsafe(settle, None, exc)
            else:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(settle, result, None)

        threading.Thread(target=body, name=f"watch {self.what}", daemon=True).start()
        return fut

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        self._cancel = Cancel()
        try:
            while not stop.is_set():
                if not self.since:
                    await self.relist()
                    if not self.since:  # the list failed; the owner logged it
                        failures += 1
                        self.failing = True
                        if await sleep_or_stop(self.backoff.delay(failures), stop):
                            return
                        continue
                self.connects += 1
                opened = time.monotonic()
                stream = self._start(self.since)
                stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
                await asyncio.wait([stream, stopper], return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                if stop.is_set():
                    return
                delay = self._after(stream, failures)
                # A watch that ended (or expired) as soon as it opened, again and again, is paced like a
                # failure: a proxy that closes every stream at once, or a 410 on every resume, must not
                # turn one node into hundreds of requests a second. The first quick end is free.
                quick = time.monotonic() - opened < self.healthy_after
                failures = failures + 1 if delay is not None or quick else 0
                if delay is None and failures > 1:
                    delay = self.backoff.delay(failures - 1)
                if delay is not None and await sleep_or_stop(delay, stop):
                    return
        finally:
            self._cancel.set()

    def _after(self, stream: asyncio.Future[str], failures: int) -> float | None:
        """Where the next watch resumes after `stream` ended; the delay it must wait first when it failed."""
        try:
            self.since = stream.result() or self.since
            self.failing = False
            return None
        except ApiFailure as exc:
            if exc.kind == "gone":
                log.info("the watch cannot resume; listing again", extra={"watch": self.what})
                self.since = ""
                return None
            self.failing = True
            delay = self.backoff.delay(failures + 1)
            log.warning(
                "a watch failed; retrying",
                extra={"watch": self.what, "error": str(exc), "retry_in_s": round(delay, 1)},
            )
            return delay
        except Exception:
            # A bug, or an answer no API server gives, costs this watch, never the owner's knowledge of
            # what it watches for the rest of its life.
            self.failing = True
            delay = self.backoff.delay(failures + 1)
            log.exception(
                "a watch broke; retrying", extra={"watch": self.what, "retry_in_s": round(delay, 1)}
            )
            return delay


async def sleep_or_stop(seconds: float, stop: asyncio.Event) -> bool:
    """Wait `seconds`; True when `stop` was set first."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


def _error(method: str, path: str, status: int, raw: bytes) -> ApiError:
    """The API's Status body, reduced to one line: its reason and message."""
    reason, message = "", ""
    with contextlib.suppress(ValueError, AttributeError):
        status_obj = json.loads(raw)
        reason = str(status_obj.get("reason") or "")
        message = str(status_obj.get("message") or "")
    text = f"{method} {path}: HTTP {status} {reason}".rstrip()
    if message:
        text += f": {message[:300]}"
    return ApiError(status, text, reason)


# --- credentials -------------------------------------------------------------------------------------


def load(kubeconfig: str | None = None, user_agent: str = USER_AGENT) -> Api:
    """An explicit kubeconfig, else in-cluster, else $KUBECONFIG / ~/.kube/config (kubectl's order).
    `user_agent` names the component in the API server's audit log and its priority-and-fairness rules."""
    if kubeconfig:
        credentials = from_kubeconfig([kubeconfig])
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        credentials = in_cluster()
    else:
        paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        if not paths:
            default = os.path.expanduser("~/.kube/config")
            if not os.path.exists(default):
                raise ConfigError("no API to reach: not in a cluster and no kubeconfig; pass --kubeconfig")
            paths = [default]
        credentials = from_kubeconfig(paths)
    return Api(replace(credentials, user_agent=user_agent))


def in_cluster(directory: str = SERVICE_ACCOUNT_DIR) -> Credentials:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token_file = os.path.join(directory, "token")
    ca_file = os.path.join(directory, "ca.crt")
    if not host or not os.path.exists(token_file):
        raise ConfigError(f"in a cluster but without a service-account token at {token_file}")
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the cluster CA {ca_file}: {exc}") from exc
    netloc = f"[{host}]" if ":" in host else host
    return Credentials(server=f"https://{netloc}:{port}", ssl_context=context, token_file=token_file)


def _merged(paths: list[str]) -> tuple[dict[str, Any], str]:
    """kubectl's merge of several kubeconfig files: the first file to set a value wins."""
    import yaml  # only a kubeconfig needs it; in a cluster it is never imported

    from nodefabric_devicemanager import yamldoc

    merged: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}, "current-context": ""}
    base_dir = ""
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = yamldoc.load(f.read())
        except FileNotFoundError as exc:
            if len(paths) == 1:
                raise ConfigError(f"kubeconfig {path} does not exist") from exc
            continue
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"kubeconfig {path} cannot be read: {str(exc).splitlines()[0]}") from exc
        if not isinstance(doc, dict):
            raise ConfigError(f"kubeconfig {path} is not a kubeconfig (not a mapping)")
        base_dir = base_dir or os.path.dirname(os.path.abspath(path))
        for kind, field in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            entries = doc.get(kind) or []
            if not isinstance(entries, list):
                raise ConfigError(f"kubeconfig {path}: {kind} is not a list")
            for entry in entries:
                if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                    merged[kind].setdefault(entry["name"], entry.get(field) or {})
        if not merged["current-context"] and isinstance(doc.get("current-context"), str):
            merged["current-context"] = doc["current-context"]
    return merged, base_dir


def _file_or_data(entry: dict[str, Any], key: str, base_dir: str) -> tuple[str | None, bytes | None]:
    path, data = entry.get(key), entry.get(f"{key}-data")
    if data:
        try:
            return None, base64.b64decode(str(data), validate=True)
        except ValueError as exc:
            raise ConfigError(f"kubeconfig {key}-data is not base64") from exc
    if path:
        return os.path.join(base_dir, str(path)), None
    return None, None


def _ssl_context(cluster: dict[str, Any], user: dict[str, Any], base_dir: str) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    ca_file, ca_data = _file_or_data(cluster, "certificate-authority", base_dir)
    try:
        if ca_data is not None:
            context.load_verify_locations(cadata=ca_data.decode("ascii", errors="replace"))
        elif ca_file is not None:
            context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"cannot load the kubeconfig's certificate authority: {exc}") from exc
    cert_file, cert_data = _file_or_data(user, "client-certificate", base_dir)
    key_file, key_data = _file_or_data(user, "client-key", base_dir)
    if (cert_file or cert_data) and (key_file or key_data):
        with tempfile.TemporaryDirectory(prefix="nf-kc-") as tmp:
            # ssl loads a certificate chain from files only; data stays in a private directory for a moment.
            if cert_data is not None:
                cert_file = os.path.join(tmp, "cert.pem")
                _write_private(cert_file, cert_data)
            if key_data is not None:
                key_file = os.path.join(tmp, "key.pem")
                _write_private(key_file, key_data)
            assert cert_file is not None and key_file is not None
            try:
                context.load_cert_chain(cert_file, key_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cannot load the kubeconfig's client certificate: {exc}") from exc
    return context


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def from_kubeconfig(paths: list[str]) -> Credentials:
    merged, base_dir = _merged(paths)
    name = merged["current-context"]
    context = merged["contexts"].get(name)
    if not name or not isinstance(context, dict):
        raise ConfigError(f"kubeconfig {', '.join(paths)} has no current context")
    cluster = merged["clusters"].get(context.get("cluster"))
    user = merged["users"].get(context.get("user"), {})
    if not isinstance(cluster, dict) or not cluster.get("server"):
        raise ConfigError(f"kubeconfig context {name!r} names no cluster with a server")
    if not isinstance(user, dict):
        raise ConfigError(f"kubeconfig context {name!r}: its user is not a mapping")
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise ConfigError(
                f"kubeconfig user {context.get('user')!r} needs the {plugin!r} credential plugin, which the "
                "agent does not run; give it a token, a tokenFile or a client certificate"
            )
    server = str(cluster["server"])
    token_file = user.get("tokenFile")
    return Credentials(
        server=server,
        ssl_context=_ssl_context(cluster, user, base_dir) if server.startswith("https:") else None,
        tls_server_name=cluster.get("tls-server-name") or None,
        token=str(user["token"]) if user.get("token") else None,
        token_file=os.path.join(base_dir, str(token_file)) if token_file else None,
    )
