"""HTTP front of the extender (aiohttp): decode, call the service, encode. Nothing else lives here.

Two listeners. The extender's own (filter, prioritize, /debug/groups, and the probes) belongs on
127.0.0.1 beside kube-scheduler, or behind TLS with client certificates. The probe listener (/healthz,
/readyz, /metrics) may face the pod network: it answers nothing that changes or reveals a decision.
A request body is read within a deadline and up to a size, and the bodies read at once up to a total
(httpbody); past any of them it is refused and the connection dropped.
"""

from __future__ import annotations

import functools
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from nodefabric_devicemanager.shell import server as shell
from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.config import ExtenderConfig, regular_file
from nodefabric_operator.extender.pods import PodError
from nodefabric_operator.extender.service import Extender, Publisher
from nodefabric_operator.extender.wire import ExtenderArgs, FilterResult, WireError, loads, parse_args
from nodefabric_operator.httpbody import BodyReader, Limits

log = logging.getLogger(__name__)

# A full Pod plus 5,000 node names is about 150 KB; full Nodes (kube-scheduler without nodeCacheCapable)
# can be 10 KB each.
MAX_BODY = 64 * 1024 * 1024
READ_TIMEOUT_S = 5.0
# The bodies being read at once may hold this many of the largest (counted as their bytes arrive).
# kube-scheduler asks one request at a time (its scheduling cycle is serial) and its bodies are KBs, so
# two are plenty; clients that each send most of a 64 MiB body and then wait no longer make the process
# hold 64 MiB apiece: past the total they are answered 503 at once.
IN_FLIGHT_BODIES = 2
# kube-scheduler keeps its connection open between requests; one idle longer than this (or one that
# never finishes its request headers) is closed.
KEEPALIVE_S = 30.0


@dataclass(frozen=True)
class Serving:
    """What the HTTP layer needs besides the extender: health of its feeds and request limits."""

    # Problems that make /healthz fail (watches broken for too long); empty when healthy.
    health: Callable[[], list[str]] = list
    max_body: int = MAX_BODY
    read_timeout: float = READ_TIMEOUT_S
    # The bytes of the bodies read at once; None: IN_FLIGHT_BODIES times max_body.
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        _ = self.limits  # refuses a max_in_flight that cannot hold one body

    @property
    def limits(self) -> Limits:
        in_flight = IN_FLIGHT_BODIES * self.max_body if self.max_in_flight is None else self.max_in_flight
        # The Content-Type is not checked: kube-scheduler's extender client sends what it sends.
        return Limits(self.max_body, self.read_timeout, in_flight, sender="kube-scheduler")


EXTENDER: web.AppKey[Extender] = web.AppKey("extender", Extender)
SERVING: web.AppKey[Serving] = web.AppKey("serving", Serving)
BODIES: web.AppKey[BodyReader] = web.AppKey("extender_bodies", BodyReader)


def _dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_dumps(data), status=status, content_type="application/json")


def _refuse(ext: Extender, verb: str, status: int, message: str) -> web.Response:
    ext.metrics.bad_requests.labels(verb).inc()
    log.warning("refused a request", extra={"verb": verb, "status": status, "error": message})
    return _json({"Error": message}, status=status)


def _answer(
    ext: Extender, verb: str, call: Callable[[Extender, ExtenderArgs], Any], raw: bytes
) -> web.Response:
    try:
        args = parse_args(loads(raw))
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting past the decoder's depth
        message = str(exc) if isinstance(exc, WireError) else f"request body is not JSON: {exc}"
        return _refuse(ext, verb, 400, message)
    try:
        out = call(ext, args)
    except PodError as exc:
        return _refuse(ext, verb, 400, f"malformed Pod in ExtenderArgs: {exc}")
    except WireError as exc:  # a NodeNames entry the API server would refuse (Extender._asked)
        return _refuse(ext, verb, 400, str(exc))
    body = out.encode() if isinstance(out, FilterResult) else _dumps(out)
    return web.Response(body=body, content_type="application/json")


def _verb(
    verb: str, call: Callable[[Extender, ExtenderArgs], Any]
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        ext = request.app[EXTENDER]
        started = time.perf_counter()
        try:
            return await request.app[BODIES].answer(
                request,
                functools.partial(_refuse, ext, verb),
                functools.partial(_answer, ext, verb, call),
            )
        finally:
            ext.metrics.latency.labels(verb).observe(time.perf_counter() - started)

    return handler


async def _groups(request: web.Request) -> web.Response:
    return _json(request.app[EXTENDER].groups())


def health(serving: Serving) -> shell.ProbeFn:
    """/healthz: 503 with one problem per line while a feed has been broken for too long."""

    def probe() -> shell.Probe:
        problems = serving.health()
        return shell.Probe(not problems, "\n".join(problems or ["ok"]) + "\n")

    return probe


def ready(extender: Extender) -> shell.ProbeFn:
    """/readyz: 503 until the caches have synced."""
    return lambda: shell.Probe(extender.cache.synced, "ok\n" if extender.cache.synced else NOT_SYNCED)


NOT_SYNCED = "node and pod caches not synced yet\n"


def _base(extender: Extender, serving: Serving) -> web.Application:
    app = web.Application(client_max_size=serving.max_body)
    app[EXTENDER] = extender
    app[SERVING] = serving
    app[BODIES] = BodyReader(serving.limits)
    return shell.add_routes(
        app,
        metrics=shell.exposition(extender.metrics.registry),
        live=health(serving),
        ready=ready(extender),
    )


def make_app(extender: Extender, serving: Serving | None = None) -> web.Application:
    """The extender's own listener: the verbs, /debug/groups and the probes."""
    app = _base(extender, serving or Serving())
    for verb, call in (("filter", Extender.filter), ("prioritize", Extender.prioritize)):
        # A client asking `Expect: 100-continue` is refused from its headers before it sends a body.
        expect = app[BODIES].expect(functools.partial(_refuse, extender, verb))
        app.router.add_post(f"/{verb}", _verb(verb, call), expect_handler=expect)
    app.router.add_get("/debug/groups", _groups)
    return app


def build_app(
    config: ExtenderConfig,
    snapshot: Iterable[dict[str, Any]] | Path | None = None,
    *,
    publisher: Publisher | None = None,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
    serving: Serving | None = None,
) -> web.Application:
    """The extender over a static snapshot (Node, Pod and PodGroup objects, or a file holding them)."""
    cache = Cache(config)
    if isinstance(snapshot, Path):
        cache.load_file(snapshot)
    elif snapshot is not None:
        cache.load_objects(snapshot)
    else:
        cache.synced = True
    extender = Extender(config, cache, publisher=publisher, registry=registry, clock=clock)
    return make_app(extender, serving)


def runner(app: web.Application) -> web.AppRunner:
    """The runner of the extender's own listener: the product's connection limits (shell.server)."""
    return shell.runner(app, idle_timeout=KEEPALIVE_S)


def group_summary(app: web.Application, group_key: str) -> str | None:
    """The decision summary of a group ("<namespace>/<family>/<name>"), None when it has no record."""
    return app[EXTENDER].summary(group_key)


def tls_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """Server TLS; with `client_ca`, only clients presenting a certificate that CA signed get through
    (kube-scheduler's extender `tlsConfig` sends one with certFile/keyFile)."""
    for path in (cert, key, client_ca):
        if path is not None:
            regular_file(path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.load_verify_locations(cafile=client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
