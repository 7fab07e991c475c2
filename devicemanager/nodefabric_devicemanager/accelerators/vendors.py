"""Which PCI functions are accelerators, and whose.

An accelerator is a function of a known manufacturer's vendor id whose class is a display/3D controller
(0x03xx) or a processing accelerator (0x12xx). The class test is what keeps a GPU's HDMI audio function
(0x0403) and the manufacturers' bridges and NVSwitches (0x0604, 0x0680) out of the list.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodefabric_devicemanager.models import FABRIC_READ_SUFFIX


@dataclass(frozen=True, slots=True)
class Manufacturer:
    key: str  # stable lowercase id: group id and label fragment ("nvidia")
    name: str  # as the manufacturer writes it ("NVIDIA")
    vendor_id: str  # PCI vendor id, lowercase hex without 0x
    group_name: str  # what the group's accelerators are called ("GPU", "NPU", ...)

    @property
    def fabric_condition(self) -> str:
        """The status condition saying whether this manufacturer's fabric could be read."""
        return self.key.capitalize() + FABRIC_READ_SUFFIX


NVIDIA = Manufacturer("nvidia", "NVIDIA", "10de", "GPU")
AMD = Manufacturer("amd", "AMD", "1002", "GPU")
ASCEND = Manufacturer("ascend", "Huawei Ascend", "19e5", "NPU")
CAMBRICON = Manufacturer("cambricon", "Cambricon", "cabc", "MLU")
HYGON = Manufacturer("hygon", "Hygon", "1d94", "DCU")
ILUVATAR = Manufacturer("iluvatar", "Iluvatar CoreX", "1e3e", "GPU")
METAX = Manufacturer("metax", "MetaX", "9999", "GPU")
MTHREADS = Manufacturer("mthreads", "Moore Threads", "1ed5", "GPU")
THEAD = Manufacturer("thead", "T-Head", "1ded", "PPU")

MANUFACTURERS: tuple[Manufacturer, ...] = (
    NVIDIA,
    AMD,
    ASCEND,
    CAMBRICON,
    HYGON,
    ILUVATAR,
    METAX,
    MTHREADS,
    THEAD,
)
BY_VENDOR: dict[str, Manufacturer] = {m.vendor_id: m for m in MANUFACTURERS}

# PCI base classes (the first byte of the 24-bit class code).
ACCELERATOR_CLASSES = ("03", "12")


def is_accelerator_class(class_code: str) -> bool:
    code = class_code.lower().removeprefix("0x")
    return len(code) == 6 and code[:2] in ACCELERATOR_CLASSES


def manufacturer_of(vendor: str, class_code: str) -> Manufacturer | None:
    """The manufacturer of an accelerator function, or None when the function is not one."""
    if not is_accelerator_class(class_code):
        return None
    return BY_VENDOR.get(vendor.lower().removeprefix("0x"))
