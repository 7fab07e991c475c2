"""Whether a pod is its owner's when the owner does not control it itself: a JobSet's pods are its Jobs', a
LeaderWorkerSet's are its StatefulSets'. A label is no proof (anyone who can create pods can copy it): the
chain of controller references from the pod up to the owner is read and checked by uid.

- JobSet: the pod's controller is a Job (batch/v1) whose own controller is the JobSet.
- LeaderWorkerSet (as the LWS controller builds it): a leader pod's controller is the leader StatefulSet,
  whose controller is the LeaderWorkerSet, and it is that StatefulSet's pod of the ordinal its group-index
  label names (the StatefulSet vouches for its pods, not their labels), of a group the LeaderWorkerSet has
  (an index below its spec.replicas: the LWS vouches for how many groups it has); a worker pod's controller
  is its group's worker StatefulSet, whose controller is the leader pod, itself checked as above, whose
  group-index label is the worker's (the pod's own label names its group: a worker labelled with another
  index is never a member, settled).

`membership` is the pure rule over what was read (a `Link` for each reference, and the pods the watch
keeps: a leader pod is never read one by one). `ChainReader` reads the links: one GET per distinct name,
kept for each reference as the pod names it (namespace, name and uid: a uid read in one namespace, or under
one name, vouches for no other), a bounded number of them. An object that could not be read (refused, no
answer, a body that is not one) leaves the pod out, "not a member yet" with the reason, and is read again
after SIZE_TTL_S, then less often. A refusal (HTTP 403) is taken as one for every object of that kind in
the namespace (RBAC grants by namespace and kind): one name is read first of a kind not read there yet, and
once one is refused, no other name of that kind there is read until one probe read, on the same backoff, is
not refused. A failure of the API server's own (any other HTTP status, no answer in time, no connection, a
body that is not one object) is taken as one for every read: once one read fails so, the reads of that hop
not sent yet are not sent, and no other name of any namespace or kind is read until one probe read, on the
same backoff, gets an answer (an object, not found, a refusal). The probe is never a name whose failure
started the outage or last prolonged it (one object can fail alone: as the probe of every step it would
hold every other read back for good); such a name is read again on its own backoff, where no other name may
be the probe, and failing again it prolongs nothing; once another name was answered, it fails alone, and
failing again it starts no outage. Either way its failure stops none of the other reads of its hop (they
would wait a backoff step for a failure not theirs). One not found is settled: a pod never counts for
it, and it is not read again (an object made under that name later has another uid).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodefabric_devicemanager.backoff import Backoff
from nodefabric_operator.admission.owners import CHAINED, Owner, controller_of, controls, labels
from nodefabric_operator.extender.groups import LWS_GROUP_INDEX

# Objects kept (beyond them, only those of the one group being read); the least recently used goes first,
# read again if needed.
MAX_LINKS = 4096
NOT_SENT = "not read: the API server failed another read"
RETRY_S = 5.0  # an object that could not be read is read again after this long (grouping.SIZE_TTL_S),
MAX_RETRY_S = 60.0  # then after twice as long each time it still cannot, up to this
READ_TIMEOUT = (5.0, 15.0)  # (connect, read) seconds, as owners are read


@dataclass(frozen=True)
class Ref:
    """An object a pod's chain names: read by name in the pod's namespace, held to the uid named."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Link:
    """One object of a chain as read: its own controller (kind, uid), None when it has none (or the name
    is another object's now: the uid named does not exist); or why it could not be read."""

    controller: tuple[str, str] | None = None
    problem: str = ""
    # Not found: the pod never counts and the object is not read again (compared as the problem is).
    settled: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Membership:
    member: bool
    reason: str = ""  # why a pod that may be a member is not counted yet; "" when settled either way
    # The reason is final (the object the pod names is not found): the pod is named in the decision
    # but never told (forged pods by the thousand would each get every decision that names them).
    settled: bool = field(default=False, compare=False)


NOT_A_MEMBER = Membership(False)
A_MEMBER = Membership(True)
Lookup = Callable[[Ref], Link | None]

_PLURALS = {"Job": ("batch", "v1", "jobs"), "StatefulSet": ("apps", "v1", "statefulsets")}


