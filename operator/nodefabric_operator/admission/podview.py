"""What the placement controller keeps of a pod, and how it reads what it kept. Pure functions.

Nothing a pod carries is read back as state: only the annotations and labels its group is named and sized
by (inputs from the pod template), the scheduling fields the controller reads and patches, and readiness.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from nodefabric_devicemanager import vocabulary
from nodefabric_operator.admission.owners import LWS_NAME
from nodefabric_operator.extender.groups import FAMILIES, LWS_GROUP_INDEX

# Annotations kept of a pod: only what names, sizes and shapes its group (template inputs). Values longer
# than this are cut (group_of refuses them with a reason anyway): a 250 KB annotation costs nothing here.
MAX_KEPT = 1024
# The labels a pod's group is named and sized by (besides the placement.<domain>/ keys kept as annotations).
GROUP_LABELS = frozenset(
    [label for _, label, _ in FAMILIES]
    + [size for _, _, size in FAMILIES if size]
    + [LWS_GROUP_INDEX, LWS_NAME]
)
_SPEC_KEPT = (
    "schedulerName",
    "nodeName",
    "schedulingGates",
    "affinity",
    "nodeSelector",
    "tolerations",
    "overhead",
    "schedulingGroup",
    "workloadRef",
)
_META_KEPT = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "resourceVersion")


def slim(obj: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """What the controller keeps of a pod: identity, the group's naming/sizing inputs, the scheduling
    fields it reads and patches, and readiness. No claim, no decision, no long value. `prefix` is the
    placement annotation prefix."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    raw_annotations = meta.get("annotations")
    annotations: Mapping[str, Any] = raw_annotations if isinstance(raw_annotations, Mapping) else {}
    kept_keys = {prefix + k for k in vocabulary.GROUP_ANNOTATIONS}
    kept_keys.add("kueue.x-k8s.io/pod-group-total-count")
    kept = {k: str(v)[:MAX_KEPT] for k, v in annotations.items() if k in kept_keys}
    raw_labels = meta.get("labels")
    # Labels likewise: only those that name and size a group (group_of, owner_ref); the rest, however
    # many (a pod's labels have no bound but the object's size), are not kept.
    labels = {
        k: str(v)[:MAX_KEPT]
        for k, v in (raw_labels.items() if isinstance(raw_labels, Mapping) else ())
        if k in kept_keys or k in GROUP_LABELS
    }

    def containers(key: str) -> Any:
        raw = spec.get(key)
        if not isinstance(raw, list):
            return raw  # pod_needs names the bad field
        return [
            {k: c.get(k) for k in ("resources", "restartPolicy") if k in c} if isinstance(c, Mapping) else c
            for c in raw
        ]

    slim_spec = {k: spec[k] for k in _SPEC_KEPT if k in spec}
    slim_spec["containers"] = containers("containers")
    if "initContainers" in spec:
        slim_spec["initContainers"] = containers("initContainers")
    conditions = status.get("conditions")
    refs = meta.get("ownerReferences")
    # Only the controller reference is read (controls, owner_ref); a pod may carry thousands of others.
    controller = [
        {k: r.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
        for r in (refs if isinstance(refs, list) else [])
        if isinstance(r, Mapping) and r.get("controller") is True
    ][:1]
    return {
        "metadata": {k: meta[k] for k in _META_KEPT if k in meta}
        | {"labels": labels, "annotations": kept, "ownerReferences": controller},
        "spec": slim_spec,
        "status": {
            "phase": status.get("phase"),
            "conditions": [c for c in conditions if isinstance(c, Mapping) and c.get("type") == "Ready"]
            if isinstance(conditions, list)
            else [],
        },
    }


def uid(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"].get("uid"))


def name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"].get("name"))


def ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def created(pod: Mapping[str, Any]) -> float:
    text = (pod.get("metadata") or {}).get("creationTimestamp")
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def scheduler(pod: Mapping[str, Any]) -> str:
    return str(pod["spec"].get("schedulerName") or "default-scheduler")


def rv(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0
