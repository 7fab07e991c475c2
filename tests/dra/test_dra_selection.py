"""The DRA driver offers what the device plugin's selectors give each family: whole functions as
`exclusive` selects them, VFs as `partitioned` does; the DeviceClasses match what is published."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from dra_helpers import Dirs, HgxDriver, live_slices

from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin.dra.devices import pool_devices
from nodefabric_deviceplugin.dra.flags import config_from
from nodefabric_deviceplugin.selection import SelectionError, parse
from nodefabric_operator.demo.kubeapi import RunningAPI


async def wait_until(predicate: Any, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


async def test_the_slices_follow_the_selectors(
    api: RunningAPI, dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    pool = pool_devices(hgx_spec)
    pf = next(d for d in pool if d.role.value == "pf" and d.endpoint.netdevs)
    vf = next(d for d in pool if d.role.value == "vf")
    selection = parse(
        {
            "exclusive": [{"ifNames": [pf.endpoint.netdevs[0]]}],
            "shared": [{"ifNames": ["not-" + pf.endpoint.netdevs[0]]}],
            "partitioned": [{"rdmaDevices": [vf.endpoint.rdma_device]}],
        }
    )
    async with hgx_driver(hgx_spec, config=dirs.config(selection=selection)) as r:
        await wait_until(lambda: r.driver.publisher.syncs >= 1)
        (obj,) = live_slices(api)
        assert sorted(d["name"] for d in obj["spec"]["devices"]) == sorted([pf.name, vf.name])


async def test_without_selectors_every_device_is_published(
    api: RunningAPI, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    async with hgx_driver(hgx_spec) as r:
        await wait_until(lambda: r.driver.publisher.syncs >= 1)
        (obj,) = live_slices(api)
        assert len(obj["spec"]["devices"]) == len([d for d in pool_devices(hgx_spec) if d.allocatable])


def test_draplugin_refuses_an_overlapping_selection(tmp_path: Path, dirs: Dirs) -> None:
    import argparse

    path = tmp_path / "sel.yaml"
    path.write_text("exclusive:\n  - vendors: ['15b3']\nshared:\n  - ifNames: [ens2f0]\n")
    args = argparse.Namespace(
        node_name="gpu-1",
        domain="gpustack.ai",
        dra_plugin_dir=dirs.plugin,
        dra_registry_dir=dirs.registry,
        dra_cdi_dir=dirs.cdi,
        rdma_selectors=str(path),
    )
    with pytest.raises(SelectionError, match="overlap"):
        config_from(args)
