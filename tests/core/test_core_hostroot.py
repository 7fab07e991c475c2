"""Host reads are capped, resolved and confined to the root; failures are errors, never empty values."""

from __future__ import annotations

import os
import pathlib

import pytest

from nodefabric_devicemanager.hostroot import (
    MAX_ATTRIBUTE_BYTES,
    AttributeTooLarge,
    HostReadError,
    HostRoot,
    PathEscapesRoot,
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
