"""Kernel uevents for net, infiniband and pci as pass triggers.

The monitor listens to the kernel's own netlink source, not udevd's: a node image need not run udevd,
and the kernel event is what we want (a driver bound, a VF appeared, a port changed). An event only
asks for a pass; the pass re-reads everything, so a missed event costs at most one interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SUBSYSTEMS = ("net", "infiniband", "pci")


class UeventWatch:
    """Calls `on_event` (from the event loop) after each burst of matching kernel uevents."""

    def __init__(self, on_event: Callable[[], None], subsystems: tuple[str, ...] = SUBSYSTEMS) -> None:
        self._on_event = on_event
        self._subsystems = subsystems
        self._monitor: Any = None
        self._fd: int | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Start listening; False (logged once) where netlink is not permitted or pyudev cannot load
        libudev: the agent then runs on its periodic pass alone."""
        try:
            import pyudev

            monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
            for subsystem in self._subsystems:
                monitor.filter_by(subsystem)
            monitor.start()
        except Exception as exc:  # ImportError, OSError (EPERM, EPROTONOSUPPORT), libudev missing
            log.warning("kernel uevents unavailable; relying on the periodic pass", extra={"error": str(exc)})
            return False
        self._monitor = monitor
        self._fd = monitor.fileno()
        loop.add_reader(self._fd, self._drain)
        log.info("watching kernel uevents", extra={"subsystems": ",".join(self._subsystems)})
        return True

    def _drain(self) -> None:
        monitor = self._monitor
        seen = False
        try:
            while (device := monitor.poll(timeout=0)) is not None:
                seen = True
                log.debug(
                    "kernel uevent",
                    extra={"action": device.action, "subsystem": device.subsystem, "path": device.sys_path},
                )
        except OSError as exc:  # ENOBUFS after an event storm: events were lost, so a pass is due anyway
            log.warning("kernel uevent socket overflowed", extra={"error": str(exc)})
            seen = True
        if seen:
            self._on_event()

    def stop(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._fd is not None:
            loop.remove_reader(self._fd)
            self._fd = None
        self._monitor = None  # pyudev closes the socket when the monitor is collected
