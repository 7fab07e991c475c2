"""`nodefabric crd apply`, the chart's CRD upgrade hook, through the real command against the embedded API."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import CHART, Doc, of_kind, one, pod_spec
from test_chart_rbac import CLUSTER, grants_of

from nodefabric_devicemanager import crd
from nodefabric_operator import console, crd_apply
from nodefabric_operator.admission import model as placement_model
from nodefabric_operator.crd_apply import NAME, VERSION_ANNOTATION, desired, plan, release
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api
from nodefabric_operator.topology import report as topology_report

CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
OURS = crd_apply.this_version()
PLG = placement_model.CRD_NAME
FTP = topology_report.crd()["metadata"]["name"]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = console.main(args)
    out, err = capsys.readouterr()
    return code, out, err


async def apply(k: RunningAPI, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    # The client blocks; the emulator serves on this loop, so the command runs in a worker thread. At
    # WARNING, stderr holds what the command says, not the emulator's access log (same process).
    crds = () if "--crd" in extra else ("--crd", "devices")  # the Devices CRD alone, unless told
    args = ["--log-level", "WARNING", "crd", "apply", "--kubeconfig", k.kubeconfig, *crds, *extra]
    return await asyncio.to_thread(run_cli, args, capsys)


def stored(k: RunningAPI) -> dict[str, Any]:
    obj = k.api.stored(CRDS, NAME)
    assert obj is not None
    return obj


def seed(k: RunningAPI, body: dict[str, Any], stored_versions: list[str] | None = None) -> None:
    """A CRD already on the cluster, as Helm's crds/ or an older release left it."""
    obj = copy.deepcopy(body)
    obj["status"] = {"storedVersions": stored_versions or ["v1alpha1"]}
    k.api.put_object(CRDS, obj)


def older(version: str) -> dict[str, Any]:
    """This CRD as an older release wrote it: one spec field and one printer column fewer."""
    body = desired(version)
    schema = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    removed = sorted(schema["properties"])[0]
    del schema["properties"][removed]
    body["spec"]["versions"][0]["additionalPrinterColumns"].pop()
    return body


def writes(k: RunningAPI) -> int:
    return k.count("POST", CRDS) + k.count("PATCH", CRDS) + k.count("PUT", CRDS)


async def test_creates_the_crd_when_the_cluster_has_none(capsys) -> None:
    async with running_api() as k:
        code, out, err = await apply(k, capsys)
        assert (code, err) == (0, "")
        assert out == f"created CustomResourceDefinition {NAME} (nodefabric {OURS})\n"
        got = stored(k)
        assert got["spec"] == crd.devices_crd()["spec"]
        assert got["metadata"]["annotations"] == {VERSION_ANNOTATION: OURS}
        assert (k.count("GET", CRDS), k.count("POST", CRDS), k.count("PATCH", CRDS)) == (1, 1, 0)
        # A second run finds it as it should be and writes nothing.
        code, out, _ = await apply(k, capsys)
        assert (code, out) == (0, f"CustomResourceDefinition {NAME} unchanged (nodefabric {OURS})\n")
        assert writes(k) == 1


async def test_records_the_version_on_the_crd_helm_installed_from_the_chart(capsys) -> None:
    """First install: Helm created the CRD from crds/ just before the hook ran. Same schema, no version."""
    chart_crd = yaml.safe_load((CHART / "crds" / crd.CRD_FILE).read_text())
    async with running_api() as k:
        seed(k, chart_crd)
        code, out, _ = await apply(k, capsys)
        assert code == 0
        assert out == (
            f"updated CustomResourceDefinition {NAME} from a version nodefabric did not record to "
            f"nodefabric {OURS}: schema unchanged, version recorded\n"
        )
        assert stored(k)["metadata"]["annotations"][VERSION_ANNOTATION] == OURS
        assert stored(k)["spec"] == chart_crd["spec"]


