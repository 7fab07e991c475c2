"""The Event recorder against the embedded API over real HTTP. It posts through the ApiClient's own
serializer (not CoreV1Api), so what the generated calls did for it is checked here: the body as sent,
an answer outside 2xx taken as the failure it is (a 404 on a count posts anew), and a failure of any
kind counted, never raised."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from test_operator_wire import Conn, Served, answered, api_at, closes_the_kept_alive_one, raw_server

from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator import events
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.recorder import NAMESPACE, Recorder

EVENTS = "v1/events"
INVOLVED = {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "Devices", "name": "n1", "uid": "u-1"}
NOTICE = events.Notice(events.WARNING, events.CAPABILITY_LOST, "NodeFeature ns/n1: rdma.capable removed")


def actions(metrics: Metrics) -> dict[str, float]:
    names = ("created", "counted", "dropped", "failed")
    return {a: metrics.events.labels(action=a)._value.get() for a in names}


def holding(
    posts: list[str], hold: threading.Event, started: threading.Event | None = None
) -> Callable[[Conn, Served], None]:
    """A server that notes each request's line in `posts` (and sets `started`), then holds its answer (an
    Event created) until `hold` is set."""

    def held(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            posts.append(head.split(b"\r\n")[0].decode())  # one append: atomic across the server's threads
            if started is not None:
                started.set()
            hold.wait(10)
            conn.answer(b'{"metadata":{"name":"n0-abcde"}}', status="201 Created")

    return held


def postings(rec: Recorder, count: int, objects: int | None = None) -> list[asyncio.Future[None]]:
    """`count` postings of NOTICE, each about an object of its own (or about `objects` objects in turn)."""
    kinds = objects or count
    about = [{**INVOLVED, "name": f"n{i % kinds}", "uid": f"u-{i % kinds}"} for i in range(count)]
    return [asyncio.ensure_future(rec.posting(involved, NOTICE)) for involved in about]


def _call(k: RunningAPI, method: str, path: str) -> Any:
    request = urllib.request.Request(f"{k.url}/api/v1/namespaces/{NAMESPACE}/events{path}", method=method)
    with urllib.request.urlopen(request) as r:
        return json.loads(r.read())


async def listed(k: RunningAPI) -> list[dict[str, Any]]:
    return list((await asyncio.to_thread(_call, k, "GET", ""))["items"])


async def test_an_event_is_posted_then_counted_and_posted_again_once_it_is_gone():
    async with running_api() as k:
        metrics = Metrics()
        rec = Recorder(load_client(k.kubeconfig), "pod-1", metrics)
        await asyncio.to_thread(rec.post, INVOLVED, NOTICE)
        [event] = await listed(k)
        assert event["involvedObject"] == INVOLVED  # no namespace: what `kubectl describe` searches for
        assert (event["type"], event["reason"], event["message"]) == (
            NOTICE.type,
            NOTICE.reason,
            NOTICE.message,
        )
        assert (event["reportingComponent"], event["reportingInstance"]) == (events.COMPONENT, "pod-1")
        assert event["count"] == 1 and event["metadata"]["name"].startswith("n1-")
        # The same Event again raises its count (a merge patch of the Event the answer named).
        await asyncio.to_thread(rec.post, INVOLVED, NOTICE)
        assert [e["count"] for e in await listed(k)] == [2]
        # Deleted meanwhile (expired): the count meets a 404, and a new Event is posted.
        await asyncio.to_thread(_call, k, "DELETE", f"/{event['metadata']['name']}")
        await asyncio.to_thread(rec.post, INVOLVED, NOTICE)
        [again] = await listed(k)
        assert again["count"] == 1 and again["metadata"]["name"] != event["metadata"]["name"]
        assert k.count("POST", EVENTS) == 2 and k.count("PATCH", EVENTS) == 2
        assert actions(metrics) == {"created": 2, "counted": 1, "dropped": 0, "failed": 0}
        gone = Recorder(load_client(k.kubeconfig), "pod-1", metrics)
    # The API is gone: a connection error, counted as a failure, nothing raised.
    await asyncio.to_thread(gone.post, INVOLVED, NOTICE)
    assert actions(metrics)["failed"] == 1


async def test_event_posts_queued_at_a_stop_are_dropped_and_the_one_in_flight_finishes(caplog):
    """Every worker thread busy (one here) with a post the API holds, three more posts queued behind it:
    the stop cancels all four. The queued ones end at once and are never sent (the lease may be a
    standby's by then), said in one WARNING with how many; the one in flight is answered first (the
    cancel waits for it) and counted as created."""
    hold, posts = threading.Event(), []
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
    with raw_server(holding(posts, hold)) as served:
        metrics = Metrics()
        rec = Recorder(api_at(served.url), "pod-1", metrics)
        tasks = postings(rec, 4)
        for _ in range(200):
            if posts:
                break
            await asyncio.sleep(0.02)
        with caplog.at_level(logging.WARNING, logger="nodefabric_operator.inflight"):
            for task in tasks:
                task.cancel()
            await asyncio.sleep(0.3)
            assert [t.done() for t in tasks] == [False, True, True, True]  # the first still in flight
            hold.set()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            await loop.shutdown_default_executor()  # every thread's work done: nothing left to send
        assert all(isinstance(o, asyncio.CancelledError) for o in outcomes)
        assert posts == [f"POST /api/v1/namespaces/{NAMESPACE}/events HTTP/1.1"]
        # The three dropped are counted so: the metric says what the WARNING says.
        assert actions(metrics) == {"created": 1, "counted": 0, "dropped": 3, "failed": 0}
        said = [r for r in caplog.records if r.name == "nodefabric_operator.inflight"]
        assert [(r.getMessage(), r.call, r.dropped) for r in said] == [  # type: ignore[attr-defined]
            ("calls queued for a worker thread were dropped at the stop, never sent", "Recorder.post", 3)
        ]


async def test_a_post_cancelled_after_it_started_is_waited_for_not_dropped():
    """The race's other side: a post its thread has started is in flight, whatever the cancel says."""
    started, hold, posts = threading.Event(), threading.Event(), []
    with raw_server(holding(posts, hold, started)) as served:
        metrics = Metrics()
        rec = Recorder(api_at(served.url), "pod-1", metrics)
        task = asyncio.ensure_future(rec.posting(INVOLVED, NOTICE))
        assert await asyncio.to_thread(started.wait, 10)
        task.cancel()
        await asyncio.sleep(0.2)
        assert not task.done()
        hold.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(posts) == 1 and actions(metrics) == {"created": 1, "counted": 0, "dropped": 0, "failed": 0}


