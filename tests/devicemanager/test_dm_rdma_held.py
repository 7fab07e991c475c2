"""An RDMA device's ports read through the descriptor that held its directory (`Listing.held`, then
`child_listing_opt("ports", dir_fd)`), attacked through a real tree: the device directory swapped after
the `infiniband` listing saw it, and after it was held, for what is not it (removed, a file, a FIFO, a
link out of the root, renamed away). No port outside the root is ever read, nothing blocks, no
descriptor is left open, and each answer is what the host has there: the held directory's own ports, or
the path-based steps' verdict for what is there now."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from nodefabric_devicemanager import hostroot, rdma
from nodefabric_devicemanager.hostroot import HostRoot, Listing, SysDir
from nodefabric_devicemanager.models import LinkState


def _descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _port(ports: Path, state: str, phys: str) -> None:
    (ports / "1").mkdir(parents=True)
    (ports / "1" / "state").write_text(f"{state}\n")
    (ports / "1" / "phys_state").write_text(f"{phys}\n")


@pytest.fixture
def fn(tmp_path: Path) -> SysDir:
    """A function whose RDMA device mlx5_0 has one DOWN port; beside the root, a directory whose port is
    ACTIVE/LinkUp: a verdict of ok can only come from outside the root."""
    root = tmp_path / "root"
    dev = root / "sys" / "devices" / "pci0000:00" / "0000:00:01.0"
    _port(dev / "infiniband" / "mlx5_0" / "ports", "1: DOWN", "3: Disabled")
    _port(tmp_path / "outside-dev" / "ports", "4: ACTIVE", "5: LinkUp")
    return HostRoot.at(root).dir("/sys/devices/pci0000:00/0000:00:01.0")


def _link_out(p: Path) -> None:
    outside = next(a / "outside-dev" for a in p.parents if (a / "outside-dev").is_dir())
    p.symlink_to(os.path.relpath(outside, p.parent))
    assert (p / "ports" / "1" / "state").read_text() == "4: ACTIVE\n"


def _by_fifo(p: Path) -> None:
    shutil.rmtree(p)
    os.mkfifo(p)


def _by_file(p: Path) -> None:
    shutil.rmtree(p)
    p.write_text("x\n")


SWAPS: dict[str, Callable[[Path], object]] = {
    "removed": shutil.rmtree,
    "by-file": _by_file,
    "by-fifo": _by_fifo,
    "by-link-out": lambda p: (shutil.rmtree(p), _link_out(p)),
    "renamed-then-link-out": lambda p: (p.rename(p.with_name("mlx5_0.old")), _link_out(p)),
}


def _swap_at_first_ports_listing(
    monkeypatch: pytest.MonkeyPatch, swap: Callable[[Path], object]
) -> list[str]:
    """`swap(<device dir>)` run just before the first listing of a device's `ports` (after the device was
    held); the list returned names the device once it ran."""
    real = SysDir.child_listing_opt
    done: list[str] = []

    def swap_first(self: SysDir, name: str, dir_fd: int | None = None) -> Listing | None:
        if name == "ports" and not done:
            done.append(self.path)
            swap(Path(self.path))
        return real(self, name) if dir_fd is None else real(self, name, dir_fd)

    monkeypatch.setattr(SysDir, "child_listing_opt", swap_first)
    return done


def _before_first_held(monkeypatch: pytest.MonkeyPatch, act: Callable[[Path, str], object]) -> list[str]:
    """`act(<listed directory>, <entry name>)` run just before the first `Listing.held`, between the
    `infiniband` listing and the hold; the list returned names the entry once it ran."""
    real = Listing.held
    done: list[str] = []

    def act_first(self: Listing, name: str, is_dir: bool) -> tuple[SysDir, int | None]:
        if not done:
            done.append(name)
            act(Path(self.dir.path), name)
        return real(self, name, is_dir)

    monkeypatch.setattr(Listing, "held", act_first)
    return done


def _renamed_with_link_out(then: Callable[[Path], object]) -> Callable[[Path], None]:
    """The device renamed to `mlx5_0.old`, `then(<renamed>)`, and a link out of the root put at its name."""

    def swap(p: Path) -> None:
        held = p.with_name("mlx5_0.old")
        p.rename(held)
        then(held)
        _link_out(p)

    return swap


def _binding(fn: SysDir) -> rdma.Binding:
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(rdma.binding(fn)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the read blocked"
    assert isinstance(got[0], rdma.Binding)
    return got[0]


def test_the_ports_are_read_relative_to_the_held_device(fn: SysDir, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int | None] = []
    real = SysDir.child_listing_opt

    def watched(self: SysDir, name: str, dir_fd: int | None = None) -> Listing | None:
        if name == "ports":
            seen.append(dir_fd)
        return real(self, name, dir_fd)

    monkeypatch.setattr(SysDir, "child_listing_opt", watched)
    before = _descriptors()
    b = _binding(fn)
    assert seen and seen[0] is not None
    assert _descriptors() == before
    assert b.device == "mlx5_0" and b.link is not None and b.link.state is LinkState.FAILED
    assert b.link.reason == "mlx5_0: port 1 state '1: DOWN' phys_state '3: Disabled'"


@pytest.mark.parametrize("swap", SWAPS)
def test_a_device_swapped_after_it_was_held_is_read_as_held_never_outside(
    fn: SysDir, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    """Held (O_PATH, relative to the listing), then swapped before its ports are opened: by the whole
    path, `.../mlx5_0/ports` would follow a link put in place of `mlx5_0` out of the root."""
    done = _swap_at_first_ports_listing(monkeypatch, SWAPS[swap])
    before = _descriptors()
    b = _binding(fn)
    assert done and _descriptors() == before
    assert b.device == "mlx5_0" and b.link is not None
    assert b.link.state is not LinkState.OK and "ACTIVE" not in b.link.reason
    if swap == "renamed-then-link-out":
        # The directory that was held, wherever it went: its own port.
        assert b.link.state is LinkState.FAILED and "'1: DOWN'" in b.link.reason
    else:
        # Removed before its ports were opened: they are absent, not whatever is at its path now.
        assert b.link.state is LinkState.UNVERIFIED and b.link.reason == "mlx5_0: no ports to read"


@pytest.mark.parametrize("swap", SWAPS)
def test_a_device_swapped_after_the_listing_is_read_as_what_it_is_now(
    fn: SysDir, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    """Swapped between the `infiniband` listing and `held`: what is there now takes the path-based steps
    (`listed_child`), with every check: refused when it leaves the root or is not a directory."""
    done = _before_first_held(monkeypatch, lambda listed, name: SWAPS[swap](listed / name))
    before = _descriptors()
    b = _binding(fn)
    assert done and _descriptors() == before
    assert b.device == "mlx5_0" and b.link is not None
    assert b.link.state is LinkState.UNVERIFIED and "ACTIVE" not in b.link.reason
    if swap in ("by-link-out", "renamed-then-link-out"):
        assert b.link.reason.startswith("mlx5_0: unreadable: ") and "outside" in b.link.reason
    elif swap in ("by-file", "by-fifo"):
        assert b.link.reason.startswith("mlx5_0: unreadable: ") and "not a directory" in b.link.reason
    else:
        assert b.link.reason == "mlx5_0: no ports to read"


def test_ports_swapped_for_a_link_out_are_refused(fn: SysDir) -> None:
    ports = Path(fn.path) / "infiniband" / "mlx5_0" / "ports"
    shutil.rmtree(ports)
    outside = next(a / "outside-dev" / "ports" for a in ports.parents if (a / "outside-dev").is_dir())
    ports.symlink_to(os.path.relpath(outside, ports.parent))
    assert (ports / "1" / "state").read_text() == "4: ACTIVE\n"
    before = _descriptors()
    b = _binding(fn)
    assert _descriptors() == before
    assert b.link is not None and b.link.state is LinkState.UNVERIFIED
    assert "ports unreadable" in b.link.reason and "outside" in b.link.reason


def test_without_proc_the_device_is_still_held_and_its_ports_read(
    fn: SysDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostroot, "_HAVE_FD_LINKS", False)
    b = _binding(fn)
    assert b.link is not None and b.link.reason == "mlx5_0: port 1 state '1: DOWN' phys_state '3: Disabled'"


def test_an_interrupt_at_any_close_leaves_no_descriptor_open(
    fn: SysDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyboardInterrupt that arrives as any descriptor of `binding` is closed (the close done, the
    signal heard after it) comes out of `binding`, and every other descriptor it held is closed too: the
    device's, the listing's, the ports listing's, the port's, an attribute's."""
    real = os.close
    at = 1
    while True:
        seen = [0]

        def close(fd: int, at: int = at, seen: list[int] = seen) -> None:
            seen[0] += 1
            real(fd)
            if seen[0] == at:
                raise KeyboardInterrupt

        before = _descriptors()
        monkeypatch.setattr(os, "close", close)
        try:
            rdma.binding(fn)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        finally:
            monkeypatch.setattr(os, "close", real)
        assert _descriptors() == before, f"close {at}"
        if not interrupted:
            break
        at += 1
    assert at > 5  # every close of the pass was interrupted in turn


