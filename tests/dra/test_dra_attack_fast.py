"""A hostile tester's findings on the first prepare's short cuts (h/drafast): each test failed before its
fix, through the Preparer kubelet's calls reach, over the fixture host."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from dra_helpers import DRIVER, NIC0, Dirs, HgxDriver, put_claim, ref, result

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra import cdi
from nodefabric_deviceplugin.dra.checkpoint import Checkpoint
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_deviceplugin.dra.prepare import Preparer
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_operator.demo.kubeapi import RunningAPI

GOOD = ClaimRef("ml", "0b6a3c1e-93f4-4f0e-8d7b-5a3f1e2c4d5e", "good")
BAD = ClaimRef("ml", "1c7b4d2f-a405-4f1f-9e8c-6b4f2f3d5e6f", "bad")


class Api:
    """The claim `good` allocated one NIC; reading `bad` raises `exc` on the hop's thread."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        if name == BAD.name:
            raise self.exc
        return {
            "metadata": {"uid": GOOD.uid},
            "status": {"allocation": {"devices": {"results": [result(NIC0)]}}},
        }


@pytest.mark.parametrize(
    "exc",
    [
        SystemExit(3),
        KeyboardInterrupt(),
        GeneratorExit(),
        asyncio.CancelledError(),  # what a concurrent future's result() raises once it was cancelled
        BaseException("odd"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_a_thread_raising_a_base_exception_fails_that_claim_only(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec, exc: BaseException
) -> None:
    """Handed to the call as it was, a SystemExit or KeyboardInterrupt from the thread stopped the
    event loop (the whole driver), and a CancelledError passed for the call's own cancellation: the
    request ended there, its other claims never prepared. Now it is that claim's error."""
    config = dirs.config()
    p = Preparer(
        config, RecordSource(hgx_spec), hgx_host[0].host, Api(exc), Checkpoint(config.checkpoint_path)
    )
    out = await asyncio.wait_for(p.prepare([BAD, GOOD]), 10)
    assert type(exc).__name__ in out[BAD.uid].error and not out[BAD.uid].devices
    assert out[GOOD.uid].error == "" and out[GOOD.uid].devices
    assert cdi.read_spec(cdi.spec_path(dirs.cdi, DRIVER, GOOD.uid)) is not None
    assert set(p.checkpoint.claims) == {GOOD.uid}
    await p.syncs.drain(5)


class _Unprintable(StopIteration):
    def __repr__(self) -> str:
        raise ValueError("no repr")


async def test_a_thread_raising_what_cannot_be_printed_still_answers_and_lets_the_claim_go(
    dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    """The thread words what it wraps: a repr that raised there escaped the thread before it handed
    anything back, and the call waited for good, holding the lock every later claim needs."""
    config = dirs.config()
    p = Preparer(
        config,
        RecordSource(hgx_spec),
        hgx_host[0].host,
        Api(_Unprintable()),
        Checkpoint(config.checkpoint_path),
    )
    out = await asyncio.wait_for(p.prepare([BAD, GOOD]), 10)
    assert "_Unprintable" in out[BAD.uid].error and out[GOOD.uid].devices
    await p.syncs.drain(5)


@pytest.mark.parametrize("exc", [SystemExit(3), asyncio.CancelledError()], ids=lambda e: type(e).__name__)
async def test_over_grpc_a_read_raising_a_base_exception_fails_its_claim_and_the_driver_serves_on(
    api: RunningAPI,
    *,
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
    monkeypatch: pytest.MonkeyPatch,
    exc: BaseException,
) -> None:
    """kubelet's NodePrepareResources over the plugin socket, the claims read from the embedded API: a
    SystemExit stopped the driver's loop, a CancelledError ended the whole request as cancelled."""
    real = DraApi.get_claim

    def get_claim(self: DraApi, namespace: str, name: str) -> dict[str, Any] | None:
        if name == "bad":
            raise exc
        return real(self, namespace, name)

    monkeypatch.setattr(DraApi, "get_claim", get_claim)
    good = put_claim(api, "good", [result(NIC0)])
    bad = put_claim(api, "bad", [result(NIC0)])
    async with hgx_driver(hgx_spec) as running:
        plugin = await running.kubelet.wait_registered(DRIVER)
        answer = await asyncio.wait_for(plugin.prepare(ref(bad), ref(good)), 10)
        assert type(exc).__name__ in answer[bad["metadata"]["uid"]].error
        assert answer[good["metadata"]["uid"]].error == "" and answer[good["metadata"]["uid"]].devices
        again = await asyncio.wait_for(plugin.prepare(ref(good)), 10)
        assert again == {good["metadata"]["uid"]: answer[good["metadata"]["uid"]]}
        assert not running.task.done()