def _refreshing(api: Any) -> list[int]:
    """A credential with a refresh hook (an exec plugin's): the calls of the hook, counted."""
    refreshed: list[int] = []
    api.configuration.api_key = {"authorization": "Bearer t"}
    api.configuration.refresh_api_key_hook = lambda config: refreshed.append(1)
    return refreshed


@pytest.mark.parametrize("first", ["a post", "a count"])
async def test_an_event_in_flight_at_a_stop_answered_401_is_not_sent_again(first: str):
    """The stop comes while an Event's post (or count: a merge patch) is in flight; the API then answers
    401, which would refresh the credential and send it once more (rawcall.send_prepared): a write after
    the stop, perhaps once the lease is a standby's. The recorder's send is given the stop, as the
    publishes' is: the request is sent once, nothing more goes out, and it is counted dropped (by the
    stop, as a queued post is), not failed (a failed post is an API problem to look into)."""
    got, go, requests = threading.Event(), threading.Event(), []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            requests.append(head.split(b"\r\n")[0].decode())
            if len(requests) == 1 and first == "a count":
                conn.answer(b'{"metadata":{"name":"n1-abcde"}}', status="201 Created")
                continue
            got.set()
            go.wait(10)
            conn.answer(b'{"kind":"Status","code":401}', status="401 Unauthorized")

    with raw_server(handle) as served:
        metrics = Metrics()
        api = api_at(served.url)
        refreshed = _refreshing(api)
        rec = Recorder(api, "pod-1", metrics)
        if first == "a count":
            await rec.posting(INVOLVED, NOTICE)  # posted: the same notice next is a count
        task = asyncio.ensure_future(rec.posting(INVOLVED, NOTICE))
        assert await asyncio.to_thread(got.wait, 10)
        task.cancel()  # the stop
        await asyncio.sleep(0.1)
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)  # a second send would have come by now
        sent = "PATCH" if first == "a count" else "POST"
        assert [r.split()[0] for r in requests][-1:] == [sent] and len(requests) == (
            2 if first == "a count" else 1
        )
        assert actions(metrics)["dropped"] == 1 and actions(metrics)["failed"] == 0 and not refreshed[1:]


