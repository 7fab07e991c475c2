"""A prepared claim across a reboot: the kernel may number the uverbs devices and name the RDMA devices
differently (a NIC added, removed, probed in another order), so a repeated prepare of a claim prepared
in another boot resolves its devices again, by their PCI addresses, and its CDI spec names today's
device nodes, not yesterday's.

A reboot here is what the driver sees of one: the driver stopped, the runtime's CDI directory emptied
(a tmpfs), the host tree's boot id changed and its NICs renumbered (another fixture tree, the same PCI
addresses), the driver started again on the checkpoint it left (kubelet's checkpoint holds the claim and
prepares it again)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from dra_helpers import DRIVER, NODE, Dirs, driving, put_claim, read, ref, result, start_preparer
from prometheus_client import REGISTRY

from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra import boot
from nodefabric_deviceplugin.dra.checkpoint import (
    CLAIM_KIND,
    CLAIM_VERSION,
    Checkpoint,
    PreparedClaim,
    PreparedDevice,
    decode,
    encode,
    file_name,
)
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_operator.demo.kubeapi import RunningAPI

BOOT_A = "0f4c3b1e-7a52-4e8f-9d3a-2b6c1e0a9f11"
BOOT_B = "8d2e6f40-1c3b-4a5d-b7e9-f0a1c2d3e4f5"
NIC_A, NIC_B = "0000:19:00.0", "0000:29:00.0"
DEV_A = "pci-0000-19-00-0"
CLAIMS = "resource.k8s.io/v1/resourceclaims"

# (RDMA device, uverbs number) by PCI address. The second boot probed the NICs the other way round.
BEFORE = {NIC_A: ("mlx5_0", 0), NIC_B: ("mlx5_1", 1)}
SWAPPED = {NIC_A: ("mlx5_1", 1), NIC_B: ("mlx5_0", 0)}


def host(root: Path, nics: dict[str, tuple[str, int]], boot_id: str | bytes | None) -> SysfsBuilder:
    """Two ConnectX NICs, each with its RDMA device and uverbs node as `nics` numbers them; the boot id
    file holds `boot_id` (None: no /proc in the tree at all)."""
    b = SysfsBuilder(root)
    for bus, (rdma, verbs) in nics.items():
        b.nic(bus, f"ens{verbs}", numa=0, rdma=rdma, verbs=verbs)
    b.rdma_cm()
    if boot_id is not None:
        b.write(f"{boot.DIRECTORY}/{boot.NAME}", boot_id)
    return b


def outcome(name: str) -> float:
    return REGISTRY.get_sample_value("nodefabric_dra_prepares_total", {"outcome": name}) or 0.0


def spec_file(dirs: Dirs, uid: str) -> Path:
    return Path(dirs.cdi, f"{DRIVER}-nic_{uid}.json")


def nodes_and_hca(spec: dict[str, Any]) -> tuple[list[str], list[str]]:
    nodes = [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    env = spec.get("containerEdits", {}).get("env", [])
    return nodes, [e for e in env if e.startswith("NCCL_IB_HCA=")]


def entry_path(dirs: Dirs, uid: str) -> Path:
    return Path(dirs.config().checkpoint_path).parent / "checkpoint.d" / file_name(uid)


def empty_cdi(dirs: Dirs) -> None:
    """What a reboot does to /var/run/cdi (a tmpfs)."""
    shutil.rmtree(dirs.cdi, ignore_errors=True)
    os.makedirs(dirs.cdi)


class Node:
    """The driver on a fixture host, started and stopped as a reboot would."""

    def __init__(self, api: RunningAPI, dirs: Dirs, tmp: Path) -> None:
        self.api, self.dirs, self.tmp, self.boots = api, dirs, tmp, 0

    def tree(self, nics: dict[str, tuple[str, int]], boot_id: str | bytes | None) -> SysfsBuilder:
        self.boots += 1
        return host(self.tmp / f"boot{self.boots}", nics, boot_id)

    async def prepare(self, b: SysfsBuilder, claim: dict[str, Any]) -> Any:
        """Start the driver on host `b`, prepare the claim once, stop: kubelet's answer for it."""
        async with driving(self.api, self.dirs, b.host, read(b)) as r:
            plugin = await r.kubelet.wait_registered(DRIVER)
            return (await plugin.prepare(ref(claim)))[claim["metadata"]["uid"]]

    async def unprepare(self, b: SysfsBuilder, claim: dict[str, Any]) -> str:
        async with driving(self.api, self.dirs, b.host, read(b)) as r:
            plugin = await r.kubelet.wait_registered(DRIVER)
            return (await plugin.unprepare(ref(claim)))[claim["metadata"]["uid"]]


