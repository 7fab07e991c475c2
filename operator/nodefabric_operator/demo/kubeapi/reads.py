"""Reads: GET one object, a list (selectors, `limit`/`continue` pages), and a watch (from now with the
current state, or resumed from a resourceVersion; bookmarks, `sendInitialEvents`, Table watches).
Each answers a Table when the client asks for one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import aiohttp.web

from nodefabric_operator.demo.kubeapi import errors
from nodefabric_operator.demo.kubeapi.catalogue import ResourceType
from nodefabric_operator.demo.kubeapi.errors import ApiError
from nodefabric_operator.demo.kubeapi.knobs import Knobs
from nodefabric_operator.demo.kubeapi.responses import respond, table_wanted
from nodefabric_operator.demo.kubeapi.routes import Route, continue_token, read_continue
from nodefabric_operator.demo.kubeapi.selectors import FieldTerm, Requirement, field_selector, label_selector
from nodefabric_operator.demo.kubeapi.state import Objects
from nodefabric_operator.demo.kubeapi.store import Watcher, key_of, meta
from nodefabric_operator.demo.kubeapi.tables import render_table
from nodefabric_operator.demo.kubeapi.watch import WatchStream


class Reads:
    def __init__(self, objects: Objects, knobs: Knobs) -> None:
        self._objects = objects
        self._knobs = knobs

    def get(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        assert route.name is not None
        obj = self._objects.existing(rt, route.namespace, route.name)
        if table_wanted(request):
            table = render_table(
                [obj],
                rt.columns,
                {"resourceVersion": meta(obj).get("resourceVersion", "")},
                include=request.params.get("includeObject", "Metadata"),
            )
            return respond(table)
        return respond(obj)

    def list_objects(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        params = request.params
        labels = label_selector(params)
        fields = field_selector(params, rt.selectable)
        try:
            limit = int(params.get("limit") or 0)
        except ValueError:
            raise errors.bad_request(f"invalid limit: {params['limit']!r}") from None
        rv, after = self._objects.rv, None
        if params.get("continue"):
            rv, after = read_continue(params["continue"])
        found = self._objects.store.select(rt.key, route.namespace, labels, fields, after)
        items: list[dict[str, Any]] = []
        list_meta: dict[str, Any] = {"resourceVersion": str(rv)}
        for obj in found:
            if limit and len(items) == limit:
                list_meta["continue"] = continue_token(rv, key_of(items[-1]))
                if not labels and not fields:
                    list_meta["remainingItemCount"] = 1 + sum(1 for _ in found)
                break
            items.append(obj)
        if table_wanted(request):
            return respond(
                render_table(items, rt.columns, list_meta, include=params.get("includeObject", "Metadata"))
            )
        return respond(
            {"kind": rt.list_kind, "apiVersion": rt.group_version, "metadata": list_meta, "items": items}
        )

    async def watch(self, rt: ResourceType, route: Route, request: Any) -> aiohttp.web.StreamResponse:
        params = request.params
        objects = self._objects
        matches, labels, fields = _matcher(rt, route, request)
        try:
            timeout = int(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        except ValueError:
            raise errors.bad_request(f"invalid timeoutSeconds: {params['timeoutSeconds']!r}") from None
        since = params.get("resourceVersion", "")
        initial = params.get("sendInitialEvents") == "true"
        bookmarks = params.get("allowWatchBookmarks") == "true"
        watcher = Watcher(matches, self._knobs.watch_capacity)
        backlog: list[tuple[str, dict[str, Any]]] = []
        expired: ApiError | None = None
        if since in ("", "0") or initial:
            backlog = [
                ("ADDED", obj) for obj in objects.store.select(rt.key, route.namespace, labels, fields)
            ]
        else:
            try:
                rv = int(since)
            except ValueError:
                raise errors.bad_request(f"invalid resource version: {since!r}") from None
            events = objects.log(rt.key).since(rv)
            if events is None:
                expired = errors.expired(since, objects.log(rt.key).evicted_through)
            else:
                for event in events:
                    watcher.offer(event)
                backlog = [item for item in watcher.queue if item is not None]
                watcher.queue.clear()
        stream = WatchStream(
            rt,
            watcher,
            current_rv=lambda: objects.rv,
            last_rv=objects.rv,
            table=table_wanted(request),
            include=params.get("includeObject", "Metadata"),
            bookmarks=bookmarks,
            bookmark_interval=self._knobs.bookmark_interval,
        )
        hub = objects.hub(rt.key)
        if expired is None:
            hub.watchers.add(watcher)  # no await since the backlog was taken: nothing falls in between
        try:
            return await stream.run(
                request._raw_request,
                backlog,
                expired,
                timeout=timeout,
                initial_bookmark=initial and bookmarks,
            )
        finally:
            hub.watchers.discard(watcher)


def _matcher(
    rt: ResourceType, route: Route, request: Any
) -> tuple[Callable[[Mapping[str, Any]], bool], list[Requirement], list[FieldTerm]]:
    labels = label_selector(request.params)
    fields = field_selector(request.params, rt.selectable)
    if route.name:
        fields.append(FieldTerm("metadata.name", route.name, True))
    namespace = route.namespace

    def matches(obj: Mapping[str, Any]) -> bool:
        m = meta(obj)
        if namespace and m.get("namespace") != namespace:
            return False
        if labels and not all(r.matches(m.get("labels") or {}) for r in labels):
            return False
        return all(t.matches(obj) for t in fields)

    return matches, labels, fields
