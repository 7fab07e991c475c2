"""NodePrepareResources and NodeUnprepareResources, one claim at a time.

Every claim of a request gets an entry (kubelet prepares a missing one again), a claim's failure is its
entry's error and never the call's, and nothing a claim carries can crash the server. Preparing:

1. a claim already in the checkpoint answers what it answered before: from its entry when the entry was
   written in this boot (its spec rewritten if it is gone); otherwise (another boot, or an unknown one
   and the spec is gone) its devices, by their names in the pool (PCI addresses), are resolved again in
   the latest record and verbs devices as in steps 3 and 4, since a reboot may have renumbered the uverbs
   nodes and renamed the RDMA devices: the entry is rewritten (durably), then the spec; the CDI ids, a
   function of the claim's uid and devices, stay. A device gone from the node fails the claim, nothing
   written (`_prepare_again`). An entry whose spec lies under another `--cdi-dir` than the current one
   (the flag changed between restarts) has its spec written under the current one and the entry
   rewritten to name the new one (`_relocate`; when resolved again, `_rewrite`); the old file is left,
   with a Warning: nothing outside `--cdi-dir` is ever removed;
2. otherwise the claim is read from the API and its uid checked; this driver's results for this node's
   pool are taken (other drivers' are theirs);
3. each device is resolved in the latest record (a device whose link failed after it was allocated is
   still served: its pod was already placed), its verbs device taken from the device plugin's
   `VerbsCache`, and the grant is the device plugin's (`allocate.grant`);
4. the claim's checkpoint file is created and the claim written into it, then the CDI spec is written
   (a kill between the two leaves no spec that the checkpoint does not name); then the CDI device ids
   are returned, and the entry's syncs follow the answer (`syncs`; checkpoint
   says why that is safe).

Steps 2 to 4 take one thread hop when the verbs devices are cached for the record (the common case:
one read of the host answers every device of a record). When they are not, the hop ends after step 2's
resolve, the verbs devices are read off the loop within a budget (`VerbsCache.devices`: never on the
hop's thread, which must not hang on a FIFO in sysfs), and step 4 takes a second hop. Either way a hop
that may write runs to its end under the lock, even when kubelet's deadline cancels the call; a call
cancelled while its hop still reads the claim walks away at once, and that thread writes nothing; a call
cancelled while its hop still waits for a thread (every hop thread busy, their cap reached) drops it, and
lets the lock go at once: the hop never runs, neither the claim's read nor a write (`hops.finish`).

Unpreparing removes the claim's spec (named by the claim's uid) from `--cdi-dir`, and only from there,
and forgets the claim; a claim never prepared here unprepares successfully. A checkpoint entry whose spec
path is relative or has `..` components is refused when the checkpoint is read (`checkpoint`), and one
whose spec lies elsewhere (an earlier `--cdi-dir`, a symlink out of it) has that file left, said.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.nodeclient import ApiFailure
from nodefabric_deviceplugin.allocate import ContainerGrant, endpoints_for, grant
from nodefabric_deviceplugin.dra import boot, cdi, hops, metrics
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice, Reservation
from nodefabric_deviceplugin.dra.claims import AllocatedDevice, ClaimError, ClaimRef, allocated_devices
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.dra.devices import PoolDevice
from nodefabric_deviceplugin.dra.pool import Pools
from nodefabric_deviceplugin.dra.syncs import Syncs
from nodefabric_deviceplugin.offloop import BuildFailed, BuildTimeout, ReadTimeout
from nodefabric_deviceplugin.resources import Family, FamilyView, RdmaEndpoint, Token
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_deviceplugin.verbs import VerbsCache, VerbsDevices, VerbsUnresolvable

log = logging.getLogger(__name__)


class _Recording(Protocol):
    @property
    def entry(self) -> Reservation | None: ...


_T = TypeVar("_T", bound=_Recording)


class ClaimReader(Protocol):
    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class Prepared:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


def claim_view(devices: Sequence[PoolDevice]) -> FamilyView:
    """The claim's devices in the shape `allocate.grant` takes, with the DRA device names as ids."""
    tokens = tuple(Token(d.name, d.endpoint, i) for i, d in enumerate(devices))
    return FamilyView(Family.EXCLUSIVE, tuple(d.endpoint for d in devices), tokens, {t.id: t for t in tokens})


