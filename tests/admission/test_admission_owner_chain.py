"""JobSet and LeaderWorkerSet groups count only the pods whose chain of controllers leads to their owner, by
uid, through the placement controller against the embedded API over real HTTP: a copied label, a Job or
StatefulSet of someone else's, a reference to an object that does not exist never takes a member's place;
an object of the chain that cannot be read leaves its pods out, said, and is read again later."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from admission_world import GATE, NS, World, eventually, fleet, gpod, placement

from nodefabric_operator.admission import model
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api

JOBS, STS = "batch/v1/jobs", "apps/v1/statefulsets"
JOBSETS, LWSS = "jobset.x-k8s.io/v1alpha2/jobsets", "leaderworkerset.x-k8s.io/v1/leaderworkersets"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
LWS_LABEL, LWS_INDEX = "leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/group-index"


def thing(
    key: str, kind: str, name: str, spec: dict[str, Any], owner: dict[str, Any] | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": key.rsplit("/", 1)[0], "kind": kind, "metadata": meta, "spec": spec}


def sts(name: str, owner: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    """A StatefulSet as the API holds it to be (a selector that selects its template)."""
    labels = {"app": name}
    template = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "c:1"}]}}
    spec = {"replicas": replicas, "selector": {"matchLabels": labels}, "template": template}
    return thing(STS, "StatefulSet", name, spec, owner)


def jobset(name: str, replicas: int, parallelism: int) -> dict[str, Any]:
    rj = {"name": "w", "replicas": replicas, "template": {"spec": {"parallelism": parallelism}}}
    return thing(JOBSETS, "JobSet", name, {"replicatedJobs": [rj]}, None)


def lws(name: str, size: int, replicas: int = 1) -> dict[str, Any]:
    spec = {"replicas": replicas, "leaderWorkerTemplate": {"size": size}}
    return thing(LWSS, "LeaderWorkerSet", name, spec, None)


def ref(w: World, key: str, kind: str, name: str) -> dict[str, Any]:
    """A controller reference to the stored object, as its controller sets it."""
    stored = w.pod(name) if key == "v1/pods" else w.k.api.stored(key, name, NS)
    assert stored is not None, name
    uid = stored["metadata"]["uid"]
    version = key.rsplit("/", 1)[0]
    return {"apiVersion": version, "kind": kind, "name": name, "uid": uid, "controller": True}


def ghost(kind: str) -> dict[str, Any]:
    version = "batch/v1" if kind == "Job" else "apps/v1"
    return {"apiVersion": version, "kind": kind, "name": "ghost", "uid": "0000-ghost", "controller": True}


@contextlib.asynccontextmanager
async def chain_world() -> AsyncIterator[tuple[RunningAPI, World]]:
    async with running_api([model.placement_crd()]) as k:
        for key, kind in (
            (JOBS, "Job"),
            (STS, "StatefulSet"),
            (JOBSETS, "JobSet"),
            (LWSS, "LeaderWorkerSet"),
        ):
            k.api.declare(key, kind=kind, namespaced=True)
        w = World(k)
        await w.create(*fleet())
        yield k, w


def refusing(k: RunningAPI, path_end: str, answer: int | bytes) -> dict[str, bool]:
    """GETs of the object at `path_end` answered with `answer` while the returned switch is on."""
    switch = {"on": True}

    def matches(req: Any) -> bool:
        return (
            switch["on"]
            and str(getattr(req.method, "value", req.method)).upper() == "GET"
            and req.url.path.endswith(path_end)
        )

    k.api[matches] << answer
    return switch


def counted(k: RunningAPI, key: str) -> Callable[[], int]:
    return lambda: k.api.count("GET", key, "get")


# --- JobSet ----------------------------------------------------------------------------------------------


async def jobset_job(w: World, js: str, i: int) -> dict[str, Any]:
    """Job `<js>-w-<i>` controlled by the JobSet, created; returns a controller reference to it."""
    name = f"{js}-w-{i}"
    await w.create(thing(JOBS, "Job", name, {"parallelism": 1}, ref(w, JOBSETS, "JobSet", js)))
    return ref(w, JOBS, "Job", name)


def jobset_pod(name: str, js: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    return gpod(name, labels={JOBSET_LABEL: js}, owner=owner)


async def test_a_jobsets_own_pods_are_admitted_each_job_read_once() -> None:
    async with chain_world() as (k, w), placement(k):
        await w.create(jobset("llm", 2, 2))
        jobs = [await jobset_job(w, "llm", i) for i in range(2)]
        key = f"{NS}/jobset/llm"
        pods = [jobset_pod(f"llm-w-{i}-{j}", "llm", jobs[i]) for i in range(2) for j in range(2)]
        await w.create(*pods[:3])
        await eventually(lambda: "3 of 4 exist" in w.status(key).get("decision", ""), what="3 of 4")
        await w.create(pods[3])
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        assert sorted(m["pod"] for m in w.status(key)["members"]) == sorted(
            p["metadata"]["name"] for p in pods
        )
        # Two decisions over four pods: each Job read once, by the uid its pods name.
        assert counted(k, JOBS)() == 2


async def test_copied_labels_and_forged_chains_never_count_for_a_jobset() -> None:
    async with chain_world() as (k, w), placement(k):
        await w.create(jobset("llm", 2, 1), jobset("other", 1, 1))
        other = await jobset_job(w, "other", 0)
        jobs = [await jobset_job(w, "llm", i) for i in range(2)]
        key = f"{NS}/jobset/llm"
        # Made first, gated, with the JobSet's label: (a) no controller, (b) the Job of another JobSet,
        # (c) a Job that does not exist.
        await w.create(
            jobset_pod("fake-a", "llm", None),
            jobset_pod("fake-b", "llm", other),
            jobset_pod("fake-c", "llm", ghost("Job")),
        )
        await w.create(jobset_pod("llm-w-0-0", "llm", jobs[0]))
        await eventually(lambda: "1 of 2 exist" in w.status(key).get("decision", ""), what="1 of 2")
        decision = w.status(key)["decision"]
        assert "not counted yet: pod fake-c (Job ml/ghost not found)" in decision
        assert "fake-a" not in decision and "fake-b" not in decision
        await w.create(jobset_pod("llm-w-1-0", "llm", jobs[1]))
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["llm-w-0-0", "llm-w-1-0"]
        for fake in ("fake-a", "fake-b", "fake-c"):
            assert w.gates(fake) == [GATE] and not w.pinned(fake), fake


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (403, "Job ml/llm-w-0 could not be read (HTTP 403)"),
        (b"<html>", "Job ml/llm-w-0 could not be read (Unsupported content type"),
    ],
)
async def test_an_unreadable_job_leaves_its_pods_out_said_and_is_read_again(
    answer: int | bytes, said: str
) -> None:
    async with chain_world() as (k, w), placement(k):
        await w.create(jobset("llm", 1, 2))
        job = await jobset_job(w, "llm", 0)
        switch = refusing(k, "/jobs/llm-w-0", answer)
        key = f"{NS}/jobset/llm"
        await w.create(*(jobset_pod(f"llm-w-0-{j}", "llm", job) for j in range(2)))
        # Both pods named: a decision made before the second pod reached the watch names the first only.
        await eventually(
            lambda: (
                said in w.status(key).get("decision", "")
                and "pod llm-w-0-1 (" in w.status(key).get("decision", "")
            ),
            what="the reason on the group, for both pods",
        )
        status = w.status(key)
        assert status["phase"] == "Waiting" and status["members"] == []
        assert "0 of 2 exist" in status["decision"]
        # Each pod left out is told, as the members are.
        note = "placement.gpustack.ai/decision"
        await eventually(lambda: said in w.pod("llm-w-0-0")["metadata"]["annotations"].get(note, ""))
        assert all(w.gates(f"llm-w-0-{j}") == [GATE] for j in range(2))
        switch["on"] = False  # the refusal lifted: read again, the pods count
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["llm-w-0-0", "llm-w-0-1"]


# --- LeaderWorkerSet -------------------------------------------------------------------------------------


def lws_pod(name: str, owner: dict[str, Any] | None, lws_name: str = "lws") -> dict[str, Any]:
    return gpod(name, labels={LWS_LABEL: lws_name, LWS_INDEX: "0"}, owner=owner)


async def lws_leader(w: World, name: str) -> None:
    """The LeaderWorkerSet's leader StatefulSet and its leader pod `<name>-0`, as the LWS controller makes
    them, and the worker StatefulSet `<name>-0` the leader pod controls."""
    await w.create(sts(name, ref(w, LWSS, "LeaderWorkerSet", name)))
    await w.create(lws_pod(f"{name}-0", ref(w, STS, "StatefulSet", name), name))
    await w.create(sts(f"{name}-0", ref(w, "v1/pods", "Pod", f"{name}-0"), 2))


async def test_a_leaderworkersets_own_pods_are_admitted_and_forgeries_never_count() -> None:
    async with chain_world() as (k, w), placement(k):
        await w.create(lws("lws", 3), lws("other", 2))
        await lws_leader(w, "other")
        # A StatefulSet controlled by a pod that is no leader (fake-a), as a worker's would be by its leader.
        await w.create(lws_pod("fake-a", None))
        await w.create(sts("rogue", ref(w, "v1/pods", "Pod", "fake-a")))
        # With the label: (a) no controller, (b) another LeaderWorkerSet's worker StatefulSet, (c) a
        # StatefulSet that does not exist, (d) the StatefulSet of a pod that is no leader.
        await w.create(
            lws_pod("fake-b", ref(w, STS, "StatefulSet", "other-0")),
            lws_pod("fake-c", ghost("StatefulSet")),
            lws_pod("fake-d", ref(w, STS, "StatefulSet", "rogue")),
        )
        await lws_leader(w, "lws")
        workers = ref(w, STS, "StatefulSet", "lws-0")
        await w.create(lws_pod("lws-0-1", workers))
        key = f"{NS}/leaderworkerset/lws-0"
        await eventually(lambda: "2 of 3 exist" in w.status(key).get("decision", ""), what="2 of 3")
        decision = w.status(key)["decision"]
        assert "not counted yet: pod fake-c (StatefulSet ml/ghost not found)" in decision
        assert not any(f"fake-{x}" in decision for x in "abd")
        await w.create(lws_pod("lws-0-2", workers))
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["lws-0", "lws-0-1", "lws-0-2"]
        for fake in ("fake-a", "fake-b", "fake-c", "fake-d"):
            assert w.gates(fake) == [GATE] and not w.pinned(fake), fake


async def test_an_unreadable_worker_statefulset_leaves_the_workers_out_until_read() -> None:
    async with chain_world() as (k, w), placement(k):
        await w.create(lws("lws", 3))
        switch = refusing(k, "/statefulsets/lws-0", 403)
        await lws_leader(w, "lws")
        workers = ref(w, STS, "StatefulSet", "lws-0")
        key = f"{NS}/leaderworkerset/lws-0"
        await w.create(lws_pod("lws-0-1", workers), lws_pod("lws-0-2", workers))
        said = "pod lws-0-1 (StatefulSet ml/lws-0 could not be read (HTTP 403))"
        # The count once both workers reached the watch (a decision may come between the two).
        await eventually(
            lambda: said in w.status(key).get("decision", "") and "1 of 3 exist" in w.status(key)["decision"],
            what="the reason on the group, both workers seen",
        )
        status = w.status(key)
        assert "1 of 3 exist" in status["decision"] and [m["pod"] for m in status["members"]] == ["lws-0"]
        switch["on"] = False
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["lws-0", "lws-0-1", "lws-0-2"]
        assert counted(k, STS)() == 2  # lws and lws-0, each read once it could be


async def test_a_worker_labelled_with_another_groups_index_never_counts_there() -> None:
    """A worker's group is named by its own group-index label: one of the lws-0 worker StatefulSet
    labelled 1 counted in group lws-1 before; now it is said never to count, and lws-0 is admitted."""
    async with chain_world() as (k, w), placement(k):
        await w.create(lws("lws", 2))
        await lws_leader(w, "lws")
        workers = ref(w, STS, "StatefulSet", "lws-0")
        await w.create(gpod("lws-0-9", labels={LWS_LABEL: "lws", LWS_INDEX: "1"}, owner=workers))
        stray = f"{NS}/leaderworkerset/lws-1"
        said = f"pod lws-0-9 (its {LWS_INDEX} label ('1') is not its leader pod's ('0'))"
        await eventually(lambda: said in w.status(stray).get("decision", ""), what="the stray worker said")
        assert "0 of 2 exist" in w.status(stray)["decision"] and w.status(stray)["members"] == []
        await w.create(lws_pod("lws-0-1", workers))
        key = f"{NS}/leaderworkerset/lws-0"
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["lws-0", "lws-0-1"]
        assert w.gates("lws-0-9") == [GATE] and not w.pinned("lws-0-9")


async def test_a_pod_of_the_leader_statefulset_labelled_with_another_index_never_counts_there() -> None:
    """A leader pod is its StatefulSet's pod `<lws>-<index>`: one more pod naming the leader StatefulSet as
    its controller, labelled with group 1, counted in group lws-1 before (the leader StatefulSet vouched
    for it) and took a member's place there; now it never counts, and lws-1 waits for its own."""
    async with chain_world() as (k, w), placement(k):
        await w.create(lws("lws", 2, replicas=2))
        await lws_leader(w, "lws")
        leaders = ref(w, STS, "StatefulSet", "lws")
        forged = gpod("lws-x", labels={LWS_LABEL: "lws", LWS_INDEX: "1"}, owner=leaders)
        real = gpod("lws-1", labels={LWS_LABEL: "lws", LWS_INDEX: "1"}, owner=leaders)
        await w.create(forged, real)
        key = f"{NS}/leaderworkerset/lws-1"
        said = f"pod lws-x (its {LWS_INDEX} label ('1') is not its ordinal in StatefulSet lws)"
        await eventually(lambda: said in w.status(key).get("decision", ""), what="the forged leader said")
        assert "1 of 2 exist" in w.status(key)["decision"]
        assert [m["pod"] for m in w.status(key)["members"]] == ["lws-1"]
        assert w.gates("lws-x") == [GATE] and not w.pinned("lws-x")


