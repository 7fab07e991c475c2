"""Filter and prioritize: resolve the pod's group from the cache and the book, decide, record, explain."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, overload

from prometheus_client import CollectorRegistry, Counter, Histogram

from nodefabric_operator.extender import placement
from nodefabric_operator.extender.book import Book, GroupRecord
from nodefabric_operator.extender.cache import POD_GROUP_APIS, VOLCANO_GROUP_ANNOTATION, Cache, pod_requests
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.groups import GroupSpec, InvalidPlacement, group_of, pod_namespace, pod_uid
from nodefabric_operator.extender.wire import ExtenderArgs, FilterResult, filter_result, host_priorities

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 10.0
NOT_CACHED = "node is not in the extender's node cache yet"


class EventSink(Protocol):
    def emit(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.decisions = Counter(
            "nodefabric_extender_decisions",
            "Filter decisions by outcome (placed, wait, never-fits, pass-through, invalid) and level.",
            ["outcome", "level"],
            registry=registry,
        )
        self.latency = Histogram(
            "nodefabric_extender_request_seconds",
            "Time to answer one extender request, by verb.",
            ["verb"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.bad_requests = Counter(
            "nodefabric_extender_bad_requests", "Requests answered 400.", ["verb"], registry=registry
        )


def _selector(pod: Mapping[str, Any]) -> dict[str, str]:
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    return {str(k): str(v) for k, v in selector.items()} if isinstance(selector, dict) else {}


class _Views(Sequence[placement.NodeView]):
    """The feasible nodes' views, looked up only if the decision walks them one by one (the cache's
    index answers the common paths without)."""

    def __init__(self, views: Mapping[str, placement.NodeView], names: Sequence[str]) -> None:
        self._views, self._names = views, names
        self._list: list[placement.NodeView] | None = None

    def _all(self) -> list[placement.NodeView]:
        if self._list is None:
            self._list = list(map(self._views.__getitem__, self._names))
        return self._list

    def __len__(self) -> int:
        return len(self._names)

    @overload
    def __getitem__(self, i: int) -> placement.NodeView: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[placement.NodeView]: ...
    def __getitem__(self, i: int | slice) -> placement.NodeView | Sequence[placement.NodeView]:
        return self._all()[i]

    def __iter__(self) -> Iterator[placement.NodeView]:
        return iter(self._all())


class Extender:
    def __init__(
        self,
        config: ExtenderConfig,
        cache: Cache,
        *,
        events: EventSink | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.cache = cache
        self.book = Book(config.claim_ttl_seconds)
        self.events = events
        self.metrics = Metrics(registry or CollectorRegistry())
        self.clock = clock
        self._swept = clock()

    # --- resolving the group ---------------------------------------------------------------------

    def _size(self, spec: GroupSpec, pod: Mapping[str, Any], bound: int, claims: int) -> tuple[int, str]:
        if spec.size is not None:
            return spec.size, "pod"
        ns = pod_namespace(pod)
        ref: tuple[str, str, str] | None = None
        if spec.family == "scheduler-plugins":
            ref = (POD_GROUP_APIS[0], ns, spec.name)
        elif spec.family == "volcano":
            ann = (pod.get("metadata") or {}).get("annotations") or {}
            ref = (POD_GROUP_APIS[1], ns, str(ann.get(VOLCANO_GROUP_ANNOTATION) or spec.name))
        if ref is not None and ref in self.cache.pod_group_sizes:
            return self.cache.pod_group_sizes[ref], "PodGroup minMember"
        # No declared size: the group's pods the cache knows (a job controller creates them together).
        return max(self.cache.group_pod_count(spec.key), bound + claims + 1), "pods seen"

    def _request(self, spec: GroupSpec, pod: Mapping[str, Any], now: float) -> placement.GroupRequest:
        uid = pod_uid(pod)
        bound = self.cache.bound_members(spec.key, uid)
        rec = self.book.get(spec.key)
        claims = rec.live_claims(now, uid, {p.uid for p in bound})
        size, source = self._size(spec, pod, len(bound), claims)
        request, _ = pod_requests(pod)
        rec.size, rec.size_source, rec.locality, rec.rank = size, source, spec.locality, spec.rank
        group = placement.GroupRequest(
            key=spec.key,
            size=size,
            remaining=max(1, size - len(bound) - claims),
            locality=spec.locality,
            rank=spec.rank,
            homogeneous_keys=spec.homogeneous_keys,
            request=request,
            choice=rec.choice,
            members=tuple(sorted({p.node for p in bound})),
            node_selector=tuple(sorted(_selector(pod).items())),
        )
        return group

    def _decide(
        self, args: ExtenderArgs
    ) -> tuple[placement.Decision, placement.GroupRequest | None, list[str]]:
        if args.nodes is not None:
            for node in args.nodes:
                self.cache.upsert_node(node)
        spec = group_of(args.pod, self.config)
        views = self.cache.views
        if spec is None:
            return placement.decide(None, [], views, self.config), None, []
        now = self.clock()
        group = self._request(spec, args.pod, now)
        names = args.node_names
        known = self.cache.names.intersection(names)
        missing = [n for n in names if n not in known] if len(known) != len(names) else []
        feasible = _Views(views, names if not missing else [n for n in names if n in known])
        ranked = None
        if group.choice is None and not group.members:
            # Choosing a bucket walks nodes in rank order until one fills: read the cache's standing
            # order lazily instead of sorting every feasible node.
            ranked = (v for v in self.cache.ranked(group.rank) if v.name in known)
        decision = placement.decide(
            group,
            feasible,
            views,
            self.config,
            ranked=ranked,
            present=self.cache.present,
            index=self.cache.index,
            names=known,
        )
        return decision, group, missing

    # --- verbs -----------------------------------------------------------------------------------

    def filter(self, args: ExtenderArgs) -> FilterResult:
        now = self.clock()
        if now - self._swept > SWEEP_EVERY_S:
            self._swept = now
            self.book.sweep(now, set(self.cache.members))
        try:
            decision, spec, missing = self._decide(args)
        except InvalidPlacement as exc:
            reason = str(exc)
            self.metrics.decisions.labels("invalid", "none").inc()
            invalid = None
            if exc.group is not None:
                # Recorded like a decision: /debug/groups shows it, and a retried pod is told once.
                invalid = self.book.get(exc.group)
                invalid.outcome, invalid.level, invalid.summary = "invalid", "none", reason
                invalid.updated = now
            self._tell(invalid, args.pod, "Warning", "InvalidPlacement", reason)
            return filter_result(args, [], {}, {reason: args.node_names})
        if spec is None:
            self.metrics.decisions.labels("pass-through", "none").inc()
            return filter_result(args, args.node_names, {}, {})
        rec = self.book.get(spec.key)
        repeated = (rec.outcome, rec.summary) == (decision.outcome, decision.summary)
        rec.outcome, rec.level, rec.summary, rec.updated = (
            decision.outcome,
            decision.level,
            decision.summary,
            now,
        )
        if decision.outcome == "placed":
            changed = decision.choice != rec.choice
            rec.choice = decision.choice
            self.book.claim(spec.key, pod_uid(args.pod), now)
            if changed:
                log.info("group placed", extra={"group": spec.key, "summary": decision.summary})
            self._tell(rec, args.pod, "Normal", "GroupPlaced", decision.summary)
        elif decision.outcome == "wait":
            self._tell(rec, args.pod, "Normal", "GroupWaiting", decision.summary)
        else:
            if not repeated:  # kube-scheduler retries every pod of the group: one line per verdict
                log.warning("group never fits", extra={"group": spec.key, "summary": decision.summary})
            self._tell(rec, args.pod, "Warning", "GroupNeverFits", decision.summary)
        self.metrics.decisions.labels(decision.outcome, decision.level).inc()
        missing_by = {NOT_CACHED: missing} if missing else {}
        if decision.unresolvable:
            return filter_result(args, decision.allowed, missing_by, decision.rejected)
        if decision.allowed and not self.config.reasons_when_placed:
            return filter_result(args, decision.allowed, missing_by, {})
        return filter_result(args, decision.allowed, {**decision.rejected, **missing_by}, {})

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        try:
            decision, group, _ = self._decide(args)
        except InvalidPlacement:
            return host_priorities(args.node_names, {})
        rank = group.rank if group else ""
        return host_priorities(args.node_names, placement.priorities(decision, self.cache.views, rank))

    # --- explanations ----------------------------------------------------------------------------

    def _tell(
        self, rec: GroupRecord | None, pod: Mapping[str, Any], type_: str, reason: str, message: str
    ) -> None:
        if self.events is None:
            return
        uid = pod_uid(pod)
        if rec is not None:
            if rec.told.get(uid) == message:
                return  # kube-scheduler retries a waiting pod often; one event per new message
            rec.told[uid] = message
        try:
            self.events.emit(pod, type_, reason, message)
        except Exception:
            log.exception("could not record a pod event", extra={"pod": uid})

    def groups(self) -> list[dict[str, Any]]:
        now = self.clock()
        return [self.book.groups[k].view(now) for k in sorted(self.book.groups)]

    def summary(self, group_key: str) -> str | None:
        rec = self.book.groups.get(group_key)
        return rec.summary if rec else None
