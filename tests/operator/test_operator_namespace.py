"""--namespace naming a namespace that does not exist (a typo), run as the operator runs against the
embedded API refusing objects in a missing namespace as a real API server does (404 NotFound, details
kind "namespaces"): one fact about the operator, said once and probed with one request at a time, not
retried per record."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import kubernetes
import pytest
from operator_harness import (
    DEVICES,
    NAMESPACE_NOT_FOUND_STATUS,
    NS,
    Probing,
    all_say,
    conditions,
    eventually,
    fleet,
    lines,
    running_operator,
    settle,
)

from nodefabric_devicemanager import crd
from nodefabric_operator import events, labels, nswait, sinks
from nodefabric_operator.demo.kubeapi import errors as kubeapi_errors
from nodefabric_operator.demo.kubeapi import running_api

RECORDS = 12
CAPABLE = labels.key(labels.DEFAULT_DOMAIN, labels.RDMA_CAPABLE)
MISSING = "the namespace for NodeFeatures does not exist: nothing is published until it does"
PROBED = "the namespace for NodeFeatures is still missing"
BACKOFFS = (0.1, 0.2)  # probes 0.1, 0.2, then doubling up to 1 s apart


async def test_a_missing_namespace_is_said_once_and_probed_with_one_request_at_a_time(caplog):
    """Every record's create was refused with the same 404 and retried on its own, through the backoffs
    and again 60 s after each round (187 creates a second at 5,000 records), each retry a WARNING line
    and each round an ERROR line. Now: one ERROR line naming the namespace, each record's condition
    written once, one create per probe whatever the number of records, and once the namespace is
    created every record is published."""
    caplog.set_level(logging.DEBUG, logger="nodefabric_operator")
    async with running_api([crd.devices_crd()], require_namespaces=True) as k:
        c = await fleet(k, RECORDS)
        async with running_operator(k, backoffs=BACKOFFS):
            await eventually(lambda: all_say(c, events.NAMESPACE_NOT_FOUND, RECORDS))
            said = (await conditions(c))["n0"]
            assert said["status"] == "False"
            assert (
                said["message"]
                == f"namespace {NS} (--namespace) does not exist: labels are published once it does"
            )
            since = Probing.now(k, caplog, PROBED)
            # At most the creates sent before the first refusal came back, and the probes since.
            assert since.creates <= RECORDS + since.probes + 1
            await since.one_create_per_probe(k, caplog)
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert [(r.getMessage(), r.namespace) for r in errors] == [(MISSING, NS)], errors
            await asyncio.to_thread(c.core.create_namespace, {"metadata": {"name": NS}})
            await eventually(lambda: all_say(c, "Published", RECORDS))
            await settle(k)
        for i in range(RECORDS):
            assert CAPABLE in (await c.nodefeature(f"n{i}"))["spec"]["labels"]
        (back,) = lines(
            caplog, "the namespace for NodeFeatures exists now, publishing the records that waited"
        )
        assert (
            back.namespace == NS and back.records == RECORDS - 1
        )  # the probe's own record was published first


async def test_a_restart_while_the_namespace_is_missing_writes_no_status_again(caplog):
    """The conditions already say so: a restart sends what it takes to find the namespace missing again
    (the creates under way before the first refusal, then the probes) and writes no record's status."""
    async with running_api([crd.devices_crd()], require_namespaces=True) as k:
        c = await fleet(k, RECORDS)
        async with running_operator(k, backoffs=BACKOFFS):
            await eventually(lambda: all_say(c, events.NAMESPACE_NOT_FOUND, RECORDS))
        statuses = k.count("PATCH", DEVICES)
        caplog.clear()
        caplog.set_level(logging.DEBUG, logger="nodefabric_operator")
        async with running_operator(k, backoffs=BACKOFFS):
            await eventually(lambda: lines(caplog, PROBED))
            assert k.count("PATCH", DEVICES) == statuses
        assert len(lines(caplog, MISSING)) == 1


def test_the_probe_backs_off_to_its_cap():
    got = nswait.delays((1, 2, 5, 10, 30, 60))
    assert [next(got) for _ in range(10)] == [1, 2, 5, 10, 30, 60, 120, 240, 300, 300]
    assert nswait.cap(()) == 5.0  # no backoffs (a test's reconciler): 1 s, doubling to 5 s


@pytest.mark.parametrize(
    ("status", "body", "missing"),
    [
        (
            404,
            NAMESPACE_NOT_FOUND_STATUS % (NS, NS),
            True,
        ),  # what kube-apiserver answers a create in a missing namespace
        (404, json.dumps(kubeapi_errors.namespace_not_found(NS).status()), True),  # the embedded API's
        (404, json.dumps(kubeapi_errors.no_such_resource().status()), False),  # no NodeFeature API
        (
            404,
            NAMESPACE_NOT_FOUND_STATUS % ("other", "other"),
            False,
        ),  # another namespace: not ours to wait for
        (404, "404 page not found", False),
        (403, NAMESPACE_NOT_FOUND_STATUS % (NS, NS), False),
    ],
    ids=["kube-apiserver", "embedded", "no-api", "other-namespace", "text", "not-404"],
)
def test_which_refusal_says_the_namespace_is_missing(status, body, missing):
    err = kubernetes.client.ApiException(status=status, reason="x")
    err.body = body
    assert sinks.missing_namespace(err, NS) is missing