def _by_device(allocated: Sequence[AllocatedDevice]) -> dict[str, list[str]]:
    """Device -> the requests it serves, in result order (one device may serve several requests)."""
    out: dict[str, list[str]] = {}
    for a in allocated:
        requests = out.setdefault(a.device, [])
        if a.request and a.request not in requests:
            requests.append(a.request)
    return out


def _resolve(
    ref: ClaimRef, found: tuple[int, dict[str, PoolDevice]] | None, names: list[str]
) -> tuple[int, list[PoolDevice]]:
    """The record version and the claim's devices in it (`found`: the pool of the latest record, None
    before the first). Raises ClaimError."""
    if found is None:
        raise ClaimError("no device record yet (the first host pass has not finished); kubelet retries")
    version, pool = found
    unknown = [n for n in names if n not in pool]
    if unknown:
        raise ClaimError(f"claim {ref}: no device {', '.join(unknown)} on this node (the record has none)")
    members = [pool[n] for n in names]
    for d in members:
        if not d.allocatable:
            log.warning(
                "preparing a device whose link has failed since it was allocated",
                extra={"claim": str(ref), "device": d.name, "why": d.endpoint.reason},
            )
    return version, members


@dataclass(frozen=True, slots=True)
class _Plan:
    """A first prepare's claim resolved in one record: its devices and the requests each serves."""

    requests: dict[str, list[str]]
    version: int
    members: tuple[PoolDevice, ...]
    endpoints: tuple[RdmaEndpoint, ...]

    @property
    def rdma_devices(self) -> list[str]:
        return [e.rdma_device for e in self.endpoints]


def _planned(
    ref: ClaimRef, requests: dict[str, list[str]], found: tuple[int, dict[str, PoolDevice]] | None
) -> _Plan:
    """The devices of `requests` (device -> the requests it serves) resolved in the record's pool, and
    the endpoints the grant takes. Pure. Raises ClaimError."""
    version, members = _resolve(ref, found, list(requests))
    if len(members) == 1:  # the common claim: the grant's view of one device is that device
        endpoints = [members[0].endpoint]
    else:
        endpoints = endpoints_for(claim_view(members), [d.name for d in members])
    return _Plan(requests, version, tuple(members), tuple(endpoints))


@dataclass(frozen=True, slots=True)
class _Written:
    """A claim's files written: what kubelet is answered, and the entry whose syncs follow."""

    devices: tuple[PreparedDevice, ...]
    grant: ContainerGrant
    path: str
    entry: Reservation


@dataclass(frozen=True, slots=True)
class _Hop:
    """What a first prepare's thread hop did: `plan` None when the claim has none of our devices,
    `written` None when the verbs devices must be read first (on the loop's budgeted path)."""

    plan: _Plan | None
    written: _Written | None

    @property
    def entry(self) -> Reservation | None:
        return None if self.written is None else self.written.entry


def _moved(written: str, current: str) -> bool:
    """Whether a claim's spec was written under another `--cdi-dir` than the current one. Another path
    of the same directory (/var/run/cdi and /run/cdi, /var/run a symlink to /run; a bind mount) is no
    move: "moving" the spec there would say the same file was left behind."""
    old, new = os.path.dirname(written), os.path.dirname(current)
    if os.path.normpath(old) == os.path.normpath(new):
        return False
    try:
        return not os.path.samefile(old, new)
    except OSError:  # either directory gone or unreadable: not one directory that can be told
        return True


