"""The driver end to end: registered by a test kubelet's plugin watcher over a real unix socket, prepare and
unprepare over the DRA socket in both API versions, ResourceSlices and ResourceClaims in the embedded API."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
from dra_helpers import (
    CLAIMS,
    DRIVER,
    NIC0,
    NODE,
    SLICES,
    Dirs,
    HgxDriver,
    Running,
    client,
    driving,
    live_slices,
    put_claim,
    ref,
    result,
    shutdown,
    slice_writes,
    start_driver,
)
from prometheus_client import REGISTRY

from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.models import DevicesSpec, LinkState, LinkVerdict
from nodefabric_devicemanager.nodeclient import ApiFailure
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.allocate import grant
from nodefabric_deviceplugin.dra import cdi
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_deviceplugin.dra.publish import SlicePublisher
from nodefabric_deviceplugin.resources import Family, view
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_deviceplugin.testing.drakubelet import DraKubelet
from nodefabric_deviceplugin.verbs import read_devices
from nodefabric_operator.demo.kubeapi import RunningAPI

VF1 = "pci-0000-e0-00-1"  # mlx5_8, the first VF of NIC 7


@pytest.fixture
async def running(hgx_driver: HgxDriver, hgx_spec: DevicesSpec) -> Any:
    async with hgx_driver(hgx_spec) as r:
        await r.kubelet.wait_registered(DRIVER)
        yield r


def link_failed(spec: DevicesSpec, rdma_device: str) -> DevicesSpec:
    broken = spec.model_copy(deep=True)
    (iface,) = [i for i in broken.interfaces if i.rdma_device == rdma_device]
    iface.link = LinkVerdict(state=LinkState.FAILED, reason=f"{rdma_device}: port 1 state '1: DOWN'")
    return broken


def spec_files(dirs: Dirs) -> list[str]:
    return sorted(os.listdir(dirs.cdi)) if os.path.isdir(dirs.cdi) else []


async def wait_until(predicate: Any, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


# --- registration -----------------------------------------------------------------------------------------


async def test_registers_through_the_plugin_watcher_with_both_versions(running: Running, dirs: Dirs) -> None:
    registered = running.kubelet.plugins[DRIVER]
    assert registered.socket == f"{dirs.registry}/{DRIVER}-reg.sock"
    info = registered.info
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == f"{dirs.plugin}/{DRIVER}/dra.sock"
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert registered.client.version.service == "v1.DRAPlugin"  # a current kubelet picks the newest
    await asyncio.wait_for(running.driver.registration.registered.wait(), 5)  # kubelet told it so
    assert running.driver.readiness() == (True, f"DRA driver: registered as {DRIVER}")


async def test_a_refused_registration_is_logged_and_not_taken_as_registered(
    dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    ancient = DraKubelet(dirs.registry, services=("v1alpha4.DRAPlugin",))
    async with hgx_driver(hgx_spec, kubelet=ancient) as r:
        assert "none of" in await ancient.wait_refused()
        await wait_until(lambda: bool(r.driver.registration.last_error))
        assert not r.driver.registration.registered.is_set()
        ready, why = r.driver.readiness()
        assert not ready and why.startswith("DRA driver: not registered with kubelet (kubelet refused it: ")
        assert "none of" in why


# --- ResourceSlices -----------------------------------------------------------------------------------------


async def test_publishes_the_pool_once_and_then_costs_no_writes(
    running: Running, api: RunningAPI, hgx_spec: DevicesSpec
) -> None:
    await wait_until(lambda: running.driver.publisher.syncs >= 1)
    (obj,) = live_slices(api)
    assert obj["metadata"]["name"] == f"{NODE}-{DRIVER}-0"
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert obj["metadata"]["ownerReferences"][0]["uid"] == api.api.stored("v1/nodes", NODE)["metadata"]["uid"]
    spec = obj["spec"]
    assert (spec["driver"], spec["nodeName"]) == (DRIVER, NODE)
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert len(spec["devices"]) == 11
    writes = slice_writes(api)
    assert writes == 1
    # The same record again (every agent pass delivers it), and a poke: decided in memory, no request.
    requests = api.count()
    running.source.update(hgx_spec.model_copy(deep=True))
    running.driver.publisher.poke()
    await wait_until(lambda: running.driver.publisher.syncs >= 2)
    assert slice_writes(api) == writes
    assert api.count() == requests
    assert api.count("GET", SLICES, "list") == 1


async def test_a_failed_link_leaves_the_pool_at_the_next_generation(
    running: Running, api: RunningAPI, hgx_spec: DevicesSpec
) -> None:
    await wait_until(lambda: running.driver.publisher.syncs >= 1)
    running.source.update(link_failed(hgx_spec, "mlx5_0"))
    await wait_until(lambda: live_slices(api)[0]["spec"]["pool"]["generation"] == 2)
    names = [d["name"] for d in live_slices(api)[0]["spec"]["devices"]]
    assert NIC0 not in names and len(names) == 10
    running.source.update(hgx_spec)  # the link came back
    await wait_until(lambda: live_slices(api)[0]["spec"]["pool"]["generation"] == 3)
    assert NIC0 in [d["name"] for d in live_slices(api)[0]["spec"]["devices"]]


async def test_slices_deleted_behind_our_back_come_back_and_other_nodes_are_untouched(
    api: RunningAPI, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    other = {
        "metadata": {"name": f"gpu-9-{DRIVER}-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "gpu-9",
            "pool": {"name": "gpu-9", "generation": 7, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    api.api.put_object(SLICES, other)
    async with hgx_driver(hgx_spec) as r:
        await wait_until(lambda: any(o["spec"]["nodeName"] == NODE for o in live_slices(api)))
        await wait_until(lambda: r.driver.publisher.watch.connects >= 1)
        # What kubelet does when it starts, or when the driver was gone for a while: the watch tells us
        # (no resync comes within the test).
        name = f"{NODE}-{DRIVER}-0"
        before = api.api.stored(SLICES, name)["metadata"]["uid"]
        await asyncio.to_thread(client(api).request, "DELETE", f"/apis/{SLICES}/{name}")
        # Not "gone, then back": the watch may bring it back before a look in between.
        await wait_until(
            lambda: any(
                o["metadata"]["name"] == name and o["metadata"]["uid"] != before for o in live_slices(api)
            )
        )
        assert api.api.stored(SLICES, other["metadata"]["name"])["spec"]["pool"]["generation"] == 7


async def test_api_outages_are_retried_and_nothing_is_published_before_the_first_record(
    api: RunningAPI, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    async with hgx_driver(None) as r:
        await asyncio.sleep(0.5)
        assert live_slices(api) == [] and not os.path.exists(r.driver.config.registration_socket)
        assert r.driver.readiness() == (False, "DRA driver: waiting for the first device record")
        api.api.fail_next(2, 503)
        r.source.update(hgx_spec)
        await wait_until(lambda: len(live_slices(api)) == 1)
        assert live_slices(api)[0]["spec"]["pool"]["generation"] == 1


# --- prepare and unprepare ---------------------------------------------------------------------------


async def test_prepare_writes_one_cdi_spec_with_the_device_plugins_grant(
    running: Running,
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_spec: DevicesSpec,
) -> None:
    claim = put_claim(api, "pair", [result(NIC0, request="nic"), result(VF1, request="vf")])
    uid = claim["metadata"]["uid"]
    answer = await running.kubelet.plugin(DRIVER).prepare(ref(claim))
    assert list(answer) == [uid]
    entry = answer[uid]
    assert entry.error == ""
    kind = f"{DRIVER}/nic"
    assert [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in entry.devices
    ] == [
        (["nic"], NODE, NIC0, [f"{kind}={uid}-{NIC0}"]),
        (["vf"], NODE, VF1, [f"{kind}={uid}-{VF1}"]),
    ]
    assert spec_files(dirs) == [f"{DRIVER}-nic_{uid}.json"]
    spec = json.loads(Path(dirs.cdi, spec_files(dirs)[0]).read_text())
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == kind
    nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}
    assert nodes == {
        f"{uid}-{NIC0}": ["/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"],
        f"{uid}-{VF1}": ["/dev/infiniband/uverbs8", "/dev/infiniband/rdma_cm"],
    }
    assert spec["containerEdits"] == {"env": ["NCCL_IB_HCA==mlx5_0,mlx5_8"]}
    # The same as a device-plugin Allocate of the same two endpoints, one token from each family.
    host = hgx_host[0].host
    whole, parts = view(hgx_spec, Family.EXCLUSIVE), view(hgx_spec, Family.PARTITIONED)
    endpoints = [whole.by_id["0000:1c:00.0"].endpoint, parts.by_id["0000:e0:00.1"].endpoint]
    dp = [grant([e], read_devices(host, [e.rdma_device])) for e in endpoints]
    granted = {n.path for g in dp for n in g.devices}
    assert granted == {p for paths in nodes.values() for p in paths}


async def test_prepare_over_v1beta1_for_a_kubelet_that_knows_only_it(
    api: RunningAPI, dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    older = DraKubelet(dirs.registry, services=("v1beta1.DRAPlugin",))
    async with hgx_driver(hgx_spec, kubelet=older):
        plugin = await older.wait_registered(DRIVER)
        assert plugin.version.service == "v1beta1.DRAPlugin"
        claim = put_claim(api, "one", [result(NIC0)])
        answer = await plugin.prepare(ref(claim))
        uid = claim["metadata"]["uid"]
        assert (
            type(answer[uid]).DESCRIPTOR.full_name
            == "k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourceResponse"
        )
        assert [d.device_name for d in answer[uid].devices] == [NIC0]
        assert await plugin.unprepare(ref(claim)) == {uid: ""}
        assert spec_files(dirs) == []


async def test_prepare_twice_gives_one_spec_and_the_same_answer(
    running: Running, api: RunningAPI, dirs: Dirs
) -> None:
    claim = put_claim(api, "twice", [result(NIC0)])
    plugin = running.kubelet.plugin(DRIVER)
    first = await plugin.prepare(ref(claim))
    reads = api.count("GET", CLAIMS)
    second = await plugin.prepare(ref(claim))
    assert first == second
    assert len(spec_files(dirs)) == 1
    assert api.count("GET", CLAIMS) == reads  # answered from the checkpoint
    # A spec the runtime directory lost (a reboot empties /var/run) is written again.
    os.unlink(Path(dirs.cdi, spec_files(dirs)[0]))
    assert await plugin.prepare(ref(claim)) == first
    assert len(spec_files(dirs)) == 1
    # The spec is not fsynced (the checkpoint entry holds it): a power loss may leave it torn or empty,
    # and kubelet's next prepare writes it whole again.
    spec = Path(dirs.cdi, spec_files(dirs)[0])
    whole = spec.read_bytes()
    # So is one that is no spec at all, nested past what json can decode (it raises RecursionError).
    for torn in (whole[: len(whole) // 2], b"", b"[" * 100_000):
        spec.write_bytes(torn)
        assert await plugin.prepare(ref(claim)) == first
        assert spec.read_bytes() == whole
    assert api.count("GET", CLAIMS) == reads


async def test_a_claim_whose_uid_differs_is_refused(running: Running, api: RunningAPI, dirs: Dirs) -> None:
    claim = put_claim(api, "recreated", [result(NIC0)])
    stale = ClaimRef("ml", str(uuid.uuid4()), "recreated")
    answer = await running.kubelet.plugin(DRIVER).prepare(stale)
    assert "deleted and recreated" in answer[stale.uid].error
    assert not answer[stale.uid].devices
    assert spec_files(dirs) == []
    assert claim["metadata"]["uid"] not in answer


async def test_another_drivers_devices_are_ignored(running: Running, api: RunningAPI, dirs: Dirs) -> None:
    gpu = result("gpu-0", request="gpu", driver="gpu.nvidia.com")
    mixed = put_claim(api, "gpu-and-nic", [gpu, result(NIC0)])
    only_gpu = put_claim(api, "gpu-only", [gpu])
    answer = await running.kubelet.plugin(DRIVER).prepare(ref(mixed), ref(only_gpu))
    assert [d.device_name for d in answer[mixed["metadata"]["uid"]].devices] == [NIC0]
    assert answer[only_gpu["metadata"]["uid"]].error == ""
    assert not answer[only_gpu["metadata"]["uid"]].devices
    assert spec_files(dirs) == [f"{DRIVER}-nic_{mixed['metadata']['uid']}.json"]
    # A claim with none of our devices is not recorded: its reserved file is gone.
    assert os.listdir(running.driver.checkpoint.directory) == [f"{mixed['metadata']['uid']}.json"]


async def test_every_claim_gets_an_entry_and_a_bad_one_fails_alone(
    running: Running, api: RunningAPI, dirs: Dirs
) -> None:
    good = put_claim(api, "good", [result(NIC0)])
    pending = put_claim(api, "pending", None)
    elsewhere = put_claim(api, "elsewhere", [result(VF1, pool="gpu-9")])
    phantom = put_claim(api, "phantom", [result("pci-0000-99-00-0")])
    missing = ClaimRef("ml", str(uuid.uuid4()), "missing")
    hostile = [
        ClaimRef("ml", "../../etc/passwd", "x"),
        ClaimRef("ML", str(uuid.uuid4()), "x"),
        ClaimRef("", "", ""),
    ]
    refs = [ref(good), ref(pending), ref(elsewhere), ref(phantom), missing, *hostile]
    answer = await running.kubelet.plugin(DRIVER).prepare(*refs)
    assert sorted(answer) == sorted({r.uid for r in refs})
    errors = {uid: e.error for uid, e in answer.items()}
    assert errors[good["metadata"]["uid"]] == ""
    assert "not allocated" in errors[pending["metadata"]["uid"]]
    assert "pool 'gpu-9'" in errors[elsewhere["metadata"]["uid"]]
    assert "no device pci-0000-99-00-0" in errors[phantom["metadata"]["uid"]]
    assert "does not exist" in errors[missing.uid]
    assert "invalid claim uid" in errors["../../etc/passwd"]
    assert "invalid claim namespace" in errors[hostile[1].uid]
    assert "invalid claim uid" in errors[""]
    assert spec_files(dirs) == [f"{DRIVER}-nic_{good['metadata']['uid']}.json"]
    # Every claim's checkpoint file was reserved while it was read; only the prepared one's stays.
    directory = running.driver.checkpoint.directory
    assert os.listdir(directory) == [f"{good['metadata']['uid']}.json"]
    # The server is still answering.
    assert (await running.kubelet.plugin(DRIVER).unprepare(ref(good))) == {good["metadata"]["uid"]: ""}


async def test_a_reference_of_megabytes_fails_alone_and_the_answer_still_reaches_kubelet(
    running: Running, api: RunningAPI, dirs: Dirs, caplog: pytest.LogCaptureFixture
) -> None:
    # A 2.1 MiB uid passes kubelet's 4 MiB limit on the way in; echoed back whole in its error, beside
    # its own key, the answer would pass it on the way out, and kubelet would lose every claim's entry.
    # Logged whole, each of kubelet's retries wrote a line of megabytes.
    good = put_claim(api, "good", [result(NIC0)])
    huge = ClaimRef("ml", "u" * (2100 << 10), "x")
    name = ClaimRef("ml", str(uuid.uuid4()), "n" * (2100 << 10))
    space = ClaimRef("s" * (2100 << 10), str(uuid.uuid4()), "x")
    plugin = running.kubelet.plugin(DRIVER)
    caplog.set_level(logging.ERROR, logger="nodefabric_deviceplugin.dra")
    for hostile in (huge, name, space):
        caplog.clear()
        answer = await plugin.prepare(ref(good), hostile)
        assert answer[good["metadata"]["uid"]].error == ""
        assert "invalid claim" in answer[hostile.uid].error and len(answer[hostile.uid].error) < 1024
        [logged] = [r for r in caplog.records if r.getMessage() == "cannot prepare a claim"]
        assert f"({2100 << 10} characters)" in logged.__dict__["claim"]
        assert len(logged.__dict__["claim"]) < 1024 and len(logged.__dict__["why"]) < 1024
        assert (await plugin.unprepare(ref(good), hostile))[good["metadata"]["uid"]] == ""


async def test_a_claim_whose_devices_link_failed_since_allocation_is_still_prepared(
    running: Running, api: RunningAPI, hgx_spec: DevicesSpec
) -> None:
    running.source.update(link_failed(hgx_spec, "mlx5_0"))
    claim = put_claim(api, "placed-before", [result(NIC0)])
    answer = await running.kubelet.plugin(DRIVER).prepare(ref(claim))
    assert answer[claim["metadata"]["uid"]].error == ""


async def test_unprepare_after_a_restart_removes_the_right_spec(
    api: RunningAPI, dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    keep = put_claim(api, "keep", [result(VF1)])
    drop = put_claim(api, "drop", [result(NIC0)])
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        await plugin.prepare(ref(keep), ref(drop))
    assert len(spec_files(dirs)) == 2
    # A new process, a new kubelet connection; the claim objects are gone from the API by now.
    api.api.objects.clear()
    api.api.put_object("v1/nodes", {"metadata": {"name": NODE}})
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        assert await plugin.unprepare(ref(drop)) == {drop["metadata"]["uid"]: ""}
        assert spec_files(dirs) == [f"{DRIVER}-nic_{keep['metadata']['uid']}.json"]
        assert list(r.driver.checkpoint.claims) == [keep["metadata"]["uid"]]
        # A prepared claim is answered from the checkpoint though its object is gone.
        again = await plugin.prepare(ref(keep))
        assert [d.device_name for d in again[keep["metadata"]["uid"]].devices] == [VF1]
        # Unpreparing a claim never prepared here is success.
        never = ClaimRef("ml", str(uuid.uuid4()), "never")
        assert await plugin.unprepare(never) == {never.uid: ""}


async def test_unprepare_after_the_cdi_dir_moved_leaves_the_old_spec_where_it_was(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
) -> None:
    """Only files inside the current --cdi-dir are removed: the spec in the earlier one is left (said),
    the claim is forgotten."""
    claim = put_claim(api, "moved", [result(NIC0)])
    async with hgx_driver(hgx_spec) as r:
        await (await r.kubelet.wait_registered(DRIVER)).prepare(ref(claim))
    old = dirs.cdi
    moved = Dirs(plugin=dirs.plugin, registry=dirs.registry, cdi=f"{dirs.cdi}-new")
    async with driving(api, moved, hgx_host[0].host, hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        assert await plugin.unprepare(ref(claim)) == {claim["metadata"]["uid"]: ""}
        assert os.listdir(old) == [f"{DRIVER}-nic_{claim['metadata']['uid']}.json"]
        assert r.driver.checkpoint.claims == {}
        assert not os.path.exists(moved.cdi) or os.listdir(moved.cdi) == []


async def _prepared_by_a_driver_that_stops(
    api: RunningAPI, dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec, name: str
) -> tuple[dict[str, Any], Any, str, bytes]:
    """A one-device claim prepared by a driver that then stops: the claim, kubelet's answer, its spec's
    file name and the spec's bytes as written."""
    claim = put_claim(api, name, [result(NIC0)])
    uid = claim["metadata"]["uid"]
    async with hgx_driver(hgx_spec) as r:
        first = (await (await r.kubelet.wait_registered(DRIVER)).prepare(ref(claim)))[uid]
    spec_name = f"{DRIVER}-nic_{uid}.json"
    return claim, first, spec_name, Path(dirs.cdi, spec_name).read_bytes()