async def test_upgrades_an_older_crd_and_says_what_changed(capsys) -> None:
    async with running_api() as k:
        seed(k, older("0.0.1"))
        code, out, err = await apply(k, capsys)
        assert (code, err) == (0, "")
        assert out.startswith(
            f"updated CustomResourceDefinition {NAME} from nodefabric 0.0.1 to nodefabric {OURS}"
        )
        assert "spec.versions" in out and "fields added: v1alpha1:spec." in out and "removed" not in out
        got = stored(k)
        assert got["spec"] == crd.devices_crd()["spec"]
        assert got["metadata"]["annotations"][VERSION_ANNOTATION] == OURS
        # One read, one conditional patch.
        assert (k.count("GET", CRDS), k.count("PATCH", CRDS), k.count("POST", CRDS)) == (1, 1, 0)
        (patch,) = k.requests("PATCH", CRDS)
        assert patch.data["metadata"]["resourceVersion"]


async def test_a_field_the_build_no_longer_has_is_removed_not_left_behind(capsys) -> None:
    async with running_api() as k:
        legacy = desired("0.0.1")
        spec_schema = legacy["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec_schema["properties"]["legacyField"] = {"type": "string"}
        legacy["spec"]["names"]["shortNames"] = ["legacy"]
        seed(k, legacy)
        code, out, _ = await apply(k, capsys)
        assert code == 0
        assert "fields removed: v1alpha1:spec.legacyField" in out
        got = stored(k)
        assert "legacyField" not in json.dumps(got["spec"])
        assert got["spec"]["names"] == crd.devices_crd()["spec"]["names"]


async def test_refuses_to_downgrade_a_crd_a_newer_release_wrote(capsys) -> None:
    async with running_api() as k:
        newer = older("99.0.0")
        seed(k, newer)
        code, out, _ = await apply(k, capsys)
        assert code == 1
        assert out.startswith(
            f"refused to update CustomResourceDefinition {NAME} (written by nodefabric 99.0.0, newer than "
            f"this nodefabric {OURS}): it stays as it is."
        )
        assert "crds.upgradeJob.enabled=false" in out and "--allow-downgrade" in out
        assert writes(k) == 0
        assert stored(k)["metadata"]["annotations"][VERSION_ANNOTATION] == "99.0.0"
        # Asked for explicitly, it replaces it.
        code, out, _ = await apply(k, capsys, "--allow-downgrade")
        assert code == 0 and out.startswith("updated ")
        assert stored(k)["spec"] == crd.devices_crd()["spec"]


async def test_never_drops_a_version_objects_are_stored_in(capsys) -> None:
    async with running_api() as k:
        seed(k, older("0.0.1"), stored_versions=["v1alpha1", "v1beta1"])
        code, out, _ = await apply(k, capsys, "--allow-downgrade")
        assert code == 1
        assert "objects are stored as v1beta1, which" in out and "status.storedVersions" in out
        assert writes(k) == 0


async def test_dry_run_says_what_it_would_do_and_writes_nothing(capsys) -> None:
    async with running_api() as k:
        code, out, _ = await apply(k, capsys, "--dry-run")
        assert (code, out) == (0, f"would create CustomResourceDefinition {NAME} (nodefabric {OURS})\n")
        seed(k, older("0.0.1"))
        code, out, _ = await apply(k, capsys, "--dry-run")
        assert code == 0 and out.startswith(
            f"would update CustomResourceDefinition {NAME} from nodefabric 0.0.1"
        )
        assert writes(k) == 0


async def test_a_concurrent_change_is_read_again_not_overwritten(capsys) -> None:
    async with running_api() as k:
        seed(k, older("0.0.1"))
        k.api.fail_next(1, 409)  # someone else wrote it between our read and our patch
        code, out, _ = await apply(k, capsys)
        assert code == 0 and out.startswith("updated ")
        assert (k.count("GET", CRDS), k.count("PATCH", CRDS)) == (2, 2)
        assert stored(k)["spec"] == crd.devices_crd()["spec"]


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (403, "forbidden"),
        (422, "HTTP 422"),
        (503, "HTTP 503"),
    ],
)
async def test_an_api_refusal_is_one_line_and_exit_1(capsys, status: int, says: str) -> None:
    async with running_api() as k:
        k.api.fail_next(1, status)
        code, out, err = await apply(k, capsys)
        assert code == 1 and out == ""
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "the CRD was not applied" in err and says in err


