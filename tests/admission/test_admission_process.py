"""The placement controller against the embedded API over real HTTP: whole groups are pinned and ungated,
incomplete or unsized groups wait gated with a reason, forgeries change nothing, a restart carries on from
the PlacementGroup, and a group not bound in time is evicted and admitted afresh."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from admission_world import (
    GATE,
    NS,
    World,
    eventually,
    fleet,
    gpod,
    job,
    job_pods,
    jobs_world,
    placement,
    stalling_proxy,
)
from aiohttp import web

from nodefabric_operator.admission import model
from nodefabric_operator.demo.kubeapi import running_api

KEY = f"{NS}/job/train"


async def deleted_by_hand(w: World) -> None:
    """The group's PlacementGroup deleted through the API, as a cluster admin would."""
    await asyncio.to_thread(
        w.custom.delete_namespaced_custom_object,
        model.GROUP,
        model.VERSION,
        NS,
        model.PLURAL,
        model.object_name(KEY),
    )


async def decision_copied(w: World, pod: str, decision: str) -> None:
    """The copy is written after the admission, without blocking it: wait for it on the pod."""
    await eventually(
        lambda: w.pod(pod)["metadata"]["annotations"]["placement.gpustack.ai/decision"] == decision,
        what="the decision copied onto the pod",
    )


async def test_a_complete_group_is_pinned_ungated_and_recorded():
    async with jobs_world(*fleet(), job("train", 4, completions=4)) as (k, w), placement(k):
        await w.create(*w.job_pods("train", 4, other_gate=True))
        await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(4)), what="ungated")
        status = w.status(KEY)
        assert status["phase"] == "Admitted"
        assert status["size"] == 4 and status["sizeSource"] == "Job train: completions"
        pg = w.pg(KEY)
        assert pg["metadata"]["labels"] == {
            "app.kubernetes.io/managed-by": "nodefabric",
            "placement.gpustack.ai/family": "job",
        }
        job_uid = k.api.stored("batch/v1/jobs", "train", NS)["metadata"]["uid"]
        assert [(o["kind"], o["name"], o["uid"]) for o in pg["metadata"]["ownerReferences"]] == [
            ("Job", "train", job_uid)
        ]
        nodes = {m["pod"]: m["node"] for m in status["members"]}
        assert sorted(nodes) == [f"train-{i}" for i in range(4)]
        # One zone, one node per pod (8 GPUs each), each pod pinned to exactly its node.
        assert len(set(nodes.values())) == 4 and len({n.rsplit("-", 1)[0] for n in nodes.values()}) == 1
        for pod, n in nodes.items():
            assert w.pinned(pod) == [n]
            assert w.gates(pod) == ["example.com/other"]  # only our gate went
        assert status["level"] == "zone" and status["location"] in ("eu-a", "eu-b")
        cond = {c["type"]: c["status"] for c in status["conditions"]}
        assert cond == {"Admitted": "True", "AllBound": "False"}
        for i in range(4):
            await w.remove_other_gate(f"train-{i}")
            await w.bind_and_ready(f"train-{i}")
        await eventually(lambda: w.status(KEY).get("phase") == "Bound", what="Bound")
        status = w.status(KEY)
        assert all(m["bound"] and m["ready"] for m in status["members"])
        assert {c["type"]: c["status"] for c in status["conditions"]}["AllBound"] == "True"
        assert ("PlacementGroup", model.object_name(KEY), "GroupAdmitted") in {e[:3] for e in w.events()}
        await decision_copied(w, "train-0", status["decision"])


async def test_an_incomplete_group_stays_gated_with_a_reason_then_goes_when_whole():
    async with jobs_world(*fleet(), job("train", 4)) as (k, w), placement(k):
        pods = w.job_pods("train", 4)
        await w.create(*pods[:3])
        await eventually(lambda: "3 of 4 exist" in w.status(KEY).get("decision", ""), what="3 of 4")
        assert w.status(KEY)["phase"] == "Waiting"
        assert all(GATE in w.gates(f"train-{i}") for i in range(3))
        assert not w.pinned("train-0")
        await w.create(pods[3])
        await eventually(lambda: w.status(KEY).get("phase") == "Admitted", what="Admitted")


async def test_unknown_size_waits_gated_never_a_group_of_one():
    async with jobs_world(*fleet()) as (k, w), placement(k) as ctl:
        await w.create(*job_pods("train", 1))  # no Job object, no declared size
        await eventually(lambda: w.status(KEY).get("phase") == "Pending", what="Pending")
        status = w.status(KEY)
        assert status["size"] is None
        assert "group size unknown: Job ml/train not found" in status["decision"]
        passes = ctl.passes
        await eventually(lambda: ctl.passes > passes + 2)
        assert w.gates("train-0") == [GATE]


async def test_members_declaring_different_sizes_wait_and_an_owner_count_wins():
    async with running_api([model.placement_crd()]) as k:
        w = World(k)
        await w.create(*fleet())
        lab = {"placement.gpustack.ai/group": "g"}
        async with placement(k):
            await w.create(
                gpod("g-0", labels=lab, annotations={"placement.gpustack.ai/group-size": "2"}),
                gpod("g-1", labels=lab, annotations={"placement.gpustack.ai/group-size": "3"}),
            )
            key = f"{NS}/explicit/g"
            await eventually(lambda: w.status(key).get("phase") == "Pending", what="Pending")
            assert "members declare different group sizes (g-0: 2, g-1: 3)" in w.status(key)["decision"]


