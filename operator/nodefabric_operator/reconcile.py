"""One node's reconcile: Devices record -> label set -> sink -> Devices status, an Event, metrics.

Level-based: every pass recomputes from the whole record and compares with the sink object the watch
delivered (the view), so a repeated pass, a replayed event or an operator restart writes nothing when
nothing changed, and reads nothing either. What a first sync costs per record: the sink write and the
status write (a first publication posts no Event: events.py). Every Devices event at or below the
resourceVersion already handled for that node (a replay after a relist, the echo of our own status
write) is skipped before the record is even parsed, and before kopf processes it (intake.py);
so is a sink object event that brings nothing newer than the view (the echo of our own sink write).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
import kubernetes
import pydantic
import urllib3

from nodefabric_devicemanager import models
from nodefabric_devicemanager.models import DevicesStatus
from nodefabric_operator import events, labels, sinks
from nodefabric_operator.echoes import SinkEchoes
from nodefabric_operator.ledger import Ledger
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.noderecord import (
    NodeRecord,
    Outcome,
    brief,
    failure_condition,
    first_error,
    prepare,
)
from nodefabric_operator.nodewatch import LabelsOnNode
from nodefabric_operator.nswait import NamespaceWait
from nodefabric_operator.progress import Told
from nodefabric_operator.recorder import Recorder
from nodefabric_operator.statuswriter import Applied, StatusUnreadable, StatusWriter
from nodefabric_operator.view import SinkView, at_or_below, part, version

log = logging.getLogger(__name__)

DEFAULT_BACKOFFS: tuple[float, ...] = (1, 2, 5, 10, 30, 60)
SHOWN = 80  # characters of a withheld value quoted in a log line


def transient(err: BaseException) -> bool:
    """Worth retrying: the API was unreachable (no answer, or none in time), overloaded or answered a
    server error: each ends without the record changing. (A missing NodeFeature API or namespace is
    no retry of the record's own: it waits with every other record, nswait.py.)"""
    if isinstance(err, kubernetes.client.ApiException):
        status = int(err.status or 0)
        # A redirect (3xx) comes from something in front of the API server and is not followed (see
        # aioclient): retried, as the threaded client's MaxRetryError for the same answer is.
        return status in (429, 500, 502, 503, 504) or 300 <= status <= 399 or not status
    return isinstance(
        err,
        urllib3.exceptions.HTTPError
        | aiohttp.ClientError
        | OSError
        | sinks.Conflict
        | StatusUnreadable,  # the labels were written: the status write is retried
    )


def record_names(custom: kubernetes.client.CustomObjectsApi, metrics: Metrics) -> dict[str, str]:
    """Every Devices record's name and uid, listed page by page."""
    page = sinks.listing(custom.api_client, f"/apis/{models.GROUP}/{models.VERSION}/{models.PLURAL}")
    found = sinks.pages(metrics, models.PLURAL, page)
    return {str(part(i, "metadata").get("name", "")): str(part(i, "metadata").get("uid", "")) for i in found}


class Reconciler:
    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        sink: sinks.Sink,
        *,
        domain: str = labels.DEFAULT_DOMAIN,
        metrics: Metrics | None = None,
        recorder: Recorder | None = None,
        backoffs: Sequence[float] = DEFAULT_BACKOFFS,
    ) -> None:
        self.api = api
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.sink = sink
        self.domain = domain
        self.metrics = metrics or Metrics()
        self.recorder = recorder
        self.backoffs = tuple(backoffs)
        self.view = SinkView()
        self.ledger = Ledger()
        self.told = Told()
        self.status = StatusWriter(api, sink, domain, self.metrics)
        self.echoes = SinkEchoes(sink, self.view, self.ledger.records, self.metrics, self.sink_event)
        self.on_node = LabelsOnNode(
            api,
            sink,
            view=self.view,
            ledger=self.ledger,
            status=self.status,
            metrics=self.metrics,
            domain=domain,
        )
        self.withdraw = Withdrawal(
            sink,
            self.view,
            ledger=self.ledger,
            status=self.status,
            metrics=self.metrics,
            backoffs=self.backoffs,
        )
        self.namespace = NamespaceWait(
            getattr(sink, "namespace", ""),
            self.backoffs,
            self._reconcile,
            self.ledger.records.__contains__,
            cheap=lambda n: (r := self.ledger.records.get(n)) is not None and r.owner.node_uid is not None,
        )
        # A node whose publish failed for a transient reason is reconciled again after the longest backoff.
        self.requeue = Requeue(
            max(self.backoffs, default=DEFAULT_BACKOFFS[-1]),
            self._reconcile,
            self.ledger.records.__contains__,
        )

    @property
    def watches_nodes(self) -> bool:
        """Whether Node events must reach node_event (the NodeFeature sink, allowed to list Nodes)."""
        return self.on_node.nodes is not None

    # --- what exists before the first reconcile -----------------------------------------------------------

    async def prime(self) -> None:
        """Read what exists before kopf starts (read_existing)."""
        await read_existing(self)

    def note_devices(self, body: Mapping[str, Any]) -> None:
        meta = part(body, "metadata")
        self.ledger.known[str(meta.get("name", ""))] = str(meta.get("uid", ""))

    # --- the async shell kopf calls --------------------------------------------------------------------

    def devices_echo(self, body: Mapping[str, Any]) -> bool:
        """Whether a Devices event is no newer than the version handled (our status write's echo, a
        replay): noted, counted, True; neither kopf (intake.py) nor a reconcile sees it."""
        name, rv = str(part(body, "metadata").get("name", "")), version(body)
        self.note_devices(body)
        if at_or_below(rv, self.ledger.handled.get(name)):
            self.metrics.inc(self.metrics.skipped, models.PLURAL)
            return True
        return False

    async def devices_event(self, body: Mapping[str, Any]) -> Outcome:
        name, rv = str(part(body, "metadata").get("name", "")), version(body)
        if self.devices_echo(body):
            return Outcome("skipped")
        try:
            record = prepare(body, self.domain)
        except pydantic.ValidationError as err:
            # A record we cannot read says nothing about the node: publish nothing, remove nothing.
            log.error(
                "devices record is invalid, labels left as published",
                extra={"node": name, "error": first_error(err)},
            )
            self.ledger.handled[name] = rv
            self.metrics.inc(self.metrics.reconciles, "invalid")
            return Outcome("invalid")
        for w in record.result.withheld:
            self.metrics.inc(self.metrics.withheld, w.key)
            log.warning(
                "label withheld",
                extra={"node": name, "key": w.key, "value": w.value[:SHOWN], "reason": w.reason},
            )
        self.ledger.records[name] = record
        self.metrics.records.set(len(self.ledger.records))
        return await self._reconcile(name)

    async def devices_deleted(self, name: str) -> Outcome:
        """The Devices object is gone: withdraw what the sink holds for it (a NodeFeature is GC'd instead)."""
        self.devices_gone(name)
        return await self.withdraw(name)

    def devices_gone(self, name: str) -> None:
        """The Devices object is gone, nothing written (its deletion dropped unhandled as the watch
        stopped): the next listing of the sink withdraws what was published for it (sink_event)."""
        self.ledger.forget(name)
        self.told.forget(name)
        self.namespace.forget(name)
        self.view.clear_deleted(name)
        self.metrics.records.set(len(self.ledger.records))

    async def sink_event(self, body: Mapping[str, Any]) -> Outcome | None:
        """A watched sink object changed: repair it only if it drifted from what the record yields (a hand
        edit, a deletion of our keys). A pure check against what is held: watching costs no requests."""
        snapshot = self.sink.snapshot(body)
        if not self.view.observe(snapshot) and snapshot.rv is not None:
            self.metrics.inc(self.metrics.skipped, self.sink.name)
        name = snapshot.name
        record = self.ledger.records.get(name)
        if record is None:
            if name not in self.ledger.known and (self.view.get(name) or snapshot).managed:
                # Labels we wrote on a Node whose record is gone (deleted while the operator was down).
                log.info("labels we wrote have no devices record, withdrawing them", extra={"node": name})
                return await self.withdraw(name)
            return None  # a record the watch listed is reconciled by its own event
        current = self.view.get(name)
        if not self.sink.drifted(record.owner, record.result.labels, record.frozen, current):
            return None
        log.info("labels drifted from the devices record, repairing", extra={"node": name})
        return await self._reconcile(name)

    async def sink_deleted(self, body: Mapping[str, Any]) -> Outcome | None:
        snapshot = self.sink.snapshot(body)
        name = snapshot.name
        dropped = self.view.forget(name, snapshot.rv, remember=name in self.ledger.known)
        if not dropped or name not in self.ledger.records:
            return None
        log.info(
            "sink object deleted while its devices record exists, publishing again", extra={"node": name}
        )
        return await self._reconcile(name)

    async def node_event(self, body: Mapping[str, Any]) -> Outcome | None:
        """A watched Node changed (NodeFeature sink): say whether the published labels reached it, and
        publish a record that waited for its Node to exist (its condition promises so)."""
        outcome = await self.on_node.node_event(body)
        name = str(part(body, "metadata").get("name", ""))
        record = self.ledger.records.get(name)
        if record is None or not waits_for_node(record.status):
            return outcome
        log.info("the node a devices record waited for exists, publishing", extra={"node": name})
        return await self._reconcile(name)

    def node_deleted(self, body: Mapping[str, Any]) -> None:
        """A Node went: its record goes with it (owned by it), so nothing is written about it."""
        self.on_node.node_deleted(body)

    def health(self) -> dict[str, int]:
        return {"nodes": len(self.ledger.records), "sinkObjects": len(self.view)}

    # --- the reconcile, one node at a time --------------------------------------------------------------

    async def _reconcile(self, name: str) -> Outcome:
        with self.echoes.publishing(name):
            return await self._publish(name)

    async def _publish(self, name: str) -> Outcome:
        async with self.ledger.lock(name):
            delays = iter(self.backoffs)
            retried = False  # a WARNING named this node: its publication gets its own INFO line too
            landed: list[sinks.Published] = []  # each try's sink write that succeeded (status.apply)
            while True:
                record = self.ledger.records.get(name)
                if record is None:
                    return Outcome("unchanged")  # deleted while waiting for the lock
                if self.view.get(name) is None and self.namespace.holds(name):
                    return await waiting_for_namespace(self, record, None)
                started = time.perf_counter()
                try:
                    view, node = self.view, self.on_node.seen(name)
                    calls = self.status.apply(record, view.get(name), view.was_deleted(name), node, landed)
                    applied = await self.status.send(calls)
                except sinks.RecordGone as err:
                    # A late event for a deleted record: its own DELETED event follows and forgets it.
                    log.info(
                        "devices record is gone, nothing published", extra={"node": name, "why": str(err)}
                    )
                    return Outcome("unchanged")
                except Exception as err:
                    if landed and landed[-1].now is not None:
                        # The labels landed and the status write failed: the retry plans against the
                        # sink object as that write left it, not the one it replaced (a 409 and a read).
                        self.view.observe(landed[-1].now)
                    if isinstance(err, sinks.Unpublishable):
                        return await waiting_for_namespace(self, record, err)
                    delay = next(delays, None) if transient(err) else None
                    if delay is None:
                        return await self._failed(record, err, written=bool(landed))
                    log.warning(
                        "label publish failed, retrying",
                        extra={"node": name, "error": brief(err), "retry_in_s": delay},
                    )
                    retried = True
                    await asyncio.sleep(delay)
                    continue
                finally:
                    self.metrics.duration.observe(time.perf_counter() - started)
                if applied.published.wrote:
                    self.namespace.present()
                outcome = self._settle(record, applied, retried=retried)
                await self._event(record, _notice(record, applied, outcome, self.domain))
                return outcome

    def _settle(self, before: NodeRecord, applied: Applied, *, retried: bool = False) -> Outcome:
        """Record what a publish did (on the event loop: the view and tables are not shared with threads)."""
        published, record = applied.published, applied.record
        name = record.name
        if published.now is not None:
            self.view.observe(published.now)
        self.ledger.keep(before, record)
        if not applied.superseded:
            self.ledger.handled[name] = record.rv
        changes = tuple(published.plan.changes)
        count_changes(self.metrics, changes)
        if published.plan.kept:
            _kept(self.metrics, self.domain, record, published.plan.kept)
        outcome = "superseded" if applied.superseded else "published" if changes else "unchanged"
        self.metrics.inc(self.metrics.reconciles, outcome)
        counted = self.told.counted(name, published.wrote and quiet_first(before, applied, changes, retried))
        if published.wrote and (not counted or log.isEnabledFor(logging.DEBUG)):
            log.log(
                logging.DEBUG if counted else logging.INFO,
                "labels published",
                extra={
                    "node": name,
                    "target": published.target,
                    "changes": " ".join(c.brief(self.domain) for c in changes) or "ownership",
                },
            )
        return Outcome(outcome, changes, applied.status_written)

    async def _failed(self, record: NodeRecord, err: BaseException, *, written: bool = False) -> Outcome:
        name = record.name
        condition = failure_condition(self.sink.name, err)
        log.error(
            failure_said(err, written=written),
            extra={"node": name, "reason": condition.reason, "error": condition.message},
        )
        self.told.failed(name)
        self.metrics.inc(self.metrics.reconciles, "error")
        if transient(err):
            # The API server is in trouble, not the record: try again later, and on any replay meanwhile.
            self.requeue.add(name)
        else:
            # This version cannot be published as it is; a replay of it is skipped. Writing the failure
            # makes a new version, whose event retries once (a missing Node may exist by then).
            self.ledger.handled[name] = record.rv
        try:
            after = await self.status.send(self.status.record_failure(record, condition))
            written = after is not None
            if after is not None:
                self.ledger.keep(record, after)
        except Exception as status_err:
            log.error(
                "could not record the failure in status", extra={"node": name, "error": brief(status_err)}
            )
            written = True  # say it in an Event at least
        # A failure already in status was already announced: its echo retries quietly.
        if written:
            await self._event(record, events.for_failure(condition.reason, condition.message))
        return Outcome("error")

    def close(self) -> None:
        """Stop retries that are due later (the operator is stopping); what the first publications'
        summary has counted so far is logged now."""
        self.requeue.close()
        self.namespace.close()
        self.echoes.close()
        self.told.flush()

    async def aclose(self) -> None:
        """Close the connections the writes were sent on (the operator stopped)."""
        self.close()
        await self.status.send.close()

    async def _event(self, record: NodeRecord, notice: events.Notice | None) -> None:
        if self.recorder is not None and notice is not None:
            await self.recorder.posting(record.ref(), notice)


