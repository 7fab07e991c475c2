"""hack/kind-e2e.sh needs Docker and kind, so it cannot run here. What can be checked is checked: the
script parses, the chart values it sets exist, the host tree it mounts makes our own code publish what the
script asserts, and its placement check passes a right placement and fails every wrong one."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import (
    CHART,
    ROOT,
    configmap_yaml,
    container,
    load_hack,
    of_kind,
    one,
    pod_spec,
    run_helm,
)

from nodefabric_operator import console
from nodefabric_operator.admission import model, owners
from nodefabric_operator.admission.webhook import WebhookConfig, gate_patch
from nodefabric_operator.extender.config import ExtenderConfig
from nodefabric_operator.extender.groups import group_of

SCRIPT = ROOT / "hack" / "kind-e2e.sh"


def script_setting(name: str) -> str:
    """A NAME=value line of the script (the value after ${NAME:-...} defaults is the default)."""
    found = re.search(rf"^{name}=(?:\$\{{{name}:-)?([^}}\s]+)", SCRIPT.read_text(), re.M)
    assert found, name
    return found.group(1)


# The Kubernetes version of the kind node image the script pins: the renders below are for it.
NODE_IMAGE = script_setting("KIND_NODE_IMAGE")
NODE_VERSION = re.search(r"^kindest/node:v(\d+\.\d+\.\d+)@sha256:[0-9a-f]{64}$", NODE_IMAGE)


def test_the_script_parses() -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text


def test_the_script_passes_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck); bash -n still runs")
    done = subprocess.run([shellcheck, "-x", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


assert NODE_VERSION, f"KIND_NODE_IMAGE {NODE_IMAGE} is not a kindest/node image pinned by digest"
KIND_KUBE = NODE_VERSION.group(1)
SCHEDULER_TAG = f"v{KIND_KUBE}"


def test_the_pinned_node_image_serves_dra() -> None:
    """resource.k8s.io/v1 is served from Kubernetes 1.34: the default node image must be at least that."""
    major, minor, _ = (int(x) for x in KIND_KUBE.split("."))
    assert (major, minor) >= (1, 34), NODE_IMAGE


def script_helm_args(mode: str = "--helm-args", **env: str) -> list[str]:
    """The nodefabric chart's flags as the script itself gives them (`--helm-args`, NUL-separated)."""
    done = subprocess.run(
        ["bash", str(SCRIPT), mode],
        env={"PATH": os.environ["PATH"], "SCHEDULER_TAG": SCHEDULER_TAG, **env},
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode().split("\0")
    assert out[-1] == "", "each flag ends with a NUL"
    return out[:-1]


def template(helm: Path, tmp_path: Path, flags: list[str]) -> subprocess.CompletedProcess[str]:
    """`helm template` with exactly these flags after the chart (run_helm checks the render against the
    API server's naming rules, as every chart test render is)."""
    args = ["template", "nodefabric", str(CHART), "--namespace", "nodefabric", "--kube-version", KIND_KUBE]
    return run_helm(helm, *args, *flags, values=None, tmp=tmp_path, kube_version=None)


def test_the_scripts_own_helm_values_render_what_it_asserts(helm: Path, tmp_path: Path) -> None:
    flags = script_helm_args()
    done = template(helm, tmp_path, flags)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    agent = one(docs, "DaemonSet", "nodefabric-agent")
    assert container(agent, "agent")["image"] == "nodefabric:e2e"
    assert container(agent, "agent")["imagePullPolicy"] == "Never"
    paths = {v["name"]: v["hostPath"]["path"] for v in pod_spec(agent)["volumes"] if "hostPath" in v}
    assert (paths["host-sys"], paths["host-dev"]) == ("/opt/nodefabric/host/sys", "/opt/nodefabric/host/dev")
    # The extender runs (whatever the chart's default), with no homogeneity key: kind nodes have no GPU label.
    scheduler = one(docs, "Deployment", "nodefabric-scheduler")
    assert container(scheduler, "kube-scheduler")["image"].endswith(f":{SCHEDULER_TAG}")
    config = configmap_yaml(docs, "nodefabric-placement-config", "extender.yaml")
    assert config["homogeneousKeys"] == []
    # The script installs with exactly these flags.
    text = SCRIPT.read_text()
    assert "mapfile -d '' -t VALUES < <(nodefabric_values)" in text
    install = text[text.index('"$HELM" upgrade --install nodefabric') :].split("--wait")[0]
    assert '"${VALUES[@]}"' in install and "--set" not in install
    # Group admission stays on (the chart's default): the webhook that gates, the process that admits.
    placement = one(docs, "Deployment", "nodefabric-placement")
    assert container(placement, "placement")["image"] == "nodefabric:e2e"
    webhook = one(docs, "MutatingWebhookConfiguration", "nodefabric-placement")
    opted_in = webhook["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    assert {"key": "placement.gpustack.ai/admission", "operator": "In", "values": ["enabled"]} in opted_in
    # The first install serves the device plugin alone: the allocatable checks count its resources.
    assert not of_kind(docs, "DeviceClass")
    assert "--serve" not in container(agent, "agent")["args"]


def test_the_dra_upgrade_renders_the_driver_beside_the_device_plugin(helm: Path, tmp_path: Path) -> None:
    """The upgrade's flags are the install's plus dra.enabled and dra.devicePlugin, rendered for the
    pinned node image's Kubernetes: the DeviceClasses the claim names, the agent serving both."""
    install, flags = script_helm_args(), script_helm_args("--helm-args-dra")
    assert flags[: len(install)] == install
    assert flags[len(install) :] == ["--set", "dra.enabled=true", "--set", "dra.devicePlugin=true"]
    done = template(helm, tmp_path, flags)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    classes = {d["metadata"]["name"]: d for d in of_kind(docs, "DeviceClass")}
    assert set(classes) == {"rdma.gpustack.ai", "pf.rdma.gpustack.ai", "vf.rdma.gpustack.ai"}
    args = container(one(docs, "DaemonSet", "nodefabric-agent"), "agent")["args"]
    assert args[args.index("--serve") + 1] == "both"
    assert args[args.index("--dra-cdi-dir") + 1] == "/var/run/cdi"
    # The upgrade keeps what the install set: admission, the extender, the image.
    one(docs, "Deployment", "nodefabric-placement")
    one(docs, "MutatingWebhookConfiguration", "nodefabric-placement")
    one(docs, "Deployment", "nodefabric-scheduler")
    # The claim's class is one the chart installs, in the API version the chart writes.
    claim = next(d for d in script_manifests() if d["kind"] == "ResourceClaim")
    wanted = claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
    assert wanted in classes and claim["apiVersion"] == classes[wanted]["apiVersion"] == "resource.k8s.io/v1"
    text = SCRIPT.read_text()
    upgrade = text[text.index('"$HELM" upgrade nodefabric') :].split("--wait")[0]
    assert '"${DRA_VALUES[@]}"' in upgrade and "--set" not in upgrade
    assert "mapfile -d '' -t DRA_VALUES < <(nodefabric_values; dra_values)" in text


def test_the_dra_upgrade_is_refused_below_1_34(helm: Path, tmp_path: Path) -> None:
    """Why the script pins a 1.34 node image and checks the server's version before it installs."""
    args = ["template", "nodefabric", str(CHART), "--namespace", "nodefabric", "--kube-version", "1.33.4"]
    done = run_helm(
        helm, *args, *script_helm_args("--helm-args-dra"), values=None, tmp=tmp_path, kube_version=None
    )
    assert done.returncode != 0 and "dra.enabled needs Kubernetes >= 1.34" in done.stderr


def script_manifests() -> list[dict[str, Any]]:
    """The objects the script creates, as it prints them (`--manifests`)."""
    env = {"PATH": os.environ["PATH"]}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--manifests"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def job_pod(job: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A pod of the Job as the Job controller creates it (its labels and controller reference)."""
    name = job["metadata"]["name"]
    meta = {
        "name": f"{name}-0-abcde",
        "namespace": namespace,
        "labels": {
            "batch.kubernetes.io/job-name": name,
            "job-name": name,
            "batch.kubernetes.io/job-completion-index": "0",
        },
        "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "j1", "controller": True}
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": copy.deepcopy(job["spec"]["template"]["spec"]),
    }


def test_the_gated_job_is_gated_only_in_its_opted_in_namespace_and_sized_by_the_job() -> None:
    """The Job the script creates, through the webhook's own rule and the admission's own sizing and
    naming: gated because its namespace opted in (not otherwise), a group of GROUP_SIZE from the Job,
    and its PlacementGroup is the one the script waits for."""
    job = next(d for d in script_manifests() if d["kind"] == "Job")
    namespace, group = script_setting("GATE_NS"), script_setting("GROUP")
    pod = job_pod(job, namespace)
    config = WebhookConfig()
    gated = gate_patch(pod, config, namespace_opted_in=True)
    gate = {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "placement.gpustack.ai/group"}]}
    assert gated.patch == (gate,), gated
    assert gate_patch(pod, config, namespace_opted_in=False).patch == ()
    spec = group_of(pod, ExtenderConfig())
    assert spec is not None and spec.key == f"{namespace}/job/{job['metadata']['name']}"
    assert model.object_name(spec.key) == group
    size, source = owners.job_size(job)
    assert size == int(script_setting("GROUP_SIZE")) == 8 and source.endswith("completions")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"device.gpustack.ai/rdma": 1}
    text = SCRIPT.read_text()
    assert 'kubectl label namespace "$GATE_NS" "placement.$DOMAIN/admission=enabled"' in text
    assert '--for=condition=AllBound "placementgroup/$GROUP"' in text