def _leave_stale(path: str, uid: str, cdi_dir: str) -> None:
    """The spec a claim had under an earlier `--cdi-dir` (or through a symlink out of it): left where it
    is, said. The driver removes only files inside the configured `--cdi-dir`: a path read back from the
    checkpoint is no proof of what the file is. A spec left there names CDI devices no claim asks for
    again (their names carry the claim's uid)."""
    log.warning(
        "a claim's CDI spec lies outside the current --cdi-dir; left there (only files inside --cdi-dir are"
        " removed), remove it by hand",
        extra={"claim": uid, "path": path, "cdi_dir": cdi_dir},
    )


def _claim_spec(
    driver: str, uid: str, plan: _Plan, verbs: VerbsDevices
) -> tuple[ContainerGrant, dict[str, Any]]:
    """The claim's grant (the device plugin's) and its CDI spec. Pure. Raises VerbsUnresolvable."""
    whole = grant(plan.endpoints, verbs)
    if len(plan.members) == 1:  # the common claim: its one device's grant is the whole one
        nodes = {plan.members[0].name: [n.path for n in whole.devices]}
    else:
        nodes = {d.name: [n.path for n in grant([d.endpoint], verbs).devices] for d in plan.members}
    return whole, cdi.build_spec(driver, uid, nodes, whole.envs)


class _Templates:
    """Each device's grant and spec template under one record version and verbs table (its generation):
    a one-device claim's first prepare splices its uid into its device's."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self._key = (-1, -1)
        self._held: dict[str, tuple[ContainerGrant, cdi.SpecTemplate]] = {}

    def spec_and_text(
        self, uid: str, plan: _Plan, verbs: VerbsDevices, generation: int
    ) -> tuple[ContainerGrant, dict[str, Any], str]:
        """`_claim_spec` and the spec's text (`cdi.spec_text`). A one-device claim's, the common one, come
        from its device's template: the grant, the spec and its encoding cost a first prepare more than
        its every other step past the read but the files. `verbs`: the answer of the verbs cache's table
        `generation`, under the lock the hop's call holds. Raises VerbsUnresolvable."""
        if len(plan.members) == 1:
            held = self.get(plan, verbs, generation)
            if held is not None:
                whole, template = held
                return whole, template.spec(uid), template.text(uid)
        whole, spec = _claim_spec(self.driver, uid, plan, verbs)
        return whole, spec, cdi.spec_text(spec)

    def get(
        self, plan: _Plan, verbs: VerbsDevices, generation: int
    ) -> tuple[ContainerGrant, cdi.SpecTemplate] | None:
        """None when the spec cannot be templated (`cdi.SpecTemplate.of`). Raises VerbsUnresolvable."""
        if self._key != (plan.version, generation):
            # Another record or verbs table: the templates held may name devices or nodes no longer so.
            self._key, self._held = (plan.version, generation), {}
        device = plan.members[0].name
        held = self._held.get(device)
        if held is None:
            whole = grant(plan.endpoints, verbs)
            template = cdi.SpecTemplate.of(self.driver, device, [n.path for n in whole.devices], whole.envs)
            if template is None:
                return None
            held = self._held[device] = (whole, template)
        return held


