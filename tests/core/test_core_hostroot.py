"""Host reads are capped, resolved and confined to the root; failures are errors, never empty values."""

from __future__ import annotations

import os
import pathlib
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


def test_a_character_device_attribute_is_refused_before_it_is_opened(dev, tree):
    node = tree / "sys/devices/pci0000:00/0000:00:01.0/numa_node"
    node.unlink()
    try:
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    with pytest.raises(NotRegularFile, match="is a character device"):
        returns(dev.read, "numa_node")


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