def test_the_webhook_probe_is_gated_in_any_namespace_and_only_dry_run() -> None:
    probe = next(d for d in script_manifests() if d["metadata"]["name"] == "webhook-probe")
    probe["metadata"]["namespace"] = "anywhere"
    assert gate_patch(probe, WebhookConfig(), namespace_opted_in=False).patch
    text = SCRIPT.read_text()
    assert text.count("webhook_probe_manifest") == 3  # defined, printed by --manifests, used in one dry run
    assert 'webhook_probe_manifest \\\n    | kubectl -n "$GATE_NS" create --dry-run=server' in text


def test_the_claims_pod_consumes_the_claim() -> None:
    docs = script_manifests()
    claim = next(d for d in docs if d["kind"] == "ResourceClaim")
    pod = next(d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == "nic-user")
    (ref,) = pod["spec"]["resourceClaims"]
    assert ref == {"name": "nic", "resourceClaimName": claim["metadata"]["name"]}
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "nic"}]
    # printenv and ls: the image is not pause.
    assert "busybox" in pod["spec"]["containers"][0]["image"]


def test_the_image_flags_follow_IMAGE(helm: Path, tmp_path: Path) -> None:
    """A local registry's host goes to image.registry (the schema refuses a host in image.repository)."""
    for image in (
        "localhost:5001/team/nodefabric:dev-1",
        "registry.local/nf:e2e",
        "localhost/nf:1",
        "team/nf:2",
    ):
        done = template(helm, tmp_path, script_helm_args(IMAGE=image))
        assert done.returncode == 0, done.stderr
        agent = one([d for d in yaml.safe_load_all(done.stdout) if d], "DaemonSet", "nodefabric-agent")
        assert container(agent, "agent")["image"] == image


