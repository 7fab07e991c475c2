"""Reads through a descriptor a pass holds (`child_link_read`, `child_listing_opt` / `Listing`), attacked:
every kind of attribute a hostile host can put there leaves no descriptor open, whatever is read or
refused; the held directory removed or replaced (by a file, a FIFO, a link out of the root) between its
resolution and its reads neither blocks nor reads outside the root; names that are not one component are
refused before anything is opened.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from test_dm_host_attributes import KINDS, NAMES

from nodefabric_devicemanager import hostroot
from nodefabric_devicemanager.hostroot import HostReadError, HostRoot


def _descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _outcome(call: Callable[[], object]) -> tuple[str, object]:
    try:
        return ("value", call())
    except (HostReadError, FileNotFoundError) as exc:
        return (type(exc).__name__, str(exc))


def _within(seconds: float, call: Callable[[], object]) -> tuple[str, object]:
    """`_outcome(call)` in a thread, which must be done within `seconds`: a read that blocks fails here."""
    got: list[tuple[str, object]] = []
    t = threading.Thread(target=lambda: got.append(_outcome(call)), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the read blocked"
    return got[0]


@pytest.fixture
def tree(tmp_path: Path) -> HostRoot:
    """/sys/bus/dev -> ../devices/dev (a function's link) and /sys/devices/dev/net/eth0 (a listed
    directory's entry), each holding every kind of attribute; "SECRET" outside the root."""
    root = tmp_path / "root"
    dev = root / "sys" / "devices" / "dev"
    eth0 = dev / "net" / "eth0"
    eth0.mkdir(parents=True)
    (tmp_path / "outside").write_text("SECRET\n")  # what KINDS' link-outside lands on
    outside_dir = tmp_path / "outside-dir"
    outside_dir.mkdir()
    for name in ("plain", "mtu"):
        (outside_dir / name).write_text("SECRET\n")
    for d in (dev, eth0):
        for name, make in KINDS.items():
            make(d / name)
        # KINDS' link-outside is spelled for a directory two below the root's parent
        (d / "link-outside").unlink()
        (d / "link-outside").symlink_to(os.path.relpath(tmp_path / "outside", d))
    bus = root / "sys" / "bus"
    bus.mkdir()
    (bus / "dev").symlink_to("../devices/dev")
    return HostRoot.at(root)


@pytest.mark.parametrize("name", NAMES)
def test_every_kind_of_attribute_read_through_a_held_descriptor_leaves_none_open(
    tree: HostRoot, name: str
) -> None:
    bus, devices = tree.dir("/sys/bus"), tree.dir("/sys/devices/dev")
    before = _descriptors()
    for names in ((name,), ("plain", name, "no-newline")):
        for link in ("link-inside", "link-outside", "link-loop", name):
            got = _within(10, lambda names=names, link=link: bus.child_link_read("dev", names, link)[1:])
            assert "SECRET" not in str(got)
        for lenient in (True, False):

            def listed(names: tuple[str, ...] = names, lenient: bool = lenient) -> object:
                listing = devices.child_listing_opt("net")
                assert listing is not None
                with listing:
                    if lenient:
                        return listing.values("eth0", True, names)[1]
                    return listing.reads("eth0", True, names)

            got = _within(10, listed)
            assert "SECRET" not in str(got)
    assert _descriptors() == before


def _swap_in_check(monkeypatch: pytest.MonkeyPatch, when: str, change: Callable[[Path], object]) -> list[str]:
    """`HostRoot.contains` made to apply `change` to the directory `when` names, the first time it is
    checked: between the resolution (or listing) and the reads. Returns a list the change is logged in."""
    contains = HostRoot.contains
    done: list[str] = []

    def swap_then_check(self: HostRoot, resolved: str) -> bool:
        if resolved == when and not done:
            done.append(resolved)
            change(Path(resolved))
        return contains(self, resolved)

    monkeypatch.setattr(HostRoot, "contains", swap_then_check)
    return done


def _removed(p: Path) -> None:
    shutil.rmtree(p)


def _by_file(p: Path) -> None:
    shutil.rmtree(p)
    p.write_text("x\n")


def _by_fifo(p: Path) -> None:
    shutil.rmtree(p)
    os.mkfifo(p)


def _link_out(p: Path) -> None:
    """A link at `p` to the directory beside the root that holds "SECRET" attributes."""
    outside = next(a / "outside-dir" for a in p.parents if (a / "outside-dir").is_dir())
    p.symlink_to(os.path.relpath(outside, p.parent))
    assert (p / "plain").read_text() == "SECRET\n"


def _by_link_out(p: Path) -> None:
    shutil.rmtree(p)
    _link_out(p)


def _renamed_then_link_out(p: Path) -> None:
    p.rename(p.with_name(p.name + ".old"))
    _link_out(p)


SWAPS = {
    "removed": _removed,
    "by-file": _by_file,
    "by-fifo": _by_fifo,
    "by-link-out": _by_link_out,
    "renamed-then-link-out": _renamed_then_link_out,
}


@pytest.mark.parametrize("swap", SWAPS)
def test_a_function_directory_swapped_after_its_resolution_is_never_read_outside_the_root(
    tree: HostRoot, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    bus = tree.dir("/sys/bus")
    dev = tree.dir("/sys/devices/dev").path
    done = _swap_in_check(monkeypatch, dev, SWAPS[swap])
    before = _descriptors()
    kind, got = _within(10, lambda: bus.child_link_read("dev", ("plain", "no-newline"), "link-inside"))
    assert done and _descriptors() == before
    assert "SECRET" not in str(got)
    if swap == "renamed-then-link-out":
        # The directory that was resolved and checked, wherever it went: its own values.
        assert kind == "value" and got[1:] == (["9000", "up"], "plain")  # type: ignore[index]
    else:
        # Removed before anything was read: gone, not a value read from whatever is at its path now.
        assert kind == "value" and got[1:] == ([None, None], None)  # type: ignore[index]


@pytest.mark.parametrize("swap", SWAPS)
def test_a_listed_directory_swapped_after_its_listing_is_never_read_outside_the_root(
    tree: HostRoot, swap: str
) -> None:
    devices = tree.dir("/sys/devices/dev")
    net = Path(devices.path) / "net"
    before = _descriptors()
    listing = devices.child_listing_opt("net")
    assert listing is not None
    with listing:
        SWAPS[swap](net)
        lenient = _within(10, lambda: listing.values("eth0", True, ("plain", "mtu"))[1])
        strict = _within(10, lambda: listing.reads("eth0", True, ("plain",)))
    assert _descriptors() == before
    assert "SECRET" not in str((lenient, strict))
    if swap == "renamed-then-link-out":
        assert lenient == ("value", ["9000", None]) and strict == ("value", ["9000"])
    else:
        assert lenient == ("value", [None, None]) and strict[0] == "FileNotFoundError"


@pytest.mark.parametrize("bad", ["", ".", "..", "../eth0", "eth0/..", "a/b", "/"])
def test_a_name_that_is_not_one_component_is_refused_before_a_held_descriptor_is_used(
    tree: HostRoot, bad: str
) -> None:
    devices, bus = tree.dir("/sys/devices/dev"), tree.dir("/sys/bus")
    before = _descriptors()
    listing = devices.child_listing_opt("net")
    assert listing is not None
    with listing:
        for is_dir in (True, False):
            with pytest.raises(ValueError, match="not a single path component"):
                listing.values(bad, is_dir, ("plain",))
            with pytest.raises(ValueError, match="not a single path component"):
                listing.reads(bad, is_dir, ("plain",))
            with pytest.raises(ValueError, match="not a single path component"):
                listing.values("eth0", is_dir, ("plain", bad))
            with pytest.raises(ValueError, match="not a single path component"):
                listing.reads("eth0", is_dir, (bad,))
    for call in (
        lambda: bus.child_link_read(bad, ("plain",), "link-inside"),
        lambda: bus.child_link_read("dev", ("plain", bad), "link-inside"),
        lambda: bus.child_link_read("dev", ("plain",), bad),
        lambda: devices.child_listing_opt(bad),
    ):
        with pytest.raises(ValueError, match="not a single path component"):
            call()
    assert _descriptors() == before


def test_a_name_with_a_nul_byte_is_refused_and_leaves_nothing_open(tree: HostRoot) -> None:
    devices, bus = tree.dir("/sys/devices/dev"), tree.dir("/sys/bus")
    before = _descriptors()
    listing = devices.child_listing_opt("net")
    assert listing is not None
    with listing, pytest.raises(ValueError, match="null"):
        listing.values("eth0", True, ("pl\0ain",))
    with pytest.raises(ValueError, match="null"):
        bus.child_link_read("dev", ("pl\0ain",), "link-inside")
    assert _descriptors() == before


def test_a_listing_of_a_huge_directory_reads_each_entry_through_it(tmp_path: Path) -> None:
    ports = tmp_path / "root" / "sys" / "ports"
    for n in range(3000):
        (ports / str(n)).mkdir(parents=True)
        (ports / str(n) / "state").write_text(f"{n}: ACTIVE\n")
    above = HostRoot.at(tmp_path / "root").dir("/sys")
    before = _descriptors()
    listing = above.child_listing_opt("ports")
    assert listing is not None
    with listing:
        got = {name: listing.reads(name, is_dir, ("state",))[0] for name, is_dir in listing.entries}
    assert got == {str(n): f"{n}: ACTIVE" for n in range(3000)}
    assert _descriptors() == before


def test_a_listing_used_after_it_is_closed_reads_by_path(tree: HostRoot) -> None:
    listing = tree.dir("/sys/devices/dev").child_listing_opt("net")
    assert listing is not None
    listing.close()
    other = os.open(tree.root, os.O_RDONLY)  # most likely the number the listing's descriptor had
    try:
        listing.close()  # twice: nothing to close the second time, and not `other`
        os.fstat(other)
        assert listing.values("eth0", True, ("plain",))[1] == ["9000"]
    finally:
        os.close(other)


def _entry_by_link_inside(p: Path) -> None:
    p.rename(p.with_name("eth0.real"))
    p.symlink_to("eth0.real")


ENTRY_SWAPS = {
    "removed": _removed,
    "by-file": _by_file,
    "by-fifo": _by_fifo,
    "by-link-out": _by_link_out,
    "by-link-inside": _entry_by_link_inside,
    "by-dangling-link": lambda p: (shutil.rmtree(p), p.symlink_to("gone")),
    "by-looping-link": lambda p: (shutil.rmtree(p), p.symlink_to("eth0")),
}


@pytest.mark.parametrize("swap", ENTRY_SWAPS)
def test_an_entry_swapped_after_the_listing_saw_a_directory_is_read_as_what_it_is_now(
    tree: HostRoot, swap: str
) -> None:
    """The listing saw `eth0` as a real directory; before its attributes are read it is replaced. A
    two-component open (`eth0/plain`) with O_NOFOLLOW would follow a link put in place of `eth0` (only the
    last component is not followed): what is there now is read as `child` reads it, checked and refused
    when it leaves the root, never read through."""
    devices = tree.dir("/sys/devices/dev")
    net = Path(devices.path) / "net"
    before = _descriptors()
    listing = devices.child_listing_opt("net")
    assert listing is not None
    with listing:
        assert ("eth0", True) in listing.entries
        ENTRY_SWAPS[swap](net / "eth0")
        lenient = _within(10, lambda: listing.values("eth0", True, ("plain", "mtu"))[1])
        strict = _within(10, lambda: listing.reads("eth0", True, ("plain",)))
    assert _descriptors() == before
    assert "SECRET" not in str((lenient, strict))
    now = listing.dir
    if swap == "removed":
        absent = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), f"{net}/eth0/plain")
        assert lenient == ("value", [None, None]) and strict == ("FileNotFoundError", str(absent))
    else:  # what `child` (the path-based steps, with every check) answers for what is there now
        assert lenient == _outcome(lambda: now.child("eth0").values(("plain", "mtu")))
        assert strict == _outcome(lambda: now.child("eth0").reads(("plain",)))
    if swap == "by-link-out":
        assert lenient[0] == "PathEscapesRoot"


def test_the_names_checked_once_stay_bounded_and_a_bad_name_is_refused_after_they_fill(
    tree: HostRoot,
) -> None:
    devices = tree.dir("/sys/devices/dev")
    for n in range(2 * hostroot._CHECKED_NAMES_MAX):
        assert devices.values((f"absent{n}",)) == [None]
    assert len(hostroot._CHECKED_NAMES) <= hostroot._CHECKED_NAMES_MAX
    for bad in (("plain", "../outside"), ("..",), ("a/b",)):
        with pytest.raises(ValueError, match="not a single path component"):
            devices.values(bad)
        assert bad not in hostroot._CHECKED_NAMES
