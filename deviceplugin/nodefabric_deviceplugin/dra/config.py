"""The driver's identity and where its files live on the node, validated once at start."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from nodefabric_devicemanager import vocabulary
from nodefabric_devicemanager.names import dns_subdomain
from nodefabric_deviceplugin.selection import Selection
from nodefabric_deviceplugin.startup import utf8

DEFAULT_DOMAIN = vocabulary.DOMAIN
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_CDI_DIR = "/var/run/cdi"
PLUGIN_TYPE = "DRAPlugin"
# The DRAPlugin services served on the DRA socket, newest first; kubelet picks the newest it knows.
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
# A unix socket path is at most 107 bytes (sun_path holds 108 with the terminating NUL).
MAX_SOCKET_PATH = 107
STANDARD_DOMAIN = "resource.kubernetes.io"
# Which functions the driver offers: whole PCI functions ("pf") and SR-IOV virtual functions ("vf").
FUNCTION_TYPES = ("pf", "vf")


@dataclass(frozen=True, slots=True)
class DriverConfig:
    node_name: str
    domain: str = DEFAULT_DOMAIN
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    registry_dir: str = DEFAULT_REGISTRY_DIR
    cdi_dir: str = DEFAULT_CDI_DIR
    # Beside the device plugin the driver offers only whole functions, so no endpoint is offered twice.
    functions: tuple[str, ...] = FUNCTION_TYPES
    # The device plugin's `--rdma-selectors`: whole functions are offered as its exclusive family selects
    # them, VFs as its partitioned family does (the default offers every one).
    selection: Selection = field(default_factory=Selection)

    def __post_init__(self) -> None:
        if not self.functions or not set(self.functions) <= set(FUNCTION_TYPES):
            raise ValueError(f"the function types must be some of {FUNCTION_TYPES}, got {self.functions!r}")
        if not dns_subdomain(self.node_name):
            raise ValueError(f"the node name must be a DNS subdomain (a Node's name), got {self.node_name!r}")
        # The driver name is a DNS subdomain of at most 63 characters (ResourceSlice validation).
        if not dns_subdomain(self.domain) or not dns_subdomain(self.driver, 63):
            raise ValueError(
                f"the domain must be a DNS subdomain such that rdma.<domain> has at most 63 characters,"
                f" got {self.domain!r}"
            )
        for flag, path in (
            ("--plugin-dir", self.plugin_dir),
            ("--registry-dir", self.registry_dir),
            ("--cdi-dir", self.cdi_dir),
        ):
            if not os.path.isabs(path):
                raise ValueError(
                    f"{flag} must be an absolute path (kubelet dials what we tell it), got {path!r}"
                )
        for what, path in (
            ("DRA socket", self.dra_socket),
            ("registration socket", self.registration_socket),
        ):
            if len(os.fsencode(path)) > MAX_SOCKET_PATH:
                raise ValueError(f"the {what} path {path} is longer than {MAX_SOCKET_PATH} bytes")
            if not utf8(path):  # gRPC takes it as UTF-8: the first serve would raise, not say this
                raise ValueError(f"the {what} path {path!r} is not valid UTF-8, as gRPC needs")

    @property
    def driver(self) -> str:
        """The driver name: `rdma.<domain>`, as in DeviceClass selectors and ResourceClaim results."""
        return vocabulary.dra_driver(self.domain)

    @property
    def pool(self) -> str:
        """One pool per node, named after it."""
        return self.node_name

    @property
    def socket_dir(self) -> str:
        return os.path.join(self.plugin_dir, self.driver)

    @property
    def dra_socket(self) -> str:
        return os.path.join(self.socket_dir, "dra.sock")

    @property
    def registration_socket(self) -> str:
        return os.path.join(self.registry_dir, f"{self.driver}-reg.sock")

    @property
    def checkpoint_path(self) -> str:
        # Beside the socket, under kubelet's state directory: it survives reboots, as kubelet's own does.
        return os.path.join(self.socket_dir, "checkpoint.json")