@pytest.mark.parametrize(
    "image", ["nodefabric", "localhost:5001/nf", "localhost:5001:dev", "nf@sha256:abc", "a:b c", "a,b:c", ""]
)
def test_an_image_without_a_tag_is_refused_before_anything_runs(image: str) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "--helm-args"],
        env={"PATH": os.environ["PATH"], "SCHEDULER_TAG": SCHEDULER_TAG, "IMAGE": image},
        capture_output=True,
        text=True,
        check=False,
    )
    if image == "":
        # Empty is unset: the default image.
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1 and "is not REPOSITORY:TAG" in done.stderr


def test_an_empty_list_by_set_is_what_the_chart_refuses(helm: Path, tmp_path: Path) -> None:
    """Why the script sets no empty list with --set: helm makes `{}` a list of one empty string."""
    old = [*script_helm_args(), "--set", "extender.defaults.homogeneous={}"]
    done = template(helm, tmp_path, old)
    assert done.returncode != 0 and "does not match pattern" in done.stderr, done.stderr
    new = [*script_helm_args(), "--set-json", "extender.defaults.homogeneous=[]"]
    done = template(helm, tmp_path, new)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert configmap_yaml(docs, "nodefabric-placement-config", "extender.yaml")["homogeneousKeys"] == []


def test_the_script_sets_no_empty_list_or_map_with_set() -> None:
    code = "\n".join(line for line in SCRIPT.read_text().splitlines() if not line.lstrip().startswith("#"))
    assert "--set" in code
    assert not re.search(r"--set(-string)?\s+['\"]?[\w.]+=(\{\s*\}|\[\s*\])", code)


def test_every_label_and_allocatable_check_is_retried() -> None:
    """Labels and each device-plugin family reach the Node on their own time: none is read only once."""
    checks = [
        line
        for line in SCRIPT.read_text().splitlines()
        if re.search(r'\b(allocatable_is|label_is) "\$node"', line)
    ]
    assert len(checks) >= 5, checks  # rdma, rdma.shared, rdma.partitioned, rdma.capable, rdma.numa
    assert all(re.match(r"\s*retry \d+ ", line) for line in checks), checks
    families = {re.search(r'allocatable_is "\$node" (\S+)', c).group(1) for c in checks if "allocatable" in c}
    assert families == {"rdma", "rdma.shared", "rdma.partitioned"}


def test_the_host_tree_is_readable_by_all_whatever_the_umask(tmp_path: Path) -> None:
    """The agent runs as uid 0 with every capability dropped: it reads the tree as "others"."""
    done = subprocess.run(
        ["bash", "-c", f'umask 077 && "{sys.executable}" hack/kind_e2e.py host "{tmp_path}/h/worker-1"'],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": "devicemanager"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    root = tmp_path / "h" / "worker-1"
    seen = 0
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        want = 0o555 if path.is_dir() else 0o444
        assert mode & want == want, f"{path} is {oct(mode)}"
        seen += 1
    assert seen > 100


def test_the_mounted_host_yields_what_the_script_asserts(tmp_path: Path, capsys) -> None:
    """The generated tree, read by the real inventory and turned into labels by the real operator code:
    rdma.capable=true, rdma.numa=0_1, and usable endpoints (the allocatable the script expects)."""
    load_hack("kind_e2e").host(tmp_path / "host")
    assert (
        console.main(["--log-level", "ERROR", "inventory", "--root", str(tmp_path / "host"), "-o", "json"])
        == 0
    )
    record = json.loads(capsys.readouterr().out)
    assert record["status"]["rdmaEndpoints"] == 5
    devices = {
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "Devices",
        "metadata": {"name": "w1"},
        **record,
    }
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(devices))
    assert console.main(["labels", "-f", str(path), "-o", "json"]) == 0
    labels = json.loads(capsys.readouterr().out)
    assert labels["feature.gpustack.ai/rdma.capable"] == "true"
    assert labels["feature.gpustack.ai/rdma.numa"] == "0_1"


def test_the_host_command_needs_only_the_standard_library_and_the_source_tree(tmp_path: Path) -> None:
    """As the script runs it, PYTHONPATH=devicemanager; -S: no site-packages, so no installed project."""
    done = subprocess.run(
        [sys.executable, "-S", "hack/kind_e2e.py", "host", str(tmp_path / "h")],
        cwd=ROOT,
        env={"PYTHONPATH": "devicemanager"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "h/sys/class/infiniband").iterdir()) == [
        f"mlx5_{i}" for i in range(5)
    ]


# The placement check.

DOMAIN = "gpustack.ai"


def nodes() -> list[dict[str, Any]]:
    zones = {"w1": "zone-0", "w2": "zone-0", "w3": "zone-1", "w4": "zone-1"}
    return [{"metadata": {"name": n, "labels": {"topology.kubernetes.io/zone": z}}} for n, z in zones.items()]


