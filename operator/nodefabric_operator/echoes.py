"""Which sink object events bring nothing new, so that neither kopf (intake.py) nor the
reconcile spends anything on them: the echo of our own sink write, a replay after a relist, and on a
restart kopf's listing of what the start read.

An event at or below the version the view holds was planned against when that version was observed (our
write made it, or the record's reconcile or a drift check read it), and a record listed later plans
against it, so the drift check sink_event would make finds nothing. For a sink that withdraws labels
itself (the Node's), an object whose record is not held still goes to sink_event, which may withdraw
them. The create's echo often arrives before the create's answer reaches the view: an event met while
its node's publish is in flight is held back (the newest one per node) and judged when the publish
ends, so an edit by someone else at that moment is still handed to sink_event and repaired.
Only the operator's event loop touches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Container, Iterator, Mapping
from typing import Any

from nodefabric_operator import sinks
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.view import SinkView, at_or_below, part, version

log = logging.getLogger(__name__)


class SinkEchoes:
    def __init__(
        self,
        sink: sinks.Sink,
        view: SinkView,
        records: Container[str],
        metrics: Metrics,
        late: Callable[[Mapping[str, Any]], Awaitable[object]],
    ) -> None:
        self.sink = sink
        self.view = view
        self.records = records  # the nodes whose record is held
        self.metrics = metrics
        self.late = late  # sink_event, for an event held back that turned out to be new
        self.in_flight: dict[str, int] = {}  # node -> reconciles in flight (each may write its object)
        self.held_back: dict[str, Mapping[str, Any]] = {}  # node -> the newest event met meanwhile
        self.running: set[asyncio.Future[object]] = set()  # late handlings (the loop holds tasks weakly)
        self.closed = False  # kopf stopping (its cleanup): nothing held back is handed over any more

    def echo(self, body: Mapping[str, Any]) -> bool:
        """True when the event brings nothing new (counted as skipped) or is held back until its node's
        publish ends; False: it goes to sink_event."""
        meta = part(body, "metadata")
        name, rv = meta.get("name"), version(body)
        if not isinstance(name, str) or rv is None:
            return False
        if name not in self.records and self.sink.withdraws:
            return False  # sink_event may withdraw labels whose record is gone
        if isinstance(self.sink, sinks.NodeFeatureSink) and meta.get("namespace") != self.sink.namespace:
            return False
        if name in self.in_flight:
            waiting = self.held_back.get(name)
            if waiting is None or not at_or_below(rv, version(waiting)):
                self.held_back[name] = body
            return True
        held = self.view.get(name)
        if held is None or held.rv is None or not at_or_below(rv, held.rv):
            return False
        self.metrics.inc(self.metrics.skipped, self.sink.name)
        return True

    @contextlib.contextmanager
    def publishing(self, name: str) -> Iterator[None]:
        """While a reconcile of `name` runs (it may write the node's sink object). A reconcile cancelled
        (the operator stopping) drops what it held back: the next listing judges it; handed over as the
        publish ends, it would be handled (a repair written) after the stop, in a task kopf no longer
        cancels."""
        self.begin(name)
        try:
            yield
        except asyncio.CancelledError:
            self.held_back.pop(name, None)
            raise
        finally:
            self.end(name)

    def begin(self, name: str) -> None:
        """A reconcile of `name` starts: it may write the node's sink object."""
        self.in_flight[name] = self.in_flight.get(name, 0) + 1

    def end(self, name: str) -> None:
        """A reconcile of `name` ended. When it was the last one under way, an event held back meanwhile
        is judged against the view as the publish left it: dropped, or handed to sink_event."""
        left = self.in_flight.pop(name, 1) - 1
        if left > 0:
            self.in_flight[name] = left
            return
        body = self.held_back.pop(name, None)
        if body is None or self.closed or self.echo(body):
            return
        task = asyncio.ensure_future(self.late(body))
        self.running.add(task)
        task.add_done_callback(self._done)

    def close(self) -> None:
        """kopf is stopping (its cleanup ran): a publish that ends from now on, not cancelled (answered
        within kopf's five seconds), drops what it held back, as a cancelled one does (`publishing`):
        handed over, it was judged (a repair written) in a task made after those kopf waits for and
        cancels, through the stop and the lease's release. The next listing brings it back."""
        self.closed = True

    def reopen(self) -> None:
        """kopf started again in the same operator (a watched resource's 404: cli._kopf)."""
        self.closed = False

    def _done(self, task: asyncio.Future[object]) -> None:
        self.running.discard(task)
        err = None if task.cancelled() else task.exception()
        if err is not None:
            log.error("sink object event failed", extra={"error": f"{type(err).__name__}: {err}"[:200]})
