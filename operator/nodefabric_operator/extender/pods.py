"""What a pod asks of a node: its resource requests and the scheduling rules the extender can evaluate.

kube-scheduler already applied every rule to the nodes it sends; the extender needs them again for one
question only: could ANY set of nodes in the cluster ever hold the whole group ("never fits" against
"wait")? So it evaluates what depends on the node alone: the node selector, required node affinity,
taints against tolerations, and allocatable. Inter-pod (anti-)affinity, topology spread, volumes and
ports depend on other pods and are not evaluated; they can only make a group wait, never "never fit".

A field the extender cannot read is a `PodError` naming it; a real API server never admits such a pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nodefabric_operator.extender.nodes import (
    INT64,
    NodeRecord,
    QuantityError,
    Taint,
    is_extended,
    mapping,
    quantity,
)

# Taints the node lifecycle controller and cloud controllers put on and take off as conditions come and
# go (not-ready, unreachable, memory-pressure, unschedulable, uninitialized): a state of the moment, like
# load, so they never make a group "never fit".
TRANSIENT_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
# Gt and Lt tolerations (Kubernetes 1.35, TaintTolerationComparisonOperators) compare the taint's value.
TOLERATION_OPERATORS = ("Equal", "Exists", "Gt", "Lt")
# What Go's strconv.ParseInt(s, 10, 64) takes, which kube-scheduler compares Gt and Lt values with:
# Python's int() also takes "1_000", " 8", "٨" and numbers beyond int64, which would match where
# kube-scheduler does not.
_INT = re.compile(r"[+-]?[0-9]{1,19}", re.ASCII)


def int64(text: str) -> int | None:
    """The value as kube-scheduler reads a Gt/Lt operand, or None where it fails to (no match)."""
    if not _INT.fullmatch(text):
        return None
    value = int(text)
    return value if -INT64 - 1 <= value <= INT64 else None


class PodError(ValueError):
    """A pod the extender cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]

    def matches(self, value: str | None) -> bool:
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        # Gt / Lt: both sides integers, as the API server requires of the one value.
        have, want = int64(value or ""), int64(self.values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want


@dataclass(frozen=True, slots=True)
class Term:
    """One nodeSelectorTerm: its expressions and fields are ANDed; an empty term matches no node."""

    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]

    def matches(self, node: NodeRecord) -> bool:
        if not self.expressions and not self.fields:
            return False
        return all(r.matches(node.labels.get(r.key)) for r in self.expressions) and all(
            r.matches(node.name if r.key == "metadata.name" else None) for r in self.fields
        )


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("Gt", "Lt"):
            # The taint's value against the toleration's; a taint value that is no integer never matches.
            have, want = int64(taint.value), int64(self.value)
            if have is None or want is None:
                return False
            return have > want if self.operator == "Gt" else have < want
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class PodNeeds:
    """One pod's resource requests and node rules."""

    extended: Mapping[str, int] = field(default_factory=dict)
    cpu: int = 0  # millicores
    memory: int = 0  # bytes
    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[Term, ...] | None = None  # required node affinity (ORed); None: no rule
    tolerations: tuple[Toleration, ...] = ()

    def admits(self, node: NodeRecord) -> bool:
        """Could this node ever run the pod, were it empty?"""
        labels = node.labels
        if any(labels.get(k) != v for k, v in self.selector):
            return False
        if self.terms is not None and not any(t.matches(node) for t in self.terms):
            return False
        for taint in node.taints:
            if taint.effect not in BLOCKING_EFFECTS or taint.key.startswith(TRANSIENT_TAINT_PREFIXES):
                continue
            if not any(t.tolerates(taint) for t in self.tolerations):
                return False
        if self.cpu > node.cpu > 0 or self.memory > node.memory > 0:
            return False
        return all(node.allocatable.get(res, 0) >= qty for res, qty in self.extended.items())


def _obj(value: object, where: str) -> Mapping[str, Any]:
    return mapping(value, where, PodError)


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PodError(f"{where}: must be a list, got {type(value).__name__}")
    return value


