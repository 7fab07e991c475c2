"""The embedded API holds pods to a real API server's rules for scheduling gates, the pod spec's
immutability, binding and eviction: the code, reason, message and causes it sends, and a refused write
changes nothing. Over real HTTP, as kube-scheduler, a webhook or the placement process send them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from nodefabric_operator.demo.kubeapi import RunningAPI, running_api

PODS = "/api/v1/namespaces/ml/pods"
GATE = "placement.gpustack.ai/group"
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
MERGE = {"Content-Type": "application/merge-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}


def pod(name: str = "w0", *, gates: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"containers": [{"name": "main", "image": "img:1"}], **spec},
    }
    if gates is not None:
        body["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    return body


@pytest.fixture
async def k() -> AsyncIterator[RunningAPI]:
    async with running_api() as api:
        yield api


async def call(
    k: RunningAPI, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    headers = headers or ({"Content-Type": "application/json"} if body is not None else {})
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, k.url + path, data=None if body is None else json.dumps(body), headers=headers
        ) as resp,
    ):
        return resp.status, await resp.json()


async def create(k: RunningAPI, body: dict[str, Any]) -> dict[str, Any]:
    status, out = await call(k, "POST", PODS, body)
    assert status == 201, out
    return out


def stored(k: RunningAPI, name: str = "w0") -> dict[str, Any]:
    obj = k.api.stored("v1/pods", name, "ml")
    assert obj is not None
    return obj


def invalid(out: dict[str, Any], name: str = "w0") -> list[tuple[str, str]]:
    assert out["reason"] == "Invalid", out
    assert out["code"] == 422
    assert out["message"].startswith(f'Pod "{name}" is invalid: ')
    return [(c["field"], c["message"]) for c in out["details"]["causes"]]


# --- creation -----------------------------------------------------------------------------------------


async def test_a_gated_pod_is_pending_and_says_it_is_gated(k: RunningAPI) -> None:
    out = await create(k, pod(gates=[GATE, "other.example/g"]))
    assert out["status"]["phase"] == "Pending"
    [condition] = out["status"]["conditions"]
    assert condition["type"] == "PodScheduled"
    assert condition["status"] == "False"
    assert condition["reason"] == "SchedulingGated"
    assert condition["message"] == "Scheduling is blocked due to non-empty scheduling gates"
    plain = await create(k, pod("w1"))
    assert plain["status"] == {"phase": "Pending"}


async def test_gates_and_node_name_together_are_refused_at_creation(k: RunningAPI) -> None:
    status, out = await call(k, "POST", PODS, pod(gates=[GATE], nodeName="n1"))
    assert status == 422
    assert invalid(out) == [
        ("spec.nodeName", "Forbidden: cannot be set until all schedulingGates have been cleared")
    ]
    assert k.api.stored("v1/pods", "w0", "ml") is None


async def test_a_gate_name_must_be_a_qualified_name_and_unique(k: RunningAPI) -> None:
    status, out = await call(k, "POST", PODS, pod(gates=["bad name!", GATE, GATE]))
    assert status == 422
    causes = invalid(out)
    assert causes[0][0] == "spec.schedulingGates[0].name"
    assert "must consist of alphanumeric characters" in causes[0][1]
    assert causes[1] == ("spec.schedulingGates[2]", f'Duplicate value: "{GATE}"')


# --- gates after creation -------------------------------------------------------------------------------


async def test_a_gate_is_never_added_later(k: RunningAPI) -> None:
    await create(k, pod(gates=["a.example/one"]))
    before = stored(k)
    patch = [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}]
    status, out = await call(k, "PATCH", f"{PODS}/w0", patch, JSON_PATCH)
    assert status == 422
    assert invalid(out) == [
        (
            "spec.schedulingGates[1].name",
            f"Forbidden: only deletion is allowed, but found new scheduling gate '{GATE}'",
        )
    ]
    await create(k, pod("w1"))
    status, out = await call(k, "PATCH", f"{PODS}/w1", {"spec": {"schedulingGates": [{"name": GATE}]}}, MERGE)
    assert status == 422, out
    assert invalid(out, "w1")[0][0] == "spec.schedulingGates[0].name"
    assert stored(k) == before
    assert "schedulingGates" not in stored(k, "w1")["spec"]


async def test_gates_are_removed_in_any_order(k: RunningAPI) -> None:
    await create(k, pod(gates=["a.example/one", GATE, "c.example/three"]))
    remove = [
        {"op": "test", "path": "/spec/schedulingGates/1", "value": {"name": GATE}},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]
    status, out = await call(k, "PATCH", f"{PODS}/w0", remove, JSON_PATCH)
    assert status == 200, out
    assert [g["name"] for g in out["spec"]["schedulingGates"]] == ["a.example/one", "c.example/three"]
    assert (
        out["status"]["conditions"][0]["reason"] == "SchedulingGated"
    )  # kube-scheduler updates it, not the API
    status, out = await call(
        k, "PATCH", f"{PODS}/w0", [{"op": "remove", "path": "/spec/schedulingGates/0"}], JSON_PATCH
    )
    assert status == 200, out
    status, out = await call(
        k, "PATCH", f"{PODS}/w0", [{"op": "remove", "path": "/spec/schedulingGates/0"}], JSON_PATCH
    )
    assert status == 200, out
    assert "schedulingGates" not in out["spec"], "an empty list is not stored (omitempty)"
    await create(k, pod("w1", gates=[GATE]))
    status, out = await call(k, "PATCH", f"{PODS}/w1", {"spec": {"schedulingGates": None}}, MERGE)
    assert status == 200, out
    assert "schedulingGates" not in out["spec"]


async def test_a_failed_test_op_removes_nothing(k: RunningAPI) -> None:
    """The placement process removes only its own gate, guarded by a `test` op on its index: another
    controller's gate at that index makes the patch fail whole."""
    await create(k, pod(gates=["a.example/one", GATE]))
    before = stored(k)
    remove = [
        {"op": "test", "path": "/spec/schedulingGates/0", "value": {"name": GATE}},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ]
    status, out = await call(k, "PATCH", f"{PODS}/w0", remove, JSON_PATCH)
    assert status in (409, 422, 500), out
    assert stored(k) == before


