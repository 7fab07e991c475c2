"""The HTTP service: wire format, malformed input, rank policies, claims, metrics, health."""

from __future__ import annotations

import json
from typing import Any

import pytest
from extender_fixtures import args, explicit, extender, filter_, fleet, node, pod, prioritize

from nodefabric_operator.extender.cache import Cache
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.service import Extender, scheduler_of
from nodefabric_operator.extender.wire import parse_args


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "request body is not JSON"),
        (b"[]", "request body must be a JSON object (ExtenderArgs), got list"),
        (b'{"NodeNames": ["a"]}', "Pod must be a Pod object with metadata"),
        (b'{"Pod": {"metadata": {}}, "NodeNames": "a"}', "NodeNames must be a list of node names"),
        (b'{"Pod": {"metadata": {}}, "NodeNames": ["a", 7]}', "NodeNames[1]: int 7 is not a node name"),
        (
            b'{"Pod": {"metadata": {}}, "NodeNames": ["a", "we\\"ird"]}',
            "NodeNames[1]: 'we\"ird' is not a node name",
        ),
        (b'{"Pod": {"metadata": {}}, "NodeNames": ["Upper"]}', "NodeNames[0]: 'Upper' is not a node name"),
        # A comma would make two names look like one joined list of others (the last-request key).
        (b'{"Pod": {"metadata": {}}, "NodeNames": ["a", "b,c"]}', "NodeNames[1]: 'b,c' is not a node name"),
        (b'{"Pod": {"metadata": {}}, "NodeNames": ["a", ""]}', "NodeNames[1]: '' is not a node name"),
        (b'{"Pod": {"metadata": {}}, "NodeNames": [","]}', "NodeNames[0]: ',' is not a node name"),
        (
            b'{"Pod": {"metadata": {}}, "NodeNames": null, "Nodes": null}',
            "one of NodeNames or Nodes is required",
        ),
        (b'{"Pod": {"metadata": {}}, "Nodes": [{}]}', "Nodes must be a NodeList with items"),
        (
            b'{"Pod": {"metadata": {}}, "Nodes": {"items": [{}]}}',
            "Nodes.items[0].metadata.name: None is not a node name (a DNS subdomain)",
        ),
        (
            b'{"Pod": {"metadata": {}}, "Nodes": {"items": [{"metadata": {"name": "n",'
            b' "labels": {"topology.kubernetes.io/zone": ["a", "b"]}}}]}}',
            "Nodes.items[0].metadata.labels['topology.kubernetes.io/zone']: must be a string, got list",
        ),
        (
            b'{"Pod": {"metadata": {}}, "Nodes": {"items": [{"metadata": {"name": "n"},'
            b' "status": {"allocatable": {"nvidia.com/gpu": "800x"}}}]}}',
            "Nodes.items[0].status.allocatable['nvidia.com/gpu']: '800x' is not a quantity",
        ),
        (
            b'{"Pod": {"metadata": {}}, "Nodes": {"items": [{"metadata": {"name": "n"},'
            b' "spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}}]}}',
            "Nodes.items[0].spec.taints[0].effect: must be one of NoExecute, NoSchedule, PreferNoSchedule",
        ),
        (
            b'{"Pod": {"metadata": {"labels": {"placement.gpustack.ai/group": "g"}}, "spec": []},'
            b' "NodeNames": []}',
            "Pod spec must be an object",
        ),
        (
            b'{"Pod": {"metadata": {"labels": ["g"]}}, "NodeNames": []}',
            "Pod metadata.labels must map names to strings",
        ),
        (
            b'{"Pod": {"metadata": {"labels": {"placement.gpustack.ai/group": "g"}},'
            b' "spec": {"containers": 5}}, "NodeNames": []}',
            "malformed Pod in ExtenderArgs: spec.containers: must be a list, got int",
        ),
        (
            b'{"Pod": {"metadata": {"labels": {"placement.gpustack.ai/group": "g"}},'
            b' "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1_000"}}}]}},'
            b' "NodeNames": []}',
            "malformed Pod in ExtenderArgs: spec.containers[0].resources.limits['nvidia.com/gpu']:"
            " '1_000' is not a quantity",
        ),
        (  # a garbage limit beside its request is refused too, not ignored
            b'{"Pod": {"metadata": {"labels": {"placement.gpustack.ai/group": "g"}},'
            b' "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"},'
            b' "limits": {"nvidia.com/gpu": "1_000"}}}]}}, "NodeNames": []}',
            "malformed Pod in ExtenderArgs: spec.containers[0].resources.limits['nvidia.com/gpu']:"
            " '1_000' is not a quantity",
        ),
        (
            b'{"Pod": {"metadata": {"name": "p", "namespace": ["ml"]}}, "NodeNames": []}',
            "Pod metadata.namespace must be a string, got list",
        ),
        (b'{"Pod": {"metadata": {"uid": 7}}, "NodeNames": []}', "Pod metadata.uid must be a string, got int"),
        (
            b'{"Pod": {"metadata": {"labels": []}}, "NodeNames": []}',
            "Pod metadata.labels must map names to strings",
        ),
        (  # a job's name is every reason's group name: held to what a label value may be
            b'{"Pod": {"metadata": {"labels": {"batch.kubernetes.io/job-name": "train\\n0"}}},'
            b' "NodeNames": []}',
            "Pod metadata.labels['batch.kubernetes.io/job-name']: 'train\\n0' is not a label value",
        ),
        (
            b'{"Pod": {"metadata": {"labels": {"placement.gpustack.ai/group": "g"}},'
            b' "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "0.5"}}}]}},'
            b' "NodeNames": []}',
            "spec.containers[0].resources.requests['nvidia.com/gpu']: '0.5' is not a whole number",
        ),
        (
            b'{"Pod": {"metadata": {"labels": {"placement.gpustack.ai/group": "g"}},'
            b' "spec": {"containers": [{"resources": {"requests": {"cpu": "9e999"}}}]}},'
            b' "NodeNames": []}',
            "spec.containers[0].resources.requests['cpu']: '9e999' is beyond int64",
        ),
        (
            b'{"Pod": {"metadata": {"labels": {"placement.gpustack.ai/group": "g"}},'
            b' "spec": {"tolerations": [{"operator": "Maybe"}]}}, "NodeNames": []}',
            "spec.tolerations[0].operator: must be one of Equal, Exists, Gt, Lt, got 'Maybe'",
        ),
        (
            b'{"Pod": {"metadata": {"labels": {"placement.gpustack.ai/group": "g"}},'
            b' "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":'
            b' {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Gt",'
            b' "values": ["1", "2"]}]}]}}}}}, "NodeNames": []}',
            "nodeSelectorTerms[0].matchExpressions[0].values: Gt takes exactly one value",
        ),
        (
            b'{"Pod": {"metadata": {"labels": {"placement.gpustack.ai/group": "g"}},'
            b' "spec": {"nodeSelector": {"pool": 7}}}, "NodeNames": []}',
            "spec.nodeSelector['pool']: must be a string, got int",
        ),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_malformed_requests_get_400_with_a_message_and_the_service_keeps_serving(body, message, verb):
    async with extender(fleet(per_zone=1)) as client:
        resp = await client.post(f"/{verb}", data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 400
        assert message in (await resp.json())["Error"]
        assert (await client.get("/healthz")).status == 200
        ok = await client.post(f"/{verb}", json=args(pod("web"), ["eu-a-0"]))
        assert ok.status == 200
        metrics = await (await client.get("/metrics")).text()
        assert f'nodefabric_extender_bad_requests_total{{verb="{verb}"}} 1.0' in metrics


def test_keys_are_accepted_in_any_case():
    parsed = parse_args({"pod": {"metadata": {"name": "p"}}, "nodenames": ["a", "b"], "NODES": None})
    assert parsed.node_names == ("a", "b") and parsed.nodes is None


async def test_without_node_cache_the_answer_carries_the_node_objects():
    nodes = fleet(per_zone=2)
    async with extender([]) as client:
        body = {
            "Pod": pod("g-0", gpus=8, **explicit("g", 2, locality="zone")),
            "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": nodes},
            "NodeNames": None,
        }
        result = await (await client.post("/filter", json=body)).json()
        assert result["NodeNames"] is None
        kept = [n["metadata"]["name"] for n in result["Nodes"]["items"]]
        assert kept == ["eu-a-0", "eu-a-1"]
        assert len(result["FailedNodes"]) == 8


