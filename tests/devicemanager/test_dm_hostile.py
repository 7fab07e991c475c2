"""Hostile hosts (issue 13), each through the real command on a fixture tree: `nodefabric inventory` and
`preflight` never hang, never invent a value, and never mistake what they could not read for an empty
host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import pytest

from nodefabric_devicemanager import crd
from nodefabric_devicemanager.testing.scenarios import SCENARIOS
from nodefabric_devicemanager.testing.sysfs import Port, SysfsBuilder
from nodefabric_operator.console import main

NIC = "/sys/devices/pci0000:16/0000:17:00.0"
NETDEV = f"{NIC}/net/ens1np0"


def nic(b: SysfsBuilder, **kwargs) -> None:
    b.nic("0000:17:00.0", "ens1np0", host_bridge="pci0000:16", numa=0, rdma="mlx5_0", verbs=0, **kwargs)


def inventory(capsys, root, *more):
    code = main(["inventory", "--root", str(root), *more])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def conditions(doc):
    return {c["type"]: c for c in doc["status"]["conditions"]}


def command(root, *args, timeout=60):
    """The console script in a child process: a read that blocks shows as a timeout, not a hung suite."""
    return subprocess.run(
        [sys.executable, "-m", "nodefabric_operator.console", *args, "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def crd_schema():
    return crd.devices_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


# --- never hang ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attribute", "part"),
    [
        (f"{NETDEV}/mtu", "InterfacesEnumerated"),
        (f"{NETDEV}/operstate", "InterfacesEnumerated"),
        (f"{NIC}/numa_node", "InterfacesEnumerated"),  # the PCI walk fails: both parts are unread
        (f"{NIC}/sriov_numvfs", "InterfacesEnumerated"),
    ],
)
def test_a_fifo_attribute_fails_the_part_it_belongs_to_and_never_blocks(builder, host_root, attribute, part):
    nic(builder)
    builder.write(f"{NIC}/sriov_totalvfs", "8")
    builder.fifo(attribute)
    proc = command(host_root, "inventory")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    cond = conditions(doc)[part]
    assert cond["status"] == "False"
    assert f"{attribute}: is a FIFO, not a regular file" in cond["message"]
    assert "interfaces" not in doc["spec"]  # not read is not empty
    assert "Traceback" not in proc.stderr


def test_a_fifo_port_state_is_an_unverified_link_and_preflight_returns(builder, host_root):
    nic(builder)
    builder.fifo(f"{NIC}/infiniband/mlx5_0/ports/1/state")
    proc = command(host_root, "preflight", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    [row] = doc["endpoints"]
    assert row["verdict"] == "unverified"
    # Refused, and said so: never "state is missing".
    assert "ports/1/state: is a FIFO, not a regular file" in row["reason"]
    assert "missing" not in row["reason"]
    assert doc["rdmaCapable"] is True  # an inability to ask is not an answer of no


def test_a_character_device_where_numa_node_belongs_is_refused(builder, host_root, capsys):
    nic(builder)
    try:
        builder.chardev(f"{NIC}/numa_node")
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    code, doc, _ = inventory(capsys, host_root)
    assert code == 1
    message = conditions(doc)["InterfacesEnumerated"]["message"]
    assert f"{NIC}/numa_node: is a character device, not a regular file" in message


def test_a_symlink_to_a_device_node_inside_the_root_is_refused(builder, host_root, capsys):
    nic(builder)
    try:
        builder.chardev("/dev/watchdog")  # opening a real one would arm it
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    builder.path(f"{NIC}/local_cpulist").unlink(missing_ok=True)
    builder.link(f"{NIC}/local_cpulist", "/dev/watchdog")
    code, doc, _ = inventory(capsys, host_root)
    assert code == 1
    assert "/dev/watchdog: is a character device" in conditions(doc)["InterfacesEnumerated"]["message"]


def test_a_directory_where_mtu_belongs_is_refused(builder, host_root, capsys):
    nic(builder)
    builder.path(f"{NETDEV}/mtu").unlink()
    builder.mkdir(f"{NETDEV}/mtu")
    code, doc, _ = inventory(capsys, host_root)
    assert code == 1
    assert f"{NETDEV}/mtu: is a directory" in conditions(doc)["InterfacesEnumerated"]["message"]


# --- never invent a value ----------------------------------------------------------------------------


BAD_NUMBERS = ["abc", "01", "²", "\u0663", "1" * 23, "-9000", "1e23", " 1", "1_0", "0\x00"]


@pytest.mark.parametrize("raw", [*BAD_NUMBERS, "1024", b"\xff\xfe"])
def test_a_numa_node_that_is_not_one_is_blank(builder, host_root, capsys, raw):
    nic(builder)
    builder.write(f"{NIC}/numa_node", raw)
    code, doc, _ = inventory(capsys, host_root)
    assert code == 0
    assert doc["spec"]["interfaces"][0]["numaAffinity"] == ""
    jsonschema.validate({"spec": doc["spec"]}, crd_schema())


@pytest.mark.parametrize("raw", [*BAD_NUMBERS, "2147483648", b"\xff\xfe"])
def test_an_mtu_that_is_not_one_is_absent_not_zero(builder, host_root, capsys, raw):
    nic(builder)
    builder.write(f"{NETDEV}/mtu", raw)
    code, doc, _ = inventory(capsys, host_root)
    assert code == 0
    assert "mtu" not in doc["spec"]["interfaces"][0]
    jsonschema.validate({"spec": doc["spec"]}, crd_schema())


def test_ids_cpus_and_flags_that_are_not_what_the_kernel_prints_are_unknown(builder, host_root, capsys):
    nic(builder, cpus="0-55")
    builder.write(f"{NIC}/vendor", "15b3")  # no 0x: not the kernel's spelling
    builder.write(f"{NIC}/device", b"0x10\xff")
    builder.write(f"{NIC}/local_cpulist", "0-55,\x1b[31m")
    builder.write(f"{NETDEV}/operstate", "unknown")
    builder.write(f"{NETDEV}/flags", "0b1")  # int(x, 0) reads 1: up
    code, doc, _ = inventory(capsys, host_root)
    iface = doc["spec"]["interfaces"][0]
    assert code == 0
    assert (iface["pciVendor"], iface["pciDevice"], iface["cpuAffinity"], iface["up"]) == ("", "", "", False)


def test_a_vf_count_that_is_not_one_is_the_vfs_the_kernel_made(builder, host_root, capsys):
    nic(builder)
    builder.sriov("0000:17:00.0", vfs=3, rdma_prefix="mlx5_", first_rdma=1)
    builder.write(f"{NIC}/sriov_numvfs", "1e3")
    code, doc, err = inventory(capsys, host_root)
    assert code == 0
    iface = doc["spec"]["interfaces"][0]
    assert iface["sriovNumVfs"] == 3 == len(iface["virtualFunctions"])
    assert "sriov_numvfs is not a VF count" in err


@pytest.mark.parametrize(
    "raw",
    [
        "4: ACT\x00IVE",  # NUL bytes
        "1: DOWN\x00",
        "DOWN",  # not the kernel's "%d: %s"
        "1: ACTIVE",  # code and name disagree
        "9: FROBNICATED",  # a name the kernel never prints
        "6: UNKNOWN",  # the kernel's own "no idea"
        b"1: DOWN\xff",
    ],
)
def test_a_port_state_that_cannot_be_parsed_is_unverified_not_failed(builder, host_root, capsys, raw):
    nic(builder, ports=[Port(raw_state=raw if isinstance(raw, str) else None, phys_state="Disabled")])
    if isinstance(raw, bytes):
        builder.write(f"{NIC}/infiniband/mlx5_0/ports/1/state", raw)
    code, doc, _ = inventory(capsys, host_root)
    link = doc["spec"]["interfaces"][0]["link"]
    assert code == 0 and link["state"] == "unverified", link
    assert doc["status"]["rdmaEndpoints"] == 1  # still counts for the label
    assert "\ufffd" not in json.dumps(doc, ensure_ascii=False)


def test_a_parsed_down_port_is_failed_and_quotes_a_long_value_in_part(builder, host_root, capsys):
    nic(builder, ports=[Port(state="DOWN", phys_state="Disabled"), Port(raw_state="x" * 5000)])
    _, doc, _ = inventory(capsys, host_root)
    link = doc["spec"]["interfaces"][0]["link"]
    assert link["state"] == "unverified"  # one junk port beside a down one: "all down" is not established
    assert "(5000 characters)" in link["reason"] and len(link["reason"]) < 400


def test_nothing_from_a_hostile_tree_breaks_the_crd_schema(builder, host_root, capsys):
    nic(builder)
    builder.sriov("0000:17:00.0", vfs=2, rdma_prefix="mlx5_", first_rdma=1)
    for path, raw in {
        f"{NIC}/numa_node": "1" * 30,
        f"{NETDEV}/mtu": "-1",
        f"{NIC}/sriov_numvfs": "99999999999999999999999",
        f"{NIC}/local_cpulist": "all",
    }.items():
        builder.write(path, raw)
    code, doc, _ = inventory(capsys, host_root)
    assert code == 0
    jsonschema.validate({"spec": doc["spec"], "status": doc["status"]}, crd_schema())


# --- never mistake unread for empty --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["loop", "dangling", "file", "fifo"])
def test_a_class_net_entry_that_is_no_interface_fails_enumeration(builder, host_root, capsys, kind):
    nic(builder)
    entry = host_root / "sys/class/net/ens9"
    if kind == "loop":
        os.symlink("ens9", entry)
    elif kind == "dangling":
        os.symlink("../../devices/pci0000:16/0000:99:00.0/net/ens9", entry)
    elif kind == "file":
        entry.write_text("ens9\n")
    else:
        os.mkfifo(entry)
    code, doc, err = inventory(capsys, host_root)
    assert code == 1
    cond = conditions(doc)["InterfacesEnumerated"]
    assert (cond["status"], cond["reason"]) == ("False", "EnumerationFailed")
    assert "/sys/class/net/ens9" in cond["message"]
    assert "interfaces" not in doc["spec"]  # the NIC beside it is not reported gone
    assert "could not enumerate network interfaces" in err


def test_bonding_masters_is_a_known_file_not_a_failure(builder, host_root, capsys):
    nic(builder)
    builder.write("/sys/class/net/bonding_masters", "bond0")
    code, doc, _ = inventory(capsys, host_root)
    assert code == 0 and [i["name"] for i in doc["spec"]["interfaces"]] == ["ens1np0"]


def test_a_root_without_a_pci_bus_has_unread_accelerators_not_none(host_root, capsys):
    SCENARIOS["platform-rdma"](host_root)
    shutil.rmtree(host_root / "sys/bus/pci")
    code, doc, _ = inventory(capsys, host_root)
    assert code == 1
    accelerators = conditions(doc)["AcceleratorsEnumerated"]
    assert (accelerators["status"], accelerators["reason"]) == ("False", "PciBusAbsent")
    assert "/sys/bus/pci is absent" in accelerators["message"]
    assert "groups" not in doc["spec"]  # so nobody reads "this node has no GPUs"
    # The interfaces do not need a bus: they were read.
    assert conditions(doc)["InterfacesEnumerated"]["status"] == "True"
    assert [i["name"] for i in doc["spec"]["interfaces"]] == ["end0", "lo"]


def test_the_agent_keeps_the_recorded_groups_of_a_root_without_a_pci_bus(host_root):
    from datetime import UTC, datetime

    from nodefabric_devicemanager import inventory as inventorymod
    from nodefabric_devicemanager.agent import publish
    from nodefabric_devicemanager.hostroot import HostRoot
    from nodefabric_devicemanager.models import Accelerator, AcceleratorGroup, DevicesSpec

    SCENARIOS["non-pci"](host_root)
    shutil.rmtree(host_root / "sys/bus/pci")
    gpu = Accelerator(id="0000:1b:00.0", index=0)
    recorded = DevicesSpec(groups=[AcceleratorGroup(id="nvidia", manufacturer="NVIDIA", accelerators=[gpu])])
    reading = inventorymod.read(HostRoot.at(host_root))
    assert publish.desired_spec(reading, recorded, datetime.now(UTC)).groups == recorded.groups


def test_a_root_without_class_net_has_unread_interfaces(host_root, capsys):
    SCENARIOS["gpu8"](host_root)
    for entry in (host_root / "sys/class/net").iterdir():
        entry.unlink()
    (host_root / "sys/class/net").rmdir()
    code, doc, _ = inventory(capsys, host_root)
    assert code == 1
    cond = conditions(doc)["InterfacesEnumerated"]
    assert cond["status"] == "False" and "/sys/class/net" in cond["message"]
    assert "interfaces" not in doc["spec"]


@pytest.mark.parametrize("kind", ["not-an-address", "dangling", "another-function"])
def test_a_pci_bus_entry_that_is_no_function_fails_the_walk(builder, host_root, capsys, kind):
    nic(builder)
    bus = host_root / "sys/bus/pci/devices"
    if kind == "not-an-address":
        os.symlink("../../../devices/pci0000:16/0000:17:00.0", bus / "eth0")
    elif kind == "dangling":
        os.symlink("../../../devices/pci0000:16/0000:99:00.0", bus / "0000:99:00.0")
    else:
        os.symlink("../../../devices/pci0000:16/0000:17:00.0", bus / "0000:99:00.0")
    code, doc, _ = inventory(capsys, host_root)
    assert code == 1
    assert conditions(doc)["InterfacesEnumerated"]["reason"] == "PciWalkFailed"
    assert conditions(doc)["AcceleratorsEnumerated"]["status"] == "False"


# --- messages an operator can act on ----------------------------------------------------------------


def test_names_in_tables_have_control_characters_escaped(builder, host_root, capsys):
    builder.nic("0000:17:00.0", "ens1\x1b[31m", host_bridge="pci0000:16", numa=0, rdma="mlx5_0", verbs=0)
    for cmd in ("inventory", "preflight"):
        assert main([cmd, "--root", str(host_root), "-o", "table"]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "ens1\\x1b[31m" in out
    _, doc, _ = inventory(capsys, host_root)
    assert doc["spec"]["interfaces"][0]["name"] == "ens1\x1b[31m"  # the record keeps the kernel's name


def test_an_interface_name_that_is_not_utf8_is_recorded_escaped(builder, host_root, capsys):
    raw = os.fsdecode(b"ens\xff1")
    nic(builder)
    netdev = builder.netdev("0000:17:00.0", raw)
    assert netdev.exists()
    code, doc, _ = inventory(capsys, host_root)
    assert code == 0
    assert sorted(i["name"] for i in doc["spec"]["interfaces"]) == ["ens1np0", "ens\\xff1"]


# --- unreadable: EACCES is an error of the part it belongs to, never an absent value -------------------


def _as_nobody(root):
    """`nodefabric inventory` run as uid 65534, for whom a mode-000 file answers EACCES (root reads it)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run the command as another user")
    command = ["nodefabric_operator.console", "inventory", "--root", str(root), "-o", "json"]
    return subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", *command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


