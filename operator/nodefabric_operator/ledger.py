"""What the operator holds per node between events, shared by the publish (reconcile) and LabelsOnNode
(nodewatch): the record as last prepared, the version fully handled, the records the watch has listed, and
one lock per node so the two never write a node's status at once. Only the event loop touches it."""

from __future__ import annotations

import asyncio

from nodefabric_operator.noderecord import NodeRecord


class Ledger:
    def __init__(self) -> None:
        self.records: dict[str, NodeRecord] = {}  # node -> the record as last prepared
        self.handled: dict[str, str | None] = {}  # node -> the record version fully handled
        self.known: dict[str, str] = {}  # node -> uid of every Devices record the watch has listed
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def drop_lock(self, name: str) -> None:
        """Nodes come and go: keep no lock for one that went (and is not being worked on)."""
        if name not in self.records and not self.lock(name).locked():
            self._locks.pop(name, None)

    def keep(self, before: NodeRecord, after: NodeRecord) -> None:
        """Hold the record as our status write left it, unless a newer version arrived meanwhile."""
        held = self.records.get(before.name)
        if held is not None and held.rv == before.rv:
            self.records[before.name] = after

    def forget(self, name: str) -> None:
        for table in (self.known, self.records, self.handled):
            table.pop(name, None)
