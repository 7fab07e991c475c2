"""The Kubernetes Event one reconcile posts on the Devices object: a pure decision, posted by the shell.

One Event per reconcile that changed labels already published (not one per label). A record's first
publication posts none: on an install that was one Event per node at once (a third of a first sync's
requests, and as many objects for the API server to keep for an hour) saying what the record's status
already says (`labels`, `labelsPublishedTime`, the LabelsPublished condition) and the operator logs.
Losing what schedulers select on is a Warning: `rdma.capable` going away takes the node out of every
RDMA job, and a `fabric.` key going away breaks group placement on the fabric domain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nodefabric_devicemanager import events as shared
from nodefabric_operator import labels

COMPONENT = "nodefabric-operator"  # the Event's source: `kubectl describe` shows it under "From"
NORMAL, WARNING = shared.NORMAL, shared.WARNING

LABELS_CHANGED = "LabelsChanged"
CAPABILITY_LOST = "RdmaCapabilityLost"
FABRIC_LOST = "FabricLabelsLost"
PUBLISH_FAILED = "PublishFailed"
NODE_NOT_FOUND = "NodeNotFound"
NAMESPACE_NOT_FOUND = "NamespaceNotFound"
NFD_NOT_FOUND = "NodeFeatureAPINotFound"  # NFD's CRD not installed: labels wait for it

# Five keys never come near the cap; a hand-edited sink might.
MAX_MESSAGE = shared.MAX_MESSAGE


@dataclass(frozen=True)
class Notice:
    type: str
    reason: str
    message: str


LINKS_SHOWN = 5


def for_changes(
    target: str,
    changes: Sequence[labels.Change],
    domain: str,
    failed_links: Sequence[str] = (),
    *,
    first: bool = False,
) -> Notice | None:
    """The Event for one reconcile's label changes on `target`, or None when nothing changed, or when
    `first` (the record was never published) and every change adds a key: a first publication is told
    by the record's status, not by an Event (see the module's note); one that removes or replaces a
    value someone else left under our keys still says so. Losing `rdma.capable` also says why: the
    failing links the record names, or that no endpoint is left."""
    if not changes or (first and all(c.old is None for c in changes)):
        return None
    removed = [c.key for c in changes if c.new is None]
    if labels.key(domain, labels.RDMA_CAPABLE) in removed:
        type_, reason = WARNING, CAPABILITY_LOST
    elif any(labels.family(k, domain) == labels.FABRIC for k in removed):
        type_, reason = WARNING, FABRIC_LOST
    else:
        type_, reason = NORMAL, LABELS_CHANGED
    message = f"{target}: " + "; ".join(c.describe() for c in changes)
    if reason == CAPABILITY_LOST:
        message += "; " + _why_lost(failed_links)
    count = f" ({len(changes)} changes)"
    if shared.cap(message) != message:  # cut, and say how many changes the whole message had
        message = shared.cap(message, MAX_MESSAGE - len(count)) + count
    return Notice(type_, reason, message)


def _why_lost(failed_links: Sequence[str]) -> str:
    if not failed_links:
        return "no link failed: no endpoint in the record has a usable RDMA device"
    shown = "; ".join(failed_links[:LINKS_SHOWN])
    more = f"; and {len(failed_links) - LINKS_SHOWN} more" if len(failed_links) > LINKS_SHOWN else ""
    return f"failing links: {shown}{more}"


def for_failure(reason: str, message: str) -> Notice:
    return Notice(WARNING, reason, shared.cap(message))
