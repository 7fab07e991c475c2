"""Forged chains of controllers up to a JobSet or LeaderWorkerSet, through the placement controller against
the embedded API over real HTTP: a Job of another namespace that a cached read
vouched for, a name that is another object's, a cycle through a worker pod, bodies that are not objects,
a re-created Job or JobSet, a forged bound pod beside a Bound group, and what a namespace of forged pods
costs in reads."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from admission_world import GATE, NS, World, eventually, placement
from test_admission_owner_chain import (
    JOBS,
    JOBSETS,
    LWSS,
    STS,
    chain_world,
    counted,
    ghost,
    jobset,
    jobset_job,
    jobset_pod,
    lws,
    lws_pod,
    ref,
    refusing,
    sts,
    thing,
)

from nodefabric_operator.admission.writer import DECISION_EVERY_S
from nodefabric_operator.demo.kubeapi import RunningAPI

OTHER = "evil"


async def create_in(w: World, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` created in `namespace` (World.create makes everything in NS); the object as stored."""
    obj["metadata"]["namespace"] = namespace
    if obj["kind"] == "Pod":
        return dict((await asyncio.to_thread(w.core.create_namespaced_pod, namespace, obj)).to_dict())
    group, version = obj["apiVersion"].split("/")
    plural = obj["kind"].lower() + "s"
    return dict(
        await asyncio.to_thread(
            w.custom.create_namespaced_custom_object, group, version, namespace, plural, obj
        )
    )


