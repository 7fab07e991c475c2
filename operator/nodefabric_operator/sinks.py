"""Where labels are published: an NFD NodeFeature per node (default) or the Node's own labels.

Both plan against the watched sink object the view holds (view.py), write only when the plan changes
something, and write with that object's resourceVersion as precondition. Both apply the same plan
(labels.plan): only our `rdma.`/`fabric.` keys are ever removed, and not while the matching enumeration
is failing. A 409 means the view was behind the API server: only then is the object read back (and the
write planned again). Each write is a generator of requests (apicall.Calls: `publishing`, `withdrawing`),
sent on the event loop by the operator (aioclient.Driver) or in the caller's thread by `publish` and
`withdraw`; the reconciler records what they return in the view.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import kubernetes

from nodefabric_devicemanager import models, vocabulary
from nodefabric_operator import apicall, events, labels, rawcall
from nodefabric_operator.apicall import Calls, Request
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.view import SinkObject, items, part, version

log = logging.getLogger(__name__)

NFD_GROUP, NFD_VERSION, NFD_PLURAL = "nfd.k8s-sigs.io", "v1alpha1", "nodefeatures"
NFD_PATH = f"/apis/{NFD_GROUP}/{NFD_VERSION}/namespaces/{{ns}}/{NFD_PLURAL}"
NFD_OBJECT = NFD_PATH + "/{name}"
NODE_PATH = "/api/v1/nodes/{name}"
DEVICES_PATH = f"/apis/{models.GROUP}/{models.VERSION}/{models.PLURAL}/{{name}}"
NFD_NODE_NAME = "nfd.node.kubernetes.io/node-name"
# Written on every NodeFeature the operator makes: with its Devices owner, what tells ours from another's.
MANAGED_BY, MANAGER = "app.kubernetes.io/managed-by", "nodefabric"
UNCLAIMED = "nobody"  # foreign_owner of a NodeFeature naming no owner and not marked as ours
STRATEGIC = "application/strategic-merge-patch+json"
CONFLICT_RETRIES = 5
PAGE = 500  # objects per page when listing at start, so a large fleet is never decoded at once


class SinkError(RuntimeError):
    """A publishing failure with a message meant for the operator reading the status condition."""


class NodeNotFound(SinkError):
    pass


class Unpublishable(SinkError):
    """Where NodeFeatures go is missing: a fact about the operator, not the record, waited for once for
    every record (nswait.py). `reason` is the LabelsPublished condition's; `fact` says which is missing."""

    reason = events.NAMESPACE_NOT_FOUND
    fact = "namespace"


class NamespaceMissing(Unpublishable):
    """--namespace does not exist (or is being deleted)."""


class NfdMissing(Unpublishable):
    """The NodeFeature API is not served: NFD's CRD is not installed, or was deleted (NFD uninstalled)."""

    reason = events.NFD_NOT_FOUND
    fact = "api"


def nfd_missing(namespace: str) -> NfdMissing:
    return NfdMissing(
        f"the NodeFeature API ({NFD_PLURAL}.{NFD_GROUP}/{NFD_VERSION}) is not served: install NFD (its "
        f"CRDs), or run with --sink node; labels are published in namespace {namespace} once it is served"
    )


def namespace_missing(namespace: str, *, terminating: bool = False) -> NamespaceMissing:
    if terminating:
        return NamespaceMissing(
            f"namespace {namespace} (--namespace) is being deleted: labels are published once it exists again"
        )
    return NamespaceMissing(
        f"namespace {namespace} (--namespace) does not exist: labels are published once it does"
    )


class Conflict(SinkError):
    """The object kept changing under us; the next event retries."""


class RecordGone(SinkError):
    """The Devices record this publish was computed from no longer exists (a late event): nothing to do."""


@dataclass(frozen=True)
class Owner:
    """The Devices record labels are published for. `node_uid` is its Node owner's uid: the agent sets
    it after reading the Node, and deleting the Node deletes the record, so a record that has one stands
    for a Node that exists."""

    name: str
    uid: str
    node_uid: str | None = None