async def test_an_event_refused_401_is_refreshed_and_sent_again_when_not_stopping():
    """The other side: with no stop, a 401 refreshes the credential and the post goes once more."""
    requests = []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            requests.append(head)
            if len(requests) == 1:
                conn.answer(b'{"kind":"Status","code":401}', status="401 Unauthorized")
                continue
            conn.answer(b'{"metadata":{"name":"n1-abcde"}}', status="201 Created")

    with raw_server(handle) as served:
        metrics = Metrics()
        api = api_at(served.url)
        _refreshing(api)
        rec = Recorder(api, "pod-1", metrics)
        await rec.posting(INVOLVED, NOTICE)
        assert len(requests) == 2
        assert actions(metrics) == {"created": 1, "counted": 0, "dropped": 0, "failed": 0}


async def test_a_count_that_meets_a_404_at_a_stop_posts_no_new_event():
    """The stop comes while an Event's count is in flight, and the Event is gone (404): with no stop the
    recorder posts a new Event; at a stop that would be a write after it. Nothing more is sent; the
    notice is counted dropped (never posted)."""
    got, go, requests = threading.Event(), threading.Event(), []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            requests.append(head.split(b"\r\n")[0].decode())
            if len(requests) == 1:
                conn.answer(b'{"metadata":{"name":"n1-abcde"}}', status="201 Created")
                continue
            got.set()
            go.wait(10)
            conn.answer(b'{"kind":"Status","code":404}', status="404 Not Found")

    with raw_server(handle) as served:
        metrics = Metrics()
        rec = Recorder(api_at(served.url), "pod-1", metrics)
        await rec.posting(INVOLVED, NOTICE)
        task = asyncio.ensure_future(rec.posting(INVOLVED, NOTICE))
        assert await asyncio.to_thread(got.wait, 10)
        task.cancel()
        await asyncio.sleep(0.1)
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)
        assert [r.split()[0] for r in requests] == ["POST", "PATCH"]
        assert actions(metrics) == {"created": 1, "counted": 0, "dropped": 1, "failed": 0}


async def test_an_event_post_the_server_may_have_read_is_not_posted_twice(caplog):
    """The API closes a kept-alive connection as the second Event's post arrives, answering nothing: the
    post may have been read (an Event created), so it is not sent again (a generated name: a second post
    would make a second Event); logged and counted as a failed post, sent once."""
    with raw_server(closes_the_kept_alive_one) as served:
        metrics = Metrics()
        rec = Recorder(api_at(served.url), "pod-1", metrics)
        with caplog.at_level(logging.WARNING, logger="nodefabric_operator.recorder"):
            await asyncio.to_thread(rec.post, INVOLVED, NOTICE)
            await asyncio.to_thread(rec.post, {**INVOLVED, "name": "n2", "uid": "u-2"}, NOTICE)
        assert actions(metrics) == {"created": 1, "counted": 0, "dropped": 0, "failed": 1}
        assert [len(c.requests) for c in served.conns] == [2]
        assert [r.getMessage() for r in caplog.records] == ["could not post event"]


async def test_event_posts_queued_at_a_stop_with_many_workers_are_dropped_and_said_once(caplog):
    """Four worker threads each with a post the API holds, sixteen more queued behind them, all cancelled
    at once by the stop: the four in flight are answered first, the sixteen never start nor are sent,
    and one WARNING says sixteen were dropped; none of them is sent after the stop."""
    hold, posts = threading.Event(), []
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=4))
    with raw_server(holding(posts, hold)) as served:
        metrics = Metrics()
        rec = Recorder(api_at(served.url), "pod-1", metrics)
        tasks = postings(rec, 20)
        for _ in range(250):
            if len(posts) == 4:
                break
            await asyncio.sleep(0.02)
        with caplog.at_level(logging.WARNING, logger="nodefabric_operator.inflight"):
            for task in tasks:
                task.cancel()
            await asyncio.sleep(0.3)
            assert sum(not t.done() for t in tasks) == 4  # the four in flight
            hold.set()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            await loop.shutdown_default_executor()
        assert all(isinstance(o, asyncio.CancelledError) for o in outcomes)
        assert len(posts) == 4
        assert actions(metrics) == {"created": 4, "counted": 0, "dropped": 16, "failed": 0}
        said = [r for r in caplog.records if r.name == "nodefabric_operator.inflight"]
        assert [(r.call, r.dropped) for r in said] == [("Recorder.post", 16)]  # type: ignore[attr-defined]


DEEP = b"[" * 100_000 + b"]" * 100_000  # brackets nested past the JSON decoder's depth