def pods(on: list[str], location: str = "zone-0", level: str = "zone") -> list[dict[str, Any]]:
    out = []
    for i, node in enumerate(on):
        where = "any location" if level == "any" else f"{level} {location}"
        text = f"placed: 8 of 8 pods of group e2e/job/e2e-job go to {where} (nodes w1, w2,\nw3)"
        out.append(
            {
                "metadata": {
                    "name": f"worker-{i}",
                    "annotations": {f"placement.{DOMAIN}/decision": text},
                },
                "spec": {"nodeName": node},
            }
        )
    return out


def test_a_group_where_the_extender_said_passes() -> None:
    lines = load_hack("kind_e2e").placement(pods(["w1", "w2"] * 4), nodes(), DOMAIN, 8)
    assert len(lines) == 8 and lines[0] == "worker-0: w1, zone zone-0"


def test_a_group_placed_anywhere_passes_when_the_extender_said_any() -> None:
    group = pods(["w1", "w3"] * 4, level="any")
    assert len(load_hack("kind_e2e").placement(group, nodes(), DOMAIN, 8)) == 8


def spoil(how: str) -> list[dict[str, Any]]:
    group = pods(["w1", "w2"] * 4)
    if how == "outside":
        group[3]["spec"]["nodeName"] = "w3"
    elif how == "unbound":
        del group[0]["spec"]["nodeName"]
    elif how == "no decision":
        del group[5]["metadata"]["annotations"][f"placement.{DOMAIN}/decision"]
    elif how == "two locations":
        group[7] = copy.deepcopy(pods(["w3"], location="zone-1")[0])
    elif how == "too few":
        group = group[:7]
    return group


@pytest.mark.parametrize(
    ("how", "says"),
    [
        (
            "outside",
            "worker-3 is on w3 (topology.kubernetes.io/zone=zone-1), but the extender said zone zone-0",
        ),
        ("unbound", "worker-0 is not bound"),
        ("no decision", "worker-5 carries no placement.gpustack.ai/decision"),
        ("two locations", "several locations"),
        ("too few", "7 pods, not 8"),
    ],
)
def test_a_group_not_where_the_extender_said_fails(how: str, says: str) -> None:
    with pytest.raises(AssertionError, match=re.escape(says)):
        load_hack("kind_e2e").placement(spoil(how), nodes(), DOMAIN, 8)


def test_the_placement_command_exits_1_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "pods.json").write_text(json.dumps({"items": spoil("outside")}))
    (tmp_path / "nodes.json").write_text(json.dumps({"items": nodes()}))
    args = [sys.executable, str(ROOT / "hack" / "kind_e2e.py"), "placement"]
    done = subprocess.run(
        [*args, str(tmp_path / "pods.json"), str(tmp_path / "nodes.json"), "--size", "8"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and done.stderr.startswith("FAIL: worker-3 is on w3")


# The device nodes made on each worker.


def test_devnodes_names_every_node_the_fixture_host_has_with_its_sysfs_numbers(tmp_path: Path) -> None:
    kind_e2e = load_hack("kind_e2e")
    kind_e2e.host(tmp_path / "h")
    nodes = kind_e2e.devnodes(tmp_path / "h")
    assert nodes == [("rdma_cm", 10, 58), *((f"uverbs{i}", 231, 192 + i) for i in range(5))]
    assert [n for n, _, _ in nodes] == sorted(p.name for p in (tmp_path / "h/dev/infiniband").iterdir())


@pytest.mark.parametrize("spoil", ["no dev", "empty", "no number", "garbage number"])
def test_devnodes_refuses_a_tree_it_cannot_number(tmp_path: Path, spoil: str) -> None:
    kind_e2e = load_hack("kind_e2e")
    kind_e2e.host(tmp_path / "h")
    dev, verbs = tmp_path / "h/dev/infiniband", tmp_path / "h/sys/class/infiniband_verbs/uverbs0/dev"
    if spoil == "no dev":
        shutil.rmtree(dev)
    elif spoil == "empty":
        for path in dev.iterdir():
            path.unlink()
    elif spoil == "no number":
        verbs.chmod(0o644)
        verbs.unlink()
    else:
        verbs.chmod(0o644)
        verbs.write_text("231:x\n")
    with pytest.raises(ValueError, match=r"not a directory|is empty|no device number for uverbs0"):
        kind_e2e.devnodes(tmp_path / "h")


# The group admitted through the gate.

GATE_NODES = {"w1": "zone-0", "w2": "zone-0", "w3": "zone-1", "w4": "zone-1"}


def pinned_pod(name: str, node: str) -> dict[str, Any]:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "metadata": {
            "name": name,
            "annotations": {f"placement.{DOMAIN}/decision": "placed: 8 of 8 pods in zone"},
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "default-scheduler",
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            },
        },
        "status": {"phase": "Running"},
    }


