"""Keeps this node's ResourceSlices equal to what the latest record yields, for the cost of one watch.

The slices are listed once, then followed with one watch (this node's, this driver's; resumed from the
last resourceVersion seen, bookmarks keeping it fresh): the publisher keeps them in memory
(`live.LiveSlices`) and plans against that copy (`slices.plan`), so a steady node costs no request at all
beyond the watch's own re-opens every 300-600 s. Someone else's change (kubelet deletes a driver's slices
when it starts and when the driver is gone a while; a hand edit) arrives on the watch and triggers a sync,
which writes only the difference. A write refused with 409 (the slice changed under us) lists again;
a watch that cannot resume (410 Gone) lists again once. Syncs also run when the record changes, when
kubelet (re)registers the driver, and every `resync` seconds; a sync that writes nothing reads the
host's link layers and nothing from the API. API failures are retried with exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Protocol

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.nodeclient import ApiFailure, Backoff, Cancel, ResumableWatch
from nodefabric_deviceplugin.dra import metrics
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.dra.devices import offered, pool_devices, published, selected
from nodefabric_deviceplugin.dra.linklayer import link_layers
from nodefabric_deviceplugin.dra.live import LiveSlices
from nodefabric_deviceplugin.dra.slices import SlicePlan, content, desired_slices, plan, resource_slice
from nodefabric_deviceplugin.offloop import ReadTimeout, SingleFlight
from nodefabric_deviceplugin.selection import read_host_facts
from nodefabric_deviceplugin.source import RecordSource

log = logging.getLogger(__name__)

# A sync against the slices in memory costs no request; it is a safety net for what no event announces
# (a port's link layer is read at sync time and is not part of the record). The agent's walk interval.
DEFAULT_RESYNC_S = 600.0
SYNC_BUDGET_S = 30.0
CONFLICT_RETRIES = 3


class SliceApi(Protocol):
    def node_owner(self) -> dict[str, Any] | None: ...
    def list_slices(self) -> tuple[list[dict[str, Any]], str]: ...
    def watch_slices(self, since: str, cancel: Cancel | None = None) -> Iterator[dict[str, Any]]: ...
    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def update_slice(self, body: dict[str, Any], version: str) -> dict[str, Any]: ...
    def delete_slice(self, name: str, version: str) -> None: ...


class SlicePublisher:
    def __init__(
        self,
        api: SliceApi,
        config: DriverConfig,
        source: RecordSource,
        host: HostRoot,
        *,
        resync: float = DEFAULT_RESYNC_S,
        budget: float = SYNC_BUDGET_S,
        backoff: Backoff | None = None,
    ) -> None:
        self.api = api
        self.backoff = backoff or Backoff()
        # One sync in flight at most, on a thread of its own: a read stuck on a blocking file under /sys
        # costs one thread, and each retry finds it still running instead of starting another.
        self.flight: SingleFlight[SlicePlan | None] = SingleFlight("the host for the ResourceSlices", budget)
        self.config = config
        self.source = source
        self.host = host
        self.resync = resync
        self.syncs = 0  # completed syncs, written or not
        self.last_plan: SlicePlan | None = None
        self.live = LiveSlices()
        self.watch = ResumableWatch(
            f"resourceslices of {config.node_name} ({config.driver})",
            api.watch_slices,
            self._on_event,
            self._relist,
        )
        self._poke = asyncio.Event()

    def poke(self) -> None:
        """Sync soon (kubelet registered the driver: it may have deleted our slices when it started)."""
        self._poke.set()

    def sync(self) -> SlicePlan | None:
        """One sync (blocking). None when there is nothing to publish from yet. Raises ApiFailure."""
        spec = self.source.spec
        devices = offered(pool_devices(spec), self.config.functions)
        selection = self.config.selection
        facts = None
        if selection.needs_host:
            # Only selectors naming drivers or linkLayers read these, here, off the loop like the rest.
            facts = read_host_facts(
                self.host, [(d.endpoint.rdma_device, d.endpoint.pci_bus_id) for d in devices]
            )
        devices = selected(devices, selection, facts)
        allocatable = published(devices)
        metrics.POOL_DEVICES.labels("published").set(len(allocatable))
        metrics.POOL_DEVICES.labels("left_out").set(len(devices) - len(allocatable))
        layers = link_layers(self.host, [d.endpoint.rdma_device for d in allocatable])
        desired = desired_slices(spec, self.config, layers, facts)
        if desired is None:
            metrics.SLICE_SYNCS.labels("skipped").inc()
            return None
        last: ApiFailure | None = None
        for _ in range(CONFLICT_RETRIES):
            # While the watch fails (an outage, a role without `watch`), nothing tells us of kubelet's
            # deletes: every sync lists, as the driver did before it held a watch.
            if not self.live.listed or self.watch.failing:
                self._list()
            decided = plan(desired, self.live.slices())
            owner: dict[str, Any] | None = None
            if decided.create or decided.update:
                # Read only when writing (steady state costs nothing), and fresh: a Node deleted and
                # re-registered has a new uid, and slices owned by the old one would be collected at once.
                owner = self.api.node_owner()
                if owner is None:
                    raise ApiFailure(
                        "node_missing",
                        f"node {self.config.node_name} does not exist; publishing no ResourceSlices for it",
                        404,
                    )
            try:
                self._apply(decided, owner)
            except ApiFailure as exc:
                if exc.kind != "conflict":
                    raise
                last = exc
                self.live.forget()
                log.info("a slice changed under us; listing again", extra={"why": str(exc)})
                continue
            self.syncs += 1
            self.last_plan = decided
            metrics.SLICE_SYNCS.labels("written" if decided.writes else "unchanged").inc()
            return decided
        raise ApiFailure(
            "conflict",
            f"slices kept changing under us over {CONFLICT_RETRIES} attempts (last: {last}); a slice of"
            " that name may belong to another node or driver",
        )

    def _list(self) -> None:
        """List the slices (one request): the copy in memory, and where the watch resumes from."""
        items, version = self.api.list_slices()
        self.live.replace(items)
        self.watch.resume_from(version)

    def _apply(self, decided: SlicePlan, owner: dict[str, Any] | None) -> None:
        if not decided.writes:
            return
        for d in decided.create:
            self.live.wrote(
                self.api.create_slice(resource_slice(d, decided.generation, owner)), content(d.spec)
            )
            metrics.SLICE_WRITES.labels("create").inc()
        for d, rv in decided.update:
            self.live.wrote(
                self.api.update_slice(resource_slice(d, decided.generation, owner), rv), content(d.spec)
            )
            metrics.SLICE_WRITES.labels("update").inc()
        # Last: the new generation is complete before the old slices go.
        for name, rv in decided.delete:
            self.api.delete_slice(name, rv)
            self.live.removed(name)
            metrics.SLICE_WRITES.labels("delete").inc()
        log.info(
            "published the node's ResourceSlices",
            extra={
                "driver": self.config.driver,
                "pool": self.config.pool,
                "generation": decided.generation,
                "slices": len(decided.create) + len(decided.update),
                "devices": sum(
                    len(d.spec["devices"]) for d in (*decided.create, *(u for u, _ in decided.update))
                ),
                "deleted": [name for name, _ in decided.delete],
            },
        )

    def _on_event(self, event: dict[str, Any]) -> None:
        """A watch event (on the event loop): someone else's change is a reason to sync."""
        if self.live.apply(event):
            metrics.SLICE_EVENTS.inc()
            meta = (event.get("object") or {}).get("metadata") or {}
            log.info(
                "a ResourceSlice of this node changed under us; syncing",
                extra={"event": event.get("type"), "slice": meta.get("name"), "node": self.config.node_name},
            )
            self.poke()

    async def _relist(self) -> None:
        """The watch has nothing to resume from (its start, a 410 Gone): a sync that lists first sets it."""
        self.live.forget()
        self.watch.since = ""
        try:
            await self.flight.run(self.sync)
        except Exception as exc:
            if not self.live.listed:  # the watch backs off and asks again
                log.warning(
                    "could not list this node's ResourceSlices for the watch; will retry",
                    extra={"why": str(exc), "node": self.config.node_name},
                )
            self.poke()  # the sync loop retries what failed (no Node yet, an outage) with its backoff
        if not self.live.listed:
            # A sync in flight from before the forget may not have listed: the watch asks again.
            self.watch.since = ""

    async def run(self, stop: asyncio.Event) -> None:
        """Sync until `stop` is set: on record changes, pokes, watch events, every `resync` s; back off on
        failures. The watch runs beside it."""
        watcher = asyncio.create_task(self.watch.run(stop), name="dra-slices-watch")
        try:
            await self._syncs(stop)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _syncs(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            version = self.source.version
            self._poke.clear()
            try:
                await self.flight.run(self.sync)
                failures, delay = 0, self.resync
            except ReadTimeout as exc:
                failures += 1
                delay = self.backoff.delay(failures)
                metrics.SLICE_SYNCS.labels("failed").inc()
                log.error(
                    "a ResourceSlice sync is stuck reading the host; will retry",
                    extra={"why": str(exc), "retry_in_s": round(delay, 2)},
                )
            except ApiFailure as exc:
                failures += 1
                delay = self.backoff.delay(failures)
                metrics.SLICE_SYNCS.labels("skipped" if exc.kind == "node_missing" else "failed").inc()
                log.error(
                    "cannot publish the node's ResourceSlices; will retry",
                    extra={"why": str(exc), "kind": exc.kind, "retry_in_s": round(delay, 2)},
                )
            except Exception:
                failures += 1
                delay = self.backoff.delay(failures)
                metrics.SLICE_SYNCS.labels("failed").inc()
                log.exception("publishing ResourceSlices failed unexpectedly; will retry")
            await self._wait(stop, version, delay, retry=failures > 0)

    async def _wait(self, stop: asyncio.Event, version: int, delay: float, *, retry: bool) -> None:
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
        if not retry:  # after a failure only the backoff (or stop) ends the wait
            waits += [
                asyncio.ensure_future(self.source.changed(version)),
                asyncio.ensure_future(self._poke.wait()),
            ]
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED), delay)
        finally:
            for w in waits:
                w.cancel()
