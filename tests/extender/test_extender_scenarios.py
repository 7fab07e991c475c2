"""The seed's placement scenarios, driven the way kube-scheduler drives the extender, over real HTTP."""

from __future__ import annotations

from typing import Any

from extender_fixtures import (
    REGION,
    ZONE,
    Recorder,
    explicit,
    extender,
    filter_,
    fleet,
    node,
    pod,
    prioritize,
)

from nodefabric_operator.extender.config import ExtenderConfig


def zone_of(name: str) -> str:
    return name.rsplit("-", 1)[0]


async def schedule(
    client: Any, pods: list[dict[str, Any]], free: dict[str, int], gpus: int
) -> list[str | None]:
    """One pod after another: feasible = nodes with room, filter, prioritize, bind the best score."""
    placed: list[str | None] = []
    for p in pods:
        feasible = sorted(n for n, f in free.items() if f >= gpus)
        result = await filter_(client, p, feasible)
        allowed = result["NodeNames"]
        if not allowed:
            placed.append(None)
            continue
        scores = await prioritize(client, p, allowed)
        best = max(sorted(allowed), key=lambda n: scores[n])
        free[best] -= gpus
        placed.append(best)
    return placed


def half_busy(nodes: list[dict[str, Any]], used: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every other node of each zone runs an unrelated pod using `used` GPUs."""
    snapshot = list(nodes)
    free = {n["metadata"]["name"]: 8 for n in nodes}
    for i, n in enumerate(nodes):
        if i % 2:
            name = n["metadata"]["name"]
            snapshot.append(
                pod(f"other-{name}", namespace="batch", gpus=used, node_name=name, phase="Running")
            )
            free[name] -= used
    return snapshot, free


def group(n: int, size: int, gpus: int, name: str = "train", **ann: str) -> list[dict[str, Any]]:
    return [pod(f"{name}-{i}", gpus=gpus, **explicit(name, size, **ann)) for i in range(n)]


async def test_seed_fleet_half_busy_group_lands_in_one_zone():
    snapshot, free = half_busy(fleet(), used=4)
    async with extender(snapshot) as client:
        placed = await schedule(client, group(8, 8, gpus=4), free, gpus=4)
        assert None not in placed
        assert len({zone_of(n) for n in placed if n}) == 1
        [summary] = [g["summary"] for g in await (await client.get("/debug/groups")).json()]
        zone = zone_of(placed[0] or "")
        assert f"zone {zone} of region {zone[:2]}" in summary
        assert "fabric level skipped: no node has a fabric domain" in summary


async def test_without_locality_the_same_group_spreads_over_zones_and_regions():
    snapshot, free = half_busy(fleet(), used=4)
    async with extender(snapshot) as client:
        placed = await schedule(client, group(8, 8, gpus=4, locality="any"), free, gpus=4)
        assert len({zone_of(n) for n in placed if n}) > 1


async def test_only_15_free_nodes_group_takes_three_zones_of_one_region():
    snapshot, free = half_busy(fleet(), used=8)  # busy nodes are full: kube-scheduler never passes them
    async with extender(snapshot) as client:
        placed = await schedule(client, group(8, 8, gpus=8), free, gpus=8)
        assert None not in placed
        zones = {zone_of(n) for n in placed if n}
        assert zones == {"eu-a", "eu-b", "eu-c"}
        [g] = await (await client.get("/debug/groups")).json()
        assert g["level"] == "region" and g["location"] == "eu"
        assert "zone level skipped: largest zone holds 3 now" in g["summary"]
        assert "region eu" in g["summary"]


async def test_first_filter_answers_the_bucket_and_a_reason_for_every_other_node():
    snapshot, free = half_busy(fleet(), used=8)
    names = sorted(n for n, f in free.items() if f == 8)
    async with extender(snapshot) as client:
        result = await filter_(client, group(1, 8, gpus=8)[0], names)
        assert sorted(result["NodeNames"]) == sorted(n for n in names if n.startswith("eu-"))
        assert set(result["FailedNodes"]) == {n for n in names if n.startswith("us-")}
        assert set(result["FailedNodes"].values()) == {"outside region eu of the group"}
        assert result["FailedAndUnresolvableNodes"] == {} and result["Error"] == ""


async def test_required_zone_waits_with_stable_reasons_while_no_zone_has_room():
    snapshot, free = half_busy(fleet(), used=8)
    names = sorted(n for n, f in free.items() if f == 8)
    events = Recorder()
    async with extender(snapshot, publisher=events) as client:
        p = group(1, 4, gpus=8, locality="zone")[0]
        for _ in range(3):  # kube-scheduler retries; the answer and the event do not change
            result = await filter_(client, p, names)
            assert result["NodeNames"] == []
            assert result["FailedAndUnresolvableNodes"] == {}
            assert set(result["FailedNodes"]) == set(names)
            assert set(result["FailedNodes"].values()) == {
                "group ml/explicit/train waits for one zone of one nvidia.com/gpu.product"
                " with room for 4 pods"
            }
        assert [e[1:3] for e in events.events] == [("Normal", "GroupWaiting")]
        # Room frees up in zone eu-b: the same pod now gets that zone.
        result = await filter_(client, p, [*names, "eu-b-1", "eu-b-3"])
        assert sorted(result["NodeNames"]) == ["eu-b-0", "eu-b-1", "eu-b-2", "eu-b-3", "eu-b-4"]


async def test_required_zone_never_fits_when_no_zone_could_ever_hold_the_group():
    events = Recorder()
    async with extender(fleet(), publisher=events) as client:  # 6 nodes per zone, one pod per node
        p = group(1, 7, gpus=8, locality="zone")[0]
        names = [n["metadata"]["name"] for n in fleet()]
        result = await filter_(client, p, names)
        assert result["NodeNames"] == [] and result["FailedNodes"] == {}
        reasons = set(result["FailedAndUnresolvableNodes"].values())
        assert reasons == {
            "never fits: no zone of one nvidia.com/gpu.product can hold the 7 pods of group ml/explicit/train"
        }
        assert len(result["FailedAndUnresolvableNodes"]) == 30
        [(name, type_, reason, message)] = events.events
        assert (name, type_, reason) == ("train-0", "Warning", "GroupNeverFits")
        assert "largest holds 6" in message
        # Counting only the nodes the pod's nodeSelector allows: a region of 18 nodes holds 7 ...
        p = group(1, 7, gpus=8, name="picky", locality="region")[0]
        assert len((await filter_(client, p, names))["NodeNames"]) == 18
        # ... but not when the selector narrows it to one zone's 6 nodes.
        p = group(1, 7, gpus=8, name="narrow", locality="region")[0]
        p["spec"]["nodeSelector"] = {"topology.kubernetes.io/zone": "eu-a"}
        result = await filter_(client, p, names[:6])
        assert result["NodeNames"] == [] and len(result["FailedAndUnresolvableNodes"]) == 6
        # The region level would hold it: that policy places the group.
        p = group(1, 7, gpus=8, name="other", locality="region")[0]
        assert len((await filter_(client, p, names))["NodeNames"]) == 18


async def test_nodes_without_a_value_never_qualify_at_a_required_level():
    nodes = [node(f"z-{i}", zone="z", region="r") for i in range(2)] + [node(f"bare-{i}") for i in range(4)]
    async with extender(nodes) as client:
        names = [n["metadata"]["name"] for n in nodes]
        result = await filter_(client, group(1, 2, gpus=8, locality="region")[0], names)
        assert sorted(result["NodeNames"]) == ["z-0", "z-1"]
        assert result["FailedNodes"]["bare-0"] == ("no region label (the group is in region r)")
        # Under prefer the same nodes are usable: they are merely not close.
        result = await filter_(client, group(1, 4, gpus=8, name="loose")[0], names)
        assert sorted(result["NodeNames"]) == sorted(names)


async def test_prefer_widens_to_the_enclosing_level_when_the_zone_is_full():
    nodes = [
        node("a-0", zone="eu-a", region="eu"),
        node("a-1", zone="eu-a", region="eu"),
        node("b-0", zone="eu-b", region="eu"),
        node("u-0", zone="us-a", region="us"),
    ]
    async with extender(nodes) as client:
        pods = group(3, 2, gpus=8)
        first = await filter_(client, pods[0], ["a-0", "a-1", "b-0", "u-0"])
        assert sorted(first["NodeNames"]) == ["a-0", "a-1"]
        # Another job took a-1 and a-0 is ours: the next pod of the group widens to region eu, not us.
        second = await filter_(client, pods[1], ["b-0", "u-0"])
        assert second["NodeNames"] == ["b-0"]
        assert second["FailedNodes"] == {"u-0": "outside region eu of the group"}
        [g] = await (await client.get("/debug/groups")).json()
        assert g["level"] == "region"
        assert (
            "widened to region eu" in g["summary"] and "zone eu-a has no feasible node left" in g["summary"]
        )


async def test_required_zone_does_not_widen():
    nodes = [
        node("a-0", zone="eu-a", region="eu"),
        node("a-1", zone="eu-a", region="eu"),
        node("b-0", zone="eu-b", region="eu"),
    ]
    async with extender(nodes) as client:
        pods = group(2, 2, gpus=8, locality="zone")
        assert sorted((await filter_(client, pods[0], ["a-0", "a-1", "b-0"]))["NodeNames"]) == ["a-0", "a-1"]
        second = await filter_(client, pods[1], ["b-0"])
        assert second["NodeNames"] == []
        assert second["FailedNodes"] == {
            "b-0": "group ml/explicit/train waits for a feasible node in zone eu-a"
            " with nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
        }


async def test_homogeneity_buckets_keep_one_gpu_product():
    mixed = [node(f"a-{i}", zone="eu-a", region="eu", product="H100" if i < 3 else "A100") for i in range(6)]
    same = [node(f"b-{i}", zone="eu-b", region="eu", product="A100") for i in range(4)]
    nodes = mixed + same
    names = [n["metadata"]["name"] for n in nodes]
    async with extender(nodes) as client:
        # zone eu-a has 6 nodes but only 3 of one product; eu-b has 4 A100: the group of 4 goes there.
        result = await filter_(client, group(1, 4, gpus=8)[0], names)
        assert sorted(result["NodeNames"]) == ["b-0", "b-1", "b-2", "b-3"]
        assert result["FailedNodes"]["a-0"] == "the group needs nvidia.com/gpu.product=A100"
        assert result["FailedNodes"]["a-3"] == "outside zone eu-b of the group"
        # With homogeneity switched off the tighter-by-rank zone eu-a holds the group.
        p = pod("free-0", gpus=8, **explicit("free", 6, homogeneous=""))
        assert sorted((await filter_(client, p, names))["NodeNames"]) == sorted(
            n for n in names if n[0] == "a"
        )


async def test_bound_members_hold_later_pods_after_a_restart():
    nodes = fleet(per_zone=3)
    bound = [
        pod(f"train-{i}", gpus=8, node_name=f"us-b-{i}", phase="Running", **explicit("train", 3))
        for i in range(2)
    ]
    async with extender(nodes + bound) as client:
        p = pod("train-2", gpus=8, **explicit("train", 3))
        names = [n["metadata"]["name"] for n in nodes if n["metadata"]["name"] not in ("us-b-0", "us-b-1")]
        result = await filter_(client, p, names)
        assert result["NodeNames"] == ["us-b-2"]
        [g] = await (await client.get("/debug/groups")).json()
        assert g["summary"].startswith("members already run in zone us-b of region us")


async def test_pods_without_a_group_pass_through_untouched():
    nodes = fleet(per_zone=2)
    names = [n["metadata"]["name"] for n in nodes]
    async with extender(nodes) as client:
        p = pod("web-0", gpus=1)
        result = await filter_(client, p, names)
        assert result == {
            "NodeNames": names,
            "Nodes": None,
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
        assert set((await prioritize(client, p, names)).values()) == {0}
        assert await (await client.get("/debug/groups")).json() == []


async def test_unknown_nodes_wait_for_the_cache_and_known_ones_are_decided():
    async with extender(fleet(per_zone=2)) as client:
        result = await filter_(client, group(1, 2, gpus=8)[0], ["eu-a-0", "eu-a-1", "new-node"])
        assert sorted(result["NodeNames"]) == ["eu-a-0", "eu-a-1"]
        assert result["FailedNodes"] == {"new-node": "node is not in the extender's node cache yet"}


async def test_custom_levels_from_configuration():
    config = ExtenderConfig.model_validate(
        {
            "levels": [
                {"name": "rack", "keys": ["example.com/rack"]},
                {"name": "zone", "keys": [ZONE]},
                {"name": "region", "keys": [REGION]},
            ],
            "homogeneousKeys": [],
        }
    )
    nodes = [node(f"n-{i}", zone="z", region="r", labels={"example.com/rack": f"r{i % 2}"}) for i in range(4)]
    async with extender(nodes, config=config) as client:
        names = [n["metadata"]["name"] for n in nodes]
        result = await filter_(client, group(1, 2, gpus=8, locality="rack")[0], names)
        assert sorted(result["NodeNames"]) == ["n-0", "n-2"]
        assert result["FailedNodes"]["n-1"] == "outside rack r0 of the group"
