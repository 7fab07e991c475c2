"""Hostile checks of the operator's speed pass: the first publications' counted log line (progress.py)
loses no node an operator needs to see, the status write's answer is taken as the server left it, the
credential check refuses exactly what it did, and label changes are counted as before."""

from __future__ import annotations

import asyncio
import json
import logging
import types
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import kubernetes
import pytest
from operator_harness import Client, eventually, running_operator, settle
from operator_records import devices, gpu, group, nic, nvlink
from test_operator_observability import captured_logs, gpu_record, operator_lines, seeded

from nodefabric_devicemanager import crd, logs, models
from nodefabric_devicemanager.models import Condition, DevicesStatus, LinkState
from nodefabric_operator import progress, rawcall, reconcile, wire
from nodefabric_operator.demo.kubeapi import running_api
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.noderecord import NodeRecord
from nodefabric_operator.statuswriter import StatusUnreadable, StatusWriter

# --- the credential's control characters ------------------------------------------------------------


def _config(token: str) -> Any:
    return types.SimpleNamespace(api_key={"BearerToken": token}, api_key_prefix={"BearerToken": "Bearer"})


def _old_refused(value: str) -> bool:
    # main's check, verbatim: `any(ord(c) < 0x20 or c == "\x7f" for c in value)`
    return any(ord(c) < 0x20 or c == "\x7f" for c in value)


def test_the_credential_check_refuses_exactly_what_the_per_character_check_refused():
    """Code points (surrogates included), alone and inside a token: refused exactly when main's
    per-character test refused it; never a message that quotes the token."""
    secret = "s3cr3t-token-value"
    differ = []
    # Every code point of the first plane (C0, C1, line and paragraph separators, surrogates, BOM) and a
    # stride through the others with their last two (every code point took 13 s).
    astral = [cp for plane in range(1, 17) for cp in range(plane << 16, (plane + 1) << 16, 251)]
    astral += [(plane << 16) | 0xFFFE for plane in range(17)] + [
        (plane << 16) | 0xFFFF for plane in range(17)
    ]
    for cp in [*range(0x10000), *astral]:
        ch = chr(cp)
        for token in (ch, f"{secret}{ch}", f"{ch}{secret}"):
            try:
                rawcall.credential(_config(token))
                refused = False
            except rawcall.UnusableCredential as err:
                refused = True
                assert secret not in str(err) and token not in str(err)
            if refused != _old_refused(f"Bearer {token}"):
                differ.append(hex(cp))
                break
    assert not differ, differ[:20]


@pytest.mark.parametrize("ch", ["\x00", "\n", "\r", "\t", "\x1f", "\x7f"])
def test_a_control_character_in_the_prefix_is_refused_too(ch):
    config = types.SimpleNamespace(
        api_key={"BearerToken": "abc"}, api_key_prefix={"BearerToken": f"Bea{ch}rer"}
    )
    with pytest.raises(rawcall.UnusableCredential) as err:
        rawcall.credential(config)
    assert "abc" not in str(err.value)


@pytest.mark.parametrize("ch", ["\u2028", "\u0085", "\u2029", "\x80", "\x9f", "\ufeff"])
def test_unicode_separators_pass_as_they_did(ch):
    """The old check refused only C0 controls and DEL; these were let through then and still are."""
    assert rawcall.credential(_config(f"abc{ch}def")) == f"Bearer abc{ch}def"


# --- label changes counted by kind --------------------------------------------------------------------


def test_label_changes_counted_with_an_amount_equal_one_increment_per_change():
    from nodefabric_operator import labels

    changes = [
        labels.Change("a", None, "1"),
        labels.Change("b", None, "2"),
        labels.Change("c", "1", "2"),
        labels.Change("d", "1", None),
        labels.Change("e", None, "3"),
    ]
    by_amount, by_one = Metrics(), Metrics()
    reconcile.count_changes(by_amount, changes)
    for c in changes:
        by_one.inc(by_one.label_changes, c.kind)
    kinds = {c.kind for c in changes}
    assert len(kinds) >= 3
    for kind in kinds:
        got = by_amount.label_changes.labels(kind)._value.get()
        assert got == by_one.label_changes.labels(kind)._value.get()
    assert sum(by_amount.label_changes.labels(k)._value.get() for k in kinds) == len(changes)
    reconcile.count_changes(by_amount, [])
    assert sum(by_amount.label_changes.labels(k)._value.get() for k in kinds) == len(changes)


