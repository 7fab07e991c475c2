"""Whether the labels the operator published are on the Node itself: the LabelsOnNode condition.

With the NodeFeature sink the operator writes a NodeFeature and nfd-master copies its labels onto the
Node. When nfd-master does not (not installed, not running, or not configured to accept our label
namespace: `-extra-label-ns`), LabelsPublished is True while the Node carries nothing a scheduler can
select on, or still carries a label the record no longer yields (a stale `rdma.capable=true` keeps
attracting workloads). This compares what was published with the Node's labels, as the watch delivered
them: a pure decision, computed again on every publish and every Node event, and written only when it
changes.
"""

from __future__ import annotations

from collections.abc import Mapping

from nodefabric_devicemanager import models
from nodefabric_devicemanager.models import Condition
from nodefabric_operator import labels

APPLIED = "Applied"
NOT_APPLIED = "NotApplied"
NODE_NOT_SEEN = "NodeNotSeen"
SHOWN = 5  # keys named in the message; the count says how many more


def _names(keys: list[str], domain: str) -> str:
    head = labels.prefix(domain)
    shown = [k.removeprefix(head) for k in keys[:SHOWN]]
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return ", ".join(shown) + more


def condition(
    node: str, published: Mapping[str, str], on_node: Mapping[str, str] | None, domain: str, via: str
) -> Condition:
    """LabelsOnNode for `node`: every published key with its value on the Node, and none of our
    `rdma.`/`fabric.` keys there that is not published. `on_node`: our keys on the Node as watched, None
    when the Node is not among the watched ones. `via`: who applies them ("nfd-master", or "" when the
    operator writes the Node itself), for the hint."""
    if on_node is None:
        return Condition(
            type=models.LABELS_ON_NODE,
            status="Unknown",
            reason=NODE_NOT_SEEN,
            message=f"node {node} is not among the Nodes the operator watches",
        )
    missing = sorted(k for k, v in published.items() if on_node.get(k) != v)
    stale = sorted(k for k in on_node if k not in published and labels.family(k, domain) is not None)
    if not missing and not stale:
        return Condition(
            type=models.LABELS_ON_NODE,
            status="True",
            reason=APPLIED,
            message=f"{len(published)} labels on Node {node}",
        )
    parts: list[str] = []
    if missing:
        parts.append(
            f"{len(missing)} of {len(published)} labels not on Node {node} ({_names(missing, domain)})"
        )
    if stale:
        parts.append(f"{len(stale)} no longer published still on Node {node} ({_names(stale, domain)})")
    if via:
        namespace = labels.prefix(domain)[:-1]
        parts.append(f"{via} applies them: is it running, and accepting the {namespace} label namespace?")
    return Condition(type=models.LABELS_ON_NODE, status="False", reason=NOT_APPLIED, message="; ".join(parts))
