"""Every name nodefabric writes into the cluster and reads back: the one place each is spelt.

Producers and consumers of a name import it from here, so the operator's label and the extender's
level can never drift apart by a typo. A leaf: it imports nothing of ours.

Two kinds of name live here. The API group names of our custom resources (and the annotation the CRD
installer writes) are fixed: a CRD's group is part of every stored object's apiVersion. Everything a
user may move with `--domain` (node labels, extended resources, the DRA driver, pod annotations and the
scheduling gate) is a function of the domain, with the default domain's spelling as a constant.
"""

from __future__ import annotations

DOMAIN = "gpustack.ai"  # the default label/resource domain; `--domain` moves every name below built from it

# --- Custom resources (fixed: the group is in every stored object's apiVersion) ---
VERSION = "v1alpha1"

DEVICES_GROUP = f"worker.{DOMAIN}"
DEVICES_KIND = "Devices"
DEVICES_PLURAL = "devices"
DEVICES_SINGULAR = "devices"

PLACEMENT_GROUP = f"placement.{DOMAIN}"  # the API group of PlacementGroup and FabricTopology
PLACEMENT_GROUP_KIND = "PlacementGroup"
PLACEMENT_GROUP_PLURAL = "placementgroups"
PLACEMENT_GROUP_SINGULAR = "placementgroup"
# The label on a PlacementGroup naming its group's family (fixed, as the API group is: not `--domain`'s).
PLACEMENT_GROUP_FAMILY_LABEL = f"{PLACEMENT_GROUP}/family"

FABRIC_TOPOLOGY_KIND = "FabricTopology"
FABRIC_TOPOLOGY_PLURAL = "fabrictopologies"

# Which nodefabric release wrote a CRD: what the installer compares to refuse a downgrade.
CRD_VERSION_ANNOTATION = f"nodefabric.{DOMAIN}/version"
# Which level of the hierarchy a projected HyperNode stands for.
TOPOLOGY_LEVEL_LABEL = f"topology.{DOMAIN}/level"

# --- Node labels: feature.<domain>/<family>.<name> ---
RDMA = "rdma"  # the families whose keys the operator owns
FABRIC = "fabric"
FAMILIES = (RDMA, FABRIC)

RDMA_CAPABLE = f"{RDMA}.capable"
RDMA_DISTANCE = f"{RDMA}.distance"
RDMA_NUMA = f"{RDMA}.numa"
FABRIC_DOMAIN = f"{FABRIC}.domain"  # the scale-up fabric a node belongs to: the extender's tightest level
FABRIC_MEMBERS = f"{FABRIC}.members"


def feature_subdomain(domain: str = DOMAIN) -> str:
    """Our node labels' key prefix without its slash, `feature.<domain>`: it must be a DNS subdomain."""
    return f"feature.{domain}"


def feature_prefix(domain: str = DOMAIN) -> str:
    """The prefix of every node label the operator publishes: `feature.<domain>/`."""
    return feature_subdomain(domain) + "/"


def feature_key(name: str, domain: str = DOMAIN) -> str:
    """A node label key of ours: `feature.<domain>/<name>` (`name` one of the constants above)."""
    return feature_prefix(domain) + name


def fabric_domain_key(domain: str = DOMAIN) -> str:
    """The label the operator writes a node's fabric domain under and the extender and topology read."""
    return feature_key(FABRIC_DOMAIN, domain)


def network_group_key(domain: str = DOMAIN) -> str:
    """Our own network-group label (a leaf switch), read first by the extender's network-group level."""
    return f"topology.{domain}/network-group"


def managed_labels_annotation(domain: str = DOMAIN) -> str:
    """The Node annotation listing the label keys the operator wrote (so a hand-set label survives)."""
    return f"nodefabric.{domain}/managed-labels"


# --- Extended resources (device plugin) and the DRA driver ---
RESOURCE_RDMA = "rdma"  # one whole RDMA function per allocation
RESOURCE_RDMA_SHARED = "rdma.shared"  # one of N tokens per whole function
RESOURCE_RDMA_PARTITIONED = "rdma.partitioned"  # one virtual function


def resource_prefix(domain: str = DOMAIN) -> str:
    """The extended-resource prefix (no slash): `device.<domain>`; must be a DNS subdomain."""
    return f"device.{domain}"


def resource_name(family: str, domain: str = DOMAIN) -> str:
    """An extended resource: `device.<domain>/<family>`, e.g. device.gpustack.ai/rdma.shared."""
    return f"{resource_prefix(domain)}/{family}"


def dra_driver(domain: str = DOMAIN) -> str:
    """The DRA driver name (DeviceClass selectors, ResourceSlices, claim results): `rdma.<domain>`."""
    return f"rdma.{domain}"


# --- Pod annotations, labels and the scheduling gate: placement.<domain>/<name> ---
GROUP = "group"  # a pod's group name (annotation or label), and the scheduling gate's name
GROUP_SIZE = "group-size"
LOCALITY = "locality"
RANK = "rank"
HOMOGENEOUS = "homogeneous"
DECISION = "decision"  # the verdict the extender and the placement controller copy onto a pod
ADMISSION = "admission"  # the namespace label that opts a namespace into gated admission
# What a pod may say about its group (annotations, or labels for the first two).
GROUP_ANNOTATIONS = (GROUP, GROUP_SIZE, LOCALITY, RANK, HOMOGENEOUS)


def placement_prefix(domain: str = DOMAIN) -> str:
    """The prefix of our pod annotations, pod labels and gate: `placement.<domain>/`."""
    return f"placement.{domain}/"


def placement_key(name: str, domain: str = DOMAIN) -> str:
    return placement_prefix(domain) + name


def scheduling_gate(domain: str = DOMAIN) -> str:
    """The scheduling gate a gated group's pods carry until the placement controller admits them."""
    return placement_key(GROUP, domain)
