"""A group's expected size, from its owner rather than from the pods seen so far.

A JobSet whose first pod exists before its siblings must not be sized from that one pod: the size comes
from what the owner asks for. The functions here are pure over the owner objects (as the API returns
them); `OwnerFetcher` is the thin shell that reads them.

Precedence: an owner's own count wins over any count a pod declares (a pod's annotations come from a
template anyone who can create pods can write). Without an owner count, the sizes the members declare
(`kueue.x-k8s.io/pod-group-total-count`, `leaderworkerset.sigs.k8s.io/size`, `placement.<domain>/group-size`)
must agree. A size nobody states is unknown: the group waits, gated, and is never placed as a group of 1.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodefabric_operator.extender.groups import GROUP_SIZE, GroupSpec

log = logging.getLogger(__name__)

MAX_SIZE = GROUP_SIZE.hi
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
MAX_REPLICAS = 2**31 - 1  # a LeaderWorkerSet's spec.replicas is an int32


class OwnerError(ValueError):
    """An owner object whose count cannot be read; the message names the field."""


@dataclass(frozen=True)
class Size:
    value: int | None  # None: unknown, the group waits
    source: str  # where it came from ("Job train: completions"); "" while unknown
    reason: str = ""  # why it is unknown (or why the members' counts were set aside)


@dataclass(frozen=True)
class OwnerRef:
    """Where a group's owner lives: an object the API serves at /apis/<group>/<version>/.../<plural>."""

    group: str
    version: str
    plural: str
    kind: str
    namespace: str
    name: str


def _count(value: object, where: str, *, default: int | None = None, zero: bool = False) -> int:
    """A whole count as the API stores it (an integer; JSON has no other). Booleans, strings, floats and
    negatives are errors naming the field; so is anything past the largest group nodefabric places."""
    if value is None:
        if default is None:
            raise OwnerError(f"{where} is not set")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise OwnerError(f"{where} must be an integer, got {type(value).__name__}")
    if value < (0 if zero else 1) or value > MAX_SIZE:
        raise OwnerError(f"{where} must be between {0 if zero else 1} and {MAX_SIZE}, got {value}")
    return value


