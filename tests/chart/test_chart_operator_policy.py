"""labelSink=node: the operator's account may patch Nodes, and an admission policy confines that to its own
label keys and the annotation recording them. Evaluated with the CEL the API server runs, on the Node
before and after the operator's real sink wrote it through the embedded API."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kubernetes
import pytest
from chart_support import NAMESPACE, CelPolicy, Doc, of_kind, one
from test_chart_validate import validate_all

from nodefabric_operator import sinks
from nodefabric_operator.demo.kubeapi import running_api

POLICY = "nf-nodefabric-operator-node-labels"
OPERATOR = f"system:serviceaccount:{NAMESPACE}:nf-nodefabric-operator"
NODE_SINK = {"labelSink": "node"}
CAPABLE = "feature.gpustack.ai/rdma.capable"
MANAGED = "nodefabric.gpustack.ai/managed-labels"
LABELS_ONLY = "the nodefabric operator may change only the labels feature.gpustack.ai/... of a Node"
ANNOTATION_ONLY = (
    "the nodefabric operator may change only the annotation nodefabric.gpustack.ai/managed-labels of a Node"
)
SPEC = "the nodefabric operator may not change a Node's spec (taints, unschedulable), finalizers or owners"


class NodePolicy:
    """The operator's Node policy for one Node UPDATE by `user`."""

    def __init__(self, policy: Doc) -> None:
        self.cel = CelPolicy(policy)

    def admit(self, old: Doc, new: Doc, *, user: str = OPERATOR) -> tuple[bool, str]:
        return self.cel.admit({"operation": "UPDATE", "userInfo": {"username": user}}, new, old)


@pytest.fixture(scope="module")
def node_docs(render: Any) -> list[Doc]:
    return render(NODE_SINK)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def node_policy(node_docs: list[Doc]) -> NodePolicy:
    return NodePolicy(one(node_docs, "ValidatingAdmissionPolicy", POLICY))


def test_the_policy_binds_denying_fails_closed_and_matches_node_updates(node_docs: list[Doc]) -> None:
    policy = one(node_docs, "ValidatingAdmissionPolicy", POLICY)
    binding = one(node_docs, "ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    # A patch arrives as UPDATE; nodes/status is not the operator's (its role has no right on it).
    assert rule == {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["UPDATE"],
        "resources": ["nodes"],
    }
    (cond,) = policy["spec"]["matchConditions"]
    assert cond["expression"] == f'request.userInfo.username == "{OPERATOR}"'
    validate_all([policy, binding])


def test_only_with_the_node_sink_and_switchable(render: Any, default_docs: list[Doc]) -> None:
    assert POLICY not in [d["metadata"]["name"] for d in default_docs]  # NodeFeatures: no Node rights
    off = render(NODE_SINK | {"operator": {"admissionPolicy": {"enabled": False}}})
    assert not [d for d in of_kind(off, "ValidatingAdmissionPolicy") if d["metadata"]["name"] == POLICY]
    named = render(NODE_SINK | {"operator": {"serviceAccount": {"name": "labeller"}}})
    (cond,) = one(named, "ValidatingAdmissionPolicy", POLICY)["spec"]["matchConditions"]
    assert cond["expression"].endswith(':labeller"')


NODE: Doc = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-7",
        "labels": {
            "kubernetes.io/hostname": "gpu-7",
            "node-role.example.com/gpu": "",
            "feature.gpustack.ai/hand": "x",
        },
        "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
    },
    "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
}


async def _written_by_the_operator(desired: dict[str, str], before: Doc) -> tuple[Doc, Doc]:
    """The Node before and after the operator's Node sink published `desired` on it."""
    async with running_api() as k:
        k.api.put_object("v1/nodes", copy.deepcopy(before))
        api = kubernetes.config.new_client_from_config(config_file=k.kubeconfig)
        sink = sinks.NodeSink(api, "gpustack.ai")
        old = k.api.stored("v1/nodes", "gpu-7")
        # The sink's client blocks: off the loop that serves the embedded API.
        published = await asyncio.to_thread(
            sink.publish, sinks.Owner("gpu-7", ""), desired, frozenset(), sink.snapshot(old)
        )
        assert published.wrote
        return old, k.api.stored("v1/nodes", "gpu-7")


async def test_the_operators_own_writes_pass(node_policy: NodePolicy) -> None:
    old, new = await _written_by_the_operator({CAPABLE: "true", "feature.gpustack.ai/rdma.numa": "0_1"}, NODE)
    assert new["metadata"]["labels"][CAPABLE] == "true" and MANAGED in new["metadata"]["annotations"]
    assert node_policy.admit(old, new) == (True, "allowed")
    # Withdrawing them (the record is gone) passes too.
    gone_old, gone = await _written_by_the_operator({}, new)
    assert CAPABLE not in gone["metadata"]["labels"]
    assert node_policy.admit(gone_old, gone) == (True, "allowed")


def labels(node: Doc) -> dict[str, str]:
    found: dict[str, str] = node["metadata"]["labels"]
    return found


def annotations(node: Doc) -> dict[str, str]:
    found: dict[str, str] = node["metadata"]["annotations"]
    return found


def changed(edit: Any) -> Doc:
    new = copy.deepcopy(NODE)
    edit(new)
    return new


@pytest.mark.parametrize(
    ("case", "edit", "message"),
    [
        ("a taint removed", lambda n: n["spec"].pop("taints"), SPEC),
        ("cordoned", lambda n: n["spec"].update(unschedulable=True), SPEC),
        ("a role label added", lambda n: labels(n).update({"node-role.kubernetes.io/control-plane": ""}),
         LABELS_ONLY),
        ("a label removed", lambda n: labels(n).pop("node-role.example.com/gpu"), LABELS_ONLY),
        ("NFD's label", lambda n: labels(n).update({"feature.node.kubernetes.io/x": "y"}), LABELS_ONLY),
        ("a look-alike prefix", lambda n: labels(n).update({"feature.gpustack.ai.evil.com/x": "y"}),
         LABELS_ONLY),
        ("another annotation", lambda n: annotations(n).update({"x": "y"}), ANNOTATION_ONLY),
        ("an annotation removed", lambda n: annotations(n).pop("node.alpha.kubernetes.io/ttl"),
         ANNOTATION_ONLY),
        ("a finalizer", lambda n: n["metadata"].update(finalizers=["x/hold"]), SPEC),
    ],
)  # fmt: skip
def test_the_operator_may_change_nothing_else(
    node_policy: NodePolicy, case: str, edit: Any, message: str
) -> None:
    assert node_policy.admit(NODE, changed(edit)) == (False, message), case


def test_other_users_are_not_confined(node_policy: NodePolicy) -> None:
    cordoned = changed(lambda n: n["spec"].update(unschedulable=True))
    for user in (
        "system:node:gpu-7",
        "kubernetes-admin",
        f"system:serviceaccount:{NAMESPACE}:nf-nodefabric-agent",
    ):
        assert node_policy.admit(NODE, cordoned, user=user) == (True, "not matched")


def test_the_policy_follows_the_domain(render: Any) -> None:
    policy = NodePolicy(
        one(render(NODE_SINK | {"domain": "example.com"}), "ValidatingAdmissionPolicy", POLICY)
    )
    mine = changed(lambda n: n["metadata"]["labels"].update({"feature.example.com/rdma.capable": "true"}))
    assert policy.admit(NODE, mine) == (True, "allowed")
    assert (
        policy.admit(NODE, changed(lambda n: n["metadata"]["labels"].update({CAPABLE: "true"})))[0] is False
    )