async def test_rank_policies_order_the_scores():
    mem = "nvidia.com/gpu.memory"
    nodes = [
        node("c", zone="z", gpus=8, labels={mem: "81559"}),
        node("a", zone="z", gpus=8, labels={mem: "40960"}),
        node("b", zone="z", gpus=8, labels={mem: "81559"}),
    ]
    busy = [
        pod("x", namespace="other", gpus=6, node_name="b", phase="Running"),
        pod("y", namespace="other", gpus=1, node_name="c", phase="Running"),
    ]
    async with extender(nodes + busy) as client:
        names = ["a", "b", "c"]

        async def scores(rank: str) -> dict[str, int]:
            p = pod(f"{rank}-0", gpus=1, **explicit(rank, 1, rank=rank))
            assert sorted((await filter_(client, p, names))["NodeNames"]) == names
            return await prioritize(client, p, names)

        # spread: least accelerator share in use first (a 0/8, c 1/8, b 6/8)
        assert await scores("spread") == {"a": 10, "c": 5, "b": 0}
        # first-fit: node name order
        assert await scores("first-fit") == {"a": 10, "b": 5, "c": 0}
        # most-free-memory: free GPUs x per-GPU memory (c 7x81559, a 8x40960, b 2x81559)
        assert await scores("most-free-memory") == {"c": 10, "a": 5, "b": 0}