async def test_forged_claims_and_other_schedulers_pods_change_nothing():
    async with jobs_world(*fleet(), job("train", 2)) as (k, w):
        forged = {
            "placement.gpustack.ai/claim": (
                '{"group":"ml/job/train","level":"any","location":"nowhere","expires":"9999"}'
            ),
            "placement.gpustack.ai/decision": "placed by the attacker",
        }
        label = {"batch.kubernetes.io/job-name": "train"}
        async with placement(k):
            # 20 pods of another scheduler carrying the Job's label; the attacker's own pods of the same
            # scheduler with the label and forged annotations, gated and not, created before the Job's
            # pods and not controlled by the Job.
            await w.create(
                *[gpod(f"x-{i}", labels=label, gated=False, scheduler="other", gpus=1) for i in range(20)]
            )
            await w.create(gpod("attacker", labels=label, annotations=forged, gated=False, scheduler="other"))
            await w.create(gpod("attacker-gated", labels=label, annotations=forged))
            await w.create(gpod("attacker-loose", labels=label, annotations=forged, gated=False))
            await w.create(*w.job_pods("train", 2, annotations=forged))
            await eventually(lambda: w.status(KEY).get("phase") == "Admitted", what="Admitted")
            status = w.status(KEY)
            assert [m["pod"] for m in status["members"]] == ["train-0", "train-1"]
            assert "attacker" not in status["decision"] and "nowhere" not in status["decision"]
            assert GATE in w.gates("attacker-gated") and not w.pinned("attacker-gated")
            assert status["location"] != "nowhere" and status["level"] == "zone"
            await decision_copied(w, "train-0", status["decision"])


async def test_a_restart_mid_admission_carries_on_from_the_placement_group():
    async with jobs_world(*fleet(), job("train", 2)) as (k, w):
        async with placement(k) as ctl:

            async def crash_before_release(group, status):  # the process dies after the status write
                raise RuntimeError("killed")

            # Never put back: a retry of the release while this controller stops would ungate the pods
            # that a process killed here leaves gated (a race the slow machine showed once).
            ctl.releaser.release = crash_before_release  # type: ignore[method-assign]
            await w.create(*w.job_pods("train", 2))
            await eventually(lambda: w.status(KEY).get("phase") == "Admitted", what="Admitted")
        assert all(GATE in w.gates(f"train-{i}") for i in range(2))
        planned = {m["pod"]: m["node"] for m in w.status(KEY)["members"]}
        async with placement(k):  # a new process: nothing in memory
            await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")
            assert {p: w.pinned(p)[0] for p in planned} == planned
            assert w.status(KEY)["attempts"] == 1


async def test_a_group_not_bound_in_time_is_evicted_and_admitted_afresh():
    from nodefabric_operator.extender.config import ExtenderConfig

    cfg = ExtenderConfig(groupReadyTimeoutSeconds=1.5)
    async with jobs_world(*fleet(), job("train", 2)) as (k, w), placement(k, cfg, backoff_base=0.5):
        await w.create(*w.job_pods("train", 2))
        await eventually(lambda: GATE not in w.gates("train-0"), what="ungated")
        await w.bind_and_ready("train-0")  # one of two binds; the other never does
        await eventually(lambda: w.status(KEY).get("phase") == "TimedOut", what="TimedOut")
        status = w.status(KEY)
        assert "was not bound and Ready within 1.5s" in status["decision"]
        assert {c["type"]: c["status"] for c in status["conditions"]}["TimedOut"] == "True"
        await eventually(lambda: not w.pods(), what="pods evicted")
        # Each Event is posted in a task of its own, not awaited before the evictions: it may land after.
        timed_out = ("PlacementGroup", model.object_name(KEY), "GroupTimedOut")
        await eventually(lambda: timed_out in {e[:3] for e in w.events()}, what="the group's TimedOut Event")
        await w.create(*w.job_pods("train", 2))  # the owner recreates them, gated
        await eventually(lambda: w.status(KEY).get("attempts") == 2, what="admitted afresh")
        assert w.status(KEY)["phase"] == "Admitted"


async def test_interleaved_groups_with_room_for_one_never_split():
    # 8 nodes of 8 GPUs: room for one group of 6
    async with jobs_world(*fleet(), job("a", 6), job("b", 6)) as (k, w), placement(k):
        a, b = w.job_pods("a", 6), w.job_pods("b", 6)
        for pa, pb in zip(a, b, strict=True):  # pod by pod
            await w.create(pa, pb)
        admitted = await eventually(
            lambda: [g for g in ("a", "b") if w.status(f"{NS}/job/{g}").get("phase") == "Admitted"],
            what="one admitted",
        )
        assert len(admitted) == 1
        (winner,) = admitted
        loser = "b" if winner == "a" else "a"
        await eventually(lambda: w.status(f"{NS}/job/{loser}").get("phase") == "Waiting", what="other waits")
        nodes = [m["node"] for m in w.status(f"{NS}/job/{winner}")["members"]]
        assert len(set(nodes)) == 6
        await eventually(lambda: all(GATE not in w.gates(f"{winner}-{i}") for i in range(6)), what="ungated")
        for i in range(6):
            assert GATE in w.gates(f"{loser}-{i}") and not w.pinned(f"{loser}-{i}")
        for i in range(6):
            await w.bind_and_ready(f"{winner}-{i}")
        await eventually(lambda: w.status(f"{NS}/job/{winner}").get("phase") == "Bound", what="Bound")
        assert w.status(f"{NS}/job/{loser}")["phase"] == "Waiting"
        assert "waits for one" in w.status(f"{NS}/job/{loser}")["decision"]
        for i in range(6):  # the winner finishes: the loser gets the whole fleet
            await w.delete(f"{winner}-{i}")
        await eventually(
            lambda: w.status(f"{NS}/job/{loser}").get("phase") == "Admitted", what="loser admitted"
        )


