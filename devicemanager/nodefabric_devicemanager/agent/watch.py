"""A watch of the agent's own Devices object, so the agent never GETs it to learn whether it changed.

The agent keeps the object as it last wrote or saw it. Someone else's write (the operator's status, a
hand edit, a delete) arrives here as an event; the agent then decides again against it, which costs no
request when nothing of ours changed. One object by field selector, resumed from the last
resourceVersion seen (bookmarks keep it fresh), so a reconnect replays nothing; when the API server no
longer holds that version (410 Gone) the object is listed once and the watch resumes from the list.
The machinery (resumption, pacing, odd answers) is `nodeclient.ResumableWatch`, shared with the DRA
driver's watch of its ResourceSlices.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.nodeclient import (
    WATCH_HEALTHY_AFTER_S,
    Backoff,
    ResumableWatch,
    metadata,
)


class ObjectWatch(ResumableWatch):
    """`on_event(event)` for every ADDED/MODIFIED/DELETED of the object `name`; `relist()` lists it again
    when the watch cannot resume."""

    def __init__(
        self,
        client: DevicesClient,
        name: str,
        on_event: Callable[[dict[str, Any]], None],
        relist: Callable[[], Awaitable[Any]],
        *,
        backoff: Backoff | None = None,
        healthy_after: float = WATCH_HEALTHY_AFTER_S,
    ) -> None:
        super().__init__(
            f"devices {name}",
            lambda since, cancel: client.watch(name, since, cancel),
            on_event,
            relist,
            # An API server that ignored the field selector must not hand us another node's object.
            keep=lambda obj: metadata(obj).get("name") == name,
            backoff=backoff,
            healthy_after=healthy_after,
        )
        self.name = name
