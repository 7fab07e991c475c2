"""`nodefabric crd apply | print`: bring the cluster's CRDs (Devices, PlacementGroup) to this build's schema.

Helm installs a chart's `crds/` on first install and never upgrades them, so a release that adds a field
to the Devices record would leave the old schema on the cluster, and the API server would prune the new
field from every record. The chart's pre-install/pre-upgrade hook Job runs `nodefabric crd apply` from the
same image as the agent, so the CRD always matches the code that writes the records.

One run reads the live CRD and does one of: create it, update it (a merge patch preconditioned on its
resourceVersion, so a concurrent change is re-read, never overwritten), leave it (nothing changed), or
refuse. It refuses to downgrade: a CRD written by a newer nodefabric (its version annotation) stays unless
`--allow-downgrade`, and one whose stored versions this build does not serve stays always (the API server
would refuse that update anyway; the stored objects must be migrated first). Every outcome is one line on
stdout, so the Job's log says what happened to the cluster.

The decision (`plan`) is a pure function of the live object and this build's; the rest is a thin shell.
"""

from __future__ import annotations

import argparse
import copy
import http
import importlib.metadata
import json
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TextIO, cast

import urllib3
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from nodefabric_devicemanager import crd, models, vocabulary
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_operator.admission import model as placement_model
from nodefabric_operator.topology import report as topology_report

log = logging.getLogger(__name__)

NAME = f"{models.PLURAL}.{models.GROUP}"
# Every CRD this build ships, applied in this order (each one line of output): `--crd` picks some.
CRDS: dict[str, Callable[[], dict[str, Any]]] = {
    models.PLURAL: crd.devices_crd,
    placement_model.PLURAL: placement_model.placement_crd,
    topology_report.PLURAL: topology_report.crd,
}
# Which nodefabric release wrote the CRD: what `apply` compares to refuse a downgrade.
VERSION_ANNOTATION = vocabulary.CRD_VERSION_ANNOTATION
# A black-holed API server must not hold a Helm upgrade for long: (connect, read) seconds.
REQUEST_TIMEOUT = (5.0, 30.0)
# Re-reads after a conflict (someone changed the CRD between our read and our write).
ATTEMPTS = 5
# Fields named in the one-line summary of an update; the rest are counted.
SHOWN = 5

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

Action = Literal["create", "update", "unchanged", "refuse"]


def this_version() -> str:
    try:
        return importlib.metadata.version("nodefabric")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def desired(version: str, which: str = models.PLURAL) -> dict[str, Any]:
    """This build's CRD (`which`, a key of CRDS), stamped with the nodefabric version that wrote it."""
    body = copy.deepcopy(CRDS[which]())  # it shares module-level lists (printer columns)
    body["metadata"].setdefault("annotations", {})[VERSION_ANNOTATION] = version
    return body


def release(version: str) -> tuple[int, ...] | None:
    """The release numbers of a version ("0.12.1rc1" -> (0, 12, 1)), None when it has none."""
    found = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    if found is None:
        return None
    parts = [int(p) for p in found.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:  # 1.2 == 1.2.0
        parts.pop()
    return tuple(parts)


def _comparable(node: Any) -> Any:
    """A CRD as it compares: the API server keeps a CRD in Go structs, so false, empty-string and empty-list
    fields come back omitted (`omitempty`) and integers as floats (JSONSchemaProps bounds are float64).
    Without this, an int64 bound or a `nullable: false` would read as a change on every run. An empty
    object is kept: `subresources.status: {}` is a pointer to an empty struct, and it matters."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if value is None or value is False or value in ("", []) or (key == "priority" and value == 0):
                continue
            out[key] = _comparable(value)
        return out
    if isinstance(node, list):
        return [_comparable(n) for n in node]
    if isinstance(node, bool):
        return node
    if isinstance(node, int | float):
        return float(node)
    return node


def merge_patch(live: Any, wanted: Any) -> Any:
    """The RFC 7386 merge patch that turns `live` into `wanted`: changed keys, removed keys as null; a list
    or a scalar is replaced whole."""
    if not (isinstance(live, dict) and isinstance(wanted, dict)):
        return copy.deepcopy(wanted)
    patch: dict[str, Any] = {key: None for key in live if key not in wanted}
    for key, value in wanted.items():
        if key not in live:
            patch[key] = copy.deepcopy(value)
        elif _comparable(live[key]) != _comparable(value):
            patch[key] = merge_patch(live[key], value)
    return patch


def schema_fields(body: dict[str, Any]) -> set[str]:
    """Every field path the CRD's schemas declare, per served version ("v1alpha1:spec.interfaces[].mtu")."""
    found: set[str] = set()

    def walk(node: Any, path: str, version: str) -> None:
        if not isinstance(node, dict):
            return
        for name, sub in _object(node.get("properties")).items():
            here = f"{path}.{name}" if path else name
            found.add(f"{version}:{here}")
            walk(sub, here, version)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]", version)
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}{{}}", version)

    versions = _object(body.get("spec")).get("versions")
    for v in versions if isinstance(versions, list) else []:
        if isinstance(v, dict):
            walk(_object(v.get("schema")).get("openAPIV3Schema"), "", str(v.get("name", "")))
    return found


