"""The chain of controllers from a pod up to a JobSet or LeaderWorkerSet, by table (the pure rule), and its
reader against the embedded API over real HTTP: one GET per object, a bounded cache, a failed read said
and read again once due, a read with no answer in time said, never a member."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from admission_world import NS, gpod, stalling_proxy

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.admission import model
from nodefabric_operator.admission.chain import ChainReader, Link, Membership, Ref, link_of, membership
from nodefabric_operator.admission.owners import Owner, OwnerRef
from nodefabric_operator.demo.kubeapi import running_api
from nodefabric_operator.demo.kubeapi.running import write_kubeconfig

JOBSET = Owner(OwnerRef("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", NS, "s"), (2, "s"), "", "js")
LWS = Owner(
    OwnerRef("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet", NS, "l"), None, "", "lw"
)
PODGROUP = Owner(
    OwnerRef("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", NS, "g"), None, "", "pg"
)


def ctl(kind: str, uid: str, name: str = "x") -> dict[str, Any]:
    version = {"Job": "batch/v1", "StatefulSet": "apps/v1", "Pod": "v1"}.get(kind, "batch/v2")
    return {"apiVersion": version, "kind": kind, "name": name, "uid": uid, "controller": True}


def pod(name: str, owner: dict[str, Any] | None = None, uid: str = "", namespace: str = NS) -> dict[str, Any]:
    p = gpod(name, owner=owner)
    p["metadata"]["uid"] = uid or f"pod-{name}"
    p["metadata"]["namespace"] = namespace
    return p


LINKS = {
    "job": Link(("JobSet", "js")),
    "job-of-another": Link(("JobSet", "someone-else")),
    "job-gone": Link(),  # its name is another Job's now
    "job-refused": Link(problem="Job ml/x could not be read (HTTP 403)"),
    "leaders": Link(("LeaderWorkerSet", "lw")),
    "workers": Link(("Pod", "pod-leader")),
    "others-leaders": Link(("LeaderWorkerSet", "another")),
    "rogue": Link(("Pod", "pod-nobody")),  # a StatefulSet controlled by a pod that is no leader
    "stray": Link(("Pod", "pod-elsewhere")),
    "unknown-leader": Link(("Pod", "pod-never-seen")),
    "refused-workers": Link(problem="StatefulSet ml/x could not be read (HTTP 403)"),
    "deep": Link(("Pod", "pod-worker")),  # a worker's StatefulSet whose "leader" is itself a worker
}


def by_uid(links: dict[str, Link]) -> Callable[[Ref], Link | None]:
    """The links as read for whichever reference names their uid (the reader keeps them by reference)."""
    return lambda ref: links.get(ref.uid)


PODS = {
    p["metadata"]["uid"]: p
    for p in (
        pod("leader", ctl("StatefulSet", "leaders")),
        pod("nobody"),
        pod("worker", ctl("StatefulSet", "workers")),
        pod("elsewhere", ctl("StatefulSet", "leaders"), namespace="other"),
    )
}


@pytest.mark.parametrize(
    ("owner", "controller", "expected"),
    [
        (JOBSET, ctl("Job", "job"), Membership(True)),
        (JOBSET, None, Membership(False)),
        (JOBSET, ctl("Job", "job-of-another"), Membership(False)),
        (JOBSET, ctl("Job", "job-gone"), Membership(False)),
        (JOBSET, ctl("JobSet", "js"), Membership(False)),  # the JobSet controls no pod itself
        (JOBSET, ctl("CronJob", "job"), Membership(False)),
        (JOBSET, {**ctl("Job", "job"), "controller": False}, Membership(False)),
        (JOBSET, ctl("Job", "job-refused"), Membership(False, "Job ml/x could not be read (HTTP 403)")),
        (JOBSET, ctl("Job", "unread", "j"), Membership(False, "Job ml/j has not been read yet")),
        (LWS, ctl("StatefulSet", "leaders"), Membership(True)),
        (LWS, ctl("StatefulSet", "workers"), Membership(True)),
        (LWS, None, Membership(False)),
        (LWS, ctl("StatefulSet", "others-leaders"), Membership(False)),
        (LWS, ctl("StatefulSet", "rogue"), Membership(False)),
        (LWS, ctl("StatefulSet", "deep"), Membership(False)),
        (LWS, ctl("LeaderWorkerSet", "lw"), Membership(False)),
        (LWS, ctl("Job", "leaders"), Membership(False)),
        (
            LWS,
            ctl("StatefulSet", "stray"),
            Membership(False, "its leader pod (the controller of its StatefulSet) is not known"),
        ),
        (
            LWS,
            ctl("StatefulSet", "unknown-leader"),
            Membership(False, "its leader pod (the controller of its StatefulSet) is not known"),
        ),
        (
            LWS,
            ctl("StatefulSet", "refused-workers"),
            Membership(False, "StatefulSet ml/x could not be read (HTTP 403)"),
        ),
        # A PodGroup controls nothing: membership is by name, as in upstream coscheduling.
        (PODGROUP, None, Membership(True)),
        (None, None, Membership(True)),  # no owner read: nothing to hold the pods to
    ],
)
def test_membership_follows_the_chain_by_uid(
    owner: Owner | None, controller: dict[str, Any] | None, expected: Membership
) -> None:
    assert membership(owner, pod("p", controller), by_uid(LINKS), PODS) == expected


def test_a_worker_whose_leaders_statefulset_is_unread_waits_on_it() -> None:
    links = {k: v for k, v in LINKS.items() if k != "leaders"}
    got = membership(LWS, pod("w", ctl("StatefulSet", "workers")), by_uid(links), PODS)
    assert got == Membership(False, "StatefulSet ml/x has not been read yet")


@pytest.mark.parametrize(
    ("obj", "link"),
    [
        ({"metadata": {"uid": "u", "ownerReferences": [ctl("JobSet", "js")]}}, Link(("JobSet", "js"))),
        (
            {"metadata": {"uid": "u", "ownerReferences": [{**ctl("JobSet", "js"), "controller": None}]}},
            Link(),
        ),
        ({"metadata": {"uid": "u", "ownerReferences": [{"kind": "JobSet", "controller": True}]}}, Link()),
        ({"metadata": {"uid": "u", "ownerReferences": "x"}}, Link()),
        ({"metadata": {"uid": "another", "ownerReferences": [ctl("JobSet", "js")]}}, Link()),
        ({"metadata": {}}, Link(problem="Job ml/j could not be read (it has no uid)")),
        ({"metadata": "x"}, Link(problem="Job ml/j could not be read (it has no uid)")),
        ("<html>", Link(problem="Job ml/j could not be read (the answer is not an object)")),
        ([1], Link(problem="Job ml/j could not be read (the answer is not an object)")),
    ],
)
def test_what_the_api_answered_becomes_a_link(obj: object, link: Link) -> None:
    assert link_of(Ref("batch/v1", "Job", NS, "j", "u"), obj) == link


# --- the reader, over real HTTP ---------------------------------------------------------------------------


def job(name: str, controller: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, "ownerReferences": [ctl("JobSet", controller, "s")]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"template": {}}}


async def test_each_object_is_read_once_and_one_not_found_never_again() -> None:
    async with running_api([model.placement_crd()]) as k:
        k.api.declare("batch/v1/jobs", kind="Job", namespaced=True)
        uids = [k.api.put_object("batch/v1/jobs", job(f"j{i}", "js"))["metadata"]["uid"] for i in range(3)]
        now = [1000.0]
        reader = ChainReader(load_client(k.kubeconfig), lambda: now[0], retry_s=5.0)
        pods = [pod(f"p{i}-{n}", ctl("Job", uids[i], f"j{i}")) for i in range(3) for n in range(4)]
        ghost = pod("ghost", ctl("Job", "ghost-uid", "ghost"))

        def gets() -> int:
            return k.api.count("GET", "batch/v1/jobs", "get")

        await reader.resolve(JOBSET, [*pods, ghost], {})
        assert gets() == 4  # three Jobs for twelve pods, and the ghost
        assert [membership(JOBSET, p, reader.lookup, {}).member for p in pods] == [True] * 12
        assert membership(JOBSET, ghost, reader.lookup, {}) == Membership(False, "Job ml/ghost not found")
        now[0] += 5.0
        await reader.resolve(JOBSET, [*pods, ghost], {})
        assert gets() == 4  # not found is settled: a Job made under that name later has another uid
        k.api.put_object("batch/v1/jobs", job("ghost", "js"))  # the name taken, by another uid
        now[0] += 60.0
        await reader.resolve(JOBSET, [*pods, ghost], {})
        assert gets() == 4 and not membership(JOBSET, ghost, reader.lookup, {}).member


async def test_the_kept_objects_are_bounded_least_recently_used_first() -> None:
    async with running_api([model.placement_crd()]) as k:
        k.api.declare("batch/v1/jobs", kind="Job", namespaced=True)
        uids = [k.api.put_object("batch/v1/jobs", job(f"j{i}", "js"))["metadata"]["uid"] for i in range(3)]
        reader = ChainReader(load_client(k.kubeconfig), limit=2)
        pods = [pod(f"p{i}", ctl("Job", uids[i], f"j{i}")) for i in range(3)]
        await reader.resolve(JOBSET, pods, {})
        # One group's chains are kept whole past the bound, so that its pods are all told right after.
        assert len(reader.links) == 3
        assert all(membership(JOBSET, p, reader.lookup, {}).member for p in pods)
        await reader.resolve(JOBSET, pods[:1], {})
        assert [r.uid for r in reader.links] == [uids[2], uids[0]]  # j1, used least recently, went
        await reader.resolve(JOBSET, pods[1:2], {})
        assert k.api.count("GET", "batch/v1/jobs", "get") == 4  # j1 read again when needed again
        assert [r.uid for r in reader.links] == [uids[0], uids[1]]


async def test_a_read_not_answered_in_time_is_said_never_a_member() -> None:
    async with running_api([model.placement_crd()]) as k, stalling_proxy(k) as proxy:
        k.api.declare("batch/v1/jobs", kind="Job", namespaced=True)
        uid = k.api.put_object("batch/v1/jobs", job("j", "js"))["metadata"]["uid"]
        proxy.stall = lambda request: "/jobs/" in request.path
        with tempfile.TemporaryDirectory() as d:
            api = load_client(write_kubeconfig(proxy.url, d))
        reader = ChainReader(api, timeout=(2.0, 0.3))
        p = pod("p", ctl("Job", uid, "j"))
        await reader.resolve(JOBSET, [p], {})
        got = membership(JOBSET, p, reader.lookup, {})
        assert not got.member and got.reason.startswith("Job ml/j could not be read (")
        assert proxy.stalled == 1
        proxy.unstall()
        await asyncio.sleep(0)