# --- the status write's answer ------------------------------------------------------------------------


def _record(rv: str = "5") -> NodeRecord:
    from nodefabric_operator import labels
    from nodefabric_operator.noderecord import prepare

    body = gpu_record("n1").wire()
    body["metadata"]["resourceVersion"] = rv
    body["metadata"]["uid"] = "u1"
    return prepare(body, labels.DEFAULT_DOMAIN)


def _new(record: NodeRecord) -> DevicesStatus:
    when = datetime(2026, 12, 2, 3, 0, 0, tzinfo=UTC)
    cond = Condition(type=models.LABELS_PUBLISHED, status="True", reason="Published", message="ok")
    return record.status.model_copy(
        update={
            "labels": {"gpu.example/a": "1", "gpu.example/b": "2"},
            "labels_published_time": when,
            "conditions": models.set_condition(record.status.conditions, cond, when),
            "rdma_endpoints": 1,
        }
    )


def _answered(record: NodeRecord, new: DevicesStatus, answer: bytes) -> NodeRecord | None:
    writer = StatusWriter(kubernetes.client.ApiClient(), None, "x", Metrics())  # type: ignore[arg-type]
    calls = writer.write(record, new)
    request = next(calls)
    assert request.method == "PATCH" and request.body["metadata"]["resourceVersion"] == record.rv
    with pytest.raises(StopIteration) as done:
        calls.send(answer)
    result: NodeRecord | None = done.value.value
    return result


def _answer(status: Any, rv: str = "6") -> bytes:
    return json.dumps({"metadata": {"name": "n1", "resourceVersion": rv}, "status": status}).encode()


# An answer nested deeper than the JSON decoder recurses (200 KB, far inside wire.MAX_ANSWER).
DEEP = b"[" * 100_000 + b"]" * 100_000


def test_the_usual_answer_keeps_the_status_sent_and_takes_the_new_version():
    record = _record()
    new = _new(record)
    after = _answered(record, new, _answer(new.wire(), rv="77"))
    assert after is not None and after.rv == "77"
    assert after.status.wire() == new.wire()


def test_an_answer_the_server_changed_is_what_the_record_keeps():
    """A server (a mutating webhook, a field dropped or normalized, another writer's condition merged)
    answers a status other than the one sent: the record holds what the server holds, not what was sent."""
    record = _record()
    new = _new(record)
    changed = new.wire()
    changed["labels"] = {"gpu.example/a": "1"}  # one dropped by the server
    changed["rdmaEndpoints"] = 3
    changed["conditions"] = [
        *changed["conditions"],
        {
            "type": "Other",
            "status": "True",
            "reason": "X",
            "message": "",
            "lastTransitionTime": "2026-12-02T03:00:00Z",
        },
    ]
    after = _answered(record, new, _answer(changed, rv="8"))
    assert after is not None and after.rv == "8"
    assert after.status.labels == {"gpu.example/a": "1"}
    assert after.status.rdma_endpoints == 3
    assert [c.type for c in after.status.conditions][-1] == "Other"


def test_an_answer_with_a_status_we_cannot_read_keeps_ours():
    record = _record()
    new = _new(record)
    after = _answered(record, new, _answer({**new.wire(), "rdmaEndpoints": -4}))
    assert after is not None and after.status.wire() == new.wire() and after.rv == "6"