def _ref(obj: Mapping[str, Any], namespace: str, api_version: str, kind: str) -> Ref | None:
    """The object's controller reference when it is a `kind` of `api_version`, else None."""
    ref = controller_of(obj)
    if ref is None or ref.get("apiVersion") != api_version or ref.get("kind") != kind:
        return None
    name, uid = ref.get("name"), ref.get("uid")
    if not isinstance(name, str) or not name or not isinstance(uid, str) or not uid:
        return None
    return Ref(api_version, kind, namespace, name, uid)


def _shown(value: object) -> str:
    return "none" if value is None else repr(str(value)[:63])


def _namespace(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    return ns if isinstance(ns, str) else ""


def _up_to(owner: Owner, pod: Mapping[str, Any], kind: str, lookup: Lookup) -> Membership | Ref | Link:
    """One hop: the pod's StatefulSet (or Job) and its controller. The Link when it is controlled by
    something other than the owner (a worker's StatefulSet by its leader pod), for the caller to follow."""
    api_version = "batch/v1" if kind == "Job" else "apps/v1"
    ref = _ref(pod, _namespace(pod), api_version, kind)
    if ref is None:
        return NOT_A_MEMBER
    got = lookup(ref)
    if got is None:
        return ref  # still to be read
    if got.problem:
        return Membership(False, got.problem, got.settled)
    if got.controller == (owner.ref.kind, owner.uid):
        return A_MEMBER
    return got


def walk(
    owner: Owner, pod: Mapping[str, Any], lookup: Lookup, pods: Mapping[str, Mapping[str, Any]]
) -> Membership | Ref:
    """The pod's membership, or the next object to read before it can be told."""
    if owner.ref.kind == "JobSet":
        got = _up_to(owner, pod, "Job", lookup)
        return NOT_A_MEMBER if isinstance(got, Link) else got
    if owner.ref.kind != "LeaderWorkerSet":
        return Membership(controls(owner, pod))
    got = _up_to(owner, pod, "StatefulSet", lookup)
    if not isinstance(got, Link):
        return _leads(pod, owner) if got == A_MEMBER else got
    # A worker: its StatefulSet is its leader pod's, which must be this LeaderWorkerSet's leader.
    if got.controller is None or got.controller[0] != "Pod":
        return NOT_A_MEMBER
    leader = pods.get(got.controller[1])
    if leader is None or _namespace(leader) != _namespace(pod):
        return Membership(False, "its leader pod (the controller of its StatefulSet) is not known")
    # The group is named by the pod's own index label: a worker labelled with another replica's index
    # would count in that replica's group. Settled: the labels the LWS controller set never change.
    mine, leaders = labels(pod).get(LWS_GROUP_INDEX), labels(leader).get(LWS_GROUP_INDEX)
    if mine != leaders:
        why = f"its {LWS_GROUP_INDEX} label ({_shown(mine)}) is not its leader pod's ({_shown(leaders)})"
        return Membership(False, why, settled=True)
    up = _up_to(owner, leader, "StatefulSet", lookup)
    if up == A_MEMBER and not (leads := _leads(leader, owner)).member:
        return Membership(False, f"its leader pod: {leads.reason}", settled=True)
    return NOT_A_MEMBER if isinstance(up, Link) else up


def _leads(pod: Mapping[str, Any], owner: Owner) -> Membership:
    """A pod of the leader StatefulSet: the leader of the group its index label names only as that
    StatefulSet's pod of that ordinal (another pod naming the StatefulSet, labelled with a group, would
    count in it: the StatefulSet vouches for its pods, not for their labels), and only of a group the
    LeaderWorkerSet has (its spec.replicas: a pod `<sts>-1` of an LWS of one replica, or of one scaled
    down whose higher groups are being deleted, is no group of it). Settled: the pod's name and labels
    never change; an LWS scaled up counts its new groups once it is read again (SIZE_TTL_S)."""
    sts = _ref(pod, _namespace(pod), "apps/v1", "StatefulSet")
    meta = pod.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    index = labels(pod).get(LWS_GROUP_INDEX)
    # The ordinal as a StatefulSet writes it: "00" or "+1" would name a group the LWS never has.
    ordinal = (
        isinstance(index, str) and index.isascii() and index.isdigit() and (index == "0" or index[0] != "0")
    )
    if sts is None or not ordinal or name != f"{sts.name}-{index}":
        why = (
            f"its {LWS_GROUP_INDEX} label ({_shown(index)}) is not its ordinal in StatefulSet "
            f"{sts and sts.name}"
        )
        return Membership(False, why, settled=True)
    if owner.groups is not None and not _below(str(index), owner.groups):
        why = (
            f"its {LWS_GROUP_INDEX} label ({_shown(index)}) names no group of {owner.ref.kind} "
            f"{owner.ref.namespace}/{owner.ref.name} (spec.replicas is {owner.groups})"
        )
        return Membership(False, why, settled=True)
    return A_MEMBER


def _below(ordinal: str, count: int) -> bool:
    """Whether the ordinal (digits, no leading zero) is less than `count`, compared as digits: int() of
    a label thousands of digits long is refused (sys.get_int_max_str_digits)."""
    limit = str(count)
    return (len(ordinal), ordinal) < (len(limit), limit)


def membership(
    owner: Owner | None, pod: Mapping[str, Any], lookup: Lookup, pods: Mapping[str, Mapping[str, Any]]
) -> Membership:
    """Whether the pod may count as a member of the group `owner` states the size of. No owner read (or
    one without a uid): nothing to hold the pods to, as `controls` says."""
    if owner is None or not owner.uid or owner.ref.kind not in CHAINED:
        return Membership(controls(owner, pod))
    got = walk(owner, pod, lookup, pods)
    if isinstance(got, Ref):
        return Membership(False, f"{got} has not been read yet")
    return got


def link_of(ref: Ref, obj: object) -> Link:
    """What the API answered for `ref`, as a Link. The uid must be the one named: the same name may be
    another object's now, and then the pod's is gone."""
    if not isinstance(obj, Mapping):
        return Link(problem=f"{ref} could not be read (the answer is not an object)")
    meta = obj.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if not isinstance(uid, str) or not uid:
        return Link(problem=f"{ref} could not be read (it has no uid)")
    if uid != ref.uid:
        return Link()
    ctl = controller_of(obj)
    kind, cuid = (ctl.get("kind"), ctl.get("uid")) if ctl is not None else (None, None)
    if isinstance(kind, str) and isinstance(cuid, str) and kind and cuid:
        return Link((kind, cuid))
    return Link()


@dataclass(frozen=True)
class Failed:
    """A read that got no object: why, and whether it is settled (not found: the uid named is gone)."""

    problem: str
    settled: bool = False
    status: int = 0  # the HTTP status, when the API answered one


@dataclass(frozen=True)
class Kept:
    link: Link
    due: float | None = None  # when a failed read is read again; None: never
    failures: int = 0
    outage: bool = False  # said to wait on an outage: once it is over, that is no reason any more


def outage_cause(ref: Ref, answer: object) -> str:
    """Why the read failed when the API server is at fault (5xx, 429, no answer, a body that is not one
    object): every read would fail alike, whatever the name. "" for an answer (found, not found, 403)."""
    if isinstance(answer, Failed):
        problem = "" if answer.settled or answer.status == 403 else answer.problem
    else:
        problem = link_of(ref, answer).problem
    return problem.removeprefix(f"{ref} could not be read (").removesuffix(")")


class ChainReader:
    """The objects of pods' chains, read through the API as owners are, kept by the reference named."""

    def __init__(
        self,
        api: client.ApiClient,
        clock: Callable[[], float] = time.time,
        *,
        limit: int = MAX_LINKS,
        retry_s: float = RETRY_S,
        timeout: tuple[float, float] = READ_TIMEOUT,
    ) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.timeout = timeout
        self.clock = clock
        self.limit = limit
        self.backoff = Backoff(base=retry_s, cap=max(MAX_RETRY_S, retry_s), jitter=False)
        self.links: OrderedDict[Ref, Kept] = OrderedDict()
        # (namespace, kind) -> its last refusal and when one name of it is read again (the probe).
        self.refused: dict[tuple[str, str], Kept] = {}
        # (namespace, kind) read with any answer but a 403: its names are read without a probe first.
        self.allowed: set[tuple[str, str]] = set()
        # The API server failing: its last failure and when one name (the probe) is read again.
        self.outage: Kept | None = None
        # The names whose failure started or last prolonged it: never its probe.
        self.suspects: set[tuple[str, str, str]] = set()
        # Names that failed while another was answered: a failure of their own, read on their own backoff.
        self.lone: set[tuple[str, str, str]] = set()
        # When each of those (and the suspects) was last sent: the least recently sent go first in a hop.
        self.tried: dict[tuple[str, str, str], float] = {}

    def lookup(self, ref: Ref) -> Link | None:
        kept = self.links.get(ref)
        if kept is None:
            return None
        self.links.move_to_end(ref)
        return kept.link

    def _fresh(self, ref: Ref) -> Link | None:
        """The link, unless it is a failed read due again."""
        kept = self.links.get(ref)
        if kept is None or (kept.due is not None and self.clock() >= kept.due):
            return None
        self.links.move_to_end(ref)
        return kept.link

    async def resolve(
        self, owner: Owner, pods: Iterable[Mapping[str, Any]], known: Mapping[str, Mapping[str, Any]]
    ) -> None:
        """Read what the pods' chains still need: each name once, all of one hop at once (but the probe of
        a kind not yet read, or refused, in a namespace: `_hold_refused`). A worker's chain is two hops
        (its StatefulSet, then its leader's). Past the bound, the objects least recently
        used go (`_trim`), never one these pods' chains use: `membership` finds all of them right after."""
        pods = list(pods)
        used: set[Ref] = set()

        def lookup(ref: Ref) -> Link | None:
            used.add(ref)
            return self._fresh(ref)

        # Four hops: while the API fails, one probe first; a kind not read yet in a namespace is probed by
        # one name first, the rest read in the next hop unless it was refused.
        for _hop in range(4):
            # However many pods (or uids) name one object, it is one GET: forged pods by the thousand
            # naming objects that do not exist cost one read per name, once.
            wanted: dict[tuple[str, str, str], dict[Ref, None]] = {}
            for pod in pods:
                got = walk(owner, pod, lookup, known)
                if isinstance(got, Ref):
                    wanted.setdefault(_named(got), {})[got] = None
            wanted = self._hold_refused(self._hold_outage(wanted, self.clock()), self.clock())
            if not wanted:
                break
            alone = self.lone | self.suspects
            wanted = dict(sorted(wanted.items(), key=lambda item: self.tried.get(item[0], -1.0)))
            answers = await _send(self.read, wanted, alone)
            now = self.clock()
            read = [(next(iter(refs)), a) for refs, a in zip(wanted.values(), answers, strict=True)]
            causes = [outage_cause(ref, answer) for ref, answer in read]  # "" for an answer
            for named, cause in zip(wanted, causes, strict=True):
                if named in alone and cause != NOT_SENT:
                    self.tried[named] = now
            # What each name read holds now, for the other references kept under it.
            told: dict[tuple[str, str, str], object] = {}
            for (named, refs), answer in zip(wanted.items(), answers, strict=True):
                for ref in refs:
                    self._keep(ref, answer, now)
                if not isinstance(answer, Failed) or answer.settled:
                    told[named] = answer
            self._renamed(told, wanted, now)
            self._note_refusals(read, causes, now)
            self._note_outage(read, causes, now)
            self._say_outage(wanted, causes)
        self._trim(used, known)

    def _hold_outage(
        self, wanted: dict[tuple[str, str, str], dict[Ref, None]], now: float
    ) -> dict[tuple[str, str, str], dict[Ref, None]]:
        """While the API server fails, one name of `wanted` (the probe: of a kind not refused there) once
        the backoff is over, none before; the others keep the failure until then (2,000 names were 2,000
        GETs per step)."""
        outage = self.outage
        if outage is None or not wanted:
            return wanted
        fresh = [n for n in wanted if n not in self.suspects and self._may_probe(n[:2], now)]
        due = outage.due is not None and now >= outage.due
        # The probe is a name that has not failed yet: one object can fail alone (a 500 of its own), and
        # as the probe of every step, reconciled first, it held every other group back for good. Names
        # that failed are read again on their own backoff when no other name may probe for them.
        sent = set(fresh[:1] if due else []) if fresh else {n for n in wanted if n in self.suspects}
        for named, refs in wanted.items():
            if named in sent:
                continue
            # A kind refused there stays said to be: the refusal is the account's, it outlasts the outage.
            refusal = self.refused.get(named[:2])
            for ref in refs:
                if refusal is not None:
                    self._hold(ref, refusal)
                else:
                    self._hold(ref, outage, keep=False)
        return {named: wanted[named] for named in sent}

    def _hold(self, ref: Ref, why: Kept, *, keep: bool = True) -> None:
        """The reference not read until `why` is due again, said to be for its reason (or, with `keep`,
        for the reason it could not be read last, if it could not)."""
        kept = self.links.get(ref)
        link = Link(problem=f"{ref} could not be read ({why.link.problem})")
        if keep and kept is not None and kept.link.problem and not kept.outage:
            link = kept.link
        failures = kept.failures if kept is not None else 0
        self.links[ref] = Kept(link, why.due, failures, outage=why is self.outage)

    def _may_probe(self, scope: tuple[str, str], now: float) -> bool:
        refusal = self.refused.get(scope)
        return refusal is None or (refusal.due is not None and now >= refusal.due)

    def _note_outage(self, answers: list[tuple[Ref, object]], causes: list[str], now: float) -> None:
        """Any answer the API server gave ends an outage; a failure of its own, with none, starts or
        prolongs one. `causes`: each answer's `outage_cause`."""
        if not causes:
            return
        failed = {
            _named(ref)
            for (ref, _), cause in zip(answers, causes, strict=True)
            if cause and cause != NOT_SENT
        }
        if not all(causes):
            # Another name answered: those that failed fail alone, and failing again start no outage.
            answered = {_named(ref) for (ref, _), cause in zip(answers, causes, strict=True) if not cause}
            self.lone = (self.lone | self.suspects | failed) - answered
            self.outage, self.suspects = None, set()
            return
        if failed <= (self.suspects if self.outage is not None else self.lone):
            return  # only names known to fail failed again: says nothing of the others
        self.suspects = (failed - self.suspects) or failed
        failures = (self.outage.failures if self.outage is not None else 0) + 1
        cause = next((c for c in causes if c != NOT_SENT), causes[0])
        text = f"{cause}: every read waits on one probe while the API server fails"
        self.outage = Kept(Link(problem=text), now + self._wait(failures), failures)

    def _say_outage(self, wanted: dict[tuple[str, str, str], dict[Ref, None]], causes: list[str]) -> None:
        """The names that failed so during an outage said to wait on it, as the others held are: the probe
        moves from name to name, and each pod's reason changing with it would tell every pod again at each
        step."""
        if self.outage is None:
            return
        for cause, refs in zip(causes, wanted.values(), strict=True):
            if cause:
                for each in refs:
                    kept = self.links[each]
                    said = Link(problem=f"{each} could not be read ({self.outage.link.problem})")
                    self.links[each] = Kept(said, kept.due, kept.failures, outage=True)

    def _hold_refused(
        self, wanted: dict[tuple[str, str, str], dict[Ref, None]], now: float
    ) -> dict[tuple[str, str, str], dict[Ref, None]]:
        """What to read of `wanted`: of a kind refused in a namespace, one name (the probe) once its
        backoff is over, none before; the others keep the refusal until then (2,000 names refused were
        2,000 GETs per step)."""
        read: dict[tuple[str, str, str], dict[Ref, None]] = {}
        probing: set[tuple[str, str]] = set()
        for named, refs in wanted.items():
            scope = named[:2]
            refusal = self.refused.get(scope)
            if refusal is None and scope in self.allowed:
                read[named] = refs
                continue
            if scope not in probing and self._may_probe(scope, now):
                probing.add(scope)
                read[named] = refs
                continue
            if refusal is None:
                continue  # read in the next hop, once the probe says it may be
            for ref in refs:
                self._hold(ref, refusal)
        return read

    def _note_refusals(self, answers: list[tuple[Ref, object]], causes: list[str], now: float) -> None:
        """A 403 refuses the namespace's kind; any other answer there (one found, not found, any failure
        but the API server's own: `causes`) says reads of it are allowed again, name by name."""
        refused: set[tuple[str, str]] = set()
        allowed: set[tuple[str, str]] = set()
        for (ref, answer), cause in zip(answers, causes, strict=True):
            if cause:
                continue  # the API server's failure says nothing of what the account may read
            if isinstance(answer, Failed) and answer.status == 403:
                refused.add((ref.namespace, ref.kind))
            else:
                allowed.add((ref.namespace, ref.kind))
        for scope in allowed:
            self.refused.pop(scope, None)
        self.allowed |= allowed
        self.allowed -= refused - allowed
        for scope in refused - allowed:
            before = self.refused.get(scope)
            failures = (before.failures if before is not None else 0) + 1
            text = f"HTTP 403: every {scope[1]} of namespace {scope[0]} is refused"
            self.refused[scope] = Kept(Link(problem=text), now + self._wait(failures), failures)

    def _trim(self, used: set[Ref], known: Mapping[str, Mapping[str, Any]]) -> None:
        """Past the bound, the least recently used go: never one these pods' chains use, nor one a pod
        still there names (read again on its group's every pass, forged pods beyond the bound would cost
        a GET each every SIZE_TTL_S). What stays past the bound is bounded by the pods the watch keeps."""
        if self.lone or self.tried:
            kept = {_named(ref) for ref in self.links}
            self.lone &= kept
            self.tried = {
                n: at for n, at in self.tried.items() if n in kept and n in self.lone | self.suspects
            }
        excess = len(self.links) - self.limit
        if excess <= 0:
            return
        named = {ref for pod in known.values() for ref in _named_by(pod)}
        for ref in [r for r in self.links if r not in used and r not in named][:excess]:
            del self.links[ref]

    def _keep(self, ref: Ref, answer: object, now: float) -> None:
        if isinstance(answer, Failed):
            link = Link(problem=answer.problem, settled=answer.settled)
            if answer.settled:
                self.links[ref] = Kept(link)
                self.links.move_to_end(ref)
                return
        else:
            link = link_of(ref, answer)
            if not link.problem:
                self.links[ref] = Kept(link)
                self.links.move_to_end(ref)
                return
        before = self.links.get(ref)
        failures = (before.failures if before is not None else 0) + 1
        self.links[ref] = Kept(link, now + self._wait(failures), failures)
        self.links.move_to_end(ref)

    def _wait(self, failures: int) -> float:
        return self.backoff.ceiling(failures - 1)

    def _renamed(
        self,
        told: dict[tuple[str, str, str], object],
        wanted: dict[tuple[str, str, str], dict[Ref, None]],
        now: float,
    ) -> None:
        """What a name holds now, told to the other references kept under it: a Job deleted and made again
        under its name has a new uid, and the pods naming the old one are no longer its."""
        others = [r for r in self.links if _named(r) in told and r not in wanted[_named(r)]]
        for ref in others:
            self._keep(ref, told[_named(ref)], now)

    def read(self, ref: Ref, failing: threading.Event | None = None) -> object:
        """The object the API holds under the reference's name, or Failed. None read once `failing` is set
        (another read found the API server failing); set when this one does."""
        if failing is not None and failing.is_set():
            return Failed(f"{ref} could not be read ({NOT_SENT})")
        answer = self._get(ref)
        if failing is not None and outage_cause(ref, answer):
            failing.set()
        return answer

    def _get(self, ref: Ref) -> object:
        group, version, plural = _PLURALS[ref.kind]
        try:
            obj: Any = self.custom.get_namespaced_custom_object(
                group, version, ref.namespace, plural, ref.name, _request_timeout=self.timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return Failed(f"{ref} not found", settled=True)
            if exc.status:
                return Failed(f"{ref} could not be read (HTTP {exc.status})", status=exc.status)
            # The client's own refusal of a body it cannot read (status 0): its reason says which.
            return Failed(f"{ref} could not be read ({str(exc.reason)[:200]})")
        except Exception as exc:
            return Failed(f"{ref} could not be read ({type(exc).__name__})")
        return obj


async def _send(
    read: Callable[[Ref, threading.Event | None], object],
    wanted: Mapping[tuple[str, str, str], Mapping[Ref, None]],
    alone: set[tuple[str, str, str]],
) -> list[object]:
    """One read per name, all at once. Once one read finds the API failing, the others not sent yet are
    not sent. Not so across names known to fail alone (`alone`) and the others: a failure of one says
    nothing of the others (each read a backoff step later), and it is due on its own backoff, not held by
    theirs. Among themselves they still stop those not sent yet: the API server failing every read, all
    2,000 would be sent at each step (failing, they start no outage). The caller puts those sent least
    recently first, so that a few failing for good never leave the others out."""
    failing, failing_alone = threading.Event(), threading.Event()
    return await asyncio.gather(
        *(
            asyncio.to_thread(read, next(iter(refs)), failing_alone if named in alone else failing)
            for named, refs in wanted.items()
        )
    )


def _named_by(pod: Mapping[str, Any]) -> list[Ref]:
    """The object the pod names as its controller, when it is one a chain reads."""
    ns = _namespace(pod)
    refs = (_ref(pod, ns, "batch/v1", "Job"), _ref(pod, ns, "apps/v1", "StatefulSet"))
    return [r for r in refs if r is not None]


def _named(ref: Ref) -> tuple[str, str, str]:
    return ref.namespace, ref.kind, ref.name
