"""A waiting group is decided again only when one of its inputs changed: its pods, the capacity it could
use (anything that may give room wakes every waiting group, oldest first), its owner's count. The
controller runs against the embedded API over real HTTP with its watches; passes are run one at a time by
the driver (churn_driver.py), so the same seed gives the same passes under either rule."""

from __future__ import annotations

from typing import Any

import pytest
from admission_world import GATE, NS, fleet, gpod, job, jobs_world, node
from churn_driver import PGS, Driver, bystander, driven, group_pod, seeded_churn

from nodefabric_operator.admission.grouping import SIZE_TTL_S

pytestmark = pytest.mark.timeout(300)


async def test_a_watch_event_that_concerns_no_waiting_group_decides_none_again():
    """Three complete groups with no room (the fleet is full): a change to a pod of no group, one to a
    pod bound where it was (only taking room), a new pod of another group, and a foreign pod bound
    straight to a node each decide no waiting group again; a pod that goes from a node wakes them all,
    oldest first, and the oldest that fits is admitted."""
    async with (
        jobs_world(*fleet(zones=("eu-a",), per_zone=2)) as (k, w),
        driven(k, w, every_event=False) as d,
    ):
        for i in range(2):
            d.put_pod(group_pod("full", i, 2))
        await d.step()
        await d.bind_released()
        await d.step()
        assert d.outcome()[f"{NS}/explicit/full"][0] == "Bound"
        for g in ("a", "b", "c"):
            for i in range(2):
                d.put_pod(group_pod(g, i, 2))
            await d.step()
        await d.step()
        assert {d.outcome()[f"{NS}/explicit/{g}"][0] for g in "abc"} == {"Waiting"}
        before = d.decisions()
        d.put_pod(bystander("bystander", "0"))
        await d.step()
        d.put_pod(bystander("bystander", "1"))
        await d.step()
        foreign = gpod("foreign", gated=False, gpus=8, scheduler="foreign")
        foreign["spec"]["nodeName"] = "eu-a-0"  # only takes room (the node is full already)
        d.put_pod(foreign)
        await d.step()
        d.put_pod(group_pod("late", 0, 2))  # one of two: decided itself, the others left alone
        await d.step()
        assert d.decisions() == before + 1, [p.decisions for p in d.passes[-4:]]
        d.remove_pod("full-1")  # eu-a-1 free: every waiting group decided again, oldest first
        await d.step()
        assert d.passes[-1].decisions == 4
        assert {d.outcome()[f"{NS}/explicit/{g}"][0] for g in "abc"} == {"Waiting"}  # room for one pod
        d.remove_pod("full-0")
        d.remove_pod("foreign")
        await d.step()
        assert d.outcome()[f"{NS}/explicit/a"][0] == "Admitted", "the oldest waiting group goes first"
        assert GATE in w.gates("b-0")


@pytest.mark.parametrize("seed", [3, 11])
async def test_deciding_only_changed_groups_reaches_every_decision_deciding_all_did(seed: int):
    """The same seeded churn (groups of 1 to 4 pods, 14 nodes' worth on 6, created in a shuffled
    interleaving among changes of no group's concern, foreign pods bound and gone, bound groups
    finishing) under both rules: after every pass every group has the same phase, attempts and nodes."""
    sizes = {"a": 4, "b": 2, "c": 3, "d": 1, "e": 4}
    traces, decisions = {}, {}
    for every_event in (True, False):
        nodes = fleet(zones=("eu-a", "eu-b"), per_zone=3)
        async with jobs_world(*nodes) as (k, w), driven(k, w, every_event=every_event) as d:
            traces[every_event] = await seeded_churn(d, seed, 80, sizes)
            decisions[every_event] = d.decisions()
    for i, (old, new) in enumerate(zip(traces[True], traces[False], strict=True)):
        assert old == new, f"pass {i}: deciding every group gave {old}, deciding changed ones {new}"
    assert any(phase == "Bound" for phase, _a, _m in traces[True][-1].values()), traces[True][-1]
    assert decisions[False] < decisions[True], decisions


def foreign_on(name: str, node_name: str) -> dict[str, Any]:
    """A pod of another scheduler bound straight to a node, taking all of its GPUs."""
    pod = gpod(name, gated=False, gpus=8, scheduler="foreign")
    pod["spec"]["nodeName"] = node_name
    return pod


