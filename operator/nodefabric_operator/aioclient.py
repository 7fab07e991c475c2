"""The operator's writes sent on kopf's event loop (aiohttp), with what the kubernetes client would use.

Everything comes from the same kubernetes `Configuration` the rest of the operator uses, so a kubeconfig
or a service account means the same here: the host, the bearer token (its refresh hook run as rawcall
runs it, at most once a second and at once after a 401, then the request sent once more; in a worker
thread, since an exec plugin or a token file is blocking work), the CA (file or data), the client
certificate and key, `verify_ssl`, `tls_server_name`, an HTTP(S) proxy unless `no_proxy` matches,
default headers and cookie. A configuration this client does not reproduce (a SOCKS proxy, a proxy TLS
context, `assert_hostname` naming another host, socket options or `keep_alive`) is left to the
kubernetes client in a worker thread, as every write was sent before (Driver).

Refusals are raised as the kubernetes client raises them (ApiException and its per-status subclasses,
built from the answer), so every caller's 404/409/422 handling is the same for both clients. No answer
at all (connection refused, reset, a timeout) is aiohttp's ClientError or TimeoutError: transient to
the reconcile, as urllib3's errors are. A request gets REQUEST_TIMEOUT_S to connect, as long again
between two reads of its answer, and twice that in all: a hung (or trickling) API server fails the
write (retried with backoff) instead of holding its record, and an operator's stop that waits for the
write in flight, forever.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from collections.abc import Mapping
from typing import Any, TypeVar

import aiohttp
import kubernetes
import yarl
from kubernetes.client import rest

from nodefabric_operator import apicall, rawcall, wire
from nodefabric_operator.inflight import writing
from nodefabric_operator.metrics import Metrics

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = rawcall.REQUEST_TIMEOUT_S
# The methods aiohttp sends once more itself after a connection closed with no answer (its session does
# for these, on any connection); wire.resendable's others are sent again here.
_AIOHTTP_RESENDS: frozenset[str] = getattr(aiohttp.client, "IDEMPOTENT_METHODS", frozenset())
T = TypeVar("T")


class Closed(apicall.Stopped, aiohttp.ClientConnectionError):
    """A request made after the client was closed (the operator stopped): refused, never sent. A stop to
    whoever asks (apicall.Stopped), and to every other caller what a connection never made is: transient,
    retried quietly, never a traceback."""


class _Answer:
    """What ApiException.from_response reads of an answer."""

    def __init__(self, status: int, reason: str | None, data: bytes, headers: Mapping[str, str]) -> None:
        self.status, self.reason, self.data, self.headers = status, reason, data, headers

    def getheaders(self) -> Mapping[str, str]:
        return self.headers


class AsyncClient:
    """Closed once, for good: the operator closes it after kopf stopped for the last time (cli.serve,
    Reconciler.aclose), never between two starts of kopf within one run (cli._kopf's restart after a
    404 reuses it open). A task that escaped kopf's stop (kopf waits for and cancels only the tasks it
    found when it began to stop) and sends a request after that is refused with Closed, before any
    byte goes out: no session is opened again to write after the lease was released to a standby."""

    def __init__(self, api: kubernetes.client.ApiClient, *, timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.api = api
        self.config = api.configuration
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        # The pool's size, taken by apicall.arun before a request is sent, not by aiohttp's connector:
        # a request waiting for a connection there is on the clock of its whole-request timeout
        # (`total`: a first sync queues many writes behind a slow API server, each would fail and its
        # retry queue again), and, inside the request's Landing, would be sent after a stop.
        self.slots = asyncio.Semaphore(int(self.config.connection_pool_maxsize or 0) or 100)
        self._options: dict[str, Any] = {}
        self._proxy_headers: dict[str, str] = {}
        if self.config.proxy and not _bypassed(self.config):
            headers = dict(self.config.proxy_headers or {})
            proxy = yarl.URL(self.config.proxy)
            if any(k.lower() == "proxy-authorization" for k in headers):
                # Said by the configuration (kubeclient.load_client turns the URL's user:password into
                # it): sent as the threaded client sends it, not encoded again by aiohttp from the URL
                # (latin-1 only: a password outside it failed every request here).
                proxy = proxy.with_user(None)
            self._options = {"proxy": proxy, "proxy_headers": headers}
            if not str(self.config.host).lower().startswith("https"):
                # aiohttp gives them to the proxy's CONNECT only; a plain-http request goes through
                # the proxy as is, so they ride along with it, as urllib3's ProxyManager sends them.
                self._proxy_headers = headers
        if self.config.tls_server_name:
            self._options["server_hostname"] = self.config.tls_server_name

    @staticmethod
    def serves(config: Any) -> bool:
        """Whether this client sends as the kubernetes client would with `config` (see the module's note)."""
        proxy = str(config.proxy or "")
        return not (
            proxy.lower().startswith("socks")
            or getattr(config, "proxy_ssl_context", None) is not None
            or isinstance(config.assert_hostname, str)
            or config.socket_options is not None
            # kubernetes' RESTClientObject turns this into TCP keepalive socket options of its own.
            or bool(getattr(config, "keep_alive", False))
        )

    def _opened(self) -> aiohttp.ClientSession:
        if self._closed:
            raise Closed("the operator stopped: its client is closed, the request was not sent")
        if self._session is None:
            # Made on first use: a session belongs to the loop it is made on, kopf's.
            config = self.config
            connector = aiohttp.TCPConnector(ssl=tls_context(config), limit=0)  # bounded by slots
            # The whole request (once it has its turn: slots) is bounded too, not only each read: a
            # server (or proxy) trickling a byte of its answer before each read timeout would otherwise
            # hold the write, and a stop waiting for it, for ever. Twice the read timeout: the API
            # server ends a request itself after 60 s (--request-timeout), so an answer still coming
            # after that is not one worth waiting for.
            timeout = aiohttp.ClientTimeout(
                total=2 * self.timeout, sock_connect=self.timeout, sock_read=self.timeout, connect=None
            )
            # No cookie jar: the kubernetes client keeps none either (ApiClient.cookie is sent as given).
            # A header line as long as the threaded client takes (wire.py), not aiohttp's 8,190 bytes, and
            # as many lines as it takes, not aiohttp's 128.
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=timeout,
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                max_line_size=wire.MAX_HEADER_LINE,
                max_field_size=wire.MAX_HEADER_LINE,
                max_headers=wire.MAX_HEADERS,
            )
        return self._session

    async def send(self, request: apicall.Request) -> bytes:
        """The answer's bytes; ApiException for an answer outside 2xx (a 401 refreshes the credential and
        sends the request once more, as rawcall.send does; so does a connection closed with no answer,
        for a request that may be sent twice: wire.py)."""
        url, headers, data = request.prepared(self.api)
        # aiohttp itself sends an idempotent method once more after such a close: not a third time here.
        resend = request.resendable and request.method.upper() not in _AIOHTTP_RESENDS
        token = await self._credential(now_due=False)
        try:
            return await self._sent(request.method, url, headers, data, token, resend=resend)
        except kubernetes.client.ApiException as err:
            refreshable = self.config.refresh_api_key_hook is not None
            # Not once the operator is stopping: a second send would be a write after the stop.
            if not wire.refresh_and_resend(rawcall.status_of(err), refreshable) or apicall.stopping():
                raise
            refused = err
        token = await self._credential(now_due=True)
        if apicall.stopping():  # the stop came while the hook ran (an exec plugin's takes a while)
            raise refused
        return await self._sent(request.method, url, headers, data, token, resend=resend)

    async def _sent(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        data: bytes | None,
        token: str | None,
        *,
        resend: bool,
    ) -> bytes:
        try:
            return await self._request(method, url, headers, data, token)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as err:
            # Not a connection never made (ClientConnectorError: refused, unreachable): sent again at
            # once, it would meet the same.
            if not resend or isinstance(err, aiohttp.ClientConnectorError) or apicall.stopping():
                raise
            log.debug("connection closed with no answer, sent once more", extra={"method": method})
        return await self._request(method, url, headers, data, token)

    async def _credential(self, *, now_due: bool) -> str | None:
        if rawcall.refresh_due(self.config, now_due=now_due):
            # Bounded as the request is: an exec plugin runs with no timeout of its own, and a stop
            # waits for the request (hook included) through every cancel (inflight.settled).
            async with asyncio.timeout(self.timeout):
                await asyncio.to_thread(self.config.refresh_api_key_hook, self.config)
        return rawcall.credential(self.config)

    async def _request(
        self, method: str, url: str, headers: dict[str, str], data: bytes | None, token: str | None
    ) -> bytes:
        if token:
            headers = {**headers, "authorization": token}
        if self._proxy_headers:
            headers = {**headers, **self._proxy_headers}
        # A redirect is not followed: the API server never sends one, and the kubernetes client as the
        # operator configures it (load_client: retries=0) never followed one either. Followed, a write's
        # body would go to another host and that host's answer be taken for the API server's.
        sending = self._opened().request(
            method, url, data=data, headers=headers, allow_redirects=False, **self._options
        )
        async with sending as answer:
            body = await _body(answer)
            status, reason, got = answer.status, answer.reason, answer.headers
        if not 200 <= status <= 299:
            raise kubernetes.client.ApiException.from_response(
                http_resp=_Answer(status, reason, body, got), body=None, data=None
            )
        return body

    async def close(self) -> None:
        self._closed = True  # first: a request made while the session closes is refused too
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