async def test_a_fleet_without_gpu_product_labels_still_places():
    """A default homogeneity key no node carries is skipped and said (extender/placement.py, index.py),
    so such a group is admitted rather than "never fits"."""
    async with jobs_world(*fleet(product=None), job("train", 2)) as (k, w), placement(k):
        await w.create(*w.job_pods("train", 2))
        await eventually(lambda: w.status(KEY).get("phase") in ("Admitted", "NeverFits"), what="decided")
        status = w.status(KEY)
        assert status["phase"] == "Admitted", status["decision"]
        assert "nvidia.com/gpu.product skipped" in status["decision"]


async def test_after_a_restart_admitted_groups_hold_their_nodes_before_any_group_is_decided():
    async with jobs_world(*fleet(zones=("eu-a",), per_zone=4), job("a", 4), job("b", 4)) as (k, w):
        b = w.job_pods("b", 4)
        async with placement(k):
            await w.create(*b[:3])  # b is older, but incomplete
            await eventually(lambda: w.status(f"{NS}/job/b").get("phase") == "Waiting", what="b waits")
            await w.create(*w.job_pods("a", 4))
            await eventually(lambda: all(GATE not in w.gates(f"a-{i}") for i in range(4)), what="a ungated")
        # A new process; a's pods are pinned, not bound: nothing but a's PlacementGroup says their nodes
        # are taken, and b (older, so decided first) becomes complete.
        async with placement(k) as ctl:
            await w.create(b[3])
            passes = ctl.passes
            await eventually(lambda: ctl.passes > passes + 3)
            status = w.status(f"{NS}/job/b")
            assert status["phase"] == "Waiting", status["decision"]
            assert all(GATE in w.gates(f"b-{i}") for i in range(4))


async def test_more_gated_pods_of_another_scheduler_do_not_take_the_group_over():
    """Gated pods carrying the Job's label, of a scheduler of their own, outnumbering the Job's pods and
    made before them: they never become the group; the Job's pods are admitted as it."""
    async with jobs_world(*fleet(), job("train", 2)) as (k, w):
        label = {"batch.kubernetes.io/job-name": "train"}
        async with placement(k):
            await w.create(*[gpod(f"evil-{i}", labels=label, scheduler="evil") for i in range(3)])
            # Of the same scheduler too, made before the Job's pods exist: not the Job's, never its group.
            await w.create(*[gpod(f"early-{i}", labels=label) for i in range(2)])
            await eventually(lambda: "0 of 2 exist" in w.status(KEY).get("decision", ""), what="0 of 2")
            await w.create(*w.job_pods("train", 2))
            await eventually(lambda: w.status(KEY).get("phase") == "Admitted", what="Admitted")
            status = w.status(KEY)
            assert [m["pod"] for m in status["members"]] == ["train-0", "train-1"]
            assert all(GATE in w.gates(f"evil-{i}") and not w.pinned(f"evil-{i}") for i in range(3))
            assert all(GATE in w.gates(f"early-{i}") and not w.pinned(f"early-{i}") for i in range(2))
            await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")


async def test_older_gated_pods_of_another_scheduler_do_not_take_an_ownerless_group_over():
    """A group named by label alone (no owner to hold pods to): pods of another scheduler made later, even
    more of them, never displace the group's first pods."""
    async with running_api([model.placement_crd()]) as k:
        w = World(k)
        await w.create(*fleet())
        lab = {"placement.gpustack.ai/group": "g"}
        size = {"placement.gpustack.ai/group-size": "2"}
        key = f"{NS}/explicit/g"
        async with placement(k):
            await w.create(gpod("g-0", labels=lab, annotations=size))
            await eventually(lambda: "1 of 2 exist" in w.status(key).get("decision", ""), what="1 of 2")
            await asyncio.sleep(1.1)  # creation times are in whole seconds
            await w.create(
                *[gpod(f"evil-{i}", labels=lab, annotations=size, scheduler="evil") for i in range(3)]
            )
            await w.create(gpod("g-1", labels=lab, annotations=size))
            await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
            assert [m["pod"] for m in w.status(key)["members"]] == ["g-0", "g-1"]
            assert all(GATE in w.gates(f"evil-{i}") for i in range(3))