async def read_existing(rec: Reconciler) -> None:
    """Read the sink objects once, page by page, before kopf starts: the first reconcile of each
    record then plans against what exists instead of reading its object back. kopf's own listing
    delivers the same versions afterwards, which the view recognises. A sink that withdraws labels
    itself (the Node's) also needs every record's name first, so that a Node carrying our labels
    is not taken for one whose record is gone merely because its record is listed later."""
    for obj in await asyncio.to_thread(lambda: list(rec.sink.existing())):
        rec.view.observe(obj)
    if rec.sink.withdraws:
        names = await asyncio.to_thread(record_names, rec.custom, rec.metrics)
        rec.ledger.known.update(names)
    await rec.on_node.prime()
    log.info(
        "sink objects read",
        extra={
            "sink": rec.sink.name,
            "objects": len(rec.view),
            "records": len(rec.ledger.known),
            "nodes": len(rec.on_node.nodes) if rec.on_node.nodes is not None else None,
        },
    )


async def waiting_for_namespace(
    rec: Reconciler, record: NodeRecord, err: sinks.Unpublishable | None
) -> Outcome:
    """`record` waits for --namespace, or the NodeFeature API, to exist (nswait.py): no request, no line
    of its own (the one ERROR line says which is missing), its LabelsPublished condition written when it
    says otherwise (once per record, not per retry), no Event (one cause for every record: its line and
    each condition say it). This version counts as handled: a replay waits as it does."""
    name = record.name
    rec.namespace.absent(name, err)
    rec.ledger.handled[name] = record.rv
    rec.told.failed(name)
    rec.metrics.inc(rec.metrics.reconciles, "error")
    condition = failure_condition(rec.sink.name, err or rec.namespace.cause)
    try:
        after = await rec.status.send(rec.status.record_failure(record, condition))
    except Exception as status_err:
        log.error("could not record the failure in status", extra={"node": name, "error": brief(status_err)})
        return Outcome("error")
    if after is not None:
        rec.ledger.keep(record, after)
    log.debug(
        "devices record waits for the NodeFeature namespace or API",
        extra={"node": name, "written": after is not None},
    )
    return Outcome("error", status_written=after is not None)