async def test_a_repeated_prepare_after_the_cdi_dir_moved_writes_the_spec_in_the_new_one(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
) -> None:
    """`--cdi-dir` changed between restarts: kubelet prepares a held claim again (its own restart, a
    pod's). The runtime now reads the new directory, so the spec lands there, and the entry names the
    new file (so a later unprepare, or a later move, finds it). The stale one in the old directory is
    left, said: only files inside the current --cdi-dir are removed."""
    claim, first, name, written = await _prepared_by_a_driver_that_stops(
        api, dirs, hgx_driver, hgx_spec, "relocated"
    )
    uid = claim["metadata"]["uid"]
    moved = Dirs(plugin=dirs.plugin, registry=dirs.registry, cdi=f"{dirs.cdi}-new")
    async with driving(api, moved, hgx_host[0].host, hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        reads = api.count("GET", CLAIMS)
        assert (await plugin.prepare(ref(claim)))[uid] == first
        assert api.count("GET", CLAIMS) == reads  # still answered from the entry
        assert Path(moved.cdi, name).read_bytes() == written
        assert os.listdir(dirs.cdi) == [name]
        assert r.driver.checkpoint.claims[uid].spec_path == os.path.join(moved.cdi, name)
    async with driving(api, moved, hgx_host[0].host, hgx_spec) as r:
        assert r.driver.checkpoint.claims[uid].spec_path == os.path.join(moved.cdi, name)  # durably
        plugin = await r.kubelet.wait_registered(DRIVER)
        assert await plugin.unprepare(ref(claim)) == {uid: ""}
        assert os.listdir(moved.cdi) == [] and os.listdir(dirs.cdi) == [name]


@pytest.mark.parametrize("uid", ["6a3c1e0e-3b5f-4d1e-9a0b-2f4c8d7e6f10", 'ünï"\\cödé', "x" * 300])
def test_a_spec_template_gives_exactly_the_spec_and_the_text_a_fresh_build_gives(uid: str) -> None:
    paths = ["/dev/infiniband/uverbs3", "/dev/infiniband/rdma_cm"]
    for envs in ({"NCCL_IB_HCA": "=mlx5_3"}, {}):
        template = cdi.SpecTemplate.of(DRIVER, NIC0, paths, envs)
        assert template is not None
        built = cdi.build_spec(DRIVER, uid, {NIC0: paths}, envs)
        assert template.spec(uid) == built and template.text(uid) == cdi.spec_text(built)
    # A spec whose own strings hold the template's marker is not templated (built each time instead).
    assert cdi.SpecTemplate.of(DRIVER, NIC0, ["/dev/\u2063uid\u2063"], {}) is None


async def test_first_prepares_of_one_device_follow_its_verbs_node_renumbered_between_them(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
) -> None:
    """A first prepare's spec comes from its device's template, made once per record and verbs table:
    byte for byte what building the spec gives, and never the old node once the host renumbered it."""
    b = hgx_host[0]
    async with hgx_driver(hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        specs: dict[str, str] = {}
        for name in ("tmpl-a", "tmpl-b", "tmpl-c"):
            if name == "tmpl-c":  # mlx5_0's verbs node renumbered (a driver reload), the record the same
                bus = "0000:1c:00.0"
                shutil.rmtree(b.functions[bus] / "infiniband_verbs" / "uverbs0")
                os.unlink(b.root / "sys/class/infiniband_verbs/uverbs0")
                os.unlink(b.root / "dev/infiniband/uverbs0")
                b.verbs(bus, "mlx5_0", 9)
            claim = put_claim(api, name, [result(NIC0)])
            uid = claim["metadata"]["uid"]
            assert (await plugin.prepare(ref(claim)))[uid].error == ""
            specs[name] = Path(dirs.cdi, f"{DRIVER}-nic_{uid}.json").read_text()
            node = "uverbs9" if name == "tmpl-c" else "uverbs0"
            built = cdi.build_spec(
                DRIVER,
                uid,
                {NIC0: [f"/dev/infiniband/{node}", "/dev/infiniband/rdma_cm"]},
                {"NCCL_IB_HCA": "=mlx5_0"},
            )
            assert specs[name] == cdi.spec_text(built) + "\n"
            assert r.driver.checkpoint.claims[uid].spec == built


async def test_a_cdi_dir_renamed_to_another_path_of_the_same_directory_keeps_the_spec(
    api: RunningAPI,
    dirs: Dirs,
    hgx_host: tuple[SysfsBuilder, Libraries],
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
) -> None:
    """`--cdi-dir` changed to another path of the same directory (/var/run/cdi and /run/cdi: /var/run is
    a symlink to /run on most distributions). Read as a move, the spec was written "there" (the same
    file), then the "stale" one removed: the claim was answered prepared with no spec on disk, and the
    runtime failed the container for a CDI device it could not find."""
    claim, first, name, written = await _prepared_by_a_driver_that_stops(
        api, dirs, hgx_driver, hgx_spec, "aliased"
    )
    uid = claim["metadata"]["uid"]
    alias = f"{dirs.cdi}-alias"
    os.symlink(dirs.cdi, alias)
    aliased = Dirs(plugin=dirs.plugin, registry=dirs.registry, cdi=alias)
    async with driving(api, aliased, hgx_host[0].host, hgx_spec) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        assert (await plugin.prepare(ref(claim)))[uid] == first
        assert Path(alias, name).read_bytes() == written
        assert await plugin.unprepare(ref(claim)) == {uid: ""}
        assert os.listdir(dirs.cdi) == []


async def test_a_corrupt_checkpoint_is_set_aside_and_unprepare_still_removes_the_spec(
    api: RunningAPI, dirs: Dirs, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    claim = put_claim(api, "c", [result(NIC0)])
    async with hgx_driver(hgx_spec) as r:
        await (await r.kubelet.wait_registered(DRIVER)).prepare(ref(claim))
    uid = claim["metadata"]["uid"]
    checkpoint = Path(r.driver.config.checkpoint_path).parent / "checkpoint.d" / f"{uid}.json"
    doc = json.loads(checkpoint.read_text())
    doc["claim"]["specPath"] = "/etc/passwd"  # tampered: the checksum catches it
    checkpoint.write_text(json.dumps(doc))
    async with hgx_driver(hgx_spec) as r:
        assert r.driver.checkpoint.claims == {}
        assert Path(f"{checkpoint}.corrupt").exists()
        plugin = await r.kubelet.wait_registered(DRIVER)
        assert await plugin.unprepare(ref(claim)) == {claim["metadata"]["uid"]: ""}
        assert spec_files(dirs) == []


async def test_a_spec_path_that_is_a_directory_fails_the_claim_not_the_server(
    running: Running, api: RunningAPI, dirs: Dirs
) -> None:
    claim = put_claim(api, "blocked", [result(NIC0)])
    uid = claim["metadata"]["uid"]
    os.makedirs(Path(dirs.cdi, f"{DRIVER}-nic_{uid}.json"))
    answer = await running.kubelet.plugin(DRIVER).prepare(ref(claim))
    assert "writing the CDI spec" in answer[uid].error
    assert uid not in running.driver.checkpoint.claims
    err = await running.kubelet.plugin(DRIVER).unprepare(ref(claim))
    assert "Is a directory" in err[uid]


async def test_a_fifo_in_place_of_a_spec_is_replaced_not_read(
    running: Running, api: RunningAPI, dirs: Dirs
) -> None:
    claim = put_claim(api, "fifo", [result(NIC0)])
    path = Path(dirs.cdi, f"{DRIVER}-nic_{claim['metadata']['uid']}.json")
    os.makedirs(dirs.cdi, exist_ok=True)
    os.mkfifo(path)
    answer = await asyncio.wait_for(running.kubelet.plugin(DRIVER).prepare(ref(claim)), 10)
    assert answer[claim["metadata"]["uid"]].error == ""
    assert stat.S_ISREG(os.lstat(path).st_mode)


# --- sockets --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        # The safety poll never comes within the test: only inotify can bring the sockets back.
        {"safety_poll": 3600.0},
        # Where inotify cannot be used, the fallback poll does.
        {"use_inotify": False, "fallback_poll": 0.05},
    ],
    ids=["inotify", "polling"],
)
async def test_deleted_sockets_are_served_again_and_a_restarted_kubelet_registers_again(
    api: RunningAPI,
    hgx_driver: HgxDriver,
    hgx_spec: DevicesSpec,
    options: dict[str, Any],
) -> None:
    async with hgx_driver(hgx_spec, **options) as r:
        await r.kubelet.wait_registered(DRIVER)
        assert r.driver.watching == options.get("use_inotify", True)
        config = r.driver.config
        for path in (config.dra_socket, config.registration_socket):
            os.unlink(path)
        await wait_until(
            lambda: os.path.exists(config.dra_socket) and os.path.exists(config.registration_socket)
        )
        await r.kubelet.restart()
        plugin = await r.kubelet.wait_registered(DRIVER, count=2)
        claim = put_claim(api, "after", [result(NIC0)])
        answer = await plugin.prepare(ref(claim))
        assert answer[claim["metadata"]["uid"]].error == ""
        # Replaced under us (a stale file of the same name): served again too.
        os.unlink(config.registration_socket)
        with open(config.registration_socket, "w"):
            pass
        await wait_until(lambda: stat.S_ISSOCK(os.stat(config.registration_socket).st_mode))


async def test_the_socket_directories_deleted_whole_are_served_and_watched_again(
    hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    async with hgx_driver(hgx_spec, fallback_poll=0.05) as r:
        await r.kubelet.wait_registered(DRIVER)
        config = r.driver.config
        shutil.rmtree(config.socket_dir)  # the checkpoint goes too: a wiped kubelet state directory
        await wait_until(lambda: os.path.exists(config.dra_socket))
        await wait_until(lambda: r.driver.watching)  # inotify follows the new directory
        os.unlink(config.dra_socket)
        await wait_until(lambda: os.path.exists(config.dra_socket))


async def test_stopping_removes_both_sockets(
    api: RunningAPI, dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    r = await start_driver(api, dirs, hgx_host[0].host, hgx_spec)
    await r.kubelet.wait_registered(DRIVER)
    await shutdown(r)
    assert not os.path.exists(r.driver.config.dra_socket)
    assert not os.path.exists(r.driver.config.registration_socket)


async def test_a_node_deleted_and_registered_again_gets_slices_owned_by_its_new_uid(
    api: RunningAPI, hgx_driver: HgxDriver, hgx_spec: DevicesSpec
) -> None:
    async with hgx_driver(hgx_spec) as r:
        await wait_until(lambda: len(live_slices(api)) == 1)
        await wait_until(lambda: r.driver.publisher.watch.connects >= 1)
        await asyncio.to_thread(client(api).request, "DELETE", f"/api/v1/nodes/{NODE}")
        await wait_until(lambda: live_slices(api) == [])  # collected with their owner

        def skipped() -> float:
            return (
                REGISTRY.get_sample_value("nodefabric_dra_slice_syncs_total", {"outcome": "skipped"}) or 0.0
            )

        before = skipped()
        # The watch sees the slices collected; the sync and its backed-off retries find no Node...
        await wait_until(lambda: skipped() >= before + 2)
        assert live_slices(api) == []  # ...and publish nothing for it
        node = api.api.put_object("v1/nodes", {"metadata": {"name": NODE}})
        await wait_until(lambda: len(live_slices(api)) == 1)
        assert live_slices(api)[0]["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]


async def test_a_foreign_slice_holding_our_name_is_reported_not_overwritten(
    api: RunningAPI, dirs: Dirs, hgx_host: tuple[SysfsBuilder, Libraries], hgx_spec: DevicesSpec
) -> None:
    squatter = {
        "metadata": {"name": f"{NODE}-{DRIVER}-0"},
        "spec": {"driver": DRIVER, "nodeName": "gpu-9", "pool": {"name": "gpu-9", "generation": 1,
                 "resourceSliceCount": 1}, "devices": []},
    }  # fmt: skip
    api.api.put_object(SLICES, squatter)
    config = dirs.config()
    publisher = SlicePublisher(DraApi(client(api), config), config, RecordSource(hgx_spec), hgx_host[0].host)
    with pytest.raises(ApiFailure, match="may belong to another node or driver"):
        await asyncio.to_thread(publisher.sync)
    assert api.api.stored(SLICES, f"{NODE}-{DRIVER}-0")["spec"]["nodeName"] == "gpu-9"
