"""The chain of controllers from a pod up to a JobSet or LeaderWorkerSet, by table (the pure rule: a
worker's group index is its leader's), and its reader against the embedded API over real HTTP: one GET per
object, a bounded cache, a failed read said and read again once due, a read with no answer in time said,
never a member; while the API server fails, one probe a backoff step for all the names."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from admission_world import NS, gpod, stalling_proxy
from test_admission_cost import failing_one, refusing_jobs

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.admission import model
from nodefabric_operator.admission.chain import ChainReader, Link, Membership, Ref, link_of, membership
from nodefabric_operator.admission.owners import Owner, OwnerError, OwnerRef, owner_groups
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.demo.kubeapi.running import write_kubeconfig

JOBSET = Owner(OwnerRef("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", NS, "s"), (2, "s"), "", "js")
INDEX = "leaderworkerset.sigs.k8s.io/group-index"
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


# Each of group 0: the leader StatefulSet's pod of group 0 as the LWS controller makes it, and others.
PODS = {
    p["metadata"]["uid"]: {**p, "metadata": {**p["metadata"], "labels": {INDEX: "0"}}}
    for p in (
        pod("x-0", ctl("StatefulSet", "leaders"), uid="pod-leader"),
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
    p = pod("x-0", controller)
    p["metadata"]["labels"] = {INDEX: "0"}
    assert membership(owner, p, by_uid(LINKS), PODS) == expected


def indexed(p: dict[str, Any], index: str | None) -> dict[str, Any]:
    if index is not None:
        p["metadata"]["labels"] = {INDEX: index}
    return p


@pytest.mark.parametrize(
    ("worker", "leader", "reason"),
    [
        ("1", "0", f"its {INDEX} label ('1') is not its leader pod's ('0')"),
        (None, "0", f"its {INDEX} label (none) is not its leader pod's ('0')"),
        ("0", None, f"its {INDEX} label ('0') is not its leader pod's (none)"),
        ("0", "0", ""),
        ("2", "2", ""),
    ],
)
def test_a_worker_counts_only_in_its_leaders_group(
    worker: str | None, leader: str | None, reason: str
) -> None:
    """A worker's group is named by its own index label: one that is not its leader's is never a member
    (before, a worker of group 0 labelled 1 counted in group 1), and it is settled: labels set by the LWS
    controller never change."""
    leader_pod = indexed(pod(f"x-{leader}", ctl("StatefulSet", "leaders"), uid="pod-leader"), leader)
    got = membership(
        LWS,
        indexed(pod("w", ctl("StatefulSet", "workers")), worker),
        by_uid(LINKS),
        {"pod-leader": leader_pod},
    )
    assert got == Membership(not reason, reason)
    assert got.settled == bool(reason)


@pytest.mark.parametrize(
    ("name", "index", "reason"),
    [
        ("x-0", "0", ""),
        ("x-12", "12", ""),
        ("x-0", "1", f"its {INDEX} label ('1') is not its ordinal in StatefulSet x"),
        ("forged", "1", f"its {INDEX} label ('1') is not its ordinal in StatefulSet x"),
        ("x-00", "00", f"its {INDEX} label ('00') is not its ordinal in StatefulSet x"),
        ("x-+1", "+1", f"its {INDEX} label ('+1') is not its ordinal in StatefulSet x"),
        ("x-0", None, f"its {INDEX} label (none) is not its ordinal in StatefulSet x"),
        ("x-²", "²", f"its {INDEX} label ('²') is not its ordinal in StatefulSet x"),
        ("x-" + "9" * 5000, "9" * 5000, ""),  # past what int() reads: said, never an error
        (
            "x-" + "0" * 5000,
            "0" * 5000,
            f"its {INDEX} label ({'0' * 63!r}) is not its ordinal in StatefulSet x",
        ),
    ],
)
def test_a_leader_counts_only_as_its_statefulsets_pod_of_its_group(
    name: str, index: str | None, reason: str
) -> None:
    """The leader StatefulSet vouches for its pods, not for their labels: before, another pod naming it as
    controller, labelled with any group, counted in that group as one more leader (and took a member's
    place); now a leader is its StatefulSet's pod `<name>-<index>` of its own index label, or never counts
    (settled), and so are the workers of one that is not."""
    leader = indexed(pod(name, ctl("StatefulSet", "leaders"), uid="pod-leader"), index)
    got = membership(LWS, leader, by_uid(LINKS), {})
    assert got == Membership(not reason, reason) and got.settled == bool(reason)
    worker = indexed(pod("w", ctl("StatefulSet", "workers")), index)
    got = membership(LWS, worker, by_uid(LINKS), {"pod-leader": leader})
    assert got == Membership(not reason, reason and f"its leader pod: {reason}")


@pytest.mark.parametrize(
    ("index", "replicas", "member"),
    [
        ("0", 1, True),
        ("1", 1, False),
        ("2", 3, True),
        ("3", 3, False),
        ("0", 0, False),  # scaled to zero: no group is its
        ("10", 9, False),
        ("9", 10, True),
        ("9" * 5000, 2**31 - 1, False),  # compared as digits: never int() of thousands of them
    ],
)
def test_a_leader_counts_only_in_a_group_its_leaderworkerset_has(
    index: str, replicas: int, member: bool
) -> None:
    """The LeaderWorkerSet vouches for how many groups it has: a leader of an index past its spec.replicas
    (forged, or of a group scaled away) is no member, settled, and neither are its workers."""
    owner = dataclasses.replace(LWS, groups=replicas)
    leader = indexed(pod(f"x-{index}", ctl("StatefulSet", "leaders"), uid="pod-leader"), index)
    said = f"names no group of LeaderWorkerSet ml/l (spec.replicas is {replicas})"
    reason = "" if member else f"its {INDEX} label ({index[:63]!r}) {said}"
    got = membership(owner, leader, by_uid(LINKS), {})
    assert got == Membership(member, reason) and got.settled == (not member)
    worker = indexed(pod("w", ctl("StatefulSet", "workers")), index)
    got = membership(owner, worker, by_uid(LINKS), {"pod-leader": leader})
    assert got == Membership(member, reason and f"its leader pod: {reason}") and got.settled == (not member)


@pytest.mark.parametrize(
    ("spec", "groups"),
    [
        ({}, 1),  # the LWS API's default
        ({"replicas": 0}, 0),
        ({"replicas": 4}, 4),
        ({"replicas": 500000}, 500000),  # groups, not pods: past the largest group is fine
        ({"replicas": "2"}, "spec.replicas must be an integer, got str"),
        ({"replicas": True}, "spec.replicas must be an integer, got bool"),
        ({"replicas": -1}, "spec.replicas must be between 0 and 2147483647, got -1"),
        ({"replicas": 2**31}, "spec.replicas must be between 0 and 2147483647, got 2147483648"),
    ],
)
def test_a_leaderworkersets_groups_are_its_spec_replicas(spec: dict[str, Any], groups: int | str) -> None:
    obj = {"metadata": {"name": "l", "uid": "lw"}, "spec": {**spec, "leaderWorkerTemplate": {"size": 2}}}
    if isinstance(groups, int):
        assert owner_groups(LWS.ref, obj) == groups
    else:
        with pytest.raises(OwnerError, match=groups):
            owner_groups(LWS.ref, obj)
    assert owner_groups(JOBSET.ref, obj) is None


def test_a_worker_whose_leaders_statefulset_is_unread_waits_on_it() -> None:
    links = {k: v for k, v in LINKS.items() if k != "leaders"}
    got = membership(LWS, indexed(pod("w", ctl("StatefulSet", "workers")), "0"), by_uid(links), PODS)
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


async def jobs_read(k: RunningAPI, n: int) -> tuple[ChainReader, list[float], list[dict[str, Any]]]:
    """`n` Jobs of the JobSet, a reader on a clock the test moves, and a pod naming each Job."""
    k.api.declare("batch/v1/jobs", kind="Job", namespaced=True)
    uids = [k.api.put_object("batch/v1/jobs", job(f"j{i}", "js"))["metadata"]["uid"] for i in range(n)]
    now = [1000.0]
    reader = ChainReader(load_client(k.kubeconfig), lambda: now[0], retry_s=5.0)
    return reader, now, [pod(f"p{i}", ctl("Job", uids[i], f"j{i}")) for i in range(n)]


def members(reader: ChainReader, pods: list[dict[str, Any]]) -> list[bool]:
    return [membership(JOBSET, p, reader.lookup, {}).member for p in pods]


@pytest.mark.parametrize("answer", [503, 429, b"<html>"])
async def test_while_the_api_server_fails_one_probe_a_step_reads_for_every_name(answer: int | bytes) -> None:
    """20 names while every read fails: before, the kind's probe failing let every name be read at each
    backoff step (20 GETs a step); now one probe a step, and once it is answered every name is read."""
    n = 20
    async with running_api([model.placement_crd()]) as k:
        reader, now, pods = await jobs_read(k, n)
        switch = refusing_jobs(k, NS, answer)
        await reader.resolve(JOBSET, pods, {})
        assert switch["refused"] == 1
        got = membership(JOBSET, pods[7], reader.lookup, {})
        assert not got.member and not got.settled
        assert got.reason.endswith("every read waits on one probe while the API server fails)"), got.reason
        await reader.resolve(JOBSET, pods, {})
        assert switch["refused"] == 1  # nothing read before the backoff is over
        for step in range(1, 4):
            now[0] += 61.0  # past the longest backoff: every name due again
            await reader.resolve(JOBSET, pods, {})
            assert switch["refused"] == 1 + step  # one probe a step: was 20 a step
        switch["on"] = 0
        now[0] += 61.0
        await reader.resolve(JOBSET, pods, {})
        assert k.api.count("GET", "batch/v1/jobs", "get") == n  # the probe, then every other name
        assert members(reader, pods) == [True] * n


async def test_an_outage_after_reads_went_well_stops_the_reads_of_a_pass_and_then_probes() -> None:
    """The kind was read before the API server began to fail: the first failure of a pass stops the reads
    not sent yet (at most one per worker thread are in flight, never each of the 40), then one probe a
    step; a 403 or 404 answered to a probe ends the outage."""
    n = 40
    async with running_api([model.placement_crd()]) as k:
        reader, now, pods = await jobs_read(k, n + 1)
        await reader.resolve(JOBSET, pods[:1], {})
        assert members(reader, pods[:1]) == [True]
        switch = refusing_jobs(k, NS, 503)
        await reader.resolve(JOBSET, pods[1:], {})
        first = switch["refused"]
        assert 1 <= first < n
        assert members(reader, pods) == [True] + [False] * n
        now[0] += 61.0
        await reader.resolve(JOBSET, pods, {})
        assert switch["refused"] == first + 1
        switch["on"] = 0
        now[0] += 61.0
        await reader.resolve(JOBSET, pods, {})
        assert k.api.count("GET", "batch/v1/jobs", "get") == n + 1
        assert members(reader, pods) == [True] * (n + 1)


async def test_reads_not_answered_in_time_cost_one_probe_a_step() -> None:
    n = 5
    async with running_api([model.placement_crd()]) as k, stalling_proxy(k) as proxy:
        k.api.declare("batch/v1/jobs", kind="Job", namespaced=True)
        uids = [k.api.put_object("batch/v1/jobs", job(f"j{i}", "js"))["metadata"]["uid"] for i in range(n)]
        proxy.stall = lambda request: "/jobs/" in request.path
        with tempfile.TemporaryDirectory() as d:
            api = load_client(write_kubeconfig(proxy.url, d))
        now = [1000.0]
        reader = ChainReader(api, lambda: now[0], timeout=(2.0, 0.3))
        pods = [pod(f"p{i}", ctl("Job", uids[i], f"j{i}")) for i in range(n)]
        await reader.resolve(JOBSET, pods, {})
        assert proxy.stalled == 1
        for step in range(1, 3):
            now[0] += 61.0
            await reader.resolve(JOBSET, pods, {})
            assert proxy.stalled == 1 + step  # one probe a step: was 5 a step
        assert not any(members(reader, pods))
        proxy.stall = lambda request: False
        proxy.unstall()
        now[0] += 61.0
        await reader.resolve(JOBSET, pods, {})
        assert k.api.count("GET", "batch/v1/jobs", "get") == n
        assert members(reader, pods) == [True] * n


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (404, "Job ml/j1 not found"),
        (403, "Job ml/j2 could not be read (HTTP 403: every Job of namespace ml is refused)"),
    ],
)
async def test_a_probe_answered_not_found_or_refused_ends_the_outage(answer: int, said: str) -> None:
    """The API server answers the probe (not found, or a refusal): the outage is over. Not found settles
    that name and the others are read; a refusal holds the kind there behind its own probe instead."""
    n = 5
    async with running_api([model.placement_crd()]) as k:
        reader, now, pods = await jobs_read(k, n)
        switch = refusing_jobs(k, NS, 503)
        await reader.resolve(JOBSET, pods, {})
        assert switch["refused"] == 1  # j0 failed: the outage's probes are the other names
        switch["on"] = 0
        failing_one(k, "/jobs/j1", answer)
        now[0] += 61.0
        await reader.resolve(JOBSET, pods, {})
        if answer == 404:
            assert membership(JOBSET, pods[1], reader.lookup, {}) == Membership(False, said)
            assert members(reader, pods) == [True, False, True, True, True]
            assert k.api.count("GET", "batch/v1/jobs", "get") == n - 1
        else:
            assert k.api.count("GET", "batch/v1/jobs", "get") == 0
            assert membership(JOBSET, pods[2], reader.lookup, {}).reason == said


async def test_a_name_known_to_fail_alone_never_stops_the_other_reads_of_its_hop() -> None:
    """j0 fails alone (HTTP 500 for it, the API fine): read again on its own backoff beside 40 names not
    read yet, its failure stopped every read of the hop not sent yet (each left out, read again 5 s
    later). Now all 41 are sent, and the 40 are answered in that pass."""
    n = 40
    async with running_api([model.placement_crd()]) as k:
        reader, now, pods = await jobs_read(k, n + 1)
        broken = failing_one(k, "/jobs/j0")
        await reader.resolve(JOBSET, pods[:1], {})  # j0 fails: the API server may be failing
        now[0] += 61.0
        # j1, the probe, answered: the outage is over, and j0, due, read again in the next hop fails alone.
        await reader.resolve(JOBSET, pods[:2], {})
        assert members(reader, pods[:2]) == [False, True] and broken() == 2
        assert reader.outage is None and {n[2] for n in reader.lone} == {"j0"}
        now[0] += 61.0
        await reader.resolve(JOBSET, pods, {})  # j0 due again, in one hop with j2..j40
        assert broken() == 3
        assert k.api.count("GET", "batch/v1/jobs", "get") == n  # j1, then every other name
        assert members(reader, pods) == [False] + [True] * n
        got = membership(JOBSET, pods[0], reader.lookup, {})
        assert got.reason == "Job ml/j0 could not be read (HTTP 500)", got.reason


async def test_names_known_to_fail_alone_cost_bounded_reads_when_the_api_server_fails() -> None:
    """20 Jobs became known to fail alone (each HTTP 500 while another name was answered), then the API
    server fails every read: before, each backoff step sent all 20 (none stopped another, and failing
    only names known to fail, no outage began); now one failing stops those not sent yet (at most one per
    worker thread in flight), and those left out go first at the next step, so none waits for good."""
    n = 20
    async with running_api([model.placement_crd()]) as k:
        reader, now, pods = await jobs_read(k, 2 * n + 1)
        broken, healthy = pods[1 : n + 1], pods[n + 1 :]
        fail = {"all": False}
        names = tuple(f"/jobs/j{i}" for i in range(1, n + 1))
        hits: dict[int, str] = {}  # request id -> the Job name: kmock asks about past requests again
        asked = [-1]

        def matches(req: Any) -> bool:
            method = str(getattr(req.method, "value", req.method)).upper()
            path = req.url.path
            if req.id <= asked[0]:
                return req.id in hits
            asked[0] = req.id
            hit = method == "GET" and "/jobs/" in path and (fail["all"] or path.endswith(names))
            if hit:
                hits[req.id] = path.rsplit("/", 1)[1]
            return hit

        k.api[matches] << 500
        await reader.resolve(JOBSET, pods[:1], {})  # the kind read once: its names read without a probe
        for fine in healthy:
            if len(reader.lone) == n:
                break
            now[0] += 61.0
            await reader.resolve(JOBSET, [fine, *broken], {})  # `fine` answered: the others fail alone
        assert {m[2] for m in reader.lone} == {f"j{i}" for i in range(1, n + 1)}
        fail["all"] = True
        sent: set[str] = set()
        for _step in range(n):
            before = asked[0]
            now[0] += 61.0
            await reader.resolve(JOBSET, broken, {})
            step = [name for i, name in hits.items() if i > before]
            assert 1 <= len(step) < n, step  # was all 20 at every step
            sent |= set(step)
        assert sent == {f"j{i}" for i in range(1, n + 1)}  # each read in turn: none left out for good