@pytest.mark.parametrize(
    "answer",
    [b"", b"garbage \xff\xfe", b"[]", b'"status"', b"null", b"42", b"{", b'{"a":"\xff"}', DEEP, b"[0]" * 100],
)
def test_an_answer_that_is_not_a_json_object_is_an_error_not_a_success(answer):
    """A failed status write (retried: reconcile.transient), said as such, not a publication failure."""
    record = _record()
    new = _new(record)
    with pytest.raises(StatusUnreadable, match="status write answered with no readable object") as failed:
        _answered(record, new, answer)
    assert reconcile.transient(failed.value)
    assert isinstance(failed.value.__cause__, ValueError)


def test_a_refusal_that_is_a_value_error_is_not_taken_for_an_unreadable_answer():
    """An error thrown in where the write yielded (a credential that cannot be sent: a ValueError) stays
    what it is: only an answer's bytes make StatusUnreadable."""
    record = _record()
    writer = StatusWriter(kubernetes.client.ApiClient(), None, "x", Metrics())  # type: ignore[arg-type]
    calls = writer.write(record, _new(record))
    next(calls)
    with pytest.raises(rawcall.UnusableCredential):
        calls.throw(rawcall.UnusableCredential("x"))


def _status_write_of(node: str) -> Any:
    def matches(req: Any) -> bool:  # the operator's (the seeding's own status write says no publication)
        path = str(req.url.path)
        return req.method == "PATCH" and path.endswith(f"/devices/{node}/status") and b"Published" in req.body

    return matches


async def test_a_status_write_answered_200_with_no_object_is_retried_and_never_said_unpublished():
    """The API server (or a proxy) answers the status write 200 with a list: the labels are on the
    Node's NodeFeature, so the operator says so (WARNING: labels written, status answer unreadable), never
    "labels not published"; the status write is retried and the record ends published."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await seeded(k, c, ["n1"])
        k.api[_status_write_of("n1")][:1] << b"[]"
        with captured_logs(logs.JsonFormatter(), logging.DEBUG) as out:
            async with running_operator(k) as metrics:
                await eventually(lambda: _published(c, "n1"))
                await settle(k)
                assert metrics.reconciles.labels(outcome="error")._value.get() == 0
    lines = _lines(out.getvalue())
    said = [(ln["level"], ln["msg"]) for ln in lines if ln.get("node") == "n1" and ln["level"] != "debug"]
    assert ("warning", "labels written, but the status write's answer is unreadable") in said, lines
    assert not [m for lvl, m in said if lvl == "error"], lines
    unreadable = [ln for ln in lines if ln["msg"].startswith("labels written, but")]
    assert unreadable[0]["error"] == "the API server answered a list, not an object", unreadable
    # The retry planned against the NodeFeature as the first try's write left it: no stale write (409).
    assert not [ln for ln in lines if ln["msg"].startswith("sink object changed while writing")], lines


async def _gives_up_saying_the_labels_were_written(stub: Callable[[Any], None], why: str) -> None:
    """Node n1's status writes answered as `stub` sets them: the reconcile gives up (ERROR), its line says
    the labels were written and the status not confirmed (`why` in its error), never "labels not
    published", and the NodeFeature holds the labels."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await seeded(k, c, ["n1"])
        stub(k)
        with captured_logs(logs.JsonFormatter(), logging.DEBUG) as out:
            async with running_operator(k) as metrics:
                await eventually(lambda: metrics.reconciles.labels(outcome="error")._value.get() >= 1)
                nf = await c.nodefeature("n1")
    assert nf is not None and nf["spec"]["labels"]  # written, as the line says
    lines = _lines(out.getvalue())
    errors = [ln for ln in lines if ln["level"] == "error" and ln.get("node") == "n1"]
    assert errors[0]["msg"] == "labels written, status not confirmed", lines
    assert why in errors[0]["error"], errors[0]
    assert not [ln for ln in lines if ln["msg"] == "labels not published"], lines


async def test_a_status_write_unreadable_through_every_retry_says_the_labels_were_written():
    """Every status write of the node is answered 200 with a list, the retries' too: the reconcile gives
    up (ERROR), and its line says what is true, the labels written and the status not confirmed, never
    "labels not published" (the NodeFeature holds them)."""

    def unreadable(k: Any) -> None:
        k.api[_status_write_of("n1")] << b"[]"

    await _gives_up_saying_the_labels_were_written(
        unreadable, "status write answered with no readable object"
    )


