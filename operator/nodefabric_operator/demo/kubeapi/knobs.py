"""The embedded API's settings as its parts read them: what a test or the demo sets on `KubeAPI`.

The parts hold the `KubeAPI` itself under this protocol and read a setting when they need it, so a test
that changes one on a running API (`require_namespaces`, `bookmark_interval`) changes what the next
request sees, and no part imports the server it serves."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Knobs(Protocol):
    history: int  # requests kept for `requests()`
    history_bytes: int  # request bodies those may hold in all
    event_window: int  # events each resource keeps for resuming watches
    bookmark_interval: float  # seconds between watch bookmarks
    watch_capacity: int  # events queued for one slow watch before it is closed
    require_namespaces: bool  # refuse objects in a namespace that does not exist
    services: dict[str, str]  # where a webhook's clientConfig.service is served