async def test_a_placement_group_deleted_by_hand_mid_admission_is_written_again_and_still_times_out():
    """The PlacementGroup of an admitted group deleted by someone (a cluster admin; the chart's policy
    lets no one else): the process writes it again from what it last wrote, owner included, and the
    group is still held to the timeout rather than left partly bound."""
    from nodefabric_operator.extender.config import ExtenderConfig

    cfg = ExtenderConfig(groupReadyTimeoutSeconds=2)
    async with jobs_world(*fleet(), job("train", 2)) as (k, w), placement(k, cfg, backoff_base=0.5):
        await w.create(*w.job_pods("train", 2))
        await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")
        before = w.pg(KEY)
        members = [(m["pod"], m["node"]) for m in before["status"]["members"]]
        await w.bind_and_ready("train-0")  # one of two binds; the other never does
        await deleted_by_hand(w)
        await eventually(
            lambda: w.pg(KEY) is not None and w.pg(KEY)["metadata"]["uid"] != before["metadata"]["uid"],
            what="written again",
        )
        again = w.pg(KEY)
        assert again["metadata"]["ownerReferences"] == before["metadata"]["ownerReferences"]
        assert [(m["pod"], m["node"]) for m in again["status"]["members"]] == members
        await eventually(lambda: w.status(KEY).get("phase") == "TimedOut", what="TimedOut")
        await eventually(lambda: not w.pods(), what="pods evicted")


async def test_a_placement_group_put_back_by_a_late_answer_after_its_deletion_is_written_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch's DELETED applied, then the answer of a status write sent before the deletion: the
    tables held the PlacementGroup again, no event would take it out, and every pass patched it, 404, for
    good (seen in CI as a group never written again). A 404 naming it is taken as its deletion."""
    from nodefabric_operator.extender.config import ExtenderConfig

    cfg = ExtenderConfig(groupReadyTimeoutSeconds=600)
    async with (
        jobs_world(*fleet(), job("train", 2)) as (k, w),
        placement(k, cfg, backoff_base=0.5) as ctl,
    ):
        await w.create(*w.job_pods("train", 2))
        await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")
        before = w.pg(KEY)
        lost: list[dict[str, Any]] = []
        lose = ctl.tables._lose

        def put_back(key: tuple[str, str], obj: dict[str, Any]) -> None:
            if lost:
                lose(key, obj)
                return
            lost.append(obj)  # the watch's DELETED, and at once the late answer that put it back
            ctl.tables.pgs[key] = obj

        monkeypatch.setattr(ctl.tables, "_lose", put_back)
        await deleted_by_hand(w)
        await eventually(lambda: lost, what="the watch's DELETED")
        await w.bind_and_ready("train-0")  # a change to write: its status patch finds the object gone
        await eventually(
            lambda: w.pg(KEY) is not None and w.pg(KEY)["metadata"]["uid"] != before["metadata"]["uid"],
            what="written again",
        )
        members = [m["pod"] for m in w.pg(KEY)["status"]["members"]]
        assert members == [m["pod"] for m in before["status"]["members"]]


async def test_a_job_scaled_up_after_its_group_is_bound_admits_its_new_pods():
    """The Job's parallelism raised once its group is Bound: the new pods are admitted beside the bound
    ones, not left gated for ever under the size the group had."""
    async with jobs_world(*fleet(), job("train", 2)) as (k, w), placement(k):
        pods = w.job_pods("train", 4)
        await w.create(*pods[:2])
        await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")
        for i in range(2):
            await w.bind_and_ready(f"train-{i}")
        await eventually(lambda: w.status(KEY).get("phase") == "Bound", what="Bound")
        await asyncio.to_thread(
            w.custom.patch_namespaced_custom_object,
            "batch",
            "v1",
            NS,
            "jobs",
            "train",
            {"spec": {"parallelism": 4}},
        )
        await w.create(*pods[2:])
        await eventually(
            lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2, 4)),
            timeout=30,
            what="the new pods ungated",
        )
        status = w.status(KEY)
        assert status["size"] == 4 and status["attempts"] == 2
        assert sorted(m["pod"] for m in status["members"]) == [f"train-{i}" for i in range(4)]


async def test_the_process_keeps_only_the_labels_a_group_is_named_by():
    """Labels and owner references have no total bound but the object's (about 1.5 MB): anyone who can
    create pods anywhere could fill the process's memory through them. It keeps only the labels that
    name and size a group and the controller reference, and the group is still found."""
    async with jobs_world(*fleet(), job("train", 2)) as (k, w):
        filler = {f"example.com/filler-{i}": "x" * 63 for i in range(2000)}  # ~150 KB of labels
        async with placement(k) as ctl:
            pods = w.job_pods("train", 2)
            refs = [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": f"c{i}", "uid": f"u{i}"} for i in range(500)
            ]
            for p in pods:
                p["metadata"]["labels"] |= filler
                p["metadata"]["ownerReferences"] += refs
            await w.create(*pods)
            await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")
            kept = {uid: p["metadata"]["labels"] for uid, p in ctl.tables.pods.items()}
            assert kept and all(
                labels == {"batch.kubernetes.io/job-name": "train"} for labels in kept.values()
            )
            assert all(len(p["metadata"]["ownerReferences"]) == 1 for p in ctl.tables.pods.values())


async def test_a_timed_out_groups_pods_a_disruption_budget_keeps_are_evicted_later():
    """Evictions refused for a while (429: a PodDisruptionBudget says not now) are tried again on later
    passes until they go, even when no pod of the group is gated to wake it: a timed-out group is never
    left partly bound."""
    from kubernetes.client.exceptions import ApiException

    from nodefabric_operator.extender.config import ExtenderConfig

    cfg = ExtenderConfig(groupReadyTimeoutSeconds=1.5)
    async with jobs_world(*fleet(), job("train", 2)) as (k, w), placement(k, cfg, backoff_base=0.5) as ctl:
        real = ctl.core.create_namespaced_pod_eviction
        refused = []

        def budget(name, ns, body, **kw):  # the API server's answer while the budget is spent
            if len(refused) < 4:
                refused.append(name)
                raise ApiException(status=429, reason="Too Many Requests")
            return real(name, ns, body, **kw)

        ctl.core.create_namespaced_pod_eviction = budget
        await w.create(*w.job_pods("train", 2))
        await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")
        await w.bind_and_ready("train-0")  # one of two binds; the other never does
        await eventually(lambda: w.status(KEY).get("phase") == "TimedOut", what="TimedOut")
        await eventually(lambda: not w.pods(), what="pods evicted once the budget allows")
        assert len(refused) == 4
        await eventually(lambda: w.status(KEY).get("members") == [], what="nothing left to evict")


async def test_what_the_process_keeps_per_group_goes_with_the_group():
    """Owners' counts and deleted PlacementGroups are not kept for ever: a cluster running many Jobs
    over weeks must not grow the process's memory with every Job it ever saw."""
    async with jobs_world(*fleet(), job("train", 2)) as (k, w), placement(k) as ctl:
        await w.create(*w.job_pods("train", 2))
        await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")
        assert ctl.grouping.sizes
        await deleted_by_hand(w)
        for i in range(2):
            await w.delete(f"train-{i}")
        await eventually(lambda: not ctl.tables.pods, what="pods gone")
        await eventually(
            lambda: not ctl.grouping.sizes and not ctl.tables.lost, timeout=15, what="nothing kept"
        )