class _AnotherBoot:
    """What a repeated prepare does with a claim whose entry another (or an unknown) boot wrote: the
    kernel may have numbered the verbs devices and named the RDMA devices otherwise since, so the entry's
    spec is trusted only as far as `_respec` says, and the claim is otherwise resolved again. A part of
    `Preparer`, held apart as its own concern."""

    config: DriverConfig
    boot_id: str
    verbs: VerbsCache
    checkpoint: Checkpoint
    _waits: hops.Waits

    pools: Pools

    def _respec(self, done: PreparedClaim) -> bool | None:
        """On a worker thread, for a repeated prepare: the spec rewritten from the entry when the entry
        can be trusted (whether it wrote), else None: the claim's devices must be resolved again.

        Trusted: written in this boot (the kernel names devices the same until it reboots); or, the boot
        unknown on either side (an entry of an older driver, a boot id that cannot be read), the spec
        still there (the runtime's directory is a tmpfs a reboot empties). Both boots known and
        different: resolved again even with the spec there (a `--cdi-dir` that survives a reboot holds
        the old boot's device nodes). A spec that differs from the entry's is replaced, as before; one
        written under an earlier `--cdi-dir` is moved to the current one (`_relocate`)."""
        # An entry naming no device (only a damaged one names a spec then) holds nothing a boot renames.
        same = (bool(done.boot_id) and done.boot_id == self.boot_id) or not done.devices
        if not same and done.boot_id and self.boot_id:
            return None
        on_disk = cdi.read_spec(done.spec_path)
        if not same and on_disk is None:
            return None
        if _moved(done.spec_path, self._spec_path(done.uid)):
            self._relocate(done)
            return False
        if on_disk == done.spec:
            return False
        cdi.write_new_spec(done.spec_path, cdi.spec_text(done.spec))
        return True

    def _spec_path(self, uid: str) -> str:
        """Where the claim's spec belongs now: under the current `--cdi-dir`."""
        return cdi.spec_path(self.config.cdi_dir, self.config.driver, uid)

    def _relocate(self, done: PreparedClaim) -> None:
        """On a worker thread, under the lock: the entry's spec written under the current `--cdi-dir`
        (the runtime is now told to read that one), then the
        entry rewritten (durably) to name the new file; the stale spec is left in the old directory,
        said (`_leave_stale`). A kill between the steps leaves nothing no later call finds: a spec in the
        current directory is found by its name (an unprepare always looks there), and the next prepare
        moves the entry again."""
        path = self._spec_path(done.uid)
        cdi.write_new_spec(path, cdi.spec_text(done.spec))
        _leave_stale(done.spec_path, done.uid, self.config.cdi_dir)
        self.checkpoint.put(dataclasses.replace(done, spec_path=path))
        log.warning(
            "moved a prepared claim's CDI spec to the current --cdi-dir",
            extra={"claim": done.uid, "from": done.spec_path, "cdi_spec": path},
        )

    async def _prepare_again(self, ref: ClaimRef, done: PreparedClaim) -> tuple[PreparedDevice, ...]:
        """A claim prepared in another (or an unknown) boot: its devices, named in the entry by their
        stable pool names (PCI addresses), resolved in the latest record and verbs devices as a first
        prepare resolves them, without reading the claim (its allocation cannot change while a pod
        reserves it); then its entry rewritten and synced, then its spec (`_rewrite`). The answer is the
        entry's: the CDI ids are functions of the claim's uid and devices. Raises ClaimError (a device no
        longer on this node: nothing written), VerbsUnresolvable, ReadTimeout, OSError."""
        plan = self._replan(ref, done, await self.pools.latest(self.pools.budget))
        again = await hops.finish(ref, hops.hop(self._rewrite, ref, done, plan, None), waits=self._waits)
        if again is None:
            # Not cached for this record: read off the loop within a budget, as a first prepare does.
            verbs = await self.verbs.devices(plan.version, plan.rdma_devices)
            again = await hops.finish(ref, hops.hop(self._rewrite, ref, done, plan, verbs), waits=self._waits)
            assert again is not None
        prepared, whole = again
        metrics.PREPARES.labels("resolved_again").inc()
        log.warning(
            "resolved a claim prepared in an earlier (or unknown) boot again and rewrote its CDI spec",
            extra={
                "claim": str(ref),
                "prepared_boot": done.boot_id or "unknown",
                "boot": self.boot_id or "unknown",
                "rdma_devices": [e.rdma_device for e in whole.endpoints],
                "device_nodes": [n.path for n in whole.devices],
                "cdi_spec": prepared.spec_path,
            },
        )
        return prepared.devices

    def _replan(
        self, ref: ClaimRef, done: PreparedClaim, found: tuple[int, dict[str, PoolDevice]] | None
    ) -> _Plan:
        """The entry's devices resolved in the latest record. Pure. Raises ClaimError."""
        foreign = sorted({d.pool for d in done.devices if d.pool != self.config.pool})
        if foreign:
            raise ClaimError(
                f"claim {ref} was prepared in pool {', '.join(foreign)} in an earlier boot; this driver's"
                f" pool is {self.config.pool}: not preparing it again (unprepare the claim to release it)"
            )
        requests = {d.device: list(d.request_names) for d in done.devices}
        if found is not None:
            gone = [name for name in requests if name not in found[1]]
            if gone:
                raise ClaimError(
                    f"claim {ref} was prepared in an earlier boot with device {', '.join(gone)}, no longer"
                    " among this driver's devices on this node (the record has none): not preparing it"
                    " again with other devices; kubelet retries, and it is prepared once the device is"
                    " back (a NIC probed late), else unprepare the claim to release it"
                )
        return _planned(ref, requests, found)

    def _rewrite(
        self, ref: ClaimRef, done: PreparedClaim, plan: _Plan, verbs: VerbsDevices | None
    ) -> tuple[PreparedClaim, ContainerGrant] | None:
        """On a worker thread, under the lock: the grant and spec of `plan`, then the claim's entry
        rewritten (atomically, synced: it names the new devices and this boot before any spec does),
        then the spec (atomically). A kill between the two leaves an entry of this boot whose spec the
        next prepare writes from it (`_respec`). None when `verbs` is None and the cache does not hold
        the plan's devices for its record. Raises VerbsUnresolvable, OSError (the entry then as it was,
        or already rewritten: either answers the next prepare right)."""
        if verbs is None:
            verbs = self.verbs.cached(plan.version, plan.rdma_devices)
            if verbs is None:
                return None
        whole, spec = _claim_spec(self.config.driver, ref.uid, plan, verbs)
        path = self._spec_path(done.uid)
        if _moved(done.spec_path, path):
            # Said before the entry is rewritten: once it names the new file, nothing names that one.
            _leave_stale(done.spec_path, done.uid, self.config.cdi_dir)
        prepared = dataclasses.replace(done, spec=spec, boot_id=self.boot_id, spec_path=path)
        self.checkpoint.put(prepared)
        cdi.write_new_spec(prepared.spec_path, cdi.spec_text(spec))
        return prepared, whole


