"""Mutating admission webhooks, called as the API server calls them on a pod's creation.

Every MutatingWebhookConfiguration (admissionregistration.k8s.io/v1), in name order, each webhook in its
order: when its rules name the operation and resource, its namespaceSelector matches the namespace's
labels (a namespace always carries `kubernetes.io/metadata.name`) and its objectSelector the object's,
the API server POSTs an AdmissionReview v1 over HTTPS, trusting the configuration's caBundle (the
system's CAs without one), within `timeoutSeconds` (default 10). A JSONPatch in the answer is applied
to the object the next webhook sees; warnings reach the client. A call that fails (unreachable, timed
out, not a 200, not a review for this request, an unusable patch) is skipped under `failurePolicy:
Ignore` and refuses the request under `Fail` (the default), with the API server's message. A webhook
that answers `allowed: false` refuses it with its own status.

`clientConfig.service` is resolved through the emulator's `services` table ("namespace/name" ->
"host:port"), since no Service routes here. `matchConditions` (CEL) and `reinvocationPolicy` are not
evaluated: a webhook is called whenever its rules and selectors match, once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import ssl
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from nodefabric_operator.demo.kubeapi.errors import ApiError
from nodefabric_operator.demo.kubeapi.patches import JSON_PATCH, apply_patch
from nodefabric_operator.demo.kubeapi.selectors import SelectorError, object_selector, selector_matches

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10
MAX_RESPONSE = 10 * 1024 * 1024


@dataclass(frozen=True)
class Target:
    """What is being admitted: the review's kind, resource, operation and names."""

    group: str
    version: str
    kind: str
    resource: str
    namespace: str
    name: str
    operation: str = "CREATE"
    dry_run: bool = False


@dataclass
class Outcome:
    obj: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    called: list[str] = field(default_factory=list)  # webhook names, in call order


class CallFailed(Exception):
    pass


def _listed(values: object, wanted: str) -> bool:
    return isinstance(values, list) and ("*" in values or wanted in values)


def rules_match(webhook: Mapping[str, Any], target: Target) -> bool:
    for rule in webhook.get("rules") or []:
        if not isinstance(rule, Mapping):
            continue
        resources = rule.get("resources")
        if (
            _listed(rule.get("operations"), target.operation)
            and _listed(rule.get("apiGroups"), target.group)
            and _listed(rule.get("apiVersions"), target.version)
            and isinstance(resources, list)
            and any(r in ("*", "*/*", target.resource) for r in resources)
            and rule.get("scope", "*") in ("*", "Namespaced" if target.namespace else "Cluster")
        ):
            return True
    return False


def selectors_match(
    webhook: Mapping[str, Any], namespace_labels: Mapping[str, str], labels: Mapping[str, str]
) -> bool:
    """Raises SelectorError for a selector that is not one."""
    return selector_matches(object_selector(webhook.get("namespaceSelector")), namespace_labels) and (
        selector_matches(object_selector(webhook.get("objectSelector")), labels)
    )