@dataclass(frozen=True)
class Published:
    target: str  # "NodeFeature nodefabric/n1", "Node n1": for messages
    plan: labels.Plan
    wrote: bool
    now: SinkObject | None  # the sink object after this publish, for the view


class Sink(Protocol):
    name: str
    withdraws: bool  # removes labels itself when a record goes (nothing garbage-collects them)

    def snapshot(self, obj: Mapping[str, Any]) -> SinkObject: ...

    def existing(self) -> Iterator[SinkObject]: ...

    def publishing(
        self,
        owner: Owner,
        desired: Mapping[str, str],
        frozen: frozenset[str],
        current: SinkObject | None,
        *,
        verify: bool = False,
    ) -> Calls[Published]: ...

    def publish(
        self,
        owner: Owner,
        desired: Mapping[str, str],
        frozen: frozenset[str],
        current: SinkObject | None,
        *,
        verify: bool = False,
    ) -> Published: ...

    def withdrawing(self, node: str, current: SinkObject | None) -> Calls[Published | None]: ...

    def withdraw(self, node: str, current: SinkObject | None) -> Published | None: ...

    def drifted(
        self, owner: Owner, desired: Mapping[str, str], frozen: frozenset[str], current: SinkObject | None
    ) -> bool: ...


def ours(found: Mapping[str, Any], domain: str) -> dict[str, str]:
    """Our `rdma.`/`fabric.` keys of a label map, as text (a value of another type is never ours to keep)."""
    return {
        k: v if isinstance(v, str) else str(v)
        for k, v in found.items()
        if isinstance(k, str) and labels.family(k, domain) is not None
    }


status_of = rawcall.status_of  # one definition, in the request layer; leader, prune and startup read it here


def foreign_owner(refs: Sequence[Mapping[str, Any]], marked: bool = False) -> str:
    """Another writer's owner of a NodeFeature ("Pod nfd-worker-x7"), "" when it is ours to write: its
    controller, or, when no Devices record owns it, any owner (nfd-worker names its Pod with no
    `controller` flag). A Devices record among the owners made it ours, whoever was added beside it.
    One naming no owner at all is ours only when `marked` (our MANAGED_BY label: ours, its owners
    removed by hand); else UNCLAIMED: a user's, or an older nfd-worker's, never adopted."""
    if not refs:
        return "" if marked else UNCLAIMED
    others = [r for r in refs if (r.get("apiVersion"), r.get("kind")) != (models.API_VERSION, models.KIND)]
    chosen = [r for r in others if r.get("controller") is True] or (
        others if len(others) == len(refs) else []
    )
    return f"{chosen[0].get('kind')} {chosen[0].get('name')}" if chosen else ""


def tagged(found: Mapping[str, Any], name: Any) -> bool:
    """Whether a NodeFeature carries both labels we write on ours: the node-name label nfd-master
    selects by, and MANAGED_BY (what tells ours from another's once its owners are gone). One of ours
    missing either drifted (sink.drifted) and is patched once to carry both: one that lost its node-name
    label, or one made before MANAGED_BY was written, which would otherwise get it only at its next label
    change. One that carries both costs no request."""
    return found.get(NFD_NODE_NAME) == name and found.get(MANAGED_BY) == MANAGER


def not_ours(target: str, foreign: str) -> str:
    """What a record's condition and Event say of a NodeFeature of its node's name that is not ours."""
    if foreign == UNCLAIMED:
        return (
            f"{target} was not made by nodefabric (it names no owner and has no {MANAGED_BY}={MANAGER} "
            "label: a user's, or an older nfd-worker's), so it is left as it is: delete it for nodefabric "
            "to publish there, or run the operator in a namespace of its own"
        )
    return (
        f"{target} belongs to {foreign}, not to nodefabric: nfd-worker names its own "
        "NodeFeature after the node, so run the operator in a namespace of its own, not NFD's"
    )


