"""The mutating webhook: which pods get the gate (pure), and the AdmissionReview v1 server over real
HTTPS with real certificates, including a certificate rotated under it."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from world_fixtures import make_ca, make_server_cert, serving_webhook

from nodefabric_operator.admission.webhook import (
    MAX_BODY,
    MAX_WARNING,
    ReloadingTLS,
    ReviewError,
    WebhookConfig,
    gate_patch,
    parse_review,
)
from nodefabric_operator.extender.config import ExtenderConfig

GATE = "placement.gpustack.ai/group"
CONFIG = WebhookConfig()


def pod(
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "w0",
            "namespace": "ml",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"containers": [{"name": "c", "image": "img"}], **spec},
    }


JOB = {"batch.kubernetes.io/job-name": "train"}


# --- which pods are gated (pure) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("the_pod", "opted_in", "reason"),
    [
        (pod(JOB), True, "gated"),
        (pod(JOB), False, "not opted in"),
        (pod({GATE: "g1"}), False, "gated"),
        (pod(annotations={GATE: "g1"}), False, "gated"),
        (
            pod({"leaderworkerset.sigs.k8s.io/name": "l", "leaderworkerset.sigs.k8s.io/size": "4"}),
            True,
            "gated",
        ),
        (pod(schedulingGroup={"podGroupName": "pg"}), True, "gated"),
        (pod(workloadRef={"name": "wl", "podGroup": "pg"}), True, "gated"),
        (pod(), True, "not in a group"),
        (pod({**JOB, "placement.gpustack.ai/admission": "disabled"}), True, "opted out"),
        (pod({GATE: "g1", "placement.gpustack.ai/admission": "disabled"}), False, "opted out"),
        (pod(JOB, nodeName="n1"), True, "already has a node"),
        (pod(JOB, schedulerName="volcano"), True, "scheduler volcano is not one nodefabric admits for"),
        (pod(JOB, schedulingGates=[{"name": GATE}]), True, "already gated"),
    ],
)
def test_which_pods_are_gated(the_pod: dict[str, Any], opted_in: bool, reason: str) -> None:
    verdict = gate_patch(the_pod, CONFIG, namespace_opted_in=opted_in)
    assert verdict.reason == reason
    if reason == "gated":
        assert verdict.patch == ({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]},)
    else:
        assert verdict.patch == ()


def test_other_gates_are_kept_and_ours_appended() -> None:
    verdict = gate_patch(
        pod(JOB, schedulingGates=[{"name": "kueue.x-k8s.io/admission"}]), CONFIG, namespace_opted_in=True
    )
    assert verdict.patch == ({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}},)


def test_the_gate_and_labels_follow_the_domain_and_schedulers() -> None:
    config = WebhookConfig(
        ExtenderConfig(domain="example.org"), scheduler_names=("default-scheduler", "mine")
    )
    verdict = gate_patch(
        pod({"placement.example.org/group": "g"}, schedulerName="mine"), config, namespace_opted_in=False
    )
    assert verdict.patch[0]["value"] == [{"name": "placement.example.org/group"}]
    assert gate_patch(pod({GATE: "g"}), config, namespace_opted_in=False).reason == "not opted in"


def test_an_unusable_group_annotation_passes_ungated_with_a_warning() -> None:
    verdict = gate_patch(
        pod({GATE: "g"}, {"placement.gpustack.ai/locality": "nowhere"}), CONFIG, namespace_opted_in=True
    )
    assert verdict.patch == ()
    assert verdict.reason == "invalid placement"
    assert "placement.gpustack.ai/locality 'nowhere' is not one of" in verdict.warning
    assert "not gated" in verdict.warning


def test_garbage_in_a_pod_never_raises() -> None:
    for weird in (
        {"metadata": {"labels": None}, "spec": None},
        {"metadata": {"labels": {GATE: 5}}, "spec": {"schedulingGates": None}},
        {"spec": {"schedulingGroup": "pg", "workloadRef": 3}},
    ):
        assert gate_patch(weird, CONFIG, namespace_opted_in=True).patch == ()


# --- AdmissionReview parsing --------------------------------------------------------------------------


def review(obj: Any = None, **request: Any) -> dict[str, Any]:
    req = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "ml",
        "object": pod(JOB) if obj is None else obj,
        **request,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "the body must be an AdmissionReview object, got list"),
        ({**review(), "apiVersion": "admission.k8s.io/v1beta1"}, "expected apiVersion admission.k8s.io/v1"),
        ({**review(), "request": None}, "request: must be an object"),
        (review(uid=""), "request.uid: must be a non-empty string"),
        (review(uid="x" * 200), "request.uid: must be a non-empty string"),
        (review(operation="EXPLODE"), "request.operation: must be CREATE"),
        (review(kind="Pod"), "request.kind: must be an object"),
        (review(obj=[1]), "request.object: must be an object, got list"),
        (review(obj={"metadata": "x"}), "request.object.metadata: must be an object, got str"),
        (
            review(obj={"spec": {"schedulingGates": "g"}}),
            "request.object.spec.schedulingGates: must be a list",
        ),
        (review(namespace=5), "request.namespace: must be a string"),
    ],
)
def test_a_malformed_review_says_what_is_wrong(body: Any, message: str) -> None:
    with pytest.raises(ReviewError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        parse_review(body)


# --- over HTTPS ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    d = tmp_path_factory.mktemp("certs")
    ca = make_ca(d)
    cert, key = make_server_cert(d, ca)
    other_ca = make_ca(d, "other-ca")
    cert2, key2 = make_server_cert(d, other_ca, name="rotated", cn="webhook-rotated")
    yield {"ca": ca[0], "cert": cert, "key": key, "other-ca": other_ca[0], "cert2": cert2, "key2": key2}


def client_ssl(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


async def post(
    url: str, ca: Path, body: bytes, content_type: str = "application/json"
) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, data=body, headers={"Content-Type": content_type}, ssl=client_ssl(ca)) as resp,
    ):
        return resp.status, await resp.json()


async def test_a_review_over_https_gets_a_jsonpatch(certs: dict[str, Path]) -> None:
    async with serving_webhook(CONFIG, certs["cert"], certs["key"]) as base:
        status, out = await post(base + "/mutate-pods", certs["ca"], json.dumps(review()).encode())
        assert status == 200
        assert (out["apiVersion"], out["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
        response = out["response"]
        assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
        assert response["allowed"] is True
        assert response["patchType"] == "JSONPatch"
        assert json.loads(base64.b64decode(response["patch"])) == [
            {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}
        ]
        # The explicit-only path leaves a Job's pod of an unlabelled namespace alone ...
        status, out = await post(base + "/mutate-pods/explicit", certs["ca"], json.dumps(review()).encode())
        assert (status, out["response"]) == (
            200,
            {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True},
        )
        # ... and gates a pod that names its group.
        named = json.dumps(review(pod({GATE: "g"}))).encode()
        status, out = await post(base + "/mutate-pods/explicit", certs["ca"], named)
        assert out["response"]["patchType"] == "JSONPatch"


async def test_other_operations_and_kinds_are_allowed_untouched(certs: dict[str, Path]) -> None:
    async with serving_webhook(CONFIG, certs["cert"], certs["key"]) as base:
        for body in (
            review(operation="UPDATE", oldObject=pod(JOB)),
            review(kind={"group": "apps", "version": "v1", "kind": "Deployment"}, obj={"spec": {}}),
            review(operation="DELETE", obj=None)
            | {"request": {**review()["request"], "operation": "DELETE", "object": None}},
        ):
            status, out = await post(base + "/mutate-pods", certs["ca"], json.dumps(body).encode())
            assert status == 200, out
            assert out["response"]["allowed"] is True
            assert "patch" not in out["response"]


async def test_a_warning_reaches_the_client(certs: dict[str, Path]) -> None:
    bad = review(pod({GATE: "g"}, {"placement.gpustack.ai/rank": "random"}))
    async with serving_webhook(CONFIG, certs["cert"], certs["key"]) as base:
        status, out = await post(base + "/mutate-pods", certs["ca"], json.dumps(bad).encode())
    assert status == 200
    assert out["response"]["allowed"] is True
    assert "patch" not in out["response"]
    assert "placement.gpustack.ai/rank 'random' is not one of" in out["response"]["warnings"][0]


@pytest.mark.parametrize("annotation", ["locality", "rank"])
async def test_a_value_of_megabytes_comes_back_cut_in_the_warning_and_the_log(
    certs: dict[str, Path], annotation: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 3 MB annotation value (and a pod name as long: admission comes before the API server's
    validation) is quoted cut with its length: echoed whole it made a 3 MB warning."""
    huge = "x" * 3_000_000
    obj = pod({GATE: "g"}, {f"placement.gpustack.ai/{annotation}": huge})
    obj["metadata"]["name"] = "p" * 3_000_000
    caplog.set_level(logging.INFO, logger="nodefabric_operator.admission.webhook")
    async with serving_webhook(CONFIG, certs["cert"], certs["key"]) as base:
        status, out = await post(base + "/mutate-pods", certs["ca"], json.dumps(review(obj)).encode())
    assert status == 200
    assert out["response"]["allowed"] is True
    [warning] = out["response"]["warnings"]
    assert len(warning) <= MAX_WARNING
    assert f"placement.gpustack.ai/{annotation} {'x' * 80!r} (3,000,000 characters) is not one of" in warning
    assert warning.endswith("the pod is not gated; it is scheduled on its own")
    [logged] = [r for r in caplog.records if r.getMessage() == "admission review"]
    assert logged.__dict__["pod"] == f"{'p' * 80!r} (3,000,000 characters)"
    assert logged.__dict__["verdict"] == "invalid placement"


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b"{not json", "application/json", 400, "request body is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "application/json", 400, "request body is not JSON"),
        (
            json.dumps({"kind": "Pod"}).encode(),
            "application/json",
            400,
            "not an AdmissionReview v1: expected apiVersion",
        ),
        (json.dumps(review()).encode(), "text/plain", 415, "Content-Type must be application/json"),
        (b"\xff\xfe", "application/json", 400, "request body is not JSON"),
    ],
    ids=["garbage", "deep", "not-a-review", "content-type", "not-utf8"],
)
async def test_malformed_bodies_get_a_clear_4xx(
    certs: dict[str, Path], body: bytes, content_type: str, status: int, message: str
) -> None:
    async with serving_webhook(CONFIG, certs["cert"], certs["key"]) as base:
        have, out = await post(base + "/mutate-pods", certs["ca"], body, content_type)
    assert have == status
    assert out["error"].startswith(message)


