"""HTTP front of the extender (aiohttp): decode, call the service, encode. Nothing else lives here."""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.service import EventSink, Extender
from nodefabric_operator.extender.wire import ExtenderArgs, FilterResult, WireError, parse_args

log = logging.getLogger(__name__)

EXTENDER: web.AppKey[Extender] = web.AppKey("extender", Extender)
MAX_BODY = 64 * 1024 * 1024  # a full Pod plus 5,000+ node names fits many times over


def _dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_dumps(data), status=status, content_type="application/json")


async def _args(request: web.Request) -> ExtenderArgs:
    try:
        body = json.loads(await request.read())
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the decoder goes
        raise WireError(f"request body is not JSON: {exc}") from exc
    return parse_args(body)


def _verb(
    verb: str, call: Callable[[Extender, ExtenderArgs], Any]
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        ext = request.app[EXTENDER]
        started = time.perf_counter()
        try:
            args = await _args(request)
        except WireError as exc:
            ext.metrics.bad_requests.labels(verb).inc()
            log.warning("refused a malformed request", extra={"verb": verb, "error": str(exc)})
            return _json({"Error": str(exc)}, status=400)
        try:
            out = call(ext, args)
            body = out.encode() if isinstance(out, FilterResult) else _dumps(out)
        except (AttributeError, TypeError, KeyError, ValueError) as exc:
            # A Pod whose fields have the wrong JSON types: refuse it rather than fail the scheduler.
            ext.metrics.bad_requests.labels(verb).inc()
            log.warning("refused a malformed pod", extra={"verb": verb, "error": repr(exc)})
            return _json({"Error": f"malformed Pod in ExtenderArgs: {exc!r}"}, status=400)
        finally:
            ext.metrics.latency.labels(verb).observe(time.perf_counter() - started)
        return web.Response(body=body, content_type="application/json")

    return handler


async def _groups(request: web.Request) -> web.Response:
    return _json(request.app[EXTENDER].groups())


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.Response:
    if request.app[EXTENDER].cache.synced:
        return web.Response(text="ok")
    return web.Response(text="node and pod caches not synced yet", status=503)


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[EXTENDER].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(extender: Extender) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[EXTENDER] = extender
    app.router.add_post("/filter", _verb("filter", Extender.filter))
    app.router.add_post("/prioritize", _verb("prioritize", Extender.prioritize))
    app.router.add_get("/debug/groups", _groups)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    return app


def build_app(
    config: ExtenderConfig,
    snapshot: Iterable[dict[str, Any]] | Path | None = None,
    *,
    events: EventSink | None = None,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> web.Application:
    """The extender over a static snapshot (Node, Pod and PodGroup objects, or a file holding them)."""
    cache = Cache(config)
    if isinstance(snapshot, Path):
        cache.load_file(snapshot)
    elif snapshot is not None:
        cache.load_objects(snapshot)
    else:
        cache.synced = True
    return make_app(Extender(config, cache, events=events, registry=registry, clock=clock))


def group_summary(app: web.Application, group_key: str) -> str | None:
    """The decision summary of a group ("<namespace>/<family>/<name>"), None when it has no record."""
    return app[EXTENDER].summary(group_key)


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx
