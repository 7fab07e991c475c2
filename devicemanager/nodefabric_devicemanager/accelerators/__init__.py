"""Accelerators: found on the PCI bus per manufacturer, their links, and their scale-up fabric.

The one entry point the inventory calls is `detect(host, pci) -> AcceleratorReading`.
"""

from nodefabric_devicemanager.accelerators.detect import (
    AcceleratorReading,
    Libraries,
    accelerator_functions,
    detect,
    failed_reading,
)

__all__ = ["AcceleratorReading", "Libraries", "accelerator_functions", "detect", "failed_reading"]