def _object(value: Any) -> dict[str, Any]:
    """A field that should hold an object, or {} when it holds anything else (a hand-edited CRD)."""
    return value if isinstance(value, dict) else {}


def _named(fields: set[str]) -> str:
    shown = sorted(fields)[:SHOWN]
    more = len(fields) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


@dataclass(frozen=True)
class Plan:
    action: Action
    detail: str  # the rest of the one-line account: versions, what changes, or why not
    body: dict[str, Any] | None = None  # the request body: the object to create, or the merge patch


def plan(live: dict[str, Any] | None, wanted: dict[str, Any], allow_downgrade: bool = False) -> Plan:
    """What `apply` does about `live` (None: absent) to reach `wanted`; pure."""
    ours = wanted["metadata"]["annotations"][VERSION_ANNOTATION]
    if live is None:
        return Plan("create", f"(nodefabric {ours})", copy.deepcopy(wanted))
    meta = _object(live.get("metadata"))
    # On one line and short, whatever a hand edit put there: it is printed.
    theirs = " ".join(str(_object(meta.get("annotations")).get(VERSION_ANNOTATION) or "").split())[:64]
    was = f"nodefabric {theirs}" if theirs else "a version nodefabric did not record"
    served = {v.get("name") for v in wanted["spec"]["versions"] if v.get("served")}
    stored_list = _object(live.get("status")).get("storedVersions")
    stored = {str(v) for v in stored_list} if isinstance(stored_list, list) else set()
    if stored - served:
        return Plan(
            "refuse",
            f"(written by {was}): objects are stored as {', '.join(sorted(stored - served))}, which "
            f"nodefabric {ours} does not serve; migrate them to {', '.join(sorted(served))} and remove the "
            "old version from status.storedVersions first",
        )
    live_release, our_release = release(theirs), release(ours)
    newer = live_release is not None and our_release is not None and live_release > our_release
    if newer and not allow_downgrade:
        return Plan(
            "refuse",
            f"(written by {was}, newer than this nodefabric {ours}): it stays as it is. Keep it by "
            "turning the upgrade job off (crds.upgradeJob.enabled=false), or replace it with "
            "--allow-downgrade (crds.upgradeJob.allowDowngrade=true)",
        )
    live_spec = _object(live.get("spec"))
    spec_patch = {
        key: merge_patch(live_spec.get(key), value)
        for key, value in wanted["spec"].items()
        if _comparable(live_spec.get(key)) != _comparable(value)
    }
    if not spec_patch and theirs == ours:
        return Plan("unchanged", f"(nodefabric {ours})")
    # The resourceVersion makes the patch conditional: a CRD changed since our read answers 409.
    patch: dict[str, Any] = {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "annotations": {VERSION_ANNOTATION: ours},
        }
    }
    if spec_patch:
        patch["spec"] = spec_patch
    before, after = schema_fields(live), schema_fields(wanted)
    changes = [f"spec.{key}" for key in sorted(spec_patch)]
    if after - before:
        changes.append(f"fields added: {_named(after - before)}")
    if before - after:
        changes.append(f"fields removed: {_named(before - after)}")
    what = "; ".join(changes) if changes else "schema unchanged, version recorded"
    return Plan("update", f"from {was} to nodefabric {ours}: {what}", patch)


class ApplyError(Exception):
    """The API did not do what was asked; the message is one line for the Job's log."""


