"""`SysDir.values` and `SysDir.reads` read several attributes in one call with the common case inlined;
every answer and refusal must be the one `value` / `read` give for the same attribute alone. Checked over a
directory holding every kind of entry a hostile host can put under an attribute's name, each attribute
read alone, in one batch, and in a batch where it sits between good values (a refusal raises, and what
came before it is not half-returned).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodefabric_devicemanager.hostroot import MAX_ATTRIBUTE_BYTES, HostReadError, HostRoot, SysDir

KINDS: dict[str, Callable[[Path], object]] = {
    "plain": lambda p: p.write_text("9000\n"),
    "no-newline": lambda p: p.write_text("up"),
    "two-newlines": lambda p: p.write_text("up\n\n"),
    "empty": lambda p: p.write_bytes(b""),
    "exactly-the-limit": lambda p: p.write_bytes(b"a" * MAX_ATTRIBUTE_BYTES),
    "one-past-the-limit": lambda p: p.write_bytes(b"a" * (MAX_ATTRIBUTE_BYTES + 1)),
    "far-past-the-limit": lambda p: p.write_bytes(b"a" * (3 * MAX_ATTRIBUTE_BYTES)),
    "page-sized": lambda p: p.write_bytes(b"b" * 4096),
    "not-utf8": lambda p: p.write_bytes(b"\xff\xfeup\n"),
    "nul": lambda p: p.write_bytes(b"9000\0"),
    "fifo": os.mkfifo,
    "directory": lambda p: p.mkdir(),
    "link-inside": lambda p: p.symlink_to("plain"),
    "link-to-fifo": lambda p: p.symlink_to("fifo"),
    "link-to-directory": lambda p: p.symlink_to("directory"),
    "link-outside": lambda p: p.symlink_to("../../outside"),
    "link-dangling": lambda p: p.symlink_to("gone"),
    "link-loop": lambda p: p.symlink_to("link-loop"),
    "unreadable": lambda p: (p.write_text("1\n"), p.chmod(0)),
}
NAMES = (*KINDS, "absent")


@pytest.fixture
def attrs(tmp_path: Path) -> SysDir:
    root = tmp_path / "root"
    d = root / "sys" / "dev"
    d.mkdir(parents=True)
    (tmp_path / "outside").write_text("secret\n")
    for name, make in KINDS.items():
        make(d / name)
    return HostRoot.at(root).dir("/sys/dev")


def _outcome(call: Callable[[], object]) -> tuple[str, object]:
    try:
        return ("value", call())
    except (HostReadError, FileNotFoundError) as exc:
        return (type(exc).__name__, str(exc))


def _alone_value(d: SysDir, name: str) -> tuple[str, object]:
    return _outcome(lambda: [d.value(name)])


def _alone_read(d: SysDir, name: str) -> tuple[str, object]:
    return _outcome(lambda: [d.read(name)])


@pytest.mark.parametrize("name", NAMES)
def test_values_answers_and_refuses_as_value_does(attrs: SysDir, name: str) -> None:
    alone = _alone_value(attrs, name)
    assert _outcome(lambda: attrs.values((name,))) == alone
    batch = _outcome(lambda: attrs.values(("plain", name, "no-newline")))
    if alone[0] == "value":
        assert batch == ("value", ["9000", *alone[1], "up"])  # type: ignore[misc]
    else:
        assert batch == alone


@pytest.mark.parametrize("name", NAMES)
def test_reads_answers_and_refuses_as_read_does(attrs: SysDir, name: str) -> None:
    alone = _alone_read(attrs, name)
    assert _outcome(lambda: attrs.reads((name,))) == alone
    batch = _outcome(lambda: attrs.reads(("plain", name)))
    assert batch == (("value", ["9000", *alone[1]]) if alone[0] == "value" else alone)  # type: ignore[misc]


def test_the_answers_are_what_the_files_say(attrs: SysDir) -> None:
    """Not only equal to the single reads: right. (A root test process can read mode-0 files.)"""
    good = ("plain", "two-newlines", "exactly-the-limit", "page-sized", "not-utf8", "nul")
    got = dict(zip(good, attrs.values(good), strict=True))
    assert got["plain"] == "9000"
    assert got["two-newlines"] == "up"
    assert got["exactly-the-limit"] == "a" * MAX_ATTRIBUTE_BYTES
    assert got["page-sized"] == "b" * 4096
    assert got["not-utf8"] is None  # unknown, logged
    assert got["nul"] == "9000\0"
    for name, why in [
        ("empty", "is a regular file"),
        ("one-past-the-limit", f"larger than {MAX_ATTRIBUTE_BYTES} bytes"),
        ("fifo", "is a FIFO, not a regular file"),
        ("directory", "is a directory, not a regular file"),
        ("link-to-fifo", "is a FIFO, not a regular file"),
        ("link-outside", "outside"),
        ("link-dangling", "symlink does not resolve"),
        ("link-loop", "symlink does not resolve"),
    ]:
        kind, message = _outcome(lambda name=name: attrs.values((name,)))
        if name == "empty":
            assert (kind, message) == ("value", [""])  # an empty regular file is an empty value
            continue
        assert kind != "value" and why in str(message), (name, kind, message)
    assert attrs.values(("absent", "link-inside")) == [None, "9000"]
    with pytest.raises(FileNotFoundError):
        attrs.reads(("plain", "absent"))


@pytest.fixture
def writer(attrs: SysDir) -> Iterator[Callable[[bytes], None]]:
    """A writer holding the FIFO open with `data` written and still there: a read gets the data, and the
    read after it would wait for more (EAGAIN, non-blocking)."""
    held: list[int] = []

    def start(data: bytes) -> None:
        opened = threading.Event()

        def hold() -> None:
            fd = os.open(f"{attrs.path}/fifo", os.O_WRONLY)
            held.append(fd)
            os.write(fd, data)
            opened.set()

        threading.Thread(target=hold, daemon=True).start()
        # The writer's open waits for a reader: this one, which is closed at once.
        probe = os.open(f"{attrs.path}/fifo", os.O_RDONLY | os.O_NONBLOCK)
        assert opened.wait(5)
        held.append(probe)

    yield start
    for fd in held:
        os.close(fd)


def test_a_fifo_whose_writer_stays_is_refused_not_read_in_part(
    attrs: SysDir, writer: Callable[[bytes], None]
) -> None:
    writer(b"9000\n")
    # The probe reader the fixture opened holds the data; ours sees the same pipe with a writer attached.
    kind, message = _outcome(lambda: attrs.values(("plain", "fifo")))
    assert kind == "NotRegularFile" and "is a FIFO" in str(message)
    kind, message = _outcome(lambda: attrs.reads(("fifo",)))
    assert kind == "NotRegularFile" and "is a FIFO" in str(message)


def test_a_name_that_is_not_one_component_is_refused_before_anything_is_read(attrs: SysDir) -> None:
    for bad in ("../plain", "", ".", "..", "a/b"):
        with pytest.raises(ValueError, match="not a single path component"):
            attrs.values(("plain", bad))
        with pytest.raises(ValueError, match="not a single path component"):
            attrs.reads((bad,))


# `child_link_read`: a directory resolved and read through the descriptor that resolved it. Every answer
# and refusal must be the one `child_link`, then `values` and `link_name`, give over the same tree.


@pytest.fixture
def bus(attrs: SysDir) -> SysDir:
    """A directory of links to `attrs` (as /sys/bus/pci/devices links to function directories), and of
    every kind of entry a hostile host can put under a function's name."""
    b = Path(attrs.host.root) / "sys" / "bus"
    b.mkdir()
    (b / "dev").symlink_to("../dev")
    (b / "file").write_text("x\n")
    (b / "real").mkdir()
    (b / "real" / "vendor").write_text("0x15b3\n")
    (b / "dangling").symlink_to("../gone")
    (b / "loop").symlink_to("loop")
    (b / "outside").symlink_to("../../../outside-dir")
    (Path(attrs.host.root).parent / "outside-dir").mkdir()
    (b / "renamed").symlink_to("../dev")  # lands on a directory of another name
    (b / "to-file").symlink_to("file")
    return attrs.host.dir("/sys/bus")


