"""What the API server checks of a Pod beyond its metadata: scheduling gates and the pod spec's
immutability (kubernetes pkg/apis/core/validation: ValidatePodCreate, ValidatePodUpdate), and the status
it gives a pod at creation.

- `spec.schedulingGates` are set at creation only: an update may remove any of them, in any order,
  never add one; a pod is never created with both gates and `spec.nodeName`.
- The pod spec is immutable but for container images, `activeDeadlineSeconds`,
  `terminationGracePeriodSeconds`, added tolerations and removed gates; while a pod is gated, also
  additions to `nodeSelector` and narrowing of required node affinity (each existing term keeps its
  expressions and fields and may get more; an absent or empty one may be set to anything).
- A new pod is Pending; a gated one says so: PodScheduled=False, reason SchedulingGated.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from nodefabric_operator.demo.kubeapi.errors import Cause
from nodefabric_operator.demo.kubeapi.validation import forbidden, invalid, qualified_name_errors

GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"
IMMUTABLE = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
    "(allow it to be set to 1 if it was previously negative)"
)
_TERMS = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"


def _spec(pod: Mapping[str, Any]) -> dict[str, Any]:
    spec = pod.get("spec")
    return spec if isinstance(spec, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def gates(pod: Mapping[str, Any]) -> list[Any]:
    return [g.get("name") if isinstance(g, dict) else g for g in _list(_spec(pod).get("schedulingGates"))]


def _gate_causes(pod: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    seen: set[Any] = set()
    for i, gate in enumerate(_list(_spec(pod).get("schedulingGates"))):
        where = f"spec.schedulingGates[{i}]"
        name = gate.get("name") if isinstance(gate, dict) else None
        if not isinstance(name, str):
            causes.append(invalid(f"{where}.name", name, "must be a string"))
            continue
        causes += [invalid(f"{where}.name", name, m) for m in qualified_name_errors(name)]
        if name in seen:
            causes.append(Cause("FieldValueDuplicate", where, f"Duplicate value: {invalid_value(name)}"))
        seen.add(name)
    return causes


def invalid_value(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def create_causes(pod: Mapping[str, Any]) -> list[Cause]:
    causes = _gate_causes(pod)
    if _spec(pod).get("schedulingGates") and _spec(pod).get("nodeName"):
        causes.append(forbidden("spec.nodeName", "cannot be set until all schedulingGates have been cleared"))
    return causes


def without_empty_gates(pod: dict[str, Any]) -> dict[str, Any]:
    """An empty gate list is not stored (the field is `omitempty`): a pod whose last gate went has none."""
    spec = pod.get("spec")
    if isinstance(spec, dict) and spec.get("schedulingGates") == []:
        return {**pod, "spec": {k: v for k, v in spec.items() if k != "schedulingGates"}}
    return pod


def created_status(pod: Mapping[str, Any], now: str) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending"}
    if _spec(pod).get("schedulingGates"):
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "SchedulingGated",
                "message": GATED_MESSAGE,
                "lastProbeTime": None,
                "lastTransitionTime": now,
            }
        ]
    return status


def _only_deleted_gates(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    before = set(gates(old))
    return [
        forbidden(
            f"spec.schedulingGates[{i}].name",
            f"only deletion is allowed, but found new scheduling gate '{name}'",
        )
        for i, name in enumerate(gates(new))
        if name not in before
    ]


def _node_selector(new: dict[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    have = new.get("nodeSelector")
    had = old.get("nodeSelector")
    if have == had:
        return []
    have_map = have if isinstance(have, dict) else {}
    for key, value in (had if isinstance(had, dict) else {}).items():
        if have_map.get(key) != value:
            return [
                invalid(
                    "spec.nodeSelector",
                    have_map,
                    "only additions to spec.nodeSelector are allowed (no mutations or deletions)",
                )
            ]
    return []


def _required_terms(spec: Mapping[str, Any]) -> list[Any] | None:
    affinity = spec.get("affinity")
    node = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(node, dict) else None
    if not isinstance(required, dict):
        return None
    return _list(required.get("nodeSelectorTerms"))


def _only_additions(new: Any, old: Any) -> bool:
    new = new if isinstance(new, dict) else {}
    old = old if isinstance(old, dict) else {}
    for key in ("matchExpressions", "matchFields"):
        before, after = _list(old.get(key)), _list(new.get(key))
        if len(before) > len(after) or after[: len(before)] != before:
            return False
    return True


def _node_affinity(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    old_terms = _required_terms(old)
    if not old_terms:  # none, or an empty list: anything may be set
        return []
    new_terms = _required_terms(new) or []
    if len(new_terms) != len(old_terms):
        return [
            invalid(
                _TERMS, new_terms, "no additions/deletions to non-empty NodeSelectorTerms list are allowed"
            )
        ]
    return [
        invalid(f"{_TERMS}[{i}]", new_terms[i], "only additions are allowed (no mutations or deletions)")
        for i in range(len(old_terms))
        if not _only_additions(new_terms[i], old_terms[i])
    ]


def _only_added_tolerations(new: Mapping[str, Any], old: Mapping[str, Any]) -> list[Cause]:
    # As validateOnlyAddedTolerations: an old toleration still there, whatever its tolerationSeconds now.
    def sans_seconds(t: Any) -> Any:
        return {k: v for k, v in t.items() if k != "tolerationSeconds"} if isinstance(t, dict) else t

    after = [sans_seconds(t) for t in _list(new.get("tolerations"))]
    for toleration in _list(old.get("tolerations")):
        if sans_seconds(toleration) not in after:
            return [
                forbidden(
                    "spec.tolerations", "existing toleration can not be modified except its tolerationSeconds"
                )
            ]
    return []


def update_causes(new_pod: Mapping[str, Any], old_pod: Mapping[str, Any]) -> list[Cause]:
    """Why the API server refuses this update of a pod's spec (empty: it may be stored)."""
    new, old = _spec(new_pod), _spec(old_pod)
    if new == old:
        return []
    causes = _gate_causes(new_pod) + _only_deleted_gates(new_pod, old_pod) + _only_added_tolerations(new, old)
    munged = copy.deepcopy(new)
    for key in ("schedulingGates", "tolerations", "activeDeadlineSeconds", "terminationGracePeriodSeconds"):
        _same(munged, old, key)
    for kind in ("containers", "initContainers"):
        have, had = _list(munged.get(kind)), _list(old.get(kind))
        if len(have) == len(had):
            for mine, theirs in zip(have, had, strict=True):
                if isinstance(mine, dict) and isinstance(theirs, dict):
                    _same(mine, theirs, "image")
    if gates(old_pod):
        causes += _node_selector(munged, old) + _node_affinity(munged, old)
        _same(munged, old, "nodeSelector")
        now_affinity = dict(munged["affinity"]) if isinstance(munged.get("affinity"), dict) else {}
        old_affinity = old["affinity"] if isinstance(old.get("affinity"), dict) else {}
        _same(now_affinity, old_affinity, "nodeAffinity")
        if now_affinity or "affinity" in old:
            munged["affinity"] = now_affinity
        else:
            munged.pop("affinity", None)
    if munged != old and not causes:
        changed = sorted(k for k in set(munged) | set(old) if munged.get(k) != old.get(k))
        causes.append(
            forbidden("spec", IMMUTABLE + "\n  changed: " + ", ".join(f"spec.{k}" for k in changed))
        )
    return causes


def _same(new: dict[str, Any], old: Mapping[str, Any], key: str) -> None:
    """Take `key` as `old` has it (present or absent): a field whose change is checked elsewhere."""
    if key in old:
        new[key] = copy.deepcopy(old[key])
    else:
        new.pop(key, None)