def _notice(record: NodeRecord, applied: Applied, outcome: Outcome, domain: str) -> events.Notice | None:
    """The Event of a publish; none for a record's first one (events.py)."""
    first = record.status.labels_published_time is None
    target, links = applied.published.target, record.result.failed_links
    return events.for_changes(target, outcome.changes, domain, links, first=first)


def failure_said(err: BaseException, *, written: bool = False) -> str:
    """The ERROR line of a publish given up on, saying what is true of its labels: `written` when a try's
    sink write succeeded (status.apply's `landed`) and only status writes failed after it, whatever the
    last try's error (a 503 on the last retry of a status write the first answered unreadably); a status
    write whose answer stayed unreadable (StatusUnreadable) always came after the labels were written.
    Whether the status was written is unknown then; anything else left the labels unpublished."""
    if written or isinstance(err, StatusUnreadable):
        return "labels written, status not confirmed"
    return "labels not published"


def failed_before(status: DevicesStatus) -> bool:
    """Whether the record's status holds a publication failure (announced by an ERROR line then)."""
    cond = status.condition(models.LABELS_PUBLISHED)
    return cond is not None and cond.status == "False"


def waits_for_node(status: DevicesStatus) -> bool:
    """Whether the record's status says its Node does not exist (so its labels wait for it)."""
    cond = status.condition(models.LABELS_PUBLISHED)
    return cond is not None and cond.status == "False" and cond.reason == events.NODE_NOT_FOUND