async def test_binding_a_gated_pod_is_refused(k: RunningAPI) -> None:
    await create(k, pod(gates=[GATE]))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "w0"}, "target": {"name": "n1"}}
    status, out = await call(k, "POST", f"{PODS}/w0/binding", binding)
    assert status == 409
    assert out["reason"] == "Conflict"
    assert (
        out["message"]
        == 'Operation cannot be fulfilled on pods/binding "w0": pod w0 has non-empty .spec.schedulingGates'
    )
    assert "nodeName" not in stored(k)["spec"]


async def test_binding_an_ungated_pod_sets_its_node_and_scheduled_condition(k: RunningAPI) -> None:
    await create(k, pod(gates=[GATE]))
    await call(k, "PATCH", f"{PODS}/w0", [{"op": "remove", "path": "/spec/schedulingGates"}], JSON_PATCH)
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "w0"}, "target": {"name": "n1"}}
    status, out = await call(k, "POST", f"{PODS}/w0/binding", binding)
    assert (status, out["status"]) == (201, "Success")
    obj = stored(k)
    assert obj["spec"]["nodeName"] == "n1"
    assert [(c["type"], c["status"]) for c in obj["status"]["conditions"]] == [("PodScheduled", "True")]
    status, out = await call(k, "POST", f"{PODS}/w0/binding", {**binding, "target": {"name": "n2"}})
    assert status == 409
    assert (
        out["message"]
        == 'Operation cannot be fulfilled on pods/binding "w0": pod w0 is already assigned to node "n1"'
    )
    wrong_uid = {**binding, "metadata": {"name": "w1", "uid": "not-its-uid"}}
    await create(k, pod("w1"))
    status, out = await call(k, "POST", f"{PODS}/w1/binding", wrong_uid)
    assert status == 409, out
    assert "nodeName" not in stored(k, "w1")["spec"]


# --- what a gated pod may change ------------------------------------------------------------------------


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


ZONE_A = {"key": "zone", "operator": "In", "values": ["a"]}
PIN = {"key": "metadata.name", "operator": "In", "values": ["n1"]}


async def test_a_gated_pod_takes_node_selector_additions_only(k: RunningAPI) -> None:
    await create(k, pod(gates=[GATE], nodeSelector={"gpu": "h100"}))
    status, out = await call(k, "PATCH", f"{PODS}/w0", {"spec": {"nodeSelector": {"zone": "a"}}}, STRATEGIC)
    assert status == 200, out
    assert out["spec"]["nodeSelector"] == {"gpu": "h100", "zone": "a"}
    for change in ({"gpu": "a100"}, {"gpu": None}):
        before = stored(k)
        status, out = await call(k, "PATCH", f"{PODS}/w0", {"spec": {"nodeSelector": change}}, MERGE)
        assert status == 422
        [(field, message)] = invalid(out)
        assert field == "spec.nodeSelector"
        assert message.endswith("only additions to spec.nodeSelector are allowed (no mutations or deletions)")
        assert stored(k) == before