class Preparer(_AnotherBoot):
    def __init__(
        self,
        config: DriverConfig,
        source: RecordSource,
        host: HostRoot,
        api: ClaimReader,
        checkpoint: Checkpoint,
        *,
        verbs: VerbsCache | None = None,
        boot_id: str | None = None,
    ) -> None:
        """`verbs`: this Preparer's own cache, never one shared with other code: a first prepare's
        worker thread looks devices up in it, safe only because every change to it is this Preparer's,
        made under the lock that thread's call holds (see `_read_and_write`). `boot_id`: this boot's
        (default: read through `host` once, here; see boot)."""
        self.config = config
        self.boot_id = boot.current(host) if boot_id is None else boot_id
        self.verbs = verbs or VerbsCache(host)
        self.source = source
        self.host = host
        self.api = api
        self.checkpoint = checkpoint
        # One claim at a time: the checkpoint and the spec directory change together.
        self._lock = asyncio.Lock()
        self.pools = Pools(source, config.functions)  # the record's pool, built off the loop per version
        self._templates = _Templates(config.driver)
        self.syncs = Syncs()
        self._waits = hops.Waits()  # the hops awaited under the lock, which a stop that gave up lets go
        cdi.remove_temporaries(config.cdi_dir, config.driver)  # a crash's leftovers; no write runs yet
        metrics.PREPARED_CLAIMS.set(len(checkpoint.claims))

    # --- prepare ----------------------------------------------------------------------------------------

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, Prepared]:
        out: dict[str, Prepared] = {}
        for ref in refs:
            if ref.uid in out:
                continue  # the same claim twice in one request: one entry answers both
            out[ref.uid] = await self._prepare_guarded(ref)
        return out

    async def _prepare_guarded(self, ref: ClaimRef) -> Prepared:
        try:
            async with self._lock:
                return Prepared(devices=await self._prepare(ref))
        except (ClaimError, ApiFailure, VerbsUnresolvable, ReadTimeout, BuildFailed, BuildTimeout) as exc:
            why = str(exc)
        except OSError as exc:
            why = f"writing the CDI spec or the checkpoint failed: {exc}"
        except Exception as exc:  # a claim must never take the server down
            log.exception("preparing a claim failed unexpectedly", extra={"claim": str(ref)})
            why = f"internal error: {exc!r}"
        metrics.PREPARES.labels("failed").inc()
        log.error("cannot prepare a claim", extra={"claim": str(ref), "why": why})
        return Prepared(error=why)

    async def _prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        ref.check()
        done = self.checkpoint.get(ref.uid)
        if done is not None:
            if (done.namespace, done.name) != (ref.namespace, ref.name):
                raise ClaimError(
                    f"claim uid {ref.uid} was prepared as {done.namespace}/{done.name}, not {ref}"
                )
            rewrote = False
            if done.spec_path and os.path.basename(done.spec_path) != cdi.spec_file_name(
                self.config.driver, ref.uid
            ):
                # As an unprepare removes no file but the claim's own: an entry naming another file (a
                # tampered or damaged checkpoint) must not make the driver write over it.
                raise ClaimError(
                    f"claim {ref}: its checkpoint entry names {done.spec_path!r} as its CDI spec, not the"
                    " claim's own spec file; not writing there (unprepare the claim to prepare it again)"
                )
            if done.spec_path:
                respec = await hops.finish(ref, hops.hop(self._respec, done), waits=self._waits)
                if respec is None:
                    return await self._prepare_again(ref, done)
                rewrote = respec
            if rewrote:
                log.warning("rewrote a prepared claim's missing CDI spec", extra={"claim": str(ref)})
            metrics.PREPARES.labels("repeated").inc()
            return done.devices
        # The record's pool (built off the loop once per record, `pool`), at least as new as the record
        # now, is taken here and handed to the thread.
        found = await self.pools.latest(self.pools.budget)
        gate = hops.WriteGate()
        hop = await self._recorded(ref, self._read_and_write, ref, found, gate, gate=gate)
        if hop.plan is None:
            metrics.PREPARES.labels("no_devices").inc()
            log.info("claim has none of this driver's devices on this node", extra={"claim": str(ref)})
            return ()
        written = hop.written
        if written is None:
            # The verbs devices were not cached for this record: read off the event loop within a budget,
            # one read in flight at most (a FIFO where an attribute belongs costs one thread, and fails
            # this claim, not the server), then the files in a second hop.
            plan = hop.plan
            verbs = await self.verbs.devices(plan.version, plan.rdma_devices)
            written = await self._recorded(ref, self._write, ref, plan, verbs)
        metrics.PREPARES.labels("prepared").inc()
        if log.isEnabledFor(logging.INFO):  # its fields cost more than the check, on kubelet's time
            log.info(
                "prepared a claim",
                extra={
                    "claim": str(ref),
                    "devices": list(hop.plan.requests),
                    "rdma_devices": [e.rdma_device for e in written.grant.endpoints],
                    "device_nodes": [n.path for n in written.grant.devices],
                    "cdi_spec": written.path,
                },
            )
        return written.devices

    def _read_and_write(
        self, ref: ClaimRef, found: tuple[int, dict[str, PoolDevice]] | None, gate: hops.WriteGate
    ) -> _Hop:
        """On a worker thread, the whole first prepare in one hop when it can be: the claim's read, its
        devices resolved in `found` (the record's pool, taken on the loop), and, when the verbs devices
        are cached for that record (the common case), the grant and both files (`_write`). Otherwise
        the plan goes back to the loop, whose budgeted verbs read this thread must not do.

        Thread safety: `found` is never changed once made (`pool.Pools` makes a new one per version); the
        grant and the spec are pure; `self.verbs` is this Preparer's own and only ever changed by its
        `devices`, awaited under the lock. The read and the plan need no lock: a call cancelled while
        they run walks away (`hops.WriteGate`), and the thread then stops before the lookup. Past
        `gate.write()` the lock is held until this thread ends (see `hops.finish`), so the cache's table
        cannot change under the lookup (one lstat per device node, no sysfs read)."""
        claim = self.api.get_claim(ref.namespace, ref.name)
        plan = self._plan(ref, claim, found)
        if plan is None:
            return _Hop(None, None)
        gate.write()  # from here the call holds the lock until this thread ends (see hops.WriteGate)
        verbs = self.verbs.cached(plan.version, list(plan.rdma_devices))
        if verbs is None:
            return _Hop(plan, None)
        return _Hop(plan, self._write(ref, plan, verbs))

    def _plan(
        self, ref: ClaimRef, claim: dict[str, Any] | None, found: tuple[int, dict[str, PoolDevice]] | None
    ) -> _Plan | None:
        """The claim's devices and requests in the record; None when it has none of ours. Raises
        ClaimError."""
        if claim is None:
            raise ClaimError(f"claim {ref} does not exist")
        allocated = allocated_devices(claim, ref, driver=self.config.driver, pool=self.config.pool)
        if not allocated:
            return None
        return _planned(ref, _by_device(allocated), found)

    def _write(self, ref: ClaimRef, plan: _Plan, verbs: VerbsDevices) -> _Written:
        """The grant (the device plugin's, pure), then the spec and the claim's entry (`_record`). On a
        worker thread. Raises VerbsUnresolvable, OSError."""
        whole, spec, text = self._templates.spec_and_text(ref.uid, plan, verbs, self.verbs.generation)
        path = cdi.spec_path(self.config.cdi_dir, self.config.driver, ref.uid)
        devices = tuple(
            PreparedDevice(
                request_names=tuple(reqs),
                pool=self.config.pool,
                device=device,
                cdi_device_ids=(cdi.device_id(self.config.driver, ref.uid, device),),
            )
            for device, reqs in plan.requests.items()
        )
        prepared = PreparedClaim(ref.uid, ref.namespace, ref.name, devices, path, spec, self.boot_id)
        return _Written(devices, whole, path, self._record(path, prepared, text))

    async def _recorded(
        self, ref: ClaimRef, fn: Callable[..., _T], *args: Any, gate: hops.WriteGate | None = None
    ) -> _T:
        """A hop that may write the claim's files: its entry's syncs follow kubelet's answer, started on
        the loop as the thread hands its outcome back (`hops.Running.settle`), so a call cancelled meanwhile
        leaves no recorded claim unsynced."""
        running = hops.hop(fn, *args, on_end=self._sync_recorded)
        return await hops.finish(ref, running, gate=gate, waits=self._waits)

    async def drain(self, timeout: float | None = None) -> None:
        """On stop, once the sockets are closed: wait for a prepare still writing (its call cancelled by
        kubelet's deadline or the server's stop, it holds the lock until its thread ends) and then for
        every sync started, its own included; `timeout` seconds for both at most. Without the lock, a
        stop could end while that write was still on its thread: its sync never started, or started
        after the drain. Past `timeout`, or cancelled, the drain gives this Preparer's hops up
        (`hops.Waits`): a call waiting on one stuck on a hung disk would hold the loop's end for good."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                await self._lock.acquire()
        except TimeoutError:
            log.error("stopping while a prepare is still writing its files; its entry may stay unsynced")
            self._waits.give_up()  # its call ends, the thread left running: the loop can close
            await self.syncs.drain(0.0)  # says what else is unsynced
            return
        except asyncio.CancelledError:  # the stop itself was cut short (the agent's bound on each part)
            self._waits.give_up()
            raise
        try:
            await self.syncs.drain(None if deadline is None else max(0.0, deadline - loop.time()))
        finally:
            self._lock.release()

    def _sync_recorded(self, done: _Recording) -> None:
        entry = done.entry
        if entry is not None:
            self.syncs.start(entry)
            # Here, not after the answer: a call cancelled mid-write still leaves its claim prepared.
            metrics.PREPARED_CLAIMS.set(len(self.checkpoint.claims))

    def _record(self, path: str, prepared: PreparedClaim, text: str | None = None) -> Reservation:
        """The claim's entry, then the spec, written (not synced: `syncs` does it after the answer).
        Raises OSError, leaving neither file: kubelet need never unprepare a claim whose prepare failed,
        and a spec left behind would stay in the runtime's directory for good.

        The entry first: a kill between the two files then leaves an entry without its spec (the next
        prepare answers from it and rewrites the spec; an unprepare removes both), never a spec that no
        entry names (kubelet, never answered, may never unprepare it, and nothing else would remove it)."""
        if text is None:  # `text`: the spec's encoding, when the caller has it
            text = cdi.spec_text(prepared.spec)  # encoded once, for the entry and the spec file
        entry = self.checkpoint.reserve(prepared.uid)  # a checkpoint that cannot be written fails first
        entry.commit(prepared, spec_text=text)  # releases the file itself when it fails
        try:
            cdi.write_new_spec(path, text)
        except BaseException:
            # Forgotten durably: the entry was written, and must not come back as a prepared claim.
            with contextlib.suppress(OSError):
                self.checkpoint.remove(prepared.uid)
            self.checkpoint.claims.pop(prepared.uid, None)
            raise
        return entry

    def _forget(self, uid: str, written: str) -> bool:
        """On a worker thread: remove the claim's spec from `--cdi-dir`, then its checkpoint entry
        (durably); whether a spec was there. `written`: the spec path its entry names ("" without one)."""
        path = self._spec_path(uid)
        if written and _moved(written, path):
            _leave_stale(written, uid, self.config.cdi_dir)
        removed = cdi.remove_spec(path)
        self.checkpoint.remove(uid)
        return removed

    # --- unprepare --------------------------------------------------------------------------------------

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """claim uid -> error ("" when unprepared)."""
        out: dict[str, str] = {}
        for ref in refs:
            if ref.uid in out:
                continue
            try:
                async with self._lock:
                    await self._unprepare(ref)
                out[ref.uid] = ""
            except (ClaimError, OSError) as exc:
                metrics.UNPREPARES.labels("failed").inc()
                log.error("cannot unprepare a claim", extra={"claim": str(ref), "why": str(exc)})
                out[ref.uid] = str(exc)
            except Exception as exc:
                log.exception("unpreparing a claim failed unexpectedly", extra={"claim": str(ref)})
                out[ref.uid] = f"internal error: {exc!r}"
        return out

    async def _unprepare(self, ref: ClaimRef) -> None:
        ref.check()
        done = self.checkpoint.get(ref.uid)
        # Only the claim's own spec, only under --cdi-dir: whatever path the entry names, the entry is
        # read back from a file, no proof of what lies there (see `_leave_stale`).
        written = "" if done is None else done.spec_path
        removed = await hops.finish(
            ref, hops.hop(self._forget, ref.uid, written), "unprepare", waits=self._waits
        )
        metrics.UNPREPARES.labels("removed" if removed else "absent").inc()
        metrics.PREPARED_CLAIMS.set(len(self.checkpoint.claims))
        log.info(
            "unprepared a claim",
            extra={"claim": str(ref), "spec_removed": removed, "was_prepared": done is not None},
        )