def quiet_first(
    before: NodeRecord, applied: Applied, changes: Sequence[labels.Change], retried: bool
) -> bool:
    """Whether a publication may be counted into the first publications' summary (progress.py) rather
    than told in a line of its own: a record's first one, adding keys only. Not one that follows a line
    naming the node (a retry's WARNING, a failure's ERROR now in its status): whoever read that one reads
    that it was published, not a count that names five nodes. Not a superseded one either: its status
    was not written, so the next version's publication is again a first one, and counting both would
    count one node twice."""
    return (
        before.status.labels_published_time is None
        and all(c.old is None for c in changes)
        and not applied.superseded
        and not retried
        and not failed_before(before.status)
    )


def count_changes(metrics: Metrics, changes: Sequence[labels.Change]) -> None:
    # One increment per kind, not per change: a first publication adds every key (five or more).
    kinds = collections.Counter(c.kind for c in changes)
    for kind, count in kinds.items():
        metrics.inc(metrics.label_changes, kind, amount=count)


def _kept(metrics: Metrics, domain: str, record: NodeRecord, kept: Sequence[str]) -> None:
    """Keys left as published because the enumeration that would say otherwise failed."""
    for key in kept:
        metrics.inc(metrics.removals_skipped, labels.family(key, domain) or "")
    log.warning(
        "enumeration failed, labels kept as published",
        extra={"node": record.name, "keys": ",".join(kept), "failed": ",".join(sorted(record.frozen))},
    )