@pytest.mark.parametrize("first", [b"[]", 503], ids=["unreadable", "refused"])
async def test_a_status_write_failing_on_every_try_after_the_labels_landed_says_they_were_written(first):
    """The labels land on the NodeFeature on the first try; that try's status write is answered 200 with
    a list (or 503), and every retry's status write 503: the reconcile gives up (ERROR), and its line
    says what is true, the labels written and the status not confirmed. The line was chosen by the last
    try's error alone, so a 503 there said "labels not published" of labels the NodeFeature held."""

    def failing(k: Any) -> None:
        k.api[_status_write_of("n1")][:1] << first
        k.api[_status_write_of("n1")][:3] << 503  # the two retries (the first is answered above)

    await _gives_up_saying_the_labels_were_written(failing, "503")


def test_the_final_line_says_labels_not_published_for_any_other_failure():
    assert reconcile.failure_said(StatusUnreadable("x")) == "labels written, status not confirmed"
    for err in (OSError("x"), ValueError("x"), kubernetes.client.ApiException(status=503)):
        assert reconcile.failure_said(err) == "labels not published"
        assert reconcile.failure_said(err, written=True) == "labels written, status not confirmed"


# --- the first publications' counted line: no node an operator was told about goes unnamed --------------


def _first_post_of(node: str) -> Any:
    def matches(req: Any) -> bool:
        return req.method == "POST" and "nodefeatures" in str(req.url) and f'"{node}"'.encode() in req.body

    return matches


def _changed(name: str) -> Any:
    return devices(
        name, interfaces=[nic(link=LinkState.FAILED)], groups=[group("nvidia", gpu(0, fabric=nvlink()))]
    )


async def _published(c: Client, name: str) -> bool:
    status = (await c.devices(name)).get("status") or {}
    return bool(status.get("labelsPublishedTime"))


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in operator_lines(out, "json")]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"[]", "the API server answered a list, not an object"),
        (b"[" * 100_000 + b"]" * 100_000, "the API server's answer is nested too deeply to read"),
    ],
    ids=["a list", "nested past the decoder's depth"],
)
async def test_a_labels_write_answered_200_with_no_object_is_an_error_named_and_tried_again(answer, said):
    """The NodeFeature's create is answered 200 with something that is not an object (a list; 200 KB of
    brackets, whose RecursionError no caller handles): the publication fails with that reason in its
    ERROR line (the operator cannot tell what was written), nothing escapes the reconcile, and the record
    is published by the try that follows."""
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        k.api[_first_post_of("n1")][:1] << answer
        await seeded(k, c, ["n1"])
        with captured_logs(logs.JsonFormatter(), logging.DEBUG) as out:
            async with running_operator(k):
                await eventually(lambda: _published(c, "n1"))
                await settle(k)
    lines = _lines(out.getvalue())
    failed = [ln for ln in lines if ln.get("node") == "n1" and ln["level"] == "error"]
    assert [ln["error"] for ln in failed] == [f"nodefeature write failed: {said}"], lines


