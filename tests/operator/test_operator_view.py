"""The pure parts behind the request budget: telling a replayed version from a new one, holding the newer
of what the watch delivered and what our own write returned, and the one Event a reconcile posts."""

from __future__ import annotations

import pytest

from nodefabric_operator import events, labels
from nodefabric_operator.view import SinkObject, SinkView, at_or_below

P = "feature.gpustack.ai/"


@pytest.mark.parametrize(
    ("rv", "seen", "below"),
    [
        ("5", "5", True),
        ("4", "5", True),
        ("6", "5", False),
        ("10", "9", False),  # numbers, not strings: "10" < "9" as text
        ("5", None, False),  # never handled
        (None, "5", False),  # no version: never assume it was seen
        ("abc", "abc", True),  # not a number: only equal counts as seen
        ("abc", "abd", False),
        ("05", "5", False),  # not a plain number either: "05" is not the revision 5
        ("1" * 30, "5", False),  # beyond any revision: compared as text only
        ("\u0665", "5", False),  # an Arabic-Indic five is not a revision
    ],
)
def test_at_or_below(rv, seen, below):
    assert at_or_below(rv, seen) is below


def nf(rv: str | None, **kw) -> SinkObject:
    return SinkObject(name="n1", rv=rv, **kw)


def test_the_view_keeps_the_newer_of_watch_and_write():
    view = SinkView()
    assert view.observe(nf("7", labels={P + "rdma.capable": "true"}))  # our write's answer
    assert not view.observe(nf("6"))  # the watch delivers an older version late: ignored
    assert not view.observe(nf("7"))  # the echo of our own write: nothing new
    assert view.get("n1").labels == {P + "rdma.capable": "true"}
    assert view.observe(nf("8"))  # someone else's edit
    assert view.get("n1").labels == {}


def test_a_deletion_older_than_what_we_recreated_keeps_it():
    view = SinkView()
    view.observe(nf("9"))
    assert not view.forget("n1", "8", remember=True)  # we recreated it (9) after the deletion (8)
    assert view.get("n1") is not None and not view.was_deleted("n1")
    assert view.forget("n1", "9", remember=True)
    assert view.get("n1") is None and view.was_deleted("n1")
    view.observe(nf("10"))
    assert not view.was_deleted("n1")


def test_our_write_answered_after_its_deletion_was_delivered_does_not_bring_it_back():
    """A publish in a worker thread creates the object (7); someone deletes it (8) and the watch delivers
    the deletion before the create's answer reaches the view: the object stays deleted, so the
    reconcile the deletion queued creates it again instead of finding it there."""
    view = SinkView()
    assert view.forget("n1", "8", remember=True)  # nothing held yet: dropped, and noted
    assert not view.observe(nf("7"))  # the create's answer, late: older than the deletion
    assert view.get("n1") is None and view.was_deleted("n1")
    assert view.observe(nf("9"))  # created again
    assert not view.was_deleted("n1") and view.get("n1").rv == "9"
    assert view.forget("n1", "10", remember=True)
    view.clear_deleted("n1")  # the record went too: nothing of the node is kept
    assert view.observe(nf("3")) and view.get("n1").rv == "3"


def test_a_deletion_for_a_node_without_a_record_leaves_nothing_behind():
    view = SinkView()
    view.observe(nf("3"))
    assert view.forget("n1", "3", remember=False)
    assert not view.was_deleted("n1") and len(view) == 0


CAPABLE, NUMA, DOMAIN = P + "rdma.capable", P + "rdma.numa", P + "fabric.domain"


@pytest.mark.parametrize(
    ("changes", "type_", "reason"),
    [
        ([labels.Change(CAPABLE, None, "true"), labels.Change(NUMA, None, "0")], "Normal", "LabelsChanged"),
        ([labels.Change(NUMA, "0", "0_1")], "Normal", "LabelsChanged"),
        ([labels.Change(NUMA, "0", None)], "Normal", "LabelsChanged"),  # a NUMA node is not a capability
        ([labels.Change(DOMAIN, "nvlink-a", None)], "Warning", "FabricLabelsLost"),
        ([labels.Change(DOMAIN, "nvlink-a", "nvlink-b")], "Normal", "LabelsChanged"),
        (
            [labels.Change(CAPABLE, "true", None), labels.Change(DOMAIN, "x", None)],
            "Warning",
            "RdmaCapabilityLost",
        ),
    ],
)
def test_one_event_per_reconcile_warning_when_something_schedulers_select_on_goes(changes, type_, reason):
    notice = events.for_changes("NodeFeature ns/n1", changes, "gpustack.ai")
    assert notice is not None
    assert (notice.type, notice.reason) == (type_, reason)
    message = "NodeFeature ns/n1: " + "; ".join(c.describe() for c in changes)
    if reason == "RdmaCapabilityLost":  # it says why, even when no link failed
        message += "; no link failed: no endpoint in the record has a usable RDMA device"
    assert notice.message == message