def admitted(on: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    members = [
        {"pod": f"e2e-gate-{i}", "node": node, "bound": True, "ready": True} for i, node in enumerate(on)
    ]
    group = {
        "metadata": {"name": "job-e2e-gate"},
        "status": {
            "size": len(on),
            "members": members,
            "level": "zone",
            "location": GATE_NODES[on[0]],
            "conditions": [{"type": "Admitted", "status": "True"}, {"type": "AllBound", "status": "True"}],
        },
    }
    pods = [pinned_pod(m["pod"], m["node"]) for m in members]
    nodes = [
        {"metadata": {"name": n, "labels": {"topology.kubernetes.io/zone": z}}} for n, z in GATE_NODES.items()
    ]
    return group, pods, nodes


def test_a_group_on_its_assigned_nodes_in_one_zone_passes() -> None:
    lines = load_hack("kind_e2e").gate(*admitted(["w1", "w2"] * 4), DOMAIN, 8)
    assert len(lines) == 8 and lines[0] == "e2e-gate-0: w1, topology.kubernetes.io/zone=zone-0"


def spoil_gate(how: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    group, pods, nodes = admitted(["w1", "w2"] * 4)
    status = group["status"]
    if how == "not all bound":
        status["conditions"][1]["status"] = "False"
    elif how == "size":
        status["size"] = 7
    elif how == "unassigned":
        status["members"][2]["node"] = ""
    elif how == "elsewhere":
        pods[3]["spec"]["nodeName"] = "w1"
    elif how == "second scheduler":
        pods[4]["spec"]["schedulerName"] = "nodefabric-scheduler"
    elif how == "still gated":
        pods[1]["spec"]["schedulingGates"] = [{"name": f"placement.{DOMAIN}/group"}]
    elif how == "never pinned":
        del pods[6]["spec"]["affinity"]
    elif how == "pending":
        pods[0]["status"]["phase"] = "Pending"
    elif how == "two zones":
        status["members"][7]["node"] = "w3"
        pods[7] = pinned_pod("e2e-gate-7", "w3")
    elif how == "stranger":
        pods.append(pinned_pod("intruder", "w1"))
    elif how == "zone said":
        status["location"] = "zone-1"
    elif how == "no zone":
        del nodes[1]["metadata"]["labels"]["topology.kubernetes.io/zone"]
    return group, pods, nodes


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("not all bound", "is not AllBound"),
        ("size", "has size 7, not 8"),
        ("unassigned", "not 8 pods each to a node"),
        ("elsewhere", "e2e-gate-3 is on w1, but PlacementGroup job-e2e-gate assigned w2"),
        ("second scheduler", "e2e-gate-4 names the scheduler nodefabric-scheduler"),
        ("still gated", "e2e-gate-1 still carries the scheduling gate"),
        ("never pinned", "e2e-gate-6 was not pinned to w1"),
        ("pending", "e2e-gate-0 is Pending, not Running"),
        ("two zones", "spans the zones ['zone-0', 'zone-1']"),
        ("stranger", "are not the members"),
        ("zone said", "says zone zone-1"),
        ("no zone", "e2e-gate-1's node w2 has no topology.kubernetes.io/zone label"),
    ],
)
def test_a_group_not_where_its_placementgroup_said_fails(how: str, says: str) -> None:
    with pytest.raises(AssertionError, match=re.escape(says)):
        load_hack("kind_e2e").gate(*spoil_gate(how), DOMAIN, 8)


def test_the_gate_command_exits_1_with_the_reason(tmp_path: Path) -> None:
    group, pods, nodes = spoil_gate("elsewhere")
    (tmp_path / "g.json").write_text(json.dumps(group))
    (tmp_path / "p.json").write_text(json.dumps({"items": pods}))
    (tmp_path / "n.json").write_text(json.dumps({"items": nodes}))
    args = [
        sys.executable,
        str(ROOT / "hack" / "kind_e2e.py"),
        "gate",
        *(str(tmp_path / f) for f in ("g.json", "p.json", "n.json")),
    ]
    done = subprocess.run([*args, "--size", "8"], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stderr.startswith("FAIL: e2e-gate-3 is on w1"), done.stderr
    (tmp_path / "g.json").write_text("not json")
    done = subprocess.run([*args, "--size", "8"], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stderr.startswith("FAIL: "), done.stderr


# The DRA claim.

DRIVER = "rdma.gpustack.ai"


def resource_slices(node: str = "w1", count: int = 5) -> list[dict[str, Any]]:
    devices = [
        {"name": f"pci-0000-{i:02x}-00-0", "attributes": {"rdmaDevice": {"string": f"mlx5_{i}"}}}
        for i in range(count)
    ]
    other = {
        "spec": {"driver": "gpu.example.com", "nodeName": node, "pool": {"name": node}, "devices": devices}
    }
    ours = {"spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node}, "devices": devices}}
    return [other, ours]


def claim_and_pod(device: str = "pci-0000-02-00-0") -> tuple[dict[str, Any], dict[str, Any]]:
    claim = {
        "metadata": {"name": "nic"},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "nic", "driver": DRIVER, "pool": "w1", "device": device}]}
            },
            "reservedFor": [{"resource": "pods", "name": "nic-user", "uid": "p1"}],
        },
    }
    pod = {"metadata": {"name": "nic-user", "uid": "p1"}, "spec": {"nodeName": "w1"}}
    return claim, pod


def test_slices_counts_the_drivers_devices_in_the_nodes_pool() -> None:
    kind_e2e = load_hack("kind_e2e")
    assert len(kind_e2e.slices(resource_slices(), DRIVER, "w1", 5)) == 5
    with pytest.raises(AssertionError, match="publishes 5 devices in the pool of w1, not 4"):
        kind_e2e.slices(resource_slices(), DRIVER, "w1", 4)
    with pytest.raises(AssertionError, match="publishes 0 devices in the pool of w2"):
        kind_e2e.slices(resource_slices(), DRIVER, "w2", 5)


