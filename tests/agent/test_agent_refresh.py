"""The link refresh between walks (`refresh.py`) on fixture trees: what it reads, what it re-judges, and
what a hostile file does to it (never blocks, never raises, refused the way a walk refuses it)."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil

from agent_fixtures import set_port, two_nic_host

from nodefabric_devicemanager import inventory, refresh
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import LinkState
from nodefabric_devicemanager.testing.sysfs import Port, SysfsBuilder


def _walked(root):
    host = HostRoot.at(root)
    interfaces = inventory.read(host).interfaces
    assert interfaces is not None
    plan = refresh.plan(host, interfaces)
    return interfaces, plan, refresh.snapshot(plan)


def _port_file(b: SysfsBuilder, bus_id: str, dev: str, name: str = "state"):
    return b.functions[bus_id] / "infiniband" / dev / "ports" / "1" / name


def test_the_plan_reads_every_port_and_netdev_and_nothing_else(tmp_path):
    b = two_nic_host(tmp_path)
    b.nic("0000:18:00.0", "ens2f0", host_bridge="pci0000:18", numa=1, rdma="mlx5_2", verbs=2)
    b.sriov("0000:18:00.0", vfs=2, netdev_prefix="ens2f0v", rdma_prefix="mlx5_", first_rdma=3, first_verbs=3)
    _, plan, _ = _walked(tmp_path)
    assert sorted(d.name for d in plan.devices) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4"]
    assert {n.name for n in plan.netdevs} >= {"ens1f0", "ens1f1", "ens2f0"}
    names = {os.path.basename(f) for f in plan.files}
    assert names == {"state", "phys_state", "operstate"}
    assert len(plan.files) == 2 * len(plan.devices) + len(plan.netdevs)


def test_nothing_changed_is_one_read_per_file_and_the_same_list(tmp_path):
    two_nic_host(tmp_path)
    interfaces, plan, before = _walked(tmp_path)
    after = refresh.snapshot(plan)
    assert after == before and not after.gone
    changes = refresh.judge(plan, before, after)
    assert not changes
    assert refresh.apply(interfaces, changes) is interfaces


def test_a_port_going_down_is_judged_by_the_walks_own_verdict(tmp_path):
    b = two_nic_host(tmp_path)
    interfaces, plan, before = _walked(tmp_path)
    set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
    after = refresh.snapshot(plan)
    changes = refresh.judge(plan, before, after)
    assert set(changes.links) == {"mlx5_1"} and not changes.up, "only what changed is re-read"
    out = refresh.apply(interfaces, changes)
    by_name = {i.name: i for i in out}
    assert by_name["ens1f1"].link.state is LinkState.FAILED and "DOWN" in by_name["ens1f1"].link.reason
    assert by_name["ens1f0"] is next(i for i in interfaces if i.name == "ens1f0"), "untouched endpoints kept"


def test_operstate_down_and_unknown_with_flags(tmp_path):
    b = two_nic_host(tmp_path)
    _, plan, before = _walked(tmp_path)
    net = b.root / "sys/class/net"
    (net / "ens1f0/operstate").write_text("down\n")
    (net / "ens1f1/operstate").write_text("unknown\n")
    (net / "ens1f1/flags").write_text("0x1003\n")  # IFF_UP
    changes = refresh.judge(plan, before, refresh.snapshot(plan))
    assert changes.up == {"ens1f0": False, "ens1f1": True}
    (net / "ens1f1/flags").write_text("0x1002\n")
    again = refresh.snapshot(plan)
    assert refresh.judge(plan, before, again).up["ens1f1"] is False, (
        "flags are read while operstate is unknown"
    )


async def test_a_fifo_where_a_port_state_belongs_never_blocks_the_snapshot(tmp_path):
    b = two_nic_host(tmp_path)
    _, plan, before = _walked(tmp_path)
    state = _port_file(b, "0000:17:00.1", "mlx5_1")
    state.unlink()
    os.mkfifo(state)
    after = await asyncio.wait_for(asyncio.to_thread(refresh.snapshot, plan), 5)
    assert after != before, "a FIFO reads as a change, to be judged (and refused) by the walk's reader"
    assert not after.gone


def test_a_symlink_out_of_the_root_is_refused_like_a_walk_refuses_it(tmp_path):
    b = two_nic_host(tmp_path)
    _, plan, before = _walked(tmp_path)
    state = _port_file(b, "0000:17:00.1", "mlx5_1")
    state.unlink()
    state.symlink_to("/proc/self/status")
    after = refresh.snapshot(plan)
    assert after != before
    changes = refresh.judge(plan, before, after)
    link = changes.links["mlx5_1"]
    assert link.state is LinkState.UNVERIFIED, "refused, never read as failed"
    assert "outside" in link.reason


def test_garbage_bytes_are_unverified_not_failed(tmp_path):
    b = two_nic_host(tmp_path)
    _, plan, before = _walked(tmp_path)
    _port_file(b, "0000:17:00.1", "mlx5_1").write_bytes(b"\xff\xfe\x00junk")
    changes = refresh.judge(plan, before, refresh.snapshot(plan))
    assert changes.links["mlx5_1"].state is LinkState.UNVERIFIED


def test_a_vanished_netdev_or_port_says_the_topology_changed(tmp_path):
    b = two_nic_host(tmp_path)
    _, plan, _ = _walked(tmp_path)
    shutil.rmtree((b.root / "sys/class/net/ens1f1").resolve())
    after = refresh.snapshot(plan)
    assert after.gone
    assert errno.ENOENT in [v for v in after.values if isinstance(v, int)]


def test_a_record_naming_what_the_host_lacks(tmp_path):
    two_nic_host(tmp_path)
    host = HostRoot.at(tmp_path)
    interfaces = inventory.read(host).interfaces
    assert interfaces is not None
    ghost = interfaces[0].model_copy(update={"name": "ghost0", "rdma_device": "mlx5_9"})
    plan = refresh.plan(host, [*interfaces, ghost])
    assert plan.unresolved == ("mlx5_9",), "an rdma device without ports is left as walked"
    assert refresh.snapshot(plan).gone, "a netdev that is not there asks for a walk"


def test_a_port_directory_that_is_a_link_inside_the_root_is_read_where_it_lands(tmp_path):
    """The plan keeps port names, not file paths; a port directory the kernel never makes a link, but a
    tree might, is kept by its resolved path and still read and re-judged."""
    b = two_nic_host(tmp_path)
    ports = b.functions["0000:17:00.1"] / "infiniband" / "mlx5_1" / "ports"
    moved = tmp_path / "elsewhere" / "port1"
    moved.parent.mkdir()
    shutil.move(ports / "1", moved)
    (ports / "1").symlink_to(moved)
    _, plan, before = _walked(tmp_path)
    device = next(d for d in plan.devices if d.name == "mlx5_1")
    assert device.files == [str(moved / "state"), str(moved / "phys_state")]
    assert next(d for d in plan.devices if d.name == "mlx5_0").port_dirs == ("1",)
    (moved / "state").write_text("1: DOWN\n")
    changes = refresh.judge(plan, before, refresh.snapshot(plan))
    assert set(changes.links) == {"mlx5_1"}
    assert changes.links["mlx5_1"].state is LinkState.FAILED


def test_a_snapshot_holds_one_object_per_distinct_value(tmp_path):
    """Kept between refreshes: on a big node nearly every port reads the same bytes, held once."""
    b = two_nic_host(tmp_path)
    _, _, snap = _walked(tmp_path)
    assert snap.values[0] == snap.values[1] and snap.values[0] is snap.values[1]
    set_port(b, "0000:17:00.1", "mlx5_1", Port(state="DOWN", phys_state="Disabled"))
    _, _, again = _walked(tmp_path)
    assert again.values[0] != again.values[1], "different bytes stay different"
