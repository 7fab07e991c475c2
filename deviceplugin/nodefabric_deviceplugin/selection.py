"""Which endpoints each RDMA resource family serves, when an operator shapes it (`--rdma-selectors FILE`).

The default, with no file, is the seed's: every whole-function endpoint is offered in both the exclusive
(`rdma`) and the shared (`rdma.shared`) family, every VF in the partitioned one. So a pod holding
`device.<domain>/rdma` may share its NIC with `rdma.shared` holders. A file dedicates endpoints:

    exclusive:                   # device.<domain>/rdma
      - ifNames: [ens1f0, ens1f1]
    shared:                      # device.<domain>/rdma.shared
      - ifNames: [ens2f0]
        sharedCount: 16          # tokens per endpoint this selector picks (default --shared-count)
      - vendors: ["8086"]
        ifNames: [ens3f0]
    partitioned:                 # device.<domain>/rdma.partitioned (VFs)
      - pfNames: [ens4f0]

A selector matches an endpoint when every field it names matches (a list matches when it holds the
endpoint's value); a family matches what any of its selectors matches. A family with selectors serves
exactly what they match; a family without serves what no other family's selectors claim (so naming
only `exclusive` dedicates those NICs to it and leaves the rest to both others as before).

Fields, each a non-empty list of strings: `vendors` and `devices` (PCI ids, 4 hex digits), `ifNames`
(the endpoint's netdevs), `pfNames` (a VF's PF netdev; a whole function's own), `rdmaDevices`,
`drivers` (the kernel driver bound to the PCI function) and `linkLayers` (`InfiniBand`, `Ethernet`).
The last two are read from the host, not the record.

Refused at start, in one line: an unknown key, a key given twice, a wrong type, an empty selector or
list, a malformed id, a link layer other than `InfiniBand` or `Ethernet` (as sysfs spells them: any other
matches nothing), a `sharedCount` outside a shared selector or out of range, and an overlap: a selector
of `exclusive` and one of `shared` that could both match one endpoint (they must differ on a field both
name), since one NIC in both would be exactly the sharing the file is there to prevent. An endpoint
with several netdevs (a RoCE LAG's bond) can still match an exclusive selector by one and a shared one
by another: it is served as exclusive only.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from nodefabric_devicemanager import yamldoc
from nodefabric_devicemanager.hostroot import HostReadError, HostRoot
from nodefabric_deviceplugin.limits import check_shared_count

FAMILIES = ("exclusive", "shared", "partitioned")
# config key -> attribute of EndpointFacts
FIELDS = {
    "vendors": "vendor",
    "devices": "device",
    "ifNames": "if_names",
    "pfNames": "pf_name",
    "rdmaDevices": "rdma_device",
    "drivers": "driver",
    "linkLayers": "link_layer",
}
HOST_FIELDS = frozenset({"drivers", "linkLayers"})
MAX_FILE_BYTES = 1 << 20
PCI_DEVICES = "/sys/bus/pci/devices"
_HEX4 = re.compile(r"[0-9a-f]{4}")
LINK_LAYERS = ("InfiniBand", "Ethernet")  # what dra.linklayer.link_layer reports


class SelectionError(ValueError):
    """The selectors cannot be used; the message is one line saying where and why."""


@dataclass(frozen=True, slots=True)
class EndpointFacts:
    """What a selector can match of one endpoint."""

    vendor: str = ""
    device: str = ""
    if_names: tuple[str, ...] = ()
    pf_name: str = ""
    rdma_device: str = ""
    driver: str = ""
    link_layer: str = ""


@dataclass(frozen=True, slots=True)
class Selector:
    values: tuple[tuple[str, frozenset[str]], ...]  # (config key, accepted values), sorted by key
    shared_count: int | None = None

    def matches(self, facts: EndpointFacts) -> bool:
        for key, accepted in self.values:
            have = getattr(facts, FIELDS[key])
            if isinstance(have, tuple):
                if not accepted.intersection(have):
                    return False
            elif have not in accepted:
                return False
        return True

    def disjoint(self, other: Selector) -> bool:
        """No endpoint can match both: they name a common field with no value in common."""
        mine = dict(self.values)
        return any(key in mine and not mine[key] & values for key, values in other.values)


@dataclass(frozen=True, slots=True)
class Selection:
    families: tuple[tuple[str, tuple[Selector, ...]], ...] = ()  # only families the file names

    @property
    def default(self) -> bool:
        return not self.families

    def selectors(self, family: str) -> tuple[Selector, ...] | None:
        return dict(self.families).get(family)

    @property
    def needs_host(self) -> bool:
        return any(key in HOST_FIELDS for _, sels in self.families for s in sels for key, _ in s.values)

    def serves(self, family: str, facts: EndpointFacts) -> bool:
        own = self.selectors(family)
        if own is not None:
            if family == "shared" and any(s.matches(facts) for s in self.selectors("exclusive") or ()):
                # Exclusive wins: selectors that pass the start-up check (different netdevs named) still
                # both match an endpoint with several netdevs (a RoCE LAG's bond), and a dedicated NIC
                # also shared is what the file is there to prevent.
                return False
            return any(s.matches(facts) for s in own)
        # Without selectors of its own, a family serves what no other family's selectors claim. The
        # partitioned family serves VFs, which whole-function selectors never see, and vice versa.
        rivals = ("partitioned",) if family == "partitioned" else ("exclusive", "shared")
        return not any(
            s.matches(facts)
            for name, sels in self.families
            if name in rivals and name != family
            for s in sels
        )

    def shared_count(self, facts: EndpointFacts, default: int) -> int:
        """Tokens per endpoint in the shared family: the first matching selector's count, else the flag's."""
        for s in self.selectors("shared") or ():
            if s.matches(facts):
                return s.shared_count if s.shared_count is not None else default
        return default

    def max_shared_count(self, default: int) -> int:
        counts = [s.shared_count for s in self.selectors("shared") or () if s.shared_count is not None]
        return max([default, *counts])


def _strings(where: str, value: Any) -> frozenset[str]:
    if not isinstance(value, list) or not value:
        raise SelectionError(f"{where}: must be a non-empty list of strings")
    if not all(isinstance(v, str) and v and len(v) <= 256 for v in value):
        raise SelectionError(f"{where}: every value must be a non-empty string of at most 256 characters")
    return frozenset(value)


def _selector(where: str, family: str, raw: Any) -> Selector:
    if not isinstance(raw, Mapping):
        raise SelectionError(f"{where}: a selector must be a mapping of fields")
    unknown = sorted(str(k) for k in raw if k not in FIELDS and k != "sharedCount")
    if unknown:
        raise SelectionError(
            f"{where}: unknown field {unknown[0]!r} (known: {', '.join([*FIELDS, 'sharedCount'])})"
        )
    values = []
    for key in sorted(k for k in raw if k in FIELDS):
        accepted = _strings(f"{where}.{key}", raw[key])
        if key in ("vendors", "devices"):
            bad = sorted(v for v in accepted if not _HEX4.fullmatch(v))
            if bad:
                raise SelectionError(f"{where}.{key}: {bad[0]!r} is not a PCI id (4 lowercase hex digits)")
        if key == "linkLayers":
            # Only what a port's link_layer reports can match: any other spelling would match nothing.
            bad = sorted(accepted.difference(LINK_LAYERS))
            if bad:
                raise SelectionError(
                    f"{where}.{key}: {bad[0]!r} is not a link layer ({' or '.join(LINK_LAYERS)})"
                )
        values.append((key, accepted))
    if not values:
        raise SelectionError(
            f"{where}: an empty selector would select every endpoint; name at least one field"
        )
    count = raw.get("sharedCount")
    if count is not None:
        if family != "shared":
            raise SelectionError(f"{where}.sharedCount: only a shared selector has a count")
        if not isinstance(count, int) or isinstance(count, bool):
            raise SelectionError(f"{where}.sharedCount: must be an integer")
        try:
            check_shared_count(count)
        except ValueError as exc:
            raise SelectionError(f"{where}.sharedCount: {exc}") from None
    return Selector(tuple(values), count)


def parse(doc: Any, source: str = "the RDMA selectors") -> Selection:
    """The selection a document describes; raises SelectionError (one line) for anything refused."""
    if doc is None:
        return Selection()
    if not isinstance(doc, Mapping):
        raise SelectionError(f"{source}: must be a mapping of family -> list of selectors")
    unknown = sorted(str(k) for k in doc if k not in FAMILIES)
    if unknown:
        raise SelectionError(f"{source}: unknown family {unknown[0]!r} (known: {', '.join(FAMILIES)})")
    families = []
    for family in FAMILIES:
        if family not in doc:
            continue
        raw = doc[family]
        if not isinstance(raw, list) or not raw:
            raise SelectionError(f"{source}: {family}: must be a non-empty list of selectors")
        families.append(
            (family, tuple(_selector(f"{source}: {family}[{i}]", family, s) for i, s in enumerate(raw)))
        )
    selection = Selection(tuple(families))
    for i, a in enumerate(selection.selectors("exclusive") or ()):
        for j, b in enumerate(selection.selectors("shared") or ()):
            if not a.disjoint(b):
                raise SelectionError(
                    f"{source}: exclusive[{i}] and shared[{j}] overlap: one endpoint could match both; "
                    "make them differ on a field both name"
                )
    return selection


def load(path: str) -> Selection:
    """The selection in a YAML (or JSON) file; raises SelectionError naming the file."""
    try:
        # Opened without blocking and read only when a regular file: a plain open of a FIFO waits for a
        # writer for good, and start would hang saying nothing.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SelectionError(f"--rdma-selectors {path}: not a regular file")
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SelectionError(f"--rdma-selectors {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SelectionError(f"--rdma-selectors {path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        # yamldoc refuses alias bombs and documents nested too deep before anything walks them.
        text = data.decode("utf-8")
        doc = yamldoc.load(text)
        twice = _repeated_key(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SelectionError(f"--rdma-selectors {path}: not YAML: {first}") from None
    except ValueError as exc:  # a bomb, too deep, or not UTF-8
        raise SelectionError(f"--rdma-selectors {path}: {str(exc).splitlines()[0]}") from None
    if twice is not None:
        # A loader keeps the last of a repeated key: a first `exclusive` list would vanish, and the NIC
        # it dedicates be shared again. The API server's YAML reading refuses one too.
        raise SelectionError(f"--rdma-selectors {path}: the key {twice!r} is given twice in one mapping")
    return parse(doc, f"--rdma-selectors {path}")


def _repeated_key(text: str) -> str | None:
    """The first key a mapping of the document repeats, or None. Walks the node graph once per node (an
    alias shares its node), so a document the bomb check passed costs no more here."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    seen: set[int] = set()
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in keys:
                        return str(key.value)
                    keys.add(key.value)
                stack.extend((key, value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None


@dataclass
class HostFacts:
    """What selectors may name that the record does not carry, by RDMA device: the kernel driver of its
    PCI function and its link layer. Read only when a selector names `drivers` or `linkLayers`."""

    drivers: dict[str, str] = field(default_factory=dict)
    link_layers: dict[str, str] = field(default_factory=dict)


def read_host_facts(host: HostRoot, devices: Iterable[tuple[str, str]]) -> HostFacts:
    """(rdma device, PCI bus id) pairs -> their drivers and link layers. A fact that cannot be read is
    absent, so a selector naming it does not match (never a guess)."""
    from nodefabric_deviceplugin.dra.linklayer import link_layer

    out = HostFacts()
    pci = host.dir(PCI_DEVICES) if host.present(PCI_DEVICES) else None
    for rdma_device, bus_id in devices:
        if pci is not None and bus_id:
            try:
                driver = pci.child(bus_id).link_name("driver")
            except (HostReadError, FileNotFoundError, ValueError):
                driver = None
            if driver:
                out.drivers[rdma_device] = driver
        layer = link_layer(host, rdma_device)
        if layer:
            out.link_layers[rdma_device] = layer
    return out