async def test_an_invalid_pod_that_is_not_the_owners_does_not_hold_the_group_back():
    """A gated pod with a Job's label and an unusable placement annotation, made by someone else (not
    controlled by the Job): the Job's group is admitted; the invalid pod stays gated."""
    async with jobs_world(*fleet(), job("train", 2)) as (k, w):
        label = {"batch.kubernetes.io/job-name": "train"}
        async with placement(k):
            bad = {"placement.gpustack.ai/locality": "nowhere-at-all"}
            await w.create(gpod("spoiler", labels=label, annotations=bad))
            await w.create(*w.job_pods("train", 2))
            await eventually(lambda: w.status(KEY).get("phase") == "Admitted", what="Admitted")
            assert [m["pod"] for m in w.status(KEY)["members"]] == ["train-0", "train-1"]
            assert GATE in w.gates("spoiler")


async def test_a_members_unusable_annotation_holds_its_group_back_with_the_reason():
    async with jobs_world(*fleet(), job("train", 2)) as (k, w), placement(k):
        pods = w.job_pods("train", 2)
        pods[1]["metadata"]["annotations"]["placement.gpustack.ai/locality"] = "nowhere-at-all"
        await w.create(*pods)
        await eventually(
            lambda: w.status(KEY).get("decision", "").startswith("InvalidPlacement: "), what="invalid"
        )
        assert w.status(KEY)["phase"] == "Waiting"
        assert all(GATE in w.gates(f"train-{i}") for i in range(2))
        await eventually(lambda: w.events("InvalidPlacement"), what="the Event")


async def test_a_lease_lost_while_the_owner_is_read_admits_nothing():
    """The holder's renew deadline passes while a group's owner is read (a slow API server): another
    replica may lead by then, so this one must not admit the group it was deciding (no Admitted status,
    no gate removed); it admits once it leads again."""
    async with jobs_world(*fleet(), job("train", 2, completions=2)) as (k, w):
        leading = [True]
        read: list[str] = []
        async with placement(k, leading=lambda: leading[0]) as ctl:
            real = ctl.grouping.owners.read

            def slow_read(ref):  # type: ignore[no-untyped-def]
                leading[0] = False  # the Lease lapses during the read
                read.append(str(ref))
                return real(ref)

            ctl.grouping.owners.read = slow_read  # type: ignore[method-assign]
            await w.create(*w.job_pods("train", 2))
            await eventually(lambda: bool(read), what="the owner read")
            await asyncio.sleep(1.0)  # passes that would admit have had their time
            assert all(GATE in w.gates(f"train-{i}") for i in range(2)), (
                "a gate was removed without the Lease"
            )
            assert (w.status(KEY) or {}).get("phase") != "Admitted"
            ctl.grouping.owners.read = real  # type: ignore[method-assign]
            leading[0] = True
            ctl.wake.set()
            await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")