class CrdApi:
    """The three requests `apply` makes on the one CRD: get, create, patch (exactly the chart hook's RBAC)."""

    def __init__(self, api_client: client.ApiClient, name: str = NAME) -> None:
        self._api = client.ApiextensionsV1Api(api_client)
        self.name = name

    # Bodies are read as JSON, never through the client's models: those drop fields they do not know and
    # refuse a CRD whose status has no conditions yet.

    def get(self) -> dict[str, Any] | None:
        try:
            response: Any = self._api.read_custom_resource_definition(
                self.name, _request_timeout=REQUEST_TIMEOUT, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:
                return None
            raise _failure(exc, f"read CustomResourceDefinition {self.name}", self.name) from exc
        try:
            body = json.loads(response.data)
        except ValueError as exc:
            raise ApplyError(
                f"read CustomResourceDefinition {self.name}: the answer is not JSON ({exc})"
            ) from exc
        if not isinstance(body, dict):
            raise ApplyError(f"read CustomResourceDefinition {self.name}: the answer is not an object")
        return body

    def create(self, body: dict[str, Any]) -> None:
        try:
            self._api.create_custom_resource_definition(
                cast(Any, body), _request_timeout=REQUEST_TIMEOUT, _preload_content=False
            )
        except ApiException as exc:
            raise _failure(exc, f"create CustomResourceDefinition {self.name}", self.name) from exc

    def patch(self, body: dict[str, Any]) -> None:
        try:
            self._api.patch_custom_resource_definition(
                self.name,
                body,
                _request_timeout=REQUEST_TIMEOUT,
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status == http.HTTPStatus.NOT_FOUND:  # deleted since our read: read again, create it
                raise Conflict(f"patch CustomResourceDefinition {self.name}") from exc
            raise _failure(exc, f"patch CustomResourceDefinition {self.name}", self.name) from exc


class Conflict(Exception):
    """The CRD changed (or appeared) between our read and our write: read again and decide again."""


def _failure(exc: ApiException, what: str, name: str = NAME) -> Exception:
    status = int(exc.status or 0)
    if status == http.HTTPStatus.CONFLICT:
        return Conflict(what)
    message = _api_message(exc)
    if status == http.HTTPStatus.FORBIDDEN:
        return ApplyError(f"{what}: forbidden ({message}); the hook's ClusterRole grants get/patch on {name}")
    return ApplyError(f"{what}: HTTP {status} {message}".rstrip())


def _api_message(exc: ApiException) -> str:
    """The Status message the API server sent, on one line; the reason phrase when the body is not one."""
    try:
        body = yaml.safe_load(exc.body or "")
    except yaml.YAMLError:
        body = None
    text = body.get("message") if isinstance(body, dict) else None
    return " ".join(str(text or exc.reason or "").split())


def apply(api: CrdApi, wanted: dict[str, Any], *, allow_downgrade: bool, dry_run: bool, out: TextIO) -> int:
    """Read, decide, write; one line on `out` per outcome. Returns the exit status."""
    name = str(wanted["metadata"]["name"])
    for _ in range(ATTEMPTS):
        live = api.get()
        step = plan(live, wanted, allow_downgrade)
        subject = f"CustomResourceDefinition {name}"
        if step.action == "refuse":
            print(f"refused to update {subject} {step.detail}", file=out)
            return EXIT_FAILED
        if step.action == "unchanged":
            print(f"{subject} unchanged {step.detail}", file=out)
            return EXIT_OK
        if dry_run:
            print(f"would {step.action} {subject} {step.detail}", file=out)
            return EXIT_OK
        assert step.body is not None
        try:
            if step.action == "create":
                api.create(step.body)
            else:
                api.patch(step.body)
        except Conflict:
            log.info("the CRD changed since it was read; reading it again", extra={"crd": name})
            continue
        print(f"{step.action}d {subject} {step.detail}", file=out)
        return EXIT_OK
    raise ApplyError(f"{name} kept changing under {ATTEMPTS} attempts to update it; try again")


def _which(text: str) -> list[str]:
    """`--crd all` or one name of CRDS."""
    if text == "all":
        return list(CRDS)
    if text not in CRDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of all, {', '.join(CRDS)}")
    return [text]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="crd_action", metavar="ACTION", required=True)
    apply_parser = actions.add_parser(
        "apply",
        help="create or update the cluster's CRDs to this version's schema (the chart's upgrade hook)",
        description="Create or update the cluster's CRDs (Devices, PlacementGroup) to this version's schema. "
        "Refuses to downgrade a CRD a newer nodefabric wrote. Prints what it did, one line per CRD.",
    )
    apply_parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else $KUBECONFIG)"
    )
    apply_parser.add_argument(
        "--allow-downgrade", action="store_true", help="replace a CRD written by a newer nodefabric"
    )
    apply_parser.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
    print_parser = actions.add_parser(
        "print",
        help="print this version's CRDs as YAML (to apply them by hand)",
        description="Print this version's CRDs as YAML documents, as `apply` would write them.",
    )
    for sub in (apply_parser, print_parser):
        sub.add_argument(
            "--crd",
            type=_which,
            default=list(CRDS),
            help=f"which CRD: all (default) or one of {', '.join(CRDS)}",
        )


def run(args: argparse.Namespace) -> int:
    version = this_version()
    wanted = [desired(version, which) for which in args.crd]
    if args.crd_action == "print":
        # Through JSON: no shared sub-objects, so no YAML anchors in a file people read.
        sys.stdout.write(
            "---\n".join(
                yaml.safe_dump(json.loads(json.dumps(body)), sort_keys=False, width=110) for body in wanted
            )
        )
        return EXIT_OK
    try:
        api_client = load_client(args.kubeconfig)
    except (ConfigException, OSError, yaml.YAMLError) as exc:
        log.error("cannot reach the kubernetes api", extra={"error": " ".join(str(exc).split())})
        return EXIT_USAGE
    worst = EXIT_OK
    try:
        for body in wanted:
            name = str(body["metadata"]["name"])
            try:
                code = apply(
                    CrdApi(api_client, name),
                    body,
                    allow_downgrade=args.allow_downgrade,
                    dry_run=args.dry_run,
                    out=sys.stdout,
                )
            except ApplyError as exc:
                log.error("the CRD was not applied", extra={"crd": name, "error": str(exc)})
                code = EXIT_FAILED
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                log.error("the kubernetes api did not answer", extra={"crd": name, "error": str(exc)})
                return EXIT_FAILED  # the next CRD would only say the same
            worst = max(worst, code)
        return worst
    finally:
        api_client.close()  # type: ignore[no-untyped-call]
