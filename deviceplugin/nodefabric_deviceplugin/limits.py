"""kubelet's 4 MiB gRPC message limit, and how many rdma.shared tokens fit under it.

kubelet reads ListAndWatch with gRPC's default receive limit (4 MiB). A device list over it is refused
on kubelet's side, the stream ends, and kubelet marks every device of the resource Unhealthy: nothing
is served at all. Only the shared family can get there (N tokens per endpoint), so its token count is
checked at start-up against a planned number of endpoints, and clamped at run time to what the actual
record fits.

The sizes are the protobuf wire encoding, computed here without building the messages (a 100,000-token
list would cost more to build than to refuse); `tests/deviceplugin` cross-checks them against the
generated classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

KUBELET_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# The most whole-function RDMA endpoints a node is planned for: 16 dual-ported adapters, each port its own
# PCI function. The start-up check guarantees a fit up to here; beyond it the run-time clamp takes over.
PLANNED_ENDPOINTS = 32
MAX_ID_LENGTH = 63  # kubelet's limit on a device ID
MAX_NUMA_NODE = 1023  # numbers.NUMA_NODE's upper bound
_LONGEST_HEALTH = len("Unhealthy")


def varint_size(value: int) -> int:
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def _field(payload: int) -> int:
    """A length-delimited field with a one-byte tag: tag + length prefix + payload."""
    return 1 + varint_size(payload) + payload


def entry_bytes(device_bytes: int) -> int:
    """Bytes a Device of `device_bytes` adds to a ListAndWatchResponse (its tag and length prefix too)."""
    return _field(device_bytes)


def device_entry_bytes(id_length: int, numa: int | None, health_length: int = _LONGEST_HEALTH) -> int:
    """Bytes one Device adds to a ListAndWatchResponse (the entry, its tag and its length prefix)."""
    size = (_field(id_length) if id_length else 0) + _field(health_length)
    if numa is not None:
        # proto3 leaves a zero ID out, so NUMANode{ID: 0} is an empty message.
        node = 1 + varint_size(numa) if numa else 0
        size += _field(_field(node))
    return _field(size)


class Shape(NamedTuple):
    """What decides the size of one endpoint's shared tokens."""

    stem_length: int
    numa: int | None
    health_length: int = _LONGEST_HEALTH


def shared_list_bytes(shapes: Sequence[Shape], count: int) -> int:
    """The rdma.shared list's size: `count` tokens "<stem>-<i>" for each endpoint's shape."""
    total = 0
    for shape in shapes:
        low, digits = 0, 1
        while low < count:
            high = min(count, 10**digits)  # indices low..high-1 have `digits` digits
            entry = device_entry_bytes(shape.stem_length + 1 + digits, shape.numa, shape.health_length)
            total += (high - low) * entry
            low, digits = high, digits + 1
    return total


def fitting_shared_count(shapes: Sequence[Shape], wanted: int) -> int:
    """The largest count <= `wanted` whose shared list fits kubelet's limit (0 when not even one does)."""
    if shared_list_bytes(shapes, wanted) <= KUBELET_MAX_MESSAGE_BYTES:
        return wanted
    low, high = 0, wanted  # fits(low) holds, fits(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        if shared_list_bytes(shapes, mid) <= KUBELET_MAX_MESSAGE_BYTES:
            low = mid
        else:
            high = mid
    return low


def _worst_case(endpoints: int) -> list[Shape]:
    # The longest stem leaves room for "-<index>" (resources.STEM_BUDGET), the widest NUMA hint.
    return [Shape(MAX_ID_LENGTH - 7, MAX_NUMA_NODE)] * endpoints


def check_shared_count(shared_count: int, endpoints: int = PLANNED_ENDPOINTS) -> None:
    """Refuse a shared count whose device list cannot reach kubelet, saying the computed size.

    Raises ValueError with a one-line message an operator can act on; the `agent` and `deviceplugin`
    commands call it (through PluginConfig) before anything is served.
    """
    if shared_count < 1:
        raise ValueError(f"--shared-count must be at least 1, got {shared_count}")
    size = shared_list_bytes(_worst_case(endpoints), shared_count)
    if size > KUBELET_MAX_MESSAGE_BYTES:
        most = fitting_shared_count(_worst_case(endpoints), shared_count)
        raise ValueError(
            f"--shared-count {shared_count} would make the rdma.shared device list {size / 2**20:.1f} MiB "
            f"for {endpoints} endpoints, over kubelet's 4 MiB gRPC message limit; at most {most} fits"
        )