NO_GROUP_1 = f"its {LWS_INDEX} label ('1') names no group of LeaderWorkerSet ml/lws (spec.replicas is 1)"


async def scale(w: World, name: str, replicas: int) -> None:
    """The LeaderWorkerSet's spec.replicas set, as `kubectl scale` does."""
    await asyncio.to_thread(
        w.custom.patch_namespaced_custom_object,
        "leaderworkerset.x-k8s.io",
        "v1",
        NS,
        "leaderworkersets",
        name,
        {"spec": {"replicas": replicas}},
    )


async def read_again(ctl: Any, now: list[float], said: Callable[[], bool], what: str) -> None:
    """The owner's count past SIZE_TTL_S, read again on the next passes, until `said`."""
    now[0] += 6.0
    await eventually(lambda: (ctl.wake.set(), said())[1], what=what)


async def test_a_leader_of_a_group_the_leaderworkerset_does_not_have_never_counts() -> None:
    """The LeaderWorkerSet vouches for how many groups it has (spec.replicas): a pod `lws-1` of its leader
    StatefulSet, labelled group 1, with the LWS at one replica, made a group lws-1 that was admitted.
    Now it is said never to count (not told: forged by the thousand, each would be told every decision)
    and stays gated; scaled to two replicas, the LWS read again counts it."""
    now = [time.time()]
    async with chain_world() as (k, w), placement(k, clock=lambda: now[0]) as ctl:
        await w.create(lws("lws", 1))
        await lws_leader(w, "lws")
        await eventually(lambda: w.status(f"{NS}/leaderworkerset/lws-0").get("phase") == "Admitted")
        leaders = ref(w, STS, "StatefulSet", "lws")
        await w.create(gpod("lws-1", labels={LWS_LABEL: "lws", LWS_INDEX: "1"}, owner=leaders))
        key = f"{NS}/leaderworkerset/lws-1"
        said = f"pod lws-1 ({NO_GROUP_1})"
        await eventually(lambda: said in w.status(key).get("decision", ""), what="the group-less leader said")
        assert "0 of 1 exist" in w.status(key)["decision"] and w.status(key)["members"] == []
        assert w.gates("lws-1") == [GATE] and not w.pinned("lws-1")
        await ctl.publisher.drain()
        assert "placement.gpustack.ai/decision" not in (w.pod("lws-1")["metadata"].get("annotations") or {})
        assert not [e for e in w.events() if e[1] == "lws-1"]
        await scale(w, "lws", 2)
        await read_again(ctl, now, lambda: w.status(key).get("phase") == "Admitted", "lws-1 admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["lws-1"]


async def test_a_group_scaled_away_is_never_admitted_its_pods_stay_gated() -> None:
    """A LeaderWorkerSet scaled from two replicas to one: group 1 is being deleted, its pods maybe after
    its worker is made. Before, the group, complete, was admitted; now its pods are no members (its leader
    names no group of the LWS, its worker's leader neither) and stay gated, while group 0 is admitted."""
    now = [time.time()]
    async with chain_world() as (k, w), placement(k, clock=lambda: now[0]) as ctl:
        await w.create(lws("lws", 2, replicas=2))
        await lws_leader(w, "lws")
        leaders = ref(w, STS, "StatefulSet", "lws")
        await w.create(gpod("lws-1", labels={LWS_LABEL: "lws", LWS_INDEX: "1"}, owner=leaders))
        await w.create(sts("lws-1", ref(w, "v1/pods", "Pod", "lws-1"), 2))
        key = f"{NS}/leaderworkerset/lws-1"
        await eventually(lambda: "1 of 2 exist" in w.status(key).get("decision", ""), what="group 1 waits")
        await scale(w, "lws", 1)
        gone = f"pod lws-1 ({NO_GROUP_1})"
        await read_again(ctl, now, lambda: gone in w.status(key).get("decision", ""), "group 1 scaled away")
        w1 = gpod(
            "lws-1-1", labels={LWS_LABEL: "lws", LWS_INDEX: "1"}, owner=ref(w, STS, "StatefulSet", "lws-1")
        )
        await w.create(w1, lws_pod("lws-0-1", ref(w, STS, "StatefulSet", "lws-0")))
        await eventually(
            lambda: w.status(f"{NS}/leaderworkerset/lws-0").get("phase") == "Admitted",
            what="group 0 admitted",
        )
        worker = f"pod lws-1-1 (its leader pod: {NO_GROUP_1})"
        await eventually(lambda: worker in w.status(key).get("decision", ""), what="its worker said")
        start = ctl.passes
        await eventually(lambda: (ctl.wake.set(), ctl.passes >= start + 2)[1], what="two passes more")
        assert w.status(key).get("phase") == "Waiting" and w.status(key)["members"] == []
        for name in ("lws-1", "lws-1-1"):
            assert w.gates(name) == [GATE] and not w.pinned(name), name


@pytest.mark.parametrize("replicas", [None, "2", 2.0, True, -1, 2**31])
async def test_a_leaderworkerset_whose_spec_replicas_cannot_be_read_keeps_its_size(replicas: Any) -> None:
    """spec.replicas unreadable (a string, a float, out of int32): before, it threw away the LWS's
    leaderWorkerTemplate.size with it, and group 0 of pods declaring no size waited for ever, its size
    unknown. Now its size counts and its groups are not checked (as before spec.replicas was read)."""
    async with chain_world() as (k, w), placement(k):
        obj = lws("lws", 1)
        obj["spec"]["replicas"] = replicas
        await w.create(obj)
        await lws_leader(w, "lws")
        key = f"{NS}/leaderworkerset/lws-0"
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="group 0 admitted")
        assert [m["pod"] for m in w.status(key)["members"]] == ["lws-0"]


