"""A walk interrupted anywhere leaks no descriptor and swallows nothing.

Every call the walk makes to read the host (os.open, os.read, os.readlink, os.scandir, os.fstat,
os.lstat) is made, in turn, to raise an exception that is not an OSError (MemoryError, KeyboardInterrupt:
what can arrive in the middle of any read): the walk must let it out, never take it for an absent or
refused attribute, and every descriptor it opened (an attribute's, the O_PATH descriptor that resolved a
function's link, a listing's) must be closed by then. The tree is the benchmark's, with damage that takes
each slow path of a read (a symlinked attribute, an empty one, a symlinked port directory).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodefabric_devicemanager import interfaces, pci
from nodefabric_devicemanager.hostroot import HostReadError, HostRoot
from nodefabric_devicemanager.models import Interface
from nodefabric_devicemanager.testing.scenarios import bench

BRIDGE = "/sys/devices/pci0000:10/0000:10:01.0"
VF = f"{BRIDGE}/0000:11:00.1"
OTHER_VF = f"{BRIDGE}/0000:11:00.2"
VF_NETDEV = f"{VF}/net/ens0f0v0"
VF_PORT = f"{VF}/infiniband/mlx5_1/ports/1"
CALLS = ("open", "read", "readlink", "scandir", "fstat", "lstat")


def _tree(root: Path) -> HostRoot:
    b = bench(root, pfs=1, vfs=2)
    mtu = b.path(f"{VF_NETDEV}/mtu")
    mtu.rename(mtu.with_name("mtu.real"))
    os.symlink("mtu.real", mtu)  # an attribute read through a link: `_open_slow`, then `_read_rest`
    b.write(f"{OTHER_VF}/numa_node", b"")  # an empty attribute: `_read_rest` asks fstat what answered
    port = b.path(VF_PORT)
    port.rename(port.with_name("1.real"))
    os.symlink("1.real", port)  # a listed entry that is a link: read by path, not through the listing
    return HostRoot.at(root)


def _walk(host: HostRoot) -> list[Interface]:
    return interfaces.read(host, pci.walk(host))


def _descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


class _Injected:
    """`os.<call>` made to raise `exc` on its `at`-th call."""

    def __init__(self, call: str, at: int, exc: BaseException) -> None:
        self.call, self.at, self.exc = call, at, exc
        self.seen = 0
        self.real: Callable[..., Any] = getattr(os, call)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.seen += 1
        if self.seen == self.at:
            raise self.exc
        return self.real(*args, **kwargs)


def _interrupted(host: HostRoot, call: str, make: Callable[[], BaseException]) -> Iterator[int]:
    """Walk `host` with the 1st, 2nd, ... `call` raising; yields each call number that raised, after
    checking the walk let that very exception out and closed every descriptor it opened."""
    at = 1
    while True:
        inject = _Injected(call, at, make())
        before = _descriptors()
        setattr(os, call, inject)
        try:
            _walk(host)
            outcome: BaseException | None = None
        except BaseException as exc:  # the injected one must come out, whatever it is
            outcome = exc
        finally:
            setattr(os, call, inject.real)
        leaked = _descriptors() - before
        for fd in leaked:  # closed here so one leak does not hide behind another
            os.close(int(fd))
        if inject.seen < at:  # the walk made fewer calls than that: nothing was injected
            assert outcome is None, outcome
            return
        assert outcome is inject.exc, (call, at, outcome)
        assert not leaked, f"{len(leaked)} descriptor(s) left open when {call} call {at} raised"
        yield at
        at += 1


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("make", [MemoryError, KeyboardInterrupt], ids=["MemoryError", "KeyboardInterrupt"])
def test_an_exception_in_any_read_of_a_walk_leaks_no_descriptor_and_comes_out(
    tmp_path: Path, call: str, make: Callable[[], BaseException]
) -> None:
    host = _tree(tmp_path / "root")
    clean = _walk(host)
    interrupted = list(_interrupted(host, call, make))
    assert interrupted, f"the walk made no {call} call: the test would prove nothing"
    assert _walk(host) == clean  # and nothing of the interrupted walks stuck


def test_two_walks_at_once_answer_as_one_and_leak_nothing(tmp_path: Path) -> None:
    host = _tree(tmp_path / "root")
    alone = _walk(host)
    before = _descriptors()
    got: list[object] = []

    def walk() -> None:
        for _ in range(20):
            try:
                got.append(_walk(host))
            except (HostReadError, OSError) as exc:
                got.append(exc)

    threads = [threading.Thread(target=walk) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 80 and all(g == alone for g in got)
    assert _descriptors() == before
