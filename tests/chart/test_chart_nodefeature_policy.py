"""labelSink=nodefeature (the default): nfd-master copies a NodeFeature's labels onto the Node it names,
so the operator's right to write NodeFeatures is confined by an admission policy to its own label keys,
no features, the node-name label naming the object itself, and its node's Devices record as controller.
Evaluated with the CEL the API server runs, on NodeFeatures the operator's real sink wrote through the
embedded API."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kubernetes
import pytest
from chart_support import NAMESPACE, CelPolicy, Doc, of_kind, one
from test_chart_validate import validate_all

from nodefabric_devicemanager import crd, models
from nodefabric_operator import sinks
from nodefabric_operator.demo.kubeapi import running_api

POLICY = "nf-nodefabric-operator-nodefeatures"
OPERATOR = f"system:serviceaccount:{NAMESPACE}:nf-nodefabric-operator"
CAPABLE = "feature.gpustack.ai/rdma.capable"
DOMAIN_LABEL = "feature.gpustack.ai/fabric.domain"
LABELS_ONLY = (
    "the nodefabric operator may set only the labels feature.gpustack.ai/rdma.* and "
    "feature.gpustack.ai/fabric.* of a NodeFeature"
)
FEATURES = "the nodefabric operator may not set the features of a NodeFeature"
NAMED = (
    "a NodeFeature of the nodefabric operator must be named after its node, with "
    "nfd.node.kubernetes.io/node-name saying the same"
)
OWNED = "a NodeFeature of the nodefabric operator must be controlled by the Devices record of its node"


class NodeFeaturePolicy:
    def __init__(self, policy: Doc) -> None:
        self.cel = CelPolicy(policy)

    def admit(self, old: Doc | None, new: Doc, *, user: str = OPERATOR) -> tuple[bool, str]:
        request = {"operation": "UPDATE" if old else "CREATE", "userInfo": {"username": user}}
        return self.cel.admit(request, new, old)


@pytest.fixture(scope="module")
def policy(default_docs: list[Doc]) -> NodeFeaturePolicy:
    return NodeFeaturePolicy(one(default_docs, "ValidatingAdmissionPolicy", POLICY))


def test_the_policy_binds_denying_fails_closed_and_matches_nodefeature_writes(
    default_docs: list[Doc],
) -> None:
    policy = one(default_docs, "ValidatingAdmissionPolicy", POLICY)
    binding = one(default_docs, "ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["nfd.k8s-sigs.io"] and rule["resources"] == ["nodefeatures"]
    assert rule["operations"] == ["CREATE", "UPDATE"]  # a patch arrives as UPDATE; the role has no delete
    (cond,) = policy["spec"]["matchConditions"]
    assert cond["expression"] == f'request.userInfo.username == "{OPERATOR}"'
    validate_all([policy, binding])


def test_only_with_the_nodefeature_sink_and_switchable(render: Any) -> None:
    names = lambda docs: [d["metadata"]["name"] for d in of_kind(docs, "ValidatingAdmissionPolicy")]  # noqa: E731
    assert POLICY not in names(render({"labelSink": "node"}))
    assert POLICY not in names(render({"operator": {"admissionPolicy": {"enabled": False}}}))


async def _written(desired: list[dict[str, str]], foreign: dict[str, str] | None = None) -> list[tuple]:
    """(old, new) of each NodeFeature write the operator's sink makes publishing `desired` in turn for
    node gpu-7; `foreign`: labels another writer puts into the NodeFeature after the first write."""
    async with running_api([crd.devices_crd()]) as k:
        k.api.put_object("v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-7"}})
        record = {
            "apiVersion": models.API_VERSION,
            "kind": models.KIND,
            "metadata": {"name": "gpu-7"},
            "spec": {},
        }
        uid = k.api.put_object(f"{models.GROUP}/{models.VERSION}/{models.PLURAL}", record)["metadata"]["uid"]
        api = kubernetes.config.new_client_from_config(config_file=k.kubeconfig)
        sink = sinks.NodeFeatureSink(api, NAMESPACE, "gpustack.ai")
        key = f"{sinks.NFD_GROUP}/{sinks.NFD_VERSION}/{sinks.NFD_PLURAL}"
        writes, current = [], None
        for i, labels in enumerate(desired):
            old = k.api.stored(key, "gpu-7", NAMESPACE)
            published = await asyncio.to_thread(
                sink.publish, sinks.Owner("gpu-7", uid), labels, frozenset(), current
            )
            current = published.now
            writes.append((old, k.api.stored(key, "gpu-7", NAMESPACE)))
            if i == 0 and foreign:
                stored = k.api.stored(key, "gpu-7", NAMESPACE)
                stored["spec"]["labels"].update(foreign)
                current = sink.snapshot(k.api.put_object(key, stored))
        api.close()
        return writes


async def test_the_operators_own_writes_pass(policy: NodeFeaturePolicy) -> None:
    first = {CAPABLE: "true", DOMAIN_LABEL: "nvlink-a"}
    writes = await _written([first, {CAPABLE: "true"}, {}], foreign={"example.com/team": "a"})
    (created_old, created), (patched_old, patched), (emptied_old, emptied) = writes
    assert created_old is None and created["spec"]["labels"] == first
    assert policy.admit(None, created) == (True, "allowed")
    # Removing its own key while another writer's stays, then removing all of its own.
    assert patched["spec"]["labels"] == {CAPABLE: "true", "example.com/team": "a"}
    assert policy.admit(patched_old, patched) == (True, "allowed")
    assert emptied["spec"]["labels"] == {"example.com/team": "a"}
    assert policy.admit(emptied_old, emptied) == (True, "allowed")


NF: Doc = {
    "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
    "kind": "NodeFeature",
    "metadata": {
        "name": "gpu-7",
        "namespace": NAMESPACE,
        "labels": {"nfd.node.kubernetes.io/node-name": "gpu-7"},
        "ownerReferences": [
            {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "Devices", "name": "gpu-7", "uid": "u",
             "controller": True},
        ],
    },
    "spec": {"labels": {CAPABLE: "true", "example.com/team": "a"}},
}  # fmt: skip


def changed(edit: Any) -> Doc:
    new = copy.deepcopy(NF)
    edit(new)
    return new


def spec_labels(nf: Doc) -> dict[str, str]:
    found: dict[str, str] = nf["spec"]["labels"]
    return found


def meta(nf: Doc) -> dict[str, Any]:
    found: dict[str, Any] = nf["metadata"]
    return found


@pytest.mark.parametrize(
    ("case", "edit", "message"),
    [
        ("a scheduling label", lambda n: spec_labels(n).update({"node-role.kubernetes.io/gpu": ""}),
         LABELS_ONLY),
        ("NFD's own namespace", lambda n: spec_labels(n).update({"feature.node.kubernetes.io/x": "1"}),
         LABELS_ONLY),
        ("our domain, another family", lambda n: spec_labels(n).update({"feature.gpustack.ai/zone": "a"}),
         LABELS_ONLY),
        ("a look-alike prefix", lambda n: spec_labels(n).update({"feature.gpustack.ai.evil.com/rdma.x": "1"}),
         LABELS_ONLY),
        ("another writer's label changed", lambda n: spec_labels(n).update({"example.com/team": "b"}),
         LABELS_ONLY),
        ("another writer's label removed", lambda n: spec_labels(n).pop("example.com/team"), LABELS_ONLY),
        ("features", lambda n: n["spec"].update(features={"flags": {"x": {}}}), FEATURES),
        ("another node", lambda n: meta(n)["labels"].update({"nfd.node.kubernetes.io/node-name": "gpu-8"}),
         NAMED),
        ("no node-name label", lambda n: meta(n).pop("labels"), NAMED),
        ("no owner", lambda n: meta(n).pop("ownerReferences"), OWNED),
        ("another node's record", lambda n: meta(n)["ownerReferences"][0].update(name="gpu-8"), OWNED),
        ("an owner that is not the controller", lambda n: meta(n)["ownerReferences"][0].pop("controller"),
         OWNED),
        ("a Node as owner", lambda n: meta(n)["ownerReferences"][0].update(apiVersion="v1", kind="Node"),
         OWNED),
    ],
)  # fmt: skip
def test_the_operator_may_write_nothing_else(
    policy: NodeFeaturePolicy, case: str, edit: Any, message: str
) -> None:
    assert policy.admit(NF, changed(edit)) == (False, message), case


def test_a_create_must_carry_only_its_own_keys(policy: NodeFeaturePolicy) -> None:
    mine = changed(lambda n: spec_labels(n).pop("example.com/team"))
    assert policy.admit(None, mine) == (True, "allowed")
    assert policy.admit(None, NF) == (False, LABELS_ONLY)  # on create, nobody else's key is there to keep
    with_features = changed(lambda n: (spec_labels(n).pop("example.com/team"), n["spec"].update(features={})))
    assert policy.admit(None, with_features) == (False, FEATURES)


def test_other_users_are_not_confined(policy: NodeFeaturePolicy) -> None:
    wild = changed(lambda n: spec_labels(n).update({"node-role.kubernetes.io/gpu": ""}))
    for user in ("system:serviceaccount:node-feature-discovery:nfd-worker", "kubernetes-admin"):
        assert policy.admit(NF, wild, user=user) == (True, "not matched")


def test_the_policy_follows_the_domain_and_the_account(render: Any) -> None:
    docs = render({"domain": "example.com", "operator": {"serviceAccount": {"name": "labeller"}}})
    doc = one(docs, "ValidatingAdmissionPolicy", POLICY)
    (cond,) = doc["spec"]["matchConditions"]
    assert cond["expression"].endswith(':labeller"')
    other = NodeFeaturePolicy(doc)
    user = f"system:serviceaccount:{NAMESPACE}:labeller"
    mine = changed(lambda n: spec_labels(n).update({"feature.example.com/rdma.capable": "true"}))
    assert other.admit(NF, mine, user=user) == (True, "allowed")
    # Under example.com, a feature.gpustack.ai key is someone else's: not the operator's to change.
    theirs = changed(lambda n: spec_labels(n).pop(CAPABLE))
    assert other.admit(NF, theirs, user=user) == (False, LABELS_ONLY.replace("gpustack.ai", "example.com"))
