"""Request accounting: exact counts by method, resource and verb, and a history of recent requests
bounded by count and by body bytes (a kept request holds its body and its decoded JSON)."""

from __future__ import annotations

import collections
from typing import Any

import kmock

from nodefabric_operator.demo.kubeapi.knobs import Knobs
from nodefabric_operator.demo.kubeapi.routes import resource_key


class RequestHistory:
    def __init__(self, knobs: Knobs) -> None:
        self._knobs = knobs
        # kmock's request history: its response DSL finds a request here by identity.
        self.kept: collections.deque[Any] = collections.deque()
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._sizes: collections.deque[int] = collections.deque()
        self._kept_bytes = 0

    def count(self, method: str | None = None, resource: str | None = None, verb: str | None = None) -> int:
        wanted = None if resource is None else resource_key(resource)
        return sum(
            n
            for (m, r, v), n in self.counts.items()
            if (method is None or m == method.upper())
            and (wanted is None or r == wanted)
            and (verb is None or v == verb)
        )

    def remember(self, request: Any, size: int) -> None:
        """Keep `request`, forgetting the oldest beyond `history` requests or `history_bytes` of bodies
        (a body larger than the whole budget is not kept at all)."""
        history, history_bytes = self._knobs.history, self._knobs.history_bytes
        while self.kept and (len(self.kept) >= history or self._kept_bytes + size > history_bytes):
            self.kept.popleft()
            self._kept_bytes -= self._sizes.popleft()
        if size <= history_bytes and history > 0:
            self.kept.append(request)
            self._sizes.append(size)
            self._kept_bytes += size

    def requests(self, method: str | None = None, resource: str | None = None) -> list[Any]:
        wanted = None if resource is None else kmock.resource(resource_key(resource))
        out = []
        for req in list(self.kept):
            if method and str(getattr(req.method, "value", req.method)).upper() != method.upper():
                continue
            if wanted is not None and req.resource != wanted:
                continue
            out.append(req)
        return out
