"""The mutating admission webhook: a group's pods carry the gate `placement.<domain>/group` from creation.

`gate_patch` decides (pure); `build_webhook_app` serves it (AdmissionReview v1 over HTTPS); `ReloadingTLS`
gives the server a TLS context that picks up a rotated certificate without a restart.

Which pods are gated: a pod of a recognised group (the families the extender knows, an explicit
`placement.<domain>/group` label or annotation, or the Workload API's `spec.schedulingGroup` /
`spec.workloadRef`), that opted in, that does not carry the gate already. Opting in: its namespace is
labelled `placement.<domain>/admission: enabled` (the webhook configuration's namespaceSelector sends
those pods to /mutate-pods), or the pod names a nodefabric group itself (label or annotation
`placement.<domain>/group`: /mutate-pods/explicit gates only those). Never gated: a pod with
`spec.nodeName` (the API server refuses gates beside it), a pod of a scheduler other than the configured
ones (its scheduler would never see our gate go), a pod labelled `placement.<domain>/admission:
disabled`.

The webhook never refuses a pod: every answer is `allowed: true`, with a patch or without. A pod whose
group annotations are unusable is let through ungated, with a warning the client (kubectl) prints.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from nodefabric_devicemanager import vocabulary
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.groups import InvalidPlacement, group_of
from nodefabric_operator.extender.wire import WireError, loads, shown
from nodefabric_operator.httpbody import BodyReader, Limits

log = logging.getLogger(__name__)

# controller-runtime's limit for an AdmissionReview: a pod is at most 3 MiB (the API server's own limit),
# sent with its old object on updates and wrapped in the review.
MAX_BODY = 7 * 1024 * 1024
REVIEW_VERSION = "admission.k8s.io/v1"
# The API server gives a webhook call at most 30 s (`timeoutSeconds`): a body still coming after that is
# no API server's. Without a bound, each client that stops mid-body holds up to MAX_BODY and a handler.
BODY_TIMEOUT_S = 30.0
# The bodies being read at once may hold this many bytes (counted as they arrive, httpbody); a review
# whose next bytes would pass it is answered 503 at once. The API server's reviews are a few
# KiB each and arrive whole, so a burst of thousands fits; clients that send 7 MiB bodies slowly, one
# connection each, no longer make the process hold 7 MiB per connection until it is killed for memory.
MAX_IN_FLIGHT = 4 * MAX_BODY
DEFAULT_SCHEDULERS = ("default-scheduler",)
# The API server truncates a webhook's warning past 256 characters (and drops warnings past 4 KiB in all):
# a warning is cut here to that bound, so no value echoed in one can make the answer itself large.
MAX_WARNING = 256


@dataclass(frozen=True)
class WebhookConfig:
    placement: ExtenderConfig = field(default_factory=ExtenderConfig)
    # The schedulers whose pods the placement process admits: only their pods are gated.
    scheduler_names: tuple[str, ...] = DEFAULT_SCHEDULERS
    max_body: int = MAX_BODY
    body_timeout: float = BODY_TIMEOUT_S
    max_in_flight: int = MAX_IN_FLIGHT

    def __post_init__(self) -> None:
        _ = self.limits  # refuses a max_in_flight that cannot hold one body

    @property
    def limits(self) -> Limits:
        return Limits(
            self.max_body,
            self.body_timeout,
            self.max_in_flight,
            sender="the API server",
            content_type="application/json",
        )

    @property
    def prefix(self) -> str:
        return self.placement.annotation_prefix

    @property
    def gate(self) -> str:
        return vocabulary.scheduling_gate(self.placement.domain)


@dataclass(frozen=True)
class Verdict:
    """What the webhook does with a pod: the JSON patch (empty: leave it), why, and a warning for the
    client (empty: none)."""

    patch: tuple[dict[str, Any], ...]
    reason: str
    warning: str = ""


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _unreadable_workload(spec: Mapping[str, Any]) -> str:
    """Why a pod that joins the Workload API (`spec.schedulingGroup`, or the first alpha's
    `spec.workloadRef`) is in no group group_of reads, or "" when it names none. Only called once group_of
    found no group: the placement process groups pods by group_of alone, so a gate on such a pod would
    never be removed."""
    group = _mapping(spec.get("schedulingGroup")).get("podGroupName")
    ref = _mapping(spec.get("workloadRef"))
    name = group if isinstance(group, str) and group else ref.get("podGroup")
    if isinstance(name, str) and name:
        shown = name if len(name) <= 63 else f"{name[:63]}..."
        return f"pod group {shown!r} is not a label value (63 characters, [A-Za-z0-9_.-])"
    if _mapping(spec.get("schedulingGroup")) or ref:
        return "spec.schedulingGroup or spec.workloadRef names no pod group"
    return ""


def names_group(pod: Mapping[str, Any], config: WebhookConfig) -> bool:
    """The pod opts in by itself: it names a nodefabric group (label or annotation)."""
    meta = _mapping(pod.get("metadata"))
    key = config.gate
    return any(
        isinstance(v, str) and v
        for v in (_mapping(meta.get("labels")).get(key), _mapping(meta.get("annotations")).get(key))
    )


def gate_patch(pod: Mapping[str, Any], config: WebhookConfig, *, namespace_opted_in: bool) -> Verdict:
    """The patch that gates this pod at creation, or none, with the reason."""
    meta = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    if _mapping(meta.get("labels")).get(config.prefix + vocabulary.ADMISSION) == "disabled":
        return Verdict((), "opted out")
    if not isinstance(pod.get("spec"), Mapping):
        # The patch adds under /spec, which must exist for it to apply (the API server always sends one).
        return Verdict((), "no spec")
    if not (namespace_opted_in or names_group(pod, config)):
        return Verdict((), "not opted in")
    if spec.get("nodeName"):
        return Verdict((), "already has a node")
    scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULERS[0]
    if scheduler not in config.scheduler_names:
        return Verdict((), f"scheduler {scheduler!s:.80} is not one nodefabric admits for")
    try:
        group = group_of(pod, config.placement)
    except InvalidPlacement as exc:
        return Verdict((), "invalid placement", f"{exc}: the pod is not gated; it is scheduled on its own")
    if group is None:
        problem = _unreadable_workload(spec)
        if problem:
            return Verdict(
                (), "invalid placement", f"{problem}: the pod is not gated; it is scheduled on its own"
            )
        return Verdict((), "not in a group")
    gates = spec.get("schedulingGates")
    if isinstance(gates, list) and any(_mapping(g).get("name") == config.gate for g in gates):
        return Verdict((), "already gated")
    if isinstance(gates, list) and gates:
        return Verdict(
            ({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": config.gate}},), "gated"
        )
    return Verdict(
        ({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": config.gate}]},), "gated"
    )


# --- AdmissionReview -----------------------------------------------------------------------------------


class ReviewError(ValueError):
    """A body that is not an AdmissionReview v1 this webhook can answer; the message says why."""


@dataclass(frozen=True)
class Review:
    uid: str
    operation: str
    kind: tuple[str, str, str]
    obj: Mapping[str, Any] | None
    namespace: str


def parse_review(data: object) -> Review:
    if not isinstance(data, dict):
        raise ReviewError(f"the body must be an AdmissionReview object, got {type(data).__name__}")
    if data.get("apiVersion") != REVIEW_VERSION or data.get("kind") != "AdmissionReview":
        have = f"{data.get('apiVersion')!s:.60}/{data.get('kind')!s:.60}"
        raise ReviewError(f"expected apiVersion {REVIEW_VERSION} and kind AdmissionReview, got {have}")
    request = data.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request: must be an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > 128:
        raise ReviewError("request.uid: must be a non-empty string (at most 128 characters)")
    operation = request.get("operation")
    if operation not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise ReviewError(
            f"request.operation: must be CREATE, UPDATE, DELETE or CONNECT, got {operation!r:.60}"
        )
    kind = request.get("kind")
    if not isinstance(kind, dict) or not all(
        isinstance(kind.get(k), str) for k in ("group", "version", "kind")
    ):
        raise ReviewError("request.kind: must be an object with string group, version and kind")
    obj = request.get("object")
    if obj is not None and not isinstance(obj, dict):
        raise ReviewError(f"request.object: must be an object, got {type(obj).__name__}")
    namespace = request.get("namespace", "")
    if not isinstance(namespace, str):
        raise ReviewError("request.namespace: must be a string")
    if operation == "CREATE" and (kind["group"], kind["kind"]) == ("", "Pod"):
        if obj is None:
            raise ReviewError("request.object: a pod's CREATE review must carry the pod")
        for part in ("metadata", "spec"):
            if obj.get(part) is not None and not isinstance(obj.get(part), dict):
                raise ReviewError(f"request.object.{part}: must be an object, got {type(obj[part]).__name__}")
        gates = _mapping(obj.get("spec")).get("schedulingGates")
        if gates is not None and not isinstance(gates, list):
            raise ReviewError("request.object.spec.schedulingGates: must be a list")
    return Review(uid, operation, (kind["group"], kind["version"], kind["kind"]), obj, namespace)


def answer(
    review: Review, config: WebhookConfig, *, namespace_opted_in: bool
) -> tuple[dict[str, Any], Verdict]:
    """The AdmissionReview response: always allowed; a JSONPatch when the pod gets the gate."""
    verdict = Verdict((), "not a pod's creation")
    if (
        review.operation == "CREATE"
        and (review.kind[0], review.kind[2]) == ("", "Pod")
        and review.obj is not None
    ):
        pod = review.obj
        if review.namespace and not _mapping(pod.get("metadata")).get("namespace"):
            # The API server fills the namespace from the URL after admission: group_of keys on it.
            pod = {**pod, "metadata": {**_mapping(pod.get("metadata")), "namespace": review.namespace}}
        verdict = gate_patch(pod, config, namespace_opted_in=namespace_opted_in)
    response: dict[str, Any] = {"uid": review.uid, "allowed": True}
    if verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(verdict.patch)).encode()).decode()
    if verdict.warning:
        response["warnings"] = [_bounded(verdict.warning)]
    return {"apiVersion": REVIEW_VERSION, "kind": "AdmissionReview", "response": response}, verdict


def _bounded(warning: str) -> str:
    """A warning at most MAX_WARNING characters, saying how long it was when cut. The values it quotes are
    cut already (`shown`): this holds for any message that might one day quote one whole."""
    if len(warning) <= MAX_WARNING:
        return warning
    tail = f"... ({len(warning):,} characters)"
    return warning[: MAX_WARNING - len(tail)] + tail


# --- HTTP -----------------------------------------------------------------------------------------------

CONFIG: web.AppKey[WebhookConfig] = web.AppKey("webhook_config", WebhookConfig)
BODIES: web.AppKey[BodyReader] = web.AppKey("webhook_bodies", BodyReader)


def _refuse(status: int, message: str) -> web.Response:
    log.warning("refused an admission request", extra={"status": status, "error": message})
    return web.json_response({"error": message}, status=status)


def _logged(value: object) -> str:
    """A value from the review as a log field: itself when it is a short string (the usual pod name, as
    before), else as `shown` quotes it, cut with its length."""
    return value if isinstance(value, str) and len(value) <= 80 else shown(value)


def _review(raw: bytes, config: WebhookConfig, namespace_opted_in: bool) -> web.Response:
    try:
        review = parse_review(loads(raw))
    except ReviewError as exc:
        return _refuse(400, f"not an AdmissionReview v1: {exc}")
    except WireError as exc:  # not UTF-8: it says so itself
        return _refuse(400, str(exc))
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting past the decoder's depth
        return _refuse(400, f"request body is not JSON: {str(exc)[:200]}")
    body, verdict = answer(review, config, namespace_opted_in=namespace_opted_in)
    meta = _mapping(_mapping(review.obj).get("metadata"))
    # Admission runs before the API server validates the pod: its name may be megabytes, and the
    # namespace is whatever the body says; both are logged cut.
    log.info(
        "admission review",
        extra={
            "uid": review.uid,
            "namespace": _logged(review.namespace),
            "pod": _logged(meta.get("name") or meta.get("generateName") or ""),
            "verdict": verdict.reason,
        },
    )
    return web.json_response(body)


def _handler(namespace_opted_in: bool) -> Any:
    async def handle(request: web.Request) -> web.Response:
        config = request.app[CONFIG]
        return await request.app[BODIES].answer(
            request, _refuse, lambda raw: _review(raw, config, namespace_opted_in)
        )

    return handle


def build_webhook_app(config: WebhookConfig | ExtenderConfig) -> web.Application:
    """POST /mutate-pods (the namespace opted in: the configuration's namespaceSelector vouches for it) and
    POST /mutate-pods/explicit (only pods that name a nodefabric group are gated). Given the placement
    configuration alone, only default-scheduler's pods are gated."""
    if isinstance(config, ExtenderConfig):
        config = WebhookConfig(placement=config)
    app = web.Application(client_max_size=config.max_body)
    app[CONFIG] = config
    app[BODIES] = BodyReader(config.limits)
    # A client asking `Expect: 100-continue` is refused from its headers before it sends a body.
    expect = app[BODIES].expect(_refuse)
    app.router.add_post("/mutate-pods", _handler(True), expect_handler=expect)
    app.router.add_post("/mutate-pods/explicit", _handler(False), expect_handler=expect)
    return app


# --- TLS ------------------------------------------------------------------------------------------------


class ReloadingTLS:
    """A server TLS context whose certificate follows its files: each handshake checks their mtime and
    size, and a change loads the new pair (cert-manager or the chart rotating a Secret, the kubelet
    updating the mounted files). A pair that does not load (the key written before its certificate) is
    logged and the previous pair serves until the next change loads."""

    def __init__(self, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]) -> None:
        self.cert_file, self.key_file = Path(cert_file), Path(key_file)
        self._lock = threading.Lock()
        self._stamp = self._read_stamp()
        self._current = self._load()  # a pair that does not load at start is the caller's error
        self.reloads = 0
        self.context = self._load()
        self.context.sni_callback = self._on_hello

    def _read_stamp(self) -> tuple[int, int, int, int]:
        cert, key = self.cert_file.stat(), self.key_file.stat()
        return (cert.st_mtime_ns, cert.st_size, key.st_mtime_ns, key.st_size)

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def current(self) -> ssl.SSLContext:
        """The context for the next handshake, reloaded first when the files changed."""
        with self._lock:
            try:
                stamp = self._read_stamp()
            except OSError as exc:
                log.warning(
                    "TLS files unreadable; serving the previous certificate", extra={"error": str(exc)}
                )
                return self._current
            if stamp != self._stamp:
                try:
                    self._current = self._load()
                except (OSError, ssl.SSLError) as exc:
                    log.warning(
                        "TLS files changed but do not load; serving the previous certificate",
                        extra={"error": str(exc)},
                    )
                    return self._current
                self._stamp = stamp
                self.reloads += 1
                log.info("TLS certificate reloaded", extra={"cert": str(self.cert_file)})
            return self._current

    def _on_hello(self, sslobj: Any, server_name: str | None, context: ssl.SSLContext) -> None:
        sslobj.context = self.current()


def ssl_context(cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]) -> ssl.SSLContext:
    """The webhook server's TLS context (for `web.TCPSite(ssl_context=...)`), following rotations of the
    files. Raises OSError or ssl.SSLError when the pair does not load at start."""
    return ReloadingTLS(cert_file, key_file).context