def test_a_claim_allocated_on_its_pods_node_and_seen_by_its_container_passes() -> None:
    claim, pod = claim_and_pod()
    (line,) = load_hack("kind_e2e").dra(
        claim, pod, resource_slices(), driver=DRIVER, hca="=mlx5_2\n", dev="rdma_cm\nuverbs2\n"
    )
    assert (
        line
        == "nic: rdma.gpustack.ai w1/pci-0000-02-00-0 (mlx5_2), NCCL_IB_HCA==mlx5_2, /dev/infiniband/uverbs2"
    )


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("unallocated", "allocated 0 devices, not 1"),
        ("other driver", "allocated by gpu.example.com, not rdma.gpustack.ai"),
        ("other pool", "from the pool w9, not the pod's node w1"),
        ("not reserved", "not reserved for nic-user"),
        ("unknown device", "pci-0000-99-00-0 is not a device"),
        ("other hca", "NCCL_IB_HCA is '=mlx5_0', not '=mlx5_2'"),
        ("no verbs", "the verbs devices [], not exactly one"),
        ("unbound", "nic-user is not bound"),
    ],
)
def test_a_claim_not_prepared_as_allocated_fails(how: str, says: str) -> None:
    claim, pod = claim_and_pod()
    hca, dev = "=mlx5_2", "rdma_cm uverbs2"
    result = claim["status"]["allocation"]["devices"]["results"][0]
    if how == "unallocated":
        del claim["status"]["allocation"]
    elif how == "other driver":
        result["driver"] = "gpu.example.com"
    elif how == "other pool":
        result["pool"] = "w9"
    elif how == "not reserved":
        claim["status"]["reservedFor"] = []
    elif how == "unknown device":
        result["device"] = "pci-0000-99-00-0"
    elif how == "other hca":
        hca = "=mlx5_0"
    elif how == "no verbs":
        dev = "rdma_cm"
    else:
        del pod["spec"]["nodeName"]
    with pytest.raises(AssertionError, match=re.escape(says)):
        load_hack("kind_e2e").dra(claim, pod, resource_slices(), driver=DRIVER, hca=hca, dev=dev)


# The run's life cycle (cluster found or created, artifacts before cleanup, what is kept), with docker,
# kind, kubectl and helm replaced by recorders at their command-line edge: the script is real bash.

FAKES = {
    "kind": """
state="$(dirname "$0")/clusters"
case "$1 $2" in
  "get clusters") printf '%s\\n' ${FAKE_CLUSTERS:-}; cat "$state" 2>/dev/null || true ;;
  "create cluster") echo "$4" >>"$state" ;;
  "export logs") mkdir -p "$3" && echo node-logs >"$3/kind.log" ;;
  "get kubeconfig") echo "apiVersion: v1" ;;
esac
""",
    "kubectl": """
[ "$1" = version ] && exit 1
echo "kubectl output"
""",
    "docker": "",
    "helm": "",
}


def fake_run(
    tmp_path: Path, fakes: dict[str, str] | None = None, cwd: Path | None = None, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    for name, body in (FAKES | (fakes or {})).items():
        tool = bin_dir / name
        tool.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"{log}"\n{body}')
        tool.chmod(0o755)
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "TMPDIR": str(tmp_path),
            "PYTHON": sys.executable,
            "HELM": str(bin_dir / "helm"),
            "HOME": str(tmp_path),
            **env,
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=cwd,
    )
    return done, log.read_text().splitlines() if log.exists() else []


def kept_work(stderr: str) -> Path:
    found = re.search(r"work directory kept: (\S+)", stderr)
    assert found, stderr
    return Path(found.group(1))


def test_a_failed_run_saves_the_artifacts_before_deleting_the_cluster_it_created(tmp_path: Path) -> None:
    done, calls = fake_run(tmp_path)
    assert done.returncode != 0
    assert (
        f"kind create cluster --name nodefabric-e2e --image {NODE_IMAGE} --wait 120s --config"
        in "\n".join(calls)
    )
    export = next(i for i, c in enumerate(calls) if c.startswith("kind export logs"))
    delete = next(i for i, c in enumerate(calls) if c == "kind delete cluster --name nodefabric-e2e")
    assert export < delete, "the logs are exported before the cluster is deleted"
    assert any(c.startswith("kubectl get events -A") for c in calls[export:delete])
    work = kept_work(done.stderr)
    assert (work / "artifacts" / "kind" / "kind.log").is_file()
    assert (work / "artifacts" / "events.txt").read_text() == "kubectl output\n"
    # The host trees were built (readable by all) and are kept with the work directory on failure.
    hosts = tmp_path / "nodefabric-e2e-nodefabric-e2e-hosts"
    assert sorted(p.name for p in hosts.iterdir()) == [f"worker-{i}" for i in range(1, 5)]
    assert (work / "kind.yaml").read_text().count(f"hostPath: {hosts}/worker-") == 4


def test_a_rerun_reuses_a_kept_cluster_and_never_deletes_it(tmp_path: Path) -> None:
    hosts = tmp_path / "nodefabric-e2e-nodefabric-e2e-hosts"
    for i in range(1, 5):
        (hosts / f"worker-{i}" / "sys/class/infiniband").mkdir(parents=True)
    done, calls = fake_run(tmp_path, FAKE_CLUSTERS="other nodefabric-e2e")
    assert done.returncode != 0  # the fake cluster's kubectl version fails
    assert "reusing it" in done.stdout
    assert not any(c.startswith("kind create") for c in calls)
    assert "kind get kubeconfig --name nodefabric-e2e" in calls
    assert any(c.startswith("kind export logs") for c in calls)
    assert not any(c.startswith("kind delete") for c in calls), calls
    assert (hosts / "worker-1" / "sys/class/infiniband").is_dir(), "a kept cluster's host trees stay"


