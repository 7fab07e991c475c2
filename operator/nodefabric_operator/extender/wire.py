"""The kube-scheduler extender wire format (k8s.io/kube-scheduler/extender/v1).

The Go structs carry no JSON tags, so kube-scheduler sends PascalCase keys; we accept any case and
answer PascalCase.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodefabric_devicemanager import numbers
from nodefabric_operator.extender.nodes import (
    MAX_NAME,
    NodeError,
    NodeRecord,
    is_label_value,
    is_node_name,
    parse_node,
)


class WireError(ValueError):
    """A request kube-scheduler would never send; answered 400 with this message."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: tuple[str, ...]
    # Full Node objects when the extender is not nodeCacheCapable; None with NodeNames.
    nodes: tuple[Mapping[str, Any], ...] | None
    # Those nodes as read, for this request only: they never enter the extender's cache.
    records: tuple[NodeRecord, ...] | None = None
    # NodeNames joined by commas (which no node name holds), "" without them: one string comparison
    # tells whether a request names the same nodes as the last one.
    names_key: str = ""


# The characters of a DNS subdomain, which every node name is: none needs escaping in JSON.
_NAME_CHARS = b"abcdefghijklmnopqrstuvwxyz0123456789.-"
_NODE_NAME_RULE = (
    "(a DNS subdomain, as the API server requires of a Node: lowercase letters, digits, '-' and '.', "
    f"alphanumeric at both ends and beside each '.', at most {MAX_NAME} characters)"
)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (Go's encoder never writes it)")


def _finite(text: str) -> float:
    # 1e999 is JSON by its grammar, but Python reads it as inf and json.dumps writes it back as Infinity,
    # which is not: an answer that echoes it (full Nodes) would be one Go's decoder refuses.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]!r} is beyond float64")
    return value


def _utf8(raw: bytes) -> str:
    # json.loads(bytes) would also take UTF-16 and UTF-32, and a surrogate written as UTF-8 bytes: none
    # of them is what a Go encoder (kube-scheduler's, the API server's) writes. A UTF-8 BOM left in the
    # text is refused by json.loads itself.
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise WireError(
            f"request body is not JSON: it is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None


def loads(raw: bytes) -> Any:
    """A request body as Go's encoder writes JSON: UTF-8, no NaN or Infinity, numbers within int64-ish
    digits and float64. Raises WireError (not UTF-8), ValueError (not such JSON) or RecursionError
    (nesting past the decoder's depth)."""
    return json.loads(
        _utf8(raw), parse_int=numbers.json_int, parse_float=_finite, parse_constant=_no_constant
    )


def not_a_node_name(position: int, name: object) -> WireError:
    """The 400 for NodeNames[position], which nodes.is_node_name refused."""
    return WireError(f"NodeNames[{position}]: {shown(name)} is not a node name {_NODE_NAME_RULE}")


def named_twice(names: Sequence[str]) -> WireError:
    """The 400 for NodeNames that name a node more than once: kube-scheduler sends each node once, and
    an answer echoing one twice would hand it back two verdicts."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            return WireError(f"NodeNames[{i}]: {shown(name)} is given twice (also NodeNames[{seen[name]}])")
        seen[name] = i
    raise AssertionError("NodeNames with no name given twice")  # pragma: no cover


def shown(value: object) -> str:
    """A value as a message quotes it (here a bad node name; the admission webhook's warnings likewise): a
    string cut short with its length, anything else by its JSON type only (the repr of a list nested a
    thousand deep is itself a RecursionError)."""
    if isinstance(value, str):
        return repr(value[:80]) + (f" ({len(value):,} characters)" if len(value) > 80 else "")
    if isinstance(value, list | dict):
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    return "null" if value is None else f"{type(value).__name__} {value!r:.40}"


def _node_names(items: list[Any]) -> str:
    """Check that every entry is a string of node-name characters, in a few C-level passes over all of
    them joined (not a Python loop over 5,000 names), so the answer is assembled from them as they are.
    Returns them joined by commas. The rest of a node name's rule (no '-' or '.' at either end or beside
    a '.', 253 characters at most) costs a pass per name: the service checks it on the names its cache
    does not know (Extender._asked), once per distinct NodeNames, as every known name was checked when
    its Node was read."""
    if not items:
        return ""
    try:
        joined = ",".join(items)
        # Only commas left once every name character is gone, exactly one between each two names
        # (so no name holds one), and no name empty.
        if (
            not joined.encode("ascii").translate(None, _NAME_CHARS + b",")
            and joined.count(",") == len(items) - 1
            and all(items)
        ):
            return joined
    except (TypeError, UnicodeEncodeError):
        pass
    for i, name in enumerate(items):
        if not is_node_name(name):
            raise not_a_node_name(i, name)
    raise AssertionError("a list the joined check refused has a bad name")  # pragma: no cover


def parse_args(body: object) -> ExtenderArgs:
    if not isinstance(body, dict):
        raise WireError(f"request body must be a JSON object (ExtenderArgs), got {type(body).__name__}")
    fields = {str(k).lower(): v for k, v in body.items()}
    if len(fields) < len(body):
        # "NodeNames" and "nodenames" both: Go's decoder keeps whichever comes last, and so would this.
        counts = Counter(str(k).lower() for k in body)
        twice = sorted(str(k) for k in body if counts[str(k).lower()] > 1)
        raise WireError(f"the request names a field more than once, in different case: {twice[:4]}")
    pod = fields.get("pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise WireError("Pod must be a Pod object with metadata")
    if not isinstance(pod.get("spec", {}), dict):
        raise WireError("Pod spec must be an object")
    meta = pod["metadata"]
    for field in ("name", "namespace", "uid"):
        if not isinstance(meta.get(field, ""), str):
            raise WireError(f"Pod metadata.{field} must be a string, got {type(meta[field]).__name__}")
    for field in ("labels", "annotations"):
        value = meta.get(field)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise WireError(f"Pod metadata.{field} must map names to strings")
    # Labels name the pod's group, which every reason and summary repeats: held to what the API server
    # admits, as the nodes' are.
    for key, value in (meta.get("labels") or {}).items():
        if not is_label_value(value):
            raise WireError(f"Pod metadata.labels[{key!r}]: {value[:80]!r} is not a label value")
    names = fields.get("nodenames")
    nodes = fields.get("nodes")
    if names is not None:
        if not isinstance(names, list):
            raise WireError("NodeNames must be a list of node names")
        return ExtenderArgs(pod, tuple(names), None, names_key=_node_names(names))
    if nodes is None:
        raise WireError("one of NodeNames or Nodes is required")
    items = nodes.get("items") if isinstance(nodes, dict) else None
    if not isinstance(items, list):
        raise WireError("Nodes must be a NodeList with items")
    try:
        records = tuple(parse_node(n, f"Nodes.items[{i}]") for i, n in enumerate(items))
    except NodeError as exc:
        raise WireError(str(exc)) from None
    first: dict[str, int] = {}
    for i, r in enumerate(records):
        # The decision would read one of the two and the answer return both: which counts is a guess.
        if first.setdefault(r.name, i) != i:
            raise WireError(f"Nodes.items[{i}]: node {r.name!r} is given twice (also items[{first[r.name]}])")
    return ExtenderArgs(pod, tuple(r.name for r in records), tuple(items), records)


@dataclass(frozen=True)
class FilterResult:
    """ExtenderFilterResult, with failed nodes grouped by reason (reason -> node names)."""

    args: ExtenderArgs
    allowed: Sequence[str]
    failed: Mapping[str, Sequence[str]]
    unresolvable: Mapping[str, Sequence[str]]

    def wire(self) -> dict[str, Any]:
        """The answer as kube-scheduler decodes it."""
        out: dict[str, Any] = {
            "FailedNodes": _by_node(self.failed),
            "FailedAndUnresolvableNodes": _by_node(self.unresolvable),
            "Error": "",
        }
        if self.args.nodes is None:
            out["NodeNames"] = list(self.allowed)
            out["Nodes"] = None
        else:
            keep = set(self.allowed)
            items = [n for n in self.args.nodes if n["metadata"]["name"] in keep]
            out["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "items": items}
            out["NodeNames"] = None
        return out

    def encode(self) -> bytes:
        """The JSON answer. With NodeNames (nodeCacheCapable) it is assembled from joined names, which
        parse_args made sure need no escaping: thousands of nodes per answer made the generic encoder
        the largest cost. Each distinct reason is encoded once."""
        if self.args.nodes is not None:
            return json.dumps(self.wire(), separators=(",", ":")).encode()
        # One list of pieces joined once: an answer is a quarter megabyte at 5,000 nodes, and every
        # intermediate string would be another copy of it.
        parts = ['{"NodeNames":']
        _names(self.allowed, parts)
        parts.append(',"Nodes":null,"FailedNodes":')
        _grouped(self.failed, parts)
        parts.append(',"FailedAndUnresolvableNodes":')
        _grouped(self.unresolvable, parts)
        parts.append(',"Error":""}')
        return "".join(parts).encode()


def _by_node(grouped: Mapping[str, Sequence[str]]) -> dict[str, str]:
    return {node: reason for reason, nodes in grouped.items() for node in nodes}


def _names(names: Sequence[str], parts: list[str]) -> None:
    if names:
        parts += ['["', '","'.join(names), '"]']
    else:
        parts.append("[]")


def _grouped(grouped: Mapping[str, Sequence[str]], parts: list[str]) -> None:
    parts.append("{")
    first = True
    for reason, nodes in grouped.items():
        if not nodes:
            continue
        value = json.dumps(reason)  # each distinct reason encoded once
        parts += ['"' if first else ',"', f'":{value},"'.join(nodes), f'":{value}']
        first = False
    parts.append("}")


def filter_result(
    args: ExtenderArgs,
    allowed: Sequence[str],
    failed: Mapping[str, Sequence[str]],
    unresolvable: Mapping[str, Sequence[str]],
) -> FilterResult:
    return FilterResult(args, allowed, failed, unresolvable)


def host_priorities(names: tuple[str, ...], scores: Mapping[str, int]) -> list[dict[str, Any]]:
    return [{"Host": n, "Score": scores.get(n, 0)} for n in names]
