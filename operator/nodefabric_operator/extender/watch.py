"""Keep the cache current from the API server: list, then watch, in a worker thread per resource.

The kubernetes client is synchronous, so each watch runs in its own thread and hands every event to
the event loop, where the cache is only ever touched by one thread. Each feed records since when it is
broken (a list or watch that failed and has not succeeded again), which `/healthz` reports.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as _watch

from nodefabric_devicemanager import vocabulary
from nodefabric_operator.extender.book import Book
from nodefabric_operator.extender.cache import POD_GROUP_APIS, Cache
from nodefabric_operator.extender.nodes import NodeError

log = logging.getLogger(__name__)

RETRY_S = 5.0
iter_resp_lines: Any = _watch.iter_resp_lines  # untyped in the client
WATCH_TIMEOUT_S = 300
# A watch connection that stays silent past its own server-side timeout is dead (a vanished API server
# or a cut network): the client gives up on it then, so the feed is seen broken instead of hanging.
REQUEST_TIMEOUT = (10, WATCH_TIMEOUT_S + 30)
# Objects per LIST page: one unpaged list of every pod would be decoded whole at once (600 pods with
# 250 KB annotations each: 515 MiB at start and at every relist); a page at a time bounds that.
PAGE = 100
PLACEMENT_GROUPS = (vocabulary.PLACEMENT_GROUP, vocabulary.VERSION, vocabulary.PLACEMENT_GROUP_PLURAL)


@dataclass
class Feed:
    """One watched resource: how to list it, how to name an object, and what to do with each."""

    name: str
    list_call: Callable[..., Any]
    # The full list after a (re)list, all pages held at once; None with key/known/forget below.
    replace: Callable[[list[dict[str, Any]]], None] | None
    apply: Callable[[str, dict[str, Any]], None]  # one watch event (ADDED, MODIFIED, DELETED)
    optional: bool = False  # a CRD that may not be installed (PodGroup, PlacementGroup)
    # Given all three, each page goes to the cache before the next is read, then what the list no
    # longer had is dropped: only one page is ever held.
    key: Callable[[dict[str, Any]], str] | None = None  # an object's identity in the cache
    known: Callable[[], set[str]] | None = None  # the identities the cache holds
    forget: Callable[[str], None] | None = None  # drop one the last list no longer had

    @property
    def streamed(self) -> bool:
        return self.key is not None and self.known is not None and self.forget is not None

    def upsert_page(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self.apply("ADDED", item)

    def prune(self, seen: set[str]) -> None:
        assert self.known is not None and self.forget is not None
        for key in self.known() - seen:
            self.forget(key)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def _namespaced(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _feeds(cache: Cache, book: Book, api: client.ApiClient) -> list[Feed]:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)

    def upsert_node(obj: dict[str, Any]) -> None:
        try:
            cache.upsert_node(obj)
        except NodeError as exc:
            # The API server admitted it, so it is ours to tolerate: keep what was known of the node.
            log.warning("could not read a node, kept what was known of it", extra={"error": str(exc)})

    def apply_node(kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            cache.delete_node(_name(obj))
        elif kind in ("ADDED", "MODIFIED"):
            upsert_node(obj)

    def delete_pod(uid: str) -> None:
        old = cache.pods.get(uid)
        if old is not None and old.group:
            book.release(old.group, uid)  # a pod deleted before it was bound holds no room any more
        gone = cache.delete_pod(uid)
        if gone is not None:
            book.forget(gone)  # the group has no pod left: release its bucket and claims

    def apply_pod(kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            delete_pod(str(obj["metadata"].get("uid")))
        elif kind in ("ADDED", "MODIFIED"):
            cache.upsert_pod(obj)

    feeds = [
        Feed(
            "nodes",
            core.list_node,
            None,
            apply_node,
            key=_name,
            known=lambda: set(cache.nodes),
            forget=cache.delete_node,
        ),
        Feed(
            "pods",
            core.list_pod_for_all_namespaces,
            None,
            apply_pod,
            key=lambda obj: str((obj.get("metadata") or {}).get("uid")),
            known=lambda: set(cache.pods),
            forget=delete_pod,
        ),
    ]
    versions = {"scheduling.x-k8s.io": "v1alpha1", "scheduling.volcano.sh": "v1beta1"}
    for group in POD_GROUP_APIS:

        def apply_group(kind: str, obj: dict[str, Any], g: str = group) -> None:
            meta = obj.get("metadata") or {}
            if kind == "DELETED":
                cache.delete_pod_group(g, str(meta.get("namespace")), str(meta.get("name")))
            elif kind in ("ADDED", "MODIFIED"):
                cache.upsert_pod_group(g, obj)

        def known_groups(g: str = group) -> set[str]:
            return {f"{ns}/{name}" for api, ns, name in cache.pod_group_sizes if api == g}

        def forget_group(key: str, g: str = group) -> None:
            cache.delete_pod_group(g, *key.split("/", 1))

        def list_groups(g: str = group, **kw: Any) -> Any:
            return custom.list_cluster_custom_object(g, versions[g], "podgroups", **kw)

        feeds.append(
            Feed(
                f"{group} podgroups",
                list_groups,
                None,
                apply_group,
                optional=True,
                key=_namespaced,
                known=known_groups,
                forget=forget_group,
            )
        )
    feeds.append(_admission_feed(cache, custom))
    return feeds


def _admission_feed(cache: Cache, custom: client.CustomObjectsApi) -> Feed:
    """PlacementGroups: optional, since without the CRD (no placement process) every group follows the
    extender's own rule."""

    def apply(kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            cache.delete_placement_group(*_namespaced(obj).split("/", 1))
        elif kind in ("ADDED", "MODIFIED"):
            cache.upsert_placement_group(obj)

    def known() -> set[str]:
        return {f"{ns}/{name}" for ns, name in cache.admission_refs()}

    def forget(key: str) -> None:
        cache.delete_placement_group(*key.split("/", 1))

    def list_call(**kw: Any) -> Any:
        return custom.list_cluster_custom_object(*PLACEMENT_GROUPS, **kw)

    return Feed(
        "placementgroups", list_call, None, apply, optional=True, key=_namespaced, known=known, forget=forget
    )


class Watcher:
    def __init__(
        self,
        cache: Cache,
        book: Book | None,
        api: client.ApiClient,
        clock: Callable[[], float] = time.monotonic,
        *,
        feeds: list[Feed] | None = None,
    ) -> None:
        """The extender's feeds (nodes, pods, PodGroups into the cache and `book`), or `feeds` given by
        another process (the placement controller) that watches through the same machinery."""
        self.cache = cache
        if feeds is None:
            assert book is not None, "the extender's feeds need its book"
            feeds = _feeds(cache, book, api)
        self.feeds = feeds
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.clock = clock
        self._listed: set[str] = set()
        self._open: dict[str, Any] = {}  # feed name -> the watch response being read
        # feed name -> since when it is broken; every feed starts broken until its first list.
        self.broken: dict[str, tuple[float, str]] = {f.name: (clock(), "not listed yet") for f in self.feeds}
        self._lock = threading.Lock()  # the watch threads write `broken`, the event loop reads it

    def problems(self, grace: float) -> list[str]:
        """The node and pod feeds broken for longer than `grace` seconds, with their last error (the
        PodGroup feeds only refine group sizes; they never fail health)."""
        now = self.clock()
        required = {f.name for f in self.feeds if not f.optional}
        with self._lock:
            broken = sorted((k, v) for k, v in self.broken.items() if k in required)
        return [
            f"{name} watch broken for {now - since:.0f}s: {error}"
            for name, (since, error) in broken
            if now - since > grace
        ]

    def _ok(self, feed: Feed) -> None:
        with self._lock:
            self.broken.pop(feed.name, None)

    def _failed(self, feed: Feed, error: str) -> None:
        with self._lock:
            since = self.broken.get(feed.name, (self.clock(), ""))[0]
            self.broken[feed.name] = (since, error)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        for feed in self.feeds:
            t = threading.Thread(target=self._run, args=(feed, loop), name=f"watch-{feed.name}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        """Stop every watch; closing the open responses unblocks the threads reading them."""
        self.stop_event.set()
        for resp in list(self._open.values()):
            with contextlib.suppress(Exception):
                resp.shutdown()
        for t in self.threads:
            t.join(timeout=2)

    def _listed_once(self, feed: Feed) -> None:
        self._listed.add(feed.name)
        if all(f.name in self._listed for f in self.feeds):
            self.cache.synced = True

    def _run(self, feed: Feed, loop: asyncio.AbstractEventLoop) -> None:
        while not self.stop_event.is_set():
            try:
                self._list_and_watch(feed, loop)
            except ApiException as exc:
                if exc.status in (403, 404) and feed.optional:
                    # Not served (404), or not ours to read (403): group sizes come from pods instead.
                    log.info("resource not watched", extra={"resource": feed.name, "status": exc.status})
                    self._ok(feed)
                    loop.call_soon_threadsafe(self._listed_once, feed)
                    return
                if exc.status != 410:
                    self._failed(feed, f"HTTP {exc.status} {exc.reason}")
                    log.warning(
                        "watch failed, listing again",
                        extra={"resource": feed.name, "status": exc.status, "error": str(exc.reason)},
                    )
                    self.stop_event.wait(RETRY_S)
            except Exception as exc:
                self._failed(feed, str(exc) or type(exc).__name__)
                log.warning("watch failed, listing again", extra={"resource": feed.name, "error": str(exc)})
                self.stop_event.wait(RETRY_S)

    def _on_loop(self, loop: asyncio.AbstractEventLoop, call: Callable[[], None]) -> bool:
        """Run `call` on the event loop (the only thread that touches the cache) and wait for it, so
        at most one page is held at a time; False when the watcher stops meanwhile."""

        async def run() -> None:
            call()

        done = asyncio.run_coroutine_threadsafe(run(), loop)
        while True:
            try:
                done.result(timeout=1.0)
                return True
            except concurrent.futures.TimeoutError:
                if self.stop_event.is_set():
                    done.cancel()
                    return False

    def _list(self, feed: Feed, loop: asyncio.AbstractEventLoop) -> str | None:
        """Every object, PAGE at a time (limit/continue), each page handed to the cache before the next
        is read, then what the list no longer has is dropped. The list's resourceVersion to watch from;
        None when the watcher stopped. An expired continue token (410) makes the caller list again."""
        seen: set[str] = set()
        held: list[dict[str, Any]] = []  # a feed without key/known/forget: its whole list
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {
                "limit": PAGE,
                "_preload_content": False,
                "_request_timeout": REQUEST_TIMEOUT,
            }
            if token:
                kwargs["_continue"] = token
            data = json.loads(feed.list_call(**kwargs).data)
            items: list[dict[str, Any]] = data.get("items") or []
            if feed.key is not None and feed.streamed:
                seen.update(feed.key(i) for i in items)
                if not self._on_loop(loop, lambda items=items: feed.upsert_page(items)):  # type: ignore[misc]
                    return None
            else:
                held.extend(items)
            meta = data.get("metadata") or {}
            del data, items
            token = meta.get("continue") or None
            if not token:
                if feed.streamed:
                    done = self._on_loop(loop, lambda: feed.prune(seen))
                else:
                    assert feed.replace is not None
                    done = self._on_loop(loop, functools.partial(feed.replace, held))
                if not done:
                    return None
                version = meta.get("resourceVersion")
                return str(version) if version else None

    def _list_and_watch(self, feed: Feed, loop: asyncio.AbstractEventLoop) -> None:
        version = self._list(feed, loop)
        if self.stop_event.is_set():
            return
        loop.call_soon_threadsafe(self._listed_once, feed)
        self._ok(feed)
        while not self.stop_event.is_set():
            kwargs: dict[str, Any] = {
                "watch": True,
                "timeout_seconds": WATCH_TIMEOUT_S,
                "allow_watch_bookmarks": True,
                "_preload_content": False,
                "_request_timeout": REQUEST_TIMEOUT,
            }
            if version:
                kwargs["resource_version"] = version
            # The raw response, not kubernetes.watch.Watch: stop() must be able to close it.
            stream = feed.list_call(**kwargs)
            self._open[feed.name] = stream
            try:
                if self.stop_event.is_set():
                    # stop() ran between this thread's last look and the line above, so it could not
                    # close this response: close it here (its connection too, not back to the pool), or
                    # the server holds the watch open for its whole timeout.
                    with contextlib.suppress(Exception):
                        stream.close()
                    return
                for line in iter_resp_lines(stream):
                    if self.stop_event.is_set():
                        return
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object")
                    if kind == "ERROR" or not isinstance(obj, dict):
                        self._failed(feed, f"watch error: {str(obj)[:200]}")
                        return  # expired or broken: list again
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if kind != "BOOKMARK":
                        loop.call_soon_threadsafe(feed.apply, str(kind), obj)
            finally:
                self._open.pop(feed.name, None)
                stream.release_conn()