async def test_a_write_the_api_never_answers_does_not_stop_admission():
    """A pin whose reply never comes (the API server behind a network that drops it) is given up after
    the write timeout and tried again; the loop never waits on it for ever while the replica, renewing
    its Lease on its own, keeps every other replica from admitting."""
    async with jobs_world(*fleet(), job("train", 2)) as (k, w), stalling_proxy(k) as proxy:
        first = True

        def stall_the_first_pin(request: web.Request) -> bool:
            nonlocal first
            hit = (
                first
                and request.method == "PATCH"
                and request.path.startswith(f"/api/v1/namespaces/{NS}/pods/")
                and request.content_type == "application/json-patch+json"  # not the decision's copy
            )
            first = first and not hit
            return hit

        proxy.stall = stall_the_first_pin
        async with placement(k, via=proxy.url, write_timeout=(2.0, 2.0)):
            try:
                await w.create(*w.job_pods("train", 2))
                await eventually(
                    lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated"
                )
                assert proxy.stalled == 1
            finally:
                proxy.unstall()  # a loop still waiting on the stalled write can stop


async def test_a_group_named_after_another_groups_placement_group_never_takes_it_over():
    """Group "X" had its PlacementGroup's name changed ("explicit-x-<hash>"); a group named "x-<hash>"
    in the same namespace would get that very name. The PlacementGroup stays its first group's: the
    other waits, gated, told why, and neither reads nor writes it."""
    victim = f"{NS}/explicit/X"
    name = model.object_name(victim)
    squatter = name.removeprefix("explicit-")
    size = {"placement.gpustack.ai/group-size": "2"}
    async with jobs_world(*fleet()) as (k, w), placement(k):
        await w.create(*[gpod(f"v-{i}", labels={GATE: "X"}, annotations=size) for i in range(2)])
        await eventually(lambda: all(GATE not in w.gates(f"v-{i}") for i in range(2)), what="ungated")
        for i in range(2):
            await w.bind_and_ready(f"v-{i}")
        await eventually(lambda: w.status(victim).get("phase") == "Bound", what="Bound")
        admitted = w.status(victim)
        await w.create(*[gpod(f"s-{i}", labels={GATE: squatter}, annotations=size) for i in range(2)])
        told = ("Pod", "s-0", "InvalidPlacement")
        await eventually(lambda: told in {e[:3] for e in w.events()}, what="the squatter told")
        assert f"belongs to group {victim}" in next(e[3] for e in w.events() if e[:3] == told)
        assert w.pg(victim)["spec"]["key"] == victim
        assert w.status(victim)["members"] == admitted["members"]
        assert w.status(victim)["attempts"] == 1
        assert all(GATE in w.gates(f"s-{i}") for i in range(2))


async def test_a_gated_pod_in_no_group_it_can_admit_is_told_why():
    """Our gate carried by the pod template on a pod that names no group, or one whose group name is not
    a label value: nothing would ever remove it, so the pod (still gated: its labels may change) is
    told why, once, beside a group admitted as usual."""
    async with jobs_world(*fleet(), job("train", 2)) as (k, w), placement(k):
        await w.create(gpod("lonely"), gpod("bad-name", annotations={GATE: "not a label value!"}))
        await w.create(*w.job_pods("train", 2))
        await eventually(lambda: w.status(KEY).get("phase") == "Admitted", what="Admitted")
        await eventually(
            lambda: {"lonely", "bad-name"} <= {e[1] for e in w.events("InvalidPlacement")}, what="told"
        )
        told = {e[1]: e[3] for e in w.events("InvalidPlacement")}
        assert "names no group" in told["lonely"]
        assert "is not a label value" in told["bad-name"]
        assert GATE in w.gates("lonely") and GATE in w.gates("bad-name")
        decision = "placement.gpustack.ai/decision"
        await eventually(lambda: w.pod("lonely")["metadata"]["annotations"].get(decision) == told["lonely"])


async def test_a_placement_group_another_group_created_first_is_never_written_over():
    """Another replica created the PlacementGroup for the other group; this process has not seen it yet:
    its create meets the object, which is not written over, and the write fails so that nothing (an
    admission's release) goes on as if it had been."""
    from kubernetes.client.exceptions import ApiException

    from nodefabric_devicemanager.kubeclient import load_client
    from nodefabric_operator.admission.controller import Controller
    from nodefabric_operator.admission.grouping import GroupView
    from nodefabric_operator.admission.model import PlacementGroupStatus
    from nodefabric_operator.extender.config import ExtenderConfig
    from nodefabric_operator.extender.groups import GroupSpec

    first = f"{NS}/explicit/X"
    name = model.object_name(first)
    second = name.removeprefix("explicit-")
    async with jobs_world() as (k, w):
        body = {
            "apiVersion": model.API_VERSION,
            "kind": model.KIND,
            "metadata": {"name": name, "namespace": NS},
            "spec": {"key": first, "family": "explicit", "name": "X"},
        }
        await asyncio.to_thread(
            w.custom.create_namespaced_custom_object, model.GROUP, model.VERSION, NS, model.PLURAL, body
        )
        ctl = Controller(ExtenderConfig(), load_client(k.kubeconfig))  # not started: it has seen nothing
        spec = GroupSpec(f"{NS}/explicit/{second}", "explicit", second, 1, "prefer", "spread", None)
        try:
            await ctl.writer.write(GroupView(spec, "default-scheduler", []), None, PlacementGroupStatus())
        except ApiException as exc:
            assert exc.status == 409
        else:
            raise AssertionError("written as if the PlacementGroup were its own")
        assert w.pg(first)["spec"]["key"] == first
        assert "status" not in w.pg(first) or not w.pg(first)["status"].get("members")


