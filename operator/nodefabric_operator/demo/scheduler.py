"""A kube-scheduler stand-in, a kubelet's Ready, and a foreign scheduler: the world group admission is
tested in (and the demo's pods are bound in).

`StandInScheduler` does what kube-scheduler does for our purposes: it takes the pods of its scheduler
names that have no node and no scheduling gate, oldest first, keeps the nodes that pass kube-scheduler's
filters (NodeUnschedulable, NodeAffinity: node selector and required node affinity with matchExpressions
and matchFields, TaintToleration with every NoSchedule/NoExecute taint, NodeResourcesFit: cpu, memory,
extended resources and the pod count against allocatable minus the requests of the node's bound,
non-terminal pods), binds the pod to the best of them through `pods/binding`, and says why when none
fits (PodScheduled=False, reason Unschedulable, kube-scheduler's "0/N nodes are available" message).
As a kubelet would, it then marks each bound pod on an existing node Ready and Running.

`ForeignScheduler` is another scheduler (its own schedulerName): a test creates its pods and binds them
to the nodes it chooses, at the moment it chooses, to take capacity from under a group.

Both speak to the API over HTTP through a kubeconfig, as the real ones do; the node rules are the
extender's own readers (`extender.pods`), so the affinity and taint logic exists once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from nodefabric_devicemanager import nodeclient
from nodefabric_operator.extender.nodes import NodeError, NodeRecord, Taint, parse_node
from nodefabric_operator.extender.pods import BLOCKING_EFFECTS, PodError, PodNeeds, Toleration, pod_needs

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER = "default-scheduler"
TERMINAL = frozenset({"Succeeded", "Failed"})
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


class KubeError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, dict) else str(body)
        super().__init__(f"{status}: {message}")
        self.status = status
        self.body = body


class Kube:
    """The few requests a scheduler makes, over aiohttp, with a kubeconfig's server, token and TLS."""

    def __init__(self, kubeconfig: str, *, user_agent: str = "nodefabric-stand-in") -> None:
        creds = nodeclient.from_kubeconfig([kubeconfig])
        self.server = creds.server.rstrip("/")
        self._headers = {"Accept": "application/json", "User-Agent": user_agent}
        if creds.token:
            self._headers["Authorization"] = f"Bearer {creds.token}"
        self._ssl: Any = creds.ssl_context if creds.ssl_context is not None else True
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._http().request(
            method, self.server + path, data=data, params=params, headers=headers, ssl=self._ssl
        ) as resp:
            text = await resp.text()
            try:
                parsed = json.loads(text) if text else {}
            except ValueError:
                parsed = text
            if resp.status >= 400:
                raise KubeError(resp.status, parsed)
            return parsed if isinstance(parsed, dict) else {}

    async def items(self, path: str, params: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Every item of a list, page by page."""
        out: list[dict[str, Any]] = []
        query = {**(params or {}), "limit": "500"}
        while True:
            page = await self.call("GET", path, params=query)
            out.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return out
            query["continue"] = token

    async def watch(self, path: str) -> AsyncIterator[dict[str, Any]]:
        """Watch events from now until the server ends the stream."""
        params = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": "300"}
        async with self._http().get(
            self.server + path, params=params, ssl=self._ssl, timeout=aiohttp.ClientTimeout(total=None)
        ) as resp:
            if resp.status >= 400:
                raise KubeError(resp.status, await resp.text())
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)


# --- the decision (pure) -----------------------------------------------------------------------------


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    s = obj.get("spec")
    return s if isinstance(s, dict) else {}


def _phase(pod: Mapping[str, Any]) -> str:
    status = pod.get("status")
    return str(status.get("phase") or "") if isinstance(status, dict) else ""


def pod_ref(pod: Mapping[str, Any]) -> str:
    return f"{_meta(pod).get('namespace', '')}/{_meta(pod).get('name', '')}"


def is_pending(pod: Mapping[str, Any], schedulers: Iterable[str]) -> bool:
    """A pod this scheduler would try to place: its scheduler, no node, no gate, not terminal, not going."""
    spec = _spec(pod)
    return (
        (spec.get("schedulerName") or DEFAULT_SCHEDULER) in set(schedulers)
        and not spec.get("nodeName")
        and not spec.get("schedulingGates")
        and _phase(pod) not in TERMINAL
        and not _meta(pod).get("deletionTimestamp")
    )


@dataclass
class Room:
    """What a node has left: allocatable minus the requests of its bound, non-terminal pods."""

    node: NodeRecord
    unschedulable: bool
    cpu: int = 0
    memory: int = 0
    pods: int = 0
    extended: dict[str, int] = field(default_factory=dict)

    def take(self, needs: PodNeeds) -> None:
        self.cpu += needs.cpu
        self.memory += needs.memory
        self.pods += 1
        for res, qty in needs.extended.items():
            self.extended[res] = self.extended.get(res, 0) + qty


def _tolerated(tolerations: Sequence[Toleration], key: str, value: str, effect: str) -> bool:
    taint = Taint(key, value, effect)
    return any(t.tolerates(taint) for t in tolerations)


def why_not(needs: PodNeeds, room: Room) -> str | None:
    """Why kube-scheduler's filters refuse this node for the pod (its reason text), or None: it fits."""
    node = room.node
    if room.unschedulable and not _tolerated(needs.tolerations, UNSCHEDULABLE_TAINT, "", "NoSchedule"):
        return "node(s) were unschedulable"
    if any(node.labels.get(k) != v for k, v in needs.selector) or (
        needs.terms is not None and not any(t.matches(node) for t in needs.terms)
    ):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in node.taints:
        if taint.effect in BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in needs.tolerations):
            return "node(s) had untolerated taint {" + f"{taint.key}: {taint.value}" + "}"
    if room.pods + 1 > node.pods:
        return "Too many pods"
    if needs.cpu and room.cpu + needs.cpu > node.cpu:
        return "Insufficient cpu"
    if needs.memory and room.memory + needs.memory > node.memory:
        return "Insufficient memory"
    for res, qty in sorted(needs.extended.items()):
        if room.extended.get(res, 0) + qty > node.allocatable.get(res, 0):
            return f"Insufficient {res}"
    return None