def test_a_kept_cluster_without_its_host_trees_is_not_used(tmp_path: Path) -> None:
    done, calls = fake_run(tmp_path, FAKE_CLUSTERS="nodefabric-e2e")
    assert done.returncode == 1
    assert "its host tree" in done.stderr and "kind delete cluster --name nodefabric-e2e" in done.stderr
    assert not any(c.startswith(("kind create", "kind delete")) for c in calls)


def test_an_old_python_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    old = tmp_path / "python3.9"
    old.write_text("#!/usr/bin/env bash\n[ \"$1\" = -V ] && echo 'Python 3.9.18' && exit 0\nexit 1\n")
    old.chmod(0o755)
    done, calls = fake_run(tmp_path, PYTHON=str(old))
    assert done.returncode == 1
    assert "needs Python >= 3.10" in done.stderr and "Python 3.9.18" in done.stderr
    assert calls == []


def test_keep_cluster_keeps_the_cluster_it_created_even_on_failure(tmp_path: Path) -> None:
    done, calls = fake_run(tmp_path, KEEP_CLUSTER="1")
    assert done.returncode != 0
    assert any(c.startswith("kind create cluster") for c in calls)
    assert any(c.startswith("kind export logs") for c in calls)
    assert not any(c.startswith("kind delete") for c in calls), calls
    assert "Cluster nodefabric-e2e kept: kind export kubeconfig --name nodefabric-e2e" in done.stdout


def without(tmp_path: Path, tool: str) -> str:
    """A PATH of the system's tools less one (links in a directory of their own)."""
    tools = tmp_path / f"without-{tool}"
    tools.mkdir()
    for system in (Path("/bin"), Path("/usr/bin")):
        for exe in system.iterdir():
            if exe.name != tool and not (tools / exe.name).exists():
                (tools / exe.name).symlink_to(exe)
    return f"{tmp_path / 'bin'}:{tools}"


def test_a_missing_make_is_said_before_a_cluster_is_made(tmp_path: Path) -> None:
    """The image is built with `make image`: without make the run used to fail minutes in, after the
    cluster was created."""
    done, calls = fake_run(tmp_path, PATH=without(tmp_path, "make"))
    assert done.returncode == 1
    assert "make is not on PATH" in done.stderr
    assert not any(c.startswith("kind create") for c in calls), calls


def test_docker_without_buildx_is_said_before_a_cluster_is_made(tmp_path: Path) -> None:
    docker = '[ "$1" = buildx ] && { echo "docker: \'buildx\' is not a docker command." >&2; exit 1; }\n'
    done, calls = fake_run(tmp_path, fakes={"docker": docker})
    assert done.returncode == 1
    assert "docker buildx" in done.stderr and "not a docker command" in done.stderr
    assert not any(c.startswith("kind create") for c in calls), calls


def test_a_relative_artifacts_directory_is_the_callers(tmp_path: Path) -> None:
    """The script works from the repository root; ARTIFACTS=out given from elsewhere is ./out of the
    caller, where the last line of a failed run says it is, not the repository's out/."""
    caller = tmp_path / "caller"
    caller.mkdir()
    done, _ = fake_run(tmp_path, cwd=caller, ARTIFACTS="nf-e2e-relative-out")
    assert done.returncode != 0
    assert (caller / "nf-e2e-relative-out" / "events.txt").is_file(), done.stderr
    assert f"Artifacts: {caller / 'nf-e2e-relative-out'}" in done.stderr
    assert not (ROOT / "nf-e2e-relative-out").exists()


def kept_host_trees(tmp_path: Path) -> Path:
    """A kept cluster's host trees: worker-1 a real fixture host (its device nodes are read), the others
    only what the reuse check looks at."""
    hosts = tmp_path / "nodefabric-e2e-nodefabric-e2e-hosts"
    load_hack("kind_e2e").host(hosts / "worker-1")
    for i in range(2, 5):
        (hosts / f"worker-{i}" / "sys/class/infiniband").mkdir(parents=True)
    return hosts


def test_a_docker_daemon_that_does_not_answer_is_said_and_a_kept_clusters_trees_stay(tmp_path: Path) -> None:
    """Docker not started (a laptop's Docker Desktop): `kind get clusters` then lists nothing, and the
    run used to take a kept cluster for gone, delete its host trees and fail at create."""
    hosts = kept_host_trees(tmp_path)
    docker = '[ "$1" = info ] && { echo "Cannot connect to the Docker daemon" >&2; exit 1; }\nexit 0\n'
    kind = FAKES["kind"].replace('"get clusters")', '"get clusters") [ -n "${FAKE_KIND_DOWN:-}" ] && exit 1;')
    done, calls = fake_run(
        tmp_path, fakes={"docker": docker, "kind": kind}, FAKE_CLUSTERS="nodefabric-e2e", FAKE_KIND_DOWN="1"
    )
    assert done.returncode == 1
    assert "Cannot connect to the Docker daemon" in done.stderr
    assert not any(c.startswith(("kind create", "kind delete")) for c in calls), calls
    assert (hosts / "worker-1" / "sys/class/infiniband").is_dir()


def test_a_kind_that_cannot_list_its_clusters_stops_the_run_before_anything_is_deleted(
    tmp_path: Path,
) -> None:
    hosts = kept_host_trees(tmp_path)
    kind = FAKES["kind"].replace(
        '"get clusters")', '"get clusters") echo "ERROR: failed to list clusters" >&2; exit 1;'
    )
    done, calls = fake_run(tmp_path, fakes={"kind": kind}, FAKE_CLUSTERS="nodefabric-e2e")
    assert done.returncode == 1
    assert "failed to list clusters" in done.stderr
    assert not any(c.startswith(("kind create", "kind delete")) for c in calls), calls
    assert (hosts / "worker-1" / "sys/class/infiniband").is_dir()