async def test_a_member_ungated_by_hand_and_bound_elsewhere_never_makes_its_group_bound():
    """The process stops after the assignment is written, before the release; the pod's author removes
    our gate from one member and it is bound on a node of another zone. The group is not whole where it
    was placed: it is never Bound, and times out, rather than being recorded as bound in its location."""
    from nodefabric_operator.extender.config import ExtenderConfig

    async with jobs_world(*fleet(), job("train", 2)) as (k, w):
        async with placement(k) as ctl:

            async def crash_before_release(group, status):
                raise RuntimeError("killed")

            ctl.releaser.release = crash_before_release  # type: ignore[method-assign]
            await w.create(*w.job_pods("train", 2))
            await eventually(lambda: w.status(KEY).get("phase") == "Admitted", what="Admitted")
        planned = {m["pod"]: m["node"] for m in w.status(KEY)["members"]}
        elsewhere = next(
            n["metadata"]["name"] for n in fleet() if n["metadata"]["name"][:4] != planned["train-1"][:4]
        )
        gates = w.gates("train-1")
        patch = [{"op": "remove", "path": f"/spec/schedulingGates/{gates.index(GATE)}"}]
        await asyncio.to_thread(w.core.patch_namespaced_pod, "train-1", NS, patch)
        await w.bind_and_ready("train-1", elsewhere)
        cfg = ExtenderConfig(groupReadyTimeoutSeconds=3)
        async with placement(k, cfg):
            await eventually(lambda: GATE not in w.gates("train-0"), what="the other released")
            await w.bind_and_ready("train-0")
            await eventually(
                lambda: w.status(KEY).get("phase") in ("Bound", "TimedOut"), what="Bound or TimedOut"
            )
            assert w.status(KEY)["phase"] == "TimedOut"


async def test_a_member_that_ran_to_completion_before_the_rest_were_ready_counts_as_ready():
    """A short task: one pod of the group is done (Succeeded, so no longer Ready) before its sibling is
    Ready. It was bound where it was placed and ran: the group is Bound, not timed out with its running
    pod evicted."""
    from nodefabric_operator.extender.config import ExtenderConfig

    cfg = ExtenderConfig(groupReadyTimeoutSeconds=3)
    async with jobs_world(*fleet(), job("train", 2)) as (k, w), placement(k, cfg):
        await w.create(*w.job_pods("train", 2))
        await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")
        await w.bind_and_ready("train-0")
        done = {"status": {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False"}]}}
        await asyncio.to_thread(w.core.patch_namespaced_pod_status, "train-0", NS, done)
        await w.bind_and_ready("train-1")
        await eventually(
            lambda: w.status(KEY).get("phase") in ("Bound", "TimedOut"), what="Bound or TimedOut"
        )
        assert w.status(KEY)["phase"] == "Bound"
        assert "train-1" in w.pods()


async def test_a_member_deleted_before_it_was_ready_times_its_group_out_at_once():
    """A pod deleted mid-admission (by hand, or its owner replacing it): the group can no longer be whole,
    so it is timed out then, not after groupReadyTimeoutSeconds (600 s here) during which its other pods
    hold their nodes and its replacement waits."""
    async with jobs_world(*fleet(), job("train", 2)) as (k, w), placement(k):
        await w.create(*w.job_pods("train", 2))
        await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")
        await w.bind_and_ready("train-0")
        await w.delete("train-1")
        await eventually(lambda: w.status(KEY).get("phase") == "TimedOut", what="TimedOut")
        assert "lost 1 member(s) before they were Ready (train-1)" in w.status(KEY)["decision"]
        await eventually(lambda: not w.pods(), what="the rest evicted")


async def test_a_member_that_failed_before_it_was_ready_times_its_group_out_at_once():
    """Its container failed at start (restartPolicy Never): the pod is terminal and the owner makes
    another; the group can no longer be whole and is timed out then."""
    async with jobs_world(*fleet(), job("train", 2)) as (k, w), placement(k):
        await w.create(*w.job_pods("train", 2))
        await eventually(lambda: all(GATE not in w.gates(f"train-{i}") for i in range(2)), what="ungated")
        await w.bind_and_ready("train-1")
        binding = {
            "target": {"kind": "Node", "name": w.pinned("train-0")[0]},
            "metadata": {"name": "train-0"},
        }
        await asyncio.to_thread(
            w.core.create_namespaced_pod_binding, "train-0", NS, binding, _preload_content=False
        )
        failed = {"status": {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}]}}
        await asyncio.to_thread(w.core.patch_namespaced_pod_status, "train-0", NS, failed)
        await eventually(lambda: w.status(KEY).get("phase") == "TimedOut", what="TimedOut")
        assert "lost 1 member(s) before they were Ready (train-0)" in w.status(KEY)["decision"]


def explicit(name: str, group: str, size: int = 2, **kw: object) -> dict[str, object]:
    """A pod naming group `group` by label alone (no owner), declaring its size."""
    labels = {GATE: group}
    return gpod(name, labels=labels, annotations={"placement.gpustack.ai/group-size": str(size)}, **kw)


