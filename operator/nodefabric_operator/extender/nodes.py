"""Node objects as the extender reads them, checked field by field.

One reader for every source of nodes: the watch, `--nodes-file`, and the `Nodes` a kube-scheduler
without `nodeCacheCapable` sends in a request. A field the extender cannot use is a `NodeError` naming
it (`Nodes.items[3].metadata.labels["a"]`), never a silent zero or a half-read node.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, TypeGuard, cast

from kubernetes.utils import parse_quantity

INT64 = 2**63 - 1
# A real API server refuses label values longer than this; a longer one is not a node it sent.
MAX_LABEL_VALUE = 63
MAX_NAME = 253
# What the API server admits as a label value: 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends.
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", re.ASCII)
# A node's name is a DNS subdomain (RFC 1123), as the API server requires.
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)
TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})

_parse_quantity = cast(Callable[[object], Decimal], parse_quantity)
# The API server's quantity grammar, ASCII only: the client's parser also takes "1_000", " 8" and "٨".
_QUANTITY = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?", re.ASCII
)


def is_label_value(value: str) -> bool:
    return len(value) <= MAX_LABEL_VALUE and _LABEL_VALUE.fullmatch(value) is not None


def is_node_name(name: object) -> TypeGuard[str]:
    """Whether the API server would take `name` for a Node: a string that is a DNS-1123 subdomain
    (lowercase alphanumerics, '-' and '.', each dot-separated part alphanumeric at both ends, at most
    253 characters)."""
    return isinstance(name, str) and len(name) <= MAX_NAME and _NODE_NAME.fullmatch(name) is not None


class NodeError(ValueError):
    """A node the extender cannot read; the message names the field."""


class QuantityError(ValueError):
    """A resource quantity that is not one; the message says why (the caller names the field)."""


def is_extended(resource: str) -> bool:
    """Extended resources (nvidia.com/gpu, device.gpustack.ai/rdma) as opposed to cpu, memory, pods."""
    domain, slash, _ = resource.partition("/")
    return bool(slash) and not domain.endswith("kubernetes.io")


def quantity(value: object, *, scale: int = 1, whole: bool = False) -> int:
    """A Kubernetes quantity ("8", "1056Gi", "500m", 8) times `scale`, rounded up, within int64.

    `whole`: the value must be a whole number (extended resources are counted, never divided).
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(f"must be a quantity string or number, got {type(value).__name__}")
    if isinstance(value, str) and len(value) > 64:  # refused before the cache would hash all of it
        shown = f"{value[:64]}..."
        raise QuantityError(f"{shown!r} is not a quantity")
    return _quantity(value, scale, whole)


# Every pod kube-scheduler asks about spells its requests anew ("4", "32Gi"), and a Decimal parse was most
# of reading a pod: the same few spellings come back request after request. Only strings and numbers get
# here (hashable); typed=True keeps 1 and 1.0 apart; a refused value raises, which is never cached.
@functools.lru_cache(maxsize=1024, typed=True)
def _quantity(value: str | int | float, scale: int, whole: bool) -> int:
    if isinstance(value, str) and not _QUANTITY.fullmatch(value):
        raise QuantityError(f"{value!r} is not a quantity")
    try:
        parsed = _parse_quantity(value) * scale
    except (ValueError, TypeError, InvalidOperation, ArithmeticError):
        raise QuantityError(f"{value!r} is not a quantity") from None
    if not parsed.is_finite() or parsed < 0:
        raise QuantityError(f"{value!r} is not a non-negative quantity")
    # Compared as a Decimal first: int() of "1e999999999" would take minutes to be refused.
    if parsed > INT64:
        raise QuantityError(f"{value!r} is beyond int64")
    if whole and parsed != parsed.to_integral_value():
        raise QuantityError(f"{value!r} is not a whole number")
    return int(parsed.to_integral_value(rounding="ROUND_CEILING"))


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]  # extended resources
    memory: int  # allocatable bytes
    cpu: int  # allocatable millicores
    taints: tuple[Taint, ...] = ()
    pods: int = 0  # allocatable pod slots; 0: not said


def mapping(value: object, where: str, error: type[ValueError] = NodeError) -> Mapping[str, Any]:
    """An optional object field of a node or pod read from the API: {} when absent; `error` naming
    `where` when it is something else (a list, a string)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise error(f"{where}: must be an object, got {type(value).__name__}")
    return value


def _labels(value: object, where: str) -> dict[str, str]:
    labels = mapping(value, where)
    for key, val in labels.items():
        if not isinstance(key, str):
            raise NodeError(f"{where}: key {key!r} is not a string")
        if not isinstance(val, str):
            raise NodeError(f"{where}[{key!r}]: must be a string, got {type(val).__name__}")
        if len(val) > MAX_LABEL_VALUE:
            raise NodeError(f"{where}[{key!r}]: longer than {MAX_LABEL_VALUE} characters")
        if not is_label_value(val):
            raise NodeError(f"{where}[{key!r}]: {val!r} is not a label value ([A-Za-z0-9_.-])")
    return dict(labels)


def _taints(value: object, where: str) -> tuple[Taint, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise NodeError(f"{where}: must be a list, got {type(value).__name__}")
    out = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise NodeError(f"{at}: must be an object, got {type(item).__name__}")
        key, val, effect = item.get("key"), item.get("value", ""), item.get("effect")
        if not isinstance(key, str) or not key:
            raise NodeError(f"{at}.key: must be a non-empty string")
        if not isinstance(val, str):
            raise NodeError(f"{at}.value: must be a string, got {type(val).__name__}")
        if effect not in TAINT_EFFECTS:
            raise NodeError(f"{at}.effect: must be one of {', '.join(sorted(TAINT_EFFECTS))}, got {effect!r}")
        out.append(Taint(key, val, effect))
    return tuple(out)


def parse_node(obj: object, where: str = "Node") -> NodeRecord:
    """The node as the decision reads it. Raises NodeError naming the first field it cannot use."""
    if not isinstance(obj, dict):
        raise NodeError(f"{where}: must be a Node object, got {type(obj).__name__}")
    meta = mapping(obj.get("metadata"), f"{where}.metadata")
    name = meta.get("name")
    if not is_node_name(name):
        shown = repr(name)[:80]
        raise NodeError(f"{where}.metadata.name: {shown} is not a node name (a DNS subdomain)")
    labels = _labels(meta.get("labels"), f"{where}.metadata.labels")
    spec = mapping(obj.get("spec"), f"{where}.spec")
    status = mapping(obj.get("status"), f"{where}.status")
    alloc = mapping(status.get("allocatable"), f"{where}.status.allocatable")
    extended: dict[str, int] = {}
    memory = cpu = pods = 0
    for res, value in alloc.items():
        try:
            if res == "memory":
                memory = quantity(value)
            elif res == "pods":
                pods = quantity(value, whole=True)
            elif res == "cpu":
                cpu = quantity(value, scale=1000)
            elif is_extended(res):
                extended[res] = quantity(value, whole=True)
        except QuantityError as exc:
            raise NodeError(f"{where}.status.allocatable[{res!r}]: {exc}") from None
    return NodeRecord(
        name=name,
        labels=labels,
        allocatable=extended,
        memory=memory,
        cpu=cpu,
        taints=_taints(spec.get("taints"), f"{where}.spec.taints"),
        pods=pods,
    )
