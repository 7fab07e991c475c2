"""Standalone mode: the driver reads the host itself (no agent, no Devices object), every few seconds.

Unlike the device plugin's standalone reader it needs the accelerators too (the fabric domain and each
endpoint's distance to its closest accelerator are attributes), so it runs the whole inventory pass. A
failed read keeps what is recorded, by the agent's rule (`inventory.keep_recorded`): a failed read is
not an empty host. Reads go through the one host poll (`hostpoll.poll`), with its deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nodefabric_devicemanager import hostpoll, inventory
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.models import DevicesSpec
from nodefabric_deviceplugin.source import RecordSource

log = logging.getLogger(__name__)

Reader = Callable[[HostRoot], inventory.Reading]


def record(reading: inventory.ReadingLike, last: DevicesSpec | None) -> DevicesSpec | None:
    """The record a reading yields, the last one kept where the reading failed; None when there is
    nothing to go on (interfaces never read)."""
    if reading.interfaces is None and last is None:
        return None
    return inventory.keep_recorded(reading, last)


async def poll_record(
    source: RecordSource,
    host: HostRoot,
    *,
    interval: float,
    stop: asyncio.Event,
    reader: Reader = inventory.read,
    deadline: float = hostpoll.DEFAULT_DEADLINE_S,
) -> None:
    """Read the host every `interval` seconds and feed the source until `stop` is set."""

    def feed(reading: inventory.Reading) -> None:
        if reading.interfaces is None:
            log.error("could not enumerate interfaces; serving the last record", extra={"root": host.root})
        spec = record(reading, source.spec)
        if spec is not None and source.update(spec):
            log.info(
                "device record changed",
                extra={"interfaces": len(spec.interfaces), "version": source.version},
            )

    await hostpoll.poll(
        lambda: reader(host),
        feed,
        root=host.root,
        interval=interval,
        stop=stop,
        log=log,
        deadline=deadline,
    )