@pytest.fixture
def open_root():
    """A host root every user may traverse (pytest's own temporary directories are root's only)."""
    base = tempfile.mkdtemp(prefix="nodefabric-eacces-")
    os.chmod(base, 0o755)
    yield Path(base) / "root"
    shutil.rmtree(base)


@pytest.mark.parametrize(
    ("where", "part", "directory"),
    [
        (f"{NIC}/numa_node", "InterfacesEnumerated", False),
        (f"{NETDEV}/mtu", "InterfacesEnumerated", False),
        (f"{NIC}/infiniband/mlx5_0/ports/1/state", None, False),
        (f"{NIC}/infiniband/mlx5_0/ports", None, True),
    ],
)
def test_an_unreadable_attribute_or_directory_is_an_error_not_absent(open_root, where, part, directory):
    b = SysfsBuilder(open_root)
    nic(b)
    os.chmod(b.path(where), 0o000)
    proc = _as_nobody(open_root)
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    if part is not None:
        assert proc.returncode == 1, proc.stderr
        cond = conditions(doc)[part]
        assert cond["status"] == "False"
        assert f"{where}: Permission denied" in cond["message"]
        assert "interfaces" not in doc["spec"]  # not read is not empty
    else:
        # A port that cannot be read makes the link unverified (an inability to ask is not a no).
        assert proc.returncode == 0, proc.stderr
        [iface] = doc["spec"]["interfaces"]
        assert iface["rdmaDevice"] == "mlx5_0"
        assert iface["link"]["state"] == "unverified"
        assert "Permission denied" in iface["link"]["reason"]
        assert "missing" not in iface["link"]["reason"]


@pytest.mark.parametrize(
    ("link", "target", "part"),
    [
        ("sys/class", "class", "InterfacesEnumerated"),  # the way to /sys/class/net loops
        ("sys/class/net", "net", "InterfacesEnumerated"),  # /sys/class/net itself loops
        ("sys/bus", "bus", "AcceleratorsEnumerated"),  # the way to /sys/bus/pci loops
    ],
)
def test_a_link_loop_on_the_way_is_refused_as_a_loop_not_called_absent(tmp_path, capsys, link, target, part):
    """A loop is something there that cannot be read: InterfacesEnumerated (or AcceleratorsEnumerated)
    False naming the loop in the kernel's words, never "is absent" (which reads as a node without it)."""
    root = tmp_path / "root"
    (root / link).parent.mkdir(parents=True)
    (root / link).symlink_to(target)
    code, doc, _ = inventory(capsys, root)
    assert code == 1
    cond = conditions(doc)[part]
    assert cond["status"] == "False"
    assert "Too many levels of symbolic links" in cond["message"], cond["message"]
    assert "absent" not in cond["message"]
