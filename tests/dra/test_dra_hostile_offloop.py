"""Hostile tests of the DRA pool built off the event loop: a build that hangs, one that fails for ever
across record changes, one still running when the driver stops, one slow while many prepares arrive, and
a record flapping A -> B -> A while B's pool is being built. Through the real driver: kubelet's DRA calls
over gRPC on unix sockets, the embedded API over HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from dra_helpers import (
    DRIVER,
    NIC0,
    NIC0_BUS,
    NODE,
    POOL_THREAD,
    SLICES,
    Dirs,
    FailingBuilds,
    HeldDriver,
    HgxDriver,
    put_claim,
    ref,
    result,
    shutdown,
    slice_writes,
    watching,
    without,
)

from nodefabric_devicemanager.backoff import Backoff
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin.dra import cdi
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from nodefabric_operator.demo.kubeapi import RunningAPI

FAILED = "could not build the DRA pool"


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("nodefabric")]


async def test_a_pool_build_that_hangs_fails_the_prepare_within_its_budget_not_never(
    api: RunningAPI, hgx_spec: DevicesSpec, held_driver: HeldDriver
) -> None:
    """The new record's pool build never ends (a bug looping in it): the prepare answers with an error
    naming the build and its budget instead of waiting for kubelet's deadline, holding the claim lock
    meanwhile (another claim's unprepare answers), and the claim is prepared once the build ends."""
    async with held_driver(without(hgx_spec, NIC0_BUS), hgx_spec) as (r, held):
        plugin = await r.kubelet.wait_registered(DRIVER)
        r.driver.preparer.pools.budget = 0.3
        claim = put_claim(api, "hung", [result(NIC0)])
        other = put_claim(api, "other", [result(NIC0)])
        uid = claim["metadata"]["uid"]
        r.source.update(hgx_spec)
        assert await asyncio.to_thread(held.entered.wait, 30)
        out = (await plugin.prepare(ref(claim)))[uid]
        assert not held.release.is_set()  # answered while the build still hangs
        assert "DRA pool" in out.error and "did not finish within 0.3 s" in out.error
        assert (await plugin.unprepare(ref(other))) == {other["metadata"]["uid"]: ""}
        held.release.set()
        r.driver.preparer.pools.budget = 30.0
        out = (await plugin.prepare(ref(claim)))[uid]
        assert out.error == "" and [d.device_name for d in out.devices] == [NIC0]


async def test_a_record_change_starts_the_backoff_and_its_error_afresh(
    api: RunningAPI,
    hgx_spec: DevicesSpec,
    hgx_driver: HgxDriver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every pool build fails. A record's failures back off (here 0.02 s doubling) and say one Error;
    a new record is built at once, and its failure is tried again after the first step of the backoff,
    not after the step the old record's streak had reached, with an Error of its own (its cause may be
    another)."""
    caplog.set_level(logging.INFO, logger="nodefabric_deviceplugin")
    FailingBuilds(monkeypatch)
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        builds = r.driver.preparer.pools.builds
        builds.retry = Backoff(base=0.02, cap=600.0, jitter=False)
        while builds.failures < 7:  # the step reached: 0.02 * 2**6 = 1.28 s
            await asyncio.sleep(0.05)
        assert [r.version for r in caplog.records if r.getMessage().startswith(FAILED)] == [1]  # type: ignore[attr-defined]
        claim = put_claim(api, "failing", [result(NIC0)])
        r.source.update(without(hgx_spec, NIC0_BUS))
        out = (await plugin.prepare(ref(claim)))[claim["metadata"]["uid"]]
        assert "record version 2 failed" in out.error
        # A streak of its own, read on the loop where it is counted: the old record's had reached 7
        # failures (a wait of 1.28 s and more); the new one's wait is its own count's step, however many
        # of its 0.02 s tries a loaded machine let pass meanwhile.
        assert builds.failures < 7
        assert builds.retry_in <= 0.02 * 2 ** (builds.failures - 1)
        assert [r.version for r in caplog.records if r.getMessage().startswith(FAILED)] == [1, 2]  # type: ignore[attr-defined]


async def test_a_driver_stopped_mid_build_stops_cleanly_and_logs_no_error(
    api: RunningAPI, hgx_spec: DevicesSpec, held_driver: HeldDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """The driver is stopped while a pool build runs (and a prepare waits for it), and the build then
    fails: the stop ends without waiting for the build, and the failure of a build nobody wants any
    more is no Error; its thread ends with the build."""
    caplog.set_level(logging.INFO, logger="nodefabric_deviceplugin")
    async with held_driver(without(hgx_spec, NIC0_BUS), hgx_spec) as (r, held):
        plugin = await r.kubelet.wait_registered(DRIVER)
        claim = put_claim(api, "stopped", [result(NIC0)])
        r.source.update(hgx_spec)
        assert await asyncio.to_thread(held.entered.wait, 30)
        prepared = asyncio.create_task(plugin.prepare(ref(claim)))
        await asyncio.sleep(0.1)
        await shutdown(r)
        assert not held.release.is_set()
        held.fail.set()
        held.release.set()
        await asyncio.gather(prepared, return_exceptions=True)  # the test kubelet's channel closed
        builds = r.driver.preparer.pools.builds
        while builds.failures == 0 and any(t.name == POOL_THREAD for t in threading.enumerate()):
            await asyncio.sleep(0.02)
        for _ in range(5):
            await asyncio.sleep(0)  # the build's end reaches the loop
        assert not any(t.name == POOL_THREAD for t in threading.enumerate())
        assert errors(caplog) == []


async def test_fifty_prepares_during_a_slow_build_share_it(
    api: RunningAPI, hgx_spec: DevicesSpec, held_driver: HeldDriver
) -> None:
    """50 claims prepared (in 50 calls) while the new record's pool is being built: one build serves
    them all, and every claim resolves in the new record."""
    async with held_driver(without(hgx_spec, NIC0_BUS), hgx_spec) as (r, held):
        plugin = await r.kubelet.wait_registered(DRIVER)
        claims = [put_claim(api, f"c{i}", [result(NIC0)]) for i in range(50)]
        r.source.update(hgx_spec)
        assert await asyncio.to_thread(held.entered.wait, 30)
        calls = [asyncio.create_task(plugin.prepare(ref(c))) for c in claims]
        await asyncio.sleep(0.2)
        held.release.set()
        outs = [(await call)[c["metadata"]["uid"]] for call, c in zip(calls, claims, strict=True)]
        assert all(o.error == "" and [d.device_name for d in o.devices] == [NIC0] for o in outs)
        assert held.builds.count("held") == 1


async def test_a_record_back_to_a_while_b_builds_never_resolves_in_b(
    api: RunningAPI, hgx_spec: DevicesSpec, held_driver: HeldDriver
) -> None:
    """A -> B -> A: B (without NIC0) is being built when A comes back; a prepare after that resolves in
    A's pool (NIC0 there), never in B's, and B's pool, built late, never replaces A's."""
    b = without(hgx_spec, NIC0_BUS)
    async with held_driver(hgx_spec, b) as (r, held):
        plugin = await r.kubelet.wait_registered(DRIVER)
        claim = put_claim(api, "aba", [result(NIC0)])
        r.source.update(b)
        assert await asyncio.to_thread(held.entered.wait, 30)
        r.source.update(hgx_spec.model_copy())
        prepared = asyncio.create_task(plugin.prepare(ref(claim)))
        await asyncio.sleep(0.1)
        held.release.set()
        out = (await prepared)[claim["metadata"]["uid"]]
        assert out.error == "" and [d.device_name for d in out.devices] == [NIC0]
        version, pool = await r.driver.preparer.pools.latest() or (0, {})
        assert version == 3 and NIC0 in pool


# --- watch events of our own slices --------------------------------------------------------------------


def held(spec: Any) -> Any:
    """A slice's spec as compared here: a rewrite moves its pool's generation on."""
    pool = spec.get("pool")
    if isinstance(pool, dict):
        return {**spec, "pool": {k: v for k, v in pool.items() if k != "generation"}}
    return spec


async def settled(api: RunningAPI, r: Any, name: str, full: dict[str, Any]) -> None:
    """Until the slice's spec is `full` again and two poked syncs in a row have written nothing: the
    watch event may reach the driver after a sync poked here, so one quiet sync proves nothing."""
    publisher = r.driver.publisher
    quiet = 0
    async with asyncio.timeout(30):  # a deadlock breaker, not a measure
        while quiet < 2:
            writes, syncs = slice_writes(api), publisher.syncs
            publisher.poke()
            while publisher.syncs <= syncs:
                await asyncio.sleep(0.02)
            same = held(api.api.stored(SLICES, name)["spec"]) == held(full) and slice_writes(api) == writes
            quiet = quiet + 1 if same else 0


@pytest.mark.parametrize(
    "garbage",
    [{"devices": None}, {"devices": "not a list"}, {"pool": None, "devices": [None, 7, "x"]}, {"pool": 3}],
    ids=["devices-null", "devices-a-string", "pool-null-devices-junk", "pool-a-number"],
)
async def test_a_slice_of_ours_stored_with_garbage_is_rewritten_once_not_for_ever(
    api: RunningAPI, hgx_spec: DevicesSpec, hgx_driver: HgxDriver, garbage: Any
) -> None:
    """Someone stores one of our slices (still naming our node and driver, which the API holds immutable)
    with garbage the API would never hold: the watch event brings it, the sync sees drift and writes the
    slice back whole, once; a later sync writes nothing."""
    async with hgx_driver(hgx_spec, resync=3600) as r:
        await r.kubelet.wait_registered(DRIVER)
        name, stored = await watching(api, r)
        full = stored["spec"]
        api.api.put_object(SLICES, {**stored, "spec": {**stored["spec"], **garbage}}, validate=False)
        await settled(api, r, name, full)
        writes = slice_writes(api)
        await settled(api, r, name, full)
        assert slice_writes(api) == writes
        assert not r.task.done()


@pytest.mark.parametrize(
    "version",
    ["ours-as-int", "ours-upper", "1", "backwards-known"],
)
async def test_a_forged_or_stale_watch_event_of_our_slice_ends_in_no_loop(
    api: RunningAPI, hgx_spec: DevicesSpec, hgx_driver: HgxDriver, version: str
) -> None:
    """A watch event of our slice with garbage in it, carrying our own write's resourceVersion as an int,
    that version in another case, an old unknown one, or one we wrote earlier: the store still holds
    what we wrote; the driver writes nothing that sticks (a stale precondition is refused, the list then
    shows nothing to do), and keeps serving."""
    async with hgx_driver(hgx_spec, resync=3600) as r:
        await r.kubelet.wait_registered(DRIVER)
        name, stored = await watching(api, r)
        full, rv = stored["spec"], stored["metadata"]["resourceVersion"]
        forged: dict[str, Any] = {
            "ours-as-int": int(rv),
            "ours-upper": f"{rv}A".upper(),
            "1": "1",
            "backwards-known": str(int(rv) - 1),
        }
        event = {**stored, "metadata": {**stored["metadata"], "resourceVersion": forged[version]}}
        event["spec"] = {**stored["spec"], "devices": "garbage"}
        await api.api.hub(SLICES).put({"type": "MODIFIED", "object": event})
        await settled(api, r, name, full)
        writes = slice_writes(api)
        await settled(api, r, name, full)
        assert slice_writes(api) == writes
        assert held(api.api.stored(SLICES, name)["spec"]) == held(full)
        assert not r.task.done()


# --- spec paths a checkpoint entry may name ------------------------------------------------------------


def _others_spec(cdi_dir: str, own: str, other: str) -> str:
    return os.path.join(cdi_dir, other)


def _cdi_dir_itself(cdi_dir: str, own: str, other: str) -> str:
    return cdi_dir


def _very_long(cdi_dir: str, own: str, other: str) -> str:
    return os.path.join(cdi_dir, *(["d" * 200] * 21), own)  # over 4096 bytes, each part a legal name


def _newline(cdi_dir: str, own: str, other: str) -> str:
    return os.path.join(cdi_dir, "a\nb", own)


def _newline_in_name(cdi_dir: str, own: str, other: str) -> str:
    return os.path.join(cdi_dir, f"{own}\n{other}")


def _symlink_to_itself(cdi_dir: str, own: str, other: str) -> str:
    os.makedirs(cdi_dir, exist_ok=True)
    os.symlink(".", os.path.join(cdi_dir, "self"))
    return os.path.join(cdi_dir, "self", own)


@pytest.mark.parametrize(
    ("make_path", "refused"),
    [
        (_others_spec, True),
        (_cdi_dir_itself, True),
        (_very_long, False),
        (_newline, False),
        (_newline_in_name, True),
        (_symlink_to_itself, False),
    ],
    ids=[
        "another-claims-spec",
        "the-cdi-dir-itself",
        "over-4096-bytes",
        "newline-in-a-dir",
        "newline-in-name",
        "symlink-to-itself",
    ],
)
async def test_an_entrys_spec_path_never_touches_another_claims_spec(  # noqa: PLR0917 (fixtures)
    api: RunningAPI, dirs: Dirs, hgx_spec: DevicesSpec, hgx_driver: HgxDriver, make_path: Any, refused: bool
) -> None:
    """Claim X's entry (of an unknown boot) names a path a damaged checkpoint may hold; claim Y is
    prepared for real. X's repeated prepare either resolves X again under its own name or is refused
    naming the path; its unprepare removes X's own spec only; Y's spec is never written or removed."""
    x, y = put_claim(api, "x", [result(NIC0)]), put_claim(api, "y", [result(NIC0)])
    xuid, yuid = x["metadata"]["uid"], y["metadata"]["uid"]
    own_x, own_y = (os.path.join(dirs.cdi, cdi.spec_file_name(DRIVER, u)) for u in (xuid, yuid))
    named = make_path(dirs.cdi, os.path.basename(own_x), os.path.basename(own_y))
    device = PreparedDevice(("nic",), NODE, NIC0, (cdi.device_id(DRIVER, xuid, NIC0),))
    entry = PreparedClaim(xuid, "ml", "x", (device,), named, {"cdiVersion": "0.5.0"}, "")
    Checkpoint(dirs.config().checkpoint_path).put(entry)
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        assert (await plugin.prepare(ref(y)))[yuid].error == ""
        y_spec = Path(own_y).read_bytes()
        out = (await plugin.prepare(ref(x)))[xuid]
        if refused:
            assert "not the claim's own spec file" in out.error
        else:
            assert out.error == "" and [d.device_name for d in out.devices] == [NIC0]
            assert json.loads(Path(own_x).read_bytes())["devices"][0]["name"].endswith(NIC0)
        assert Path(own_y).read_bytes() == y_spec
        assert await plugin.unprepare(ref(x)) == {xuid: ""}
        assert not os.path.exists(own_x) and Path(own_y).read_bytes() == y_spec
        assert os.path.isdir(dirs.cdi) and xuid not in r.driver.checkpoint.claims
        assert await plugin.unprepare(ref(y)) == {yuid: ""}
        assert not os.path.exists(own_y)