def unschedulable_message(total: int, reasons: Mapping[str, int]) -> str:
    """kube-scheduler's FailedScheduling text: "0/3 nodes are available: 1 Insufficient cpu, 2 ..."."""
    parts = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
    return f"0/{total} nodes are available: {parts}." if parts else f"0/{total} nodes are available."


def rooms(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> dict[str, Room]:
    """Each readable node's room, the bound pods' requests taken off (a pod the scheduler cannot read
    is logged and counts for nothing, as a node it cannot read is left out)."""
    out: dict[str, Room] = {}
    for obj in nodes:
        try:
            record = parse_node(dict(obj))
        except NodeError as exc:
            log.warning("node left out: %s", exc)
            continue
        out[record.name] = Room(record, unschedulable=bool(_spec(obj).get("unschedulable")))
    for pod in pods:
        node = _spec(pod).get("nodeName")
        if not node or node not in out or _phase(pod) in TERMINAL:
            continue
        try:
            out[node].take(pod_needs(pod))
        except PodError as exc:
            log.warning("bound pod %s not counted: %s", pod_ref(pod), exc)
    return out


def least_allocated(needs: PodNeeds, room: Room) -> tuple[float, str]:
    """kube-scheduler's default scoring, reduced: the node left emptiest by the pod first, then by name."""
    node = room.node
    shares = [(room.pods + 1) / node.pods if node.pods else 1.0]
    if node.cpu:
        shares.append((room.cpu + needs.cpu) / node.cpu)
    if node.memory:
        shares.append((room.memory + needs.memory) / node.memory)
    for res, qty in needs.extended.items():
        if node.allocatable.get(res):
            shares.append((room.extended.get(res, 0) + qty) / node.allocatable[res])
    return (sum(shares) / len(shares), node.name)


Chooser = Callable[[PodNeeds, Sequence[Room]], Room]


def choose_least_allocated(needs: PodNeeds, feasible: Sequence[Room]) -> Room:
    return min(feasible, key=lambda room: least_allocated(needs, room))


# --- the processes -----------------------------------------------------------------------------------


def _ready_status(pod: Mapping[str, Any], now: str) -> dict[str, Any]:
    kept = [
        c
        for c in ((pod.get("status") or {}).get("conditions") or [])
        if isinstance(c, dict) and c.get("type") not in ("Initialized", "ContainersReady", "Ready")
    ]
    extra = [
        {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
        for kind in ("Initialized", "ContainersReady", "Ready")
    ]
    return {"status": {"phase": "Running", "conditions": kept + extra, "startTime": now}}


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod_path(pod: Mapping[str, Any], sub: str = "") -> str:
    m = _meta(pod)
    return f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}" + (f"/{sub}" if sub else "")


class StandInScheduler:
    """kube-scheduler (and the kubelets' Ready), for the pods of `scheduler_names`.

    `async with StandInScheduler(kubeconfig) as s:` runs it: a watch on pods and nodes wakes it, and a
    resync every `interval` seconds catches what a watch missed. `await s.cycle()` runs one pass
    (deterministic: pods oldest first, then by namespace and name). `kubelet=False` leaves pods bound but
    not Ready; `hold` names pods ("ns/name") whose kubelet never reports them Ready."""

    def __init__(
        self,
        kubeconfig: str,
        *,
        scheduler_names: Sequence[str] = (DEFAULT_SCHEDULER,),
        interval: float = 0.5,
        kubelet: bool = True,
        choose: Chooser = choose_least_allocated,
    ) -> None:
        self.kube = Kube(kubeconfig, user_agent="kube-scheduler-stand-in")
        self.scheduler_names = tuple(scheduler_names)
        self.interval = interval
        self.kubelet = kubelet
        self.hold: set[str] = set()
        self.choose = choose
        self.bound: list[tuple[str, str]] = []  # (ns/name, node), in binding order
        self.unschedulable: dict[str, str] = {}  # ns/name -> the last "0/N nodes" message
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> StandInScheduler:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._loop(), name="stand-in-scheduler"),
            asyncio.create_task(self._watch("/api/v1/pods"), name="stand-in-watch-pods"),
            asyncio.create_task(self._watch("/api/v1/nodes"), name="stand-in-watch-nodes"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.kube.close()

    async def _watch(self, path: str) -> None:
        while True:
            try:
                async for _ in self.kube.watch(path):
                    self._wake.set()
            except (aiohttp.ClientError, KubeError, ValueError) as exc:
                log.debug("stand-in watch of %s ended: %s", path, exc)
            await asyncio.sleep(self.interval)

    async def _loop(self) -> None:
        while True:
            try:
                await self.cycle()
            except (aiohttp.ClientError, KubeError) as exc:
                log.warning("stand-in scheduler pass failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()

    async def cycle(self) -> list[tuple[str, str]]:
        """One pass: bind what fits now, say why the rest does not, mark bound pods Ready. Returns what
        this pass bound."""
        async with self._lock:
            nodes = await self.kube.items("/api/v1/nodes")
            pods = await self.kube.items("/api/v1/pods")
            room = rooms(nodes, pods)
            pending = sorted(
                (p for p in pods if is_pending(p, self.scheduler_names)),
                key=lambda p: (str(_meta(p).get("creationTimestamp", "")), pod_ref(p)),
            )
            done: list[tuple[str, str]] = []
            for pod in pending:
                node = await self._schedule(pod, room)
                if node is not None:
                    done.append((pod_ref(pod), node))
            if self.kubelet:
                # Read again: a kubelet sees the pod as the binding left it (its PodScheduled condition).
                await self._mark_ready(await self.kube.items("/api/v1/pods") if done else pods, room)
            return done

    async def _schedule(self, pod: dict[str, Any], room: dict[str, Room]) -> str | None:
        ref = pod_ref(pod)
        try:
            needs = pod_needs(pod)
        except PodError as exc:
            await self._unschedulable(pod, f"the pod cannot be read: {exc}")
            return None
        reasons: dict[str, int] = {}
        feasible = []
        for candidate in sorted(room.values(), key=lambda r: r.node.name):
            why = why_not(needs, candidate)
            if why is None:
                feasible.append(candidate)
            else:
                reasons[why] = reasons.get(why, 0) + 1
        if not feasible:
            await self._unschedulable(pod, unschedulable_message(len(room), reasons))
            return None
        chosen = self.choose(needs, feasible)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": _meta(pod)["name"], "uid": _meta(pod).get("uid")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": chosen.node.name},
        }
        try:
            await self.kube.call("POST", _pod_path(pod, "binding"), binding)
        except KubeError as exc:
            # The pod changed or went between the list and the bind (gated again, deleted, bound by
            # another): the next pass sees it as it is.
            log.info("binding %s to %s refused: %s", ref, chosen.node.name, exc)
            return None
        chosen.take(needs)
        self.bound.append((ref, chosen.node.name))
        self.unschedulable.pop(ref, None)
        pod.setdefault("spec", {})["nodeName"] = chosen.node.name
        return chosen.node.name

    async def _unschedulable(self, pod: Mapping[str, Any], message: str) -> None:
        ref = pod_ref(pod)
        if self.unschedulable.get(ref) == message:
            return
        self.unschedulable[ref] = message
        kept = [
            c
            for c in ((pod.get("status") or {}).get("conditions") or [])
            if isinstance(c, dict) and c.get("type") != "PodScheduled"
        ]
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": _now(),
        }
        with contextlib.suppress(KubeError):
            await self.kube.call(
                "PATCH",
                _pod_path(pod, "status"),
                {"status": {"conditions": [*kept, condition]}},
                content_type="application/merge-patch+json",
            )

    async def _mark_ready(self, pods: Iterable[dict[str, Any]], room: Mapping[str, Room]) -> None:
        for pod in pods:
            node = _spec(pod).get("nodeName")
            if (
                not node
                or node not in room
                or is_ready(pod)
                or _phase(pod) in TERMINAL
                or _meta(pod).get("deletionTimestamp")
                or pod_ref(pod) in self.hold
            ):
                continue
            with contextlib.suppress(KubeError):
                await self.kube.call(
                    "PATCH",
                    _pod_path(pod, "status"),
                    _ready_status(pod, _now()),
                    content_type="application/merge-patch+json",
                )