async def test_placed_group_pods_prioritize_only_inside_the_bucket():
    nodes = fleet(per_zone=2)
    names = [n["metadata"]["name"] for n in nodes]
    async with extender(nodes) as client:
        p = pod("g-0", gpus=8, **explicit("g", 2))
        allowed = (await filter_(client, p, names))["NodeNames"]
        scores = await prioritize(client, p, names)
        assert {n for n, s in scores.items() if s > 0} <= set(allowed)
        assert all(scores[n] == 0 for n in names if n not in allowed)


def _pods(n: int) -> list[dict[str, Any]]:
    return [pod(f"g-{i}", gpus=8, **explicit("g", n)) for i in range(n)]


def test_claims_count_until_they_expire_or_the_pod_is_seen_bound():
    now = [1_800_000_000.0]
    cfg = ExtenderConfig(claimTTLSeconds=60)
    cache = Cache(cfg)
    nodes = fleet(per_zone=3)
    cache.load_objects(nodes)
    ext = Extender(cfg, cache, clock=lambda: now[0])
    pods = _pods(3)
    names = tuple(n["metadata"]["name"] for n in nodes)
    ext.filter(parse_args(args(pods[0], names)))
    ext.filter(parse_args(args(pods[1], names)))
    rec = ext.book.groups["ml/explicit/g"]
    assert len(rec.claims) == 2

    def live() -> int:
        bound = {p.uid for p in cache.bound_members("ml/explicit/g", "", scheduler_of(pods[0]))}
        claims = ext._state("", rec, now[0], bound)[1]
        # The count a request uses (set operations, no dict built) agrees with the claims listed,
        # for any pod asking: one of the claimants, a bound member, or another.
        for uid in ("", *rec.claims, *bound):
            expected = len({u for u in claims if u != uid})
            assert ext._live_claims(uid, rec, now[0], bound) == expected, uid
        return len(claims)

    # The first pod is bound: it counts as a member, its claim no longer double-counts.
    cache.upsert_pod({**pods[0], "spec": {**pods[0]["spec"], "nodeName": "eu-a-0"}})
    assert live() == 1
    now[0] += 61
    assert live() == 0
    # The group's last pod goes: the record is released at the next sweep.
    cache.delete_pod(pods[0]["metadata"]["uid"])
    now[0] += 61
    ext.filter(parse_args(args(pod("web"), names)))
    assert "ml/explicit/g" not in ext.book.groups


