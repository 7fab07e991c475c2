"""Filter and prioritize: resolve the pod's group from the cache and the book, decide, record, explain.

A group with an admitted PlacementGroup (the placement process admitted it whole) is followed: each
member may go only to the node the PlacementGroup assigns it, and is told the PlacementGroup's decision.
Any other group follows the placement rule with the extender's own in-memory book (the bucket each
group was given and the pods let through); state changes only through filter's own verdicts, and
nothing a pod carries (annotations included) is read back as state. Each verdict is told once per pod
and message: a pod Event, and a copy in the pod's `decision` annotation for `kubectl describe pod`.
"""

from __future__ import annotations

import logging
import time
from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nodefabric_devicemanager import buildinfo
from nodefabric_operator.extender import decisions, placement
from nodefabric_operator.extender.book import Book, GroupRecord
from nodefabric_operator.extender.cache import (
    DEFAULT_SCHEDULER,
    POD_GROUP_APIS,
    VOLCANO_GROUP_ANNOTATION,
    Admission,
    Cache,
)
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.groups import GroupSpec, InvalidPlacement, group_of, pod_namespace, pod_uid
from nodefabric_operator.extender.index import Index
from nodefabric_operator.extender.nodes import is_node_name
from nodefabric_operator.extender.pods import PodNeeds, pod_needs
from nodefabric_operator.extender.wire import (
    ExtenderArgs,
    FilterResult,
    filter_result,
    host_priorities,
    named_twice,
    not_a_node_name,
)

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 10.0
NOT_CACHED = "node is not in the extender's node cache yet"
NOT_SYNCED = "the extender has not listed the cluster's nodes and pods yet"
EVENT_REASONS = {
    "placed": ("Normal", "GroupPlaced"),
    "wait": ("Normal", "GroupWaiting"),
    "never-fits": ("Warning", "GroupNeverFits"),
    "invalid": ("Warning", "InvalidPlacement"),
}


