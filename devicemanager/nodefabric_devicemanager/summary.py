"""What a whole record says about its node: the usable RDMA endpoints, the closest accelerator-to-NIC
distance, the accelerators' shared fabric domain.

One definition serves the operator (labels and the `kubectl get devices` columns) and `inventory`
(which prints the same columns), so the two can never tell an operator different things.
"""

from __future__ import annotations

from nodefabric_devicemanager import distance
from nodefabric_devicemanager.models import DevicesSpec, Distance, Endpoint, Fabric, Interface, LinkState

# Amazon's PCI vendor: the only RDMA device bound to one of its functions is EFA, which AWS's own plugin
# allocates under vpc.amazonaws.com/efa; advertising it here too would hand one adapter out twice.
AMAZON_VENDOR = "1d0f"


def usable(ep: Endpoint) -> bool:
    """An explicit verdict wins over the rdma flag in both directions; without one, a bound device counts.

    An unreadable tree records rdma=false with an Unverified verdict and still counts: an inability to
    ask must not read as an answer of no, because withholding the label removes the node from scheduling.

    A software RDMA device (rxe, siw) never counts, whatever its link: it emulates RDMA on the CPU over an
    ordinary netdev, cannot do GPUDirect, and NCCL over it is no faster than over TCP sockets, so a job
    that selects on rdma.capable would land on a node that cannot give it what the label promises.
    """
    if ep.rdma_software:
        return False
    if ep.link is not None:
        return ep.link.state != LinkState.FAILED
    return ep.rdma


def usable_endpoints(spec: DevicesSpec) -> list[Endpoint]:
    return [ep for ep in spec.endpoints() if usable(ep)]


def best_distance(spec: DevicesSpec, endpoints: list[Endpoint] | None = None) -> Distance | None:
    """The closest accelerator-to-usable-endpoint distance. None without an accelerator or an endpoint:
    a distance is a statement about a pair, so it is absent there rather than UNK."""
    endpoints = usable_endpoints(spec) if endpoints is None else endpoints
    accelerators = [a.topology for g in spec.groups for a in g.accelerators]
    if not accelerators or not endpoints:
        return None
    return distance.closest(accelerators, endpoints)


def fabric_domain(fabric: Fabric | None) -> str | None:
    """`<kind>-<id>[-<clique>]`, or None for an accelerator in no identified domain."""
    if fabric is None or not fabric.id:
        return None
    parts = [str(fabric.kind), fabric.id]
    if fabric.clique_id is not None:
        # Two accelerators sharing a cluster but not its clique cannot address each other.
        parts.append(str(fabric.clique_id))
    return "-".join(parts)


def node_fabric_domain(spec: DevicesSpec) -> str | None:
    """The domain every accelerator of the node reports; None when they differ or one is in none, since
    naming one of several domains would advertise co-location the hardware does not offer."""
    domains = {fabric_domain(a.topology.fabric) for g in spec.groups for a in g.accelerators}
    return domains.pop() if len(domains) == 1 else None


# --- what kubelet's RDMA keys draw on (the device plugin builds its families by the same rules) ---------


def partitioned(iface: Interface) -> bool:
    """A PF with VFs configured serves only the partitioned family. Both facts are read."""
    return iface.sriov and iface.sriov_num_vfs > 0


def top_level_vf(iface: Interface) -> bool:
    """A VF listed at top level because its PF has no host netdev (moved into a pod, bound to vfio)."""
    return bool(iface.physical_function)


def servable(ep: Endpoint) -> bool:
    """Whether an endpoint can be handed out at all. Without a device name there is nothing an allocation
    could hand over. Software RDMA (rxe, siw) is not served: the node is not RDMA capable by `usable`'s
    rule, and a token would hand a job CPU-emulated RDMA under a resource that promises a NIC."""
    return bool(ep.rdma_device) and ep.pci_vendor != AMAZON_VENDOR and not ep.rdma_software


def served_endpoints(spec: DevicesSpec) -> int:
    """What kubelet's RDMA keys draw on: whole functions (a PF with VFs configured is not one) and VFs,
    one per RDMA device (two netdevs can share one, e.g. a bond over a LAG)."""
    whole = {
        i.rdma_device for i in spec.interfaces if not partitioned(i) and not top_level_vf(i) and servable(i)
    }
    vfs = {
        vf.rdma_device
        for i in spec.interfaces
        if partitioned(i)
        for vf in i.virtual_functions
        if servable(vf)
    }
    top = {i.rdma_device for i in spec.interfaces if top_level_vf(i) and servable(i)}
    return len(whole) + len(vfs | top)
