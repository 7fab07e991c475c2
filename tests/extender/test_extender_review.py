"""Review fixes: an invalid placement is recorded and told once per pod; a body nested past the JSON
decoder's depth is a 400, not a server error; a group that never fits is logged once per verdict."""

from __future__ import annotations

import logging

from extender_fixtures import Recorder, args, explicit, extender, filter_, fleet, pod


async def test_an_invalid_placement_is_told_once_per_pod_and_shown_in_debug_groups():
    nodes = fleet(per_zone=1)
    names = [n["metadata"]["name"] for n in nodes]
    recorder = Recorder()
    async with extender(nodes, publisher=recorder) as client:
        bad = pod("bad-0", **explicit("g", 2, locality="closest"))
        for _ in range(3):  # kube-scheduler retries an unschedulable pod
            result = await filter_(client, bad, names)
            assert result["NodeNames"] == [] and set(result["FailedAndUnresolvableNodes"]) == set(names)
        other = pod("bad-1", **explicit("g", 2, locality="closest"))
        await filter_(client, other, names)

        told = [(name, type_, reason) for name, type_, reason, _ in recorder.events]
        assert told == [("bad-0", "Warning", "InvalidPlacement"), ("bad-1", "Warning", "InvalidPlacement")]
        assert "placement.gpustack.ai/locality 'closest' is not one of" in recorder.events[0][3]

        (group,) = await (await client.get("/debug/groups")).json()
        assert (group["group"], group["outcome"]) == ("ml/explicit/g", "invalid")
        assert group["summary"] == recorder.events[0][3]


async def test_a_bad_group_size_is_recorded_under_its_group():
    nodes = fleet(per_zone=1)
    names = [n["metadata"]["name"] for n in nodes]
    async with extender(nodes) as client:
        bad = pod("jb-0", labels={"batch.kubernetes.io/job-name": "jb"})
        bad["metadata"]["annotations"]["placement.gpustack.ai/group-size"] = "eight"
        await filter_(client, bad, names)
        (group,) = await (await client.get("/debug/groups")).json()
        assert (group["group"], group["outcome"]) == ("ml/job/jb", "invalid")
        assert "group-size: group size 'eight': not a plain ASCII decimal number" in group["summary"]


async def test_a_body_nested_past_the_decoder_depth_is_a_400_and_the_service_keeps_serving():
    async with extender(fleet(per_zone=1)) as client:
        body = b'{"Pod": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        resp = await client.post("/filter", data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 400
        assert "request body is not JSON" in (await resp.json())["Error"]
        ok = await client.post("/filter", json=args(pod("web"), ["eu-a-0"]))
        assert ok.status == 200


async def test_a_group_that_never_fits_is_logged_once_per_verdict_not_per_retry(caplog):
    nodes = fleet()  # 6 nodes per zone: no zone holds 7 one-node pods
    names = [n["metadata"]["name"] for n in nodes]
    async with extender(nodes) as client:
        with caplog.at_level(logging.WARNING, logger="nodefabric_operator.extender.service"):
            for i in range(3):
                p = pod(f"train-{i}", gpus=8, **explicit("train", 7, locality="zone"))
                for _ in range(2):
                    result = await filter_(client, p, names)
                    assert len(result["FailedAndUnresolvableNodes"]) == 30
    lines = [r for r in caplog.records if r.getMessage() == "group never fits"]
    assert len(lines) == 1
    assert "no zone of one nvidia.com/gpu.product can hold the 7 pods" in lines[0].__dict__["summary"]
