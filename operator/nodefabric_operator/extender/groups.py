"""Which distributed group a pod belongs to, how big the group is, and what placement it asks for.

Read from the labels and annotations the common job controllers put on their pods, or from the
explicit `placement.<domain>/group` and `placement.<domain>/group-size`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodefabric_devicemanager import vocabulary
from nodefabric_devicemanager.numbers import BadNumber, Quantity, parse
from nodefabric_operator.extender.config import RANKS, ExtenderConfig, canonical
from nodefabric_operator.extender.nodes import is_label_value
from nodefabric_operator.extender.wire import shown

# (family, label carrying the group name, annotation or label carrying the size or "")
# Order matters: a pod carrying several (a Kueue pod group made of a JobSet) belongs to the most
# explicit one, which is listed first.
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("scheduler-plugins", "scheduling.x-k8s.io/pod-group", ""),
    ("kueue", "kueue.x-k8s.io/pod-group-name", "kueue.x-k8s.io/pod-group-total-count"),
    ("leaderworkerset", "leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/size"),
    ("volcano", "volcano.sh/job-name", ""),
    ("kubeflow", "training.kubeflow.org/job-name", ""),
    ("jobset", "jobset.sigs.k8s.io/jobset-name", ""),
    ("job", "batch.kubernetes.io/job-name", ""),
)
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
# ASCII digits only: int() also takes "1_000", " 8" and "٨", which no controller writes. The bound keeps a
# typo of a few extra digits a clear error instead of a group that waits forever.
GROUP_SIZE = Quantity("group size", 1, 100_000)
_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?",
    re.ASCII,
)
MAX_HOMOGENEOUS_KEYS = 16


class InvalidPlacement(ValueError):
    """A pod asks for something the extender cannot honour (a bad annotation value)."""

    def __init__(self, message: str, group: str | None = None) -> None:
        super().__init__(message)
        self.group = group  # the group key, once known: the error is recorded and told once per pod


@dataclass(frozen=True)
class GroupSpec:
    key: str  # "<namespace>/<family>/<name>": unique per cluster
    family: str
    name: str
    size: int | None  # None: not declared on the pod; the caller counts the group's pods
    locality: str
    rank: str
    homogeneous_keys: tuple[str, ...] | None  # None: the configured default for the pod's resources


def _meta(pod: Mapping[str, Any], field: str) -> Mapping[str, str]:
    meta = pod.get("metadata")
    value = meta.get(field) if isinstance(meta, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def pod_namespace(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    return ns if isinstance(ns, str) and ns else "default"


def pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else ""


def pod_uid(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) and uid else f"{pod_namespace(pod)}/{pod_name(pod)}"


def _size(text: str, where: str) -> int:
    try:
        size = parse(text, GROUP_SIZE)
    except BadNumber as exc:
        raise InvalidPlacement(f"{where}: {exc}") from None
    assert size is not None  # GROUP_SIZE has no spelling of unknown
    return size


def _workload_group(pod: Mapping[str, Any]) -> str | None:
    """The native Workload API's PodGroup a pod joins: `spec.schedulingGroup.podGroupName`, or in the
    first alpha `spec.workloadRef.podGroup` (with its replica key, `<podGroup>/<replica>`: each replica is
    its own gang)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return None
    sg = spec.get("schedulingGroup")
    if isinstance(sg, Mapping):
        name = sg.get("podGroupName")
        if isinstance(name, str) and is_label_value(name) and name:
            return name
    ref = spec.get("workloadRef")
    if isinstance(ref, Mapping):
        group = ref.get("podGroup")
        replica = ref.get("podGroupReplicaKey")
        if isinstance(group, str) and is_label_value(group) and group:
            if isinstance(replica, str) and replica and is_label_value(replica):
                # "/", which no label value holds: "a" replica "b" and a PodGroup "a-b" are two gangs.
                return f"{group}/{replica}"
            return group
    return None


def group_of(pod: Mapping[str, Any], config: ExtenderConfig) -> GroupSpec | None:
    """The pod's group, or None for a pod that is not part of a distributed group.

    Raises InvalidPlacement for a group annotation the extender cannot honour.
    """
    labels = _meta(pod, "labels")
    annotations = _meta(pod, "annotations")
    prefix = config.annotation_prefix

    def lookup(key: str) -> str | None:
        value = annotations.get(key, labels.get(key))
        return value if isinstance(value, str) and value else None

    family = name = ""
    size_text: str | None = None
    size_key = ""
    explicit = lookup(prefix + vocabulary.GROUP)
    # A group's name appears in every reason and summary: it is held to what a label value may be (the
    # API server holds the job controllers' labels to that already).
    if explicit and not is_label_value(explicit):
        cut = explicit if len(explicit) <= 63 else f"{explicit[:63]}..."
        raise InvalidPlacement(f"{prefix}group {cut!r} is not a label value (63 characters, [A-Za-z0-9_.-])")
    if explicit:
        family, name = "explicit", explicit
    elif workload := _workload_group(pod):
        family, name = "workload", workload
    else:
        for fam, label, size_at in FAMILIES:
            value = labels.get(label)
            if isinstance(value, str) and value:
                family, name = fam, value
                if fam == "leaderworkerset":
                    # Each replica of a LeaderWorkerSet is its own group of `size` pods.
                    name = f"{value}-{labels.get(LWS_GROUP_INDEX, '0')}"
                if size_at:
                    size_text, size_key = lookup(size_at), size_at
                break
    if not family:
        return None
    key = f"{pod_namespace(pod)}/{family}/{name}"
    explicit_size = lookup(prefix + vocabulary.GROUP_SIZE)
    if explicit_size is not None:
        size_text, size_key = explicit_size, prefix + vocabulary.GROUP_SIZE
    try:
        size = _size(size_text, size_key) if size_text is not None else None
    except InvalidPlacement as exc:
        raise InvalidPlacement(str(exc), key) from None

    locality = lookup(prefix + vocabulary.LOCALITY) or config.default_locality
    if canonical(locality) not in config.localities:
        raise InvalidPlacement(
            f"{prefix}locality {shown(locality)} is not one of {', '.join(config.localities)}", key
        )
    rank = lookup(prefix + vocabulary.RANK) or config.default_rank
    if canonical(rank) not in RANKS:
        raise InvalidPlacement(f"{prefix}rank {shown(rank)} is not one of {', '.join(RANKS)}", key)
    homog_text = annotations.get(prefix + vocabulary.HOMOGENEOUS)
    homogeneous = None
    if isinstance(homog_text, str):
        homogeneous = tuple(dict.fromkeys(k.strip() for k in homog_text.split(",") if k.strip()))
        bad = next((k for k in homogeneous if len(k) > 317 or not _LABEL_KEY.fullmatch(k)), None)
        if bad is not None:
            raise InvalidPlacement(f"{prefix}homogeneous: {bad[:80]!r} is not a label key", key)
        if len(homogeneous) > MAX_HOMOGENEOUS_KEYS:
            raise InvalidPlacement(
                f"{prefix}homogeneous names {len(homogeneous)} keys, at most {MAX_HOMOGENEOUS_KEYS}", key
            )
    return GroupSpec(
        key=key,
        family=family,
        name=name,
        size=size,
        locality=canonical(locality),
        rank=canonical(rank),
        homogeneous_keys=homogeneous,
    )
