"""The embedded API calls MutatingWebhookConfigurations on a pod's creation as a real API server does:
AdmissionReview v1 over HTTPS trusting the caBundle, namespace and object selectors, failurePolicy,
timeoutSeconds, JSONPatch applied, warnings passed on, and the API server's refusals. The webhook here is
a small HTTPS server each test tells how to answer."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from nodefabric_operator.demo.kubeapi import RunningAPI, running_api

MWC = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
PODS = "/api/v1/namespaces/ml/pods"
GATE = {"name": "placement.gpustack.ai/group"}
ADD_GATE = [{"op": "add", "path": "/spec/schedulingGates", "value": [GATE]}]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    d = tmp_path_factory.mktemp("certs")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={ca}",
                 "-keyout", str(d / f"{ca}.key"), "-out", str(d / f"{ca}.crt"))  # fmt: skip
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=hook",
             "-keyout", str(d / "hook.key"), "-out", str(d / "hook.csr"))  # fmt: skip
    _openssl("x509", "-req", "-in", str(d / "hook.csr"), "-CA", str(d / "ca.crt"),
             "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1", "-out", str(d / "hook.crt"),
             "-extfile", str(d / "san.cnf"))  # fmt: skip
    yield {"ca": d / "ca.crt", "other-ca": d / "other-ca.crt", "cert": d / "hook.crt", "key": d / "hook.key"}


Answer = Callable[[dict[str, Any]], Any]


class Hook:
    """An HTTPS webhook whose answer a test sets; it records every review it received."""

    def __init__(self) -> None:
        self.reviews: list[dict[str, Any]] = []
        self.answer: Answer = lambda review: allow(review, ADD_GATE)
        self.port = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        review = await request.json()
        self.reviews.append(review)
        out = self.answer(review)
        if asyncio.iscoroutine(out):
            out = await out
        if isinstance(out, web.StreamResponse):
            return out
        return web.json_response(out)


def allow(review: dict[str, Any], patch: list[dict[str, Any]] | None = None, **more: Any) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True, **more}
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


@pytest.fixture
async def hook(certs: dict[str, Path]) -> AsyncIterator[Hook]:
    h = Hook()
    app = web.Application()
    app.router.add_post("/mutate", h.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs["cert"], certs["key"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        h.port = s.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", h.port, ssl_context=ctx).start()
    yield h
    await runner.cleanup()


@pytest.fixture
async def k() -> AsyncIterator[RunningAPI]:
    async with running_api() as api:
        api.api.put_object(
            "v1/namespaces",
            {"metadata": {"name": "ml", "labels": {"placement.gpustack.ai/admission": "enabled"}}},
        )
        api.api.put_object("v1/namespaces", {"metadata": {"name": "other"}})
        yield api


def configuration(hook: Hook, ca: Path, name: str = "nodefabric", **webhook: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": "pods.placement.gpustack.ai",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "clientConfig": {
            "url": f"https://127.0.0.1:{hook.port}/mutate",
            "caBundle": base64.b64encode(ca.read_bytes()).decode(),
        },
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "namespaceSelector": {"matchLabels": {"placement.gpustack.ai/admission": "enabled"}},
        "objectSelector": {
            "matchExpressions": [
                {"key": "placement.gpustack.ai/admission", "operator": "NotIn", "values": ["disabled"]}
            ]
        },
        "failurePolicy": "Ignore",
        "timeoutSeconds": 2,
        **webhook,
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [entry],
    }


def pod(name: str = "w0", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "img"}]},
    }


async def create(
    k: RunningAPI, body: dict[str, Any], ns: str = "ml"
) -> tuple[int, dict[str, Any], list[str]]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{k.url}/api/v1/namespaces/{ns}/pods", json=body) as resp,
    ):
        return resp.status, await resp.json(), resp.headers.getall("Warning", [])


async def test_a_matching_webhook_gets_a_review_and_its_patch_is_applied(
    k: RunningAPI, hook: Hook, certs: dict[str, Path]
) -> None:
    k.api.put_object(MWC, configuration(hook, certs["ca"]))
    status, out, _ = await create(k, pod())
    assert status == 201, out
    assert out["spec"]["schedulingGates"] == [GATE]
    assert (
        out["status"]["conditions"][0]["reason"] == "SchedulingGated"
    )  # the gate counts as created with the pod
    [review] = hook.reviews
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    request = review["request"]
    assert request["operation"] == "CREATE"
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert (request["namespace"], request["name"]) == ("ml", "w0")
    assert request["object"]["metadata"]["name"] == "w0"
    assert request["object"]["metadata"]["namespace"] == "ml"
    assert len(request["uid"]) == 36


async def test_selectors_decide_who_is_sent(k: RunningAPI, hook: Hook, certs: dict[str, Path]) -> None:
    k.api.put_object(MWC, configuration(hook, certs["ca"]))
    status, out, _ = await create(k, pod(), ns="other")  # namespace not labelled
    assert status == 201 and "schedulingGates" not in out["spec"]
    status, out, _ = await create(k, pod("w1", {"placement.gpustack.ai/admission": "disabled"}))  # opted out
    assert status == 201 and "schedulingGates" not in out["spec"]
    assert hook.reviews == []
    by_name = configuration(
        hook,
        certs["ca"],
        name="by-name",
        namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": "other"}},
    )
    k.api.put_object(MWC, by_name)
    status, out, _ = await create(k, pod("w2"), ns="other")
    assert status == 201 and out["spec"]["schedulingGates"] == [GATE]


async def test_rules_must_name_the_operation_and_resource(
    k: RunningAPI, hook: Hook, certs: dict[str, Path]
) -> None:
    rules = [{"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]
    k.api.put_object(MWC, configuration(hook, certs["ca"], rules=rules))
    k.api.put_object(
        MWC,
        configuration(
            hook,
            certs["ca"],
            name="deployments",
            rules=[{**rules[0], "operations": ["*"], "resources": ["deployments"]}],
        ),
    )
    status, out, _ = await create(k, pod())
    assert status == 201 and "schedulingGates" not in out["spec"]
    assert hook.reviews == []


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
@pytest.mark.parametrize(
    ("fault", "why"),
    [
        ("status", "the server responded with status 500"),
        ("garbage", "received invalid webhook response"),
        ("uid", "expected response.uid="),
        ("patch", "the patch does not apply"),
        ("slow", "context deadline exceeded"),
        ("untrusted", "certificate verify failed"),
        ("down", "Cannot connect to host"),
    ],
)
async def test_a_failing_webhook_follows_its_failure_policy(
    k: RunningAPI, hook: Hook, certs: dict[str, Path], *, policy: str, fault: str, why: str
) -> None:
    async def answer(review: dict[str, Any]) -> Any:
        if fault == "status":
            return web.Response(status=500, text="boom")
        if fault == "garbage":
            return web.Response(text="{not json", content_type="application/json")
        if fault == "uid":
            return allow({"request": {"uid": "someone-else"}})
        if fault == "patch":
            return allow(review, [{"op": "remove", "path": "/spec/nothing"}])
        if fault == "slow":
            await asyncio.sleep(3)
        return allow(review, ADD_GATE)

    hook.answer = answer
    ca = certs["other-ca"] if fault == "untrusted" else certs["ca"]
    config = configuration(hook, ca, failurePolicy=policy, timeoutSeconds=1)
    if fault == "down":
        config["webhooks"][0]["clientConfig"]["url"] = "https://127.0.0.1:1/mutate"
    k.api.put_object(MWC, config)
    status, out, _ = await create(k, pod())
    if policy == "Ignore":
        assert status == 201, out
        assert "schedulingGates" not in out["spec"]
        assert k.api.stored("v1/pods", "w0", "ml") is not None
    else:
        assert status == 500, out
        assert out["reason"] == "InternalError"
        assert out["message"].startswith(
            'Internal error occurred: failed calling webhook "pods.placement.gpustack.ai": '
            "failed to call webhook: "
        )
        assert why in out["message"]
        assert k.api.stored("v1/pods", "w0", "ml") is None


async def test_a_denial_refuses_the_pod_with_the_webhooks_status(
    k: RunningAPI, hook: Hook, certs: dict[str, Path]
) -> None:
    hook.answer = lambda review: {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": review["request"]["uid"],
            "allowed": False,
            "status": {"code": 422, "message": "no"},
        },
    }
    k.api.put_object(MWC, configuration(hook, certs["ca"]))
    status, out, _ = await create(k, pod())
    assert status == 422
    assert out["message"] == 'admission webhook "pods.placement.gpustack.ai" denied the request: no'
    assert k.api.stored("v1/pods", "w0", "ml") is None


async def test_warnings_reach_the_client(k: RunningAPI, hook: Hook, certs: dict[str, Path]) -> None:
    hook.answer = lambda review: allow(review, None, warnings=["the pod is not gated"])
    k.api.put_object(MWC, configuration(hook, certs["ca"]))
    status, _, warnings = await create(k, pod())
    assert status == 201
    assert warnings == ['299 - "the pod is not gated"']


async def test_a_patched_pod_is_validated_as_the_api_server_does(
    k: RunningAPI, hook: Hook, certs: dict[str, Path]
) -> None:
    """A webhook that adds a gate to a pod created with nodeName makes an invalid pod: refused, 422."""
    k.api.put_object(MWC, configuration(hook, certs["ca"]))
    body = pod()
    body["spec"]["nodeName"] = "n1"
    status, out, _ = await create(k, body)
    assert status == 422
    assert (
        "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared"
        in out["message"]
    )
    hook.answer = lambda review: allow(
        review, [{"op": "replace", "path": "/metadata/name", "value": "renamed"}]
    )
    status, out, _ = await create(k, pod("w5"))
    assert status == 201 and out["metadata"]["name"] == "w5"  # a webhook may not rename the object


async def test_a_service_reference_is_resolved_through_the_services_table(
    k: RunningAPI, hook: Hook, certs: dict[str, Path]
) -> None:
    config = configuration(hook, certs["ca"], failurePolicy="Fail")
    config["webhooks"][0]["clientConfig"] = {
        "service": {
            "namespace": "nodefabric",
            "name": "nodefabric-placement",
            "path": "/mutate",
            "port": 443,
        },
        "caBundle": config["webhooks"][0]["clientConfig"]["caBundle"],
    }
    k.api.put_object(MWC, config)
    status, out, _ = await create(k, pod())
    assert status == 500
    assert 'service "nodefabric/nodefabric-placement" not found' in out["message"]
    k.api.services["nodefabric/nodefabric-placement"] = f"127.0.0.1:{hook.port}"
    status, out, _ = await create(k, pod())
    assert status == 201 and out["spec"]["schedulingGates"] == [GATE]


async def test_a_bad_selector_is_a_failed_call(k: RunningAPI, hook: Hook, certs: dict[str, Path]) -> None:
    bad = configuration(
        hook,
        certs["ca"],
        failurePolicy="Fail",
        objectSelector={"matchExpressions": [{"key": "a", "operator": "Near"}]},
    )
    k.api.put_object(MWC, bad)
    status, out, _ = await create(k, pod())
    assert status == 500
    assert "'Near' is not a valid operator" in out["message"]
