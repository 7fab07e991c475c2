"""What of the watch streams reaches kopf: echoes of our own writes dropped, Devices events handled by
the operator's own per-record lanes, everything else left to kopf.

kopf hands every event through its per-event machinery (a worker queue, body and patch wrappers, three
loggers, cause detection, handler selection) before a handler sees it: about a millisecond each here,
as much as a do-nothing kopf operator spends on a record. Two kinds of event are answered before it:

- Echoes. A first sync meets three events per record where that operator meets one, two of them the
  echoes of our own writes (the status write on the Devices watch, the sink object we created on its
  watch). An event the reconciler recognises as carrying nothing newer than what it holds (the same test
  the handlers make first) is counted and dropped; DELETED events are never echoes.
- Devices events. Their handler wants only the newest state of each record (the reconcile is
  level-based), so `Lanes` hand them over one record at a time, in order, the newest pending state
  replacing an older one not yet handled; a DELETED event keeps its place. That is what kopf's
  per-object workers did for this resource, without the per-event machinery: with it a first sync cost
  1.7-2.4x the do-nothing operator's CPU, without it 1.4-1.65x (hack/bench_operator.py --versus). An
  event replaced so is counted skipped, as an echo is: every event delivered is handled or counted.

When a watch stream ends (the operator stopping: SIGTERM, a lease lost; a watched CRD gone) the events
waiting in its lanes are dropped, each lane finishing the one in hand (the reconciler waits for a write
in flight even when cancelled: apicall.arun, or inflight.writing for a call in a thread), so nothing is
written for them after the stop; the next listing brings them back. A dropped DELETED event is still
told to the reconciler (nothing written), since no listing has an event for an object that went.

The intake also keeps kopf's watches going where kopf gave up (`_resumed_watch`: an ERROR event other
than 410, a garbled line, a listing refused past kopf's retries ended the whole operator; a 429's
Retry-After held a watch as long as it asked), and hands on the deletions a new listing shows (an
object held that it lacks went while no watch was open: `Lanes.vanished`).

kopf offers no public hook ahead of its processing, so the intake wraps its watch stream
(`infinite_watch`: an event answered on arrival costs kopf no queue and no per-object worker) and its
`process_resource_event` (an echo that arrived before its write's answer was settled waits in the
object's queue behind the handler that wrote, and is recognised there); both are looked up when the
operator starts its watchers. On a kopf without them, every event goes through kopf as before (the
Devices handler is registered with kopf either way), only slower.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import logging
import math
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)

Echo = Callable[[Mapping[str, Any]], bool]  # True: the event was an echo, counted and dropped
Handler = Callable[[Mapping[str, Any]], Awaitable[object]]  # one raw watch event, handled
Key = tuple[str, str]  # (group, plural) of a watched resource
OBJECT_EVENTS = (None, "ADDED", "MODIFIED", "DELETED")  # None: listed (kopf's name for a listing's items)


class Lanes:
    """One lane per object: its events handled one at a time, in the order they came, by `handle`.
    Only the newest state matters to a level-based handler, so an event that finds the newest one still
    pending takes its place; a DELETED event, or one after it, is queued behind (a record deleted and
    created again under its name is withdrawn, then published)."""

    def __init__(
        self,
        handle: Handler,
        what: str,
        forget: Callable[[str], object] = lambda _: None,
        replaced: Callable[[], object] = lambda: None,
        held: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self.handle = handle
        # The objects the handler holds (the records the reconciler keeps): what a new listing must have.
        self.held = held
        self.what = what  # for the log: whose events these are
        # Told of each event replaced by a newer one before it was handled (counted where the events
        # the handler skips are counted: every event delivered is then handled or counted skipped).
        self.replaced = replaced
        # Told of an object whose DELETED event is dropped unhandled: a listing cannot say it went.
        self.forget = forget
        self._pending: dict[str, collections.deque[Mapping[str, Any]]] = {}
        self._running: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references

    def put(self, name: str, event: Mapping[str, Any]) -> None:
        pending = self._pending.get(name)
        if pending is None:
            pending = self._pending[name] = collections.deque((event,))
            task = asyncio.get_running_loop().create_task(
                self._drain(name, pending), name=f"{self.what} {name}"
            )
            self._running.add(task)
            task.add_done_callback(lambda done: self._ended(done, name, pending))
        elif pending and "DELETED" not in (pending[-1].get("type"), event.get("type")):
            pending[-1] = event
            self.replaced()
        else:
            pending.append(event)

    def vanished(self, listed: set[str]) -> int:
        """A new listing is over: each object held, or with events waiting, that it lacks went while no
        watch was open (a deletion no stream delivers) and is handed a DELETED event of its own, after
        what waits for it, as client-go's reflector does on a relist; how many."""
        gone = [
            name
            for name in sorted({*self.held(), *self._pending} - listed)
            if not (self._pending.get(name) and self._pending[name][-1].get("type") == "DELETED")
        ]
        for name in gone:
            log.info("deleted while no watch was open", extra={"resource": self.what, "node": name})
            self.put(name, {"type": "DELETED", "object": {"metadata": {"name": name}}})
        return len(gone)

    def __len__(self) -> int:
        """Objects with events in hand or waiting."""
        return len(self._pending)

    async def _drain(self, name: str, pending: collections.deque[Mapping[str, Any]]) -> None:
        try:
            while pending:
                event = pending.popleft()
                try:
                    await self.handle(event)
                except Exception as err:
                    # kopf logged a failed event handler and went on; so does a lane: the next event of
                    # this object (a relist's, at the latest) is handled as usual.
                    log.error(
                        "watch event not handled",
                        exc_info=err,
                        extra={"resource": self.what, "node": name, "type": event.get("type")},
                    )
        finally:
            # Here, not in _ended: an event put between the last one handled and a done callback would
            # wait in a lane no task drains.
            self._unregister(name, pending)

    def _ended(self, task: asyncio.Task[None], name: str, pending: collections.deque[Any]) -> None:
        self._running.discard(task)
        # A task cancelled before it first ran (the lanes closed, or kopf cancelling every task of its
        # loop at shutdown) never reaches its `finally`: its lane would stay, and take every later event
        # of the object without a task to handle them.
        self._unregister(name, pending)

    def _unregister(self, name: str, pending: collections.deque[Any]) -> None:
        if self._pending.get(name) is pending:
            del self._pending[name]

    def drop(self) -> int:
        """Drop the events not yet handled, leaving each lane to finish the one in hand (the watch
        stopped: a listing brings them back when it starts again); how many were dropped."""
        return sum(self._discard(name, pending) for name, pending in list(self._pending.items()))

    def _discard(self, name: str, pending: collections.deque[Mapping[str, Any]]) -> int:
        """Drop what waits in one lane. A deletion among it is still told (`forget`, nothing written):
        when the watch starts again in this process, its listing has no event for an object that went,
        and what was published for it would stay."""
        dropped = len(pending)
        if any(event.get("type") == "DELETED" for event in pending):
            self.forget(name)
        pending.clear()
        return dropped

    async def close(self) -> None:
        """Stop every lane (the watches stopped): events not yet handled are dropped (see `drop`; the
        next start lists every object again), the ones in hand cancelled (a write in flight is still
        answered first: apicall.arun, inflight.writing)."""
        self.drop()
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