class Withdrawal:
    """The Node sink's labels withdrawn when a record goes: sent under the node's lock, a transient
    failure retried through the backoffs as a publish is."""

    def __init__(
        self,
        sink: sinks.Sink,
        view: SinkView,
        *,
        ledger: Ledger,
        status: StatusWriter,
        metrics: Metrics,
        backoffs: Sequence[float],
    ) -> None:
        self.sink, self.view, self.ledger, self.status = sink, view, ledger, status
        self.metrics, self.backoffs = metrics, backoffs

    async def __call__(self, name: str) -> Outcome:
        try:
            async with self.ledger.lock(name):
                published = await self._sent(name)
        except Exception as err:
            # Not left to the watch's catch-all (a traceback per event): the view still holds the labels
            # as ours, so the Node's next change brings the withdrawal again (sink_event), and so does
            # the operator's next start (its listing finds labels with no record).
            log.error(
                "labels not withdrawn, tried again on the Node's next change",
                extra={"node": name, "error": brief(err)},
            )
            self.metrics.inc(self.metrics.reconciles, "error")
            return Outcome("error")
        finally:
            self.ledger.drop_lock(name)
        changes = tuple(published.plan.changes) if published else ()
        if published is not None and published.now is not None:
            self.view.observe(published.now)
        count_changes(self.metrics, changes)
        if changes:
            log.info(
                "labels withdrawn with the devices record", extra={"node": name, "removed": len(changes)}
            )
        self.metrics.inc(self.metrics.reconciles, "withdrawn")
        return Outcome("withdrawn", changes)

    async def _sent(self, name: str) -> sinks.Published | None:
        """The withdrawal sent, a transient failure retried after each of the backoffs as a publish is."""
        delays = iter(self.backoffs)
        while True:
            try:
                return await self.status.send(self.sink.withdrawing(name, self.view.get(name)))
            except Exception as err:
                delay = next(delays, None) if transient(err) else None
                if delay is None:
                    raise
                log.warning(
                    "label withdrawal failed, retrying",
                    extra={"node": name, "error": brief(err), "retry_in_s": delay},
                )
                await asyncio.sleep(delay)


