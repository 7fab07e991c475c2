"""HostRoot.resolve lets the kernel walk link chains; its answers and refusals are realpath's."""

from __future__ import annotations

import os

import pytest

from nodefabric_devicemanager.hostroot import HostRoot, PathEscapesRoot


def test_resolution_matches_realpath_over_a_sysfs_tree(scenario, host_root):
    host = scenario("sriov")
    for name in os.listdir(host_root / "sys/class/net"):
        path = str(host_root / "sys/class/net" / name / "device" / "physfn")
        if os.path.lexists(path):
            assert host.resolve(path) == os.path.realpath(path)


def test_a_dangling_link_out_of_the_root_is_still_refused(host_root):
    (host_root / "sys").mkdir()
    os.symlink("../../nowhere/at/all", host_root / "sys" / "gone")
    with pytest.raises(PathEscapesRoot):
        HostRoot.at(host_root).resolve(str(host_root / "sys" / "gone"))


def test_an_absent_path_inside_resolves_to_itself(host_root):
    host = HostRoot.at(host_root)
    assert host.dir("/sys/class/net").path == str(host_root / "sys/class/net")
    assert not host.dir("/sys/class/net").is_dir()


def test_a_link_loop_is_refused_or_reported_never_followed_forever(host_root):
    (host_root / "sys").mkdir()
    os.symlink("b", host_root / "sys" / "a")
    os.symlink("a", host_root / "sys" / "b")
    host = HostRoot.at(host_root)
    resolved = host.resolve(str(host_root / "sys" / "a"))
    assert resolved.startswith(str(host_root))
