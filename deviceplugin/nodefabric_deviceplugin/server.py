"""The gRPC side: one DevicePlugin server per family on its own unix socket, registered with kubelet.

`DevicePluginManager.run()` serves first and registers second (kubelet dials the plugin back inside
Register), then follows the device-plugin directory with inotify: when kubelet restarts it deletes every
socket there and recreates kubelet.sock, so a new kubelet.sock or a vanished socket of ours means serve
again and re-register, within milliseconds. A slow poll backs inotify up, and replaces it where inotify
cannot be used.

Nothing on the event loop reads sysfs: ListAndWatch and GetPreferredAllocation answer from the record
alone, and Allocate's verbs lookup goes through `verbs.VerbsCache`, which reads off the loop within a
time budget, as do the host facts a selector may name (drivers, link layers), once per record version.
GetPreferredAllocation's choice, pure but up to seconds of CPU, runs on a thread of its own, as does
building a family's device list (over a second for rdma.shared at kubelet's 4 MiB limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import NoReturn

import grpc

from nodefabric_devicemanager.backoff import Backoff
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin import metrics, offloop, rpc, wire
from nodefabric_deviceplugin.allocate import UnknownToken, endpoints_for, first_few, grant
from nodefabric_deviceplugin.api import deviceplugin_pb2 as pb
from nodefabric_deviceplugin.dirwatch import DirWatch
from nodefabric_deviceplugin.limits import KUBELET_MAX_MESSAGE_BYTES
from nodefabric_deviceplugin.offloop import BuildFailed, BuildTimeout, ReadTimeout
from nodefabric_deviceplugin.preferred import preferred
from nodefabric_deviceplugin.resources import (
    Family,
    FamilyView,
    PluginConfig,
    RdmaEndpoint,
    partition_endpoints,
    view,
    whole_function_endpoints,
)
from nodefabric_deviceplugin.selection import HostFacts, read_host_facts
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_deviceplugin.startup import DEFAULT_PLUGIN_DIR, socket_name
from nodefabric_deviceplugin.unixserver import MAX_BACKOFF_S, Identity, UnixServer, identity
from nodefabric_deviceplugin.verbs import DEFAULT_READ_BUDGET_S, VerbsCache, VerbsUnresolvable

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT_S = 5.0
RETRY_BASE_S = 0.1
SAFETY_POLL_S = 30.0  # with inotify: a look now and then in case an event was missed
FALLBACK_POLL_S = 1.0  # without inotify
KUBELET_ABSENT_WARNING_S = 30.0
KEPT_RESPONSES = 256  # Allocate answers kept per family: distinct endpoint sets since the last re-read

__all__ = ["DEFAULT_PLUGIN_DIR", "DevicePluginManager", "DevicePluginServicer", "socket_name"]


HostFactsFlight = offloop.SingleFlight[tuple[list[tuple[str, str]], HostFacts]]


def host_facts_flight(budget: float) -> HostFactsFlight:
    return offloop.SingleFlight("the host facts the RDMA selectors name", budget)


class DevicePluginServicer(rpc.DevicePluginServicer):
    """One family's DevicePlugin service. Every answer is rebuilt from the source's latest record."""

    def __init__(
        self,
        family: Family,
        config: PluginConfig,
        source: RecordSource,
        verbs: VerbsCache,
        facts: HostFactsFlight | None = None,
        *,
        retry: Backoff | None = None,
        budget: float = offloop.BUILD_WAIT_S,
    ) -> None:
        """`facts`: the read of the host facts, shared by every family (one read answers all of them).
        `retry`: how soon a failed build of the device list is tried again (`offloop.BUILD_RETRY`).
        `budget`: how long an Allocate or a preferred allocation waits for the list's build."""
        self.family = family
        self.config = config
        self.source = source
        self.verbs = verbs
        self.resource = config.resource_name(family)
        self._cached: tuple[int, FamilyView, pb.ListAndWatchResponse] | None = None
        self._builds: offloop.VersionedBuild[tuple[FamilyView, pb.ListAndWatchResponse]] = (
            offloop.VersionedBuild(
                "the device list",
                retry or offloop.BUILD_RETRY,
                thread=f"the {self.resource} device list",
                resource=self.resource,
            )
        )
        self._granted = metrics.ALLOCATIONS.labels(family.value, "granted")
        self._responses: dict[tuple[tuple[str, ...], int, int], pb.ContainerAllocateResponse] = {}
        self._facts = facts or host_facts_flight(verbs.budget)
        self.budget = budget

    async def view(self) -> tuple[int, FamilyView]:
        """The record version and the family's tokens from it (derived once per version), waiting
        `budget` seconds at most. Raises ReadTimeout (only with selectors that name host facts),
        BuildFailed, BuildTimeout (the build goes on: a later call shares it)."""
        try:
            async with asyncio.timeout(self.budget):
                version, current, _ = await self._derive()
        except TimeoutError:
            running = self._builds.running_for
            raise BuildTimeout(self._builds.what, self.source.version, self.budget, running) from None
        return version, current

    async def _derive(self) -> tuple[int, FamilyView, pb.ListAndWatchResponse]:
        """The view and its device list, built once per record version: every stream (kubelet opens a
        new one after each restart) and every Allocate of that version shares them. Raises ReadTimeout,
        BuildFailed (tried again after a backoff while the record is unchanged: `offloop.VersionedBuild`)."""
        while True:
            version, spec = self.source.snapshot()
            cached = self._cached
            if cached is not None and cached[0] == version:
                return cached
            if await self._builds.other_ended(version):
                continue  # the record may have changed again meanwhile: build the latest
            facts = None
            if self.config.selection.needs_host and spec is not None:
                facts = await self._host_facts(spec)
            # On a thread of its own: rdma.shared at kubelet's 4 MiB limit is some 123,000 tokens, over a
            # second of CPU, and every family's calls and streams (the DRA driver's too, in the agent)
            # share this loop. One build at a time per family (see `offloop.VersionedBuild`).
            built = await self._builds.build(version, functools.partial(self._list, spec, facts))
            if built is None:
                continue
            cached = (version, *built)
            if self._cached is None or self._cached[0] < version:  # a newer one built meanwhile stays
                self._cached = cached
            return cached

    def _list(
        self, spec: DevicesSpec | None, facts: HostFacts | None
    ) -> tuple[FamilyView, pb.ListAndWatchResponse]:
        """The family's view of a record and its device list, fitted to kubelet's limit. Pure but for its
        logs: safe on any thread."""
        current = view(spec, self.family, self.config.shared_count, self.config.selection, facts)
        wanted = self.config.selection.max_shared_count(self.config.shared_count)
        if self.family is Family.SHARED and current.shared_count < wanted:
            log.error(
                "the rdma.shared device list would exceed kubelet's 4 MiB message limit; serving "
                "fewer tokens per endpoint",
                extra={
                    "resource": self.resource,
                    "shared_count": self.config.shared_count,
                    "served_per_endpoint": current.shared_count,
                    "endpoints": len(current.endpoints),
                },
            )
        message = wire.device_list(current)
        if message.ByteSize() > KUBELET_MAX_MESSAGE_BYTES:
            # Only a record of some 100,000 functions gets here (shared is fitted in `view`): serve
            # what fits rather than a list kubelet refuses, ending the stream.
            kept = wire.fit(message, KUBELET_MAX_MESSAGE_BYTES)
            log.error(
                "the device list would exceed kubelet's 4 MiB message limit; serving the first devices",
                extra={"resource": self.resource, "devices": len(current.tokens), "served": kept},
            )
        return current, message

    async def _host_facts(self, spec: DevicesSpec) -> HostFacts:
        """The drivers and link layers a selector names, read once per record version, off the loop
        within the verbs budget (a sysfs read can block in a driver), one read in flight that callers
        share. Raises ReadTimeout."""
        endpoints = [*whole_function_endpoints(spec), *partition_endpoints(spec)]
        pairs = [(e.rdma_device, e.pci_bus_id) for e in endpoints]
        while True:
            read_for, facts = await self._facts.run(lambda: (pairs, read_host_facts(self.verbs.host, pairs)))
            if read_for == pairs:
                return facts
            # The read shared was an earlier record's: its endpoints differ. That one has ended: read anew.

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse]
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        # Never returns on its own: kubelet marks every device Unhealthy when this stream ends. A record
        # that cannot be turned into a list keeps the last list sent, with an Error log.
        last: pb.ListAndWatchResponse | None = None
        waiting = False  # for a stuck host read: said once, not at every try
        while True:
            version = self.source.version
            retry: float | None = None
            try:
                _, current, message = await self._derive()
            except BuildFailed as exc:
                # Logged once per failure streak by the build; tried again after its backoff, since no
                # record change may come (or at once when one does).
                retry = exc.retry_in
            except ReadTimeout as exc:
                # Tried again (sharing the read in flight) until it returns: no record change may come.
                retry = self.verbs.budget
                if not waiting:
                    log.error(
                        "the device list waits for a host read; kubelet keeps the last one sent",
                        extra={"resource": self.resource, "version": version, "why": str(exc)},
                    )
                waiting = True
            except Exception:
                log.exception(
                    "could not build the device list; kubelet keeps the last one sent",
                    extra={"resource": self.resource, "version": version},
                )
            else:
                waiting = False
                if message != last:
                    self._sending(current)
                    yield message
                    last = message
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.source.changed(version), retry)

    def _sending(self, current: FamilyView) -> None:
        healthy = sum(1 for t in current.tokens if t.endpoint.healthy)
        metrics.DEVICES.labels(self.family.value, "healthy").set(healthy)
        metrics.DEVICES.labels(self.family.value, "unhealthy").set(len(current.tokens) - healthy)
        fields: dict[str, object] = {
            "resource": self.resource,
            "devices": len(current.tokens),
            "healthy": healthy,
        }
        # Which endpoint is down and why, so "why is allocatable short" needs no second tool.
        down = [f"{e.rdma_device} ({e.reason})" for e in current.endpoints if not e.healthy]
        if down:
            fields["unhealthy"] = down
        log.info("sending the device list", extra=fields)

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse],
    ) -> pb.PreferredAllocationResponse:
        try:
            _, current = await self.view()
        except (ReadTimeout, BuildFailed, BuildTimeout) as exc:
            # Said by the build (once per streak) or the read; kubelet then allocates without a preference.
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise AssertionError("context.abort raises") from exc  # pragma: no cover
        out = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            available, must = list(req.available_deviceIDs), list(req.must_include_deviceIDs)
            # On a thread of its own (about 50 us): the choice costs up to seconds of CPU (1,023 of 1,024
            # VFs behind 64 ports; 36 ms for 255 of 256 behind 16), and every other call and every
            # family's stream share this loop. The view is never changed once made.
            choose = functools.partial(preferred, current, available, must, req.allocation_size)
            try:
                running = offloop.start(choose, "a preferred allocation")
            except RuntimeError:  # no thread to be had (the process at its limit): an answer all the same
                ids = choose()
            else:
                ids = await running
            metrics.PREFERRED_ALLOCATIONS.labels(self.family.value).inc()
            out.container_responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return out

    async def Allocate(
        self,
        request: pb.AllocateRequest,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        try:
            version, current = await self.view()
        except ReadTimeout as exc:
            ids = [i for req in request.container_requests for i in req.devices_ids]
            await self._refuse(context, "host_read_timeout", grpc.StatusCode.UNAVAILABLE, ids, exc)
        except (BuildFailed, BuildTimeout) as exc:
            # UNAVAILABLE: the build is tried again (or ends); kubelet retries the container's start.
            ids = [i for req in request.container_requests for i in req.devices_ids]
            await self._refuse(context, "list_not_built", grpc.StatusCode.UNAVAILABLE, ids, exc)
        out = pb.AllocateResponse()
        for req in request.container_requests:
            ids = list(req.devices_ids)
            try:
                endpoints = endpoints_for(current, ids)
                response = await self._response(version, endpoints)
            except UnknownToken as exc:
                await self._refuse(context, "unknown_device", grpc.StatusCode.INVALID_ARGUMENT, ids, exc)
            except VerbsUnresolvable as exc:
                await self._refuse(
                    context, "unresolvable_verbs", grpc.StatusCode.FAILED_PRECONDITION, ids, exc
                )
            except ReadTimeout as exc:
                # UNAVAILABLE: the host may answer the next try (a driver reset ends); nothing was granted.
                await self._refuse(context, "host_read_timeout", grpc.StatusCode.UNAVAILABLE, ids, exc)
            self._granted.inc()
            # Debug, not info: kubelet calls Allocate on every container start, restarts included, and a
            # grant is routine (the metric counts them); every refusal is a Warning or an Error.
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "allocated",
                    extra={
                        "resource": self.resource,
                        "devices": first_few(ids),
                        "rdma_devices": [e.rdma_device for e in endpoints],
                        "device_nodes": [d.host_path for d in response.devices],
                    },
                )
            out.container_responses.append(response)
        return out

    async def _response(self, version: int, endpoints: list[RdmaEndpoint]) -> pb.ContainerAllocateResponse:
        """One container's answer. A pure function of the record, the verbs table and the endpoints, so
        it is kept while the table stays fresh (its nodes unchanged) and rebuilt after any re-read."""
        names = [e.rdma_device for e in endpoints]
        key = (tuple(e.key for e in endpoints), version, self.verbs.generation)
        kept = self._responses.get(key)
        if kept is not None and self.verbs.fresh(version, names):
            return kept
        verbs = await self.verbs.devices(version, names)
        response = wire.container_response(grant(endpoints, verbs))
        if len(self._responses) >= KEPT_RESPONSES:
            self._responses.clear()
        self._responses[(key[0], version, self.verbs.generation)] = response
        return response

    async def _refuse(
        self,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
        outcome: str,
        code: grpc.StatusCode,
        ids: list[str],
        exc: Exception,
    ) -> NoReturn:
        metrics.ALLOCATIONS.labels(self.family.value, outcome).inc()
        level = logging.WARNING if code is grpc.StatusCode.INVALID_ARGUMENT else logging.ERROR
        log.log(
            level,
            "allocation refused",
            extra={"resource": self.resource, "devices": first_few(ids), "code": code.name, "why": str(exc)},
        )
        await context.abort(code, str(exc))
        raise AssertionError("context.abort raises")  # pragma: no cover

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[pb.PreStartContainerRequest, pb.PreStartContainerResponse],
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