def _obj(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise OwnerError(f"{where} must be an object, got {type(value).__name__}")
    return value


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else "?"


def job_size(job: Mapping[str, Any]) -> tuple[int, str]:
    """An indexed Job runs min(completions, parallelism) pods at once; any other Job `parallelism`."""
    spec = _obj(job.get("spec"), "spec")
    parallelism = _count(spec.get("parallelism"), "spec.parallelism", default=1)
    if spec.get("completionMode") == "Indexed":
        completions = _count(spec.get("completions"), "spec.completions")
        if completions <= parallelism:
            return completions, f"Job {_name(job)}: completions"
        return parallelism, f"Job {_name(job)}: parallelism"
    return parallelism, f"Job {_name(job)}: parallelism"


def jobset_size(jobset: Mapping[str, Any]) -> tuple[int, str]:
    """Every replicated job's replicas x its template's parallelism, summed."""
    spec = _obj(jobset.get("spec"), "spec")
    jobs = spec.get("replicatedJobs")
    if not isinstance(jobs, list) or not jobs:
        raise OwnerError("spec.replicatedJobs must be a non-empty list")
    total = 0
    for i, raw in enumerate(jobs):
        where = f"spec.replicatedJobs[{i}]"
        rj = _obj(raw, where)
        replicas = _count(rj.get("replicas"), f"{where}.replicas", default=1, zero=True)
        template = _obj(_obj(rj.get("template"), f"{where}.template").get("spec"), f"{where}.template.spec")
        parallelism = _count(template.get("parallelism"), f"{where}.template.spec.parallelism", default=1)
        total += replicas * parallelism
    if not 1 <= total <= MAX_SIZE:
        raise OwnerError(f"spec.replicatedJobs add up to {total} pods, not between 1 and {MAX_SIZE}")
    return total, f"JobSet {_name(jobset)}: replicatedJobs"


def lws_size(lws: Mapping[str, Any]) -> tuple[int, str]:
    spec = _obj(lws.get("spec"), "spec")
    template = _obj(spec.get("leaderWorkerTemplate"), "spec.leaderWorkerTemplate")
    size = _count(template.get("size"), "spec.leaderWorkerTemplate.size", default=1)
    return size, f"LeaderWorkerSet {_name(lws)}: leaderWorkerTemplate.size"


def lws_replicas(lws: Mapping[str, Any]) -> int:
    """How many groups a LeaderWorkerSet has (its `spec.replicas`, 1 when absent, as its API defaults
    it): the ones of a higher index are not its, or no longer (scaled down, their pods being deleted).
    Not bounded by the largest group: it counts groups, not pods (the API's int32 bounds it)."""
    value = _obj(lws.get("spec"), "spec").get("replicas")
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise OwnerError(f"spec.replicas must be an integer, got {type(value).__name__}")
    if not 0 <= value <= MAX_REPLICAS:
        raise OwnerError(f"spec.replicas must be between 0 and {MAX_REPLICAS}, got {value}")
    return value


def replica_specs_size(job: Mapping[str, Any]) -> tuple[int, str]:
    """Kubeflow training jobs and MPIJob: `spec.<kind>ReplicaSpecs` maps a role to its `replicas`."""
    spec = _obj(job.get("spec"), "spec")
    keys = [k for k in spec if isinstance(k, str) and k.endswith("ReplicaSpecs")]
    if not keys:
        raise OwnerError("spec has no ...ReplicaSpecs")
    total = 0
    for key in keys:
        for role, raw in _obj(spec[key], f"spec.{key}").items():
            where = f"spec.{key}.{role}"
            total += _count(_obj(raw, where).get("replicas"), f"{where}.replicas", default=1, zero=True)
    if not 1 <= total <= MAX_SIZE:
        raise OwnerError(f"the replica specs add up to {total} pods, not between 1 and {MAX_SIZE}")
    kind = job.get("kind") if isinstance(job.get("kind"), str) else "job"
    return total, f"{kind} {_name(job)}: replica specs"


def pod_group_size(pg: Mapping[str, Any]) -> tuple[int, str]:
    """scheduler-plugins / Volcano PodGroup `minMember`; the Workload API's PodGroup gang `minCount`."""
    spec = _obj(pg.get("spec"), "spec")
    if "minMember" in spec:
        return _count(spec["minMember"], "spec.minMember"), f"PodGroup {_name(pg)}: minMember"
    for path in (("schedulingPolicy", "gang"), ("policy", "gang"), ("gang",), ()):
        node: Mapping[str, Any] = spec
        where = "spec"
        for part in path:
            where += f".{part}"
            node = _obj(node.get(part), where)
        if "minCount" in node:
            return _count(node["minCount"], f"{where}.minCount"), f"PodGroup {_name(pg)}: minCount"
    raise OwnerError("spec has neither minMember nor a gang minCount")


SIZERS = {
    "Job": job_size,
    "JobSet": jobset_size,
    "LeaderWorkerSet": lws_size,
    "PodGroup": pod_group_size,
}


def owner_size(ref: OwnerRef, obj: Mapping[str, Any]) -> tuple[int, str]:
    """The owner's own count. Raises OwnerError naming the field it cannot read."""
    if not isinstance(obj, Mapping):
        raise OwnerError(f"{ref.kind} {ref.name} is not an object")
    sizer = SIZERS.get(ref.kind, replica_specs_size)
    return sizer(obj)


def owner_groups(ref: OwnerRef, obj: Mapping[str, Any]) -> int | None:
    """How many groups the owner has, where it makes one per index (a LeaderWorkerSet); None for the
    others. Raises OwnerError naming the field it cannot read."""
    return lws_replicas(obj) if ref.kind == "LeaderWorkerSet" else None


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def labels(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object's controller reference (the one with `controller: true`), None when it has none."""
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def _pod_group(pod: Mapping[str, Any]) -> str:
    """The Workload API PodGroup a pod names (`spec.schedulingGroup.podGroupName`, or the first alpha's
    `spec.workloadRef.podGroup`), without a replica key; "" when none."""
    spec = _spec(pod)
    for field, key in (("schedulingGroup", "podGroupName"), ("workloadRef", "podGroup")):
        holder = spec.get(field)
        name = holder.get(key) if isinstance(holder, Mapping) else None
        if isinstance(name, str) and name:
            return name
    return ""


def owner_ref(spec: GroupSpec, pod: Mapping[str, Any]) -> OwnerRef | None:
    """Where the owner that states the group's size lives, None for a family that has none (Kueue pod
    groups and explicit groups state their size on the pods)."""
    ns = spec.key.split("/", 1)[0]
    fam = spec.family
    if fam == "job":
        return OwnerRef("batch", "v1", "jobs", "Job", ns, spec.name)
    if fam == "jobset":
        return OwnerRef("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", ns, spec.name)
    if fam == "leaderworkerset":
        lws = labels(pod).get(LWS_NAME)
        if isinstance(lws, str) and lws:
            return OwnerRef("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet", ns, lws)
        return None
    if fam == "scheduler-plugins":
        return OwnerRef("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", ns, spec.name)
    if fam == "workload":
        # The PodGroup the pod names: with a replica key the group is "<podGroup>/<replica>" (each
        # replica its own gang), but its size is the one PodGroup's.
        return OwnerRef(
            "scheduling.k8s.io", "v1alpha1", "podgroups", "PodGroup", ns, _pod_group(pod) or spec.name
        )
    if fam == "kubeflow":
        ref = controller_of(pod)
        api, kind = (ref.get("apiVersion"), ref.get("kind")) if ref else (None, None)
        if isinstance(api, str) and "/" in api and isinstance(kind, str) and kind:
            group, version = api.split("/", 1)
            return OwnerRef(group, version, kind.lower() + "s", kind, ns, spec.name)
    return None


def resolve(
    owner: tuple[int, str] | None, owner_problem: str, declared: Sequence[tuple[int | None, str]]
) -> Size:
    """The group's size. `owner`: the owner's count and where it is stated; `owner_problem`: why the owner
    gave none (missing, unreadable); `declared`: each member's (declared size or None, pod name)."""
    if owner is not None:
        return Size(owner[0], owner[1])
    sizes = {size for size, _ in declared if size is not None}
    if len(sizes) > 1:
        shown = ", ".join(f"{pod}: {size}" for size, pod in sorted(declared, key=lambda d: d[1]) if size)
        return Size(None, "", f"members declare different group sizes ({shown[:300]})")
    if sizes:
        (size,) = sizes
        return Size(size, "declared by the members")
    reason = "group size unknown: no owner states it and no member declares it"
    if owner_problem:
        reason = f"group size unknown: {owner_problem}"
    return Size(None, "", reason)


@dataclass(frozen=True)
class Owner:
    """What was read of a group's owner: its count (or why none) and its uid ("" when not read)."""

    ref: OwnerRef
    count: tuple[int, str] | None
    problem: str = ""
    uid: str = ""
    # How many groups it has, by index (a LeaderWorkerSet's spec.replicas): a leader of an index past
    # them (or equal) is none of its members. None: no such count (any other kind, or not read).
    groups: int | None = None

    @property
    def api_version(self) -> str:
        return f"{self.ref.group}/{self.ref.version}" if self.ref.group else self.ref.version


# Owners that control none of their pods themselves. A JobSet's pods are its Jobs', a LeaderWorkerSet's its
# StatefulSets': whether the chain of controllers leads to the owner is chain.membership's, and on its own
# `controls` says no. A PodGroup (scheduler-plugins, the Workload API) controls nothing: as in upstream
# coscheduling, any pod of the namespace that names it (a label, `spec.schedulingGroup`) is a member.
CHAINED = frozenset({"JobSet", "LeaderWorkerSet"})
_BY_NAME = frozenset({"PodGroup"})


def controls(owner: Owner | None, pod: Mapping[str, Any]) -> bool:
    """Whether the pod may be a member: a pod of a Job (or a Kubeflow job) names it as its controller by
    uid. Anyone who can create pods can copy a Job's label, but not have the Job control their pod
    without also reading the Job's uid; a pod the owner does not control never counts."""
    if owner is None or not owner.uid or owner.ref.kind in _BY_NAME:
        return True
    if owner.ref.kind in CHAINED:
        return False
    ref = controller_of(pod)
    return ref is not None and ref.get("uid") == owner.uid


class OwnerFetcher:
    """Reads a group's owner through the API (any group/version, as a custom object)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)

    def read(self, ref: OwnerRef) -> Owner:
        """The owner's count and uid, or why there is no count."""
        try:
            obj: Any = self.custom.get_namespaced_custom_object(
                ref.group, ref.version, ref.namespace, ref.plural, ref.name, _request_timeout=(5, 15)
            )
        except ApiException as exc:
            if exc.status == 404:
                return Owner(ref, None, f"{ref.kind} {ref.namespace}/{ref.name} not found")
            return Owner(
                ref, None, f"{ref.kind} {ref.namespace}/{ref.name} could not be read (HTTP {exc.status})"
            )
        except Exception as exc:
            return Owner(
                ref, None, f"{ref.kind} {ref.namespace}/{ref.name} could not be read ({type(exc).__name__})"
            )
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        uid = uid if isinstance(uid, str) else ""
        try:
            count = owner_size(ref, obj)
        except OwnerError as exc:
            return Owner(ref, None, f"{ref.kind} {ref.namespace}/{ref.name}: {exc}", uid)
        try:
            groups = owner_groups(ref, obj)
        except OwnerError as exc:
            # The size stands: an unreadable group count leaves the groups unchecked (None), as before it
            # was read, rather than every group of the owner waiting with its size unknown.
            log.warning(
                "owner's group count unreadable",
                extra={"owner": f"{ref.namespace}/{ref.name}", "error": str(exc)},
            )
            groups = None
        return Owner(ref, count, "", uid, groups)
