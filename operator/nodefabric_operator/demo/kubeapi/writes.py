"""Writes on a resource: create (generateName, dry runs, a pod's webhooks and rules), update and the
four patch types (resourceVersion and uid preconditions, server-owned metadata kept, the status
subresource), delete (preconditions, propagation, finalizers) and deletecollection."""

from __future__ import annotations

import random
import uuid
from typing import Any

import aiohttp.web

from nodefabric_operator.demo.kubeapi import errors, pods
from nodefabric_operator.demo.kubeapi.admission import NAMESPACES, admit, header, now, parse_body
from nodefabric_operator.demo.kubeapi.catalogue import ResourceType
from nodefabric_operator.demo.kubeapi.knobs import Knobs
from nodefabric_operator.demo.kubeapi.mutation import admit_pod, mutate
from nodefabric_operator.demo.kubeapi.patches import apply_patch
from nodefabric_operator.demo.kubeapi.responses import respond
from nodefabric_operator.demo.kubeapi.routes import Route
from nodefabric_operator.demo.kubeapi.selectors import field_selector, label_selector
from nodefabric_operator.demo.kubeapi.state import PODS, Objects
from nodefabric_operator.demo.kubeapi.store import meta
from nodefabric_operator.demo.kubeapi.validation import check_meta_types

_SERVER_OWNED = ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what the API server draws generateName suffixes from


class Writes:
    def __init__(self, objects: Objects, knobs: Knobs) -> None:
        self._objects = objects
        self._knobs = knobs

    async def create(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        store = self._objects.store
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
            obj, more = await mutate(store, self._knobs.services, rt, obj, request)
            warnings += more
            obj = admit_pod(obj)
        m = meta(obj)
        if store.get(rt.key, m.get("namespace"), m["name"]) is not None:
            raise errors.already_exists(rt.plural, rt.group, m["name"])
        if (
            self._knobs.require_namespaces
            and rt.namespaced
            and store.get(NAMESPACES, None, m["namespace"]) is None
        ):
            raise errors.namespace_not_found(m["namespace"])
        if request.params.get("dryRun") == "All":
            return respond(obj, 201, warnings)
        return respond(self._objects.commit(rt, obj, None), 201, warnings)

    def update(self, rt: ResourceType, route: Route, request: Any, verb: str) -> aiohttp.web.StreamResponse:
        assert route.name is not None
        old = self._objects.existing(rt, route.namespace, route.name)
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
            obj = pods.without_empty_gates(obj)
        if request.params.get("dryRun") == "All":
            return respond(obj, 200, warnings)
        return respond(self._objects.commit(rt, obj, old), 200, warnings)

    def delete(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        assert route.name is not None
        obj = self._objects.existing(rt, route.namespace, route.name)
        options = _delete_options(request)
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
            return respond(obj)
        propagation = (
            options.get("propagationPolicy") or request.params.get("propagationPolicy") or "Background"
        )
        return respond(self._objects.delete(rt, obj, propagation))

    def delete_collection(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        labels = label_selector(request.params)
        fields = field_selector(request.params, rt.selectable)
        items = list(self._objects.store.select(rt.key, route.namespace, labels, fields))
        if request.params.get("dryRun") != "All":
            for obj in items:
                self._objects.delete(rt, obj)
        return respond(
            {
                "kind": rt.list_kind,
                "apiVersion": rt.group_version,
                "metadata": {"resourceVersion": str(self._objects.rv)},
                "items": items,
            }
        )


def _delete_options(request: Any) -> dict[str, Any]:
    if not request.body.strip():
        return {}
    body = parse_body(request)
    if not isinstance(body, dict):
        raise errors.bad_request("the body of a delete request must be DeleteOptions")
    return body