def review_request(target: Target, obj: Mapping[str, Any]) -> dict[str, Any]:
    gvk = {"group": target.group, "version": target.version, "kind": target.kind}
    gvr = {"group": target.group, "version": target.version, "resource": target.resource}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": target.name,
            "namespace": target.namespace,
            "operation": target.operation,
            "userInfo": {"username": "emulator", "groups": ["system:masters", "system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": target.dry_run,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def _url(client: Mapping[str, Any], services: Mapping[str, str]) -> str:
    if isinstance(client.get("url"), str):
        return str(client["url"])
    service = client.get("service")
    if not isinstance(service, Mapping):
        raise CallFailed("clientConfig has neither url nor service")
    key = f"{service.get('namespace')}/{service.get('name')}"
    where = services.get(key)
    if where is None:
        raise CallFailed(f'service "{key}" not found')
    return f"https://{where}{service.get('path') or '/'}"


def _ssl(client: Mapping[str, Any]) -> ssl.SSLContext:
    bundle = client.get("caBundle")
    if not bundle:
        return ssl.create_default_context()
    try:
        pem = base64.b64decode(str(bundle), validate=True).decode()
        return ssl.create_default_context(cadata=pem)
    except (binascii.Error, UnicodeDecodeError, ssl.SSLError, ValueError) as exc:
        raise CallFailed(f"caBundle is not a PEM bundle: {exc}") from None


async def _call(
    webhook: Mapping[str, Any], review: dict[str, Any], services: Mapping[str, str]
) -> dict[str, Any]:
    client = webhook.get("clientConfig")
    if not isinstance(client, Mapping):
        raise CallFailed("clientConfig is missing")
    url = _url(client, services)
    timeout = webhook.get("timeoutSeconds", DEFAULT_TIMEOUT_S)
    timeout = timeout if isinstance(timeout, int) and 1 <= timeout <= 30 else DEFAULT_TIMEOUT_S
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http,
            http.post(url, json=review, ssl=_ssl(client)) as resp,
        ):
            raw = await resp.content.read(MAX_RESPONSE + 1)
            if resp.status != 200:
                raise CallFailed(f'Post "{url}": the server responded with status {resp.status}')
    except TimeoutError:
        raise CallFailed(f'Post "{url}": context deadline exceeded') from None
    except aiohttp.ClientError as exc:
        raise CallFailed(f'Post "{url}": {exc}') from None
    if len(raw) > MAX_RESPONSE:
        raise CallFailed("the response is too large")
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CallFailed(f"received invalid webhook response: {exc}") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("response"), dict):
        raise CallFailed("received invalid webhook response: no response")
    if answer.get("apiVersion") != "admission.k8s.io/v1" or answer.get("kind") != "AdmissionReview":
        raise CallFailed(
            f"expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, "
            f"got {answer.get('apiVersion')}, Kind={answer.get('kind')}"
        )
    response: dict[str, Any] = answer["response"]
    want = review["request"]["uid"]
    if response.get("uid") != want:
        raise CallFailed(f"expected response.uid={want!r}, got {response.get('uid')!r}")
    if not isinstance(response.get("allowed"), bool):
        raise CallFailed("expected response.allowed to be a boolean")
    return response


def _patched(obj: dict[str, Any], response: Mapping[str, Any]) -> dict[str, Any]:
    patch = response.get("patch")
    if patch is None:
        return obj
    if response.get("patchType") != "JSONPatch":
        raise CallFailed(f"unsupported patch type {response.get('patchType')!r}")
    try:
        ops = json.loads(base64.b64decode(str(patch), validate=True))
    except (binascii.Error, ValueError) as exc:
        raise CallFailed(f"the patch is not base64 JSON: {exc}") from None
    try:
        return apply_patch(obj, ops, JSON_PATCH, custom=False)
    except ApiError as exc:
        raise CallFailed(f"the patch does not apply: {exc}") from None


def _denied(name: str, response: Mapping[str, Any]) -> ApiError:
    status = response.get("status") if isinstance(response.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    given = status.get("code")
    code = given if isinstance(given, int) and 400 <= given < 600 else 403
    message = f'admission webhook "{name}" denied the request'
    if status.get("message"):
        message += f": {status['message']}"
    reason = str(status.get("reason") or ("Forbidden" if code == 403 else ""))
    return ApiError(code, reason, message, {})


def _failed(name: str, why: str) -> ApiError:
    return ApiError(
        500, "InternalError", f'Internal error occurred: failed calling webhook "{name}": {why}', {}
    )


async def admit_through_webhooks(
    configurations: Sequence[Mapping[str, Any]],
    target: Target,
    obj: dict[str, Any],
    namespace_labels: Mapping[str, str],
    services: Mapping[str, str],
) -> Outcome:
    """The object after every matching mutating webhook. Raises ApiError as the API server refuses."""
    outcome = Outcome(obj)
    for config in sorted(configurations, key=lambda c: str((c.get("metadata") or {}).get("name", ""))):
        for webhook in config.get("webhooks") or []:
            if not isinstance(webhook, Mapping):
                continue
            name = str(webhook.get("name", ""))
            policy = webhook.get("failurePolicy", "Fail")
            labels = (outcome.obj.get("metadata") or {}).get("labels") or {}
            try:
                if not rules_match(webhook, target) or not selectors_match(webhook, namespace_labels, labels):
                    continue
                outcome.called.append(name)
                response = await _call(webhook, review_request(target, outcome.obj), services)
                if not response["allowed"]:
                    raise _denied(name, response)
                outcome.obj = _patched(outcome.obj, response)
                warnings = response.get("warnings") or []
                outcome.warnings += [str(w) for w in warnings] if isinstance(warnings, list) else []
            except (CallFailed, SelectorError) as exc:
                if policy == "Ignore":
                    log.warning("webhook %s failed and is ignored: %s", name, exc)
                    continue
                raise _failed(name, f"failed to call webhook: {exc}") from None
            await asyncio.sleep(0)
    return outcome