async def passes_after(ctl: object, n: int = 3) -> None:
    """Wait for `n` more reconcile passes: whatever was delivered before has been decided."""
    start = ctl.passes  # type: ignore[attr-defined]
    await eventually(lambda: ctl.passes >= start + n, what=f"{n} passes")  # type: ignore[attr-defined]


async def test_a_member_relabelled_after_its_group_was_admitted_stays_a_member_of_that_group():
    """A bound member of group a relabelled into group b: it keeps its place in a (its node was given
    for a), b does not count it (b would be admitted a pod short), and the pod is told so."""
    a, b = f"{NS}/explicit/a", f"{NS}/explicit/b"
    async with running_api([model.placement_crd()]) as k:
        w = World(k)
        await w.create(*fleet())
        async with placement(k) as ctl:
            await w.create(explicit("a-0", "a"), explicit("a-1", "a"))
            await eventually(lambda: all(GATE not in w.gates(f"a-{i}") for i in range(2)), what="a ungated")
            for i in range(2):
                await w.bind_and_ready(f"a-{i}")
            await eventually(lambda: w.status(a).get("phase") == "Bound", what="a Bound")
            await w.create(explicit("b-0", "b"))
            await eventually(lambda: "1 of 2 exist" in w.status(b).get("decision", ""), what="b 1 of 2")
            patch = {"metadata": {"labels": {GATE: "b"}}}
            await asyncio.to_thread(w.core.patch_namespaced_pod, "a-1", NS, patch)
            told = await eventually(
                lambda: [e[3] for e in w.events("MemberRelabelled") if e[1] == "a-1"], what="a-1 told"
            )
            assert "group ml/explicit/a was admitted with this pod" in told[0]
            assert "group ml/explicit/b does not count it" in told[0]
            await passes_after(ctl)
            assert w.status(b)["phase"] == "Waiting" and "1 of 2 exist" in w.status(b)["decision"]
            assert GATE in w.gates("b-0")
            assert w.status(a)["phase"] == "Bound"
            assert [m["pod"] for m in w.status(a)["members"]] == ["a-0", "a-1"]
            await w.create(explicit("b-1", "b"))
            await eventually(lambda: w.status(b).get("phase") == "Admitted", what="b Admitted")
            assert [m["pod"] for m in w.status(b)["members"]] == ["b-0", "b-1"]


async def test_a_gated_member_relabelled_once_admitted_is_released_by_the_group_that_admitted_it():
    """Relabelled between its group's admission and its release (the process stopped in between): its
    node was given for group a, so a still pins and ungates it there, and b never places it again."""
    a, b = f"{NS}/explicit/a", f"{NS}/explicit/b"
    async with running_api([model.placement_crd()]) as k:
        w = World(k)
        await w.create(*fleet())
        async with placement(k) as ctl:

            async def crash_before_release(group, status):  # the process dies after the status write
                raise RuntimeError("killed")

            ctl.releaser.release = crash_before_release  # type: ignore[method-assign]
            await w.create(explicit("a-0", "a"), explicit("a-1", "a"))
            await eventually(lambda: w.status(a).get("phase") == "Admitted", what="a Admitted")
        planned = {m["pod"]: m["node"] for m in w.status(a)["members"]}
        patch = {"metadata": {"labels": {GATE: "b"}}}
        await asyncio.to_thread(w.core.patch_namespaced_pod, "a-1", NS, patch)
        await w.create(explicit("b-0", "b"))
        async with placement(k) as ctl:
            await eventually(lambda: all(GATE not in w.gates(f"a-{i}") for i in range(2)), what="a ungated")
            assert {p: w.pinned(p) for p in planned} == {p: [n] for p, n in planned.items()}
            await passes_after(ctl)
            assert w.status(b)["phase"] == "Waiting" and "1 of 2 exist" in w.status(b)["decision"]


async def test_a_bound_pod_copying_an_ownerless_groups_label_occupies_its_node_but_is_no_member():
    """A pod created bound (spec.nodeName set: no gate, no scheduler) naming a group no owner vouches
    for: it takes its node like any pod, but it never makes the group partly admitted (the group would
    go a member short, its last member left gated as extra, and be pulled to the pod's node)."""
    key = f"{NS}/explicit/g"
    async with running_api([model.placement_crd()]) as k:
        w = World(k)
        await w.create(*fleet())
        async with placement(k) as ctl:
            await w.create(explicit("g-0", "g"))
            await eventually(lambda: "1 of 2 exist" in w.status(key).get("decision", ""), what="1 of 2")
            copycat = explicit("copycat", "g", gated=False)
            copycat["spec"]["nodeName"] = "eu-a-0"  # type: ignore[index]
            await w.create(copycat)
            await passes_after(ctl)
            assert w.status(key)["phase"] == "Waiting" and "1 of 2 exist" in w.status(key)["decision"]
            assert GATE in w.gates("g-0")
            await w.create(explicit("g-1", "g"))
            await eventually(lambda: w.status(key).get("phase") == "Admitted", what="Admitted")
            members = {m["pod"]: m["node"] for m in w.status(key)["members"]}
            assert sorted(members) == ["g-0", "g-1"]
            assert "eu-a-0" not in members.values(), "the copy's node is full: it counts as load"
