"""The two writes that let an admitted pod go: pin it to its node, then remove our gate. Pure JSON patches.

Kubernetes lets a gated pod's required node affinity be narrowed: every existing term gains
`matchFields: metadata.name In [node]` (terms are ORed, so each must be narrowed); a pod without one gets
a single term holding just that. nodeSelector and existing expressions are never touched. The gate is
removed by index, guarded by a `test` op on that index, so a gate list changed since we read it fails the
patch instead of removing someone else's gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _field(node: str) -> dict[str, Any]:
    return {"key": "metadata.name", "operator": "In", "values": [node]}


def _uid_test(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    uid = (pod.get("metadata") or {}).get("uid")
    return [{"op": "test", "path": "/metadata/uid", "value": uid}] if uid else []


def pinned_to(pod: Mapping[str, Any], node: str) -> bool:
    """Every required term already names the node (a restart after the pin was written)."""
    terms = _terms(pod)
    return bool(terms) and all(_field(node) in (t.get("matchFields") or []) for t in terms)


def _terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    affinity = spec.get("affinity") or {}
    na = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    req = na.get(REQUIRED) if isinstance(na, Mapping) else None
    terms = req.get("nodeSelectorTerms") if isinstance(req, Mapping) else None
    return [t for t in terms if isinstance(t, Mapping)] if isinstance(terms, list) else []


def pin_patch(pod: Mapping[str, Any], node: str) -> list[dict[str, Any]] | None:
    """The JSON patch pinning the pod to `node`; None when it already is."""
    if pinned_to(pod, node):
        return None
    field = _field(node)
    ops = _uid_test(pod)
    terms = _terms(pod)
    base = f"/spec/affinity/nodeAffinity/{REQUIRED}"
    if terms:
        for i, term in enumerate(terms):
            fields = term.get("matchFields")
            if not isinstance(fields, list):
                ops.append(
                    {"op": "add", "path": f"{base}/nodeSelectorTerms/{i}/matchFields", "value": [field]}
                )
            elif field not in fields:
                ops.append(
                    {"op": "add", "path": f"{base}/nodeSelectorTerms/{i}/matchFields/-", "value": field}
                )
        return ops
    required = {"nodeSelectorTerms": [{"matchFields": [field]}]}
    spec = pod.get("spec") or {}
    affinity = spec.get("affinity")
    if not isinstance(affinity, Mapping):
        ops.append({"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {REQUIRED: required}}})
    elif not isinstance(affinity.get("nodeAffinity"), Mapping):
        ops.append({"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {REQUIRED: required}})
    else:
        ops.append({"op": "add", "path": base, "value": required})
    return ops


def gate_index(pod: Mapping[str, Any], gate: str) -> int | None:
    gates = (pod.get("spec") or {}).get("schedulingGates")
    if not isinstance(gates, list):
        return None
    for i, g in enumerate(gates):
        if isinstance(g, Mapping) and g.get("name") == gate:
            return i
    return None


def ungate_patch(pod: Mapping[str, Any], gate: str) -> list[dict[str, Any]] | None:
    """The JSON patch removing only our gate; None when the pod does not carry it."""
    i = gate_index(pod, gate)
    if i is None:
        return None
    return [
        *_uid_test(pod),
        {"op": "test", "path": f"/spec/schedulingGates/{i}/name", "value": gate},
        {"op": "remove", "path": f"/spec/schedulingGates/{i}"},
    ]