def _by_steps(parent: SysDir, name: str, names: tuple[str, ...], link: str) -> tuple[str, object]:
    def steps() -> object:
        d = parent.child_link(name)
        if d.name != name:
            return (d.path, None, None)
        return (d.path, d.values(names), d.link_name(link))

    return _outcome(steps)


def _at_once(parent: SysDir, name: str, names: tuple[str, ...], link: str) -> tuple[str, object]:
    def call() -> object:
        d, values, target = parent.child_link_read(name, names, link)
        return (d.path, values, target)

    return _outcome(call)


@pytest.mark.parametrize("name", NAMES)
def test_child_link_read_answers_and_refuses_each_attribute_as_values_does(bus: SysDir, name: str) -> None:
    for names in ((name,), ("plain", name, "no-newline")):
        for link in ("link-inside", name):
            assert _at_once(bus, "dev", names, link) == _by_steps(bus, "dev", names, link), (names, link)


@pytest.mark.parametrize(
    "entry", ["dev", "absent", "file", "real", "dangling", "loop", "outside", "renamed", "to-file"]
)
def test_child_link_read_answers_and_refuses_each_entry_as_child_link_does(bus: SysDir, entry: str) -> None:
    names = ("plain", "absent", "vendor")
    assert _at_once(bus, entry, names, "link-inside") == _by_steps(bus, entry, names, "link-inside")