def _null_removed(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, str | None]:
    """A merge-patch map: new values, and null for each key that goes."""
    out: dict[str, str | None] = {k: None for k in old if k not in new}
    out.update({k: v for k, v in new.items() if old.get(k) != v})
    return out


def pages(
    metrics: Metrics, resource: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Iterator[Mapping[str, Any]]:
    """Every item of a list made with the kubernetes client's `fn`, page by page, decoded from the raw
    answer (no client models), each page counted in the request metric (a write's requests are counted
    where they are sent: apicall).

    A continue token that expired mid-list (410 Gone: etcd compacted past the list's snapshot, a list
    slower than its compaction interval) does not fail the list (that would restart the operator on a
    large fleet for good). The API server's 410 carries a continue token of its own, for the rest of the
    list (the keys after the last one handed on) from its newest snapshot: followed, in pages as before.
    Only a 410 without one is followed by a full list, as client-go's pager does: one answer,
    bounded by wire.MAX_ANSWER and decoded whole, which the fleets whose list outlasts compaction are the
    likeliest to exceed. client-go hands that full list on alone; here the first pages are handed on
    already, so an object in it is left out when handed on before in the same version (uid and
    resourceVersion), and handed on again, the newer after the older, when it changed in between. The
    list then mixes two snapshots (one deleted in between may have been handed on), which a watch's
    events bring up to date as ever. As in client-go, only a 410 whose Status says reason Expired is an
    expiry: any other 410 (a proxy's page, garbage, another reason) fails the list like any refusal."""
    token: str | None = None
    followed: set[str] = set()
    handed: dict[tuple[Any, Any], tuple[Any, Any]] = {}  # every named object handed on: its uid and rv
    limit, after, just_expired = PAGE, False, False
    while True:
        metrics.requested("list", resource)
        try:
            answer = fn(*args, limit=limit, _continue=token, _preload_content=False, **kwargs)
        except kubernetes.client.ApiException as err:
            gone = None if token is None or just_expired or limit == 0 else expiry(err)
            if gone is None:
                # Not an expiry, or a 410 right after one (to the token it carried, or the full list),
                # or one within the full list (that came in pages after all): the list fails, no loop.
                raise
            fresh = carried(gone, followed)
            log.warning(
                "a list's continue token expired mid-list; listing the rest from the newest snapshot",
                extra={"resource": resource, "handed": len(handed), "rest": "in pages" if fresh else "whole"},
            )
            token, limit, after, just_expired = fresh, PAGE if fresh else 0, True, True
            if fresh:
                followed.add(fresh)
            continue
        just_expired = False
        page = _decoded(answer)
        for item in listed(page, resource):
            key, stamp = _named(item)
            if key is not None:
                if after and handed.get(key) == stamp:
                    continue  # handed on from a page before the expiry, in this version
                handed[key] = stamp
            yield item
        token = continued(page, resource, followed)
        if token is None:
            return
        followed.add(token)


def missing_namespace(err: kubernetes.client.ApiException, namespace: str) -> bool:
    """Whether a create was refused because its namespace does not exist: the API server's 404 Status
    names the namespace (details kind "namespaces", name the namespace); a missing NodeFeature API is
    a 404 too, with no such details."""
    if status_of(err) != 404:
        return False
    details = rawcall.status_body(err).get("details")
    if not isinstance(details, dict) or details.get("kind") != "namespaces":
        return False
    return details.get("name") in (None, namespace)


def missing_api(err: kubernetes.client.ApiException) -> bool:
    """Whether a create was refused because the API server does not serve the resource (its CRD not
    installed, or deleted): a 404 that names no object. kube-apiserver answers an unknown resource with a
    plain-text "404 page not found" (its last handler), and a built-in group's unknown resource with a
    Status without details; a missing namespace's 404 names the namespace (details kind "namespaces"),
    a missing object's names the object, neither of which a create of ours meets otherwise. A Status
    naming the NodeFeature resource and no object (kube-apiserver's NotFound for a resource, its name
    empty) says the same: a create names no object that could be missing. One naming another group, or
    an object, is not the API's: that record's own failure."""
    if status_of(err) != 404:
        return False
    details = rawcall.status_body(err).get("details")
    if not isinstance(details, dict) or not details.get("kind"):
        return True
    return (
        details.get("kind") == NFD_PLURAL
        and details.get("group") in (None, "", NFD_GROUP)
        and not details.get("name")
    )


def terminating_namespace(err: kubernetes.client.ApiException) -> bool:
    """Whether a create was refused because its namespace is being deleted: kube-apiserver's
    NamespaceLifecycle answers 403 with the cause NamespaceTerminating until the namespace is gone (then
    404), however long its finalizers keep it. A create names our namespace, so the cause is about it."""
    if status_of(err) != 403:
        return False
    details = rawcall.status_body(err).get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return isinstance(causes, list) and any(
        isinstance(c, dict) and c.get("reason") == "NamespaceTerminating" for c in causes
    )


def expiry(err: kubernetes.client.ApiException) -> dict[str, Any] | None:
    """The Status of a 410 that says its continue token expired (reason Expired, what the API server
    answers once etcd compacted past the list), None for anything else: another code, another reason, a
    body that is no Status (a proxy's, garbage), which client-go's pager does not take for an expiry
    either (a full list on a 410 that may mean anything would hide it). client-go reads the reason only
    off a body that decodes as a Status (its kind) of status Failure: JSON with a reason alone is not one."""
    if status_of(err) != 410:
        return None
    try:
        body = json.loads(err.body or "")
    except (TypeError, ValueError, RecursionError):  # RecursionError: nesting past the decoder's depth
        return None
    if not isinstance(body, dict) or (body.get("kind"), body.get("status")) != ("Status", "Failure"):
        return None
    return body if body.get("reason") == "Expired" else None


def carried(gone: Mapping[str, Any], followed: set[str]) -> str | None:
    """The continue token an expiry's Status carries (the API server's: the rest of the list from the
    newest snapshot), None when it has none or one already followed."""
    meta = gone.get("metadata")
    token = meta.get("continue") if isinstance(meta, dict) else None
    return token if isinstance(token, str) and token and token not in followed else None


def _named(item: Mapping[str, Any]) -> tuple[tuple[Any, Any] | None, tuple[Any, Any]]:
    """An item's namespace and name (None for one without a name: never matched, handed on as it is),
    and its uid and resourceVersion (which version of it that is)."""
    meta = item.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None, (None, None)
    return (meta.get("namespace"), meta["name"]), (meta.get("uid"), meta.get("resourceVersion"))


def listed(page: Mapping[str, Any], resource: str) -> list[dict[str, Any]]:
    """A list page's items. No `items` (or null, a Go nil slice) is an empty page; items that are not a
    list, or an item that is not an object, a SinkError: skipped, they would cut the list short, and a
    list cut short is not harmless (the Node sink takes a record missing from it for one deleted)."""
    found = page.get("items")
    if found is None:
        return []
    if not isinstance(found, list):
        raise SinkError(f"a page of {resource} whose items are a {type(found).__name__}, not a list")
    for item in found:
        if not isinstance(item, dict):
            raise SinkError(
                f"a page of {resource} with an item that is a {type(item).__name__}, not an object"
            )
    return found


def continued(page: Mapping[str, Any], resource: str, followed: set[str]) -> str | None:
    """The page's continue token, None on the last page (none, or empty). A token of another type, or
    metadata that is not an object, is a SinkError (taken as the last page, the list would be cut
    short), and so is a token already `followed` (the list would never end)."""
    meta = page.get("metadata")
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise SinkError(f"a page of {resource} whose metadata is a {type(meta).__name__}, not an object")
    token = meta.get("continue")
    if token is None or token == "":
        return None
    if not isinstance(token, str):
        raise SinkError(f"a page of {resource} whose continue token is a {type(token).__name__}, not text")
    if token in followed:
        raise SinkError(f"a page of {resource} continued with a token already followed: the list never ends")
    return token


def listing(
    api: kubernetes.client.ApiClient,
    path: str,
    params: Mapping[str, str] | None = None,
    query: Sequence[tuple[str, str | int]] = (),
) -> Callable[..., bytes]:
    """A list's page, for `pages`, sent through rawcall as a generated list call would send it (the
    path, its `query`, then limit and continue): every answer, a refusal's too, read up to
    wire.MAX_ANSWER (a generated call reads a refusal's body whole before raising it), within rawcall's
    timeouts (a generated call has none), its credential refreshed as for a write."""

    def page(*, limit: int, _continue: str | None, _preload_content: bool) -> bytes:
        asked: list[tuple[str, str | int]] = [*query, ("limit", limit)]
        if _continue:
            asked.append(("continue", _continue))
        return rawcall.send(api, "GET", path, params or {}, query=asked)

    return page


class _SentInThread:
    """A sink's `publish`: its `publishing` sent through the kubernetes client in the caller's thread
    (`--prune`, the CLIs and tests; the operator sends the same requests on its loop)."""

    api: kubernetes.client.ApiClient
    metrics: Metrics
    publishing: Callable[..., Calls[Published]]  # each sink's own (see Sink)

    def publish(
        self,
        owner: Owner,
        desired: Mapping[str, str],
        frozen: frozenset[str],
        current: SinkObject | None,
        *,
        verify: bool = False,
    ) -> Published:
        """`publishing`, sent in this thread."""
        calls = self.publishing(owner, desired, frozen, current, verify=verify)
        return apicall.run(calls, self.api, self.metrics)


class NodeFeatureSink(_SentInThread):
    """One NodeFeature per node in our namespace, named after the node and owned by its Devices object,
    so deleting the record garbage-collects the labels (nfd-master then removes them from the Node)."""

    name = "nodefeature"
    withdraws = False

    def __init__(
        self, api: kubernetes.client.ApiClient, namespace: str, domain: str, metrics: Metrics | None = None
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.domain = domain
        self.metrics = metrics or Metrics()

    def target(self, node: str) -> str:
        return f"NodeFeature {self.namespace}/{node}"

    def snapshot(self, obj: Mapping[str, Any]) -> SinkObject:
        meta = part(obj, "metadata")
        return SinkObject(
            name=str(meta.get("name", "")),
            rv=version(obj),
            labels=ours(part(obj, "spec", "labels"), self.domain),
            owners=frozenset(str(r.get("uid", "")) for r in items(obj, "metadata", "ownerReferences")),
            tagged=tagged(part(meta, "labels"), meta.get("name")),
            foreign=foreign_owner(
                items(obj, "metadata", "ownerReferences"), part(meta, "labels").get(MANAGED_BY) == MANAGER
            ),
        )

    def existing(self) -> Iterator[SinkObject]:
        """Our namespace's NodeFeatures, read once at start: the view before the first reconcile."""
        path = f"/apis/{NFD_GROUP}/{NFD_VERSION}/namespaces/{{namespace}}/{NFD_PLURAL}"
        page = listing(self.api, path, {"namespace": self.namespace}, [("labelSelector", NFD_NODE_NAME)])
        items = pages(self.metrics, NFD_PLURAL, page)
        for item in items:
            yield self.snapshot(item)

    def drifted(
        self, owner: Owner, desired: Mapping[str, str], frozen: frozenset[str], current: SinkObject | None
    ) -> bool:
        if current is None:
            return True
        plan = labels.plan(current.labels, desired, domain=self.domain, frozen=frozen)
        return bool(plan.changes) or owner.uid not in current.owners or not current.tagged

    def publishing(
        self,
        owner: Owner,
        desired: Mapping[str, str],
        frozen: frozenset[str],
        current: SinkObject | None,
        *,
        verify: bool = False,
    ) -> Calls[Published]:
        target = self.target(owner.name)
        problem = labels.value_problem(owner.name)
        if problem is not None:
            # A node name may run to 253 characters; the label nfd-master selects by holds 63 at most, so
            # the API server would refuse every write of this object.
            raise SinkError(
                f"cannot write {target}: the node's name is not a valid value for its {NFD_NODE_NAME} "
                f"label ({problem}), which nfd-master needs; run with --sink node"
            )

        def attempt(current: SinkObject | None) -> Calls[Published]:
            plan = labels.plan(current.labels if current else {}, desired, domain=self.domain, frozen=frozen)
            if current is None:
                return Published(target, plan, True, (yield from self._create(owner, plan, verify=verify)))
            if current.foreign:
                # Never ours to write (a second controller is refused anyway) nor, adopted, ours to delete.
                raise SinkError(not_ours(target, current.foreign))
            if not self.drifted(owner, desired, frozen, current):
                return Published(target, plan, False, current)
            try:
                return Published(target, plan, True, (yield from self._patch(owner, plan, current)))
            except kubernetes.client.ApiException as err:
                if status_of(err) != 404:
                    raise
            # Deleted under us: create it again, but only for a record that still exists.
            plan = labels.plan({}, desired, domain=self.domain, frozen=frozen)
            return Published(target, plan, True, (yield from self._create(owner, plan, verify=True)))

        return (yield from _written(target, owner.name, current, attempt, self._read))

    def _create(self, owner: Owner, plan: labels.Plan, *, verify: bool) -> Calls[SinkObject]:
        node = owner.name
        if owner.node_uid is None:
            yield from self._check_node(node)
        if verify:
            yield from self._check_owner(owner)
        body = {
            "apiVersion": f"{NFD_GROUP}/{NFD_VERSION}",
            "kind": "NodeFeature",
            "metadata": {
                "name": node,
                "namespace": self.namespace,  # explicit: the owner is cluster-scoped
                "labels": {NFD_NODE_NAME: node, MANAGED_BY: MANAGER},
                "ownerReferences": [self._owner_ref(owner)],
            },
            "spec": {"labels": dict(plan.managed)},
        }
        try:
            created = _decoded(
                (yield Request("create", NFD_PLURAL, "POST", NFD_PATH, {"ns": self.namespace}, body))
            )
        except kubernetes.client.ApiException as err:
            if missing_namespace(err, self.namespace):
                raise namespace_missing(self.namespace) from err
            if terminating_namespace(err):
                raise namespace_missing(self.namespace, terminating=True) from err
            if missing_api(err):
                raise nfd_missing(self.namespace) from err
            raise
        return self.snapshot(created)

    def _patch(self, owner: Owner, plan: labels.Plan, current: SinkObject) -> Calls[SinkObject]:
        node = owner.name
        patch: dict[str, Any] = {
            "metadata": {"resourceVersion": current.rv, "labels": {NFD_NODE_NAME: node, MANAGED_BY: MANAGER}},
            "spec": {"labels": _null_removed(current.labels, plan.managed)},
        }
        if owner.uid not in current.owners:
            # The record was recreated: point at the new one so garbage collection follows it. The list
            # is replaced whole by a merge patch, so any other owner is read back first to be kept.
            live = yield from self._read_raw(node)
            refs = items(live, "metadata", "ownerReferences")
            patch["metadata"]["ownerReferences"] = [
                r for r in refs if r.get("kind") != models.KIND or r.get("apiVersion") != models.API_VERSION
            ] + [self._owner_ref(owner)]
        patched = yield Request(
            "patch", NFD_PLURAL, "PATCH", NFD_OBJECT, self._at(node), patch, content_type=rawcall.MERGE_PATCH
        )
        return self.snapshot(_decoded(patched))

    def _at(self, node: str) -> dict[str, str]:
        return {"ns": self.namespace, "name": node}

    def _owner_ref(self, owner: Owner) -> dict[str, Any]:
        return {
            "apiVersion": models.API_VERSION,
            "kind": models.KIND,
            "name": owner.name,
            "uid": owner.uid,
            "controller": True,
        }

    def _read_raw(self, node: str) -> Calls[dict[str, Any]]:
        return _decoded((yield Request("get", NFD_PLURAL, "GET", NFD_OBJECT, self._at(node))))

    def _read(self, node: str) -> Calls[SinkObject | None]:
        try:
            return self.snapshot((yield from self._read_raw(node)))
        except kubernetes.client.ApiException as err:
            if status_of(err) != 404:
                raise
            return None

    def _check_node(self, node: str) -> Calls[None]:
        """A record without a Node owner was not written by the agent: make sure its node exists, since
        nfd-master ignores a NodeFeature for a node it does not know and nothing would say why."""
        try:
            yield Request("get", "nodes", "GET", NODE_PATH, {"name": node})
        except kubernetes.client.ApiException as err:
            if status_of(err) == 404:
                raise NodeNotFound(f"node {node} does not exist") from err
            if status_of(err) != 403:
                raise
            # Without `get nodes` (a least-privilege install), publish as before this check existed.
            log.warning(
                "cannot check that the node exists, publishing anyway",
                extra={"node": node, "error": f"HTTP 403 {err.reason or ''}".strip()},
            )

    def _check_owner(self, owner: Owner) -> Calls[None]:
        """Creating a NodeFeature again after one was deleted may race its record's deletion (garbage
        collection deletes both): creating it for a record that is gone would publish a gone node's
        labels, so this rare path reads the record first."""
        try:
            live = _decoded((yield Request("get", models.PLURAL, "GET", DEVICES_PATH, {"name": owner.name})))
        except kubernetes.client.ApiException as err:
            if status_of(err) != 404:
                raise
            raise RecordGone(f"devices {owner.name} is gone") from err
        if part(live, "metadata").get("uid") != owner.uid:
            raise RecordGone(f"devices {owner.name} was replaced")

    def withdraw(self, node: str, current: SinkObject | None) -> Published | None:
        return None  # the NodeFeature is owned by the Devices object: garbage collection removes it

    def withdrawing(self, node: str, current: SinkObject | None) -> Calls[Published | None]:
        return None
        yield  # a generator that sends nothing


class NodeSink(_SentInThread):
    """The Node's own labels, for clusters without NFD. The keys we wrote are recorded in an annotation,
    so a label someone set by hand (even one under our prefix) is never removed by us. Every Node is in
    the view (Nodes are watched), so a Node missing from it does not exist."""

    name = "node"
    withdraws = True

    def __init__(self, api: kubernetes.client.ApiClient, domain: str, metrics: Metrics | None = None) -> None:
        self.api = api
        self.domain = domain
        self.annotation = managed_annotation(domain)
        self.metrics = metrics or Metrics()

    def snapshot(self, obj: Mapping[str, Any]) -> SinkObject:
        meta = part(obj, "metadata")
        raw = part(meta, "annotations").get(self.annotation)
        return SinkObject(
            name=str(meta.get("name", "")),
            rv=version(obj),
            labels=ours(part(meta, "labels"), self.domain),
            managed=frozenset(k for k in raw.split(",") if k) if isinstance(raw, str) else frozenset(),
        )

    def existing(self) -> Iterator[SinkObject]:
        """Every Node, read once at start: the view before the first reconcile."""
        for item in pages(self.metrics, "nodes", listing(self.api, "/api/v1/nodes")):
            yield self.snapshot(item)

    def _plan(
        self, desired: Mapping[str, str], frozen: frozenset[str], current: SinkObject
    ) -> tuple[labels.Plan, str | None, str | None]:
        plan = labels.plan(current.labels, desired, domain=self.domain, frozen=frozen, owned=current.managed)
        new_owned = ",".join(sorted(plan.managed)) or None
        old_owned = ",".join(sorted(current.managed or ())) or None
        return plan, new_owned, old_owned

    def drifted(
        self, owner: Owner, desired: Mapping[str, str], frozen: frozenset[str], current: SinkObject | None
    ) -> bool:
        if current is None:
            return False  # no Node: nothing to repair until it appears
        plan, new_owned, old_owned = self._plan(desired, frozen, current)
        return bool(plan.changes) or new_owned != old_owned

    def publishing(
        self,
        owner: Owner,
        desired: Mapping[str, str],
        frozen: frozenset[str],
        current: SinkObject | None,
        *,
        verify: bool = False,
    ) -> Calls[Published]:
        node = owner.name
        target = f"Node {node}"

        def attempt(current: SinkObject | None) -> Calls[Published]:
            if current is None:
                raise NodeNotFound(f"node {node} does not exist")
            plan, new_owned, old_owned = self._plan(desired, frozen, current)
            if not plan.changes and new_owned == old_owned:
                return Published(target, plan, False, current)
            patch = {
                "metadata": {
                    "resourceVersion": current.rv,
                    "labels": {c.key: c.new for c in plan.changes},
                    "annotations": {self.annotation: new_owned},
                }
            }
            try:
                # A strategic merge patch, as the kubernetes client sends a Node patch given an object.
                patched = yield Request(
                    "patch", "nodes", "PATCH", NODE_PATH, {"name": node}, patch, content_type=STRATEGIC
                )
            except kubernetes.client.ApiException as err:
                if status_of(err) == 404:
                    raise NodeNotFound(f"node {node} does not exist") from err
                raise
            return Published(target, plan, True, self.snapshot(_decoded(patched)))

        return (yield from _written(target, node, current, attempt, self._read))

    def _read(self, node: str) -> Calls[SinkObject | None]:
        try:
            live = yield Request("get", "nodes", "GET", NODE_PATH, {"name": node})
        except kubernetes.client.ApiException as err:
            if status_of(err) == 404:
                return None
            raise
        return self.snapshot(_decoded(live))

    def withdraw(self, node: str, current: SinkObject | None) -> Published | None:
        """`withdrawing`, sent in this thread."""
        return apicall.run(self.withdrawing(node, current), self.api, self.metrics)

    def withdrawing(self, node: str, current: SinkObject | None) -> Calls[Published | None]:
        """The record is gone: remove every key we wrote, as garbage collection does for a NodeFeature."""
        if current is None or not current.managed:
            return None
        try:
            return (yield from self.publishing(Owner(node, ""), {}, frozenset(), current))
        except NodeNotFound:
            return None


def _written(
    target: str,
    node: str,
    current: SinkObject | None,
    attempt: Callable[[SinkObject | None], Calls[Published]],
    read: Callable[[str], Calls[SinkObject | None]],
) -> Calls[Published]:
    """`attempt` against what the view holds; a 409 (AlreadyExists, or a stale resourceVersion) means the
    view is behind the API server, so the object is read back and the write planned again."""
    for _ in range(CONFLICT_RETRIES):
        try:
            return (yield from attempt(current))
        except kubernetes.client.ApiException as err:
            if status_of(err) != 409:
                raise
        log.info("sink object changed while writing, reading it back", extra={"node": node, "target": target})
        current = yield from read(node)
    raise Conflict(f"{target} kept changing while being written")


def _decoded(answer: Any) -> dict[str, Any]:
    """A raw answer's JSON object. The client's Node models are skipped: they cost more than the whole
    publish, and refuse (with a validation error) a Node that a newer API server adds fields to. An
    answer that is no JSON object is a SinkError that says what came (rawcall.json_object's reason), so
    the record's condition and ERROR line name it, not "ValueError". An answer not yet read (a generated
    call's, `_preload_content=False`) is read as rawcall reads one: up to wire.MAX_ANSWER (a LIST page
    answered with an endless body is refused, not buffered whole)."""
    data = answer if isinstance(answer, bytes) else rawcall.read_answer(answer)
    try:
        return rawcall.json_object(data)
    except ValueError as err:
        raise SinkError(str(err)) from err


def managed_annotation(domain: str) -> str:
    return vocabulary.managed_labels_annotation(domain)
