"""`nodefabric operator --prune`, the chart's post-delete hook: what the operator published is taken
back (its NodeFeatures deleted, or its keys removed from Nodes) and nothing of anyone else's, run as the
command runs against the embedded API."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

import pytest
from aiohttp import web
from operator_harness import NS, Client, answering_api, eventually, running_operator, settle
from operator_records import gpu_record
from watch_breaker import watch_breaker

from nodefabric_devicemanager import crd
from nodefabric_operator import cli, labels, sinks
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api, write_kubeconfig

D = labels.DEFAULT_DOMAIN
CAPABLE = labels.key(D, labels.RDMA_CAPABLE)
NF_KEY = f"{sinks.NFD_GROUP}/{sinks.NFD_VERSION}/{sinks.NFD_PLURAL}"


def prune_args(k: RunningAPI, *extra: str, kubeconfig: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(
        [
            "--prune",
            "--namespace",
            NS,
            "--kubeconfig",
            kubeconfig or k.kubeconfig,
            "--prune-settle",
            "0.2",
            *extra,
        ]
    )


async def prune(k: RunningAPI, *extra: str, kubeconfig: str | None = None) -> int:
    return await asyncio.to_thread(cli.run, prune_args(k, *extra, kubeconfig=kubeconfig))


def nodefeature(name: str, namespace: str = NS, *, owned: bool = False) -> dict:
    meta: dict = {"name": name, "namespace": namespace, "labels": {sinks.NFD_NODE_NAME: name}}
    if owned:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-1", "controller": True}
        ]
    return {"apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature", "metadata": meta,
            "spec": {"labels": {"example.com/team": "a"}}}  # fmt: skip


async def test_the_operators_nodefeatures_are_deleted_and_no_one_elses(caplog):
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        for n in ("n0", "n1", "n2"):
            await c.node(n)
            await c.put_devices(gpu_record(n))
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 3)
            await settle(k)
        k.api.put_object(
            "v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "nfd"}}
        )
        k.api.put_object(NF_KEY, nodefeature("n0", "nfd"))  # nfd-worker's own, elsewhere
        k.api.put_object(NF_KEY, nodefeature("hand"))  # in our namespace, but nobody's record owns it
        k.api.put_object(NF_KEY, nodefeature("other", owned=True))  # controlled by something else
        with caplog.at_level(logging.INFO):
            assert await prune(k) == 0
        for n in ("n0", "n1", "n2"):
            assert await c.nodefeature(n) is None
        for name, ns in (("n0", "nfd"), ("hand", NS), ("other", NS)):
            assert k.api.stored(NF_KEY, name, ns) is not None, (name, ns)
        assert k.count("DELETE", "nfd.k8s-sigs.io/v1alpha1/nodefeatures") == 3
        pruned = [r for r in caplog.records if r.getMessage() == "pruned"]
        assert [(r.removed, r.passes) for r in pruned] == [(3, 2)]  # a second pass found nothing
        # Again: nothing left, nothing deleted.
        assert await prune(k) == 0
        assert k.count("DELETE", "nfd.k8s-sigs.io/v1alpha1/nodefeatures") == 3


async def test_with_the_node_sink_only_the_keys_the_operator_wrote_are_removed():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n0", labels={"example.com/rack": "r1", labels.key(D, "rdma.hand"): "x"})
        await c.put_devices(gpu_record("n0"))
        async with running_operator(k, sink="node"):
            await eventually(lambda: _has(c, "n0", CAPABLE))
            await settle(k)
        assert await prune(k, "--sink", "node") == 0
        left = await c.node_labels("n0")
        assert left == {"example.com/rack": "r1", labels.key(D, "rdma.hand"): "x"}  # a hand-set key stays
        assert sinks.managed_annotation(D) not in await c.node_annotations("n0")


async def _has(c: Client, node: str, key: str) -> bool:
    return key in await c.node_labels(node)


async def test_without_a_nodefeature_api_there_is_nothing_to_prune(caplog):
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        proxy.refuse("GET", f"/apis/{sinks.NFD_GROUP}/", 404)
        with caplog.at_level(logging.INFO):
            assert await prune(k, kubeconfig=proxy.kubeconfig) == 0
        assert any(r.getMessage() == "nothing to prune" for r in caplog.records)


async def test_a_refusal_is_one_line_and_exit_1(caplog):
    async with running_api([crd.devices_crd()]) as k, watch_breaker(k.url) as proxy:
        proxy.refuse("GET", f"/apis/{sinks.NFD_GROUP}/", 403)
        assert await prune(k, kubeconfig=proxy.kubeconfig) == 1
        (line,) = [r for r in caplog.records if r.getMessage() == "prune refused"]
        assert line.error.startswith("HTTP 403")


async def test_an_operator_still_running_recreates_them_and_prune_says_so(caplog):
    """A terminating operator pod may recreate a NodeFeature just deleted: the passes repeat, and if the
    operator never stops, prune gives up at its timeout with exit 1 and a reason."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(gpu_record("n0"))
        async with running_operator(k) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 1)
            assert await prune(k, "--prune-timeout", "3") == 1
        (line,) = [r for r in caplog.records if r.getMessage() == "prune did not finish"]
        assert line.error == f"nodefeatures in {NS} kept coming back: is an operator still running?"
        assert line.removed >= 2
        # Once it has stopped, one more prune finishes.
        assert await prune(k) == 0
        assert await c.nodefeature("n0") is None


def test_an_unusable_kubeconfig_is_exit_2(tmp_path, caplog):
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: 7\n")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["--prune", "--kubeconfig", str(bad)])) == 2
    assert any(r.getMessage() == "prune cannot start" for r in caplog.records)