def test_child_link_read_of_another_name_reads_nothing(bus: SysDir) -> None:
    d, values, target = bus.child_link_read("renamed", ("plain",), "link-inside")
    assert d.name == "dev" and values is None and target is None


def test_child_link_read_reads_the_directory_it_resolved_even_when_its_path_is_swapped(
    bus: SysDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the resolution and the reads, the resolved directory is moved away and another put in its
    place: the values are the checked directory's, not what its path names now."""
    dev = Path(bus.host.root) / "sys" / "dev"
    contains = HostRoot.contains

    def swap_then_check(self: HostRoot, resolved: str) -> bool:
        if resolved == str(dev) and not (dev.parent / "dev.old").exists():
            dev.rename(dev.parent / "dev.old")
            dev.mkdir()
            (dev / "plain").write_text("1500\n")
            (dev / "link-inside").symlink_to("elsewhere")
        return contains(self, resolved)

    monkeypatch.setattr(HostRoot, "contains", swap_then_check)
    d, values, target = bus.child_link_read("dev", ("plain", "no-newline"), "link-inside")
    assert d.path == str(dev)
    assert values == ["9000", "up"]  # what the directory resolved (now dev.old) holds
    assert target == "plain"
    assert dev.joinpath("plain").read_text() == "1500\n"  # the path names the planted one now


# `child_listing_opt`: a directory listed through a descriptor that stays open while its entries'
# attributes are read relative to it. Every answer and refusal must be `child_entries_opt`'s, then
# `listed_child(...).values` / `.reads`'.


@pytest.fixture
def above(attrs: SysDir) -> SysDir:
    """The directory holding `attrs` ("dev"), beside every kind of entry a listing can meet."""
    sys_dir = Path(attrs.host.root) / "sys"
    (sys_dir / "link-to-dev").symlink_to("dev")
    (sys_dir / "outside").symlink_to("../../outside")
    (sys_dir / "dangling").symlink_to("gone")
    (sys_dir / "file").write_text("x\n")
    (sys_dir / "loop").symlink_to("loop")
    return attrs.host.dir("/sys")


def _listing_outcome(parent: SysDir, name: str, entry: str, names: tuple[str, ...], lenient: bool) -> object:
    def call() -> object:
        listing = parent.child_listing_opt(name)
        if listing is None:
            return None
        with listing:
            is_dir = dict(listing.entries)[entry]
            if lenient:
                child, got = listing.values(entry, is_dir, names)
            else:
                got = listing.reads(entry, is_dir, names)  # type: ignore[assignment]
                child = listing.dir.listed_child(entry, is_dir)
            return (listing.dir.path, listing.entries, child.path, got)

    return _outcome(call)


def _steps_outcome(parent: SysDir, name: str, entry: str, names: tuple[str, ...], lenient: bool) -> object:
    def call() -> object:
        found = parent.child_entries_opt(name)
        if found is None:
            return None
        d, entries = found
        child = d.listed_child(entry, dict(entries)[entry])
        return (d.path, entries, child.path, child.values(names) if lenient else child.reads(names))

    return _outcome(call)


@pytest.mark.parametrize("name", NAMES)
def test_a_listing_reads_each_attribute_as_values_and_reads_do(above: SysDir, name: str) -> None:
    root = above.host.dir("/")
    for names in ((name,), ("plain", name, "no-newline")):
        for lenient in (True, False):
            got = _listing_outcome(root, "sys", "dev", names, lenient)
            assert got == _steps_outcome(root, "sys", "dev", names, lenient), (names, lenient)


@pytest.mark.parametrize("entry", ["dev", "link-to-dev", "outside", "dangling", "file", "loop"])
def test_a_listing_answers_and_refuses_each_entry_as_listed_child_does(above: SysDir, entry: str) -> None:
    root = above.host.dir("/")
    for lenient in (True, False):
        names = ("plain", "absent") if lenient else ("plain",)
        got = _listing_outcome(root, "sys", entry, names, lenient)
        assert got == _steps_outcome(root, "sys", entry, names, lenient)


@pytest.mark.parametrize("name", ["absent", "link-to-dev", "outside", "dangling", "file", "loop"])
def test_a_listing_of_what_is_not_a_real_directory_answers_as_child_entries_opt_does(
    above: SysDir, name: str
) -> None:
    def listing() -> object:
        found = above.child_listing_opt(name)
        if found is None:
            return None
        with found:
            return (found.dir.path, found.entries)

    def steps() -> object:
        found = above.child_entries_opt(name)
        return None if found is None else (found[0].path, found[1])

    assert _outcome(listing) == _outcome(steps)


def test_a_listing_reads_the_directory_it_listed_even_when_its_path_is_swapped(above: SysDir) -> None:
    """After the listing, the listed directory is moved away and another put in its place: its entries'
    attributes are read from the directory that was listed, not from what the path names now."""
    net = Path(above.host.root) / "sys" / "net"
    (net / "eth0").mkdir(parents=True)
    (net / "eth0" / "mtu").write_text("9000\n")
    listing = above.child_listing_opt("net")
    assert listing is not None
    with listing:
        net.rename(net.parent / "net.old")
        (net / "eth0").mkdir(parents=True)
        (net / "eth0" / "mtu").write_text("1500\n")
        child, values = listing.values("eth0", True, ("mtu",))
    assert child.path == str(net / "eth0") and values == ["9000"]
    assert listing.dir.child("eth0").value("mtu") == "1500"  # the path names the planted one now


def test_a_listing_closes_its_descriptor(above: SysDir) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        listing = above.host.dir("/").child_listing_opt("sys")
        assert listing is not None
        with listing:
            listing.values("dev", True, ("plain",))
        with pytest.raises(FileNotFoundError), above.host.dir("/").child_listing_opt("sys") as failing:  # type: ignore[union-attr]
            failing.reads("dev", True, ("absent",))
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("piece", [1, 3, 4096])
def test_an_attribute_handed_over_in_pieces_answers_as_one_read_does(
    attrs: SysDir, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    """A file that gives its bytes over several reads (procfs, a network filesystem): the read that hears
    EOF asks for one byte, and a byte more is read on to the cap, so every answer and refusal is the one a
    file read whole gets, in a batch and alone."""
    whole = {name: (_outcome(lambda n=name: attrs.values((n,))), _alone_read(attrs, name)) for name in NAMES}
    real = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: real(fd, min(n, piece)))
    for name in NAMES:
        assert (_outcome(lambda n=name: attrs.values((n,))), _alone_read(attrs, name)) == whole[name], name
    batch = ("plain", "page-sized", "exactly-the-limit", "no-newline")
    assert attrs.values(batch) == [attrs.value(n) for n in batch]


def test_an_absent_attribute_is_none_among_values_and_named_whole_when_read(attrs: SysDir) -> None:
    """The lenient read answers an absent attribute with None at once (no exception raised to say so);
    the strict one still raises FileNotFoundError naming the whole path: by path, through a held
    function descriptor (`child_link_read`) and through a listing's (`Listing`)."""
    names = ("plain", "absent", "no-newline")
    above = attrs.host.dir("/sys")
    got_by_path = attrs.values(names)
    _, got_held, _ = above.child_link_read("dev", names, "link-inside")
    listing = above.host.dir("/").child_listing_opt("sys")
    assert listing is not None
    with listing:
        _, got_listed = listing.values("dev", True, names)
        with pytest.raises(FileNotFoundError) as listed:
            listing.reads("dev", True, names)
    assert got_by_path == got_held == got_listed == ["9000", None, "up"]
    with pytest.raises(FileNotFoundError) as by_path:
        attrs.reads(names)
    whole = f"{attrs.path}/absent"
    assert by_path.value.filename == whole and listed.value.filename == whole