def _str(value: object, where: str, *, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise PodError(f"{where}: must be a string, got {type(value).__name__}")
    return value


def _container(c: object, where: str) -> tuple[dict[str, int], int, int]:
    res = _obj(_obj(c, where).get("resources"), f"{where}.resources")
    limits = _obj(res.get("limits"), f"{where}.resources.limits")
    requests = _obj(res.get("requests"), f"{where}.resources.requests")
    # The API server copies a limit to a missing request (extended resources may only be given as limits).
    # A limit beside its request counts for nothing, but it is still read: the API server never admits a
    # pod whose limit is not a quantity.
    _amounts(limits, dict.fromkeys(limits, f"{where}.resources.limits"))
    merged = {**limits, **requests}
    at = {name: f"{where}.resources.{'requests' if name in requests else 'limits'}" for name in merged}
    return _amounts(merged, at)


def _amounts(merged: Mapping[str, object], at: Mapping[str, str]) -> tuple[dict[str, int], int, int]:
    ext: dict[str, int] = {}
    cpu = memory = 0
    for name, value in merged.items():
        try:
            if name == "cpu":
                cpu = quantity(value, scale=1000)
            elif name == "memory":
                memory = quantity(value)
            elif is_extended(name) and (qty := quantity(value, whole=True)) > 0:
                ext[name] = qty
        except QuantityError as exc:
            raise PodError(f"{at[name]}[{name!r}]: {exc}") from None
    return ext, cpu, memory


def _requests(spec: Mapping[str, Any]) -> tuple[dict[str, int], int, int]:
    """Containers (and restartable init containers, which run beside them) summed; each ordinary init
    container runs alone, so the pod needs the larger of the two; plus the pod's overhead."""
    ext: dict[str, int] = {}
    cpu = memory = 0

    def add(more: tuple[dict[str, int], int, int]) -> None:
        nonlocal cpu, memory
        for k, v in more[0].items():
            ext[k] = ext.get(k, 0) + v
        cpu += more[1]
        memory += more[2]

    for i, c in enumerate(_list(spec.get("containers"), "spec.containers")):
        add(_container(c, f"spec.containers[{i}]"))
    alone: list[tuple[dict[str, int], int, int]] = []
    for i, c in enumerate(_list(spec.get("initContainers"), "spec.initContainers")):
        one = _container(c, f"spec.initContainers[{i}]")
        if isinstance(c, dict) and c.get("restartPolicy") == "Always":
            add(one)
        else:
            alone.append(one)
    for e, c, m in alone:
        for k, v in e.items():
            ext[k] = max(ext.get(k, 0), v)
        cpu, memory = max(cpu, c), max(memory, m)
    overhead = _obj(spec.get("overhead"), "spec.overhead")
    add(_amounts(overhead, dict.fromkeys(overhead, "spec.overhead")))
    return ext, cpu, memory


def _requirement(raw: object, where: str) -> Requirement:
    r = _obj(raw, where)
    key = _str(r.get("key"), f"{where}.key")
    op = _str(r.get("operator"), f"{where}.operator")
    if op not in OPERATORS:
        raise PodError(f"{where}.operator: must be one of {', '.join(sorted(OPERATORS))}, got {op!r}")
    values = _list(r.get("values"), f"{where}.values")
    if not all(isinstance(v, str) for v in values):
        raise PodError(f"{where}.values: must be a list of strings")
    if op in ("Gt", "Lt") and len(values) != 1:
        raise PodError(f"{where}.values: {op} takes exactly one value")
    return Requirement(key, op, tuple(values))


def _terms(spec: Mapping[str, Any]) -> tuple[Term, ...] | None:
    base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    affinity = _obj(spec.get("affinity"), "spec.affinity")
    node_affinity = _obj(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    terms = []
    listed = _list(_obj(required, base).get("nodeSelectorTerms"), f"{base}.nodeSelectorTerms")
    for i, raw in enumerate(listed):
        where = f"{base}.nodeSelectorTerms[{i}]"
        term = _obj(raw, where)
        exprs = _list(term.get("matchExpressions"), f"{where}.matchExpressions")
        fields = _list(term.get("matchFields"), f"{where}.matchFields")
        terms.append(
            Term(
                tuple(_requirement(e, f"{where}.matchExpressions[{j}]") for j, e in enumerate(exprs)),
                tuple(_requirement(f, f"{where}.matchFields[{j}]") for j, f in enumerate(fields)),
            )
        )
    return tuple(terms)


def _tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    out = []
    for i, raw in enumerate(_list(spec.get("tolerations"), "spec.tolerations")):
        where = f"spec.tolerations[{i}]"
        t = _obj(raw, where)
        op = _str(t.get("operator"), f"{where}.operator", default="Equal") or "Equal"
        if op not in TOLERATION_OPERATORS:
            raise PodError(f"{where}.operator: must be one of {', '.join(TOLERATION_OPERATORS)}, got {op!r}")
        value = _str(t.get("value"), f"{where}.value")
        if op in ("Gt", "Lt") and int64(value) is None:
            raise PodError(f"{where}.value: {op} compares integers, got {value[:80]!r}")
        out.append(
            Toleration(
                key=_str(t.get("key"), f"{where}.key"),
                operator=op,
                value=value,
                effect=_str(t.get("effect"), f"{where}.effect"),
            )
        )
    return tuple(out)


def pod_needs(pod: Mapping[str, Any]) -> PodNeeds:
    """Read a Pod's requests and node rules. Raises PodError naming the field it cannot use."""
    spec = _obj(pod.get("spec"), "spec")
    ext, cpu, memory = _requests(spec)
    selector = _obj(spec.get("nodeSelector"), "spec.nodeSelector")
    for k, v in selector.items():
        _str(v, f"spec.nodeSelector[{k!r}]")
    return PodNeeds(
        extended=ext,
        cpu=cpu,
        memory=memory,
        selector=tuple(sorted(selector.items())),
        terms=_terms(spec),
        tolerations=_tolerations(spec),
    )
