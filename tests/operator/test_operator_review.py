"""Review fixes: NUMA values that only look like digits, the operator's start-up errors and its API
client's lifetime, Node labels of a record deleted while the operator was down, and the labels
command's message for a bad domain."""

from __future__ import annotations

import pytest
from operator_harness import Client, eventually, running_operator, settle
from operator_records import devices, gpu, group, nic, nvlink

from nodefabric_devicemanager import crd
from nodefabric_operator import cli, labels, sinks
from nodefabric_operator.console import main
from nodefabric_operator.demo.kubeapi import running_api

NUMA = "feature.gpustack.ai/rdma.numa"
CAPABLE = "feature.gpustack.ai/rdma.capable"


@pytest.mark.parametrize("numa", ["²", "٣", "0²"])
def test_a_numa_value_of_non_ascii_digits_is_withheld_not_mangled(numa):
    # "²" made int() raise inside the reconcile; "٣" was published as node 3, a value nobody wrote.
    record = devices("n1", interfaces=[nic(numa=numa), nic("ens2f0", bus_id="0000:1b:00.0", numa="1")])
    result = labels.compute(record)
    assert NUMA not in result.labels
    assert [(w.key, w.value) for w in result.withheld] == [(NUMA, numa)]
    assert result.labels[CAPABLE] == "true"


def test_the_operator_without_a_usable_kubeconfig_exits_2_with_a_log_line(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "missing-kubeconfig"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(missing))  # serve() sets it from --kubeconfig: restored after
    assert main(["operator", "--standalone", "--kubeconfig", str(missing)]) == 2
    err = capsys.readouterr().err
    assert '"operator cannot start"' in err and "kube-config" in err, err
    assert "Traceback" not in err


async def test_the_operator_closes_its_api_client_when_it_stops(monkeypatch):
    clients = []

    def load_client(kubeconfig):
        api = real(kubeconfig)
        clients.append(api)
        return api

    real = cli.load_client
    monkeypatch.setattr(cli, "load_client", load_client)
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(
            devices("n1", interfaces=[nic()], groups=[group("nvidia", gpu(0, fabric=nvlink()))])
        )
        async with running_operator(k):
            await eventually(lambda: c.nodefeature("n1"))
            (api,) = clients
            assert len(api.rest_client.pool_manager.pools) > 0  # it did reach the API through this client
        assert len(api.rest_client.pool_manager.pools) == 0


def test_a_bad_domain_is_not_reported_as_an_unreadable_file(tmp_path, capsys):
    path = tmp_path / "devices.json"
    path.write_text("{}")
    assert main(["labels", "-f", str(path), "--domain", "Not_A_Domain"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nodefabric labels: label domain 'Not_A_Domain'"), err
    assert "cannot read" not in err


async def test_node_labels_of_a_record_deleted_while_the_operator_was_down_are_withdrawn_at_start():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        hand = {"example.com/rack": "r1"}
        await c.node("n1", hand)
        await c.node("n2", hand)
        await c.put_devices(devices("n1", interfaces=[nic()]))
        await c.put_devices(devices("n2", interfaces=[nic()]))
        ann = sinks.managed_annotation("gpustack.ai")
        async with running_operator(k, sink="node"):
            assert await eventually(lambda: _has(c, "n1", CAPABLE))
            await settle(k)
        await c.delete_devices("n1")  # while no operator runs: no DELETED event will ever reach it
        async with running_operator(k, sink="node") as metrics:
            assert await eventually(lambda: metrics.reconciles.labels(outcome="withdrawn")._value.get() >= 1)
            await settle(k)
        assert await c.node_labels("n1") == hand
        assert ann not in await c.node_annotations("n1")
        # The node whose record still exists keeps what we wrote.
        assert await c.node_labels("n2") == {**hand, CAPABLE: "true", NUMA: "0"}


async def _has(c: Client, node: str, key: str) -> bool:
    return key in await c.node_labels(node)