async def test_a_gated_pod_takes_narrowed_required_affinity(k: RunningAPI) -> None:
    await create(k, pod(gates=[GATE], affinity=affinity({"matchExpressions": [ZONE_A]})))
    narrowed = affinity({"matchExpressions": [ZONE_A], "matchFields": [PIN]})
    status, out = await call(k, "PATCH", f"{PODS}/w0", {"spec": {"affinity": narrowed}}, MERGE)
    assert status == 200, out
    assert out["spec"]["affinity"] == narrowed


async def test_a_gated_pod_without_affinity_may_get_any(k: RunningAPI) -> None:
    await create(k, pod(gates=[GATE]))
    status, out = await call(
        k, "PATCH", f"{PODS}/w0", {"spec": {"affinity": affinity({"matchFields": [PIN]})}}, MERGE
    )
    assert status == 200, out
    await create(k, pod("w1", gates=[GATE], affinity=affinity()))  # an empty list of terms: anything
    status, out = await call(
        k, "PATCH", f"{PODS}/w1", {"spec": {"affinity": affinity({"matchFields": [PIN]})}}, MERGE
    )
    assert status == 200, out


@pytest.mark.parametrize(
    ("terms", "field", "message"),
    [
        (
            [{"matchExpressions": [ZONE_A]}, {"matchFields": [PIN]}],
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
            "no additions/deletions to non-empty NodeSelectorTerms list are allowed",
        ),
        (
            [{"matchExpressions": [{**ZONE_A, "values": ["a", "b"]}]}],
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]",
            "only additions are allowed (no mutations or deletions)",
        ),
        (
            [{"matchFields": [PIN]}],
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]",
            "only additions are allowed (no mutations or deletions)",
        ),
    ],
    ids=["term-added", "expression-changed", "expression-removed"],
)
async def test_a_gated_pod_refuses_widened_affinity(
    k: RunningAPI, terms: list[dict[str, Any]], field: str, message: str
) -> None:
    await create(k, pod(gates=[GATE], affinity=affinity({"matchExpressions": [ZONE_A]})))
    before = stored(k)
    status, out = await call(k, "PATCH", f"{PODS}/w0", {"spec": {"affinity": affinity(*terms)}}, MERGE)
    assert status == 422
    [(have_field, have_message)] = invalid(out)
    assert (have_field, have_message.rsplit(": ", 1)[-1]) == (field, message)
    assert stored(k) == before


