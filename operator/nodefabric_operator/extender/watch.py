"""Keep the cache current from the API server: list, then watch, in a worker thread per resource.

The kubernetes client is synchronous, so each watch runs in its own thread and hands every event to
the event loop, where the cache is only ever touched by one thread. Each feed records since when it is
broken (a list or watch that failed and has not succeeded again), which `/healthz` reports.
"""

from __future__ import annotations

import asyncio
import contextlib
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


@dataclass
class Feed:
    """One watched resource: how to list it and what to do with what comes back."""

    name: str
    list_call: Callable[..., Any]
    replace: Callable[[list[dict[str, Any]]], None]  # the full list after a (re)list
    apply: Callable[[str, dict[str, Any]], None]  # one watch event
    optional: bool = False  # a CRD that may not be installed (PodGroup)


def _feeds(cache: Cache, book: Book, api: client.ApiClient) -> list[Feed]:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)

    def upsert_node(obj: dict[str, Any]) -> None:
        try:
            cache.upsert_node(obj)
        except NodeError as exc:
            # The API server admitted it, so it is ours to tolerate: keep what was known of the node.
            log.warning("could not read a node, kept what was known of it", extra={"error": str(exc)})

    def replace_nodes(items: list[dict[str, Any]]) -> None:
        keep = {str((i.get("metadata") or {}).get("name")) for i in items}
        for name in set(cache.nodes) - keep:
            cache.delete_node(name)
        for item in items:
            upsert_node(item)

    def apply_node(kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            cache.delete_node(str(obj["metadata"]["name"]))
        elif kind in ("ADDED", "MODIFIED"):
            upsert_node(obj)

    def replace_pods(items: list[dict[str, Any]]) -> None:
        keep = {str(i["metadata"].get("uid")) for i in items}
        for uid in set(cache.pods) - keep:
            _delete_pod(uid)
        for item in items:
            cache.upsert_pod(item)

    def _delete_pod(uid: str) -> None:
        old = cache.pods.get(uid)
        if old is not None and old.group:
            book.release(old.group, uid)  # a pod deleted before it was bound holds no room any more
        gone = cache.delete_pod(uid)
        if gone is not None:
            book.forget(gone)  # the group has no pod left: release its bucket and claims

    def apply_pod(kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            _delete_pod(str(obj["metadata"].get("uid")))
        elif kind in ("ADDED", "MODIFIED"):
            cache.upsert_pod(obj)

    feeds = [
        Feed("nodes", core.list_node, replace_nodes, apply_node),
        Feed("pods", core.list_pod_for_all_namespaces, replace_pods, apply_pod),
    ]
    versions = {"scheduling.x-k8s.io": "v1alpha1", "scheduling.volcano.sh": "v1beta1"}
    for group in POD_GROUP_APIS:

        def replace_groups(items: list[dict[str, Any]], g: str = group) -> None:
            for key in [k for k in cache.pod_group_sizes if k[0] == g]:
                cache.delete_pod_group(*key)
            for item in items:
                cache.upsert_pod_group(g, item)

        def apply_group(kind: str, obj: dict[str, Any], g: str = group) -> None:
            meta = obj.get("metadata") or {}
            if kind == "DELETED":
                cache.delete_pod_group(g, str(meta.get("namespace")), str(meta.get("name")))
            elif kind in ("ADDED", "MODIFIED"):
                cache.upsert_pod_group(g, obj)

        def list_groups(g: str = group, **kw: Any) -> Any:
            return custom.list_cluster_custom_object(g, versions[g], "podgroups", **kw)

        feeds.append(Feed(f"{group} podgroups", list_groups, replace_groups, apply_group, optional=True))
    return feeds


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

    def _list_and_watch(self, feed: Feed, loop: asyncio.AbstractEventLoop) -> None:
        resp = feed.list_call(_preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        data = json.loads(resp.data)
        items = data.get("items") or []
        version = (data.get("metadata") or {}).get("resourceVersion")
        loop.call_soon_threadsafe(feed.replace, items)
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
