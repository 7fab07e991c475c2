"""What a waiting group costs the API, through the placement controller against the embedded API over real
HTTP: pods of a group created one after another are told its decision as its kind changes (waiting,
admitted), and its changing counts at most once per pod per DECISION_EVERY_S, the latest text winning;
an owner chain's kind refused (HTTP 403) in a namespace is probed once per backoff step, not read again
name by name, and so is every read while the API server fails (HTTP 503)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from admission_world import NS, World, eventually, fleet, job, jobs_world, placement
from test_admission_chain_hostile import passes
from test_admission_owner_chain import (
    JOBS,
    chain_world,
    counted,
    ghost,
    jobset,
    jobset_job,
    jobset_pod,
)

from nodefabric_operator.admission import writer
from nodefabric_operator.demo.kubeapi import RunningAPI

NOTE = "placement.gpustack.ai/decision"


def pod_events(w: World, reason: str) -> int:
    return len([e for e in w.events(reason) if e[0] == "Pod"])


def note(w: World, name: str) -> str:
    return str((w.pod(name)["metadata"].get("annotations") or {}).get(NOTE, ""))


async def arrive_one_by_one(k: RunningAPI, w: World, ctl: Any, n: int) -> tuple[int, int]:
    """All but the last of `n` pods created one after another, each decided; (pod PATCHes, pod Events)."""
    key = f"{NS}/job/train"
    pods = w.job_pods("train", n, gpus=1)
    for i, pod in enumerate(pods[:-1]):
        await w.create(pod)
        said = f"{i + 1} of {n} exist"
        await eventually(lambda s=said: s in w.status(key).get("decision", ""), what=said)
    await passes(k, ctl, 2)
    await ctl.publisher.drain()
    return k.api.count("PATCH", "v1/pods"), pod_events(w, "GroupWaiting")


async def test_pods_arriving_one_by_one_are_not_each_told_every_count() -> None:
    """Before: every decision ("k of n exist") went to every gated pod as an annotation and an Event:
    n(n-1)/2 pod PATCHes. Now each pod is told once as it starts to wait, and the latest count once the
    window has passed; its kind changing (admitted) is told at once."""
    n, key = 16, f"{NS}/job/train"
    now = [time.time()]
    async with jobs_world(job("train", n), *fleet()) as (k, w), placement(k, clock=lambda: now[0]) as ctl:
        patches, events = await arrive_one_by_one(k, w, ctl, n)
        assert patches <= n - 1, patches  # was (n-1)n/2 = 120
        assert events <= n - 1, events
        assert "1 of 16 exist" in note(w, "train-0")
        pg_events = [e for e in w.events("GroupWaiting") if e[0] == "PlacementGroup"]
        assert pg_events  # the PlacementGroup still hears of the decisions (its spam filter holds bursts)
        now[0] += writer.DECISION_EVERY_S + 1
        await passes(k, ctl, 2)
        await eventually(lambda: f"{n - 1} of {n} exist" in note(w, "train-0"), what="the latest count")
        await ctl.publisher.drain()
        assert k.api.count("PATCH", "v1/pods") <= 2 * (n - 1)
        await w.create(w.job_pods("train", n, gpus=1)[-1])
        await eventually(lambda: w.status(key).get("phase") == "Admitted", what="admitted")
        admitted = w.status(key)["decision"]
        await eventually(lambda: note(w, "train-0") == admitted, what="told admitted at once")
        assert pod_events(w, "GroupAdmitted") == n


def refusing_jobs(k: RunningAPI, namespace: str, answer: int | bytes = 403) -> dict[str, int]:
    """Every GET of a Job in `namespace` answered `answer` (403: no RBAC for them there; 503: the API
    server failing) while the switch is on; "refused" counts them (the API's own count never sees them)."""
    switch = {"on": 1, "refused": 0}
    seen: list[Any] = []  # kmock asks about one request more than once

    def matches(req: Any) -> bool:
        method = str(getattr(req.method, "value", req.method)).upper()
        hit = bool(switch["on"]) and method == "GET" and f"/namespaces/{namespace}/jobs/" in req.url.path
        if hit and not any(r is req for r in seen):
            seen.append(req)
            switch["refused"] += 1
        return hit

    k.api[matches] << answer
    return switch


async def test_jobs_refused_in_a_namespace_cost_one_probe_per_backoff_step() -> None:
    """Pods naming 30 Jobs of a namespace whose Jobs cannot be read (HTTP 403): before, each name was
    read at first and again at every backoff step (30 GETs a step); now one probe at first and one a
    step, and the names are read again once a read of the kind there is not refused."""
    names, now = 30, [time.time()]
    async with chain_world() as (k, w), placement(k, clock=lambda: now[0]) as ctl:
        await w.create(jobset("llm", 1, 2))
        key = f"{NS}/jobset/llm"
        switch = refusing_jobs(k, NS)
        forged = [
            jobset_pod(f"p-{i}", "llm", {**ghost("Job"), "name": f"g{i}", "uid": f"u{i}"})
            for i in range(names)
        ]
        await w.create(*forged)
        said = f"and {names - 5} more"
        await eventually(lambda: said in w.status(key).get("decision", ""), what="every pod left out")
        assert "HTTP 403" in w.status(key)["decision"]
        first = switch["refused"]
        assert first == 1  # the kind probed by one name in the namespace: was one GET per name (30)
        for _ in range(3):
            now[0] += 61.0  # past the longest backoff: every name due again
            ctl.wake.set()
            await passes(k, ctl, 3)
        assert switch["refused"] - first <= 3  # one probe a step: was 30 a step
        switch["on"] = 0
        now[0] += 61.0
        await eventually(
            lambda: (ctl.wake.set(), "not found" in w.status(key).get("decision", ""))[1], what="read"
        )
        await eventually(lambda: counted(k, JOBS)() >= names, what="every name read again")


async def test_a_failing_api_server_costs_one_probe_per_backoff_step_then_admits() -> None:
    """Pods naming 30 Jobs while every read of them fails (HTTP 503): before, each name was read again at
    every backoff step (30 GETs a step); now one probe a step for every name of every namespace and kind,
    and once a probe is answered every name is read and the group's own pods are admitted."""
    names, now = 30, [time.time()]
    async with chain_world() as (k, w), placement(k, clock=lambda: now[0]) as ctl:
        await w.create(jobset("llm", 1, 2))
        job = await jobset_job(w, "llm", 0)
        key = f"{NS}/jobset/llm"
        switch = refusing_jobs(k, NS, 503)
        forged = [
            jobset_pod(f"p-{i}", "llm", {**ghost("Job"), "name": f"g{i}", "uid": f"u{i}"})
            for i in range(names)
        ]
        await w.create(*forged, *(jobset_pod(f"llm-w-0-{j}", "llm", job) for j in range(2)))
        said = f"and {names + 2 - 5} more"
        await eventually(lambda: said in w.status(key).get("decision", ""), what="every pod left out")
        assert "HTTP 503" in w.status(key)["decision"]
        first = switch["refused"]
        assert first == 1  # one probe, then every read held back behind it
        for _ in range(3):
            now[0] += 61.0  # past the longest backoff: every name due again
            ctl.wake.set()
            await passes(k, ctl, 3)
        assert switch["refused"] - first <= 3  # one probe a step: was 31 a step
        switch["on"] = 0
        now[0] += 61.0
        await eventually(
            lambda: (ctl.wake.set(), w.status(key).get("phase") == "Admitted")[1], what="admitted"
        )
        assert [m["pod"] for m in w.status(key)["members"]] == ["llm-w-0-0", "llm-w-0-1"]
        assert counted(k, JOBS)() == names + 1  # each name read once it could be


def failing_one(k: RunningAPI, path_end: str, answer: int = 500) -> Callable[[], int]:
    """Every GET of the object at `path_end` answered `answer` (HTTP 500); how many there were."""
    seen: list[Any] = []  # kmock asks about one request more than once

    def matches(req: Any) -> bool:
        method = str(getattr(req.method, "value", req.method)).upper()
        hit = method == "GET" and req.url.path.endswith(path_end)
        if hit and not any(r is req for r in seen):
            seen.append(req)
        return hit

    k.api[matches] << answer
    return lambda: len(seen)


async def test_one_job_that_always_fails_never_holds_back_another_groups_reads() -> None:
    """One Job whose every read answers HTTP 500 (a conversion webhook failing on that object alone, the
    rest of the API fine), its group made first so it is reconciled first on every pass: before, its
    failing probe at each backoff step held every other name of every group behind it for good (the
    other JobSet was never admitted); now a probe of any other name ends the outage, and the broken Job
    is read on its own backoff, as before there was one."""
    now = [time.time()]
    async with chain_world() as (k, w), placement(k, clock=lambda: now[0]) as ctl:
        await w.create(jobset("aaa", 1, 1), jobset("llm", 1, 2))
        broken = await jobset_job(w, "aaa", 0)
        broken_reads = failing_one(k, "/jobs/aaa-w-0")
        await w.create(jobset_pod("aaa-w-0-0", "aaa", broken))
        bad = f"{NS}/jobset/aaa"
        await eventually(lambda: "HTTP 500" in w.status(bad).get("decision", ""), what="the broken Job said")
        good = await jobset_job(w, "llm", 0)
        await w.create(*(jobset_pod(f"llm-w-0-{j}", "llm", good) for j in range(2)))
        key = f"{NS}/jobset/llm"
        await eventually(lambda: "llm-w-0-0" in w.status(key).get("decision", ""), what="llm decided")
        for _ in range(4):
            now[0] += 61.0  # past the longest backoff: the probe is due
            await passes(k, ctl, 2)
        assert w.status(key).get("phase") == "Admitted", w.status(key).get("decision")
        assert [m["pod"] for m in w.status(key)["members"]] == ["llm-w-0-0", "llm-w-0-1"]
        assert "HTTP 500" in w.status(bad)["decision"] and w.status(bad)["members"] == []
        assert counted(k, JOBS)() == 1  # llm-w-0 read once (before: never)
        assert broken_reads() <= 1 + 4  # the broken one on its own backoff, once a step at most
        # Known to fail alone, it fails again without holding anyone back: a group made right after is
        # read at once (before, each of its failures, once another name had ended the outage, held every
        # read a backoff step).
        for name in ("new", "newer"):
            reads = broken_reads()
            now[0] += 61.0
            await passes(k, ctl, 2)
            assert broken_reads() == reads + 1  # read again on its own backoff
            await w.create(jobset(name, 1, 1))
            fine = await jobset_job(w, name, 0)
            await w.create(jobset_pod(f"{name}-w-0-0", name, fine))
            await passes(k, ctl, 3)
            assert w.status(f"{NS}/jobset/{name}").get("phase") == "Admitted", name


async def test_pods_are_not_told_again_at_each_step_of_an_outage() -> None:
    """While every read fails (HTTP 503) the probe moves from name to name; what each pod is told stays
    the same, so a long outage patches no pod again at each backoff step (the decision is unchanged)."""
    names, now = 6, [time.time()]
    async with chain_world() as (k, w), placement(k, clock=lambda: now[0]) as ctl:
        await w.create(jobset("llm", 1, 2))
        key = f"{NS}/jobset/llm"
        switch = refusing_jobs(k, NS, 503)
        await w.create(
            *(
                jobset_pod(f"p-{i}", "llm", {**ghost("Job"), "name": f"g{i}", "uid": f"u{i}"})
                for i in range(names)
            )
        )
        await eventually(lambda: "and 1 more" in w.status(key).get("decision", ""), what="every pod left out")
        for _ in range(2):
            now[0] += 61.0  # past the longest backoff, and past DECISION_EVERY_S: a changed text is told
            await passes(k, ctl, 3)
        await ctl.publisher.drain()
        decision, patches, probes = (
            w.status(key)["decision"],
            k.api.count("PATCH", "v1/pods"),
            switch["refused"],
        )
        for _ in range(3):
            now[0] += 61.0
            await passes(k, ctl, 3)
            assert w.status(key)["decision"] == decision
        await ctl.publisher.drain()
        assert k.api.count("PATCH", "v1/pods") == patches
        assert 1 <= switch["refused"] - probes <= 3  # one probe a step, and the probe still sent