async def bound_group(d: Driver, group: str, size: int) -> None:
    """An owner-less group (named by its labels alone) admitted, bound and Ready."""
    for i in range(size):
        d.put_pod(group_pod(group, i, size))
    await d.step()
    await d.bind_released()
    await d.step()
    assert d.outcome()[f"{NS}/explicit/{group}"][0] == "Bound", d.outcome()


def blocked_node(how: str) -> dict[str, Any]:
    n = node("eu-a-1", "eu-a")
    if how == "cordoned":
        n["spec"] = {"unschedulable": True}
    elif how == "tainted":
        n["spec"] = {"taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]}
    elif how == "without-gpus":
        n["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    return n  # "unlabelled": lacks the label the pod selects


@pytest.mark.parametrize("how", ["cordoned", "tainted", "unlabelled", "without-gpus"])
async def test_a_node_that_becomes_usable_decides_every_waiting_group_again(how: str):
    """The only other node is full; the one a group could use is cordoned, tainted, lacks the label the
    pod selects, or has no GPUs allocatable. The node made usable (no pod changes) wakes the group."""
    async with (
        jobs_world(node("eu-a-0", "eu-a"), blocked_node(how)) as (k, w),
        driven(k, w, every_event=False) as d,
    ):
        d.put_pod(foreign_on("foreign", "eu-a-0"))
        pod = group_pod("a", 0, 1)
        if how == "unlabelled":
            pod["spec"]["nodeSelector"] = {"pool": "train"}
        d.put_pod(pod)
        await d.step()
        await d.step()
        assert d.outcome()[f"{NS}/explicit/a"][0] in ("Waiting", "NeverFits"), d.outcome()
        usable = node("eu-a-1", "eu-a")
        usable["metadata"]["labels"]["pool"] = "train"
        await d.put_node(usable)
        await d.step()
        assert d.outcome()[f"{NS}/explicit/a"][0] == "Admitted", d.outcome()


async def test_a_decision_whose_write_failed_is_made_again_on_the_next_pass():
    """Room frees up for a waiting group and its admission's write is refused once (503): nothing else
    changes, yet the next pass decides it again and admits it (it must not wait for an unrelated
    change, nor for ever)."""
    async with (
        jobs_world(*fleet(zones=("eu-a",), per_zone=2)) as (k, w),
        driven(k, w, every_event=False) as d,
    ):
        await bound_group(d, "full", 2)
        for i in range(2):
            d.put_pod(group_pod("a", i, 2))
        await d.step()
        await d.step()
        assert d.outcome()[f"{NS}/explicit/a"][0] == "Waiting"
        d.remove_pod("full-0")
        d.remove_pod("full-1")
        await d.settle()
        k.api.fail_next(1, 503)
        await d.step()
        assert d.outcome()[f"{NS}/explicit/a"][0] == "Waiting", "the write was refused"
        await d.step()
        assert d.outcome()[f"{NS}/explicit/a"][0] == "Admitted", d.outcome()


async def test_a_bound_group_waiting_for_room_for_a_replaced_member_still_counts_the_members_it_placed():
    """An owner-less bound group loses a member; its replacement finds the node taken and the group
    waits. When room comes back the replacement is admitted beside the member the group placed: that
    member stays the group's (its node kept in the PlacementGroup), not load of the group's label."""
    async with (
        jobs_world(*fleet(zones=("eu-a",), per_zone=2)) as (k, w),
        driven(k, w, every_event=False) as d,
    ):
        await bound_group(d, "h", 2)
        taken = w.pod("h-1")["spec"]["nodeName"]
        d.remove_pod("h-1")
        d.put_pod(foreign_on("foreign", taken))
        d.put_pod(group_pod("h", 1, 2))
        await d.step()
        await d.step()
        phase, _attempts, members = d.outcome()[f"{NS}/explicit/h"]
        assert phase == "Waiting" and [m for m, _n in members] == ["h-0", "h-1"], d.outcome()
        d.remove_pod("foreign")
        await d.step()
        assert GATE not in w.gates("h-1"), d.outcome()
        assert w.pinned("h-1") == [taken]


async def test_a_bound_group_whose_placement_group_was_deleted_by_hand_still_counts_its_bound_members():
    """The PlacementGroup of an owner-less bound group deleted by hand is written again from what was
    last seen: a replaced member is then admitted beside the bound one, which is still the group's."""
    async with (
        jobs_world(*fleet(zones=("eu-a",), per_zone=2)) as (k, w),
        driven(k, w, every_event=False) as d,
    ):
        await bound_group(d, "h", 2)
        (pg,) = k.api.store.select(PGS)
        k.api.remove_object(PGS, pg["metadata"]["name"], NS)
        await d.step()
        (again,) = k.api.store.select(PGS)
        assert again["metadata"]["uid"] != pg["metadata"]["uid"]
        assert again["status"]["phase"] == "Bound"
        d.remove_pod("h-1")
        d.put_pod(group_pod("h", 1, 2))
        await d.step()
        assert GATE not in w.gates("h-1"), d.outcome()


async def test_a_relabelled_member_of_a_bound_group_that_waits_again_stays_that_groups():
    """A bound member of an owner-less group relabelled into another group, then another member
    replaced while its node is taken: the group waits, still counting the relabelled member it placed
    (the group its labels name does not), and admits the replacement beside it once there is room."""
    async with (
        jobs_world(*fleet(zones=("eu-a",), per_zone=3)) as (k, w),
        driven(k, w, every_event=False) as d,
    ):
        await bound_group(d, "h", 2)
        relabelled = w.pod("h-0")
        relabelled["metadata"]["labels"] = {GATE: "g"}
        k.api.put_object("v1/pods", relabelled)
        d.put_pod(group_pod("g", 1, 2))
        taken = w.pod("h-1")["spec"]["nodeName"]
        free = ({"eu-a-0", "eu-a-1", "eu-a-2"} - {taken, relabelled["spec"]["nodeName"]}).pop()
        d.remove_pod("h-1")
        d.put_pod(foreign_on("foreign", taken))
        d.put_pod(foreign_on("other", free))
        d.put_pod(group_pod("h", 1, 2))
        await d.step()
        await d.step()
        phase, _attempts, members = d.outcome()[f"{NS}/explicit/h"]
        assert phase == "Waiting" and [m for m, _n in members] == ["h-0", "h-1"], d.outcome()
        assert [m for m, _n in d.outcome()[f"{NS}/explicit/g"][2]] == ["g-1"], d.outcome()
        d.remove_pod("foreign")
        await d.step()
        assert GATE not in w.gates("h-1"), d.outcome()
        assert GATE in w.gates("g-1")


async def test_a_process_started_after_a_group_was_bound_still_counts_the_members_its_admission_placed():
    """The process that admitted an owner-less group is replaced (a restart, a new leader): what the
    group's admission gave is read back from its PlacementGroup, so a replaced member is admitted
    beside the bound one, not left waiting for a whole group of gated pods."""
    async with jobs_world(*fleet(zones=("eu-a",), per_zone=2)) as (k, w):
        async with driven(k, w, every_event=False) as d:
            await bound_group(d, "h", 2)
        d.remove_pod("h-1")
        async with driven(k, w, every_event=False) as d2:
            d2.put_pod(group_pod("h", 1, 2))
            await d2.step()
            assert GATE not in w.gates("h-1"), d2.outcome()


async def test_an_owner_count_changed_with_nothing_else_changing_is_seen_within_its_ttl():
    """A Job of 3 with 2 pods waits. Its parallelism lowered to 2, with no pod event, no node event and
    nothing else that wakes the group, is still seen: the owner's count is read again once SIZE_TTL_S
    old, and the group admitted within a pass of that."""
    async with (
        jobs_world(*fleet(zones=("eu-a",), per_zone=4), job("train", 3)) as (k, w),
        driven(k, w, every_event=False) as d,
    ):
        for pod in w.job_pods("train", 2):
            d.put_pod(pod)
        await d.step()
        assert d.outcome()[f"{NS}/job/train"][0] == "Waiting"
        stored = k.api.stored("batch/v1/jobs", "train", NS)
        assert stored is not None
        stored["spec"]["parallelism"] = 2
        k.api.put_object("batch/v1/jobs", stored)
        passes = 0
        while d.outcome()[f"{NS}/job/train"][0] != "Admitted":
            passes += 1
            assert passes <= SIZE_TTL_S + 1, f"the new count unseen after {passes} passes"
            await d.step()