@pytest.mark.parametrize("answer", [b"[]", DEEP], ids=["a list", "nested too deep"])
async def test_an_event_created_with_an_answer_that_names_nothing_is_posted_anew_next_time(answer):
    """The create is answered 200 with no object (a list; brackets nested past the decoder's depth, whose
    RecursionError no caller would handle): the post is counted created, nothing is raised, and with no
    name to count on, the same notice is posted anew rather than patched into an unknown Event."""
    async with running_api() as k:
        metrics = Metrics()
        k.api[lambda req: req.method == "POST" and "/events" in str(req.url)][:1] << answer
        rec = Recorder(load_client(k.kubeconfig), "pod-1", metrics)
        await asyncio.to_thread(rec.post, INVOLVED, NOTICE)
        await asyncio.to_thread(rec.post, INVOLVED, NOTICE)
        [event] = await listed(k)  # the first create was answered by the stand-in, the second stored
        assert event["count"] == 1
        assert k.count("PATCH", EVENTS) == 0
        assert actions(metrics) == {"created": 2, "counted": 0, "dropped": 0, "failed": 0}


async def test_a_stop_that_comes_while_the_credential_is_refreshed_sends_nothing_more():
    """The post is refused 401 and the refresh hook runs (an exec plugin's takes a while); the stop comes
    meanwhile: the refreshed credential is not used, the post is not sent again."""
    in_hook, go, requests = threading.Event(), threading.Event(), []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            requests.append(head)
            conn.answer(b'{"kind":"Status","code":401}', status="401 Unauthorized")

    with raw_server(handle) as served:
        metrics = Metrics()
        api = api_at(served.url)
        api.configuration.api_key = {"authorization": "Bearer t"}
        calls: list[int] = []

        def hook(config: Any) -> None:
            calls.append(1)
            if len(calls) == 2:  # the refresh the 401 asks for
                in_hook.set()
                go.wait(10)

        api.configuration.refresh_api_key_hook = hook
        rec = Recorder(api, "pod-1", metrics)
        task = asyncio.ensure_future(rec.posting(INVOLVED, NOTICE))
        assert await asyncio.to_thread(in_hook.wait, 10)
        task.cancel()  # the stop, while the hook runs
        await asyncio.sleep(0.1)
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)
        assert len(requests) == 1 and len(calls) == 2
        assert actions(metrics)["dropped"] == 1 and actions(metrics)["failed"] == 0


async def test_a_post_whose_thread_starts_after_the_stop_sends_nothing():
    """Its thread took it as the stop came: nothing is sent, and it is counted dropped."""
    with raw_server(answered) as served:
        metrics = Metrics()
        stopping = threading.Event()
        stopping.set()
        rec = Recorder(api_at(served.url), "pod-1", metrics)
        await asyncio.to_thread(rec.post, INVOLVED, NOTICE, "PublishLabels", stopping)
        assert served.conns == []
        assert actions(metrics) == {"created": 0, "counted": 0, "dropped": 1, "failed": 0}


async def test_many_posts_raced_by_a_stop_each_end_in_one_action_and_nothing_is_sent_after():
    """Two hundred posts about eight objects (so creates, counts, counts meeting a 404 and posted anew,
    401s refreshed and sent again), cancelled at a moment of the stream the tasks are in: every posting
    ends as asyncio does (None, or CancelledError), each is counted in exactly one action, and no
    request reaches the server once every cancelled posting has returned."""
    lock, seen, done = threading.Lock(), [], threading.Event()
    late: list[str] = []

    def serve(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            line = head.split(b"\r\n")[0].decode()
            with lock:
                seen.append(line)
                number = len(seen)
                if done.is_set():
                    late.append(line)
            if number % 7 == 0:
                conn.answer(b'{"kind":"Status","code":401}', status="401 Unauthorized")
            elif line.startswith("PATCH") and number % 3 == 0:
                conn.answer(b'{"kind":"Status","code":404}', status="404 Not Found")
            else:
                conn.answer(b'{"metadata":{"name":"e-%d"}}' % number, status="201 Created")

    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=6))
    with raw_server(serve) as served:
        api = api_at(served.url)
        api.configuration.refresh_api_key_hook = lambda config: None
        metrics = Metrics()
        rec = Recorder(api, "pod-1", metrics)
        tasks = postings(rec, 200, objects=8)
        await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        done.set()
        await asyncio.sleep(0.2)
        await loop.shutdown_default_executor()
    assert all(o is None or isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
    assert sum(actions(metrics).values()) == len(tasks), actions(metrics)
    assert late == []