async def test_an_api_server_that_never_answers_is_given_up_at_the_timeout(tmp_path, caplog):
    """A request no answer comes to (an overloaded API server, a black-holed load balancer) must not
    hold the hook past --prune-timeout: the Job's deadline would kill it later, saying nothing."""
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read the request, answer nothing, keep the connection open

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    kubeconfig = write_kubeconfig(f"http://127.0.0.1:{port}", str(tmp_path))
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--prune", "--kubeconfig", kubeconfig, "--prune-timeout", "2"])
    try:
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(asyncio.to_thread(cli.run, args), 30) == 1
        assert asyncio.get_running_loop().time() - started < 10
    finally:
        for w in held:
            w.close()
        server.close()
    (line,) = [r for r in caplog.records if r.getMessage() == "prune did not finish"]
    assert "did not answer" in line.error, line.error


POD_OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "nfd-worker-x7", "uid": "p-1"}


@pytest.mark.parametrize(
    ("owners", "said"),
    [
        ([{**POD_OWNER, "controller": True}], "belongs to Pod nfd-worker-x7"),
        ([POD_OWNER], "belongs to Pod nfd-worker-x7"),
        ([], "was not made by nodefabric (it names no owner"),
    ],
    ids=["its-controller", "no-controller", "no-owner"],
)
async def test_nfd_workers_own_nodefeature_in_the_same_namespace_is_never_taken_over(owners, said):
    """Installed in NFD's namespace, the operator finds nfd-worker's NodeFeature: also named after the
    node, with the node-name label, owned by the worker's Pod. It was patched as if it were ours (our
    labels and a second controller, which the API server refuses; without the Pod reference it was
    adopted, and the next prune or the record's deletion deleted nfd-worker's object). Now it is left as
    it is, and LabelsPublished says whose it is and what to do. nfd-worker run as a bare Pod (no
    DaemonSet: nothing for it to inherit) names its Pod with no `controller` flag (nfd-worker never sets
    one): another writer named among its owners makes it theirs, controller or not. One naming no owner
    at all (an older nfd-worker's, or a user's by hand) and without the operator's managed-by label is
    not the operator's either: it was adopted (our owner added), and so deleted with the record or by
    the next prune."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n0")
        worker = nodefeature("n0")
        if owners:
            worker["metadata"]["ownerReferences"] = owners
        worker["spec"] = {"labels": {"feature.node.kubernetes.io/cpu-model.vendor_id": "Intel"}}
        k.api.put_object(NF_KEY, worker)
        before = k.api.stored(NF_KEY, "n0", NS)
        await c.put_devices(gpu_record("n0"))
        async with running_operator(k):

            async def refused() -> Any:
                conditions = (await c.devices("n0")).get("status", {}).get("conditions", [])
                return next((x for x in conditions if x["type"] == "LabelsPublished"), None)

            cond = await eventually(refused)
            await settle(k)
        assert cond["status"] == "False", cond
        assert said in cond["message"], cond["message"]
        posted = await asyncio.to_thread(c.core.list_event_for_all_namespaces)
        warned = [e for e in posted.items if e.type == "Warning"]
        assert [e.involved_object.name for e in warned] == ["n0"], warned
        assert said in warned[0].message
        assert k.api.stored(NF_KEY, "n0", NS) == before, "nfd-worker's object untouched"
        assert await prune(k) == 0
        assert k.api.stored(NF_KEY, "n0", NS) == before, "and never pruned"


DEVICES_OWNER = {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "Devices", "name": "n0", "uid": "d-1"}
POD = {"apiVersion": "v1", "kind": "Pod", "name": "nfd-worker-x7", "uid": "p-1"}
DAEMONSET = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "name": "nfd-worker",
    "uid": "ds-1",
    "controller": True,
}


@pytest.mark.parametrize(
    ("refs", "whose"),
    [
        ([], sinks.UNCLAIMED),  # a user's, or an older nfd-worker's: never adopted
        ([POD], "Pod nfd-worker-x7"),
        ([DAEMONSET, POD], "DaemonSet nfd-worker"),  # what nfd-worker run by a DaemonSet names
        ([{**DEVICES_OWNER, "controller": True}, POD], ""),  # ours, someone's owner added beside
        ([{**DEVICES_OWNER, "uid": "d-0"}], ""),  # a record since created again: still ours
        ([DEVICES_OWNER, DAEMONSET], "DaemonSet nfd-worker"),  # another controller: never ours
    ],
)
def test_whose_nodefeature_it_is(refs, whose):
    assert sinks.foreign_owner(refs) == whose


def test_a_nodefeature_of_ours_whose_owners_were_removed_is_still_ours():
    """The operator's managed-by label, written with its owner, tells its own object stripped of its
    owners (repaired: test_operator_hostile) from one nobody claims (left alone)."""
    assert sinks.foreign_owner([], marked=True) == ""
    assert sinks.foreign_owner([POD], marked=True) == "Pod nfd-worker-x7"


async def test_a_list_answered_with_garbage_is_a_failed_pass_and_exit_1(tmp_path, caplog):
    """A list page that is no list page (a proxy's answer: a JSON list here) fails the pass, retried as a
    connection error is, and prune gives up at its timeout with exit 1 naming what came: no traceback."""

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=b"[]", content_type="application/json")

    runner, kubeconfig = await answering_api(tmp_path, answer)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        ["--prune", "--kubeconfig", kubeconfig, "--prune-timeout", "1", "--prune-settle", "0.2"]
    )
    try:
        assert await asyncio.wait_for(asyncio.to_thread(cli.run, args), 30) == 1
    finally:
        await runner.cleanup()
    (line,) = [r for r in caplog.records if r.getMessage() == "prune did not finish"]
    assert line.error == "the API server answered a list, not an object", line.error
    assert any(r.getMessage() == "prune pass failed, retrying" for r in caplog.records)
