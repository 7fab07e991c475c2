"""The extender's own record of groups: the bucket each was given and the pods it let through.

A pod let through by filter is a claim on its group's room until the cache sees it bound or the claim
expires (kube-scheduler may still reject the pod after us). The record is bounded: at most `cap` groups,
least recently used dropped first. Nothing is lost with one: what a group needs to go on (its bucket,
its claims) is also persisted on its pods and read back through the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nodefabric_operator.extender.placement import Choice

# Pods per group whose last message the record remembers (so a retried pod is told once).
TOLD_CAP = 512


@dataclass
class GroupRecord:
    key: str
    size: int = 0
    size_source: str = ""
    locality: str = ""
    rank: str = ""
    choice: Choice | None = None
    chosen_at: float = 0.0  # when `choice` was made here (seconds since the epoch)
    claims: dict[str, float] = field(default_factory=dict)  # pod uid -> expiry (seconds since the epoch)
    outcome: str = ""
    level: str = ""
    summary: str = ""
    updated: float = 0.0
    # pod uid -> the last message sent, and when the claim sent with it was made (None: no claim)
    told: OrderedDict[str, tuple[str, float | None]] = field(default_factory=OrderedDict)

    def tell(self, uid: str, message: str, claimed: float | None = None, renew_after: float = 0.0) -> bool:
        """Remember the message (and claim time) for the pod; False when it was already told exactly
        this, with a claim made less than `renew_after` seconds before `claimed`."""
        last = self.told.get(uid)
        if last is not None and last[0] == message:
            made = last[1]
            if claimed is None or (made is not None and claimed - made < renew_after):
                return False
        self.told[uid] = (message, claimed)
        self.told.move_to_end(uid)
        while len(self.told) > TOLD_CAP:
            self.told.popitem(last=False)
        return True

    def view(self, now: float, claims: dict[str, float]) -> dict[str, Any]:
        return {
            "group": self.key,
            "size": self.size,
            "sizeFrom": self.size_source,
            "locality": self.locality,
            "rank": self.rank,
            "outcome": self.outcome,
            "level": self.level,
            "location": self.choice.location if self.choice else None,
            "homogeneous": dict(self.choice.homogeneity) if self.choice else {},
            "claims": sorted(uid for uid, exp in claims.items() if exp > now),
            "summary": self.summary,
        }


class Book:
    def __init__(self, ttl: float, cap: int) -> None:
        self.ttl = ttl
        self.cap = cap
        self.groups: OrderedDict[str, GroupRecord] = OrderedDict()
        self.on_evict: Callable[[], None] = lambda: None

    def get(self, key: str) -> GroupRecord:
        """The group's record, made when missing; the least recently used beyond the cap go."""
        rec = self.groups.get(key)
        if rec is None:
            rec = self.groups[key] = GroupRecord(key)
            while len(self.groups) > self.cap:
                self.groups.popitem(last=False)
                self.on_evict()
        else:
            self.groups.move_to_end(key)
        return rec

    def peek(self, key: str) -> GroupRecord | None:
        return self.groups.get(key)

    def claim(self, key: str, uid: str, now: float) -> None:
        self.get(key).claims[uid] = now + self.ttl

    def release(self, key: str, uid: str) -> None:
        rec = self.groups.get(key)
        if rec is not None:
            rec.claims.pop(uid, None)

    def forget(self, key: str) -> None:
        self.groups.pop(key, None)

    def sweep(self, now: float, alive: set[str]) -> list[str]:
        """Drop expired claims, and groups with no pod in the cache and nothing live; returns them."""
        gone: list[str] = []
        for key, rec in list(self.groups.items()):
            rec.claims = {uid: exp for uid, exp in rec.claims.items() if exp > now}
            if not rec.claims and key not in alive and now - rec.updated > self.ttl:
                del self.groups[key]
                gone.append(key)
        return gone
