"""Per-family endpoint selectors (`--rdma-selectors`): refused at start in one line when they overlap or
select nothing, and served through the real gRPC device plugin as the operator shaped them."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc
import pytest
from dp_helpers import FixtureHost, nic, shutdown, start_plugin, two_nics_and_vfs

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin import server
from nodefabric_deviceplugin.resources import Family, PluginConfig, view
from nodefabric_deviceplugin.selection import (
    HostFacts,
    Selection,
    SelectionError,
    load,
    parse,
    read_host_facts,
)
from nodefabric_deviceplugin.verbs import VerbsCache
from nodefabric_operator.console import main

EXCLUSIVE, SHARED, PARTITIONED = (f"device.gpustack.ai/{f.value}" for f in Family)


# --- what is refused ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ([], "must be a mapping of family"),
        ({"exclusiv": [{"ifNames": ["a"]}]}, "unknown family 'exclusiv'"),
        ({"exclusive": []}, "exclusive: must be a non-empty list of selectors"),
        ({"exclusive": {"ifNames": ["a"]}}, "must be a non-empty list of selectors"),
        ({"exclusive": [{}]}, "exclusive[0]: an empty selector would select every endpoint"),
        ({"exclusive": [{"ifNames": []}]}, "exclusive[0].ifNames: must be a non-empty list"),
        ({"exclusive": [{"ifNames": "ens1f0"}]}, "exclusive[0].ifNames: must be a non-empty list"),
        ({"exclusive": [{"ifNames": [7]}]}, "every value must be a non-empty string"),
        ({"exclusive": [{"ifNames": ["x" * 300]}]}, "at most 256 characters"),
        ({"exclusive": [{"ifname": ["a"]}]}, "unknown field 'ifname'"),
        ({"exclusive": [{"vendors": ["0x15b3"]}]}, "'0x15b3' is not a PCI id"),
        ({"exclusive": [{"devices": ["101D"]}]}, "'101D' is not a PCI id"),
        ({"exclusive": [{"ifNames": ["a"], "sharedCount": 4}]}, "only a shared selector has a count"),
        ({"shared": [{"ifNames": ["a"], "sharedCount": True}]}, "sharedCount: must be an integer"),
        ({"shared": [{"ifNames": ["a"], "sharedCount": "8"}]}, "sharedCount: must be an integer"),
        ({"shared": [{"ifNames": ["a"], "sharedCount": 0}]}, "must be at least 1"),
        ({"shared": [{"ifNames": ["a"], "sharedCount": 10**9}]}, "over kubelet's 4 MiB gRPC message limit"),
        # Overlaps: nothing tells the two apart, or the only field both name shares a value.
        (
            {"exclusive": [{"vendors": ["15b3"]}], "shared": [{"ifNames": ["ens2f0"]}]},
            "exclusive[0] and shared[0] overlap",
        ),
        (
            {"exclusive": [{"ifNames": ["ens1f0", "ens2f0"]}], "shared": [{"ifNames": ["ens2f0"]}]},
            "exclusive[0] and shared[0] overlap",
        ),
        (
            {
                "exclusive": [{"ifNames": ["ens1f0"]}, {"linkLayers": ["InfiniBand"]}],
                "shared": [{"ifNames": ["ens2f0"]}],
            },
            "exclusive[1] and shared[0] overlap",
        ),
    ],
)
def test_a_selection_that_is_not_usable_is_one_line(doc: Any, says: str) -> None:
    with pytest.raises(SelectionError) as err:
        parse(doc)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_disjoint_selections_and_no_file_are_accepted() -> None:
    assert parse(None) == Selection() and Selection().default
    ok = parse(
        {
            "exclusive": [{"ifNames": ["ens1f0"], "vendors": ["15b3"]}],
            "shared": [
                {"ifNames": ["ens2f0"], "sharedCount": 2},
                {"linkLayers": ["Ethernet"], "ifNames": ["x"]},
            ],
        }
    )
    assert not ok.default and ok.max_shared_count(4) == 4


def test_the_file_is_read_as_yaml_and_its_errors_name_it(tmp_path: Path) -> None:
    good = tmp_path / "sel.yaml"
    good.write_text("exclusive:\n  - ifNames: [ens1f0]\n")
    assert load(str(good)).selectors("exclusive") is not None
    bad = tmp_path / "bad.yaml"
    bad.write_text("exclusive: [ifNames: [a\n")
    with pytest.raises(SelectionError, match=rf"--rdma-selectors {bad}: not YAML"):
        load(str(bad))
    with pytest.raises(SelectionError, match="No such file"):
        load(str(tmp_path / "absent.yaml"))
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"#" * (2 << 20))
    with pytest.raises(SelectionError, match="larger than"):
        load(str(huge))


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("exclusive:\n  - vendors: ['15b3']\nshared:\n  - ifNames: [ens2f0]\n", "overlap"),
        ("exclusive:\n  - {}\n", "an empty selector would select every endpoint"),
        ("exclusive: 3\n", "must be a non-empty list of selectors"),
    ],
)
def test_the_command_refuses_a_bad_selection_in_one_line_exit_2(
    tmp_path: Path, plugin_dir: str, capsys: pytest.CaptureFixture[str], content: str, says: str
) -> None:
    path = tmp_path / "sel.yaml"
    path.write_text(content)
    assert main(["deviceplugin", "--plugin-dir", plugin_dir, "--rdma-selectors", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err


# --- what is served ---------------------------------------------------------------------------------------


def names(devices: Any) -> list[str]:
    return sorted(d.ID for d in devices)


async def test_by_default_every_whole_function_is_in_both_exclusive_and_shared(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs())
    try:
        exclusive = await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) == 2)
        shared = await r.kubelet.wait_devices(SHARED, lambda ds: len(ds) == 8)
        assert names(exclusive) == ["0000:19:00.0", "0000:5e:00.0"]
        assert {d.ID.rsplit("-", 1)[0] for d in shared} == {"0000:19:00.0", "0000:5e:00.0"}
    finally:
        await shutdown(r)


async def test_a_nic_dedicated_to_exclusive_leaves_shared_and_counts_per_selector(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    selection = parse(
        {
            "exclusive": [{"ifNames": ["ens1f0"]}],
            "shared": [{"ifNames": ["ens2f0"], "sharedCount": 2}],
            "partitioned": [{"pfNames": ["ens3f0"], "rdmaDevices": ["mlx5_3"]}],
        }
    )
    config = PluginConfig(shared_count=4, selection=selection)
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), config)
    try:
        exclusive = await r.kubelet.wait_devices(EXCLUSIVE)
        shared = await r.kubelet.wait_devices(SHARED)
        partitioned = await r.kubelet.wait_devices(PARTITIONED)
        assert names(exclusive) == ["0000:19:00.0"]
        assert names(shared) == ["0000:5e:00.0-0", "0000:5e:00.0-1"], "ens2f0 only, 2 tokens (its selector)"
        assert names(partitioned) == ["0000:86:00.1"], "only the VF the partitioned selector names"
        # An allocation of the dedicated NIC hands over its verbs device; the shared one never holds it.
        answer = await r.kubelet.plugin(EXCLUSIVE).allocate(["0000:19:00.0"])
        paths = [d.host_path for d in answer.container_responses[0].devices]
        assert "/dev/infiniband/uverbs7" in paths
    finally:
        await shutdown(r)


async def test_a_family_without_selectors_serves_what_no_other_claims(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    config = PluginConfig(shared_count=3, selection=parse({"shared": [{"ifNames": ["ens1f0"]}]}))
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), config)
    try:
        assert names(await r.kubelet.wait_devices(EXCLUSIVE)) == ["0000:5e:00.0"]
        assert names(await r.kubelet.wait_devices(SHARED)) == [f"0000:19:00.0-{i}" for i in range(3)]
        assert len(await r.kubelet.wait_devices(PARTITIONED)) == 2, "VFs are not whole functions: untouched"
    finally:
        await shutdown(r)


async def test_drivers_and_link_layers_are_read_from_the_host(
    plugin_dir: str, fixture_host: FixtureHost
) -> None:
    # The fixture's ConnectX functions are bound to mlx5_core and their ports are Ethernet (RoCE).
    config = PluginConfig(
        shared_count=2,
        selection=parse(
            {
                "exclusive": [{"drivers": ["mlx5_core"], "ifNames": ["ens2f0"]}],
                "shared": [{"linkLayers": ["InfiniBand"], "ifNames": ["ens1f0"]}],
            }
        ),
    )
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), config)
    try:
        assert names(await r.kubelet.wait_devices(EXCLUSIVE)) == ["0000:5e:00.0"]
        assert names(await r.kubelet.wait_devices(SHARED)) == [], "no InfiniBand port on this host"
    finally:
        await shutdown(r)


async def test_host_facts_are_read_off_the_event_loop_and_a_stuck_read_fails_only_its_callers(
    plugin_dir: str, fixture_host: FixtureHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.current_thread()
    release = threading.Event()
    reads: list[str] = []

    def stuck(host: HostRoot, devices: Iterable[tuple[str, str]]) -> HostFacts:
        # What a read blocked in a driver looks like from here; on the loop it would hold every call.
        assert threading.current_thread() is not loop_thread, "a sysfs read on the event loop"
        reads.append(threading.current_thread().name)
        release.wait(60)
        return read_host_facts(host, devices)

    monkeypatch.setattr(server, "read_host_facts", stuck)
    config = PluginConfig(shared_count=2, selection=parse({"exclusive": [{"drivers": ["mlx5_core"]}]}))
    verbs = VerbsCache(fixture_host.host, budget=0.2)
    r = await start_plugin(plugin_dir, fixture_host.host, two_nics_and_vfs(), config, verbs=verbs)
    try:
        await r.kubelet.wait_registered(EXCLUSIVE)
        plugin = r.kubelet.plugin(EXCLUSIVE)
        # While the read is stuck: other calls answer, an Allocate fails within the budget, and the
        # callers share the one read rather than start one each.
        for _ in range(2):
            assert (await plugin.options(timeout=5)).get_preferred_allocation_available
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await plugin.allocate(["0000:19:00.0"], timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "did not finish within 0.2 s" in (err.value.details() or "")
        assert len(reads) == 1
        release.set()
        assert names(await r.kubelet.wait_devices(EXCLUSIVE, lambda ds: len(ds) > 0, timeout=30)) == [
            "0000:19:00.0",
            "0000:5e:00.0",
        ]
        response = await plugin.allocate(["0000:19:00.0"], timeout=30)
        assert response.container_responses[0].envs["NCCL_IB_HCA"] == "=mlx5_0"
    finally:
        release.set()
        await shutdown(r)


def test_a_selection_with_an_unread_host_fact_matches_nothing() -> None:
    spec = two_nics_and_vfs()
    selection = parse({"exclusive": [{"drivers": ["mlx5_core"]}]})
    assert view(spec, Family.EXCLUSIVE, 4, selection).tokens == (), "a fact not read is not a match"
    # Nothing was claimed, so the family without selectors serves both whole functions.
    assert [e.rdma_device for e in view(spec, Family.SHARED, 4, selection).endpoints] == ["mlx5_0", "mlx5_1"]


def test_pf_names_select_a_pfs_vfs_and_a_whole_function_itself() -> None:
    spec = two_nics_and_vfs()
    vfs = parse({"partitioned": [{"pfNames": ["ens3f0"]}]})
    assert [e.rdma_device for e in view(spec, Family.PARTITIONED, 4, vfs).endpoints] == ["mlx5_3", "mlx5_4"]
    none = parse({"partitioned": [{"pfNames": ["ens1f0"]}]})
    assert view(spec, Family.PARTITIONED, 4, none).endpoints == ()
    whole = parse({"exclusive": [{"pfNames": ["ens1f0"]}], "shared": [{"pfNames": ["ens2f0"]}]})
    assert [e.rdma_device for e in view(spec, Family.EXCLUSIVE, 4, whole).endpoints] == ["mlx5_0"]
    assert [e.rdma_device for e in view(spec, Family.SHARED, 4, whole).endpoints] == ["mlx5_1"]


def test_an_alias_bomb_or_bytes_that_are_not_text_are_one_line(tmp_path: Path) -> None:
    lines = ["x0: &a0 [x, x]"] + [f"x{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 30)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join([*lines, "exclusive: *a29"]) + "\n")
    with pytest.raises(SelectionError, match="expands to more than 2,000,000 values"):
        load(str(bomb))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SelectionError, match=rf"--rdma-selectors {binary}: "):
        load(str(binary))


def test_a_fifo_as_the_file_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    # A plain open of a FIFO blocks until a writer comes: start would hang for good, saying nothing.
    fifo = tmp_path / "sel.yaml"
    os.mkfifo(fifo)
    with pytest.raises(SelectionError, match=rf"--rdma-selectors {fifo}: not a regular file"):
        load(str(fifo))
    with pytest.raises(SelectionError, match=rf"--rdma-selectors {tmp_path}: Is a directory"):
        load(str(tmp_path))


@pytest.mark.parametrize("layer", ["IB", "infiniband", "RoCE", "ethernet"])
def test_a_link_layer_no_port_reports_is_refused_not_left_to_match_nothing(layer: str) -> None:
    with pytest.raises(SelectionError) as err:
        parse({"exclusive": [{"linkLayers": [layer], "ifNames": ["ens1f0"]}]})
    assert f"{layer!r} is not a link layer (InfiniBand or Ethernet)" in str(err.value), str(err.value)


def test_an_endpoint_matched_by_both_an_exclusive_and_a_shared_selector_is_exclusive_only() -> None:
    # A RoCE LAG: one RDMA device over two netdevs. The selectors name different netdevs, so they pass
    # the start-up overlap check, yet both match the one endpoint: it must not be shared while exclusive.
    spec = DevicesSpec(
        interfaces=[
            nic("ens1f0", "0000:19:00.0", "mlx5_bond_0", numa="0"),
            nic("ens1f1", "0000:19:00.1", "mlx5_bond_0", numa="0"),
            nic("ens2f0", "0000:5e:00.0", "mlx5_1", numa="1"),
        ]
    )
    selection = parse({"exclusive": [{"ifNames": ["ens1f0"]}], "shared": [{"ifNames": ["ens1f1", "ens2f0"]}]})
    assert [e.rdma_device for e in view(spec, Family.EXCLUSIVE, 4, selection).endpoints] == ["mlx5_bond_0"]
    assert [e.rdma_device for e in view(spec, Family.SHARED, 4, selection).endpoints] == ["mlx5_1"]


@pytest.mark.parametrize(
    ("content", "key"),
    [
        ("exclusive:\n  - ifNames: [ens1f0]\nexclusive:\n  - ifNames: [ens2f0]\n", "exclusive"),
        ("shared:\n  - ifNames: [ens1f0]\n    ifNames: [ens2f0]\n", "ifNames"),
    ],
)
def test_a_key_given_twice_is_refused_not_silently_the_last(tmp_path: Path, content: str, key: str) -> None:
    # YAML loaders keep the last of a repeated key: the first exclusive list vanished, and the NIC it
    # dedicated was shared again. The API server's own YAML reading refuses a repeated key; so does this.
    path = tmp_path / "sel.yaml"
    path.write_text(content)
    with pytest.raises(SelectionError) as err:
        load(str(path))
    assert f"--rdma-selectors {path}: the key {key!r} is given twice" in str(err.value), str(err.value)
