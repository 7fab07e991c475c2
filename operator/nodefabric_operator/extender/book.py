"""The extender's own record of groups: the bucket each was given and the pods it let through.

A pod let through by filter is a claim on its group's room until the cache sees it bound or the claim
expires (kube-scheduler may still reject the pod after us). A group's record goes when it has no pod
left in the cache and no live claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nodefabric_operator.extender.placement import Choice


@dataclass
class GroupRecord:
    key: str
    size: int = 0
    size_source: str = ""
    locality: str = ""
    rank: str = ""
    choice: Choice | None = None
    claims: dict[str, float] = field(default_factory=dict)  # pod uid -> expiry (monotonic seconds)
    outcome: str = ""
    level: str = ""
    summary: str = ""
    updated: float = 0.0
    told: dict[str, str] = field(default_factory=dict)  # pod uid -> last event message sent to it

    def live_claims(self, now: float, except_uid: str, bound: set[str]) -> int:
        return sum(
            1 for uid, exp in self.claims.items() if exp > now and uid != except_uid and uid not in bound
        )

    def view(self, now: float) -> dict[str, Any]:
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
            "claims": sorted(uid for uid, exp in self.claims.items() if exp > now),
            "summary": self.summary,
        }


class Book:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.groups: dict[str, GroupRecord] = {}

    def get(self, key: str) -> GroupRecord:
        rec = self.groups.get(key)
        if rec is None:
            rec = self.groups[key] = GroupRecord(key)
        return rec

    def claim(self, key: str, uid: str, now: float) -> None:
        self.get(key).claims[uid] = now + self.ttl

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