def _held_ports_by_file(p: Path) -> None:
    shutil.rmtree(p / "ports")
    (p / "ports").write_text("x\n")


def _held_ports_by_link(p: Path) -> None:
    shutil.rmtree(p / "ports")
    (p / "ports").symlink_to("ports")  # a loop: ELOOP however it is opened


def _held_ports_by_fifo(p: Path) -> None:
    shutil.rmtree(p / "ports")
    os.mkfifo(p / "ports")


@pytest.mark.parametrize(
    "ports_swap",
    [_held_ports_by_file, _held_ports_by_link, _held_ports_by_fifo],
    ids=["file", "link-loop", "fifo"],
)
def test_held_ports_that_are_not_a_directory_are_judged_in_the_held_device_never_by_its_old_path(
    fn: SysDir, monkeypatch: pytest.MonkeyPatch, ports_swap: Callable[[Path], None]
) -> None:
    """Held, then renamed away with a link out of the root put at its name, and its own `ports` made a
    file, a link or a FIFO: the open of `ports` relative to the held device fails, and what it is must
    be asked of the held device, not of `<old path>/ports`, which now names the port outside the root
    (the path-based steps would take that real directory for the device's ports and read ACTIVE)."""
    done = _swap_at_first_ports_listing(monkeypatch, _renamed_with_link_out(ports_swap))
    before = _descriptors()
    b = _binding(fn)
    assert done and _descriptors() == before
    assert b.device == "mlx5_0" and b.link is not None
    assert b.link.state is LinkState.UNVERIFIED, b.link.reason
    assert "ACTIVE" not in b.link.reason and "ports unreadable" in b.link.reason, b.link.reason