@dataclass
class _Registration:
    kubelet: Identity | None = None  # the kubelet.sock we registered with
    failed_for: Identity | None = None  # the kubelet.sock the last attempt failed with
    failures: int = 0
    next_try: float = 0.0
    error: str = ""  # why the last attempt failed, for readiness

    def due(self, kubelet: Identity, now: float) -> bool:
        # A new kubelet is tried at once; the same one that refused us waits out the backoff.
        return self.kubelet != kubelet and (self.failed_for != kubelet or self.next_try <= now)


class FamilyServer(UnixServer):
    """One family's gRPC server on `<plugin dir>/nodefabric-<family>.sock`."""

    def __init__(self, servicer: DevicePluginServicer, plugin_dir: str) -> None:
        self.servicer = servicer
        self.family = servicer.family
        self.plugin_dir = plugin_dir
        self.endpoint = socket_name(servicer.family)
        super().__init__(
            os.path.join(plugin_dir, self.endpoint),
            lambda server: rpc.add_device_plugin_servicer(servicer, server),
            servicer.resource,
            grace=None,
        )
        self.registration = _Registration()

    async def serve(self) -> None:
        if self.registration.kubelet is not None:
            # Routine when kubelet restarts; anything else deleting it is worth a look.
            log.info("our socket was removed; serving again", extra={"socket": self.path})
        await super().serve()
        self.registration = _Registration()  # a fresh socket is registered afresh

    async def register(self, kubelet: rpc.RegistrationStub) -> None:
        """Register with kubelet; raises grpc.aio.AioRpcError when kubelet refuses or cannot be reached."""
        await kubelet.Register(
            pb.RegisterRequest(
                version=API_VERSION,
                endpoint=self.endpoint,
                resource_name=self.servicer.resource,
                options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
            ),
            timeout=REGISTER_TIMEOUT_S,
        )