class Publisher(Protocol):
    """Where verdicts go besides the answer: pod Events and the pod's own annotations."""

    def event(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...

    def annotate(self, pod: Mapping[str, Any], annotations: Mapping[str, str | None]) -> None: ...


class Metrics:
    def __init__(self, registry: CollectorRegistry, book: Book) -> None:
        # A `_created` series per child doubles what Prometheus stores and says nothing useful here.
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry
        prometheus_client.ProcessCollector(registry=registry)
        prometheus_client.PlatformCollector(registry=registry)
        buildinfo.register("extender", registry)
        self.decisions = Counter(
            "nodefabric_extender_decisions",
            "Filter decisions by outcome (placed, wait, never-fits, pass-through, invalid) and level.",
            ["outcome", "level"],
            registry=registry,
        )
        self.latency = Histogram(
            "nodefabric_extender_request_duration_seconds",
            "Time to answer one extender request, by verb.",
            ["verb"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry,
        )
        self.bad_requests = Counter(
            "nodefabric_extender_bad_requests",
            "Requests refused (malformed, too large, too slow, past the bytes read at once), by verb.",
            ["verb"],
            registry=registry,
        )
        groups = Gauge(
            "nodefabric_extender_groups", "Groups the extender keeps a record of.", registry=registry
        )
        groups.set_function(lambda: len(book.groups))
        self.evicted = Counter(
            "nodefabric_extender_groups_evicted",
            "Group records dropped because the cap (maxGroups) was reached; rebuilt from pods on use.",
            registry=registry,
        )


class Extender:
    def __init__(
        self,
        config: ExtenderConfig,
        cache: Cache,
        *,
        publisher: Publisher | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.cache = cache
        self.book = Book(config.claim_ttl_seconds, config.max_groups)
        self.publisher = publisher
        self.metrics = Metrics(registry or CollectorRegistry(), self.book)
        self.book.on_evict = self.metrics.evicted.inc
        self.clock = clock
        self._swept = clock()
        self._decision_key = decisions.key(config)
        # (index names version, NodeNames as compared, the known ones as a set, the unknown ones) of the
        # last request
        self._last_names: tuple[int, str | tuple[str, ...], set[str], list[str]] | None = None

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
        # No declared size: the group's pods the cache knows (a job controller creates them together),
        # of this pod's scheduler only.
        count = self.cache.group_pod_count(spec.key, scheduler_of(pod))
        return max(count, bound + claims + 1), "pods seen"

    def _state(
        self, uid: str, rec: GroupRecord | None, now: float, bound: set[str]
    ) -> tuple[placement.Choice | None, dict[str, float]]:
        """The group's bucket and live claims (pod uid -> expiry), as this extender made them: a pod's
        annotations are anyone's to write, so none is read back."""
        choice = rec.choice if rec is not None else None
        claims = rec.claims if rec is not None else {}
        live = {u: e for u, e in claims.items() if e > now and u != uid and u not in bound}
        return choice, live

    @staticmethod
    def _live_claims(uid: str, rec: GroupRecord | None, now: float, bound: set[str]) -> int:
        """How many of `_state`'s live claims there are, without building them: a placed group's every
        pod holds one until it binds, and this runs on each of its pods' requests. The usual case, no
        claim expired, is counted by set operations."""
        if rec is None or not rec.claims:
            return 0
        claims = rec.claims
        if min(claims.values()) > now:
            others = claims.keys() & bound if bound else ()
            return len(claims) - (uid in claims) - len(others) + (uid in others)
        return sum(1 for u, e in claims.items() if e > now and u != uid and u not in bound)

    def _request(
        self,
        spec: GroupSpec,
        pod: Mapping[str, Any],
        needs: PodNeeds,
        now: float,
        rec: GroupRecord | None,
        *,
        record: bool,
    ) -> placement.GroupRequest:
        uid = pod_uid(pod)
        bound = self.cache.bound_members(spec.key, uid, scheduler_of(pod))
        claims = self._live_claims(uid, rec, now, {p.uid for p in bound})
        choice = rec.choice if rec is not None else None
        if not bound and not claims:
            # Nothing of the group holds room any more (its claims expired unbound, or its pods were
            # re-created after a restart of the job): this pod is its first again, and the group must
            # fit whole anew. Following the old bucket would let pods through one by one into a bucket
            # that may no longer hold them all.
            choice = None
        size, source = self._size(spec, pod, len(bound), claims)
        if rec is not None and record:  # prioritize reads the record, never writes it
            rec.size, rec.size_source, rec.locality, rec.rank = size, source, spec.locality, spec.rank
        keys = spec.homogeneous_keys
        return placement.GroupRequest(
            key=spec.key,
            size=size,
            remaining=max(1, size - len(bound) - claims),
            locality=spec.locality,
            rank=spec.rank,
            homogeneous_keys=keys if keys is not None else self.config.homogeneity_for(needs.extended),
            default_keys=keys is None,
            needs=needs,
            choice=choice,
            members=tuple(sorted({p.node for p in bound})),
        )

    def _asked(self, args: ExtenderArgs) -> tuple[set[str], list[str]]:
        """The request's NodeNames the cache knows, and the ones it does not. Raises WireError (a 400)
        for a name the API server would refuse for a Node: the known ones were checked when their Node
        was read, so only the unknown ones are, once per distinct NodeNames."""
        index, asked = self.cache.index, args.node_names
        last = self._last_names
        # kube-scheduler sends the same NodeNames request after request while nothing changes:
        # comparing the names joined in one string (parse_args joined them to check them) is far
        # cheaper than hashing 5,000 fresh strings again, or comparing them one by one.
        same: str | tuple[str, ...] = args.names_key or asked
        if last is not None and last[0] == index.names_version and last[1] == same:
            return last[2], last[3]
        known = index.names.intersection(asked)
        missing = [] if len(known) == len(asked) else [n for n in asked if n not in index.names]
        for name in missing:
            if not is_node_name(name):
                raise not_a_node_name(asked.index(name), name)
        if len(known) != len(asked) and len(known) + len(set(missing)) != len(asked):
            raise named_twice(asked)  # fewer distinct names than entries
        self._last_names = (index.names_version, same, known, missing)
        return known, missing

    def _snapshot(self, args: ExtenderArgs) -> tuple[placement.Snapshot, set[str], list[str]]:
        """The nodes this request decides over, the feasible ones among them, and the unknown ones."""
        if args.records is None:
            known, missing = self._asked(args)
            return self.cache, known, missing
        # kube-scheduler without nodeCacheCapable sends full Nodes: they count for this request only,
        # against the pods the cache knows; the cache itself never sees them.
        views = {r.name: self.cache.view_of(r) for r in args.records}
        index = Index.of(views.values(), len(self.config.levels), self.config.indexed_homogeneity)
        cluster = ChainMap(views, self.cache.index.views)
        return placement.Snapshot(index, cluster), set(views), []

    def _decide(
        self, args: ExtenderArgs, spec: GroupSpec | None, *, record: bool
    ) -> tuple[placement.Decision, placement.GroupRequest | None, list[str]]:
        snap, feasible, missing = self._snapshot(args)
        if spec is None:
            return placement.decide(None, feasible, snap, self.config), None, missing
        admission = self.cache.admissions.get(spec.key)
        if admission is not None and admission.admitted:
            return self._follow_admission(admission, args, feasible), None, missing
        needs = pod_needs(args.pod)
        now = self.clock()
        rec = self.book.get(spec.key) if record else self.book.peek(spec.key)
        group = self._request(spec, args.pod, needs, now, rec, record=record)
        decision = placement.decide(group, feasible, snap, self.config, complete=not missing)
        return decision, group, missing

    def _follow_admission(
        self, admission: Admission, args: ExtenderArgs, feasible: set[str]
    ) -> placement.Decision:
        """A member of an admitted group goes only to the node its PlacementGroup assigns it."""
        node = admission.nodes.get(pod_uid(args.pod))
        key = admission.key
        text = admission.decision or f"group {key} admitted"
        if node is None:
            reason = f"group {key} was admitted without this pod: it waits for the group's next admission"
            return placement.Decision("wait", (), {reason: sorted(feasible)}, False, "none", reason)
        rejected = sorted(n for n in feasible if n != node)
        if node not in feasible:
            reason = f"group {key} is admitted to node {node}, which is not feasible for this pod now"
            return placement.Decision("wait", (), {reason: sorted(feasible)}, False, "none", reason)
        others = {f"group {key} is admitted to node {node}": rejected} if rejected else {}
        return placement.Decision("placed", (node,), others, False, "admitted", text)

    # --- verbs -----------------------------------------------------------------------------------

    def filter(self, args: ExtenderArgs) -> FilterResult:
        if args.records is None:
            self._asked(args)  # a bad name is a 400 before any verdict repeats it
        if not self.cache.synced:
            # Before the first full list of nodes and pods, a group's bound members and claims are not
            # known yet: a decision now could split a placed group or call a group "never fits" over an
            # empty cache. Its pods wait (nothing recorded, nothing told); other pods pass untouched.
            try:
                grouped = group_of(args.pod, self.config) is not None
            except InvalidPlacement:
                grouped = True
            if grouped:
                self.metrics.decisions.labels("wait", "none").inc()
                return filter_result(args, [], {NOT_SYNCED: args.node_names}, {})
        now = self.clock()
        if now - self._swept > SWEEP_EVERY_S:
            self._swept = now
            self.book.sweep(now, set(self.cache.members))
        try:
            spec = group_of(args.pod, self.config)
            decision, group, missing = self._decide(args, spec, record=True)
        except InvalidPlacement as exc:
            reason = str(exc)
            self.metrics.decisions.labels("invalid", "none").inc()
            invalid = None
            if exc.group is not None:
                # Recorded like a decision: /debug/groups shows it, and a retried pod is told once.
                invalid = self.book.get(exc.group)
                invalid.outcome, invalid.level, invalid.summary = "invalid", "none", reason
                invalid.updated = now
            self._tell(invalid, args.pod, "invalid", reason, now=now)
            return filter_result(args, [], {}, {reason: args.node_names})
        if group is None and decision.outcome == "pass-through":
            self.metrics.decisions.labels("pass-through", "none").inc()
            return filter_result(args, args.node_names, {}, {})
        assert spec is not None
        rec = self.book.get(spec.key)
        repeated = (rec.outcome, rec.summary) == (decision.outcome, decision.summary)
        rec.outcome, rec.level, rec.summary, rec.updated = (
            decision.outcome,
            decision.level,
            decision.summary,
            now,
        )
        uid = pod_uid(args.pod)
        if decision.outcome == "placed" and decision.choice is not None:
            if decision.choice != rec.choice:
                rec.choice, rec.chosen_at = decision.choice, now
            if decision.planned:
                log.info("group placed", extra={"group": spec.key, "summary": decision.summary})
            self.book.claim(spec.key, uid, now)
        elif decision.outcome != "placed":
            self.book.release(spec.key, uid)
            if decision.outcome == "never-fits" and not repeated:
                # kube-scheduler retries every pod of the group: one line per verdict.
                log.warning("group never fits", extra={"group": spec.key, "summary": decision.summary})
        self._tell(rec, args.pod, decision.outcome, decision.summary, now=now)
        self.metrics.decisions.labels(decision.outcome, decision.level).inc()
        missing_by = {NOT_CACHED: missing} if missing else {}
        if decision.unresolvable:
            return filter_result(args, decision.allowed, missing_by, decision.rejected)
        if decision.allowed and not self.config.reasons_when_placed:
            return filter_result(args, decision.allowed, missing_by, {})
        return filter_result(args, decision.allowed, {**decision.rejected, **missing_by}, {})

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        if args.records is None:
            self._asked(args)  # a bad name is a 400 before any score names it
        try:
            decision, group, _ = self._decide(args, group_of(args.pod, self.config), record=False)
        except InvalidPlacement:
            return host_priorities(args.node_names, {})
        rank = group.rank if group else ""
        views = (
            self.cache.index.views
            if args.records is None
            else {r.name: self.cache.view_of(r) for r in args.records}
        )
        return host_priorities(args.node_names, placement.priorities(decision, views, rank))

    # --- explanations ----------------------------------------------------------------------------

    def _tell(
        self,
        rec: GroupRecord | None,
        pod: Mapping[str, Any],
        outcome: str,
        summary: str,
        *,
        now: float,
    ) -> None:
        """One Event and one annotation write per pod and distinct verdict, not per retry. The
        annotation is only a copy for `kubectl describe pod`: it is never read back."""
        if self.publisher is None:
            return
        uid = pod_uid(pod)
        text = decisions.decision_text(outcome, summary)
        if rec is not None and not rec.tell(uid, text):
            return
        try:
            type_, reason = EVENT_REASONS[outcome]
            self.publisher.event(pod, type_, reason, summary)
            self.publisher.annotate(pod, {self._decision_key: text})
        except Exception:
            log.exception("could not record a verdict on the pod", extra={"pod": uid})

    def groups(self) -> list[dict[str, Any]]:
        now = self.clock()
        out = []
        for key in sorted(self.book.groups):
            rec = self.book.groups[key]
            _, claims = self._state("", rec, now, set())
            out.append(rec.view(now, claims))
        return out

    def summary(self, group_key: str) -> str | None:
        rec = self.book.groups.get(group_key)
        return rec.summary if rec else None


def scheduler_of(pod: Mapping[str, Any]) -> str:
    """The pod's spec.schedulerName (the API server's default when unset)."""
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else DEFAULT_SCHEDULER
