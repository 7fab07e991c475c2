"""The NodeFeature API not served (NFD's CRD not installed, or deleted under the running operator: NFD
uninstalled or reinstalled), run as the operator runs against the embedded API, which answers a create
of a resource it does not serve as a real API server does (404, no details naming a kind): one fact
about the operator, said once and probed with one request at a time, not retried per record."""

from __future__ import annotations

import asyncio
import json
import logging

import kmock
import kubernetes
import pytest
from operator_harness import (
    CRD_NAME,
    NAMESPACE_NOT_FOUND_STATUS,
    NS,
    Probing,
    all_say,
    conditions,
    crds,
    eventually,
    fleet,
    lines,
    nodefeature_crd,
    running_operator,
    settle,
)

from nodefabric_devicemanager import crd
from nodefabric_operator import events, labels, sinks
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.demo.kubeapi import errors as kubeapi_errors

RECORDS = 12
CAPABLE = labels.key(labels.DEFAULT_DOMAIN, labels.RDMA_CAPABLE)
CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
BACKOFFS = (0.1, 0.2)  # probes 0.1, 0.2, then doubling up to 1 s apart
MISSING = "the NodeFeature API is not served (NFD's CRD is not installed): nothing is published until it is"
PROBED = "the NodeFeature API is still not served"
BACK = "the NodeFeature API is served now, publishing the records that waited"


def reasons(k: RunningAPI) -> list[str]:
    """The reason of every Event posted."""
    posted = k.api.objects.items()
    return [o.get("reason") for key, o in posted if key[0] == kmock.resource("v1/events") and not o.deleted]


async def test_the_nodefeature_api_deleted_under_the_operator_is_said_once_and_probed_one_at_a_time(caplog):
    """NFD uninstalled under the running operator: its CRD deleted, every NodeFeature with it. Each record
    whose NodeFeature went was published again, its create refused 404, retried on its own through the
    backoffs and again after the longest (12 records sent 666 requests in 5 s), a WARNING per retry, an
    ERROR line and a PublishFailed Event per record and round. Now: one ERROR line saying the API is not
    served, each waiting record's condition written once (reason NodeFeatureAPINotFound), no Event, one
    create per probe; and once the CRD is installed again every record is published."""
    caplog.set_level(logging.DEBUG, logger="nodefabric_operator")
    async with running_api([crd.devices_crd(), nodefeature_crd()]) as k:
        c = await fleet(k, RECORDS)
        ext = await crds(c)
        async with running_operator(k, backoffs=BACKOFFS):
            await eventually(lambda: all_say(c, "Published", RECORDS))
            await settle(k)
            caplog.clear()
            await asyncio.to_thread(ext.delete_custom_resource_definition, CRD_NAME)

            async def waiting() -> list[str]:
                found = await conditions(c)
                return [n for n, x in found.items() if x["reason"] == events.NFD_NOT_FOUND]

            await eventually(waiting)
            await eventually(lambda: len(lines(caplog, PROBED)) >= 2)
            said = (await conditions(c))[(await waiting())[0]]
            assert said["status"] == "False" and "install NFD" in said["message"], said
            await Probing.now(k, caplog, PROBED).one_create_per_probe(k, caplog)
            assert all(
                x["reason"] in ("Published", events.NFD_NOT_FOUND) for x in (await conditions(c)).values()
            )
            # Ours: kopf says its own watch failed, which the operator restarts (cli._kopf).
            ours = [r for r in caplog.records if r.name.startswith("nodefabric_operator")]
            errors = [r.getMessage() for r in ours if r.levelno >= logging.ERROR]
            assert errors == [MISSING], errors
            retried = [r for r in caplog.records if r.getMessage() == "label publish failed, retrying"]
            assert retried == []
            await asyncio.to_thread(ext.create_custom_resource_definition, nodefeature_crd())
            await eventually(lambda: all_say(c, "Published", RECORDS))
            await settle(k)
        for i in range(RECORDS):
            assert CAPABLE in ((await c.nodefeature(f"n{i}")) or {}).get("spec", {}).get("labels", {})
        assert len(lines(caplog, BACK)) == 1
        assert events.PUBLISH_FAILED not in reasons(k)


OBJECT = (
    '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nodefeatures.nfd.k8s-sigs.io'
    ' \\"n0\\" not found","reason":"NotFound","details":{"name":"n0","group":"nfd.k8s-sigs.io",'
    '"kind":"nodefeatures"},"code":404}'
)


@pytest.mark.parametrize(
    ("status", "body", "api", "namespace"),
    [
        (404, "404 page not found\n", True, False),  # kube-apiserver, the group not served at all
        (404, json.dumps(kubeapi_errors.no_such_resource().status()), True, False),  # a Status, no details
        (404, '{"kind":"Status","code":404,"details":{}}', True, False),
        (404, NAMESPACE_NOT_FOUND_STATUS % (NS, NS), False, True),
        (404, OBJECT, False, False),  # an object's own 404 (a patch of one deleted): not the API
        (403, "404 page not found", False, False),
        (503, json.dumps(kubeapi_errors.no_such_resource().status()), False, False),
    ],
    ids=["kube-apiserver", "status", "empty-details", "namespace", "object", "not-404", "503"],
)
def test_which_refusal_says_the_nodefeature_api_is_missing(status, body, api, namespace):
    """A create's 404 names the namespace when that is missing; one that names nothing is the API's."""
    err = kubernetes.client.ApiException(status=status, reason="x")
    err.body = body
    assert sinks.missing_api(err) is api
    assert sinks.missing_namespace(err, NS) is namespace