def controller(obj: dict[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }


def lag(k: RunningAPI, obj: dict[str, Any]) -> None:
    """`obj` put back as garbage collection leaves it until it gets to it: still naming a deleted owner
    (the embedded API collects at once)."""
    k.api.put_object(JOBS if obj["kind"] == "Job" else "v1/pods", obj)


async def passes(k: RunningAPI, ctl: Any, n: int = 2) -> None:
    """`n` more full passes of the loop (woken, not waited for by time)."""
    start = ctl.passes
    for _ in range(n):
        ctl.wake.set()
        await asyncio.sleep(0.05)
    await eventually(lambda: ctl.passes >= start + n, what=f"{n} passes")


# --- forgeries -------------------------------------------------------------------------------------------


async def test_a_job_of_another_namespace_never_vouches_through_what_was_read_there() -> None:
    """A Job in namespace `evil` names the JobSet of `ml` as its controller (ownerReferences are
    namespace-local: it is no Job of that JobSet). Read there for a group of `evil`, it must not make a pod
    of `ml` that names its uid a member of the JobSet in `ml`."""
    async with chain_world() as (k, w), placement(k):
        await w.create(jobset("llm", 2, 1))
        js = ref(w, JOBSETS, "JobSet", "llm")
        await create_in(w, OTHER, jobset("bait", 1, 1))
        trojan = await create_in(w, OTHER, thing(JOBS, "Job", "trojan", {"parallelism": 1}, js))
        trojan_ref = controller(trojan, "batch/v1", "Job")
        bait_pod = jobset_pod("bait-0", "bait", trojan_ref)
        await create_in(w, OTHER, bait_pod)
        bait_key = f"{OTHER}/jobset/bait"
        got = lambda: k.api.stored("placement.gpustack.ai/v1alpha1/placementgroups", "jobset-bait", OTHER)  # noqa: E731
        await eventually(
            lambda: got() is not None and (got().get("status") or {}).get("decision"), what=bait_key
        )
        assert counted(k, JOBS)() >= 1  # the trojan Job was read, for the group of `evil`
        job0 = await jobset_job(w, "llm", 0)
        key = f"{NS}/jobset/llm"
        await w.create(jobset_pod("llm-w-0-0", "llm", job0), jobset_pod("fake", "llm", trojan_ref))
        await eventually(
            lambda: "fake" in w.status(key).get("decision", "") or w.status(key).get("phase") == "Admitted",
            what="the fake pod decided",
        )
        job1 = await jobset_job(w, "llm", 1)
        await w.create(jobset_pod("llm-w-1-0", "llm", job1))
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["llm-w-0-0", "llm-w-1-0"]
        assert w.gates("fake") == [GATE] and not w.pinned("fake")


async def test_a_wrong_name_for_a_genuine_uid_never_keeps_the_genuine_pods_out() -> None:
    """A pod naming the genuine Job's uid under another name (read first: not found) must not stand for
    the genuine Job: its own pods, naming it rightly, are members."""
    async with chain_world() as (k, w), placement(k):
        await w.create(jobset("llm", 1, 2))
        job = await jobset_job(w, "llm", 0)
        key = f"{NS}/jobset/llm"
        await w.create(jobset_pod("fake", "llm", {**job, "name": "nowhere"}))
        await eventually(lambda: "fake" in w.status(key).get("decision", ""), what="the fake pod read")
        await w.create(*(jobset_pod(f"llm-w-0-{j}", "llm", job) for j in range(2)))
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["llm-w-0-0", "llm-w-0-1"]


async def test_a_cycle_through_a_worker_pod_and_wrong_kinds_never_count() -> None:
    """A pod controlled by a StatefulSet controlled by that very pod; a pod naming the genuine worker
    StatefulSet's uid as another kind or apiVersion."""
    async with chain_world() as (k, w), placement(k):
        await w.create(lws("lws", 2))
        await w.create(sts("lws", ref(w, LWSS, "LeaderWorkerSet", "lws")))
        await w.create(lws_pod("lws-0", ref(w, STS, "StatefulSet", "lws")))
        await w.create(sts("lws-0", ref(w, "v1/pods", "Pod", "lws-0"), 2))
        workers = ref(w, STS, "StatefulSet", "lws-0")
        # The cycle: a pod named and uid'd ahead is not possible, so the StatefulSet names the pod after.
        await w.create(lws_pod("loop", None))
        await w.create(sts("loop-sts", ref(w, "v1/pods", "Pod", "loop")))
        loop_sts = ref(w, STS, "StatefulSet", "loop-sts")
        await asyncio.to_thread(
            w.core.patch_namespaced_pod, "loop", NS, {"metadata": {"ownerReferences": [loop_sts]}}
        )
        await w.create(
            lws_pod("fake-kind", {**workers, "kind": "ReplicaSet"}),
            lws_pod("fake-api", {**workers, "apiVersion": "apps/v2"}),
        )
        key = f"{NS}/leaderworkerset/lws-0"
        await eventually(lambda: "1 of 2 exist" in w.status(key).get("decision", ""), what="1 of 2")
        await w.create(lws_pod("lws-0-1", workers))
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["lws-0", "lws-0-1"]
        for fake in ("loop", "fake-kind", "fake-api"):
            assert w.gates(fake) == [GATE], fake


@pytest.mark.parametrize(
    "body",
    [b"[1, 2]", b'"a string"', b'{"metadata": null}', b'{"metadata": {"uid": 7, "ownerReferences": 3}}'],
)
async def test_a_job_read_as_garbage_never_vouches_and_is_said(body: bytes) -> None:
    async with chain_world() as (k, w), placement(k):
        await w.create(jobset("llm", 1, 1))
        job = await jobset_job(w, "llm", 0)
        switch = refusing(k, "/jobs/llm-w-0", body)
        key = f"{NS}/jobset/llm"
        await w.create(jobset_pod("llm-w-0-0", "llm", job))
        said = "pod llm-w-0-0 (Job ml/llm-w-0 could not be read ("
        await eventually(lambda: said in w.status(key).get("decision", ""), what="the reason on the group")
        assert w.status(key)["members"] == [] and w.gates("llm-w-0-0") == [GATE]
        switch["on"] = False
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")


# --- re-created owners -----------------------------------------------------------------------------------


async def test_a_recreated_jobs_new_pods_count_and_its_old_ones_no_longer() -> None:
    """A Job deleted and made again under its name (a new uid), its old pod still there (garbage collection
    not done with it yet): the old pod names a Job that is gone, the new one the Job that is."""
    async with chain_world() as (k, w), placement(k):
        await w.create(jobset("llm", 1, 2))
        old = await jobset_job(w, "llm", 0)
        key = f"{NS}/jobset/llm"
        await w.create(jobset_pod("old-0", "llm", old))
        await eventually(lambda: "1 of 2 exist" in w.status(key).get("decision", ""), what="old-0 counted")
        await asyncio.to_thread(
            w.custom.delete_namespaced_custom_object, "batch", "v1", NS, "jobs", "llm-w-0"
        )
        # Garbage collection not done with the old pod yet: it is there, naming the deleted Job.
        lag(k, jobset_pod("old-0", "llm", old))
        new = await jobset_job(w, "llm", 0)
        assert new["uid"] != old["uid"]
        await w.create(jobset_pod("new-0", "llm", new))
        await eventually(
            lambda: "new-0" in [m["pod"] for m in w.status(key).get("members", [])], what="new-0"
        )
        await w.create(jobset_pod("new-1", "llm", new))
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["new-0", "new-1"]
        assert w.gates("old-0") == [GATE] and not w.pinned("old-0")


async def test_a_recreated_jobsets_old_pods_never_count() -> None:
    """A JobSet deleted and made again under its name, while its old Job and pod are still there."""
    async with chain_world() as (k, w), placement(k):
        await w.create(jobset("llm", 1, 2))
        old_js = ref(w, JOBSETS, "JobSet", "llm")
        old = await jobset_job(w, "llm", 0)
        key = f"{NS}/jobset/llm"
        await w.create(jobset_pod("old-0", "llm", old))
        await eventually(lambda: "1 of 2 exist" in w.status(key).get("decision", ""), what="old-0 counted")
        await asyncio.to_thread(
            w.custom.delete_namespaced_custom_object, "jobset.x-k8s.io", "v1alpha2", NS, "jobsets", "llm"
        )
        # Garbage collection not done with the old Job and pod yet.
        lag(k, thing(JOBS, "Job", "llm-w-0", {"parallelism": 2}, old_js))
        lag(k, jobset_pod("old-0", "llm", ref(w, JOBS, "Job", "llm-w-0")))
        await w.create(jobset("llm", 1, 2))
        js = ref(w, JOBSETS, "JobSet", "llm")
        await w.create(thing(JOBS, "Job", "llm-v2-0", {"parallelism": 2}, js))
        job = ref(w, JOBS, "Job", "llm-v2-0")
        await w.create(jobset_pod("new-0", "llm", job))
        await eventually(
            lambda: "new-0" in [m["pod"] for m in w.status(key).get("members", [])], what="new-0"
        )
        await w.create(jobset_pod("new-1", "llm", job))
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["new-0", "new-1"]
        assert w.gates("old-0") == [GATE] and not w.pinned("old-0")


# --- Bound groups ----------------------------------------------------------------------------------------


async def test_a_forged_bound_pod_never_takes_a_bound_groups_slot() -> None:
    """A Bound JobSet group loses a member; its replacement is admitted even with a pod beside it carrying
    the JobSet's label, bound by hand, that no Job of the JobSet controls."""
    async with chain_world() as (k, w), placement(k):
        await w.create(jobset("llm", 2, 1))
        jobs = [await jobset_job(w, "llm", i) for i in range(2)]
        key = f"{NS}/jobset/llm"
        await w.create(*(jobset_pod(f"llm-w-{i}-0", "llm", jobs[i]) for i in range(2)))
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        for i in range(2):
            await eventually(lambda i=i: w.pinned(f"llm-w-{i}-0"), what="pinned")
            await w.bind_and_ready(f"llm-w-{i}-0")
        await eventually(lambda: w.status(key).get("phase") == "Bound", what="Bound")
        fake = jobset_pod("fake", "llm", None)
        del fake["spec"]["schedulingGates"]
        fake["spec"]["nodeName"] = w.pinned("llm-w-0-0")[0]
        await w.create(fake)
        await w.delete("llm-w-1-0")
        await w.create(jobset_pod("llm-w-1-0b", "llm", jobs[1]))
        await eventually(lambda: w.gates("llm-w-1-0b") == [], what="the replacement released")
        members = [m["pod"] for m in w.status(key)["members"]]
        assert "fake" not in members and "llm-w-1-0b" in members


# --- PlacementGroups of a deleted owner ------------------------------------------------------------------


async def test_a_deleted_owners_placementgroup_is_not_written_back() -> None:
    """The owner deleted: garbage collection deletes its PlacementGroup (owned by it) and its pods, maybe
    after. The PlacementGroup is not created again for pods about to go (it would be collected again)."""
    async with chain_world() as (k, w), placement(k) as ctl:
        await w.create(jobset("llm", 1, 2), jobset("keeper", 1, 1))
        # The Job has a second owner, so that collection leaves it, and its pods, for now.
        keeper = {**ref(w, JOBSETS, "JobSet", "keeper"), "controller": False}
        job_obj = thing(JOBS, "Job", "llm-w-0", {"parallelism": 2}, ref(w, JOBSETS, "JobSet", "llm"))
        job_obj["metadata"]["ownerReferences"].append(keeper)
        await w.create(job_obj)
        job = ref(w, JOBS, "Job", "llm-w-0")
        key = f"{NS}/jobset/llm"
        await w.create(*(jobset_pod(f"llm-w-0-{j}", "llm", job) for j in range(2)))
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        for j in range(2):
            await eventually(lambda j=j: w.pinned(f"llm-w-0-{j}"), what="pinned")
            await w.bind_and_ready(f"llm-w-0-{j}")
        await eventually(lambda: w.status(key).get("phase") == "Bound", what="Bound")
        pg = w.pg(key)
        assert pg is not None and pg["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
        creates = k.api.count("POST", "placement.gpustack.ai/v1alpha1/placementgroups", "create")
        await asyncio.to_thread(
            w.custom.delete_namespaced_custom_object, "jobset.x-k8s.io", "v1alpha2", NS, "jobsets", "llm"
        )
        assert w.pg(key) is None  # collected with its owner
        assert w.pod("llm-w-0-0") and w.pod("llm-w-0-1")  # the pods not yet
        name = pg["metadata"]["name"]
        await eventually(lambda: name not in {n for _, n in ctl.tables.pgs}, what="seen gone")
        await passes(k, ctl, 3)
        assert w.pg(key) is None
        assert k.api.count("POST", "placement.gpustack.ai/v1alpha1/placementgroups", "create") == creates


async def test_a_placementgroup_deleted_by_hand_is_still_written_back() -> None:
    """Its owner still there: the PlacementGroup of a bound group deleted by hand is written again."""
    async with chain_world() as (k, w), placement(k):
        await w.create(jobset("llm", 1, 1))
        job = await jobset_job(w, "llm", 0)
        key = f"{NS}/jobset/llm"
        await w.create(jobset_pod("llm-w-0-0", "llm", job))
        await eventually(lambda: w.pinned("llm-w-0-0"), what="pinned")
        await w.bind_and_ready("llm-w-0-0")
        await eventually(lambda: w.status(key).get("phase") == "Bound", what="Bound")
        pg = w.pg(key)
        assert pg is not None
        await asyncio.to_thread(
            w.custom.delete_namespaced_custom_object,
            "placement.gpustack.ai",
            "v1alpha1",
            NS,
            "placementgroups",
            pg["metadata"]["name"],
        )
        await eventually(lambda: w.status(key).get("phase") == "Bound", what="written again")
        assert [m["pod"] for m in w.status(key)["members"]] == ["llm-w-0-0"]


# --- what forged pods cost -------------------------------------------------------------------------------


async def test_forged_pods_naming_missing_jobs_are_read_once_never_once_per_pass() -> None:
    """Pods naming Jobs that do not exist: each reference is read once (one GET per name in a pass,
    however many pods and uids name it) and never again (a Job made later under that name has another
    uid), however long the group waits: before, each one was read again every SIZE_TTL_S."""
    now = [time.time()]
    async with chain_world() as (k, w), placement(k, clock=lambda: now[0]) as ctl:
        await w.create(jobset("llm", 1, 2))
        job = await jobset_job(w, "llm", 0)
        key = f"{NS}/jobset/llm"
        forged = [
            jobset_pod(f"ghost-{i}", "llm", {**ghost("Job"), "name": f"g{i % 20}", "uid": f"u{i}"})
            for i in range(30)
        ]
        await w.create(jobset_pod("llm-w-0-0", "llm", job), *forged)
        await eventually(lambda: "and 25 more" in w.status(key).get("decision", ""), what="every pod read")
        first = counted(k, JOBS)()
        assert 21 <= first <= 31  # the Job; each of the twenty names at least once, no reference twice
        for _ in range(3):
            owner_reads = counted(k, JOBSETS)()
            now[0] += 6.0
            await eventually(
                lambda n=owner_reads: (ctl.wake.set(), counted(k, JOBSETS)() > n)[1],
                what="the owner read again",
            )
            await passes(k, ctl, 2)
        assert counted(k, JOBS)() == first


async def test_forged_pods_past_the_bound_are_not_read_again_on_every_pass() -> None:
    """Two waiting groups whose pods name more objects than the reader keeps (the bound lowered here
    from 4096): what a pod still there names is kept past the bound, or each group's pass would read
    again what the other's pushed out, every SIZE_TTL_S."""
    now = [time.time()]
    async with chain_world() as (k, w), placement(k, clock=lambda: now[0]) as ctl:
        ctl.grouping.chain.limit = 8
        for js in ("a", "b"):
            await w.create(jobset(js, 1, 2))
            job = await jobset_job(w, js, 0)
            forged = [
                jobset_pod(f"{js}-ghost-{i}", js, {**ghost("Job"), "name": f"{js}{i}", "uid": f"{js}{i}"})
                for i in range(10)
            ]
            await w.create(jobset_pod(f"{js}-w-0-0", js, job), *forged)
        for js in ("a", "b"):
            await eventually(
                lambda js=js: "and 5 more" in w.status(f"{NS}/jobset/{js}").get("decision", ""), what=js
            )
        first = counted(k, JOBS)()
        for _ in range(3):
            owner_reads = counted(k, JOBSETS)()
            now[0] += 6.0
            await eventually(
                lambda n=owner_reads: (ctl.wake.set(), counted(k, JOBSETS)() >= n + 2)[1],
                what="owners read again",
            )
            await passes(k, ctl, 2)
        assert counted(k, JOBS)() == first


async def test_pods_naming_missing_jobs_are_named_but_never_told() -> None:
    """The decision names them (not counted), but neither its Event nor its annotation goes to them: made
    one after another by the thousand, each would be told every decision that names them (300 such pods
    cost 13,904 pod PATCHes and 6,543 Events)."""
    now = [time.time()]
    async with chain_world() as (k, w), placement(k, clock=lambda: now[0]) as ctl:
        await w.create(jobset("llm", 1, 2))
        job = await jobset_job(w, "llm", 0)
        key = f"{NS}/jobset/llm"
        await w.create(jobset_pod("llm-w-0-0", "llm", job))
        for i in range(12):
            await w.create(jobset_pod(f"ghost-{i}", "llm", {**ghost("Job"), "name": f"g{i}", "uid": f"u{i}"}))
        note = "placement.gpustack.ai/decision"
        said = "and 7 more"
        await eventually(lambda: said in w.status(key).get("decision", ""), what="every pod read")
        now[0] += DECISION_EVERY_S  # the latest text of a decision of the same kind, once it is due
        await eventually(
            lambda: said in w.pod("llm-w-0-0")["metadata"]["annotations"].get(note, ""), what="told"
        )
        await passes(k, ctl, 2)
        for i in range(12):
            assert note not in (w.pod(f"ghost-{i}")["metadata"].get("annotations") or {}), i
        assert not [e for e in w.events() if e[1].startswith("ghost-")]