@pytest.fixture
def node(api: RunningAPI, dirs: Dirs, tmp_path: Path) -> Node:
    return Node(api, dirs, tmp_path)


def spec_of(dirs: Dirs, uid: str) -> dict[str, Any]:
    return json.loads(spec_file(dirs, uid).read_text())  # type: ignore[no-any-return]


async def test_after_a_reboot_that_renumbered_the_nics_the_spec_names_todays_verbs_node(
    node: Node, api: RunningAPI, dirs: Dirs
) -> None:
    claim = put_claim(api, "train", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    first = await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    assert first.error == ""
    assert nodes_and_hca(spec_of(dirs, uid)) == (
        ["/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"],
        ["NCCL_IB_HCA==mlx5_0"],
    )
    assert decode(entry_path(dirs, uid).read_bytes()).boot_id == BOOT_A

    empty_cdi(dirs)
    reads, again_before = api.count("GET", CLAIMS), outcome("resolved_again")
    today = node.tree(SWAPPED, BOOT_B + "\n")
    again = await node.prepare(today, claim)
    assert again == first  # the CDI ids are the claim's uid and device: kubelet hears the same
    assert nodes_and_hca(spec_of(dirs, uid)) == (
        ["/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"],
        ["NCCL_IB_HCA==mlx5_1"],
    )
    assert api.count("GET", CLAIMS) == reads  # resolved from the entry, not the API
    assert outcome("resolved_again") == again_before + 1
    entry = decode(entry_path(dirs, uid).read_bytes())
    assert entry.boot_id == BOOT_B and entry.spec == spec_of(dirs, uid)

    # The same boot again (the driver restarted, no reboot): the entry is trusted, nothing rewritten.
    spec = spec_file(dirs, uid)
    before = (spec.stat().st_ino, spec.stat().st_mtime_ns, entry_path(dirs, uid).read_bytes())
    assert await node.prepare(today, claim) == first
    assert (spec.stat().st_ino, spec.stat().st_mtime_ns, entry_path(dirs, uid).read_bytes()) == before
    assert outcome("resolved_again") == again_before + 1
    assert await node.unprepare(today, claim) == ""
    assert os.listdir(dirs.cdi) == [] and not entry_path(dirs, uid).exists()


async def test_a_claim_of_two_devices_gets_each_its_own_new_verbs_node(
    node: Node, api: RunningAPI, dirs: Dirs
) -> None:
    """Each CDI device carries its own device's uverbs node: after the swap, each the other's old one."""
    dev_b = "pci-0000-29-00-0"
    claim = put_claim(api, "pair", [result(DEV_A, request="a"), result(dev_b, request="b")])
    uid = claim["metadata"]["uid"]
    first = await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    assert [d.device_name for d in first.devices] == [DEV_A, dev_b]
    empty_cdi(dirs)
    assert await node.prepare(node.tree(SWAPPED, BOOT_B), claim) == first
    spec = spec_of(dirs, uid)
    per_device = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}
    assert per_device == {
        f"{uid}-{DEV_A}": ["/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"],
        f"{uid}-{dev_b}": ["/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"],
    }
    assert nodes_and_hca(spec)[1] == ["NCCL_IB_HCA==mlx5_0,mlx5_1"]  # the grant sorts them