class ForeignScheduler:
    """Another scheduler: it binds only pods of its own schedulerName, to the nodes a test names, when
    the test calls it. `take` creates one of its pods asking `requests` and binds it to `node` at once."""

    def __init__(self, kubeconfig: str, *, name: str = "foreign-scheduler") -> None:
        self.kube = Kube(kubeconfig, user_agent=name)
        self.name = name

    async def close(self) -> None:
        await self.kube.close()

    async def take(
        self,
        node: str,
        *,
        namespace: str = "default",
        name: str | None = None,
        requests: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """A pod of this scheduler asking `requests`, created and bound to `node` now."""
        pod = foreign_pod(self.name, namespace, name or f"{self.name}-{node}", requests or {}, labels or {})
        created = await self.kube.call("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        await self.bind(created, node)
        return created

    async def bind(self, pod: Mapping[str, Any], node: str) -> None:
        """Bind one of this scheduler's pods to `node` (no filter: the test chose the node)."""
        if (_spec(pod).get("schedulerName") or DEFAULT_SCHEDULER) != self.name:
            raise ValueError(f"{pod_ref(pod)} is not a pod of {self.name}")
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": _meta(pod)["name"]}}
        binding["target"] = {"apiVersion": "v1", "kind": "Node", "name": node}
        await self.kube.call("POST", _pod_path(pod, "binding"), binding)


def foreign_pod(
    scheduler: str,
    namespace: str,
    name: str,
    requests: Mapping[str, str],
    labels: Mapping[str, str],
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/foreign:1",
                    "resources": {"requests": dict(requests), "limits": dict(requests)},
                }
            ],
        },
    }
