"""A pod's POST subresources: `binding` (what kube-scheduler does to place a pod) and `eviction`
(policy/v1 Eviction). The status subresource is an update (`writes`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp.web

from nodefabric_operator.demo.kubeapi import errors, pods
from nodefabric_operator.demo.kubeapi.admission import now, parse_body
from nodefabric_operator.demo.kubeapi.catalogue import ResourceType
from nodefabric_operator.demo.kubeapi.responses import respond
from nodefabric_operator.demo.kubeapi.routes import Route
from nodefabric_operator.demo.kubeapi.state import Objects
from nodefabric_operator.demo.kubeapi.store import meta
from nodefabric_operator.demo.kubeapi.validation import required

_SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


class PodSubresources:
    def __init__(self, objects: Objects) -> None:
        self._objects = objects

    def bind(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        """POST pods/<name>/binding: what kube-scheduler does to place a pod."""
        assert route.name is not None
        pod = self._objects.existing(rt, route.namespace, route.name)
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
        self._objects.commit(rt, {**pod, "spec": spec, "status": status}, pod)
        return respond(_SUCCESS, 201)

    def evict(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
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
        pod = self._objects.existing(rt, route.namespace, route.name)
        options = body.get("deleteOptions") or {}
        if not isinstance(options, dict):
            raise errors.bad_request("deleteOptions of an eviction must be an object")
        wanted = (options.get("preconditions") or {}).get("uid")
        if wanted and wanted != meta(pod).get("uid"):
            raise errors.conflict(rt.plural, rt.group, route.name, _uid_mismatch(wanted, pod))
        if request.params.get("dryRun") != "All" and options.get("dryRun") != ["All"]:
            self._objects.delete(rt, pod)
        return respond(_SUCCESS, 201)


def _uid_mismatch(wanted: object, obj: Mapping[str, Any]) -> str:
    return f"Precondition failed: UID in precondition: {wanted}, UID in object meta: {meta(obj).get('uid')}"