class DevicePluginManager:
    """Runs the served families: serve, register, follow kubelet restarts, stop cleanly.

    In the agent:

        check_startup(config, plugin_dir)            # startup.py: one line and exit 2 when it raises
        source = RecordSource()
        manager = DevicePluginManager(source, HostRoot.at(root), config=config, plugin_dir=plugin_dir)
        task = asyncio.create_task(manager.run(stop))
        source.update(spec)          # after every agent pass
        ok, message = manager.readiness()            # for /readyz
    """

    def __init__(
        self,
        source: RecordSource,
        host: HostRoot,
        *,
        config: PluginConfig | None = None,
        plugin_dir: str = DEFAULT_PLUGIN_DIR,
        read_budget: float = DEFAULT_READ_BUDGET_S,
        verbs: VerbsCache | None = None,
        use_inotify: bool = True,
        safety_poll: float = SAFETY_POLL_S,
        fallback_poll: float = FALLBACK_POLL_S,
        retry_base: float = RETRY_BASE_S,
        kubelet_absent_warning: float = KUBELET_ABSENT_WARNING_S,
        build_retry: Backoff = offloop.BUILD_RETRY,
        build_budget: float = offloop.BUILD_WAIT_S,
    ) -> None:
        """`build_retry`: how soon a family's device list whose build failed is built again while the
        record is unchanged; `build_budget`: how long an Allocate waits for a build at most."""
        self.source = source
        self.host = host
        self.config = config or PluginConfig()
        self.plugin_dir = plugin_dir
        self.use_inotify = use_inotify
        self.safety_poll = safety_poll
        self.fallback_poll = fallback_poll
        self.retry_base = retry_base
        self.kubelet_absent_warning = kubelet_absent_warning
        # One verbs cache for every family: one read of the host answers all of them.
        self.verbs = verbs or VerbsCache(host, budget=read_budget)
        facts = host_facts_flight(self.verbs.budget)  # one read of the host facts answers every family
        self.servers = [
            FamilyServer(
                DevicePluginServicer(
                    f, self.config, source, self.verbs, facts, retry=build_retry, budget=build_budget
                ),
                plugin_dir,
            )
            for f in self.config.families()
        ]
        self.serving = asyncio.Event()  # set once every family is serving and registered at least once
        self.reconciles = 0  # passes over the directory, for tests and the benchmark
        self._running = False
        self._kubelet: Identity | None = None
        self._kubelet_absent_since: float | None = None
        self._absent_warned = False
        self._absent_counted_at: float | None = None
        self._watch: DirWatch | None = None

    @property
    def watching(self) -> bool:
        """Whether inotify is following the plugin directory now (else the fallback poll is)."""
        return self._watch is not None and self._watch.active

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set. Waits for the first record: a failed read is not an empty host."""
        os.makedirs(self.plugin_dir, exist_ok=True)
        if self.source.spec is None:
            log.info("waiting for the first device record before registering")
            if not await self.source.first_or_stop(stop):
                return
        wake = asyncio.Event()
        stopper = asyncio.ensure_future(stop.wait())
        stopper.add_done_callback(lambda _: wake.set())
        names = [KUBELET_SOCKET, *(s.endpoint for s in self.servers)]
        self._watch = DirWatch(self.plugin_dir, names, wake.set) if self.use_inotify else None
        if self._watch is not None:
            self._watch.start()
        log.info(
            "following the plugin directory",
            extra={"plugin_dir": self.plugin_dir, "how": "inotify" if self.watching else "polling"},
        )
        self._running = True
        try:
            while not stop.is_set():
                wake.clear()
                await self.reconcile()
                if self._watch is not None and self._watch.lost:
                    # The directory was replaced: watch the new one (or poll until it is back).
                    self._watch.start()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=self._next_wakeup())
        finally:
            self._running = False
            stopper.cancel()
            if self._watch is not None:
                self._watch.stop()
            for server in self.servers:
                await server.stop()
            log.info("stopped serving", extra={"plugin_dir": self.plugin_dir})

    def _next_wakeup(self) -> float:
        """Seconds until something is due: a retry, the absent-kubelet warning, else the poll."""
        now = time.monotonic()
        due = [self.safety_poll if self.watching else self.fallback_poll]
        for server in self.servers:
            if server.needs_serving():
                # At its retry time, or at once when that passed while the last look ran: that look
                # skipped the socket (not due yet), then waited on kubelet's Register of the others for
                # longer than the backoff. Nothing else wakes us: a retry counted only while still ahead
                # left the socket unserved, its resource unregistered, until the 30 s safety poll.
                due.append(server.retry_at - now)
            reg = server.registration
            if reg.failed_for is not None and reg.failed_for == self._kubelet:
                due.append(reg.next_try - now)
        if self._kubelet_absent_since is not None and not self._absent_warned:
            due.append(self._kubelet_absent_since + self.kubelet_absent_warning - now)
        if self._absent_counted_at is not None:
            due.append(self._absent_counted_at + self.kubelet_absent_warning - now)
        return max(0.0, min(due))

    async def reconcile(self) -> None:
        """One look at the directory: re-serve a deleted socket, (re-)register with a new kubelet."""
        self.reconciles += 1
        kubelet = identity(os.path.join(self.plugin_dir, KUBELET_SOCKET))
        now = time.monotonic()
        self._follow_kubelet(kubelet, now)
        for server in self.servers:
            if server.due(now):
                await server.serve_again(now, self.retry_base)
        if kubelet is None:
            return
        due = [s for s in self.servers if not s.needs_serving() and s.registration.due(kubelet, now)]
        if due:
            # One connection carries every family's Register: after a kubelet restart all three are due.
            path = os.path.join(self.plugin_dir, KUBELET_SOCKET)
            async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
                stub = rpc.registration_stub(channel)
                await asyncio.gather(*(self._register(s, stub, kubelet) for s in due))
        if all(s.registration.kubelet is not None for s in self.servers):
            self.serving.set()

    def _follow_kubelet(self, kubelet: Identity | None, now: float) -> None:
        path = os.path.join(self.plugin_dir, KUBELET_SOCKET)
        if kubelet is not None:
            if self._kubelet_absent_since is not None and self._absent_warned:
                log.info("kubelet.sock is back", extra={"path": path})
            self._kubelet_absent_since, self._absent_warned, self._absent_counted_at = None, False, None
        elif self._kubelet_absent_since is None:
            self._kubelet_absent_since = now
        elif now - self._kubelet_absent_since >= self.kubelet_absent_warning:
            if not self._absent_warned:
                self._absent_warned = True
                log.warning(
                    "kubelet.sock has been absent; is kubelet running, and is its device-plugin directory "
                    "mounted here?",
                    extra={"path": path, "absent_s": round(now - self._kubelet_absent_since, 1)},
                )
            # No Register can be sent: count it failed, once per family per warning interval while kubelet
            # stays away, so the registrations_total{outcome="failed"} alert fires for an absent kubelet
            # (a start-up race of a few seconds is never counted).
            if (
                self._absent_counted_at is None
                or now - self._absent_counted_at >= self.kubelet_absent_warning
            ):
                self._absent_counted_at = now
                for server in self.servers:
                    if server.registration.kubelet is None or server.registration.kubelet != kubelet:
                        metrics.REGISTRATIONS.labels(server.family.value, "failed").inc()
        self._kubelet = kubelet

    async def _register(self, server: FamilyServer, stub: rpc.RegistrationStub, kubelet: Identity) -> None:
        reg = server.registration
        try:
            await server.register(stub)
        except grpc.aio.AioRpcError as exc:
            # A new kubelet starts a fresh backoff: failures against the ones a restart loop left behind
            # say nothing about this one.
            reg.failures = reg.failures + 1 if reg.failed_for == kubelet else 1
            backoff = Backoff(self.retry_base, MAX_BACKOFF_S, jitter=False).delay(reg.failures)
            reg.kubelet, reg.failed_for = None, kubelet
            reg.next_try = time.monotonic() + backoff
            reg.error = f"{exc.code().name}: {exc.details()}"
            metrics.REGISTRATIONS.labels(server.family.value, "failed").inc()
            log.error(
                "registration with kubelet failed; will retry",
                extra={
                    "resource": server.servicer.resource,
                    "code": exc.code().name,
                    "why": exc.details(),
                    "retry_in_s": round(backoff, 2),
                },
            )
            return
        reg.kubelet, reg.failed_for, reg.failures, reg.error = kubelet, None, 0, ""
        metrics.REGISTRATIONS.labels(server.family.value, "ok").inc()
        log.info(
            "registered with kubelet", extra={"resource": server.servicer.resource, "socket": server.path}
        )

    def readiness(self) -> tuple[bool, str]:
        """(ready, why) for /readyz: ready once kubelet has accepted every served resource.

        Answers from what the last look at the directory found (no I/O), so it is cheap on any loop.
        """
        if self.source.spec is None:
            return False, "device plugin: waiting for the first device record"
        if not self._running:
            return False, "device plugin: not running"
        path = os.path.join(self.plugin_dir, KUBELET_SOCKET)
        if self._kubelet is None:
            since = self._kubelet_absent_since
            absent = f" for {time.monotonic() - since:.0f} s" if since is not None else ""
            return False, f"device plugin: no kubelet.sock at {path}{absent}"
        pending = []
        for server in self.servers:
            if server.registration.kubelet != self._kubelet:
                why = server.error or server.registration.error or "registering"
                pending.append(f"{server.servicer.resource} ({why})")
        if pending:
            return False, "device plugin: not registered with kubelet: " + "; ".join(pending)
        return True, "device plugin: registered " + ", ".join(s.servicer.resource for s in self.servers)
