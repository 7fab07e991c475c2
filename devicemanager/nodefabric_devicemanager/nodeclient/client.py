"""The HTTP client: one API server, JSON requests over one keep-alive connection, watch streams each on
their own, bearer tokens re-read when rotated, and a Cancel that ends blocked watches from another thread.

Every call blocks; callers run it on a worker thread with a deadline, so a hung API server never holds
a pass, a kubelet call or a SIGTERM."""

from __future__ import annotations

import contextlib
import http
import http.client
import json
import os
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from nodefabric_devicemanager.nodeclient.errors import (
    ApiError,
    ConfigError,
    classify,
    status_error,
)

# A black-holed API server must not hold a request for long.
REQUEST_TIMEOUT_S = 10.0
# The largest response body or watch line accepted: a Devices object of an 8 PF x 128 VF node is 430 KiB.
MAX_BODY_BYTES = 32 * 1024 * 1024
USER_AGENT = "nodefabric-agent"
_RETRYABLE_SEND = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


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
            raise status_error(method, path, resp.status, raw)
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
                raise status_error("watch", path, resp.status, raw)
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