def test_an_unreachable_api_is_one_line_and_exit_1(capsys, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    code, out, err = run_cli(["crd", "apply", "--kubeconfig", str(kubeconfig)], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "did not answer" in err and "Traceback" not in err


@pytest.mark.parametrize("content", ["", "not: [a kubeconfig", "apiVersion: v1\nkind: Config\n"])
def test_a_bad_kubeconfig_is_one_line_and_exit_2(capsys, tmp_path: Path, content: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(content)
    code, out, err = run_cli(["crd", "apply", "--kubeconfig", str(kubeconfig)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "cannot reach the kubernetes api" in err and "Traceback" not in err


def test_print_writes_the_crds_apply_would_write(capsys) -> None:
    code, out, _ = run_cli(["crd", "print"], capsys)
    assert code == 0
    assert "&id" not in out and "*id" not in out  # no YAML anchors in a file people read
    assert list(yaml.safe_load_all(out)) == [
        desired(OURS),
        desired(OURS, "placementgroups"),
        desired(OURS, "fabrictopologies"),
    ]
    code, out, _ = run_cli(["crd", "print", "--crd", "placementgroups"], capsys)
    assert (code, yaml.safe_load(out)) == (0, desired(OURS, "placementgroups"))


def test_the_console_script_prints_a_crd() -> None:
    """`nodefabric crd` as the chart's upgrade hook runs it: the real console script in its own process."""
    done = subprocess.run(
        [sys.executable, "-m", "nodefabric_operator.console", "crd", "print", "--crd", "placementgroups"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert yaml.safe_load(done.stdout) == desired(OURS, "placementgroups")


async def test_by_default_every_crd_is_applied_one_line_each(capsys) -> None:
    async with running_api() as k:
        code, out, err = await apply(k, capsys, "--crd", "all")
        assert (code, err) == (0, "")
        assert out == (
            f"created CustomResourceDefinition {NAME} (nodefabric {OURS})\n"
            f"created CustomResourceDefinition {PLG} (nodefabric {OURS})\n"
            f"created CustomResourceDefinition {FTP} (nodefabric {OURS})\n"
        )
        assert k.api.stored(CRDS, PLG)["spec"] == placement_model.placement_crd()["spec"]
        assert k.api.stored(CRDS, FTP)["spec"] == topology_report.crd()["spec"]
        code, out, _ = await asyncio.to_thread(
            run_cli, ["--log-level", "WARNING", "crd", "apply", "--kubeconfig", k.kubeconfig], capsys
        )
        assert (code, out.count("unchanged")) == (0, 3)


def test_an_unknown_crd_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        console.main(["crd", "print", "--crd", "nodes"])
    assert exited.value.code == 2
    assert "'nodes' is not one of all, devices, placementgroups" in capsys.readouterr().err


def test_an_unknown_action_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        console.main(["crd", "delete"])
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# The decision, as a pure function.


def as_the_api_server_returns_it(body: dict[str, Any]) -> dict[str, Any]:
    """Go structs round-trip: false, empty strings and empty lists omitted (omitempty), integers as
    float64; an empty object stays (`subresources.status: {}` is a pointer to an empty struct)."""

    def go(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: go(v) for k, v in node.items() if not (v is False or v is None or v in ("", []))}
        if isinstance(node, list):
            return [go(n) for n in node]
        if isinstance(node, int) and not isinstance(node, bool):
            return float(node)
        return node

    out = go(copy.deepcopy(body))
    out["metadata"]["resourceVersion"] = "7"
    return out


def test_the_api_servers_normal_form_is_not_a_change() -> None:
    wanted = desired(OURS)
    schema = wanted["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["status"]["properties"]["bounded"] = {
        "type": "integer", "minimum": 0, "maximum": 2**63 - 1, "nullable": False,
    }  # fmt: skip
    assert plan(as_the_api_server_returns_it(wanted), wanted).action == "unchanged"


def test_a_real_change_in_a_bound_is_a_change() -> None:
    wanted = desired(OURS)
    live = as_the_api_server_returns_it(wanted)
    live["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["maxProperties"] = 3.0
    step = plan(live, wanted)
    assert step.action == "update"
    assert step.body is not None and step.body["spec"]["versions"] == wanted["spec"]["versions"]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("0.1.0", (0, 1)),
        ("v1.2.3", (1, 2, 3)),
        ("1.2", (1, 2)),
        ("1.2.0rc1", (1, 2)),
        ("10.0.1", (10, 0, 1)),
        ("", None),
        ("garbage", None),
    ],
)
def test_release_numbers(text: str, parsed: tuple[int, ...] | None) -> None:
    assert release(text) == parsed


@pytest.mark.parametrize("theirs", ["garbage", "", "0+unknown"])
def test_a_version_annotation_that_says_nothing_is_not_a_downgrade(theirs: str) -> None:
    live = as_the_api_server_returns_it(older("0.0.1"))
    live["metadata"]["annotations"][VERSION_ANNOTATION] = theirs
    assert plan(live, desired(OURS)).action == "update"


def test_ten_is_newer_than_nine() -> None:
    """Release numbers compare as numbers, not as text ("10.0.0" < "9.0.0" as strings)."""
    live = as_the_api_server_returns_it(older("10.0.0"))
    assert plan(live, desired("9.0.0")).action == "refuse"
    assert plan(as_the_api_server_returns_it(older("9.0.0")), desired("10.0.0")).action == "update"


# The hook in the chart: when it runs, what it may do, and that this is exactly what the command does.

HOOK = "nf-nodefabric-crd-upgrade"
HOOK_GRANTS = {
    (CLUSTER, "apiextensions.k8s.io", "customresourcedefinitions", NAME): {"get", "patch"},
    (CLUSTER, "apiextensions.k8s.io", "customresourcedefinitions", PLG): {"get", "patch"},
    (CLUSTER, "apiextensions.k8s.io", "customresourcedefinitions", FTP): {"get", "patch"},
    # create cannot be narrowed to a name: RBAC checks it before the object has one.
    (CLUSTER, "apiextensions.k8s.io", "customresourcedefinitions", ""): {"create"},
}
VERB_OF = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def hook_objects(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["metadata"]["name"] == HOOK]


def test_the_hook_runs_before_install_and_upgrade_with_its_rbac_first(default_docs: list[Doc]) -> None:
    objects = {d["kind"]: d for d in hook_objects(default_docs)}
    assert set(objects) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"}
    weights = {}
    for kind, d in objects.items():
        notes = d["metadata"]["annotations"]
        assert notes["helm.sh/hook"] == "pre-install,pre-upgrade", kind
        # Deleted once it worked; kept after a failure (for its log) until the next run replaces it.
        assert notes["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded", kind
        weights[kind] = int(notes["helm.sh/hook-weight"])
    assert max(weights[k] for k in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")) < weights["Job"]


def test_the_hook_may_do_exactly_what_the_command_does(default_docs: list[Doc]) -> None:
    grants, builtin = grants_of(default_docs, HOOK)
    assert grants == HOOK_GRANTS
    assert builtin == set()
    # The name it may touch is the CRD the chart ships.
    shipped = one(default_docs, "CustomResourceDefinition", NAME)
    assert shipped["metadata"]["name"] == NAME


async def test_every_request_the_command_makes_is_one_the_hook_may_make(capsys) -> None:
    """Create, update after a conflict, unchanged and a dry run: every request, as verb and name, is
    granted by the hook's ClusterRole (nothing else is needed, so nothing else is granted)."""
    async with running_api() as k:
        await apply(k, capsys)
        await apply(k, capsys)
        k.api.put_object(CRDS, {**older("0.0.1"), "status": {"storedVersions": ["v1alpha1"]}})
        k.api.fail_next(1, 409)
        await apply(k, capsys)
        await apply(k, capsys, "--dry-run")
        used = {
            (VERB_OF[str(getattr(r.method, "value", r.method)).upper()], r.name or "")
            for r in k.requests(resource=CRDS)
        }
    assert used == {("get", NAME), ("patch", NAME), ("create", "")}
    for verb, name in used:
        assert verb in HOOK_GRANTS[(CLUSTER, "apiextensions.k8s.io", "customresourcedefinitions", name)]


def test_the_hook_job(default_docs: list[Doc]) -> None:
    job = one(default_docs, "Job", HOOK)
    spec = pod_spec(job)
    assert spec["serviceAccountName"] == HOOK
    assert spec["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] >= 1 and job["spec"]["activeDeadlineSeconds"] <= 600
    (c,) = spec["containers"]
    # The CRD comes from the image the agent runs: the schema of the code that writes the records.
    agent_image = pod_spec(one(default_docs, "DaemonSet", "nf-nodefabric-agent"))["containers"][0]["image"]
    assert c["image"] == agent_image
    assert c["args"][-2:] == ["crd", "apply"]
    assert c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["readOnlyRootFilesystem"]


def test_the_hook_can_be_turned_off(render) -> None:
    docs = render({"crds": {"upgradeJob": {"enabled": False}}})
    assert hook_objects(docs) == []
    # The CRD itself is still installed from crds/ on first install.
    assert of_kind(docs, "CustomResourceDefinition")


async def test_a_create_race_is_read_again(capsys) -> None:
    """Someone created the CRD between our read and our create (AlreadyExists is a 409)."""
    async with running_api() as k:
        k.api.fail_next(1, 409)
        code, out, _ = await apply(k, capsys)
        assert (code, out) == (0, f"created CustomResourceDefinition {NAME} (nodefabric {OURS})\n")
        assert (k.count("GET", CRDS), k.count("POST", CRDS)) == (2, 2)


async def test_a_crd_deleted_between_read_and_patch_is_read_again(capsys) -> None:
    async with running_api() as k:
        seed(k, older("0.0.1"))
        k.api.fail_next(1, 404)
        code, out, _ = await apply(k, capsys)
        assert code == 0 and out.startswith("updated ")
        assert (k.count("GET", CRDS), k.count("PATCH", CRDS)) == (2, 2)


@pytest.mark.parametrize(
    "spoil",
    [
        lambda c: c.update(spec="garbage"),
        lambda c: c.update(status=["not", "an", "object"]),
        lambda c: c.update(status={"storedVersions": "v1alpha1"}),
        lambda c: c.update(status={"storedVersions": [1, None]}),
        lambda c: c["metadata"].update(annotations=["x"]),
        lambda c: c["metadata"]["annotations"].update(
            {VERSION_ANNOTATION: "1.0\nrefused to update everything"}
        ),
        lambda c: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"].update(properties=["spec"]),
        lambda c: c["spec"].update(versions={"v1alpha1": {}}),
    ],
    ids=[
        "spec",
        "status",
        "stored-string",
        "stored-junk",
        "annotations",
        "version-newline",
        "props",
        "versions",
    ],
)
def test_a_hand_edited_crd_is_planned_not_a_traceback(spoil: Any) -> None:
    live = as_the_api_server_returns_it(older("0.0.1"))
    spoil(live)
    step = plan(live, desired(OURS))
    assert step.action in ("update", "refuse")
    assert "\n" not in step.detail