def test_a_port_that_is_a_link_in_the_held_ports_is_never_read_by_the_old_path(
    fn: SysDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held, then renamed away with a link out of the root put at its name, and its port `1` made a link
    (to a port directory inside the root): the held `ports` listing opens fine, the port takes the
    path-based steps (a link), and `<old path>/ports/1` now names the port outside the root."""

    def port_made_a_link(held: Path) -> None:
        (held / "ports" / "1").rename(held / "port1.real")
        (held / "ports" / "1").symlink_to("../port1.real")

    done = _swap_at_first_ports_listing(monkeypatch, _renamed_with_link_out(port_made_a_link))
    before = _descriptors()
    b = _binding(fn)
    assert done and _descriptors() == before
    assert b.device == "mlx5_0" and b.link is not None
    assert b.link.state is not LinkState.OK and "ACTIVE" not in b.link.reason, b.link.reason


@pytest.mark.parametrize("device_then", ["removed", "by-link"])
def test_an_infiniband_directory_swapped_after_its_listing_is_never_read_by_its_old_path(
    fn: SysDir, monkeypatch: pytest.MonkeyPatch, device_then: str
) -> None:
    """Between the `infiniband` listing and `held`: the listed directory renamed away, its device removed
    (or made a link), and a link out of the root put at its name, holding a device `mlx5_0` whose port is
    ACTIVE. The device gone from (or a link in) what was listed must not send the read by
    `<infiniband>/mlx5_0/ports`, which now leads outside the root."""
    top = next(a for a in Path(fn.path).parents if (a / "outside-dev").is_dir())
    outside_ib = top / "outside-ib"
    shutil.copytree(top / "outside-dev", outside_ib / "mlx5_0")

    def swap(p: Path, name: str) -> None:
        p.rename(p.with_name("infiniband.old"))
        dev = p.with_name("infiniband.old") / name
        shutil.rmtree(dev)
        if device_then == "by-link":
            dev.symlink_to("../infiniband.old")
        p.symlink_to(os.path.relpath(outside_ib, p.parent))
        assert (p / name / "ports" / "1" / "state").read_text() == "4: ACTIVE\n"

    done = _before_first_held(monkeypatch, swap)
    before = _descriptors()
    b = _binding(fn)
    assert done and _descriptors() == before
    assert b.device == "mlx5_0" and b.link is not None
    assert b.link.state is not LinkState.OK and "ACTIVE" not in b.link.reason, b.link.reason


def test_an_empty_infiniband_directory_binds_nothing_and_holds_nothing(fn: SysDir) -> None:
    """The listing is held open for the device it names: an `infiniband` directory with nothing in it is
    no RDMA device (no verdict), and its descriptor is closed."""
    shutil.rmtree(Path(fn.path) / "infiniband" / "mlx5_0")
    before = _descriptors()
    assert _binding(fn) == rdma.NO_BINDING
    assert _descriptors() == before


def test_a_device_link_gone_between_the_listing_and_held_is_unverified(
    fn: SysDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device the listing saw as a link (not held: `child`'s steps) and removed before it is resolved:
    unverified, named, nothing left open."""
    ib = Path(fn.path) / "infiniband"
    (ib / "mlx5_0").rename(Path(fn.path) / "mlx5_0.real")
    (ib / "mlx5_0").symlink_to("../mlx5_0.real")
    real = Listing.held

    def remove_first(self: Listing, name: str, is_dir: bool) -> tuple[SysDir, int | None]:
        assert not is_dir
        (Path(self.dir.path) / name).unlink()
        return real(self, name, is_dir)

    monkeypatch.setattr(Listing, "held", remove_first)
    before = _descriptors()
    b = _binding(fn)
    assert _descriptors() == before
    assert b.device == "mlx5_0" and b.link is not None and b.link.state is LinkState.UNVERIFIED
    assert b.link.reason.startswith("mlx5_0: unreadable: ")


@pytest.mark.parametrize("device", ["dir", "link"])
def test_an_infiniband_directory_unplugged_after_its_listing_is_absent_not_changed(
    fn: SysDir, monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    """Hot-unplug: the whole `infiniband` directory removed between its listing and `held` (nothing put
    in its place) is a device whose ports are absent (or gone), as before the device was held, not a
    directory that "changed while being read"."""
    if device == "link":
        ib = Path(fn.path) / "infiniband"
        (ib / "mlx5_0").rename(Path(fn.path) / "mlx5_0.real")
        (ib / "mlx5_0").symlink_to("../mlx5_0.real")
    real = Listing.held

    def unplug_first(self: Listing, name: str, is_dir: bool) -> tuple[SysDir, int | None]:
        shutil.rmtree(self.dir.path)
        return real(self, name, is_dir)

    monkeypatch.setattr(Listing, "held", unplug_first)
    before = _descriptors()
    b = _binding(fn)
    assert _descriptors() == before
    assert b.device == "mlx5_0" and b.link is not None and b.link.state is LinkState.UNVERIFIED
    assert "changed" not in b.link.reason
    if device == "dir":
        assert b.link.reason == "mlx5_0: no ports to read"
    else:
        assert b.link.reason.startswith("mlx5_0: unreadable: ") and "No such file" in b.link.reason
