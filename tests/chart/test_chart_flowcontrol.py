"""API Priority and Fairness: nodefabric's accounts get a priority level of their own, switchable, with
shares and queues the API server accepts."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import NAMESPACE, Doc, RenderError, of_kind, pod_spec
from test_chart_validate import validate_all

NAME = "nf-nodefabric"


def flowcontrol(docs: list[Doc]) -> tuple[Doc, Doc]:
    (schema,), (level,) = of_kind(docs, "FlowSchema"), of_kind(docs, "PriorityLevelConfiguration")
    return schema, level


def subjects(schema: Doc) -> list[tuple[str, str]]:
    (rule,) = schema["spec"]["rules"]
    return [(s["serviceAccount"]["namespace"], s["serviceAccount"]["name"]) for s in rule["subjects"]]


def accounts(docs: list[Doc]) -> list[tuple[str, str]]:
    """The accounts the agent's and the operator's pods run as."""
    out = []
    for kind, name in (("DaemonSet", "nf-nodefabric-agent"), ("Deployment", "nf-nodefabric-operator")):
        found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
        out += [(NAMESPACE, pod_spec(d)["serviceAccountName"]) for d in found]
    return out


def test_the_agents_and_the_operators_requests_have_their_own_level(default_docs: list[Doc]) -> None:
    schema, level = flowcontrol(default_docs)
    assert schema["metadata"]["name"] == level["metadata"]["name"] == NAME
    assert schema["apiVersion"] == level["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1"
    assert schema["spec"]["priorityLevelConfiguration"] == {"name": level["metadata"]["name"]}
    assert subjects(schema) == accounts(default_docs)
    # One flow per account: the whole fleet of agents cannot starve the operator, nor the reverse.
    assert schema["spec"]["distinguisherMethod"] == {"type": "ByUser"}
    # Every request of those accounts: objects (cluster-wide and namespaced), watches, discovery.
    (rule,) = schema["spec"]["rules"]
    assert rule["resourceRules"] == [
        {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True, "namespaces": ["*"]}
    ]
    assert rule["nonResourceRules"] == [{"verbs": ["*"], "nonResourceURLs": ["*"]}]


def test_the_schema_is_matched_after_the_system_ones_and_before_the_catch_alls(
    default_docs: list[Doc],
) -> None:
    schema, _ = flowcontrol(default_docs)
    precedence = schema["spec"]["matchingPrecedence"]
    # Built-in: kube-system-service-accounts 900 (its accounts are not ours), service-accounts 9000,
    # global-default 9900, catch-all 10000. Below 9000, or every ServiceAccount request matches
    # service-accounts first and ours is never used.
    assert 900 < precedence < 9000


def test_sane_shares_and_queues(default_docs: list[Doc]) -> None:
    _, level = flowcontrol(default_docs)
    limited = level["spec"]["limited"]
    assert level["spec"]["type"] == "Limited"
    # Beside the built-in levels' shares (workload-low 100, node-high 40, global-default 20): a share of
    # the server, never all of it, and what it does not use is lent.
    assert 5 <= limited["nominalConcurrencyShares"] <= 100
    assert 0 < limited["lendablePercent"] <= 100
    response = limited["limitResponse"]
    assert response["type"] == "Queue"
    q = response["queuing"]
    # What the API server validates: handSize <= queues, and at most 60 bits of shuffle-sharding entropy.
    assert 1 <= q["handSize"] <= q["queues"]
    assert q["handSize"] * (q["queues"] - 1).bit_length() <= 60
    assert q["queueLengthLimit"] > 0


@pytest.mark.parametrize("kube_version", ["1.30.0", "latest"])
def test_valid_at_every_supported_version(render, kube_version: str) -> None:
    from kubernetes_validate.utils import latest_version

    version = latest_version() if kube_version == "latest" else kube_version
    validate_all(list(flowcontrol(render(kube_version=version))), version)


def test_values_reach_the_objects(render) -> None:
    values: dict[str, Any] = {
        "apiPriorityAndFairness": {
            "matchingPrecedence": 2000,
            "nominalConcurrencyShares": 40,
            "lendablePercent": 0,
            "queuing": {"queues": 128, "handSize": 8, "queueLengthLimit": 200},
        }
    }
    schema, level = flowcontrol(render(values))
    assert schema["spec"]["matchingPrecedence"] == 2000
    assert level["spec"]["limited"]["nominalConcurrencyShares"] == 40
    assert level["spec"]["limited"]["lendablePercent"] == 0
    assert level["spec"]["limited"]["limitResponse"]["queuing"] == {
        "queues": 128, "handSize": 8, "queueLengthLimit": 200,
    }  # fmt: skip


def test_a_hand_larger_than_the_deck_is_refused(render) -> None:
    with pytest.raises(RenderError, match=r"handSize \(8\) may not exceed queues \(4\)"):
        render({"apiPriorityAndFairness": {"queuing": {"queues": 4, "handSize": 8}}})


def test_switched_off(render) -> None:
    docs = render({"apiPriorityAndFairness": {"enabled": False}})
    assert not of_kind(docs, "FlowSchema") and not of_kind(docs, "PriorityLevelConfiguration")


def test_only_the_components_that_run_are_subjects(render) -> None:
    docs = render({"operator": {"enabled": False}})
    assert subjects(flowcontrol(docs)[0]) == [(NAMESPACE, "nf-nodefabric-agent")]
    docs = render({"agent": {"enabled": False}})
    assert subjects(flowcontrol(docs)[0]) == [(NAMESPACE, "nf-nodefabric-operator")]
    # Neither: no level for nobody.
    docs = render({"agent": {"enabled": False}, "operator": {"enabled": False}})
    assert not of_kind(docs, "FlowSchema") and not of_kind(docs, "PriorityLevelConfiguration")


def test_two_releases_do_not_share_the_cluster_scoped_objects(render) -> None:
    a = flowcontrol(render(release="one"))
    b = flowcontrol(render(release="two"))
    assert {d["metadata"]["name"] for d in a} == {"one-nodefabric"}
    assert {d["metadata"]["name"] for d in b} == {"two-nodefabric"}
