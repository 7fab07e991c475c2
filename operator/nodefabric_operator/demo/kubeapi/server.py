"""The API server: kmock's HTTP plumbing, with our request path behind it.

kmock (by kopf's author) supplies the HTTP server, request parsing and its request history; its
emulator matches every request against its whole history and scans every object to find one, which
cannot hold a fleet, so `KubeAPI._handle` answers Kubernetes requests itself, from an indexed store
(`store.Store`), and consults kmock's response DSL only for reactions a test registered.

What it does as a real API server does, because our parts or kubectl depend on it:
- discovery (`/api`, `/apis`, group and group-version documents with short names and categories) and
  OpenAPI v3 for `kubectl explain` and server-side field validation;
- CRUD on declared resources; PUT, merge, strategic-merge and JSON patches; the status subresource;
  uid, resourceVersion (one counter), generation, creationTimestamp; 409 on a stale resourceVersion;
  no-op writes change nothing and notify no watch; finalizers; garbage collection by owner uid;
- validation of metadata (names, labels, annotations...) and of custom resources against their CRD's
  structural schema, with pruning, defaulting, `fieldValidation` and the 422 causes a server sends;
- label and field selectors, `limit`/`continue` pages, server-side Tables for kubectl;
- pods: scheduling gates only at creation, never beside `nodeName`, removable in any order; a gated
  pod may only add to its node selector, narrow its required node affinity and add tolerations, other
  spec changes are refused as the API server refuses them (`pods`); binding a gated pod is refused;
  `pods/eviction`; MutatingWebhookConfigurations called on a pod's creation (`webhooks`);
- watches: from "now" with the current state, or resuming from a resourceVersion (410 Expired once
  it left the event window), bookmarks, `sendInitialEvents`, `timeoutSeconds`, Table watches.

The request path is here; what answers each verb lives beside it, one job each: `state.Objects` (what is
stored and the one write path into it), `reads` (get, list, watch), `writes` (create, update, patch,
delete), `subresources` (binding, eviction), `mutation` (a pod's webhooks and rules at creation),
`history` (request counts and the bounded history), `responses` (HTTP answers).
"""

from __future__ import annotations

import contextlib
import copy
import hmac
import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import attrs
import kmock

from nodefabric_operator.demo.kubeapi import discovery, errors
from nodefabric_operator.demo.kubeapi.admission import CRDS, NAMESPACES
from nodefabric_operator.demo.kubeapi.catalogue import Catalogue, ResourceType, builtin_types
from nodefabric_operator.demo.kubeapi.compat import Buses, ObjectsView, ResourcesView
from nodefabric_operator.demo.kubeapi.errors import ApiError
from nodefabric_operator.demo.kubeapi.history import RequestHistory
from nodefabric_operator.demo.kubeapi.reads import Reads
from nodefabric_operator.demo.kubeapi.responses import error, respond
from nodefabric_operator.demo.kubeapi.routes import parse_route, resource_key, verb
from nodefabric_operator.demo.kubeapi.state import SYSTEM_NAMESPACES, Objects
from nodefabric_operator.demo.kubeapi.store import Hub, Store
from nodefabric_operator.demo.kubeapi.subresources import PodSubresources
from nodefabric_operator.demo.kubeapi.writes import Writes

MAX_BODY = 3 * 1024 * 1024  # the API server's request size limit
_WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
log = logging.getLogger(__name__)


def _loose_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


