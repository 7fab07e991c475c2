"""What to write, decided without I/O: the desired Devices spec and conditions, and create / patch / nothing.

The decision compares a freshly read host with the live object. Steady state must cost zero API writes,
so the comparison is order-insensitive (sysfs directory order is not stable) and ignores volatile
fields, and the one time-valued field (a failed link's firstSeenTime) is merged from the stored object
before comparing: taking the clock each pass would never compare equal and rewrite the object forever.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from nodefabric_devicemanager import inventory, summary
from nodefabric_devicemanager.models import (
    ACCELERATORS_ENUMERATED,
    FABRIC_READ_SUFFIX,
    INTERFACES_ENUMERATED,
    READY,
    Condition,
    DevicesSpec,
    Endpoint,
    Interface,
    LinkState,
    set_condition,
)
from nodefabric_devicemanager.pci import bus_key

log = logging.getLogger(__name__)


# What one pass yields; the agent's observation is one too.
ReadingLike = inventory.ReadingLike


@dataclass(frozen=True, slots=True)
class Plan:
    """One pass's decision. `spec` / `conditions` are None when that part already matches."""

    create: bool
    spec: DevicesSpec | None
    conditions: list[dict[str, Any]] | None
    # The spec decided on, also when it equals the stored one (then the caller keeps this copy, not both).
    desired: DevicesSpec | None = None
    # The agent's status summaries (rdmaServed, failedLinks, notRead) when they differ from the stored
    # ones; written with the conditions, in the one status patch.
    summary: dict[str, Any] | None = None

    @property
    def writes(self) -> bool:
        return self.create or self.spec is not None or self.conditions is not None or self.summary is not None


# --- firstSeenTime ---------------------------------------------------------------------------------


def _vf_key(ep: Endpoint) -> str:
    # A VF may have no netdev of its own, so its PCI address is its identity.
    return ep.pci_bus_id or ep.name


def _carry(fresh: Endpoint, stored: Endpoint | None, now: datetime) -> dict[str, Any]:
    """The `link` update for one endpoint (empty when it already reads right): a failure keeps the time
    it was first seen, as long as it lasts; anything else has no time."""
    link = fresh.link
    if link is None or link.state is not LinkState.FAILED:
        return (
            {}
            if link is None or link.first_seen_time is None
            else {"link": link.model_copy(update={"first_seen_time": None})}
        )
    before = stored.link if stored is not None else None
    if before is not None and before.state is LinkState.FAILED and before.first_seen_time is not None:
        seen = before.first_seen_time
    else:
        seen = link.first_seen_time or now
    return {} if seen == link.first_seen_time else {"link": link.model_copy(update={"first_seen_time": seen})}


def carry_first_seen(
    fresh: Sequence[Interface], stored: Sequence[Interface], now: datetime
) -> list[Interface]:
    """`fresh`, each failed link's firstSeenTime taken from `stored` where that failure was already there."""
    by_name = {i.name: i for i in stored}
    out: list[Interface] = []
    # Only an endpoint whose time changes is copied: a node has thousands of VFs and most never fail.
    for iface in fresh:
        before = by_name.get(iface.name)
        before_vfs = {_vf_key(vf): vf for vf in before.virtual_functions} if before is not None else {}
        vfs = []
        changed = False
        for vf in iface.virtual_functions:
            update = _carry(vf, before_vfs.get(_vf_key(vf)), now)
            vfs.append(vf.model_copy(update=update) if update else vf)
            changed = changed or bool(update)
        update = _carry(iface, before, now)
        if changed:
            update["virtual_functions"] = vfs
        out.append(iface.model_copy(update=update) if update else iface)
    return out


# --- the desired spec ------------------------------------------------------------------------------


def desired_spec(reading: ReadingLike, stored: DevicesSpec | None, now: datetime) -> DevicesSpec:
    """The spec to publish: `inventory.keep_recorded` (a failed read keeps what is recorded), with each
    failed link's firstSeenTime carried from the stored spec."""
    carried = (
        carry_first_seen(reading.interfaces, stored.interfaces if stored else [], now)
        if reading.interfaces is not None
        else None
    )
    return inventory.keep_recorded(reading, stored, interfaces=carried)


