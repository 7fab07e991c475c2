"""`nodefabric operator --prune`: take back what the operator published, as the chart's post-delete hook.

Uninstalling left the operator's NodeFeatures (owned by the Devices records, which Helm keeps with their
CRD), so NFD kept the labels on the Nodes, and a stale `rdma.capable=true` kept attracting workloads.
With the NodeFeature sink this deletes the NodeFeatures the operator created (in its namespace, with the
node-name label, controlled by a Devices record: never another writer's), and nfd-master removes their
labels from the Nodes. With the Node sink it removes from each Node the keys the operator recorded as
written (its managed-labels annotation, and the annotation itself); a hand-set label stays.

A terminating operator pod may still recreate what was just deleted, so passes repeat, `settle` seconds
apart, until one finds nothing; past `timeout` seconds the command gives up with exit status 1, also
when a request is still unanswered then.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3

from nodefabric_devicemanager import models
from nodefabric_operator import rawcall, sinks, startup
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.view import items, part

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pass:
    """What one pass found and took back; `absent`: the sink's API is not served (nothing to take)."""

    removed: int
    absent: bool = False


def owned_by_a_record(obj: Mapping[str, Any]) -> bool:
    """A NodeFeature the operator created: its controller is a Devices record."""
    return any(
        r.get("apiVersion") == models.API_VERSION
        and r.get("kind") == models.KIND
        and r.get("controller") is True
        for r in items(obj, "metadata", "ownerReferences")
    )


def nodefeatures(api: kubernetes.client.ApiClient, namespace: str) -> Pass:
    try:
        # Through rawcall (sinks.listing), not the generated list call: that one reads a refusal's body
        # whole before raising it, however long it runs.
        page = sinks.listing(api, sinks.NFD_PATH, {"ns": namespace}, [("labelSelector", sinks.NFD_NODE_NAME)])
        found = list(sinks.pages(Metrics(), sinks.NFD_PLURAL, page))
    except kubernetes.client.ApiException as err:
        if sinks.status_of(err) == 404:
            return Pass(0, absent=True)  # no NodeFeature API (NFD gone first): nothing of ours can exist
        raise
    removed = 0
    for obj in found:
        if not owned_by_a_record(obj):
            continue
        meta = part(obj, "metadata")
        name = str(meta.get("name", ""))
        body = {"preconditions": {"uid": meta.get("uid")}} if meta.get("uid") else None
        try:
            # Through rawcall, as the list: the generated delete reads a refusal's body whole.
            rawcall.send(api, "DELETE", sinks.NFD_OBJECT, {"ns": namespace, "name": name}, body)
        except kubernetes.client.ApiException as err:
            if sinks.status_of(err) in (404, 409):  # gone already, or replaced: the next pass sees it
                continue
            raise
        removed += 1
        log.info("nodefeature deleted", extra={"node": name, "namespace": namespace})
    return Pass(removed)


def node_labels(api: kubernetes.client.ApiClient, domain: str) -> Pass:
    sink = sinks.NodeSink(api, domain)
    removed = 0
    for node in sink.existing():
        if not node.managed:
            continue
        published = sink.withdraw(node.name, node)
        if published is not None and published.wrote:
            removed += 1
            log.info(
                "labels removed from node",
                extra={"node": node.name, "removed": len(published.plan.changes)},
            )
    return Pass(removed)


def _within(one_pass: Callable[[], Pass], seconds: float) -> Pass | None:
    """The pass's result, or None when it has not returned after `seconds`. The API client has no
    request timeout of its own, so a request no answer ever comes to (an overloaded API server, a
    black-holed load balancer) would hold the hook until the Job's deadline killed it, saying nothing;
    the pass runs in a daemon thread, left behind when the command gives up."""
    outcome: list[Pass] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            outcome.append(one_pass())
        except BaseException as err:  # handed to the caller, as if the pass ran in its thread
            failure.append(err)

    thread = threading.Thread(target=target, name="prune-pass", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        return None
    if failure:
        raise failure[0]
    return outcome[0]


def run(
    one_pass: Callable[[], Pass], what: str, *, timeout: float, settle: float, sleep: Callable[[float], None]
) -> int:
    """Passes until one takes nothing back: 0; still taking things back (or failing) at `timeout`: 1."""
    deadline = time.monotonic() + timeout
    total, passes = 0, 0
    while True:
        passes += 1
        try:
            done = _within(one_pass, max(deadline - time.monotonic(), 1.0))
            error = None
            if done is None:
                log.error(
                    "prune did not finish",
                    extra={
                        "what": what,
                        "removed": total,
                        "error": f"the API server did not answer within {timeout:g} s",
                    },
                )
                return 1
        except kubernetes.client.ApiException as err:
            if sinks.status_of(err) in (401, 403):
                log.error(
                    "prune refused",
                    extra={"what": what, "error": f"HTTP {err.status} {err.reason or ''}".strip()},
                )
                return 1
            done, error = None, f"HTTP {err.status} {err.reason or ''}".strip()
        except (urllib3.exceptions.HTTPError, OSError) as err:
            done, error = None, startup.cause(err)
        except sinks.SinkError as err:  # a garbled list page, a NodeSink write that kept conflicting
            done, error = None, str(err)
        if done is not None:
            total += done.removed
            if done.absent:
                log.info("nothing to prune", extra={"what": what, "why": "API not served"})
                return 0
            if done.removed == 0:
                log.info("pruned", extra={"what": what, "removed": total, "passes": passes})
                return 0
        if time.monotonic() + settle > deadline:
            reason = error or f"{what} kept coming back: is an operator still running?"
            log.error("prune did not finish", extra={"what": what, "removed": total, "error": reason})
            return 1
        if error is not None:
            log.warning("prune pass failed, retrying", extra={"what": what, "error": error})
        sleep(settle)
