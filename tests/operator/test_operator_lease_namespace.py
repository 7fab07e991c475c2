"""--leader-elect with --namespace naming a namespace that does not exist (a typo, or one not created
yet), run as the operator runs against the embedded API refusing objects in a missing namespace as a
real API server does: the Lease cannot be created, so no replica leads. It used to say only "waiting to
lead" (INFO, as a standby does) and try again every retry period for ever: a silently idle operator.
Now one ERROR line says why, and the tries back off, doubling; once the namespace exists it leads."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from operator_harness import NS, Client, answering_api, eventually
from operator_records import devices, gpu, group, nic, nvlink
from test_operator_leader import Replica, lease

from nodefabric_devicemanager import crd
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator import leader
from nodefabric_operator.demo.kubeapi import running_api

MISSING = "cannot take the lease: its namespace is missing, nothing is published until it exists"
PROBED = "the lease's namespace is still missing"
LEASES = "coordination.k8s.io/v1/leases"


async def test_a_lease_in_a_missing_namespace_is_one_error_and_a_backed_off_retry(caplog):
    caplog.set_level(logging.DEBUG, logger="nodefabric_operator")
    async with running_api([crd.devices_crd()], require_namespaces=True) as k:
        c = Client(k.kubeconfig)
        await c.node("n0")
        await c.put_devices(
            devices("n0", interfaces=[nic()], groups=[group("nvidia", gpu(0, fabric=nvlink()))])
        )
        a = Replica(k)
        try:
            await eventually(lambda: len([r for r in caplog.records if r.getMessage() == PROBED]) >= 4)
            probes = [r for r in caplog.records if r.getMessage() == PROBED]
            waits = [r.retry_in_s for r in probes]
            assert waits[:4] == [0.1, 0.2, 0.4, 0.8], waits  # TIMING's retry, doubling
            # Two requests a try (the read, the create), the first try's included: no hot loop.
            assert k.count("POST", LEASES) <= len(probes) + 2
            assert a.published() == 0 and a.thread.is_alive() and not a.failure
            (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert error.getMessage() == MISSING
            assert error.error == f"namespace {NS} does not exist"
            await asyncio.to_thread(c.core.create_namespace, {"metadata": {"name": NS}})
            await eventually(lambda: a.published() == 1, timeout=60)
            assert lease(k)["spec"]["holderIdentity"]
        finally:
            await a.stopped()
        assert not a.failure
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [MISSING]


def test_the_tries_back_off_to_five_minutes():
    got = leader.absent_delays(2.0)
    assert [next(got) for _ in range(10)] == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]


TERMINATING = (
    '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"leases.coordination.k8s.io'
    ' \\"nodefabric-operator\\" is forbidden: unable to create new content in namespace nodefabric because it'
    ' is being terminated","reason":"Forbidden","details":{"name":"nodefabric-operator","group":'
    '"coordination.k8s.io","kind":"leases","causes":[{"reason":"NamespaceTerminating","message":"namespace'
    ' nodefabric is being terminated","field":"metadata.namespace"}]},"code":403}'
)


async def test_a_lease_namespace_being_deleted_waits_as_a_missing_one(tmp_path, caplog):
    """kube-apiserver refuses a create in a namespace being deleted with 403 NamespaceTerminating: a
    refusal the elector took for RBAC, so the operator exited 2 at start ("cannot take the lease: HTTP
    403"). It is the namespace missing for a while: said once, tried again with backoff."""

    async def answer(request: web.Request) -> web.Response:
        if request.method == "POST":
            return web.Response(status=403, text=TERMINATING, content_type="application/json")
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "NotFound",
            "code": 404,
        }
        return web.json_response(status, status=404)

    runner, kubeconfig = await answering_api(tmp_path, answer)
    try:
        elector = leader.Elector(
            load_client(kubeconfig), leader.LeaseConfig(NS, "nodefabric-operator", "me", 2.0, 1.0, 0.1)
        )
        caplog.set_level(logging.DEBUG, logger="nodefabric_operator")
        tries = 0

        def stopping() -> bool:
            nonlocal tries
            tries += 1
            return tries > 4

        assert await elector.acquire(stopping) is False
    finally:
        await runner.cleanup()
    (error,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.getMessage() == MISSING and error.error == f"namespace {NS} is being deleted"
    assert [r.retry_in_s for r in caplog.records if r.getMessage() == PROBED] == [0.1, 0.2, 0.4, 0.8]