def _canonical_endpoint(ep: dict[str, Any]) -> dict[str, Any]:
    out = dict(ep)
    link = out.get("link")
    if isinstance(link, dict):
        out["link"] = {k: v for k, v in link.items() if k != "firstSeenTime"}
    vfs = out.get("virtualFunctions")
    if isinstance(vfs, list):
        canon = [_canonical_endpoint(vf) for vf in vfs]
        out["virtualFunctions"] = sorted(
            canon,
            key=lambda v: (bus_key(v.get("pciBusId", "")), v.get("pciBusId", ""), v.get("name", "")),
        )
    return out


def canonical(spec: DevicesSpec) -> dict[str, Any]:
    """The spec as compared: every list in a fixed order, volatile fields (firstSeenTime) left out.
    pciSwitches keeps its order because it means something (innermost first)."""
    wire = spec.wire()
    interfaces = sorted(
        (_canonical_endpoint(i) for i in wire.get("interfaces", [])), key=lambda i: i.get("name", "")
    )
    groups = []
    for group in wire.get("groups", []):
        accelerators = sorted(
            group.get("accelerators", []), key=lambda a: (a.get("index", 0), a.get("id", ""))
        )
        groups.append({**group, "accelerators": accelerators})
    groups.sort(key=lambda g: (g.get("manufacturer", ""), g.get("id", "")))
    return {"interfaces": interfaces, "groups": groups}


def same_spec(a: DevicesSpec, b: DevicesSpec) -> bool:
    # Equal models are equal specs; only specs that differ as models (order, firstSeenTime) are compared
    # in canonical form, which costs a copy of both as dicts. A list read for the first time is a change
    # even when it is empty: the key appears (an enumerated host with no interfaces writes []).
    if any(a.has(key) != b.has(key) for key in ("interfaces", "groups")):
        return False
    return a == b or canonical(a) == canonical(b)


# --- conditions ------------------------------------------------------------------------------------


def reported_conditions(reading: ReadingLike) -> list[Condition]:
    """The reading's own conditions, plus the two enumeration conditions where the reading left them out,
    so a reader of the object can always tell a failed read from an empty host."""
    out = list(reading.conditions)
    types = {c.type for c in out}
    if INTERFACES_ENUMERATED not in types:
        if reading.interfaces is None:
            out.append(
                Condition(
                    type=INTERFACES_ENUMERATED,
                    status="False",
                    reason="EnumerationFailed",
                    message="network interfaces could not be enumerated; the recorded list is kept",
                )
            )
        else:
            out.append(Condition(type=INTERFACES_ENUMERATED, status="True", reason="Enumerated"))
    if ACCELERATORS_ENUMERATED not in types:
        if reading.failed_manufacturers:
            names = ", ".join(sorted(reading.failed_manufacturers))
            out.append(
                Condition(
                    type=ACCELERATORS_ENUMERATED,
                    status="False",
                    reason="EnumerationFailed",
                    message=f"accelerators of {names} could not be read; their recorded groups are kept",
                )
            )
        else:
            out.append(Condition(type=ACCELERATORS_ENUMERATED, status="True", reason="Enumerated"))
    return out


def merge_conditions(
    current: Iterable[Mapping[str, Any]], reported: Sequence[Condition], now: datetime
) -> list[dict[str, Any]] | None:
    """The status.conditions to write, or None when ours already read as reported.

    Conditions are owned per type: another writer's entries are carried verbatim (every field, even ones
    our model does not know), and ours move lastTransitionTime only when their status changes. The list
    is a map keyed by type: an entry repeated by hand is merged into one (the first that parses), once."""
    current = [c for c in current if isinstance(c, Mapping)]
    types = [c.get("type") for c in current]
    duplicated = len(types) != len(set(map(str, types)))
    ours_types = {c.type for c in reported}
    others: dict[str, dict[str, Any]] = {}
    ours_now: dict[str, Condition] = {}
    for raw in current:
        kind = str(raw.get("type"))
        if kind not in ours_types:
            others.setdefault(kind, dict(raw))
            continue
        if kind in ours_now:
            continue
        try:
            ours_now[kind] = Condition.model_validate(raw)
        except ValidationError:
            log.warning("rewriting a malformed condition", extra={"condition": dict(raw)})
    before = [c.wire() for c in sorted(ours_now.values(), key=lambda c: c.type)]
    merged = sorted(ours_now.values(), key=lambda c: c.type)
    for cond in reported:
        merged = set_condition(merged, cond, now)
    after = [c.wire() for c in merged]
    if before == after and not duplicated:
        return None
    return sorted([*others.values(), *after], key=lambda c: str(c.get("type", "")))