class Requeue:
    """Reconciles due again later, at most one pending per node."""

    def __init__(
        self, delay: float, run: Callable[[str], Awaitable[Outcome]], wanted: Callable[[str], bool]
    ) -> None:
        self.delay = delay
        self.run = run  # the reconcile of one node
        self.wanted = wanted  # whether the node is still there to reconcile when the time comes
        self._due: dict[str, asyncio.TimerHandle] = {}
        self._running: set[asyncio.Future[Outcome]] = set()
        self._closed = False

    def add(self, name: str) -> None:
        """Reconcile `name` again after `delay`, once, unless a retry is already due. Not once closed: a
        publish under way as kopf stopped that failed after its cleanup armed a retry whose reconcile
        ran in a task kopf neither waits for nor cancels, its writes sent through the stop (and after
        the lease's release, on a session opened again). Its record is not handled: kopf's next
        listing, when it starts again, reconciles it."""
        if name in self._due or self._closed:
            return
        self._due[name] = asyncio.get_running_loop().call_later(self.delay, self._fire, name)

    def _fire(self, name: str) -> None:
        self._due.pop(name, None)
        if self.wanted(name):
            task = asyncio.ensure_future(self.run(name))
            self._running.add(task)  # held until done: the loop keeps only weak references to tasks
            task.add_done_callback(self._running.discard)

    def close(self) -> None:
        self._closed = True
        for handle in self._due.values():
            handle.cancel()
        self._due.clear()

    def reopen(self) -> None:
        """kopf started again in the same operator (a watched resource's 404: cli._kopf)."""
        self._closed = False
