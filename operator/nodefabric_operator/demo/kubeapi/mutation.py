"""A pod's creation beyond the API server's own admission: the mutating webhooks' turn (`webhooks`),
the changed pod admitted again, then the pod's own rules (gates, nodeName) and the status it is given."""

from __future__ import annotations

from typing import Any

from nodefabric_operator.demo.kubeapi import errors, pods, webhooks
from nodefabric_operator.demo.kubeapi.admission import NAMESPACES, admit, now
from nodefabric_operator.demo.kubeapi.catalogue import ResourceType
from nodefabric_operator.demo.kubeapi.store import Store, meta

MUTATING_WEBHOOKS = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
_PINNED = ("name", "namespace", "uid", "creationTimestamp", "generation")


async def mutate(
    store: Store, services: dict[str, str], rt: ResourceType, obj: dict[str, Any], request: Any
) -> tuple[dict[str, Any], list[str]]:
    """The mutating webhooks' turn (see `webhooks`), then the object validated again as changed."""
    configurations = list(store.select(MUTATING_WEBHOOKS))
    if not configurations:
        return obj, []
    m = meta(obj)
    namespace = m.get("namespace", "")
    ns_labels = {
        **(meta(store.get(NAMESPACES, None, namespace) or {}).get("labels") or {}),
        "kubernetes.io/metadata.name": namespace,
    }
    target = webhooks.Target(
        rt.group,
        rt.version,
        rt.kind,
        rt.plural,
        namespace,
        m.get("name", ""),
        dry_run=request.params.get("dryRun") == "All",
    )
    outcome = await webhooks.admit_through_webhooks(configurations, target, obj, ns_labels, services)
    if not outcome.called:
        return obj, []
    # A webhook may not rename or move the object; whatever else it changed is validated as sent.
    changed = {**outcome.obj, "metadata": {**meta(outcome.obj), **{k: m[k] for k in _PINNED if k in m}}}
    obj, more = admit(rt, changed, namespace=namespace, params=request.params)
    return obj, outcome.warnings + more


def admit_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's own rules at creation (gates, nodeName), and the status the API server gives it."""
    causes = pods.create_causes(pod)
    if causes:
        raise errors.invalid("Pod", "", meta(pod).get("name", ""), causes)
    return {**pods.without_empty_gates(pod), "status": pods.created_status(pod, now())}
