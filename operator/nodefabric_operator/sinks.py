"""Where labels are published: an NFD NodeFeature per node (default) or the Node's own labels.

Both compare with the live object and write nothing when nothing changed, both refuse a stale write
(resourceVersion precondition, re-read on 409), and both apply the same plan (labels.plan): only our
`rdma.`/`fabric.` keys are ever removed, and not while the matching enumeration is failing. Calls are
synchronous (the kubernetes client); the reconciler runs them in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import kubernetes

from nodefabric_devicemanager import models
from nodefabric_devicemanager.models import Devices
from nodefabric_operator import labels

log = logging.getLogger(__name__)

NFD_GROUP, NFD_VERSION, NFD_PLURAL = "nfd.k8s-sigs.io", "v1alpha1", "nodefeatures"
NFD_NODE_NAME = "nfd.node.kubernetes.io/node-name"
CONFLICT_RETRIES = 5


class SinkError(RuntimeError):
    """A publishing failure with a message meant for the operator reading the status condition."""


class NodeNotFound(SinkError):
    pass


class NfdMissing(SinkError):
    pass


class Conflict(SinkError):
    """The object kept changing under us; the next event retries."""


class RecordGone(SinkError):
    """The Devices record this publish was computed from no longer exists (a late event): nothing to do."""


@dataclass(frozen=True)
class Published:
    target: str  # "NodeFeature nodefabric/n1", "Node n1": for messages
    plan: labels.Plan
    wrote: bool


class Sink(Protocol):
    name: str

    def publish(self, devices: Devices, desired: Mapping[str, str], frozen: frozenset[str]) -> Published: ...

    def withdraw(self, node: str) -> Published | None: ...

    def current(self, obj: Mapping[str, Any]) -> tuple[dict[str, str], frozenset[str] | None]: ...


def _status(err: kubernetes.client.ApiException) -> int:
    return int(getattr(err, "status", 0) or 0)


def _null_removed(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, str | None]:
    """A merge-patch map: new values, and null for each key that goes."""
    out: dict[str, str | None] = {k: None for k in old if k not in new}
    out.update({k: v for k, v in new.items() if old.get(k) != v})
    return out


class NodeFeatureSink:
    """One NodeFeature per node in our namespace, named after the node and owned by its Devices object,
    so deleting the record garbage-collects the labels (nfd-master then removes them from the Node)."""

    name = "nodefeature"

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, domain: str) -> None:
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.namespace = namespace
        self.domain = domain

    def _owner(self, devices: Devices) -> dict[str, Any]:
        return {
            "apiVersion": models.API_VERSION,
            "kind": models.KIND,
            "name": devices.metadata.name,
            "uid": devices.metadata.uid or "",
            "controller": True,
        }

    def current(self, obj: Mapping[str, Any]) -> tuple[dict[str, str], frozenset[str] | None]:
        return dict((obj.get("spec") or {}).get("labels") or {}), None

    def publish(self, devices: Devices, desired: Mapping[str, str], frozen: frozenset[str]) -> Published:
        node = devices.metadata.name
        target = f"NodeFeature {self.namespace}/{node}"
        for _ in range(CONFLICT_RETRIES):
            live: dict[str, Any] | None
            try:
                live = cast(
                    dict[str, Any],
                    self.custom.get_namespaced_custom_object(
                        NFD_GROUP, NFD_VERSION, self.namespace, NFD_PLURAL, node
                    ),
                )
            except kubernetes.client.ApiException as err:
                if _status(err) != 404:
                    raise
                live = None
            current, _ = self.current(live or {})
            plan = labels.plan(current, desired, domain=self.domain, frozen=frozen)
            # Keys that are not ours (another writer's, or a hand edit) stay as they are.
            new_labels = {k: v for k, v in current.items() if labels.family(k, self.domain) is None}
            new_labels.update(plan.managed)
            owner = self._owner(devices)
            try:
                if live is None:
                    # A watch event can arrive after its record was deleted and its NodeFeature collected:
                    # creating one then would publish a gone node's labels until GC removes it again.
                    self._check_owner(devices)
                    body = {
                        "apiVersion": f"{NFD_GROUP}/{NFD_VERSION}",
                        "kind": "NodeFeature",
                        "metadata": {
                            "name": node,
                            "namespace": self.namespace,  # explicit: the owner is cluster-scoped
                            "labels": {NFD_NODE_NAME: node},
                            "ownerReferences": [owner],
                        },
                        "spec": {"labels": new_labels},
                    }
                    try:
                        self.custom.create_namespaced_custom_object(
                            NFD_GROUP, NFD_VERSION, self.namespace, NFD_PLURAL, body
                        )
                    except kubernetes.client.ApiException as err:
                        if _status(err) == 404:
                            raise NfdMissing(
                                f"cannot create {target}: the NodeFeature API or namespace {self.namespace} "
                                "is missing (install NFD, or run with --sink node)"
                            ) from err
                        raise
                    return Published(target, plan, wrote=True)
                meta = live.get("metadata") or {}
                refs = list(meta.get("ownerReferences") or [])
                owned = any(r.get("uid") == owner["uid"] for r in refs)
                tagged = (meta.get("labels") or {}).get(NFD_NODE_NAME) == node
                if new_labels == current and owned and tagged:
                    return Published(target, plan, wrote=False)
                patch: dict[str, Any] = {
                    "metadata": {
                        "resourceVersion": meta.get("resourceVersion"),
                        "labels": {NFD_NODE_NAME: node},
                    },
                    "spec": {"labels": _null_removed(current, new_labels)},
                }
                if not owned:  # the record was recreated: point at the new one so GC follows it
                    patch["metadata"]["ownerReferences"] = [
                        r
                        for r in refs
                        if r.get("kind") != models.KIND or r.get("apiVersion") != models.API_VERSION
                    ] + [owner]
                self.custom.patch_namespaced_custom_object(
                    NFD_GROUP, NFD_VERSION, self.namespace, NFD_PLURAL, node, patch
                )
                return Published(target, plan, wrote=True)
            except kubernetes.client.ApiException as err:
                if _status(err) != 409:
                    raise
                log.info("nodefeature changed while writing, retrying", extra={"node": node})
        raise Conflict(f"{target} kept changing while being written")

    def _check_owner(self, devices: Devices) -> None:
        name = devices.metadata.name
        try:
            live = cast(
                dict[str, Any],
                self.custom.get_cluster_custom_object(models.GROUP, models.VERSION, models.PLURAL, name),
            )
        except kubernetes.client.ApiException as err:
            if _status(err) != 404:
                raise
            raise RecordGone(f"devices {name} is gone") from err
        if devices.metadata.uid and (live.get("metadata") or {}).get("uid") != devices.metadata.uid:
            raise RecordGone(f"devices {name} was replaced")

    def withdraw(self, node: str) -> Published | None:
        return None  # the NodeFeature is owned by the Devices object: garbage collection removes it


class NodeSink:
    """The Node's own labels, for clusters without NFD. The keys we wrote are recorded in an annotation,
    so a label someone set by hand (even one under our prefix) is never removed by us."""

    name = "node"

    def __init__(self, api: kubernetes.client.ApiClient, domain: str) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        self.domain = domain
        self.annotation = managed_annotation(domain)

    def current(self, obj: Mapping[str, Any]) -> tuple[dict[str, str], frozenset[str] | None]:
        meta = obj.get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(self.annotation, "")
        return dict(meta.get("labels") or {}), frozenset(k for k in raw.split(",") if k)

    def _apply(self, node: str, desired: Mapping[str, str], frozen: frozenset[str]) -> Published:
        target = f"Node {node}"
        for _ in range(CONFLICT_RETRIES):
            try:
                live = self.core.api_client.sanitize_for_serialization(self.core.read_node(node))
            except kubernetes.client.ApiException as err:
                if _status(err) == 404:
                    raise NodeNotFound(f"node {node} not found") from err
                raise
            current, owned = self.current(live)
            plan = labels.plan(current, desired, domain=self.domain, frozen=frozen, owned=owned)
            new_owned = ",".join(sorted(plan.managed)) or None
            old_owned = ",".join(sorted(owned or ())) or None
            if not plan.changes and new_owned == old_owned:
                return Published(target, plan, wrote=False)
            meta = live.get("metadata") or {}
            patch = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "labels": {c.key: c.new for c in plan.changes},
                    "annotations": {self.annotation: new_owned},
                }
            }
            try:
                self.core.patch_node(node, patch)
                return Published(target, plan, wrote=True)
            except kubernetes.client.ApiException as err:
                if _status(err) != 409:
                    raise
                log.info("node changed while writing labels, retrying", extra={"node": node})
        raise Conflict(f"{target} kept changing while being written")

    def publish(self, devices: Devices, desired: Mapping[str, str], frozen: frozenset[str]) -> Published:
        return self._apply(devices.metadata.name, desired, frozen)

    def withdraw(self, node: str) -> Published | None:
        """The record is gone: remove every key we wrote, as garbage collection does for a NodeFeature."""
        try:
            return self._apply(node, {}, frozenset())
        except NodeNotFound:
            return None


def managed_annotation(domain: str) -> str:
    return f"nodefabric.{domain}/managed-labels"