async def _body(answer: aiohttp.ClientResponse) -> bytes:
    """The answer's body, at most wire.MAX_ANSWER bytes of it (see wire.py); AnswerTooLarge beyond, the
    connection closed unread."""
    size = answer.content_length
    if wire.too_large(size):
        answer.close()
        raise wire.AnswerTooLarge(size)
    if size is not None and "Content-Encoding" not in answer.headers:
        return await answer.read()  # no more than announced: aiohttp reads the body to its length
    # Of no announced size (chunked, or up to the close), or decoded (gzip's size is not the body's):
    # read a piece at a time, counted.
    body = bytearray()
    async for piece in answer.content.iter_chunked(wire.CHUNK):
        body += piece
        if wire.too_large(len(body)):
            answer.close()
            raise wire.AnswerTooLarge()
    return bytes(body)


def tls_context(config: Any) -> ssl.SSLContext | bool:
    """The TLS settings the kubernetes client's urllib3 pool would use with `config`."""
    if not str(config.host).lower().startswith("https"):
        return True  # aiohttp's default; never used for http
    context = ssl.create_default_context(cafile=config.ssl_ca_cert, cadata=config.ca_cert_data)
    if not config.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif config.assert_hostname is False:
        context.check_hostname = False
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    return context


def _bypassed(config: Any) -> bool:
    bypass = getattr(rest, "should_bypass_proxies", None)  # kubernetes >= 33 honours no_proxy
    no_proxy = getattr(config, "no_proxy", None)
    return bool(bypass is not None and bypass(config.host, no_proxy or ""))


class Driver:
    """Sends a publish's requests for the operator: on the loop when the configuration allows it
    (AsyncClient.serves), else through the ApiClient in a worker thread (inflight.writing)."""

    def __init__(self, api: kubernetes.client.ApiClient, metrics: Metrics) -> None:
        self.api = api
        self.metrics = metrics
        self.client = AsyncClient(api) if AsyncClient.serves(api.configuration) else None
        self._closed = False

    async def __call__(self, calls: apicall.Calls[T]) -> T:
        if self._closed:  # as AsyncClient refuses (see its note), for the writes sent in a thread too
            calls.close()
            raise Closed("the operator stopped: its client is closed, the request was not sent")
        if self.client is not None:
            return await apicall.arun(calls, self.client, self.metrics)
        # Told to stop at the cancel: the thread runs on after it, and would send the rest of the publish.
        stopping = threading.Event()
        return await writing(apicall.run, calls, self.api, self.metrics, stopping, stopping=stopping)

    async def close(self) -> None:
        self._closed = True
        if self.client is not None:
            await self.client.close()