def test_a_request_naming_other_nodes_is_not_answered_from_the_last_ones():
    """The known and unknown NodeNames of the last request are kept while the next names the same
    nodes, compared joined: a different list of the same joined length, the same names in another
    order, or a node joining the cache in between is worked out again."""
    cfg = ExtenderConfig()
    cache = Cache(cfg)
    nodes = fleet(per_zone=3)
    cache.load_objects(nodes)
    ext = Extender(cfg, cache)
    names = [n["metadata"]["name"] for n in nodes]

    def failed(asked: list[str], i: int) -> dict[str, str]:
        result = ext.filter(parse_args(args(pod(f"p-{i}", gpus=8, **explicit(f"g{i}", 1)), asked)))
        return {n: r for r, ns in result.failed.items() for n in ns}

    unknown = "node is not in the extender's node cache yet"
    assert failed([*names, "ghost-1"], 0)["ghost-1"] == unknown
    assert failed([*names, "ghost-1"], 1)["ghost-1"] == unknown  # the same request again
    after = failed([*names, "ghost-2"], 2)  # same joined length, another node
    assert after["ghost-2"] == unknown and "ghost-1" not in after
    assert failed(["ghost-2", *names], 3)["ghost-2"] == unknown  # reordered
    cache.load_objects([node("ghost-2", zone="eu-a", region="eu")])
    assert "ghost-2" not in failed(["ghost-2", *names], 4)


async def test_metrics_count_decisions_by_outcome_and_level_and_time_requests():
    nodes = fleet(per_zone=2)
    names = [n["metadata"]["name"] for n in nodes]
    async with extender(nodes) as client:
        await filter_(client, pod("g-0", gpus=8, **explicit("g", 2)), names)
        await filter_(client, pod("w-0", gpus=8, **explicit("w", 3, locality="zone")), names)
        await filter_(client, pod("web"), names)
        text = await (await client.get("/metrics")).text()
        assert 'nodefabric_extender_decisions_total{level="zone",outcome="placed"} 1.0' in text
        assert 'nodefabric_extender_decisions_total{level="zone",outcome="never-fits"} 1.0' in text
        assert 'nodefabric_extender_decisions_total{level="none",outcome="pass-through"} 1.0' in text
        assert 'nodefabric_extender_request_duration_seconds_count{verb="filter"} 3.0' in text
        assert "nodefabric_extender_groups 2.0" in text
        assert "_created" not in text  # a series per child that says nothing here
        assert "process_resident_memory_bytes" in text and "python_info" in text
        assert (await client.get("/readyz")).status == 200


async def test_answers_use_pascal_case_exactly_as_kube_scheduler_decodes_them():
    nodes = fleet(per_zone=1)
    async with extender(nodes) as client:
        resp = await client.post("/prioritize", data=json.dumps(args(pod("web"), ["eu-a-0"])))
        assert await resp.json() == [{"Host": "eu-a-0", "Score": 0}]
        resp = await client.post("/filter", data=json.dumps(args(pod("web"), ["eu-a-0"])))
        assert set(await resp.json()) == {
            "Nodes",
            "NodeNames",
            "FailedNodes",
            "FailedAndUnresolvableNodes",
            "Error",
        }


async def test_in_process_api_builds_the_app_and_returns_a_group_summary():
    from aiohttp.test_utils import TestClient, TestServer

    from nodefabric_operator.extender import build_app, group_summary

    app = build_app(ExtenderConfig(), fleet(per_zone=2))
    assert group_summary(app, "ml/explicit/g") is None
    async with TestClient(TestServer(app)) as client:
        await filter_(client, pod("g-0", gpus=8, **explicit("g", 2)), ["us-a-0", "us-a-1", "eu-b-0"])
    summary = group_summary(app, "ml/explicit/g")
    assert summary is not None and summary.startswith("2 of 2 pods of group ml/explicit/g go to zone us-a")


async def test_a_body_nested_past_the_decoder_depth_is_a_400_and_the_service_keeps_serving():
    async with extender(fleet(per_zone=1)) as client:
        body = b'{"Pod": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        resp = await client.post("/filter", data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 400
        assert "request body is not JSON" in (await resp.json())["Error"]
        ok = await client.post("/filter", json=args(pod("web"), ["eu-a-0"]))
        assert ok.status == 200