async def test_an_oversize_body_is_413(certs: dict[str, Path]) -> None:
    big = review(pod(JOB, annotations={"x": "y" * (MAX_BODY + 10)}))
    async with serving_webhook(CONFIG, certs["cert"], certs["key"]) as base:
        status, out = await post(base + "/mutate-pods", certs["ca"], json.dumps(big).encode())
        assert status == 413
        assert out["error"] == f"request body larger than {MAX_BODY} bytes"
        # The server is still there for the next review.
        status, _ = await post(base + "/mutate-pods", certs["ca"], json.dumps(review()).encode())
        assert status == 200


async def test_a_client_that_does_not_trust_the_ca_is_refused(certs: dict[str, Path]) -> None:
    async with serving_webhook(CONFIG, certs["cert"], certs["key"]) as base:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await post(base + "/mutate-pods", certs["other-ca"], json.dumps(review()).encode())


async def test_a_rotated_certificate_is_served_without_a_restart(
    certs: dict[str, Path], tmp_path: Path
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(certs["cert"].read_bytes())
    key.write_bytes(certs["key"].read_bytes())
    async with serving_webhook(CONFIG, cert, key) as base:
        body = json.dumps(review()).encode()
        assert (await post(base + "/mutate-pods", certs["ca"], body))[0] == 200
        # Half-rotated (the key first): the old pair goes on serving.
        key.write_bytes(certs["key2"].read_bytes())
        os.utime(key, ns=(1, 1))
        assert (await post(base + "/mutate-pods", certs["ca"], body))[0] == 200
        cert.write_bytes(certs["cert2"].read_bytes())
        assert (await post(base + "/mutate-pods", certs["other-ca"], body))[0] == 200
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await post(base + "/mutate-pods", certs["ca"], body)


def test_a_pair_that_does_not_load_at_start_is_an_error(certs: dict[str, Path]) -> None:
    with pytest.raises(ssl.SSLError):
        ReloadingTLS(certs["cert"], certs["key2"])
    with pytest.raises(OSError):
        ReloadingTLS(certs["cert"], certs["cert"].parent / "missing.key")


# --- end to end: the embedded API calls the webhook -----------------------------------------------------


def webhook_configuration(base: str, ca: Path) -> dict[str, Any]:
    """The two webhooks a cluster is given: opted-in namespaces, and pods naming a nodefabric group."""
    bundle = base64.b64encode(ca.read_bytes()).decode()
    rules = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]
    not_disabled = {"key": "placement.gpustack.ai/admission", "operator": "NotIn", "values": ["disabled"]}
    enabled = {"matchLabels": {"placement.gpustack.ai/admission": "enabled"}}
    common = {
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "rules": rules,
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "nodefabric-placement"},
        "webhooks": [
            {
                **common,
                "name": "namespaces.placement.gpustack.ai",
                "clientConfig": {"url": base + "/mutate-pods", "caBundle": bundle},
                "namespaceSelector": enabled,
                "objectSelector": {"matchExpressions": [not_disabled]},
            },
            {
                **common,
                "name": "groups.placement.gpustack.ai",
                "clientConfig": {"url": base + "/mutate-pods/explicit", "caBundle": bundle},
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "placement.gpustack.ai/admission", "operator": "NotIn", "values": ["enabled"]}
                    ]
                },
                "objectSelector": {"matchExpressions": [not_disabled, {"key": GATE, "operator": "Exists"}]},
            },
        ],
    }


