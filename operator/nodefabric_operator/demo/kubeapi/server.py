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
"""

from __future__ import annotations

import collections
import contextlib
import copy
import hmac
import json
import logging
import random
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import attrs
import kmock
from multidict import CIMultiDict

from nodefabric_operator.demo.kubeapi import discovery, errors, pods, webhooks
from nodefabric_operator.demo.kubeapi.admission import (
    CRDS,
    NAMESPACES,
    admit,
    content,
    crd_status,
    header,
    now,
    parse_body,
)
from nodefabric_operator.demo.kubeapi.catalogue import Catalogue, ResourceType, builtin_types, crd_types
from nodefabric_operator.demo.kubeapi.compat import Buses, ObjectsView, ResourcesView
from nodefabric_operator.demo.kubeapi.errors import ApiError
from nodefabric_operator.demo.kubeapi.patches import apply_patch
from nodefabric_operator.demo.kubeapi.routes import (
    Route,
    continue_token,
    parse_route,
    read_continue,
    resource_key,
    verb,
)
from nodefabric_operator.demo.kubeapi.selectors import FieldTerm, field_selector, label_selector
from nodefabric_operator.demo.kubeapi.store import Event, EventLog, Hub, Store, Watcher, key_of, meta
from nodefabric_operator.demo.kubeapi.tables import render_table
from nodefabric_operator.demo.kubeapi.validation import check_meta_types, required
from nodefabric_operator.demo.kubeapi.watch import WatchStream, dumps

MAX_BODY = 3 * 1024 * 1024  # the API server's request size limit
SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")  # every cluster has them
_WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
_SERVER_OWNED = ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
PODS = "v1/pods"
MUTATING_WEBHOOKS = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
_PINNED = ("name", "namespace", "uid", "creationTimestamp", "generation")
_SUCCESS = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Success",
    "code": 201,
}  # what the API server draws generateName suffixes from
log = logging.getLogger(__name__)


def _loose_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _uid_mismatch(wanted: object, obj: Mapping[str, Any]) -> str:
    return f"Precondition failed: UID in precondition: {wanted}, UID in object meta: {meta(obj).get('uid')}"


def _table_wanted(request: Any) -> bool:
    return "as=Table" in header(request, "Accept")


def _warning_headers(warnings: list[str]) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    for text in warnings:
        headers.add("Warning", '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return headers


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
    _logs: dict[str, EventLog] = attrs.field(factory=dict, init=False)
    _hubs: dict[str, Hub] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=0, init=False)
    _seq: int = attrs.field(default=0, init=False)
    _faults: list[int] = attrs.field(factory=list, init=False)
    _counts: collections.Counter[tuple[str, str, str]] = attrs.field(factory=collections.Counter, init=False)
    _sizes: collections.deque[int] = attrs.field(factory=collections.deque, init=False)
    _kept_bytes: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # kmock's own fallback reactions are replaced by our request path; what a test registers
        # later with kmock's DSL still answers first.
        self._payloads.clear()
        # kmock's fields, replaced: a bounded request history, and event buses that are our watch hubs.
        object.__setattr__(self, "_requests", collections.deque())
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

    def _declare_types(self, crd: Mapping[str, Any]) -> None:
        name = crd.get("metadata", {}).get("name", "")
        self.catalogue.remove_crd(name)  # an updated CRD replaces its versions; open watches go on
        for rt in crd_types(crd):
            self.catalogue.add(rt)

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next `count` writes (create, update, patch, delete) with `status`: an outage, a
        conflict."""
        self._faults.extend([status] * count)

    def next_resource_version(self) -> str:
        self._rv += 1
        return str(self._rv)

    @property
    def resource_version(self) -> int:
        """The newest resource version handed out (etcd's revision)."""
        return self._rv

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
        rt = self.catalogue.by_key(key)
        if rt is None:
            raise errors.no_such_resource()
        body = copy.deepcopy(obj)
        m = body.setdefault("metadata", {})
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
            raise errors.invalid(rt.kind, rt.group, "", [required("metadata.name")])
        old = self.store.get(rt.key, m.get("namespace"), m.get("name") or "")
        server = {k: v for k, v in meta(old or {}).items() if k in ("uid", "creationTimestamp", "generation")}
        m.update({k: m.get(k) or v for k, v in server.items()})
        m.setdefault("uid", str(uuid.uuid4()))
        m.setdefault("creationTimestamp", now())
        m.setdefault("generation", 1)
        m.pop("resourceVersion", None)
        if validate:
            body, _ = admit(rt, body, namespace=m.get("namespace"), params={}, old=old)
            causes = pods.create_causes(body) if rt.key == PODS and old is None else []
            if causes:
                raise errors.invalid(rt.kind, rt.group, m["name"], causes)
        else:
            body.update({"apiVersion": rt.group_version, "kind": rt.kind})
        stored = self._commit(rt, body, old)
        obj.setdefault("metadata", {}).update(
            {k: meta(stored)[k] for k in ("uid", "creationTimestamp", "resourceVersion")}
        )
        return obj

    def remove_object(self, key: str, name: str, namespace: str | None = None) -> None:
        rt = self.catalogue.by_key(key)
        obj = None if rt is None else self.store.get(rt.key, namespace, name)
        if rt is not None and obj is not None:
            self._remove(rt, obj, "Background")

    def clear_objects(self) -> None:
        """Delete every object (watches see them go) except the CRDs served and the system namespaces."""
        for resource, obj in list(self.store.items()):
            ns, name = key_of(obj)
            if resource == CRDS or (resource == NAMESPACES and name in SYSTEM_NAMESPACES):
                continue
            if self.store.get(resource, ns or None, name) is not None:
                self.remove_object(resource, name, ns or None)

    def hub(self, resource: str) -> Hub:
        hub = self._hubs.get(resource)
        if hub is None:
            hub = self._hubs[resource] = Hub()
        return hub

    def close_watches(self, *, expired: bool = False) -> int:
        """End every open watch, as an API server does at a watch's timeout (clients resume from their
        last resourceVersion) or, with `expired`, with a 410 Expired event (clients must re-list: every
        object is replayed to them). Returns how many watches were closed."""
        closed = 0
        for hub in self._hubs.values():
            for watcher in list(hub.watchers):
                watcher.close(expired=expired)
                closed += 1
        return closed

    def compact(self) -> None:
        """Forget every resource's event history, as etcd compaction does: a watch that resumes from an
        older resourceVersion is answered 410 Expired."""
        for log in self._logs.values():
            log.compact(self._rv)

    # --- request accounting -------------------------------------------------------------------------

    def count(self, method: str | None = None, resource: str | None = None, verb: str | None = None) -> int:
        """Requests received, by HTTP method, resource ("v1/nodes") and verb (get, list, watch, create,
        update, patch, delete, deletecollection): exact and cheap, whatever the history holds."""
        wanted = None if resource is None else resource_key(resource)
        return sum(
            n
            for (m, r, v), n in self._counts.items()
            if (method is None or m == method.upper())
            and (wanted is None or r == wanted)
            and (verb is None or v == verb)
        )

    def _remember(self, request: Any, size: int) -> None:
        """Keep `request` in the history, forgetting the oldest beyond `history` requests or
        `history_bytes` of bodies (a body larger than the whole budget is not kept at all)."""
        while self._requests and (
            len(self._requests) >= self.history or self._kept_bytes + size > self.history_bytes
        ):
            self._requests.popleft()
            self._kept_bytes -= self._sizes.popleft()
        if size <= self.history_bytes and self.history > 0:
            self._requests.append(request)
            self._sizes.append(size)
            self._kept_bytes += size

    def requests(self, method: str | None = None, resource: str | None = None) -> list[Any]:
        """The most recent requests (the last `history`, within `history_bytes`), by HTTP method and
        resource."""
        wanted = None if resource is None else kmock.resource(resource_key(resource))
        out = []
        for req in list(self._requests):
            if method and str(getattr(req.method, "value", req.method)).upper() != method.upper():
                continue
            if wanted is not None and req.resource != wanted:
                continue
            out.append(req)
        return out

    # --- the request path ---------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """The HTTP entry point (kmock's, without its parsing of Kubernetes URLs, which cannot read
        `/api/v1/namespaces`): record the request in the bounded history, then answer it."""
        raw_request._client_max_size = MAX_BODY
        if self.token is not None and not self._authenticated(raw_request):
            return self._error(errors.unauthorized())
        try:
            body = await raw_request.read()
            text = body.decode("utf-8")
        except aiohttp.web.HTTPRequestEntityTooLarge:
            return self._error(errors.too_large(MAX_BODY))
        except UnicodeDecodeError:
            return self._error(errors.bad_request("the body of the request is not valid UTF-8"))
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
        self._remember(request if self._payloads else attrs.evolve(request, raw_request=None), len(body))
        try:
            return await self._handle(request)
        except ApiError as err:
            return self._error(err)
        except RecursionError:
            return self._error(errors.bad_request("the object is nested too deeply"))
        except Exception as exc:
            log.exception("the embedded API failed to answer a request", extra={"path": raw_request.path})
            return self._error(
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

    def _error(self, err: ApiError) -> aiohttp.web.Response:
        return aiohttp.web.Response(
            body=dumps(err.status()), status=err.code, content_type="application/json", headers=err.headers
        )

    def _respond(
        self, obj: Any, status: int = 200, warnings: list[str] | None = None
    ) -> aiohttp.web.Response:
        headers = _warning_headers(warnings or [])
        return aiohttp.web.Response(
            body=dumps(obj), status=status, content_type="application/json", headers=headers
        )

    async def _serve(self, request: Any) -> aiohttp.web.StreamResponse:
        method = str(getattr(request.method, "value", request.method)).upper()
        route = parse_route(request.url.path)
        if route is None:
            self._counts[method, "", ""] += 1
            return self._serve_meta(method, request.url.path)
        params: Mapping[str, str] = request.params
        action = verb(method, route, params)
        self._counts[method, route.key, action or ""] += 1
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
            return self._get(rt, route, request)
        if action == "list":
            return self._list(rt, route, request)
        if action == "watch":
            return await self._watch(rt, route, request)
        if action == "create":
            if route.sub == "binding":
                return self._bind(rt, route, request)
            if route.sub == "eviction":
                return self._evict(rt, route, request)
            if route.name:
                raise errors.method_not_allowed()
            return await self._create(rt, route, request)
        if action in ("update", "patch"):
            return self._update(rt, route, request, action)
        if action == "delete":
            return self._delete(rt, route, request)
        return self._delete_collection(rt, route, request)

    def _serve_meta(self, method: str, path: str) -> aiohttp.web.StreamResponse:
        if method != "GET":
            raise errors.method_not_allowed()
        if "/" + path.strip("/") in discovery.HEALTH:
            return aiohttp.web.Response(text="ok")
        doc = discovery.document(self.catalogue, path)
        if doc is None:
            raise errors.no_such_resource()
        return self._respond(doc)

    # --- reads -------------------------------------------------------------------------------------

    def _get(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        assert route.name is not None
        obj = self.store.get(rt.key, route.namespace, route.name)
        if obj is None:
            raise errors.not_found(rt.plural, rt.group, route.name)
        if _table_wanted(request):
            table = render_table(
                [obj],
                rt.columns,
                {"resourceVersion": meta(obj).get("resourceVersion", "")},
                include=request.params.get("includeObject", "Metadata"),
            )
            return self._respond(table)
        return self._respond(obj)

    def _list(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        params = request.params
        labels = label_selector(params)
        fields = field_selector(params, rt.selectable)
        try:
            limit = int(params.get("limit") or 0)
        except ValueError:
            raise errors.bad_request(f"invalid limit: {params['limit']!r}") from None
        rv, after = self._rv, None
        if params.get("continue"):
            rv, after = read_continue(params["continue"])
        found = self.store.select(rt.key, route.namespace, labels, fields, after)
        items: list[dict[str, Any]] = []
        list_meta: dict[str, Any] = {"resourceVersion": str(rv)}
        for obj in found:
            if limit and len(items) == limit:
                list_meta["continue"] = continue_token(rv, key_of(items[-1]))
                if not labels and not fields:
                    list_meta["remainingItemCount"] = 1 + sum(1 for _ in found)
                break
            items.append(obj)
        if _table_wanted(request):
            return self._respond(
                render_table(items, rt.columns, list_meta, include=params.get("includeObject", "Metadata"))
            )
        return self._respond(
            {"kind": rt.list_kind, "apiVersion": rt.group_version, "metadata": list_meta, "items": items}
        )

    def _matcher(self, rt: ResourceType, route: Route, request: Any) -> Any:
        labels = label_selector(request.params)
        fields = field_selector(request.params, rt.selectable)
        if route.name:
            fields.append(FieldTerm("metadata.name", route.name, True))
        namespace = route.namespace

        def matches(obj: Mapping[str, Any]) -> bool:
            m = meta(obj)
            if namespace and m.get("namespace") != namespace:
                return False
            if labels and not all(r.matches(m.get("labels") or {}) for r in labels):
                return False
            return all(t.matches(obj) for t in fields)

        return matches, labels, fields

    async def _watch(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        params = request.params
        matches, labels, fields = self._matcher(rt, route, request)
        try:
            timeout = int(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        except ValueError:
            raise errors.bad_request(f"invalid timeoutSeconds: {params['timeoutSeconds']!r}") from None
        since = params.get("resourceVersion", "")
        initial = params.get("sendInitialEvents") == "true"
        bookmarks = params.get("allowWatchBookmarks") == "true"
        watcher = Watcher(matches, self.watch_capacity)
        backlog: list[tuple[str, dict[str, Any]]] = []
        expired: ApiError | None = None
        if since in ("", "0") or initial:
            backlog = [("ADDED", obj) for obj in self.store.select(rt.key, route.namespace, labels, fields)]
        else:
            try:
                rv = int(since)
            except ValueError:
                raise errors.bad_request(f"invalid resource version: {since!r}") from None
            events = self._log(rt.key).since(rv)
            if events is None:
                expired = errors.expired(since, self._log(rt.key).evicted_through)
            else:
                for event in events:
                    watcher.offer(event)
                backlog = [item for item in watcher.queue if item is not None]
                watcher.queue.clear()
        stream = WatchStream(
            rt,
            watcher,
            current_rv=lambda: self._rv,
            last_rv=self._rv,
            table=_table_wanted(request),
            include=params.get("includeObject", "Metadata"),
            bookmarks=bookmarks,
            bookmark_interval=self.bookmark_interval,
        )
        hub = self.hub(rt.key)
        if expired is None:
            hub.watchers.add(watcher)  # no await since the backlog was taken: nothing falls in between
        try:
            return await stream.run(
                request._raw_request,
                backlog,
                expired,
                timeout=timeout,
                initial_bookmark=initial and bookmarks,
            )
        finally:
            hub.watchers.discard(watcher)

    # --- writes ------------------------------------------------------------------------------------

    def _log(self, resource: str) -> EventLog:
        log = self._logs.get(resource)
        if log is None:
            log = self._logs[resource] = EventLog(self.event_window)
        return log

    def _commit(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        """Store an admitted object: a new resourceVersion, generation when its content changed, an
        event for watches. A write that changes nothing stores nothing and notifies nobody."""
        if rt.key == CRDS:
            obj = {**obj, "status": crd_status(obj)}
        m = dict(obj["metadata"])
        if old is not None:
            old_m = meta(old)
            m["generation"] = old_m.get("generation", 1)
            if content(old, rt) != content(obj, rt):
                m["generation"] = int(old_m.get("generation", 1)) + 1
            m["resourceVersion"] = old_m.get("resourceVersion")
            if {**obj, "metadata": m} == old:
                return old
        m["resourceVersion"] = self.next_resource_version()
        obj = {**obj, "metadata": m}
        if m.get("deletionTimestamp") and not m.get("finalizers"):
            self.store.put(rt.key, obj)  # the last finalizer went: the deletion it waited for happens
            return self._remove(rt, obj, "Background")
        self.store.put(rt.key, obj)
        self._emit(rt, Event(self._rv, "ADDED" if old is None else "MODIFIED", obj, old))
        if rt.key == CRDS:
            self._declare_types(obj)
        return obj

    def _emit(self, rt: ResourceType, event: Event) -> None:
        self._log(rt.key).append(event)
        hub = self._hubs.get(rt.key)
        if hub is not None:
            hub.publish(event)

    def _remove(self, rt: ResourceType, obj: dict[str, Any], propagation: str) -> dict[str, Any]:
        m = meta(obj)
        self.store.remove(rt.key, m.get("namespace"), m["name"])
        gone = {**obj, "metadata": {**m, "resourceVersion": self.next_resource_version()}}
        self._emit(rt, Event(self._rv, "DELETED", gone))
        if rt.key == CRDS:
            for served in self.catalogue.remove_crd(m["name"]):
                for item in list(self.store.select(served.key)):
                    self._remove(served, item, "Background")
                for watcher in list(self.hub(served.key).watchers):
                    watcher.close()
        if rt.key == NAMESPACES:
            for other in self.catalogue:
                if other.namespaced:
                    for item in list(self.store.select(other.key, m["name"])):
                        self._remove(other, item, "Background")
        if m.get("uid"):
            self._collect(m["uid"], propagation)
        return gone

    def _collect(self, uid: str, propagation: str) -> None:
        """Garbage collection: a dependent whose owners are all gone goes too (or, with Orphan, only
        loses its reference); one that still has a live owner only loses the dangling reference."""
        for resource, dependent in self.store.dependents(uid):
            rt = self.catalogue.by_key(resource)
            if rt is None:
                continue
            refs = meta(dependent).get("ownerReferences") or []
            alive = [
                r for r in refs if r.get("uid") != uid and self.store.by_uid(r.get("uid", "")) is not None
            ]
            if propagation == "Orphan" or alive:
                kept = [r for r in refs if r.get("uid") != uid]
                m = {**meta(dependent), "ownerReferences": kept}
                if not kept:
                    del m["ownerReferences"]
                self._commit(rt, {**dependent, "metadata": m}, dependent)
            elif meta(dependent).get("finalizers"):
                self._mark_deleted(rt, dependent)
            else:
                self._remove(rt, dependent, propagation)

    def _mark_deleted(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        if meta(obj).get("deletionTimestamp"):
            return obj
        m = {**meta(obj), "deletionTimestamp": now(), "deletionGracePeriodSeconds": 0}
        return self._commit(rt, {**obj, "metadata": m}, obj)

    async def _create(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        body = parse_body(request)
        if not isinstance(body, dict):
            raise errors.bad_request("Object 'Kind' is missing in the body: it is not a JSON object")
        raw_meta = {} if body.get("metadata") is None else body["metadata"]
        check_meta_types(raw_meta)
        m = dict(raw_meta)
        if not m.get("name") and m.get("generateName"):
            m["name"] = m["generateName"] + "".join(random.choices(_NAME_CHARS, k=5))
        for key in ("uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            m.pop(key, None)
        m.update({"uid": str(uuid.uuid4()), "creationTimestamp": now(), "generation": 1})
        body = {**body, "metadata": m}
        if "status" in rt.subresources:
            body.pop("status", None)  # status is written through its subresource only
        obj, warnings = admit(rt, body, namespace=route.namespace, params=request.params)
        if rt.key == PODS:
            obj, more = await self._mutate(rt, obj, request)
            warnings += more
            obj = self._admit_pod(obj)
        m = meta(obj)
        if self.store.get(rt.key, m.get("namespace"), m["name"]) is not None:
            raise errors.already_exists(rt.plural, rt.group, m["name"])
        if (
            self.require_namespaces
            and rt.namespaced
            and self.store.get(NAMESPACES, None, m["namespace"]) is None
        ):
            raise errors.namespace_not_found(m["namespace"])
        if request.params.get("dryRun") == "All":
            return self._respond(obj, 201, warnings)
        return self._respond(self._commit(rt, obj, None), 201, warnings)

    def _update(self, rt: ResourceType, route: Route, request: Any, verb: str) -> aiohttp.web.StreamResponse:
        assert route.name is not None
        old = self.store.get(rt.key, route.namespace, route.name)
        if old is None:
            raise errors.not_found(rt.plural, rt.group, route.name)
        body = parse_body(request)
        if verb == "patch":
            content_type = header(request, "Content-Type")
            candidate = apply_patch(old, body, content_type, custom=rt.schema is not None or bool(rt.crd))
        else:
            if not isinstance(body, dict):
                raise errors.bad_request("Object 'Kind' is missing in the body: it is not a JSON object")
            candidate = body
        if not isinstance(candidate.get("metadata"), dict):
            candidate = {**candidate, "metadata": {}}
        m = dict(candidate["metadata"])
        if m.get("name") and m["name"] != route.name:
            raise errors.bad_request(
                f"the name of the object ({m['name']}) does not match the name on the URL ({route.name})"
            )
        m["name"] = route.name
        old_m = meta(old)
        wanted_rv = m.get("resourceVersion")
        if wanted_rv and str(wanted_rv) != str(old_m.get("resourceVersion")):
            raise errors.conflict(rt.plural, rt.group, route.name, errors.STALE)
        if m.get("uid") and m["uid"] != old_m.get("uid"):
            have = old_m.get("uid")
            why = f"Precondition failed: UID in precondition: {m['uid']}, UID in object meta: {have}"
            raise errors.conflict(rt.plural, rt.group, route.name, why)
        for key in _SERVER_OWNED:
            if key in old_m:
                m[key] = old_m[key]
            else:
                m.pop(key, None)
        candidate = {**candidate, "metadata": m}
        if route.sub == "status":
            status = candidate.get("status")
            candidate = {k: v for k, v in old.items() if k != "status"}
            if status is not None:
                candidate["status"] = status
        elif "status" in rt.subresources:
            candidate = {k: v for k, v in candidate.items() if k != "status"}
            if "status" in old:
                candidate["status"] = old["status"]
        obj, warnings = admit(rt, candidate, namespace=route.namespace, params=request.params, old=old)
        if rt.key == PODS and route.sub is None:
            causes = pods.update_causes(obj, old)
            if causes:
                raise errors.invalid(rt.kind, rt.group, route.name, causes)
        if request.params.get("dryRun") == "All":
            return self._respond(obj, 200, warnings)
        return self._respond(self._commit(rt, obj, old), 200, warnings)

    def _delete_options(self, request: Any) -> dict[str, Any]:
        if not request.body.strip():
            return {}
        body = parse_body(request)
        if not isinstance(body, dict):
            raise errors.bad_request("the body of a delete request must be DeleteOptions")
        return body

    def _delete(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        assert route.name is not None
        obj = self.store.get(rt.key, route.namespace, route.name)
        if obj is None:
            raise errors.not_found(rt.plural, rt.group, route.name)
        options = self._delete_options(request)
        pre = options.get("preconditions") or {}
        m = meta(obj)
        if pre.get("uid") and pre["uid"] != m.get("uid"):
            raise errors.conflict(
                rt.plural,
                rt.group,
                route.name,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {m.get('uid')}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != m.get("resourceVersion"):
            raise errors.conflict(
                rt.plural,
                rt.group,
                route.name,
                f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
                f"ResourceVersion in object meta: {m.get('resourceVersion')}",
            )
        if request.params.get("dryRun") == "All" or options.get("dryRun") == ["All"]:
            return self._respond(obj)
        propagation = (
            options.get("propagationPolicy") or request.params.get("propagationPolicy") or "Background"
        )
        if m.get("finalizers"):
            return self._respond(self._mark_deleted(rt, obj))
        return self._respond(self._remove(rt, obj, propagation))

    def _delete_collection(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        labels = label_selector(request.params)
        fields = field_selector(request.params, rt.selectable)
        items = list(self.store.select(rt.key, route.namespace, labels, fields))
        if request.params.get("dryRun") != "All":
            for obj in items:
                if meta(obj).get("finalizers"):
                    self._mark_deleted(rt, obj)
                else:
                    self._remove(rt, obj, "Background")
        return self._respond(
            {
                "kind": rt.list_kind,
                "apiVersion": rt.group_version,
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        )

    def _bind(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        """POST pods/<name>/binding: what kube-scheduler does to place a pod."""
        assert route.name is not None
        pod = self.store.get(rt.key, route.namespace, route.name)
        if pod is None:
            raise errors.not_found(rt.plural, rt.group, route.name)
        body = parse_body(request)
        target = (body.get("target") or {}).get("name") if isinstance(body, dict) else None
        if not target:
            raise errors.invalid("Binding", "", route.name, [required("target.name")])
        expected_uid = (body.get("metadata") or {}).get("uid") if isinstance(body, dict) else None
        if expected_uid and expected_uid != meta(pod).get("uid"):
            raise errors.conflict(rt.plural, rt.group, route.name, _uid_mismatch(expected_uid, pod))
        current = (pod.get("spec") or {}).get("nodeName")
        if current:
            raise errors.conflict(
                "pods/binding", "", route.name, f'pod {route.name} is already assigned to node "{current}"'
            )
        if pods.gates(pod):
            raise errors.conflict(
                "pods/binding", "", route.name, f"pod {route.name} has non-empty .spec.schedulingGates"
            )
        status = dict(pod.get("status") or {})
        kept = [
            c
            for c in status.get("conditions") or []
            if isinstance(c, dict) and c.get("type") != "PodScheduled"
        ]
        scheduled = {
            "type": "PodScheduled",
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": now(),
        }
        status["conditions"] = [*kept, scheduled]
        spec = {**(pod.get("spec") or {}), "nodeName": target}
        self._commit(rt, {**pod, "spec": spec, "status": status}, pod)
        return self._respond(_SUCCESS, 201)

    def _evict(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        """POST pods/<name>/eviction (policy/v1 Eviction): the pod is deleted (no PodDisruptionBudget
        is emulated, so every eviction is allowed)."""
        assert route.name is not None
        body = parse_body(request)
        if not isinstance(body, dict):
            raise errors.bad_request("Object 'Kind' is missing in the body: it is not a JSON object")
        for field, allowed in (("apiVersion", ("policy/v1", "policy/v1beta1")), ("kind", ("Eviction",))):
            if body.get(field) not in allowed:
                have = body.get(field)
                raise errors.bad_request(
                    f"the {field} of an eviction must be one of {', '.join(allowed)}, got {have!r}"
                )
        name = (body.get("metadata") or {}).get("name") if isinstance(body.get("metadata"), dict) else None
        if name != route.name:
            raise errors.bad_request("name in URL does not match name in Eviction object")
        pod = self.store.get(rt.key, route.namespace, route.name)
        if pod is None:
            raise errors.not_found(rt.plural, rt.group, route.name)
        options = body.get("deleteOptions") or {}
        if not isinstance(options, dict):
            raise errors.bad_request("deleteOptions of an eviction must be an object")
        wanted = (options.get("preconditions") or {}).get("uid")
        if wanted and wanted != meta(pod).get("uid"):
            raise errors.conflict(rt.plural, rt.group, route.name, _uid_mismatch(wanted, pod))
        if request.params.get("dryRun") != "All" and options.get("dryRun") != ["All"]:
            if meta(pod).get("finalizers"):
                self._mark_deleted(rt, pod)
            else:
                self._remove(rt, pod, "Background")
        return self._respond(_SUCCESS, 201)

    async def _mutate(
        self, rt: ResourceType, obj: dict[str, Any], request: Any
    ) -> tuple[dict[str, Any], list[str]]:
        """The mutating webhooks' turn (see `webhooks`), then the object validated again as changed."""
        configurations = list(self.store.select(MUTATING_WEBHOOKS))
        if not configurations:
            return obj, []
        m = meta(obj)
        namespace = m.get("namespace", "")
        ns_labels = {
            **(meta(self.store.get(NAMESPACES, None, namespace) or {}).get("labels") or {}),
            "kubernetes.io/metadata.name": namespace,
        }
        target = webhooks.Target(
            rt.group,
            rt.version,
            rt.kind,
            rt.plural,
            namespace,
            m.get("name", ""),
            dry_run=request.params.get("dryRun") == "All",
        )
        outcome = await webhooks.admit_through_webhooks(configurations, target, obj, ns_labels, self.services)
        if not outcome.called:
            return obj, []
        # A webhook may not rename or move the object; whatever else it changed is validated as sent.
        changed = {**outcome.obj, "metadata": {**meta(outcome.obj), **{k: m[k] for k in _PINNED if k in m}}}
        obj, more = admit(rt, changed, namespace=namespace, params=request.params)
        return obj, outcome.warnings + more

    def _admit_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The pod's own rules at creation (gates, nodeName), and the status the API server gives it."""
        causes = pods.create_causes(pod)
        if causes:
            raise errors.invalid("Pod", "", meta(pod).get("name", ""), causes)
        return {**pod, "status": pods.created_status(pod, now())}
