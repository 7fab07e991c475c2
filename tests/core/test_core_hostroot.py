"""Host reads are capped, resolved and confined to the root; failures are errors, never empty values."""

from __future__ import annotations

import os
import pathlib
import socket
import stat
import threading

import pytest

from nodefabric_devicemanager.hostroot import (
    MAX_ATTRIBUTE_BYTES,
    AttributeTooLarge,
    HostReadError,
    HostRoot,
    NotADirectory,
    NotRegularFile,
    NotText,
    PathEscapesRoot,
    Refused,
    recorded_name,
)


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    dev = tmp_path / "root/sys/devices/pci0000:00/0000:00:01.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    (dev / "big").write_bytes(b"x" * (MAX_ATTRIBUTE_BYTES + 1))
    (dev / "exact").write_bytes(b"y" * MAX_ATTRIBUTE_BYTES)
    net = tmp_path / "root/sys/class/net"
    net.mkdir(parents=True)
    os.symlink("../../devices/pci0000:00/0000:00:01.0", net / "eth0")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/secret").write_text("s3cret")
    os.symlink("../../../../outside", net / "evil")
    os.symlink("../../../../../outside/secret", dev / "leak")
    os.symlink("loop", dev / "loop")
    return tmp_path / "root"


def test_reads_through_a_relative_symlink_chain(tree):
    eth0 = HostRoot.at(tree).dir("/sys/class/net/eth0")
    assert eth0.read("numa_node") == "1"
    assert eth0.shown == "/sys/devices/pci0000:00/0000:00:01.0"
    assert eth0.read_opt("absent") is None


def test_attribute_at_the_cap_is_read_whole_and_one_byte_more_is_refused(tree, caplog):
    dev = HostRoot.at(tree).dir("/sys/devices/pci0000:00/0000:00:01.0")
    assert len(dev.read("exact")) == MAX_ATTRIBUTE_BYTES
    with pytest.raises(AttributeTooLarge, match="larger than 65536 bytes"):
        dev.read("big")
    assert "refused an oversized attribute" in caplog.text


def test_directory_symlink_escaping_the_root_is_refused_and_logged(tree, caplog):
    host = HostRoot.at(tree)
    with pytest.raises(PathEscapesRoot) as err:
        host.dir("/sys/class/net/evil")
    assert err.value.path == "/sys/class/net/evil"
    with pytest.raises(PathEscapesRoot):
        host.dir("/sys/class/net").child("evil")
    assert "outside the host root" in caplog.text


def test_attribute_symlink_escaping_the_root_is_refused(tree):
    dev = HostRoot.at(tree).dir("/sys/devices/pci0000:00/0000:00:01.0")
    with pytest.raises(PathEscapesRoot):
        dev.read("leak")


def test_a_symlink_loop_is_an_error_not_an_absent_value(tree):
    dev = HostRoot.at(tree).dir("/sys/devices/pci0000:00/0000:00:01.0")
    with pytest.raises(HostReadError):
        dev.read_opt("loop")


def test_listing_a_missing_directory_is_an_error(tree):
    host = HostRoot.at(tree)
    with pytest.raises(HostReadError):
        host.dir("/sys/class/infiniband").list()


def test_single_components_only(tree):
    dev = HostRoot.at(tree).dir("/sys/class/net")
    with pytest.raises(ValueError, match="single path component"):
        dev.read("../net/eth0/numa_node")


def test_root_slash_displays_host_paths_unchanged():
    host = HostRoot.at("/")
    assert host.display("/sys/class/net") == "/sys/class/net"
    assert host.contains("/anything")


# --- never hang, never invent: what is not a regular UTF-8 file is refused or unknown ----------------


def returns(fn, *args, fifo=None):
    """Call fn in a thread; fail (instead of hanging the suite) when it blocks. On failure a writer opens
    `fifo`, which releases a reader blocked in open(), so no thread is left behind."""
    result: dict = {}

    def call():
        try:
            result["value"] = fn(*args)
        except BaseException as exc:  # handed to the test below
            result["error"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"{fn.__name__} blocked")
    if "error" in result:
        raise result["error"]
    return result.get("value")


@pytest.fixture
def dev(tree):
    return HostRoot.at(tree).dir("/sys/devices/pci0000:00/0000:00:01.0")


def test_a_fifo_attribute_is_refused_without_blocking_and_named(dev, tree):
    fifo = tree / "sys/devices/pci0000:00/0000:00:01.0/mtu"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile) as err:
        returns(dev.read, "mtu", fifo=fifo)
    assert err.value.path == "/sys/devices/pci0000:00/0000:00:01.0/mtu"
    assert "is a FIFO, not a regular file" in str(err.value)
    # Refused is not absent: read_opt and value() raise too.
    with pytest.raises(Refused):
        returns(dev.read_opt, "mtu", fifo=fifo)
    with pytest.raises(Refused):
        returns(dev.value, "mtu", fifo=fifo)


