"""The requests of a publish, described once and sent by either client.

A sink's publish and the status write are generators (`Calls`): each yields a `Request` and is sent the
answer's bytes, or has the refusal (ApiException, a connection error) thrown in where it yielded, so
their 404/409/422 handling reads as straight-line code. Two drivers send them: `run` through the
kubernetes ApiClient in the calling thread (the CLIs, tests, any caller without an event loop) and
`arun` on the event loop through `aioclient.AsyncClient`, the operator's way: a request through
urllib3 in a worker thread cost 0.39 ms of CPU in a first sync (thread hand-offs included), the same
request on the loop 0.24 ms, and a first sync is two of them per record.

Stopping: kopf cancels the reconciles when the operator stops, and five seconds later every task of
the loop it did not start. `arun` lets a request already sent get its answer (the cancel waits for it)
and sends nothing after: no write lands once the lease may have passed to a standby, and none is cut
off half-sent (inflight.py's promise, kept without the thread). The request runs as a `Landing` task,
which refuses to be cancelled by another task: kopf's sweep would otherwise cut it wherever it is (its
stop then waits for the task, which the client's timeouts bound). A Landing ends with the request's
answer or its refusal as its result, never raised (`outcome`): kopf, once its watches stopped, waits for
every task of its loop and re-raises the first failure it finds among them, so a write refused as kopf
stopped (a 409 while NodeFeature writes conflict) ended kopf.operator with that refusal in place of a
404's restart, or a plain stop with a traceback. The refusal is its caller's: `arun` throws it into the
calls (a 409 is read back and retried: sinks._written).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import kubernetes

from nodefabric_operator import rawcall, wire
from nodefabric_operator.inflight import settled
from nodefabric_operator.metrics import Metrics

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Request:
    verb: str  # the request metric's labels
    resource: str
    method: str
    path: str  # with `{name}` placeholders filled from params, quoted
    params: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    content_type: str = rawcall.JSON
    query: Sequence[tuple[str, str | int]] = ()

    @property
    def resendable(self) -> bool:
        """Whether it may be sent once more after its connection closed with no answer (wire.py)."""
        return wire.resendable(self.method, self.body, self.content_type)

    def prepared(self, api: kubernetes.client.ApiClient) -> tuple[str, dict[str, str], bytes | None]:
        """Its URL, headers (no credential) and body, as either client sends them (rawcall.prepared)."""
        return rawcall.prepared(
            api,
            self.method,
            self.path,
            self.params,
            self.body,
            content_type=self.content_type,
            query=self.query,
        )


Calls = Generator[Request, bytes, T]


class Sends(Protocol):
    # Taken before a request is sent (the pool's connections): waiting for one sends nothing yet, so
    # a stop cancels that wait, where it waits for a request already sent.
    slots: asyncio.Semaphore

    async def send(self, request: Request) -> bytes: ...


class Landing(asyncio.Task[bytes | Exception]):
    """A request on its way: answered or refused (`arun` sends it as `outcome`: its refusal returned,
    see the module's note), never cut off by another task's cancel (kopf's sweep, a lane stopped). Its
    own timeouts still end it: asyncio's and aiohttp's cancel the task from a loop callback or from the
    task itself, which is let through, as is asyncio.run's last sweep once the loop stopped."""

    # Set when its caller was cancelled (the operator stopping): the request is waited for, but not
    # sent again after it (a connection closed with no answer, a 401), a write made after the stop.
    stopping = False

    def cancel(self, msg: Any = None) -> bool:
        # The loop's current task, not the running loop's: asyncio.run cancels what is left after the
        # loop stopped, where asyncio.current_task() raises (RuntimeError in place of the real failure).
        if asyncio.current_task(self.get_loop()) not in (None, self):
            return False
        return super().cancel(msg)


async def outcome(sending: Awaitable[bytes]) -> bytes | Exception:
    """The answer, or the refusal returned rather than raised: the task sending it then never ends failed
    for kopf to re-raise (see the module's note)."""
    try:
        return await sending
    except Exception as err:
        return err


def stopping() -> bool:
    """Whether the request this task sends (a Landing) is to be sent no more than it was (see Landing)."""
    task = asyncio.current_task()
    return isinstance(task, Landing) and task.stopping


class Stopped(Exception):
    """`run` was told to stop (the operator stopping, its caller cancelled) before a request it would
    have sent: nothing was sent after the request in flight."""


def run(
    calls: Calls[T],
    api: kubernetes.client.ApiClient,
    metrics: Metrics,
    stopping: threading.Event | None = None,
) -> T:
    """`calls` to their end, each request sent through `api` in this thread; Stopped, with nothing more
    sent, once `stopping` is set (the caller on the loop was cancelled and waits for this thread)."""
    try:
        request = next(calls)
        while True:
            _stop_if(stopping, calls)
            metrics.requested(request.verb, request.resource)
            try:
                answer = rawcall.send_prepared(
                    api, request.method, *request.prepared(api), resend=request.resendable, stopping=stopping
                )
            except Exception as err:
                _stop_if(stopping, calls)
                request = calls.throw(err)
            else:
                _stop_if(stopping, calls)
                request = calls.send(answer)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _stop_if(stopping: threading.Event | None, calls: Calls[Any]) -> None:
    # Checked before the calls go on, as arun does at a cancel: a thread outlives the cancel of the task
    # that started it, and a publish is several requests (a 409's read-back and second patch, then the
    # status write), none of which may be sent once the operator stops and gives its lease up.
    if stopping is not None and stopping.is_set():
        calls.close()
        raise Stopped("stopped: nothing more sent")


async def arun(calls: Calls[T], client: Sends, metrics: Metrics) -> T:
    """`calls` to their end, each request sent by `client` on this loop. Cancelled meanwhile: the
    request in flight is answered first, then the cancel raised and nothing more sent."""
    try:
        request = next(calls)
        while True:
            try:
                await client.slots.acquire()  # a cancel here: nothing sent, nothing to wait for
            except asyncio.CancelledError:
                calls.close()
                raise
            try:
                metrics.requested(request.verb, request.resource)
                sent = Landing(outcome(client.send(request)))
                try:
                    answer = await asyncio.shield(sent)
                except asyncio.CancelledError:
                    sent.stopping = True
                    await settled(sent)  # through any further cancel too (see settled)
                    calls.close()
                    raise
            finally:
                client.slots.release()
            request = calls.throw(answer) if isinstance(answer, Exception) else calls.send(answer)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