def test_losing_rdma_capability_names_the_failing_links_and_no_other_event_does():
    lost = [labels.Change(CAPABLE, "true", None)]
    links = [f"ens{i}f0 (mlx5_{i}): state 1: DOWN, phys_state 3: Disabled" for i in range(7)]
    notice = events.for_changes("Node n1", lost, "gpustack.ai", links[:2])
    assert notice is not None and notice.message == (
        "Node n1: removed feature.gpustack.ai/rdma.capable (was true); failing links: "
        "ens0f0 (mlx5_0): state 1: DOWN, phys_state 3: Disabled; "
        "ens1f0 (mlx5_1): state 1: DOWN, phys_state 3: Disabled"
    )
    notice = events.for_changes("Node n1", lost, "gpustack.ai", links)
    assert notice is not None and notice.message.endswith(
        "ens4f0 (mlx5_4): state 1: DOWN, phys_state 3: Disabled; and 2 more"
    )
    numa = [labels.Change(NUMA, "0", None)]
    notice = events.for_changes("Node n1", numa, "gpustack.ai", links)
    assert notice is not None and "failing" not in notice.message  # only the capability's loss says why


def test_a_first_publication_has_no_event_unless_it_removes_or_replaces_a_value():
    added = [labels.Change(CAPABLE, None, "true"), labels.Change(NUMA, None, "0")]
    assert events.for_changes("NodeFeature ns/n1", added, "gpustack.ai", first=True) is None
    # A value someone else left under our keys, replaced or taken away by the first publication: said.
    for found in ([labels.Change(NUMA, "7", "0")], [labels.Change(DOMAIN, "nvlink-a", None)]):
        notice = events.for_changes("NodeFeature ns/n1", added[:1] + found, "gpustack.ai", first=True)
        assert notice is not None and found[0].describe() in notice.message
    # Published before: every change has its Event, additions included.
    assert events.for_changes("NodeFeature ns/n1", added, "gpustack.ai", first=False) is not None


def test_no_event_without_changes_and_a_bounded_message():
    assert events.for_changes("Node n1", [], "gpustack.ai") is None
    many = [labels.Change(f"{P}fabric.k{i}", None, "v" * 60) for i in range(100)]
    notice = events.for_changes("Node n1", many, "gpustack.ai")
    assert notice is not None and len(notice.message) <= events.MAX_MESSAGE
    assert notice.message.endswith("(100 changes)")


@pytest.mark.parametrize("kind", ["change", "failure"])
def test_the_event_body_is_a_valid_v1_event(kind):
    """The recorder posts event_body's mapping as it is (not through CoreV1Api, which would first turn
    it into a CoreV1Event and refuse a malformed one): the same check, held here."""
    from datetime import UTC, datetime

    import kubernetes

    from nodefabric_operator import recorder

    changes = [labels.Change(f"{P}rdma.capable", "true", None)]
    notice = (
        events.for_changes("NodeFeature ns/n1", changes, "gpustack.ai")
        if kind == "change"
        else events.for_failure(events.PUBLISH_FAILED, "x" * 5000)
    )
    assert notice is not None
    involved = {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "Devices", "name": "n1", "uid": "u-1"}
    body = recorder.event_body(involved, notice, "pod-1", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    event = kubernetes.client.CoreV1Event.model_validate(body)
    assert event.involved_object.namespace is None and event.metadata.namespace == recorder.NAMESPACE
    assert event.first_timestamp == event.last_timestamp and event.count == 1
    assert (event.type, event.reason, event.message) == (notice.type, notice.reason, notice.message)
    assert (event.involved_object.kind, event.involved_object.uid) == ("Devices", "u-1")
    assert (event.reporting_component, event.reporting_instance) == (events.COMPONENT, "pod-1")