async def test_a_node_that_recovers_from_a_failure_is_named_in_its_own_info_line(monkeypatch):
    """A record's publication failed (ERROR, its Node missing) and later succeeds amid a burst of new
    nodes: its success is not folded into the summary's "and N more" (which names five): the operator
    who read the ERROR line about that node reads a line that says it was published."""
    monkeypatch.setattr(progress, "QUIET_S", 0.5)
    monkeypatch.setattr(progress, "NAMED", 1)  # the summary names one node: the burst hides the rest
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.put_devices(gpu_record("ghost"), node_owner=False)  # no Node named ghost yet
        with captured_logs(logs.JsonFormatter(), logging.DEBUG) as out:
            async with running_operator(k) as metrics:
                await eventually(lambda: metrics.reconciles.labels(outcome="error")._value.get() >= 1)
                await seeded(k, c, [f"n{i}" for i in range(6)])
                await c.node("ghost")  # its arrival publishes the record that waited for it
                await eventually(lambda: _published(c, "ghost"))
                # And the agent's next pass (a link gone) makes a new version: published again.
                await c.put_devices(_changed("ghost"))
                for name in ["ghost", *(f"n{i}" for i in range(6))]:
                    await eventually(lambda name=name: _published(c, name))
                await eventually(lambda: "labels published for the first time" in out.getvalue())
                await settle(k)
    lines = _lines(out.getvalue())
    assert [ln for ln in lines if ln["level"] == "error" and ln.get("node") == "ghost"], lines
    own = [ln for ln in lines if ln["msg"] == "labels published" and ln.get("node") == "ghost"]
    assert [ln["level"] for ln in own] == ["info", "info"], lines
    _each_node_told_once_and_counted_once(lines, [f"n{i}" for i in range(6)])


def _each_node_told_once_and_counted_once(lines: list[dict[str, Any]], names: list[str]) -> None:
    """The summaries count exactly the publications whose own line went to DEBUG, no node twice (the
    nodes seeded while the operator runs meet superseded writes: their record changed under them), and
    every node's publication is either in an INFO line of its own or among those counted."""
    own = [ln for ln in lines if ln["msg"] == "labels published"]
    counted = [ln["node"] for ln in own if ln["level"] == "debug"]
    assert len(counted) == len(set(counted)), counted
    summaries = [ln for ln in lines if ln["msg"] == "labels published for the first time"]
    assert sum(s["records"] for s in summaries) == len(counted), (summaries, counted)
    told = {ln["node"] for ln in own if ln["level"] == "info"}
    assert set(names) <= told | set(counted)


async def test_a_node_whose_publish_was_retried_is_named_in_its_own_info_line(monkeypatch):
    """A first publication that met a server error and was retried (a WARNING naming the node) ends
    with an INFO line naming it, not only a count."""
    monkeypatch.setattr(progress, "QUIET_S", 0.5)
    monkeypatch.setattr(progress, "NAMED", 0)
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        k.api[_first_post_of("n3")][:1] << 503  # one server error on n3's first write
        await seeded(k, c, [f"n{i}" for i in range(6)])
        with captured_logs(logs.JsonFormatter(), logging.DEBUG) as out:
            async with running_operator(k) as metrics:
                await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 6)
                await eventually(lambda: "labels published for the first time" in out.getvalue())
                await settle(k)
    lines = _lines(out.getvalue())
    warned = [ln for ln in lines if ln["level"] == "warning" and ln.get("node") == "n3"]
    assert warned and warned[0]["msg"] == "label publish failed, retrying", lines
    own = [ln for ln in lines if ln["msg"] == "labels published" and ln.get("node") == "n3"]
    assert [ln["level"] for ln in own] == ["info"], lines
    _each_node_told_once_and_counted_once(lines, [f"n{i}" for i in range(6)])
    assert sum(ln["records"] for ln in lines if ln["msg"] == "labels published for the first time") == 5


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_the_stop_writes_the_summary_on_the_event_loop_and_leaves_no_timer(monkeypatch):
    """The stop's summary is written by the operator's event loop (kopf runs a plain function handler in
    a worker thread: a summary taken there races the loop's publications still in flight, and a timer
    cancelled from another thread is not thread-safe), and no summary timer is left behind."""
    monkeypatch.setattr(progress, "QUIET_S", 60.0)  # only the stop ends the count
    made: list[progress.FirstPublications] = []

    class Kept(progress.FirstPublications):
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            made.append(self)

    monkeypatch.setattr(progress, "FirstPublications", Kept)  # the one the reconciler's Told makes
    seen = _Records()
    logging.getLogger(progress.__name__).addHandler(seen)
    try:
        async with running_api([crd.devices_crd()]) as k:
            await seeded(k, Client(k.kubeconfig), ["n0", "n1", "n2"])
            with captured_logs(logs.JsonFormatter()):
                async with running_operator(k) as metrics:
                    await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 3)
                    await settle(k)
    finally:
        logging.getLogger(progress.__name__).removeHandler(seen)
    (summary,) = [r for r in seen.records if r.getMessage() == "labels published for the first time"]
    assert summary.records == 3  # type: ignore[attr-defined]
    assert summary.threadName == "operator", summary.threadName  # the operator's loop (harness thread)
    (counted,) = made
    assert counted.count == 0 and counted._timer is None