async def test_an_ungated_pod_refuses_node_rules_changes(k: RunningAPI) -> None:
    await create(k, pod())
    for change in ({"nodeSelector": {"zone": "a"}}, {"affinity": affinity({"matchFields": [PIN]})}):
        status, out = await call(k, "PATCH", f"{PODS}/w0", {"spec": change}, MERGE)
        assert status == 422
        [(field, message)] = invalid(out)
        assert field == "spec"
        assert message.startswith(
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`"
        )
        assert f"spec.{next(iter(change))}" in message


async def test_tolerations_may_only_be_added(k: RunningAPI) -> None:
    base = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    await create(k, pod(gates=[GATE], tolerations=[base]))
    more = [base, {"key": "rack", "operator": "Exists"}]
    status, out = await call(k, "PATCH", f"{PODS}/w0", {"spec": {"tolerations": more}}, MERGE)
    assert status == 200, out
    status, out = await call(k, "PATCH", f"{PODS}/w0", {"spec": {"tolerations": more[1:]}}, MERGE)
    assert status == 422
    assert invalid(out) == [
        (
            "spec.tolerations",
            "Forbidden: existing toleration can not be modified except its tolerationSeconds",
        )
    ]


@pytest.mark.parametrize(
    "change",
    [
        {"nodeName": "n1"},
        {"schedulerName": "other"},
        {"containers": [{"name": "main", "image": "img:1", "resources": {"requests": {"cpu": "1"}}}]},
        {"priority": 5},
    ],
    ids=["nodeName", "schedulerName", "resources", "priority"],
)
async def test_a_gated_pod_refuses_other_spec_changes(k: RunningAPI, change: dict[str, Any]) -> None:
    await create(k, pod(gates=[GATE]))
    before = stored(k)
    status, out = await call(k, "PATCH", f"{PODS}/w0", {"spec": change}, MERGE)
    assert status == 422
    [(field, message)] = invalid(out)
    assert field == "spec"
    assert "pod updates may not change fields other than" in message
    assert stored(k) == before


async def test_images_and_metadata_stay_mutable(k: RunningAPI) -> None:
    await create(k, pod(gates=[GATE]))
    new_image = {
        "spec": {"containers": [{"name": "main", "image": "img:2"}]},
        "metadata": {"labels": {"a": "b"}},
    }
    status, out = await call(k, "PATCH", f"{PODS}/w0", new_image, MERGE)
    assert status == 200, out
    assert out["spec"]["containers"][0]["image"] == "img:2"
    status, out = await call(
        k, "PATCH", f"{PODS}/w0/status", {"status": {"phase": "Pending", "message": "x"}}, MERGE
    )
    assert status == 200, out


# --- eviction -------------------------------------------------------------------------------------------


def eviction(name: str, **more: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": "ml"},
        **more,
    }


async def test_eviction_deletes_the_pod(k: RunningAPI) -> None:
    await create(k, pod())
    status, out = await call(k, "POST", f"{PODS}/w0/eviction", eviction("w0"))
    assert (status, out["kind"], out["status"]) == (201, "Status", "Success")
    assert k.api.stored("v1/pods", "w0", "ml") is None


async def test_eviction_of_a_missing_pod_is_404(k: RunningAPI) -> None:
    status, out = await call(k, "POST", f"{PODS}/gone/eviction", eviction("gone"))
    assert status == 404
    assert (out["reason"], out["message"]) == ("NotFound", 'pods "gone" not found')


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "other"}},
            "name in URL does not match name in Eviction object",
        ),
        (
            {"apiVersion": "v1", "kind": "Eviction", "metadata": {"name": "w0"}},
            "the apiVersion of an eviction",
        ),
        ({"apiVersion": "policy/v1", "kind": "Pod", "metadata": {"name": "w0"}}, "the kind of an eviction"),
        (["w0"], "Object 'Kind' is missing"),
    ],
    ids=["other-name", "wrong-version", "wrong-kind", "not-an-object"],
)
async def test_a_malformed_eviction_is_400_and_deletes_nothing(
    k: RunningAPI, body: Any, message: str
) -> None:
    await create(k, pod())
    status, out = await call(k, "POST", f"{PODS}/w0/eviction", body)
    assert status == 400
    assert out["reason"] == "BadRequest"
    assert out["message"].startswith(message)
    assert k.api.stored("v1/pods", "w0", "ml") is not None


async def test_eviction_with_a_stale_uid_is_a_conflict(k: RunningAPI) -> None:
    await create(k, pod())
    body = eviction("w0", deleteOptions={"preconditions": {"uid": "an-older-pod"}})
    status, out = await call(k, "POST", f"{PODS}/w0/eviction", body)
    assert status == 409
    assert "Precondition failed: UID in precondition: an-older-pod" in out["message"]
    assert k.api.stored("v1/pods", "w0", "ml") is not None


async def test_eviction_is_in_discovery(k: RunningAPI) -> None:
    status, doc = await call(k, "GET", "/api/v1")
    assert status == 200
    entry = next(r for r in doc["resources"] if r["name"] == "pods/eviction")
    assert (entry["kind"], entry["verbs"]) == ("Eviction", ["create"])


async def test_an_existing_tolerations_seconds_may_change_as_the_api_server_allows(k: RunningAPI) -> None:
    # validateOnlyAddedTolerations: each old toleration must still be there, its tolerationSeconds aside.
    base = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    await create(k, pod(gates=[GATE], tolerations=[{**base, "tolerationSeconds": 300}]))
    status, out = await call(
        k, "PATCH", f"{PODS}/w0", {"spec": {"tolerations": [{**base, "tolerationSeconds": 30}]}}, MERGE
    )
    assert status == 200, out
    changed = [{**base, "key": "node.kubernetes.io/not-ready", "tolerationSeconds": 30}]
    status, out = await call(k, "PATCH", f"{PODS}/w0", {"spec": {"tolerations": changed}}, MERGE)
    assert status == 422, out


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/gone", None),
        ("PUT", "/gone", None),
        ("DELETE", "/gone", None),
        (
            "POST",
            "/gone/binding",
            {"kind": "Binding", "metadata": {"name": "gone"}, "target": {"name": "n1"}},
        ),
        ("POST", "/gone/eviction", None),
    ],
)
async def test_every_verb_on_a_missing_pod_is_the_same_404_naming_it(
    k: RunningAPI, method: str, path: str, body: dict[str, Any] | None
) -> None:
    # One lookup answers them all (Objects.existing): the same Status, whichever handler asked.
    sent = body or (
        pod("gone") if method == "PUT" else eviction("gone") if path.endswith("eviction") else None
    )
    status, out = await call(k, method, f"{PODS}{path}", sent)
    assert status == 404
    assert (out["kind"], out["reason"], out["message"]) == ("Status", "NotFound", 'pods "gone" not found')
    assert out["details"] == {"name": "gone", "kind": "pods"}