async def test_the_same_boot_answers_from_the_entry_even_where_the_host_changed(
    node: Node, api: RunningAPI, dirs: Dirs
) -> None:
    """Within one boot the entry is the truth (the fast path reads no record and no verbs device): a
    lost spec is written back from it as it was."""
    claim = put_claim(api, "steady", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    first = await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    written = spec_file(dirs, uid).read_bytes()
    spec_file(dirs, uid).unlink()
    before = outcome("resolved_again")
    assert await node.prepare(node.tree(SWAPPED, BOOT_A), claim) == first
    assert spec_file(dirs, uid).read_bytes() == written
    assert outcome("resolved_again") == before


async def test_another_boot_replaces_a_spec_that_survived_it(node: Node, api: RunningAPI, dirs: Dirs) -> None:
    """A CDI directory that is not a tmpfs (`--cdi-dir /etc/cdi`) keeps the old boot's spec: both boots
    known and different, the claim is resolved again all the same."""
    claim = put_claim(api, "kept", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    first = await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    assert await node.prepare(node.tree(SWAPPED, BOOT_B), claim) == first
    assert nodes_and_hca(spec_of(dirs, uid))[0][0] == "/dev/infiniband/uverbs1"


async def test_another_boot_and_another_cdi_dir_write_the_new_spec_in_the_new_dir(
    node: Node, api: RunningAPI, dirs: Dirs
) -> None:
    """A reboot that also changed `--cdi-dir` (the old one not a tmpfs): the claim is resolved again and
    its new spec lands in the current directory; the old boot's spec in the old one is left (only files
    inside the current --cdi-dir are removed), as it was."""
    claim = put_claim(api, "moved", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    first = await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    old = spec_file(dirs, uid).read_bytes()
    node.dirs = Dirs(plugin=dirs.plugin, registry=dirs.registry, cdi=f"{dirs.cdi}-new")
    assert await node.prepare(node.tree(SWAPPED, BOOT_B), claim) == first
    assert nodes_and_hca(spec_of(node.dirs, uid))[0][0] == "/dev/infiniband/uverbs1"
    assert os.listdir(dirs.cdi) == [spec_file(dirs, uid).name] and spec_file(dirs, uid).read_bytes() == old
    entry = decode(entry_path(dirs, uid).read_bytes())
    assert entry.spec_path == str(spec_file(node.dirs, uid)) and entry.spec == spec_of(node.dirs, uid)


@pytest.mark.parametrize("gone", ["nic", "verbs"])
async def test_a_device_gone_after_the_reboot_fails_the_claim_and_writes_nothing(
    node: Node, api: RunningAPI, dirs: Dirs, gone: str
) -> None:
    """The NIC removed while the node was down (or its verbs device missing): the claim's error says
    which device and why, no spec is written, and the entry stays as it was (an unprepare removes it)."""
    claim = put_claim(api, "orphan", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    empty_cdi(dirs)
    entry = entry_path(dirs, uid).read_bytes()
    if gone == "nic":
        today = node.tree({NIC_B: ("mlx5_0", 0)}, BOOT_B)
    else:
        today = node.tree(SWAPPED, BOOT_B)
        os.unlink(today.path("/dev/infiniband/uverbs1"))
    answer = await node.prepare(today, claim)
    assert not answer.devices
    if gone == "nic":
        assert f"device {DEV_A}, no longer among this driver's devices on this node" in answer.error
        assert "earlier boot" in answer.error
    else:
        assert "mlx5_1" in answer.error, answer.error
    assert os.listdir(dirs.cdi) == []
    assert entry_path(dirs, uid).read_bytes() == entry
    assert await node.unprepare(today, claim) == ""
    assert not entry_path(dirs, uid).exists()


def older_entry(path: Path) -> None:
    """Rewrite a claim's file as a driver before boot ids wrote it: no `bootId`, its own checksum."""
    doc = json.loads(path.read_bytes())
    del doc["claim"]["bootId"]
    body = {"uid": doc["uid"], "claim": doc["claim"]}
    doc["checksum"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("spec", ["kept", "lost"])
async def test_an_older_drivers_entry_is_of_an_unknown_boot(
    node: Node, api: RunningAPI, dirs: Dirs, spec: str
) -> None:
    """An entry without a boot id loads (boot unknown). Its spec still there (the runtime's tmpfs was
    not emptied: no reboot) is trusted and left alone; gone, the claim is resolved again."""
    claim = put_claim(api, "old", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    first = await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    older_entry(entry_path(dirs, uid))
    assert Checkpoint(dirs.config().checkpoint_path).claims[uid].boot_id == ""
    written = spec_file(dirs, uid).read_bytes()
    if spec == "lost":
        empty_cdi(dirs)
    assert await node.prepare(node.tree(SWAPPED, BOOT_B), claim) == first
    verbs = nodes_and_hca(spec_of(dirs, uid))[0][0]
    if spec == "kept":
        assert spec_file(dirs, uid).read_bytes() == written and verbs == "/dev/infiniband/uverbs0"
        assert decode(entry_path(dirs, uid).read_bytes()).boot_id == ""  # not rewritten
    else:
        assert verbs == "/dev/infiniband/uverbs1"
        assert decode(entry_path(dirs, uid).read_bytes()).boot_id == BOOT_B


def test_an_entry_written_with_a_boot_id_reads_as_an_older_driver_reads_it(tmp_path: Path) -> None:
    """A downgrade keeps the claims: `bootId` is inside the checksummed body, so the older driver's
    checksum (of the body it finds) holds and its parser ignores the key it does not know."""
    device = PreparedDevice(("nic",), NODE, DEV_A, (f"{DRIVER}/nic=u-{DEV_A}",))
    claim = PreparedClaim("u", "ml", "c", (device,), "/cdi/x.json", {"kind": "k"}, BOOT_A)
    doc = json.loads(encode(claim))
    assert doc["kind"] == CLAIM_KIND and doc["version"] == CLAIM_VERSION
    body = {"uid": doc["uid"], "claim": doc["claim"]}
    assert doc["checksum"] == hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    assert doc["claim"]["bootId"] == BOOT_A
    assert decode(encode(claim, '{"kind": "k"}')) == claim  # the spliced encoding too
    assert decode(encode(claim)).boot_id == BOOT_A


@pytest.mark.parametrize("bad", [7, None, ["x"]])
async def test_an_entry_whose_boot_id_is_not_a_string_is_set_aside(
    node: Node, api: RunningAPI, dirs: Dirs, bad: Any
) -> None:
    """Checksummed yet not what `encode` writes: the file is moved aside as any damaged entry; the claim
    is prepared again from the API and its spec found by its name."""
    claim = put_claim(api, "odd", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    first = await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    path = entry_path(dirs, uid)
    doc = json.loads(path.read_bytes())
    doc["claim"]["bootId"] = bad
    doc["checksum"] = hashlib.sha256(
        json.dumps({"uid": doc["uid"], "claim": doc["claim"]}, sort_keys=True).encode()
    ).hexdigest()
    path.write_text(json.dumps(doc))
    reads = api.count("GET", CLAIMS)
    assert await node.prepare(node.tree(SWAPPED, BOOT_B), claim) == first
    assert api.count("GET", CLAIMS) == reads + 1
    assert Path(f"{path}.corrupt").exists()
    assert nodes_and_hca(spec_of(dirs, uid))[0][0] == "/dev/infiniband/uverbs1"


def boot_file(tmp_path: Path, content: str | bytes | None, kind: str = "file") -> HostRoot:
    b = SysfsBuilder(tmp_path / "h")
    b.mkdir(boot.DIRECTORY)
    path = f"{boot.DIRECTORY}/{boot.NAME}"
    if kind == "fifo":
        b.fifo(path)
    elif kind == "directory":
        b.mkdir(path)
    elif kind == "link-out":  # a valid boot id, outside the host root: refused, never followed
        outside = tmp_path / "outside"
        outside.write_text(BOOT_B + "\n")
        b.link(path, outside)
    elif kind == "link-in":
        b.write("/run/boot", BOOT_B + "\n")
        b.link(path, "/run/boot")
    elif content is not None:
        b.write(path, content)
    return b.host


@pytest.mark.parametrize(
    ("content", "kind", "want"),
    [
        (BOOT_A + "\n", "file", BOOT_A),
        (BOOT_A, "file", BOOT_A),
        ("not a boot id\n", "file", ""),
        (BOOT_A.upper() + "\n", "file", ""),
        (BOOT_A + "\n" + BOOT_B + "\n", "file", ""),
        (" " + BOOT_A + "\n", "file", ""),
        (b"\xff\xfe" + BOOT_A.encode(), "file", ""),
        ("", "file", ""),
        ("a" * (1 << 20), "file", ""),
        (None, "file", ""),  # /proc there, the file not
        (None, "fifo", ""),
        (None, "directory", ""),
        (None, "link-out", ""),
        (None, "link-in", BOOT_B),
    ],
)
def test_a_boot_id_that_cannot_be_read_or_is_not_one_is_unknown(
    tmp_path: Path, content: str | bytes | None, kind: str, want: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert boot.current(boot_file(tmp_path, content, kind)) == want
    if want == "":
        assert any("boot id" in r.getMessage() for r in caplog.records)


def test_a_host_root_without_proc_reads_this_kernels_boot_id(tmp_path: Path) -> None:
    """The chart mounts the host's /sys and /dev under the host root, not /proc: the boot id is the
    kernel's, the same from the container's own /proc."""
    b = SysfsBuilder(tmp_path / "h")
    b.mkdir("/sys")
    own = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert boot.current(b.host) == own != ""


async def test_a_boot_id_that_cannot_be_read_resolves_again_only_where_the_spec_is_gone(
    node: Node, api: RunningAPI, dirs: Dirs
) -> None:
    """Garbage where the boot id belongs: every boot is unknown. The entry records none; its spec there,
    the entry is trusted; gone, the claim is resolved again (a reboot empties the runtime's tmpfs)."""
    claim = put_claim(api, "blind", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    first = await node.prepare(node.tree(BEFORE, "garbage\n"), claim)
    assert decode(entry_path(dirs, uid).read_bytes()).boot_id == ""
    written = spec_file(dirs, uid).read_bytes()
    assert await node.prepare(node.tree(SWAPPED, b"\0" * 100_000), claim) == first
    assert spec_file(dirs, uid).read_bytes() == written
    empty_cdi(dirs)
    assert await node.prepare(node.tree(SWAPPED, "x"), claim) == first
    assert nodes_and_hca(spec_of(dirs, uid))[0][0] == "/dev/infiniband/uverbs1"


async def test_a_crash_between_the_entry_and_the_spec_leaves_an_entry_of_todays_devices(
    node: Node, api: RunningAPI, dirs: Dirs
) -> None:
    """The entry is rewritten (synced) before the spec: a failure (here the spec's directory is not a
    directory; a kill is the same) leaves an entry naming today's devices, and the next prepare, in this
    boot, writes the spec from it without resolving again."""
    claim = put_claim(api, "torn", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    first = await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    shutil.rmtree(dirs.cdi)
    Path(dirs.cdi).write_text("")  # every spec write fails (ENOTDIR) after the entry's
    today = node.tree(SWAPPED, BOOT_B)
    failed = await node.prepare(today, claim)
    assert "writing the CDI spec or the checkpoint failed" in failed.error
    entry = decode(entry_path(dirs, uid).read_bytes())
    assert entry.boot_id == BOOT_B
    assert nodes_and_hca(entry.spec)[0][0] == "/dev/infiniband/uverbs1"
    os.unlink(dirs.cdi)
    os.makedirs(dirs.cdi)
    resolved, repeated = outcome("resolved_again"), outcome("repeated")
    assert await node.prepare(today, claim) == first
    assert spec_of(dirs, uid) == entry.spec
    assert (outcome("resolved_again"), outcome("repeated")) == (resolved, repeated + 1)


async def test_an_entry_of_another_pool_is_not_prepared_again(
    node: Node, api: RunningAPI, dirs: Dirs
) -> None:
    """The node's pool renamed between the boots (another node name): the entry's devices are not this
    pool's, and the claim says so rather than guessing."""
    claim = put_claim(api, "moved", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    empty_cdi(dirs)
    path = entry_path(dirs, uid)
    doc = json.loads(path.read_bytes())
    doc["claim"]["devices"][0]["pool"] = "another-node"
    doc["checksum"] = hashlib.sha256(
        json.dumps({"uid": doc["uid"], "claim": doc["claim"]}, sort_keys=True).encode()
    ).hexdigest()
    path.write_text(json.dumps(doc))
    answer = await node.prepare(node.tree(SWAPPED, BOOT_B), claim)
    assert "prepared in pool another-node" in answer.error and f"pool is {NODE}" in answer.error
    assert os.listdir(dirs.cdi) == []


async def test_the_boot_id_is_read_once_at_start(node: Node, api: RunningAPI, dirs: Dirs) -> None:
    """A boot does not change under a running driver: the file is not read again per call (a repeated
    prepare costs what it cost), so what it holds later changes nothing until the next start."""
    claim = put_claim(api, "once", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    b = node.tree(BEFORE, BOOT_A)
    async with driving(api, dirs, b.host, read(b)) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        first = await plugin.prepare(ref(claim))
        b.write(f"{boot.DIRECTORY}/{boot.NAME}", BOOT_B)
        before, ino = outcome("resolved_again"), spec_file(dirs, uid).stat().st_ino
        assert await plugin.prepare(ref(claim)) == first
        assert (outcome("resolved_again"), spec_file(dirs, uid).stat().st_ino) == (before, ino)
    assert r.driver.preparer.boot_id == BOOT_A


async def test_a_repeated_prepare_after_a_reboot_killed_at_any_call_never_leaves_a_spec_ahead_of_its_entry(
    api: RunningAPI, dirs: Dirs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed at every system call of the resolving prepare in turn, restarted (same boot): a spec on
    disk is always the entry's (the entry is rewritten first), and the next prepare answers the claim
    whole with today's device nodes."""
    from test_dra_attack_hop import Kill, at

    kill = Kill(os.path.dirname(dirs.cdi), monkeypatch)
    base = os.path.dirname(dirs.cdi)
    yesterday, today = host(tmp_path / "a", BEFORE, BOOT_A), host(tmp_path / "b", SWAPPED, BOOT_B)
    before, after = RecordSource(read(yesterday)), RecordSource(read(today))
    claim = put_claim(api, "victim", [result(DEV_A), result("pci-0000-29-00-0", request="other")])
    uid = claim["metadata"]["uid"]
    for n in range(200):
        d = at(base, n)
        p = start_preparer(api, d, yesterday.host, before)
        assert (await p.prepare([ref(claim)]))[uid].error == ""
        await p.syncs.drain(5)
        empty_cdi(d)
        p = start_preparer(api, d, today.host, after)
        kill.arm(n)
        told = (await p.prepare([ref(claim)]))[uid].error == ""
        finished = not kill.dead
        kill.arm(None)
        spec = Path(d.cdi, f"{DRIVER}-nic_{uid}.json")
        entry = Checkpoint(d.config().checkpoint_path).claims[uid]  # never lost: rewritten by rename
        if spec.exists():
            assert entry.boot_id == BOOT_B and json.loads(spec.read_text()) == entry.spec, f"call {n}"
        assert entry.boot_id in (BOOT_A, BOOT_B)
        assert not told or spec.exists(), f"call {n}: answered without its spec"
        again = (await start_preparer(api, d, today.host, after).prepare([ref(claim)]))[uid]
        assert again.error == "" and len(again.devices) == 2, f"call {n}: {again.error}"
        assert nodes_and_hca(spec_of(d, uid))[0][0] == "/dev/infiniband/uverbs1", f"call {n}"
        assert Checkpoint(d.config().checkpoint_path).claims[uid].boot_id == BOOT_B
        if finished:
            assert n > 5, "the resolving prepare made fewer calls than its two files need"
            return
    raise AssertionError("a prepare of more than 200 calls")


async def test_a_nic_probed_after_the_first_pass_is_prepared_on_kubelets_retry(
    node: Node, api: RunningAPI, dirs: Dirs
) -> None:
    """The record read before the NIC's driver probed it lacks the device: the claim fails (its entry
    intact), and kubelet's retry, after a pass that found it, prepares it with today's node."""
    claim = put_claim(api, "late", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    first = await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    empty_cdi(dirs)
    early = node.tree({NIC_B: ("mlx5_0", 0)}, BOOT_B)
    async with driving(api, dirs, early.host, read(early)) as r:
        plugin = await r.kubelet.wait_registered(DRIVER)
        failed = (await plugin.prepare(ref(claim)))[uid]
        assert "kubelet retries" in failed.error and os.listdir(dirs.cdi) == []
        early.nic(NIC_A, "ens1", numa=0, rdma="mlx5_1", verbs=1)  # probed now
        r.source.update(read(early))  # the next pass
        assert await plugin.prepare(ref(claim)) == {uid: first}
    assert nodes_and_hca(spec_of(dirs, uid))[1] == ["NCCL_IB_HCA==mlx5_1"]


async def test_an_entry_naming_a_spec_and_no_device_is_written_back_as_it_is(
    node: Node, api: RunningAPI, dirs: Dirs
) -> None:
    """Nothing in it for a boot to rename (only a damaged entry names a spec and no device): its spec
    is rewritten from it, as before boot ids, never resolved into an empty one."""
    claim = put_claim(api, "hollow", [result(DEV_A)])
    uid = claim["metadata"]["uid"]
    await node.prepare(node.tree(BEFORE, BOOT_A), claim)
    empty_cdi(dirs)
    path = entry_path(dirs, uid)
    doc = json.loads(path.read_bytes())
    doc["claim"]["devices"] = []
    doc["checksum"] = hashlib.sha256(
        json.dumps({"uid": doc["uid"], "claim": doc["claim"]}, sort_keys=True).encode()
    ).hexdigest()
    path.write_text(json.dumps(doc))
    answer = await node.prepare(node.tree(SWAPPED, BOOT_B), claim)
    assert answer.error == "" and not answer.devices
    assert spec_of(dirs, uid) == decode(path.read_bytes()).spec != {}