class Intake:
    """Per resource, the reconciler's test for an event that brings nothing new, and the resources whose
    events go to lanes of ours rather than to kopf (see the module's note)."""

    # By the identity of the settings the operator runs with (a dataclass: compared by value, unhashable),
    # each entry dropped when those settings go.
    _installed: dict[int, Intake] = {}

    @classmethod
    def of(cls, settings: object) -> Intake | None:
        return cls._installed.get(id(settings))

    def __init__(
        self,
        echoes: Mapping[Key, Echo],
        lanes: Mapping[Key, Lanes] | None = None,
        relists: Mapping[Key, Lanes] | None = None,
    ) -> None:
        self.echoes = dict(echoes)
        self.lanes = dict(lanes or {})
        # Per resource whose events kopf handles, lanes for the deletions a new listing shows (vanished).
        self.relists = dict(relists or {})

    def echo(self, resource: Any, raw_event: Mapping[str, Any]) -> bool:
        test = self.echoes.get(_key(resource))
        if test is None or raw_event.get("type") == "DELETED":
            return False
        body = raw_event.get("object")
        return isinstance(body, Mapping) and test(body)

    def take(self, resource: Any, raw_event: Mapping[str, Any]) -> bool:
        """Hand an object's event to its lane; False (kopf handles it) for a resource without lanes and
        for anything that is not an object's event with a name."""
        lanes = self.lanes.get(_key(resource))
        if lanes is None or raw_event.get("type") not in OBJECT_EVENTS:
            return False
        body = raw_event.get("object")
        meta = body.get("metadata") if isinstance(body, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            return False
        lanes.put(name, raw_event)
        return True

    def attach(self, settings: Any) -> bool:
        """Filter the events of the operator run with `settings`; False when kopf cannot be hooked."""
        _wrap("kopf._cogs.clients.watching", "continuous_watch", _resumed_watch)
        _wrap("kopf._cogs.clients.errors", "check_response", _bounded_retry_after)
        _wrap("kopf._core.reactor.orchestration", "terminate_redundancies", _retrieved_redundancies)
        if not (
            _wrap("kopf._core.reactor.processing", "process_resource_event", _filtered_processing)
            and _wrap("kopf._cogs.clients.watching", "infinite_watch", _filtered_watch)
        ):
            log.warning("kopf offers no place ahead of its event processing; every event goes through kopf")
            return False
        Intake._installed[id(settings)] = self
        weakref.finalize(settings, Intake._installed.pop, id(settings), None)
        return True

    def relisting(self, resource: Any, event: object, names: set[str] | None) -> set[str] | None:
        """The names of a listing in progress, `names` as far as it went, with `event` added; when the
        event is kopf's mark that the listing is over, its lanes are told what it lacked (vanished)."""
        key = _key(resource)
        lanes = self.lanes[key] if key in self.lanes else self.relists.get(key)
        if lanes is None:
            return None
        if isinstance(event, Mapping):
            if event.get("type") is not None:
                return names
            body = event.get("object")
            meta = body.get("metadata") if isinstance(body, Mapping) else None
            name = meta.get("name") if isinstance(meta, Mapping) else None
            return (names or set()) | ({name} if isinstance(name, str) and name else set())
        if getattr(event, "name", None) == "LISTED":  # kopf's Bookmark.LISTED, even after no object
            lanes.vanished(names or set())
            return None
        return names

    def stopped(self, resource: Any) -> None:
        """The resource's watch ended (the operator stopping, its CRD gone): its events not yet handled
        are dropped, so that nothing is written for them after the stop (kopf lets the tasks it finds
        run five seconds more before it cancels them); the next listing brings them back."""
        lanes = self.lanes.get(_key(resource))
        relisted = self.relists.get(_key(resource))
        if relisted is not None:
            relisted.drop()
        if lanes is None:
            return
        dropped = lanes.drop()
        if dropped:
            log.info("watch stopped, events not handled", extra={"resource": lanes.what, "events": dropped})

    async def close(self) -> None:
        for lanes in [*self.lanes.values(), *self.relists.values()]:
            await lanes.close()


def _key(resource: Any) -> Key:
    return str(getattr(resource, "group", "")), str(getattr(resource, "plural", ""))


def _wrap(module: str, name: str, wrap: Callable[[Any], Any]) -> bool:
    """Put `wrap(original)` in place of kopf's `module.name`, once per process; False when this kopf has
    no such thing (the operator then runs unfiltered)."""
    try:
        found = importlib.import_module(module)
    except ImportError:
        return False
    original = getattr(found, name, None)
    if original is None:
        return False
    if not getattr(original, "nodefabric_intake", False):
        wrapper = wrap(original)
        wrapper.nodefabric_intake = True
        setattr(found, name, wrapper)
    return True


def _filtered_processing(original: Callable[..., Awaitable[str | None]]) -> Callable[..., Any]:
    """The filter ahead of kopf's processing of each resource event: an echo that arrived before the
    write's answer was settled waited in the object's queue behind the handler that made the write, so
    it is recognised here."""

    async def process_resource_event(**kwargs: Any) -> str | None:
        found = Intake.of(kwargs.get("settings"))
        if found is not None and found.echo(kwargs.get("resource"), kwargs.get("raw_event") or {}):
            return None  # nothing patched: kopf's worker waits for the next event of this object
        return await original(**kwargs)

    return process_resource_event


def _filtered_watch(original: Callable[..., AsyncGenerator[Any, None]]) -> Callable[..., Any]:
    """The intake on kopf's watch streams: an echo already recognisable when it arrives (its write's
    answer settled first) is dropped, and an event of a resource with lanes goes to its lane; neither
    costs kopf a queue or a per-object worker. When the stream ends, so do its lanes' waiting events."""

    async def infinite_watch(**kwargs: Any) -> AsyncIterator[Any]:
        found = Intake.of(kwargs.get("settings"))
        resource = kwargs.get("resource")
        stream = original(**kwargs)
        listing: set[str] | None = None  # the names of a listing in progress
        try:
            async with contextlib.aclosing(stream):  # kopf's own clean-up runs when kopf closes ours
                async for event in stream:
                    if found is not None:
                        listing = found.relisting(resource, event, listing)
                    if found is None or not isinstance(event, Mapping):
                        yield event  # kopf's own markers (the listing's end) included
                    elif not (found.echo(resource, event) or found.take(resource, event)):
                        yield event
        finally:
            if found is not None:
                found.stopped(resource)

    return infinite_watch


REWATCH_PAUSE_S = (1.0, 60.0)  # the first pause after a watch ended by an error, and the longest
RETRY_AFTER_MAX_S = 10  # the longest a 429's Retry-After holds one of kopf's requests


def _resumed_watch(original: Callable[..., AsyncGenerator[Any, None]]) -> Callable[..., Any]:
    """kopf's one listing and watch of a resource, ended quietly when it fails: an ERROR event other
    than 410 (a 504 "Too large resource version" from an API server replica whose cache lags, a 500, one
    with no code), a line that is no JSON or no event (a proxy's page), or a listing refused past kopf's
    own retries (a 5xx or a 403 for a minute, the API server unreachable). kopf raised each out of every
    watcher, and the operator ended. kopf then lists and watches again, as after a 410 (client-go's
    reflector does the same), after a pause that doubles while such failures follow one another with
    no event between. A 404 (the resource gone) and a 401 still end kopf: the operator starts it again
    (cli), or kopf logs in again."""
    pauses: dict[Key, float] = {}
    ended = _watch_failures()

    async def continuous_watch(**kwargs: Any) -> AsyncIterator[Any]:
        key = _key(kwargs.get("resource"))
        stream = original(**kwargs)
        try:
            async with contextlib.aclosing(stream):
                async for event in stream:
                    if isinstance(event, Mapping) and event.get("type") is not None:
                        # A watch's event, not the listing's (type None): a stream that lists and
                        # then fails at once every time keeps its pause growing, not relisting each second.
                        pauses.pop(key, None)
                    yield event
        except ended as err:
            if getattr(err, "status", None) in (401, 404):
                raise
            pause = pauses.get(key, REWATCH_PAUSE_S[0])
            pauses[key] = min(pause * 2, REWATCH_PAUSE_S[1])
            log.warning(
                "a watch ended with an error, listing and watching again",
                extra={
                    "resource": ".".join(reversed(key)).strip("."),
                    "error": str(err)[:300] or type(err).__name__,
                    "in_s": pause,
                },
            )
            await asyncio.sleep(pause)

    return continuous_watch


def _watch_failures() -> tuple[type[BaseException], ...]:
    """What a failed listing or watch of kopf's raises: its reading of a line of the wrong shape (an
    ERROR event with no code, an event that is no object; a Retry-After it cannot read), its refusals
    (APIError, the 404 and 401 among them: told apart by status), the connection's errors."""
    ended: list[type[BaseException]] = [ValueError, KeyError, TypeError, AttributeError, ArithmeticError]
    ended += [OSError, TimeoutError]  # aiohttp's connection errors are OSErrors
    for module, name in [
        ("kopf._cogs.clients.watching", "WatchingError"),
        ("kopf._cogs.clients.errors", "APIError"),
        ("aiohttp", "ClientError"),
    ]:
        found = getattr(importlib.import_module(module), name, None)
        if isinstance(found, type) and issubclass(found, BaseException):
            ended.append(found)
    return tuple(ended)


def _retrieved_redundancies(original: Callable[..., Awaitable[None]]) -> Callable[..., Any]:
    """kopf's stop of the watchers its observer found no longer needed (their CRD deleted), with the
    exception of one that had already failed retrieved: a watch's 404 as the CRD went ends the watcher
    before the observer stops it, and kopf, which re-raises a watcher's failure only when it notices it
    first, dropped that task unread; asyncio then logged "Task exception was never retrieved" as an ERROR
    whenever the task was collected. kopf's guard logged the failure as it happened ("Watcher for ... has
    failed"), and the watcher is gone with its resource: nothing is hidden."""

    async def terminate_redundancies(**kwargs: Any) -> None:
        ensemble = kwargs.get("ensemble")
        before = set(ensemble.get_tasks(ensemble.get_keys())) if ensemble is not None else set()
        try:
            await original(**kwargs)
        finally:
            kept = set(ensemble.get_tasks(ensemble.get_keys())) if ensemble is not None else set()
            for task in before - kept:
                if task.done() and not task.cancelled():
                    task.exception()

    return terminate_redundancies


def _bounded_retry_after(original: Callable[..., Awaitable[None]]) -> Callable[..., Any]:
    """kopf's check of an answer, its 429's Retry-After bounded: kopf slept whatever it asked (a day held
    the watch a day), and raised out of the watcher on one it could not read (text, "nan", "inf"). One
    that is no number of seconds is dropped (kopf's own backoff applies); a longer one is cut to
    RETRY_AFTER_MAX_S."""

    async def check_response(response: Any) -> None:
        try:
            await original(response)
        except Exception as err:
            if getattr(err, "status", None) == 429:
                _bound(getattr(err, "headers", None), "Retry-After", str)
                _bound(getattr(err, "details", None), "retryAfterSeconds", int)
            raise

    return check_response


def _bound(found: object, key: str, kind: Callable[[int], object]) -> None:
    if not isinstance(found, dict) or key not in found:
        return
    try:
        seconds = float(found[key])
    except (TypeError, ValueError):
        seconds = math.nan
    if math.isfinite(seconds) and seconds >= 0:
        found[key] = kind(min(int(seconds), RETRY_AFTER_MAX_S))
    else:
        del found[key]
