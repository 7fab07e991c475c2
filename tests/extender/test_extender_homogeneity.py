"""Homogeneity defaults on a fleet that lacks the label (the NVIDIA device plugin without GPU feature
discovery): a default key no node carries is skipped and said; where some nodes carry it, the others are
left out; a group's own `homogeneous` annotation stays a requirement. Over real HTTP, and the index's
count of carriers against a count done the slow way."""

from __future__ import annotations

import random
from typing import Any

from extender_fixtures import PRODUCT, Recorder, explicit, extender, filter_, node, pod

from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.index import Index, NodeView

GROUP = "ml/explicit/train"
SKIPPED = f"homogeneity on {PRODUCT} skipped: no node has it"


def bare(name: str, **kw: Any) -> dict[str, Any]:
    """A GPU node without the product label (no GPU feature discovery)."""
    n = node(name, **kw)
    del n["metadata"]["labels"][PRODUCT]
    return n


def group(size: int, **ann: str) -> list[dict[str, Any]]:
    return [pod(f"train-{i}", gpus=8, **explicit("train", size, **ann)) for i in range(size)]


async def test_a_fleet_without_product_labels_places_the_group_and_says_the_key_was_skipped() -> None:
    nodes = [bare(f"n-{i}", zone="z", region="r") for i in range(4)]
    events = Recorder()
    async with extender(nodes, publisher=events) as client:
        result = await filter_(client, group(4)[0], [n["metadata"]["name"] for n in nodes])
        assert sorted(result["NodeNames"]) == ["n-0", "n-1", "n-2", "n-3"], result
        assert result["FailedAndUnresolvableNodes"] == {}
        summary = (await (await client.get("/debug/groups")).json())[0]["summary"]
        assert summary.endswith(SKIPPED), summary
        assert "go to" in summary
        # The next pod of the group follows the same bucket.
        result = await filter_(client, group(4)[1], [n["metadata"]["name"] for n in nodes])
        assert result["NodeNames"], result


async def test_every_policy_places_without_the_label() -> None:
    for locality in ("prefer", "zone", "region", "any"):
        nodes = [bare(f"n-{i}", zone="z", region="r") for i in range(2)]
        async with extender(nodes) as client:
            result = await filter_(client, group(2, locality=locality)[0], ["n-0", "n-1"])
            assert sorted(result["NodeNames"]) == ["n-0", "n-1"], (locality, result)


async def test_where_some_nodes_carry_the_key_the_others_are_left_out() -> None:
    labelled = [node(f"h-{i}", zone="z", region="r") for i in range(2)]
    nodes = [*labelled, bare("b-0", zone="z", region="r")]
    async with extender(nodes) as client:
        result = await filter_(client, group(2)[0], ["h-0", "h-1", "b-0"])
        assert sorted(result["NodeNames"]) == ["h-0", "h-1"], result
        assert "b-0" in result["FailedNodes"]
        summary = (await (await client.get("/debug/groups")).json())[0]["summary"]
        assert "skipped: no node has it" not in summary
    # Three such pods never fit: only two nodes have the product at all.
    async with extender(nodes) as client:
        result = await filter_(client, group(3)[0], ["h-0", "h-1", "b-0"])
        assert result["NodeNames"] == [], result
        assert result["FailedAndUnresolvableNodes"], result


async def test_a_groups_own_homogeneous_annotation_is_a_requirement() -> None:
    nodes = [bare(f"n-{i}", zone="z", region="r") for i in range(3)]
    events = Recorder()
    async with extender(nodes, publisher=events) as client:
        result = await filter_(client, group(2, homogeneous=PRODUCT)[0], ["n-0", "n-1", "n-2"])
        assert result["NodeNames"] == []
        reasons = set(result["FailedAndUnresolvableNodes"].values()) | set(result["FailedNodes"].values())
        assert reasons and all("skipped" not in r for r in reasons), reasons
        assert any(r.startswith("never fits") for r in result["FailedAndUnresolvableNodes"].values()), result


async def test_the_global_default_keys_are_skipped_too() -> None:
    config = ExtenderConfig(homogeneousKeys=("example.com/model",))
    nodes = [bare(f"n-{i}", zone="z", region="r") for i in range(2)]
    async with extender(nodes, config) as client:
        result = await filter_(client, group(2)[0], ["n-0", "n-1"])
        assert sorted(result["NodeNames"]) == ["n-0", "n-1"], result
        summary = (await (await client.get("/debug/groups")).json())[0]["summary"]
        assert "homogeneity on example.com/model skipped: no node has it" in summary
        assert SKIPPED in summary


def test_the_index_counts_carriers_as_nodes_come_change_and_go() -> None:
    keys = (PRODUCT, "example.com/model")
    index = Index(2, [keys])
    rng = random.Random(7)
    views: dict[str, NodeView] = {}
    for step in range(600):
        name = f"n-{rng.randrange(40)}"
        if rng.random() < 0.3 and name in views:
            index.remove(views.pop(name))
        else:
            labels = {k: rng.choice(["", "A", "B"]) for k in keys if rng.random() < 0.5}
            view = NodeView(name=name, labels=labels, locations=(None, None), free={}, allocatable={})
            index.add(view)
            views[name] = view
        for key in (*keys, "never.indexed/key"):
            expected = any(v.labels.get(key) for v in views.values())
            assert index.carries(key) is expected, (step, key)