def test_the_counter_keeps_five_names_however_many_it_counts():
    async def run() -> progress.FirstPublications:
        counted = progress.FirstPublications(every=10**9, quiet_s=3600)
        for i in range(100_000):
            counted.add(f"node-{i}")
        assert counted.count == 100_000 and len(counted.names) == progress.NAMED
        counted.flush()
        return counted

    counted = asyncio.run(run())
    assert counted.count == 0 and counted.names == [] and counted._timer is None


def _failure_written_for(node: str) -> Any:
    def matches(req: Any) -> bool:
        path = str(req.url.path)
        return (
            req.method == "PATCH"
            and path.endswith(f"/devices/{node}/status")
            and b"PublishFailed" in req.body
        )

    return matches


async def test_a_node_named_at_error_whose_failure_could_not_be_recorded_is_named_when_published(
    monkeypatch,
):
    """The API server in trouble: a node's first write fails through every retry (ERROR), and so does
    the write of that failure to its status; the later retry publishes it. Its status holds no failure
    to tell the publication from a quiet first one, yet the operator read an ERROR naming the node: the
    publication gets its own INFO line."""
    monkeypatch.setattr(progress, "QUIET_S", 0.5)
    monkeypatch.setattr(progress, "NAMED", 0)
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await seeded(k, c, [f"n{i}" for i in range(6)])
        k.api[_first_post_of("n3")][:3] << 503  # the first try and both retries
        k.api[_failure_written_for("n3")][:1] << 503  # the failure's status write
        with captured_logs(logs.JsonFormatter(), logging.DEBUG) as out:
            async with running_operator(k) as metrics:
                for name in [f"n{i}" for i in range(6)]:
                    await eventually(lambda name=name: _published(c, name))
                await eventually(lambda: "labels published for the first time" in out.getvalue())
                await settle(k)
                assert metrics.reconciles.labels(outcome="error")._value.get() == 1
    lines = _lines(out.getvalue())
    errors = [ln["msg"] for ln in lines if ln["level"] == "error" and ln.get("node") == "n3"]
    assert errors == ["labels not published", "could not record the failure in status"], lines
    own = [ln for ln in lines if ln["msg"] == "labels published" and ln.get("node") == "n3"]
    assert [ln["level"] for ln in own] == ["info"], lines
    _each_node_told_once_and_counted_once(lines, [f"n{i}" for i in range(6)])


async def test_an_answer_over_the_bound_fails_the_write_and_it_is_retried(monkeypatch):
    """Something in front of the API answers the first NodeFeature create with a body over the bound (1
    MiB here): the operator refuses it unread, as AnswerTooLarge, logs the retry with that name, and the
    retry publishes (the create was not taken for done on a body it did not read)."""
    monkeypatch.setattr(wire, "MAX_ANSWER", 1024 * 1024)
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await seeded(k, c, ["n1"])
        k.api[_first_post_of("n1")][:1] << b"[" + b"0," * (1024 * 1024) + b"0]"
        with captured_logs(logs.JsonFormatter(), logging.DEBUG) as out:
            async with running_operator(k) as metrics:
                await eventually(lambda: _published(c, "n1"))
                await settle(k)
                assert metrics.reconciles.labels(outcome="error")._value.get() == 0
    lines = _lines(out.getvalue())
    retried = [ln for ln in lines if ln["msg"] == "label publish failed, retrying" and ln.get("node") == "n1"]
    assert [ln["error"] for ln in retried] == ["AnswerTooLarge"], lines
    assert not [ln for ln in lines if ln["msg"] == "labels not published"], lines