# What kube-apiserver's NamespaceLifecycle answers a create in a namespace being deleted (its finalizers
# may keep it Terminating for minutes): 403, not 404, with the cause NamespaceTerminating.
TERMINATING = (
    '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nodefeatures.nfd.k8s-sigs.io'
    ' \\"n0\\" is forbidden: unable to create new content in namespace %s because it is being terminated",'
    '"reason":"Forbidden","details":{"name":"n0","group":"nfd.k8s-sigs.io","kind":"nodefeatures","causes":'
    '[{"reason":"NamespaceTerminating","message":"namespace %s is being terminated",'
    '"field":"metadata.namespace"}]},"code":403}'
)


@pytest.mark.parametrize(
    ("status", "body", "terminating"),
    [
        (403, TERMINATING % (NS, NS), True),
        (403, NAMESPACE_NOT_FOUND_STATUS % (NS, NS), False),  # another 403 (RBAC): a failure of its own
        (404, TERMINATING % (NS, NS), False),
        (403, '{"details":{"causes":"NamespaceTerminating"}}', False),
        (403, '{"details":{"causes":[["NamespaceTerminating"]]}}', False),
        (403, "[" * 100_000, False),
        (403, '"x"', False),
    ],
    ids=["kube-apiserver", "rbac", "not-403", "causes-text", "causes-lists", "deep", "text"],
)
def test_which_refusal_says_the_namespace_is_being_deleted(status, body, terminating):
    """A namespace deleted under the running operator is Terminating first: every record's create was a
    PublishFailed of its own (a Warning Event and a retry each) until it was gone. It is the same fact
    as a missing namespace, waited for the same way."""
    err = kubernetes.client.ApiException(status=status, reason="x")
    err.body = body
    assert sinks.terminating_namespace(err) is terminating
    assert sinks.missing_namespace(err, NS) is False


async def test_a_probe_outliving_its_round_leaves_the_next_rounds_probe_alone():
    """The namespace created (a write landed) and deleted again while a probe's publish was still under
    way (its retries): that publish, once done, cleared the next round's probe, whose record was then held
    like any other and sent nothing."""
    started = {n: asyncio.Event() for n in ("a", "b")}
    release = {n: asyncio.Event() for n in ("a", "b")}

    async def publish(name: str) -> Any:
        started[name].set()
        await release[name].wait()

    wait = nswait.NamespaceWait(NS, (0.01,), publish, lambda name: True)
    wait.absent("a")
    await started["a"].wait()
    first = wait._probe_task
    assert first is not None and wait.probing == "a"
    wait.present()  # another record's create landed
    wait.absent("b")  # and the namespace went again
    await started["b"].wait()
    release["a"].set()
    await first  # the first round's probe ends, seeing a new round
    assert wait.probing == "b"
    assert not wait.holds("b")  # the probe's own record still sends
    release["b"].set()
    wait.close()


async def test_a_refusal_answered_after_the_stop_starts_no_probe():
    """A publish under way as the operator stops, answered "namespace not found" after it: it started a
    probe that went on sending creates from an operator that was stopping."""

    async def publish(name: str) -> Any:
        raise AssertionError(f"{name} published after the stop")

    wait = nswait.NamespaceWait(NS, (0.01,), publish, lambda name: True)
    wait.close()
    wait.absent("a")
    assert wait._probe_task is None and wait.missing  # waits, said once, and nothing will send


async def test_the_probe_landing_after_the_stop_publishes_no_waiting_record_until_kopf_starts_again():
    """The probe's publish is left to end as the operator stops (close), and its create landed after the
    stop began: `present` published every waiting record in new tasks, which kopf, already past the
    tasks it waits for and cancels, let send their creates through its stop and the release of the
    lease (a burst of writes from an operator that was stopping). They wait for kopf's next start
    (a watched resource's 404), whose probe publishes them; a final stop sends nothing."""
    sent: list[str] = []
    probing = asyncio.Event()
    landed = asyncio.Event()

    async def publish(name: str) -> Any:
        sent.append(name)
        probing.set()
        await landed.wait()  # the probe's create is answered once the stop began; each after it lands
        wait.present()

    wait = nswait.NamespaceWait(NS, (0.01,), publish, lambda name: True)
    wait.absent("a")
    wait.absent("b")
    wait.absent("c")
    await probing.wait()
    probe = wait._probe_task
    assert probe is not None
    wait.close()  # kopf's cleanup: the probe's publish is under way, left to end
    landed.set()
    await probe
    for _ in range(5):
        await asyncio.sleep(0)
    assert sent == ["a"]  # nothing more sent after the stop
    wait.reopen()  # kopf started again: its probe finds the namespace, and the records are published
    await eventually(lambda: sorted(sent) == ["a", "b", "c"])
    wait.close()