@attrs.define(kw_only=True)
class KubeAPI(kmock.KubernetesEmulator):  # type: ignore[misc]
    """The embedded API server. Knobs: `history` (requests kept for `requests()`), `history_bytes`
    (request bodies those may hold in all: the oldest are forgotten first), `event_window`
    (events each resource keeps for resuming watches), `bookmark_interval` (seconds between watch
    bookmarks), `watch_capacity` (events queued for one slow watch before it is closed),
    `require_namespaces` (refuse objects in a namespace that does not exist, as a real server does;
    off by default, since most tests never create the namespaces they write to), `services` (where a
    mutating webhook's `clientConfig.service` is served: "namespace/name" -> "host:port"), `token`
    (the bearer token every request but the probes must carry: 401 without it)."""

    history: int = 4096
    # A kept request holds its body and its decoded JSON (about 7 times the body in memory): 150
    # requests of 2 MiB held 2 GiB, so 4,096 of them (kubectl apply in a loop) would exhaust a machine.
    history_bytes: int = 32 * 2**20
    event_window: int = 10_000
    bookmark_interval: float = 60.0
    watch_capacity: int = 100_000
    require_namespaces: bool = False
    # Where a webhook's `clientConfig.service` is served ("namespace/name" -> "host:port"): no Service
    # routes traffic here.
    services: dict[str, str] = attrs.field(factory=dict)
    # The bearer token every request must carry (None: no authentication, as most tests want). The
    # probes answer without it, as a real API server's do to anonymous requests.
    token: str | None = attrs.field(default=None, repr=False)

    catalogue: Catalogue = attrs.field(factory=Catalogue, init=False)
    store: Store = attrs.field(factory=Store, init=False)
    # The parts, built at start; they read the knobs above from this object (`knobs.Knobs`) as they go.
    _objects: Objects = attrs.field(init=False)
    _history: RequestHistory = attrs.field(init=False)
    _reads: Reads = attrs.field(init=False)
    _writes: Writes = attrs.field(init=False)
    _subresources: PodSubresources = attrs.field(init=False)
    _seq: int = attrs.field(default=0, init=False)
    _faults: list[int] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._objects = Objects(self.catalogue, self.store, self)
        self._history = RequestHistory(self)
        self._reads = Reads(self._objects, self)
        self._writes = Writes(self._objects, self)
        self._subresources = PodSubresources(self._objects)
        # kmock's own fallback reactions are replaced by our request path; what a test registers
        # later with kmock's DSL still answers first.
        self._payloads.clear()
        # kmock's fields, replaced: a bounded request history, and event buses that are our watch hubs.
        object.__setattr__(self, "_requests", self._history.kept)
        object.__setattr__(self, "_buses", Buses(self))
        for rt in builtin_types():
            self.catalogue.add(rt)
        for name in SYSTEM_NAMESPACES:
            self.put_object(NAMESPACES, {"metadata": {"name": name}, "status": {"phase": "Active"}})

    # --- declarations and seeding (tests, the demo) --------------------------------------------------

    def declare(self, key: str, *, kind: str, namespaced: bool, subresources: Any = ()) -> None:
        """Serve a resource no CRD declares (schema-less), e.g. a CRD another project installs. A
        resource already served keeps what it has (printer columns, selectable fields, names)."""
        known = self.catalogue.by_key(key)
        extra = (
            {}
            if known is None
            else {
                "singular": known.singular,
                "short_names": known.short_names,
                "categories": known.categories,
                "selectable": known.selectable,
                "columns": known.columns,
                "schema": known.schema,
                "crd": known.crd,
            }
        )
        rt = ResourceType.from_key(key, kind, namespaced, subresources=frozenset(subresources), **extra)
        self.catalogue.add(rt)

    def declare_crd(self, crd: Mapping[str, Any]) -> None:
        """Serve a CRD's resources, as if it had been applied (it is stored too, for kubectl)."""
        self.put_object(CRDS, copy.deepcopy(dict(crd)))

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next `count` writes (create, update, patch, delete) with `status`: an outage, a
        conflict."""
        self._faults.extend([status] * count)

    def next_resource_version(self) -> str:
        return self._objects.next_resource_version()

    @property
    def resource_version(self) -> int:
        """The newest resource version handed out (etcd's revision)."""
        return self._objects.rv

    @property
    def objects(self) -> ObjectsView:
        return ObjectsView(self)

    @property
    def resources(self) -> ResourcesView:
        return ResourcesView(self)

    def stored(self, key: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """A copy of the stored object, or None."""
        obj = self.store.get(resource_key(key), namespace, name)
        return None if obj is None else copy.deepcopy(obj)

    def put_object(self, key: str, obj: dict[str, Any], *, validate: bool = True) -> dict[str, Any]:
        """Create or replace an object directly (as an admin or the cloud would have), validated as a
        write through the API would be; watches see it. The uid, creationTimestamp and
        resourceVersion given to it are written into `obj` as well; ApiError says why it is refused.

        `validate=False` stores it as given: state no write could create today, such as an object
        stored under an older, looser version of its CRD's schema."""
        return self._objects.put(key, obj, validate=validate)

    def remove_object(self, key: str, name: str, namespace: str | None = None) -> None:
        self._objects.remove_object(key, name, namespace)

    def clear_objects(self) -> None:
        """Delete every object (watches see them go) except the CRDs served and the system namespaces."""
        self._objects.clear()

    def hub(self, resource: str) -> Hub:
        return self._objects.hub(resource)

    def close_watches(self, *, expired: bool = False) -> int:
        """End every open watch, as an API server does at a watch's timeout (clients resume from their
        last resourceVersion) or, with `expired`, with a 410 Expired event (clients must re-list: every
        object is replayed to them). Returns how many watches were closed."""
        return self._objects.close_watches(expired=expired)

    def compact(self) -> None:
        """Forget every resource's event history, as etcd compaction does: a watch that resumes from an
        older resourceVersion is answered 410 Expired."""
        self._objects.compact()

    # --- request accounting -------------------------------------------------------------------------

    def count(self, method: str | None = None, resource: str | None = None, verb: str | None = None) -> int:
        """Requests received, by HTTP method, resource ("v1/nodes") and verb (get, list, watch, create,
        update, patch, delete, deletecollection): exact and cheap, whatever the history holds."""
        return self._history.count(method, resource, verb)

    def requests(self, method: str | None = None, resource: str | None = None) -> list[Any]:
        """The most recent requests (the last `history`, within `history_bytes`), by HTTP method and
        resource."""
        return self._history.requests(method, resource)

    # --- the request path ---------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """The HTTP entry point (kmock's, without its parsing of Kubernetes URLs, which cannot read
        `/api/v1/namespaces`): record the request in the bounded history, then answer it."""
        raw_request._client_max_size = MAX_BODY
        if self.token is not None and not self._authenticated(raw_request):
            return error(errors.unauthorized())
        try:
            body = await raw_request.read()
            text = body.decode("utf-8")
        except aiohttp.web.HTTPRequestEntityTooLarge:
            return error(errors.too_large(MAX_BODY))
        except UnicodeDecodeError:
            return error(errors.bad_request("the body of the request is not valid UTF-8"))
        route = parse_route(raw_request.path)
        request = kmock.Request(
            id=self._seq,
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=text,
            data=_loose_json(text) if text else None,  # what tests (and kmock's DSL) read of a body
            resource=None if route is None else kmock.resource(route.group, route.version, route.plural),
            namespace=None if route is None else route.namespace,
            name=None if route is None else route.name,
            subresource=None if route is None else route.sub,
        )
        self._seq += 1
        # The history keeps what a test asserts on, not aiohttp's request (its transport, its buffers),
        # unless kmock's DSL has reactions: it finds a request in the history by identity.
        self._history.remember(
            request if self._payloads else attrs.evolve(request, raw_request=None), len(body)
        )
        try:
            return await self._handle(request)
        except ApiError as err:
            return error(err)
        except RecursionError:
            return error(errors.bad_request("the object is nested too deeply"))
        except Exception as exc:
            log.exception("the embedded API failed to answer a request", extra={"path": raw_request.path})
            return error(
                ApiError(
                    500,
                    "InternalError",
                    f"an error on the server ({exc!r}) has prevented the request from succeeding",
                )
            )

    def _authenticated(self, raw_request: aiohttp.web.BaseRequest) -> bool:
        if "/" + raw_request.path.strip("/") in discovery.HEALTH:
            return True
        scheme, _, given = raw_request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), str(self.token).encode()
        )

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        if self._payloads:
            with contextlib.suppress(NotImplementedError):
                response: aiohttp.web.StreamResponse = await kmock.RawHandler._handle(self, request)
                return response
        return await self._serve(request)

    async def _serve(self, request: Any) -> aiohttp.web.StreamResponse:
        method = str(getattr(request.method, "value", request.method)).upper()
        route = parse_route(request.url.path)
        if route is None:
            self._history.counts[method, "", ""] += 1
            return self._serve_meta(method, request.url.path)
        params: Mapping[str, str] = request.params
        action = verb(method, route, params)
        self._history.counts[method, route.key, action or ""] += 1
        rt = self.catalogue.get(route.group, route.version, route.plural)
        if rt is None or (route.namespace is not None and not rt.namespaced):
            raise errors.no_such_resource()
        if action is None:
            raise errors.method_not_allowed()
        if route.sub and (route.sub not in rt.subresources or action in ("list", "deletecollection")):
            raise errors.no_such_resource()
        if rt.namespaced and route.namespace is None and action not in ("list", "watch"):
            if route.name is None:
                raise errors.method_not_allowed()
            raise errors.no_such_resource()
        if action in _WRITES and self._faults:
            raise errors.injected(self._faults.pop(0))
        if action == "get":
            return self._reads.get(rt, route, request)
        if action == "list":
            return self._reads.list_objects(rt, route, request)
        if action == "watch":
            return await self._reads.watch(rt, route, request)
        if action == "create":
            if route.sub == "binding":
                return self._subresources.bind(rt, route, request)
            if route.sub == "eviction":
                return self._subresources.evict(rt, route, request)
            if route.name:
                raise errors.method_not_allowed()
            return await self._writes.create(rt, route, request)
        if action in ("update", "patch"):
            return self._writes.update(rt, route, request, action)
        if action == "delete":
            return self._writes.delete(rt, route, request)
        return self._writes.delete_collection(rt, route, request)

    def _serve_meta(self, method: str, path: str) -> aiohttp.web.StreamResponse:
        if method != "GET":
            raise errors.method_not_allowed()
        if "/" + path.strip("/") in discovery.HEALTH:
            return aiohttp.web.Response(text="ok")
        doc = discovery.document(self.catalogue, path)
        if doc is None:
            raise errors.no_such_resource()
        return respond(doc)