async def test_pods_created_through_the_embedded_api_are_gated_by_the_webhook(certs: dict[str, Path]) -> None:
    from nodefabric_operator.demo.kubeapi import running_api

    async with serving_webhook(CONFIG, certs["cert"], certs["key"]) as base, running_api() as k:
        k.api.put_object(
            "v1/namespaces",
            {"metadata": {"name": "ml", "labels": {"placement.gpustack.ai/admission": "enabled"}}},
        )
        k.api.put_object("v1/namespaces", {"metadata": {"name": "plain"}})
        k.api.put_object(
            "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            webhook_configuration(base, certs["ca"]),
        )

        async def create(ns: str, name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
            body = pod(labels, **spec)
            body["metadata"] = {"name": name, "labels": labels}
            async with (
                aiohttp.ClientSession() as http,
                http.post(f"{k.url}/api/v1/namespaces/{ns}/pods", json=body) as resp,
            ):
                out: dict[str, Any] = await resp.json()
                assert resp.status == 201, out
                return out

        def gates(out: dict[str, Any]) -> list[str]:
            return [g["name"] for g in out["spec"].get("schedulingGates", [])]

        assert gates(await create("ml", "job-0", JOB)) == [GATE]
        assert gates(await create("ml", "solo", {})) == []
        assert gates(await create("ml", "out", {**JOB, "placement.gpustack.ai/admission": "disabled"})) == []
        assert gates(await create("ml", "bound", JOB, nodeName="n1")) == []
        assert gates(await create("plain", "job-0", JOB)) == []  # a plain Job never waits on nodefabric
        assert gates(await create("plain", "named", {GATE: "g"})) == [GATE]
        kept = await create("ml", "two", JOB, schedulingGates=[{"name": "example.com/other"}])
        assert gates(kept) == ["example.com/other", GATE]
        assert kept["status"]["conditions"][0]["reason"] == "SchedulingGated"


async def test_the_placement_configuration_alone_builds_the_app(certs: dict[str, Path]) -> None:
    """`nodefabric placement` hands its configuration file's model over: the gate follows its domain."""
    config = ExtenderConfig(domain="example.org")
    async with serving_webhook(config, certs["cert"], certs["key"]) as base:
        body = json.dumps(review(pod({"placement.example.org/group": "g"}))).encode()
        _, out = await post(base + "/mutate-pods/explicit", certs["ca"], body)
    assert json.loads(base64.b64decode(out["response"]["patch"]))[0]["value"] == [
        {"name": "placement.example.org/group"}
    ]


@pytest.mark.parametrize(
    "spec",
    [
        {"schedulingGroup": {"podGroupName": "g" * 100}},  # a DNS subdomain, too long for a label value
        {"workloadRef": {"name": "wl"}},  # names its Workload but no pod group
    ],
    ids=["long-pod-group", "no-pod-group"],
)
async def test_a_workload_group_the_placement_process_cannot_read_is_not_gated(
    certs: dict[str, Path], spec: dict[str, Any]
) -> None:
    """The placement process groups pods by group_of; a gate on a pod it finds in no group would never be
    removed: such a pod is let through ungated, with the reason."""
    async with serving_webhook(CONFIG, certs["cert"], certs["key"]) as base:
        status, out = await post(base + "/mutate-pods", certs["ca"], json.dumps(review(pod(**spec))).encode())
    assert status == 200
    assert "patch" not in out["response"], out
    assert out["response"]["warnings"][0].endswith("the pod is not gated; it is scheduled on its own")


async def test_a_body_that_never_arrives_is_answered_408_not_waited_for(certs: dict[str, Path]) -> None:
    """A client that sends the headers and part of the body, then nothing: the body is waited for only
    so long, and the connection closed (else each such client holds up to 7 MiB and a handler for ever)."""
    config = WebhookConfig(body_timeout=0.5)
    async with serving_webhook(config, certs["cert"], certs["key"]) as base:
        host, port = base.removeprefix("https://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port), ssl=client_ssl(certs["ca"]))
        head = (
            "POST /mutate-pods HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n{"
        )
        writer.write(head.encode())
        await writer.drain()
        try:
            # Bounded only so that a server waiting for ever fails the test rather than hanging it.
            answer = await asyncio.wait_for(reader.read(), 30)
        finally:
            writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request body not received within 0.5 s" in answer
