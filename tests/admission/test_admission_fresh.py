"""A waiting group is decided again only when one of its inputs changed: its pods, the capacity it could
use (anything that may give room wakes every waiting group, oldest first), its owner's count. The
controller runs against the embedded API over real HTTP with its watches; passes are run one at a time by
the driver (churn_driver.py), so the same seed gives the same passes under either rule."""

from __future__ import annotations

import pytest
from admission_world import GATE, NS, fleet, gpod, jobs_world
from churn_driver import bystander, driven, group_pod, seeded_churn

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