async def test_a_bound_group_scaled_away_stays_bound_its_replacement_pod_gated() -> None:
    """Group 1 bound and Ready, then the LWS scaled to one replica: its pods are the LWS controller's to
    delete. A worker replaced meanwhile (its StatefulSet not collected yet) is no member and stays gated,
    and the group's PlacementGroup is not undone (still Bound, its members kept)."""
    now = [time.time()]
    async with chain_world() as (k, w), placement(k, clock=lambda: now[0]) as ctl:
        await w.create(lws("lws", 2, replicas=2))
        await lws_leader(w, "lws")
        leaders = ref(w, STS, "StatefulSet", "lws")
        await w.create(gpod("lws-1", labels={LWS_LABEL: "lws", LWS_INDEX: "1"}, owner=leaders))
        await w.create(sts("lws-1", ref(w, "v1/pods", "Pod", "lws-1"), 2))
        workers = ref(w, STS, "StatefulSet", "lws-1")
        await w.create(gpod("lws-1-1", labels={LWS_LABEL: "lws", LWS_INDEX: "1"}, owner=workers))
        key = f"{NS}/leaderworkerset/lws-1"
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="group 1 admitted")
        for name in ("lws-1", "lws-1-1"):
            await w.bind_and_ready(name)
        await eventually(lambda: (ctl.wake.set(), w.status(key).get("phase") == "Bound")[1], what="bound")
        await scale(w, "lws", 1)
        await w.delete("lws-1-1")
        await w.create(gpod("lws-1-1", labels={LWS_LABEL: "lws", LWS_INDEX: "1"}, owner=workers))
        await eventually(lambda: w.gates("lws-1-1") == [GATE], what="the replacement seen gated")
        now[0] += 6.0
        start = ctl.passes
        await eventually(lambda: (ctl.wake.set(), ctl.passes >= start + 3)[1], what="three passes more")
        assert w.status(key).get("phase") == "Bound"
        assert [m["pod"] for m in w.status(key)["members"]] == ["lws-1", "lws-1-1"]
        assert w.gates("lws-1-1") == [GATE] and not w.pinned("lws-1-1")