def ready_condition(reported: Sequence[Condition]) -> Condition:
    """The roll-up: True when every part of the host was read. It is written in the status patch that
    follows the spec write, so a True one on the object also says the record holding that reading is
    published (a spec write that fails writes no status)."""
    unread = [c.type for c in reported if c.status != "True" and c.type != READY]
    if unread:
        return Condition(
            type=READY,
            status="False",
            reason="NotRead",
            message=f"{', '.join(sorted(unread))} not True; the recorded data is kept for what was not read",
        )
    return Condition(type=READY, status="True", reason="Published", message="every part of the host read")


def _part(condition_type: str) -> str:
    if condition_type == INTERFACES_ENUMERATED:
        return "interfaces"
    if condition_type == ACCELERATORS_ENUMERATED:
        return "accelerators"
    if condition_type.endswith(FABRIC_READ_SUFFIX):
        return f"{condition_type.removesuffix(FABRIC_READ_SUFFIX).lower()}-fabric"
    return condition_type


def summaries(spec: DevicesSpec, reported: Sequence[Condition]) -> dict[str, Any]:
    """The status fields the agent owns beside its conditions, as `kubectl get devices` prints them."""
    failed = sum(1 for ep in spec.endpoints() if ep.link is not None and ep.link.state is LinkState.FAILED)
    not_read = sorted({_part(c.type) for c in reported if c.status != "True" and c.type != READY})
    return {
        "rdmaServed": summary.served_endpoints(spec),
        "failedLinks": failed,
        "notRead": ",".join(not_read),
    }


def _summary_change(
    stored: Mapping[str, Any] | None, spec: DevicesSpec | None, reported: Sequence[Condition]
) -> dict[str, Any] | None:
    if spec is None:
        return None
    want = summaries(spec, reported)
    status = (stored or {}).get("status") or {}
    have = {k: status.get(k) for k in want} if isinstance(status, Mapping) else {}
    return None if have == want else want


# --- the decision ----------------------------------------------------------------------------------


def stored_spec(obj: Mapping[str, Any]) -> DevicesSpec | None:
    """The live object's spec, or None when it does not parse (then it is rewritten whole)."""
    try:
        return DevicesSpec.model_validate(obj.get("spec") or {})
    except ValidationError as exc:
        log.warning(
            "the stored spec does not parse; the next pass that reads the whole host rewrites it",
            extra={"error": str(exc)},
        )
        return None


_UNPARSED: Any = object()


def plan(
    stored: Mapping[str, Any] | None, reading: ReadingLike, now: datetime, parsed: Any = _UNPARSED
) -> Plan:
    """Create when there is no object; otherwise patch only the parts that changed. `parsed` is the
    stored spec already parsed (a `DevicesSpec`, or None when it does not parse), when the caller has it."""
    reported = reported_conditions(reading)
    written = [*reported, ready_condition(reported)]
    if stored is None:
        created = desired_spec(reading, None, now)
        return Plan(
            create=True,
            spec=created,
            conditions=merge_conditions([], written, now),
            summary=summaries(created, reported),
        )
    old = stored_spec(stored) if parsed is _UNPARSED else parsed
    conditions = merge_conditions((stored.get("status") or {}).get("conditions") or [], written, now)
    if old is None and (reading.interfaces is None or reading.failed_manufacturers):
        # Rewriting an unparseable record from a partial read would replace what it holds with an empty
        # list, a failed read published as an empty host: it stays until a pass reads every part.
        return Plan(create=False, spec=None, conditions=conditions)
    desired = desired_spec(reading, old, now)
    spec = None if old is not None and same_spec(desired, old) else desired
    summary = _summary_change(stored, desired, reported)
    return Plan(create=False, spec=spec, conditions=conditions, desired=desired, summary=summary)