@pytest.mark.parametrize(("minor", "what"), [(3, "/dev/null"), (5, "/dev/zero"), (8, "/dev/random")])
def test_a_character_device_attribute_is_refused_not_read_as_a_value(dev, tree, minor, what):
    # The node sits under the attribute's own name, so the O_NOFOLLOW open reaches it (non-blocking, no
    # controlling terminal); what it gives (nothing, or more than the cap) sends the read to the fstat,
    # which refuses it by its type: never "" from /dev/null, never 64 KiB of zeros or entropy.
    node = tree / "sys/devices/pci0000:00/0000:00:01.0/numa_node"
    node.unlink()
    try:
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    with pytest.raises(NotRegularFile, match="numa_node: is a character device"):
        returns(dev.read, "numa_node")
    with pytest.raises(NotRegularFile):
        returns(dev.values, ("vendor", "numa_node"))


def test_a_symlink_to_a_character_device_is_refused_without_opening_it(dev, tree):
    try:
        os.mknod(tree / "dev/zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    except FileNotFoundError:
        (tree / "dev").mkdir()
        os.mknod(tree / "dev/zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    os.symlink("../../../../dev/zero", tree / "sys/devices/pci0000:00/0000:00:01.0/vendor")
    # Named by its target: refused from the resolution's stat, which comes before any open of it.
    with pytest.raises(NotRegularFile, match=r"^/dev/zero: is a character device"):
        returns(dev.read, "vendor")


def test_a_socket_attribute_is_refused_as_a_socket(dev, tree):
    here = os.getcwd()
    os.chdir(tree / "sys/devices/pci0000:00/0000:00:01.0")
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind("mtu")  # relative: a unix socket path is limited to 108 bytes
            with pytest.raises(NotRegularFile, match="mtu: is a socket, not a regular file"):
                returns(dev.read, "mtu")
    finally:
        os.chdir(here)


def test_an_attribute_symlink_inside_the_root_is_read_through(dev, tree):
    os.symlink("numa_node", tree / "sys/devices/pci0000:00/0000:00:01.0/alias")
    assert dev.read("alias") == "1"
    assert dev.values(("alias", "absent", "numa_node")) == ["1", None, "1"]


def test_values_answers_as_value_does_name_by_name(dev, tree):
    (tree / "sys/devices/pci0000:00/0000:00:01.0/label").write_bytes(b"eth\xff0\n")
    names = ("numa_node", "absent", "label", "exact")
    assert dev.values(names) == [dev.value(n) for n in names]
    assert dev.values(names)[:3] == ["1", None, None]
    with pytest.raises(AttributeTooLarge):
        dev.values(("numa_node", "big"))
    with pytest.raises(PathEscapesRoot):
        dev.values(("leak",))
    with pytest.raises(HostReadError, match="symlink does not resolve"):
        dev.values(("loop",))
    with pytest.raises(ValueError, match="single path component"):
        dev.values(("numa_node", "../numa_node"))


def test_a_symlink_to_a_fifo_inside_the_root_is_refused(dev, tree):
    os.mkfifo(tree / "pipe")
    os.symlink("../../../../pipe", tree / "sys/devices/pci0000:00/0000:00:01.0/vendor")
    with pytest.raises(NotRegularFile, match="/pipe: is a FIFO"):
        returns(dev.read, "vendor", fifo=tree / "pipe")


def test_a_directory_where_an_attribute_belongs_is_refused(dev, tree):
    (tree / "sys/devices/pci0000:00/0000:00:01.0/class").mkdir()
    with pytest.raises(NotRegularFile, match="is a directory, not a regular file"):
        dev.read("class")


def test_bytes_that_are_not_utf8_are_not_text_and_value_reads_them_unknown(dev, tree, caplog):
    (tree / "sys/devices/pci0000:00/0000:00:01.0/label").write_bytes(b"eth\xff0\n")
    with pytest.raises(NotText, match="not UTF-8"):
        dev.read("label")
    assert dev.value("label") is None  # unknown, and never "eth\ufffd0"
    assert "not UTF-8 text" in caplog.text


def test_child_refuses_a_dangling_link_a_loop_and_a_file(tree):
    net = HostRoot.at(tree).dir("/sys/class/net")
    os.symlink("../../devices/gone", tree / "sys/class/net/dangling")
    os.symlink("looping", tree / "sys/class/net/looping")
    (tree / "sys/class/net/plain").write_text("x")
    for name in ("dangling", "looping"):
        with pytest.raises(HostReadError, match="symlink does not resolve"):
            net.child(name)
    with pytest.raises(NotADirectory, match="is a regular file, not a directory"):
        net.child("plain")
    with pytest.raises(FileNotFoundError):
        net.child("absent")  # only an entry that is not there is absent


def test_present_sees_a_link_that_escapes_where_exists_does_not(tree):
    host = HostRoot.at(tree)
    assert host.present("/sys/class/net/evil") and not host.exists("/sys/class/net/evil")
    assert not host.present("/sys/bus/pci")


def test_names_that_are_not_utf8_are_recorded_escaped():
    raw = os.fsdecode(b"eth\xff0")
    assert recorded_name(raw) == "eth\\xff0"
    assert recorded_name("ens1f0") == "ens1f0"
    recorded_name(raw).encode("utf-8")  # what an API object can carry


# --- child_link: the kernel resolves a link at once, with exactly child()'s checks and refusals ------


@pytest.fixture
def links(tree: pathlib.Path) -> pathlib.Path:
    net = tree / "sys/class/net"
    os.symlink("../../devices/pci0000:00/0000:00:01.0/numa_node", net / "afile")
    os.symlink("../../devices/absent", net / "dangling")
    os.symlink("selfloop", net / "selfloop")
    (net / "realdir").mkdir()
    (tree.parent / "outside/sub").mkdir()
    # Escapes through an intermediate link, so the spelled path looks inside the root.
    os.symlink("../../devices/pci0000:00/0000:00:01.0/out", net / "via")
    os.symlink("../../../../../outside", tree / "sys/devices/pci0000:00/0000:00:01.0/out")
    os.mkfifo(net / "pipe")
    return net


@pytest.mark.parametrize("method", ["child", "child_link"])
def test_child_link_answers_as_child_does(tree, links, method, caplog):
    net = HostRoot.at(tree).dir("/sys/class/net")
    get = getattr(net, method)
    assert get("eth0").shown == "/sys/devices/pci0000:00/0000:00:01.0"
    assert get("realdir").shown == "/sys/class/net/realdir"
    with pytest.raises(PathEscapesRoot):
        get("evil")
    with pytest.raises(PathEscapesRoot):
        get("via")
    assert "outside the host root" in caplog.text
    with pytest.raises(NotADirectory, match="is a regular file, not a directory"):
        get("afile")
    with pytest.raises(NotADirectory, match="is a FIFO, not a directory"):
        returns(get, "pipe")
    for broken in ("dangling", "selfloop"):
        with pytest.raises(HostReadError, match="symlink does not resolve") as err:
            get(broken)
        assert not isinstance(err.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        get("absent")
    with pytest.raises(ValueError, match="single path component"):
        get("..")
    opt = getattr(net, f"{method}_opt")
    assert opt("absent") is None
    assert opt("eth0").name == "0000:00:01.0"


def test_child_link_through_a_link_into_the_root_itself(tree):
    os.symlink("../../..", tree / "sys/class/net/top")
    assert HostRoot.at(tree).dir("/sys/class/net").child_link("top").shown == "/"


def test_child_link_of_a_directory_named_like_a_removed_one_is_still_read(tree):
    # /proc/self/fd/N of a removed directory ends in " (deleted)": child_link hands such an answer to
    # child(), which must still find a directory that is merely named so.
    real = tree / "sys/devices/pci0000:00/0000:00:01.0/x (deleted)"
    real.mkdir()
    (real / "mtu").write_text("1500\n")
    os.symlink("../../devices/pci0000:00/0000:00:01.0/x (deleted)", tree / "sys/class/net/gone")
    net = HostRoot.at(tree).dir("/sys/class/net")
    assert net.child_link("gone").read("mtu") == "1500"
    assert net.child_link("gone") == net.child("gone")


def test_a_directory_reached_two_ways_is_one_value(tree):
    """SysDir is a plain slotted class (it is made once per directory of a pass): equality and hashing
    still follow what it names, so a directory reached by its link and by its path is one key."""
    host = HostRoot.at(tree)
    by_link = host.dir("/sys/class/net").child("eth0")
    by_path = host.dir("/sys/devices/pci0000:00").child("0000:00:01.0")
    assert by_link == by_path and hash(by_link) == hash(by_path) and len({by_link, by_path}) == 1
    assert by_link != host.dir("/sys/devices/pci0000:00") and by_link != by_link.path
    assert by_link.read("numa_node") == "1" and by_link.name == "0000:00:01.0"
    assert repr(by_link) == f"SysDir(host={host!r}, path={by_path.path!r})"
    other = HostRoot.at(tree / "sys")
    assert other.dir("/devices/pci0000:00/0000:00:01.0") != by_path  # the same path under another root
    with pytest.raises(AttributeError):
        by_link.extra = 1  # type: ignore[attr-defined]


# --- listing: a directory opened once (O_NOFOLLOW), its entries' types standing in for an lstat each ----


@pytest.fixture
def kinds(tree: pathlib.Path) -> pathlib.Path:
    dev = tree / "sys/devices/pci0000:00/0000:00:01.0"
    (dev / "infiniband/mlx5_0/ports/1").mkdir(parents=True)
    (dev / "infiniband/mlx5_0/ports/1/state").write_text("4: ACTIVE\n")
    os.symlink("mlx5_0", dev / "infiniband/alias")  # a link to a directory inside the root
    (dev / "infiniband/afile").write_text("x")
    os.symlink("../../../../../outside", dev / "escape")  # a directory link that leaves the root
    os.symlink("infiniband", dev / "ib_link")
    os.mkfifo(dev / "pipe")
    (dev / "plain").write_text("x")
    os.symlink("dloop", dev / "dloop")
    os.symlink("gone", dev / "dangling")
    return dev


def test_entries_lists_names_sorted_with_real_directories_marked(tree, kinds):
    ib = HostRoot.at(tree).dir("/sys/devices/pci0000:00/0000:00:01.0/infiniband")
    assert ib.entries() == [("afile", False), ("alias", False), ("mlx5_0", True)]
    assert [n for n, _ in ib.entries()] == ib.list()


def test_child_entries_opt_answers_as_child_opt_then_entries(tree, kinds, caplog):
    dev = HostRoot.at(tree).dir("/sys/devices/pci0000:00/0000:00:01.0")
    ib, entries = dev.child_entries_opt("infiniband")
    assert ib == dev.child("infiniband") and entries == ib.entries()
    # A link to a directory inside the root is followed, as child() does, and listed.
    via, via_entries = dev.child_entries_opt("ib_link")
    assert via == ib and via_entries == entries
    assert dev.child_entries_opt("absent") is None
    with pytest.raises(PathEscapesRoot):
        dev.child_entries_opt("escape")
    assert "outside the host root" in caplog.text
    with pytest.raises(NotADirectory, match="is a FIFO, not a directory"):
        returns(dev.child_entries_opt, "pipe", fifo=kinds / "pipe")
    with pytest.raises(NotADirectory, match="is a regular file, not a directory"):
        dev.child_entries_opt("plain")
    for broken in ("dloop", "dangling"):  # a broken link is not an absent directory
        with pytest.raises(HostReadError, match="symlink does not resolve"):
            dev.child_entries_opt(broken)
    with pytest.raises(ValueError, match="single path component"):
        dev.child_entries_opt("..")


def test_listed_child_takes_a_listed_directory_and_checks_anything_else(tree, kinds):
    dev = HostRoot.at(tree).dir("/sys/devices/pci0000:00/0000:00:01.0")
    ib, entries = dev.child_entries_opt("infiniband")
    seen = dict(entries)
    mlx = ib.listed_child("mlx5_0", seen["mlx5_0"])
    assert mlx == ib.child("mlx5_0")
    assert mlx.child("ports").child("1").read("state") == "4: ACTIVE"
    # Not seen as a real directory: child()'s resolution and refusals, never taken on trust.
    assert ib.listed_child("alias", seen["alias"]) == mlx
    with pytest.raises(NotADirectory):
        ib.listed_child("afile", seen["afile"])
    with pytest.raises(ValueError, match="single path component"):
        ib.listed_child("../infiniband", True)


def test_a_directory_that_becomes_a_link_after_its_parent_was_listed_is_still_checked(tree, kinds):
    """The d_type a listing saw stands in for an lstat; an entry the listing saw as a link (or that a
    caller did not see as a directory) always goes through child()'s checks."""
    dev = HostRoot.at(tree).dir("/sys/devices/pci0000:00/0000:00:01.0")
    assert dict(dev.child_entries_opt("infiniband")[1])["mlx5_0"] is True
    (kinds / "infiniband/mlx5_0").rename(kinds / "moved")
    os.symlink("../../../../../../outside", kinds / "infiniband/mlx5_0")
    ib, entries = dev.child_entries_opt("infiniband")
    assert dict(entries)["mlx5_0"] is False  # the next listing sees the link
    with pytest.raises(PathEscapesRoot):
        ib.listed_child("mlx5_0", dict(entries)["mlx5_0"])