# A cluster that answers enough for the run to reach the chart's install (and fail after it).
ANSWERING_KUBECTL = """
case "$1" in
  version) [ "${2:-}" = -o ] && printf '{"serverVersion": {"gitVersion": "%s"}}\\n' "${FAKE_SERVER:-v1.34.0}"
    exit 0 ;;
  get) if [ "$2" = nodes ] && [ "$3" = -l ]; then printf 'w1\\nw2\\nw3\\nw4\\n'; exit 0; fi ;;
esac
echo "kubectl output"
"""


def test_a_release_an_interrupted_run_left_pending_is_uninstalled_before_the_install(tmp_path: Path) -> None:
    """Ctrl-C during `helm upgrade --install --wait` on a kept cluster leaves the release pending-install:
    every later `helm upgrade --install` then fails ("another operation is in progress")."""
    kept_host_trees(tmp_path)
    helm = (
        '[ "$1 $2 $3" = "-n nodefabric list" ] && [ -n "${FAKE_PENDING:-}" ] && echo nodefabric\n'
        '[ "$1 $2 $3" = "-n node-feature-discovery list" ] && [ -n "${FAKE_PENDING:-}" ] && echo nfd\n'
        "exit 0\n"
    )
    done, calls = fake_run(
        tmp_path,
        fakes={"kubectl": ANSWERING_KUBECTL, "helm": helm},
        FAKE_CLUSTERS="nodefabric-e2e",
        FAKE_PENDING="1",
    )
    assert "the CRD records version" in done.stderr, done.stdout + done.stderr  # got past the install
    uninstall = [i for i, c in enumerate(calls) if c.startswith("helm -n nodefabric uninstall nodefabric")]
    install = [i for i, c in enumerate(calls) if c.startswith("helm upgrade --install nodefabric")]
    assert uninstall and install and uninstall[0] < install[0], calls
    nfd_uninstall = [
        i for i, c in enumerate(calls) if c.startswith("helm -n node-feature-discovery uninstall nfd")
    ]
    nfd_install = [i for i, c in enumerate(calls) if c.startswith("helm upgrade --install nfd")]
    assert nfd_uninstall and nfd_install and nfd_uninstall[0] < nfd_install[0], calls
    assert "the nodefabric release is pending" in done.stdout


def test_a_release_not_pending_is_upgraded_in_place(tmp_path: Path) -> None:
    kept_host_trees(tmp_path)
    done, calls = fake_run(tmp_path, fakes={"kubectl": ANSWERING_KUBECTL}, FAKE_CLUSTERS="nodefabric-e2e")
    assert "the CRD records version" in done.stderr, done.stdout + done.stderr
    assert any(c.startswith("helm upgrade --install nodefabric") for c in calls)
    assert not any(" uninstall " in c for c in calls), calls


def test_a_cluster_older_than_1_34_is_refused_before_anything_is_installed(tmp_path: Path) -> None:
    """A kept cluster (or a KIND_NODE_IMAGE) older than 1.34 serves no resource.k8s.io/v1: said at once,
    not after the install and the group."""
    kept_host_trees(tmp_path)
    done, calls = fake_run(
        tmp_path, fakes={"kubectl": ANSWERING_KUBECTL}, FAKE_CLUSTERS="nodefabric-e2e", FAKE_SERVER="v1.33.4"
    )
    assert done.returncode == 1
    assert "the cluster runs Kubernetes v1.33.4; the DRA step needs >= 1.34" in done.stderr
    assert not any(c.startswith(("helm upgrade", "docker exec", "make")) for c in calls), calls


def test_a_new_cluster_gets_the_pinned_node_image(tmp_path: Path) -> None:
    _, calls = fake_run(tmp_path)
    create = next(c for c in calls if c.startswith("kind create cluster"))
    assert f"--image {NODE_IMAGE} " in create
    (tmp_path / "other").mkdir()
    _, calls = fake_run(tmp_path / "other", KIND_NODE_IMAGE="kindest/node:v1.35.0")
    assert "--image kindest/node:v1.35.0 " in next(c for c in calls if c.startswith("kind create cluster"))


def test_every_worker_gets_the_fixtures_device_nodes_before_the_install(tmp_path: Path) -> None:
    """What a grant or a CDI spec names must exist on the node: a character device per entry of the
    fixture's dev/infiniband, with its sysfs numbers, on each of the four workers, before the chart."""
    kept_host_trees(tmp_path)
    done, calls = fake_run(tmp_path, fakes={"kubectl": ANSWERING_KUBECTL}, FAKE_CLUSTERS="nodefabric-e2e")
    assert "the CRD records version" in done.stderr, done.stdout + done.stderr
    made = [c for c in calls if c.startswith("docker exec")]
    assert len(made) == 4 * 6, made
    assert (
        "docker exec w3 sh -c mkdir -p /dev/infiniband && { [ -c /dev/infiniband/uverbs4 ] || "
        "mknod -m 666 /dev/infiniband/uverbs4 c 231 196; }" in made
    )
    assert {c.split()[2] for c in made} == {"w1", "w2", "w3", "w4"}
    assert calls.index(made[-1]) < next(
        i for i, c in enumerate(calls) if c.startswith("helm upgrade --install nfd")
    )
