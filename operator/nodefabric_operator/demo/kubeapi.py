"""An in-process Kubernetes API for tests and the demo: kmock's emulator, plus what our parts rely on.

kmock's KubernetesEmulator keeps objects and serves CRUD, merge patches and watches over real HTTP. A
real API server also does the following, and our components depend on it, so this subclass adds it
(rather than monkeypatching any client):

- metadata.uid, resourceVersion (one cluster-wide counter), creationTimestamp, generation on writes;
- optimistic concurrency: a patch that names a stale resourceVersion is refused with 409;
- the status subresource: a patch to the object ignores `status`, one to `/status` touches only it;
- list responses with `kind`/`apiVersion`/`resourceVersion`, and label selectors on lists and watches;
- CustomResourceDefinitions: creating one serves its resource, and `kubectl get` gets the server-side
  Table of its printer columns;
- garbage collection: deleting an owner deletes the objects whose ownerReferences name its uid;
- fault injection: `fail_next(n, status)` answers the next n writes with that status (outages, conflicts).

`running_api()` starts it on 127.0.0.1 and writes a kubeconfig, so every component connects exactly as
it would to a cluster (`--kubeconfig`), with no code path of its own for tests.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import attrs
import kmock
import yaml
from kmock._internal import enums, rendering

# (group/version/plural, kind, namespaced, subresources): the built-in resources our parts touch.
BUILTIN_RESOURCES: tuple[tuple[str, str, bool, tuple[str, ...]], ...] = (
    ("v1/nodes", "Node", False, ("status",)),
    ("v1/pods", "Pod", True, ("status", "binding")),
    ("v1/namespaces", "Namespace", False, ()),
    ("v1/events", "Event", True, ()),
    ("events.k8s.io/v1/events", "Event", True, ()),
    ("coordination.k8s.io/v1/leases", "Lease", True, ()),
    ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition", False, ("status",)),
    ("nfd.k8s-sigs.io/v1alpha1/nodefeatures", "NodeFeature", True, ()),
    ("scheduling.x-k8s.io/v1alpha1/podgroups", "PodGroup", True, ("status",)),
)
_VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}


class SelectorError(ValueError):
    pass


def parse_label_selector(text: str) -> list[tuple[str, str, frozenset[str]]]:
    """Equality and set-based selectors as kubectl writes them: a=b, a!=b, a in (x,y), a notin (x), a, !a."""
    terms: list[tuple[str, str, frozenset[str]]] = []
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for raw in (p.strip() for p in parts):
        if not raw:
            continue
        if " notin " in raw or " in " in raw:
            op = "notin" if " notin " in raw else "in"
            key, _, values = raw.partition(f" {op} ")
            inner = values.strip()
            if not (inner.startswith("(") and inner.endswith(")")):
                raise SelectorError(f"bad set in selector term {raw!r}")
            terms.append((key.strip(), op, frozenset(v.strip() for v in inner[1:-1].split(","))))
        elif "!=" in raw:
            key, _, value = raw.partition("!=")
            terms.append((key.strip(), "notin", frozenset([value.strip()])))
        elif "=" in raw:
            key, _, value = raw.replace("==", "=").partition("=")
            terms.append((key.strip(), "in", frozenset([value.strip()])))
        elif raw.startswith("!"):
            terms.append((raw[1:].strip(), "absent", frozenset()))
        else:
            terms.append((raw, "exists", frozenset()))
    return terms


def selector_matches(terms: Iterable[tuple[str, str, frozenset[str]]], labels: Mapping[str, str]) -> bool:
    for key, op, values in terms:
        present = key in labels
        if (
            (op == "in" and not (present and labels[key] in values))
            or (op == "notin" and present and labels[key] in values)
            or (op == "exists" and not present)
            or (op == "absent" and present)
        ):
            return False
    return True


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class KubeAPI(kmock.KubernetesEmulator):  # type: ignore[misc]
    _counter: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _status_resources: set[Any] = attrs.field(factory=set, init=False)
    _faults: list[int] = attrs.field(factory=list, init=False)
    _printer_columns: dict[Any, list[dict[str, Any]]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, kind, namespaced, subresources in BUILTIN_RESOURCES:
            self.declare(key, kind=kind, namespaced=namespaced, subresources=subresources)

    # The Kubernetes release whose APIs this emulates (resource.k8s.io/v1 is served from 1.34), as GET
    # /version tells clients that check it: helm's kubeVersion, kubectl's version-skew warning. kmock says
    # v1.26, older than anything the chart installs on.
    SERVER_VERSION = (1, 34, 0)

    async def _serve_server_version(self, request: rendering.Request) -> rendering.Payload:
        payload = await super()._serve_server_version(request)
        major, minor, patch = self.SERVER_VERSION
        return {**payload, "major": str(major), "minor": str(minor), "gitVersion": f"v{major}.{minor}.{patch}"}

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        """An APIResourceList, whose core groupVersion is "v1", as the API server writes it: kmock writes
        "/v1", and client-go's REST mapper (helm's) then maps no core kind at all."""
        payload = await super()._serve_version(request)
        return {**payload, "groupVersion": str(payload["groupVersion"]).lstrip("/")}

    # --- declarations -------------------------------------------------------------------------------

    def declare(self, key: str, *, kind: str, namespaced: bool, subresources: Iterable[str] = ()) -> None:
        singular = kind.lower()
        self.resources[key] = kmock.ResourceInfo(
            kind=kind, singular=singular, namespaced=namespaced, verbs=_VERBS, subresources=set(subresources)
        )
        if "status" in subresources:
            self._status_resources.add(kmock.resource(key))

    def declare_crd(self, crd: Mapping[str, Any]) -> None:
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            key = f"{spec['group']}/{version['name']}/{spec['names']['plural']}"
            self._printer_columns[kmock.resource(key)] = version.get("additionalPrinterColumns", [])
            self.declare(
                key,
                kind=spec["names"]["kind"],
                namespaced=spec.get("scope") == "Namespaced",
                subresources=version.get("subresources", {}).keys(),
            )

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next `count` writes (create/patch/delete) with `status`: an outage or a conflict."""
        self._faults.extend([status] * count)

    def next_resource_version(self) -> str:
        return str(next(self._counter))

    # --- the request path ---------------------------------------------------------------------------

    async def _handle(self, request: rendering.Request) -> Any:
        action = request.action
        is_write = action in (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE)
        if request.resource is not None and is_write and self._faults:
            status = self._faults.pop(0)
            raise kmock.KubernetesError(status=status, reason="Injected", message=f"injected HTTP {status}")
        if request.resource is not None and isinstance(request.data, dict):
            if action == enums.action.CREATE:
                self._stamp_create(request)
            elif action == enums.action.UPDATE and request.name is not None:
                self._stamp_update(request)
        response = await super()._handle(request)
        if action == enums.action.CREATE and response.status == 200 and not response.prepared:
            response.set_status(201)  # clients generated from the OpenAPI spec read only 201 on create
        if request.resource is not None and action == enums.action.DELETE and request.name is not None:
            await self._collect_dependents(request)
        return response

    def _stamp_create(self, request: rendering.Request) -> None:
        meta = request.data.setdefault("metadata", {})
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            # An API server appends a random suffix (kopf names its Events this way).
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["resourceVersion"] = self.next_resource_version()
        meta["generation"] = 1
        if request.resource in self._status_resources:
            request.data.pop("status", None)  # status is written through its subresource only
        if request.resource == kmock.resource("apiextensions.k8s.io/v1/customresourcedefinitions"):
            self.declare_crd(request.data)

    def _stamp_update(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects:
            return  # kmock answers 404
        stored = self.objects[key]
        if stored.deleted:
            return  # kmock answers 404
        current = stored.get("metadata", {}).get("resourceVersion")
        wanted = request.data.get("metadata", {}).get("resourceVersion")
        if wanted is not None and current is not None and str(wanted) != str(current):
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message=f"the object has been modified; resourceVersion {wanted} is not {current}",
            )
        if request.resource in self._status_resources:
            if request.subresource == "status":
                status = request.data.get("status")
                request.data.clear()  # the request is frozen; its payload dict is not
                request.data.update({"status": status, "metadata": {}})
            else:
                request.data.pop("status", None)
        meta = request.data.setdefault("metadata", {})
        if "spec" in request.data:
            meta["generation"] = int(stored.get("metadata", {}).get("generation", 1)) + 1
        meta["resourceVersion"] = self.next_resource_version()

    async def _collect_dependents(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or not self.objects[key].deleted:
            return  # still held by finalizers
        uid = self.objects[key].last.get("metadata", {}).get("uid")
        if not uid:
            return
        for (resource, namespace, name), obj in list(self.objects.items()):
            if obj.deleted:
                continue
            owners = obj.get("metadata", {}).get("ownerReferences", [])
            if any(ref.get("uid") == uid for ref in owners):
                async with self._lock:
                    raw = obj.raw
                    obj.delete()
                    await self._buses[resource].put({"type": "DELETED", "object": raw})
                await self._collect_dependents(
                    rendering.Request(resource=resource, namespace=namespace, name=name)
                )

    def _kind(self, request: rendering.Request) -> str:
        for res, info in self.resources.items():
            if res == request.resource and getattr(info, "kind", None):
                return str(info.kind)
        return ""

    async def _serve_list(self, request: rendering.Request) -> Any:
        result = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            terms = parse_label_selector(selector)
            result["items"] = [
                i
                for i in result["items"]
                if selector_matches(terms, i.get("metadata", {}).get("labels") or {})
            ]
        field_selector = request.params.get("fieldSelector", "")
        if field_selector.startswith("metadata.name="):
            name = field_selector.partition("=")[2]
            result["items"] = [i for i in result["items"] if i.get("metadata", {}).get("name") == name]
        resource = request.resource
        group_version = resource.version if not resource.group else f"{resource.group}/{resource.version}"
        result["apiVersion"] = group_version
        result["kind"] = f"{self._kind(request)}List"
        result["metadata"] = {"resourceVersion": str(next(self._counter))}
        if "as=Table" in request.headers.get("Accept", "") and request.resource in self._printer_columns:
            return as_table(result["items"], self._printer_columns[request.resource], result["metadata"])
        return result

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        selector = request.params.get("labelSelector")
        terms = parse_label_selector(selector) if selector else None
        async for event in super()._serve_watch(request):
            if terms is None or not isinstance(event, dict):
                yield event
                continue
            labels = event.get("object", {}).get("metadata", {}).get("labels") or {}
            if selector_matches(terms, labels):
                yield event

    # --- convenience for tests and the demo ---------------------------------------------------------

    def stored(self, key: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        ref = (kmock.resource(key), namespace, name)  # `in` does not parse string keys, indexing does
        if ref not in self.objects or self.objects[ref].deleted:
            return None
        raw: dict[str, Any] = self.objects[ref].raw
        return raw

    def put_object(self, key: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Seed an object directly (as an admin or the cloud would have), with API-side metadata."""
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["resourceVersion"] = self.next_resource_version()
        self.objects[key, meta.get("namespace"), meta["name"]] = obj
        return obj


def jsonpath(obj: Any, path: str) -> list[Any]:
    """The simple JSONPath subset printer columns use: `.a.b`, `.a[*].b`, `.a[0]`."""
    values = [obj]
    for part in path.strip().lstrip(".").split("."):
        name, _, index = part.partition("[")
        nxt: list[Any] = []
        for value in values:
            if isinstance(value, dict) and name in value:
                nxt.append(value[name])
        if index:
            index = index.rstrip("]")
            flat: list[Any] = []
            for value in nxt:
                if isinstance(value, list):
                    flat.extend(value if index == "*" else value[int(index) : int(index) + 1])
            nxt = flat
        values = nxt
    return values


def _age(timestamp: str) -> str:
    then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    seconds = int((datetime.datetime.now(datetime.UTC) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def as_table(
    items: list[dict[str, Any]], columns: list[dict[str, Any]], meta: dict[str, Any]
) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table as the API server renders a custom resource's printer columns for kubectl."""
    definitions = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
    definitions += [
        {
            "name": c["name"],
            "type": c["type"],
            "format": "",
            "description": c.get("description", ""),
            "priority": c.get("priority", 0),
        }
        for c in columns
    ]
    rows = []
    for item in items:
        cells: list[Any] = [item["metadata"]["name"]]
        for c in columns:
            found = jsonpath(item, c["jsonPath"])
            if not found:
                cells.append(None)
            elif c["type"] == "date":
                cells.append(_age(found[0]))
            elif len(found) == 1:
                cells.append(found[0])
            else:
                cells.append(",".join(str(v) for v in found))
        rows.append(
            {
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": item["metadata"],
                },
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": definitions,
        "rows": rows,
    }


@dataclass
class RunningAPI:
    api: KubeAPI
    server: Any
    url: str
    kubeconfig: str

    def requests(self, method: str | None = None, resource: str | None = None) -> list[Any]:
        """Requests the API received, by HTTP method and resource ("worker.gpustack.ai/v1alpha1/devices")."""
        out = []
        wanted = kmock.resource(resource) if resource else None
        for req in self.api:
            if method and str(getattr(req.method, "value", req.method)).upper() != method:
                continue
            if wanted is not None and req.resource != wanted:
                continue
            out.append(req)
        return out

    def count(self, method: str | None = None, resource: str | None = None) -> int:
        """How many requests the API received, by HTTP method and resource: the tests' request budget."""
        return len(self.requests(method, resource))


def write_kubeconfig(url: str, directory: str) -> str:
    path = os.path.join(directory, "kubeconfig")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {"token": "emulator"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator"}}],
        "current-context": "emulator",
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path


@contextlib.asynccontextmanager
async def running_api(
    crds: Iterable[Mapping[str, Any]] = (), directory: str | None = None
) -> AsyncIterator[RunningAPI]:
    """Serve a fresh emulator on 127.0.0.1 with the given CRDs loaded and a kubeconfig pointing at it."""
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="nodefabric-api-"))
        async with KubeAPI() as api, kmock.Server(api) as server:
            for crd in crds:
                api.declare_crd(crd)
            url = str(server.url).rstrip("/")
            yield RunningAPI(api=api, server=server, url=url, kubeconfig=write_kubeconfig(url, directory))


def load_crds(paths: Iterable[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            out.extend(doc for doc in yaml.safe_load_all(f) if doc)
    return out
