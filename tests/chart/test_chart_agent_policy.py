"""The agent's own-node policies refuse what would pass a node's word off as the operator's: an Event
whose source or reportingComponent says nodefabric-operator, and a status write that changes the
operator's conditions (LabelsPublished, LabelsOnNode) on the node's own record. The agent's real status
merge (publish.merge_conditions) carries those conditions verbatim, so its own writes pass."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from chart_support import NAMESPACE, CelPolicy, Doc, one, user_info

from nodefabric_devicemanager import models
from nodefabric_devicemanager.agent.publish import merge_conditions
from nodefabric_devicemanager.models import Condition
from nodefabric_operator import events, onnode

AGENT = f"system:serviceaccount:{NAMESPACE}:nf-nodefabric-agent"
OPERATOR = f"system:serviceaccount:{NAMESPACE}:nf-nodefabric-operator"
NOT_OURS = (
    "the nodefabric agent may not change the operator's conditions (LabelsPublished, LabelsOnNode) of a "
    "Devices record"
)
T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
T1 = datetime(2026, 12, 1, 11, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def record_policy(default_docs: list[Doc]) -> CelPolicy:
    return CelPolicy(one(default_docs, "ValidatingAdmissionPolicy", "nf-nodefabric-agent-own-node"))


@pytest.fixture(scope="module")
def event_policy(default_docs: list[Doc]) -> CelPolicy:
    return CelPolicy(one(default_docs, "ValidatingAdmissionPolicy", "nf-nodefabric-agent-own-events"))


def _record(conditions: list[dict[str, Any]]) -> Doc:
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": "gpu-7"},
        "spec": {},
        "status": {"conditions": conditions},
    }


def _stored() -> Doc:
    """The record as the operator left it: the agent's condition, then the operator's two."""
    conds = [
        Condition(type=models.INTERFACES_ENUMERATED, status="True", reason="Enumerated"),
        Condition(type=models.LABELS_PUBLISHED, status="True", reason="Published", message="5 labels"),
        # nfd-master has not applied the labels: what an agent would most want to hide.
        onnode.condition(
            "gpu-7", {"feature.gpustack.ai/rdma.capable": "true"}, {}, "gpustack.ai", "nfd-master"
        ),
    ]
    out: list[Condition] = []
    for c in conds:
        out = models.set_condition(out, c, T0)
    return _record([c.wire() for c in out])


def _status_write(policy: CelPolicy, old: Doc, new: Doc, *, user: str = AGENT) -> tuple[bool, str]:
    request = {
        "operation": "UPDATE",
        "subResource": "status",
        "name": "gpu-7",
        "userInfo": user_info(user, ["gpu-7"]),
    }
    return policy.admit(request, new, old)


def test_the_agents_own_status_write_carries_the_operators_conditions_and_passes(record_policy) -> None:
    old = _stored()
    failed = Condition(type=models.INTERFACES_ENUMERATED, status="False", reason="EnumerationFailed")
    merged = merge_conditions(old["status"]["conditions"], [failed], T1)
    assert merged is not None
    new = _record(merged)
    assert [c["type"] for c in merged] == ["InterfacesEnumerated", "LabelsOnNode", "LabelsPublished"]
    assert _status_write(record_policy, old, new) == (True, "allowed")


def _edited(edit: Any) -> Doc:
    new = copy.deepcopy(_stored())
    edit(new["status"]["conditions"])
    return new


def _by_type(conds: list[dict[str, Any]], type_: str) -> dict[str, Any]:
    return next(c for c in conds if c["type"] == type_)


@pytest.mark.parametrize(
    ("case", "edit"),
    [
        ("LabelsPublished flipped", lambda cs: _by_type(cs, "LabelsPublished").update(status="False")),
        ("LabelsOnNode claimed", lambda cs: _by_type(cs, "LabelsOnNode").update(status="True",
                                                                                 reason="Applied")),
        ("LabelsOnNode's message", lambda cs: _by_type(cs, "LabelsOnNode").update(message="all fine")),
        ("LabelsOnNode removed", lambda cs: cs.remove(_by_type(cs, "LabelsOnNode"))),
        ("every condition dropped", lambda cs: cs.clear()),
        ("a second LabelsPublished", lambda cs: cs.append(dict(_by_type(cs, "LabelsPublished"),
                                                               status="False"))),
    ],
)  # fmt: skip
def test_the_agent_may_not_change_the_operators_conditions(record_policy, case: str, edit: Any) -> None:
    assert _status_write(record_policy, _stored(), _edited(edit)) == (False, NOT_OURS), case


def test_a_condition_the_operator_never_wrote_may_not_be_forged_either(record_policy) -> None:
    old = _record([Condition(type=models.INTERFACES_ENUMERATED, status="True").wire()])
    forged = _record([*old["status"]["conditions"], {"type": "LabelsOnNode", "status": "True"}])
    assert _status_write(record_policy, old, forged) == (False, NOT_OURS)


def test_the_operator_and_spec_writes_are_not_confined_by_it(record_policy) -> None:
    flipped = _edited(lambda cs: _by_type(cs, "LabelsPublished").update(status="False"))
    assert _status_write(record_policy, _stored(), flipped, user=OPERATOR) == (True, "not matched")
    # A write of the record itself (not /status): the API server ignores status there.
    request = {"operation": "UPDATE", "name": "gpu-7", "userInfo": user_info(AGENT, ["gpu-7"])}
    assert record_policy.admit(request, flipped, _stored()) == (True, "allowed")


def _event(**fields: Any) -> Doc:
    """An Event as the agent posts it (agent/kube.py), with `fields` replaced."""
    event: Doc = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "gpu-7-", "namespace": "default"},
        "involvedObject": {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "Devices", "name": "gpu-7"},
        "type": "Warning",
        "reason": "LinkDown",
        "message": "x",
        "source": {"component": "nodefabric-agent", "host": "gpu-7"},
        "reportingComponent": "nodefabric-agent",
        "reportingInstance": "gpu-7",
    }
    event.update(fields)
    return event


def _post(policy: CelPolicy, event: Doc) -> tuple[bool, str]:
    return policy.admit({"operation": "CREATE", "userInfo": user_info(AGENT, ["gpu-7"])}, event)


def test_the_agent_posts_as_itself(event_policy) -> None:
    assert _post(event_policy, _event()) == (True, "allowed")
    bare = _event()
    del bare["source"], bare["reportingComponent"]
    assert _post(event_policy, bare) == (True, "allowed")  # an Event that says nothing of its source


@pytest.mark.parametrize(
    "fields",
    [
        {"source": {"component": events.COMPONENT}},
        {"reportingComponent": events.COMPONENT},
        {"source": {"component": events.COMPONENT}, "reportingComponent": events.COMPONENT},
        {"reportingComponent": "kubelet"},
    ],
)
def test_the_agent_may_not_post_as_the_operator_or_anyone_else(event_policy, fields: Doc) -> None:
    said = fields.get("reportingComponent") or fields["source"]["component"]
    assert _post(event_policy, _event(**fields)) == (
        False,
        f"the nodefabric agent may post Events only as nodefabric-agent, not as {said}",
    )


@pytest.mark.parametrize(
    ("case", "arrange"),
    [
        ("the operator's two in the other order", lambda cs: list(reversed(cs))),
    ],
)
def test_the_agents_write_passes_whatever_order_the_stored_list_is_in(
    record_policy, case: str, arrange: Any
) -> None:
    # A list edited by hand (kubectl edit) or merged by another writer need not be sorted; the agent's
    # merge sorts it by type, the operator's entries verbatim. Refusing that would refuse every later
    # status write of the agent: Ready and its columns stuck for good.
    old = _stored()
    old["status"]["conditions"] = arrange(old["status"]["conditions"])
    failed = Condition(type=models.INTERFACES_ENUMERATED, status="False", reason="EnumerationFailed")
    merged = merge_conditions(old["status"]["conditions"], [failed], T1)
    assert merged is not None
    assert _status_write(record_policy, old, _record(merged)) == (True, "allowed"), case
