"""Standalone mode: the driver reads the host itself (no agent, no Devices object), every few seconds.

Unlike the device plugin's standalone reader it needs the accelerators too (the fabric domain and each
endpoint's distance to its closest accelerator are attributes), so it runs the whole inventory pass. A
part that could not be read keeps its last reading: a failed read is not an empty host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from nodefabric_devicemanager import inventory
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin.source import RecordSource

log = logging.getLogger(__name__)

Reader = Callable[[HostRoot], inventory.Reading]


def record(reading: inventory.Reading, last: DevicesSpec | None) -> DevicesSpec | None:
    """The record a reading yields, merged with the last one where the reading failed; None when there
    is nothing to go on (interfaces never read)."""
    interfaces = reading.interfaces if reading.interfaces is not None else (last.interfaces if last else None)
    if interfaces is None:
        return None
    kept = [g for g in (last.groups if last else []) if g.id in reading.failed_manufacturers]
    fresh = [g for g in reading.groups if g.id not in reading.failed_manufacturers]
    return DevicesSpec(interfaces=interfaces, groups=sorted([*fresh, *kept], key=lambda g: g.id))


async def poll_record(
    source: RecordSource,
    host: HostRoot,
    *,
    interval: float,
    stop: asyncio.Event,
    reader: Reader = inventory.read,
) -> None:
    """Read the host every `interval` seconds and feed the source until `stop` is set."""
    while not stop.is_set():
        try:
            reading = await asyncio.to_thread(reader, host)
        except Exception:
            log.exception("reading the host failed; serving the last record", extra={"root": host.root})
        else:
            if reading.interfaces is None:
                log.error(
                    "could not enumerate interfaces; serving the last record", extra={"root": host.root}
                )
            spec = record(reading, source.spec)
            if spec is not None and source.update(spec):
                log.info(
                    "device record changed",
                    extra={"interfaces": len(spec.interfaces), "version": source.version},
                )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)
