"""hack/kind-e2e.sh needs Docker and kind, so it cannot run here. What can be checked is checked: the
script parses, the chart values it sets exist, the host tree it mounts makes our own code publish what the
script asserts, and its placement check passes a right placement and fails every wrong one."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chart_support import ROOT, container, load_hack, one, pod_spec

from nodefabric_devicemanager import cli

SCRIPT = ROOT / "hack" / "kind-e2e.sh"


def test_the_script_parses() -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text


def test_the_script_passes_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    done = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_the_chart_values_the_script_sets_render(render) -> None:
    """Every --set of the script's helm install is a chart value (the schema refuses unknown ones)."""
    text = SCRIPT.read_text()
    install = text[text.index('"$HELM" install nodefabric') :].split("--wait")[0]
    sets = re.findall(r"--set '?([\w.]+)=", install)
    assert {
        "image.registry",
        "image.repository",
        "agent.hostRoot",
        "extender.defaults.homogeneous",
        "extender.enabled",
        "scheduler.image.tag",
    } <= set(sets)
    docs = render(
        {
            "image": {"registry": "", "repository": "nodefabric", "tag": "e2e", "pullPolicy": "Never"},
            "agent": {"hostRoot": "/opt/nodefabric/host"},
            "extender": {"enabled": True, "defaults": {"homogeneous": []}},
            "scheduler": {"image": {"tag": "v1.33.1"}},
        },
        scheduler_tag=False,
    )
    agent = one(docs, "DaemonSet", "nf-nodefabric-agent")
    assert container(agent, "agent")["image"] == "nodefabric:e2e"
    # The script's group goes through the optional second scheduler: the install turns it on.
    assert one(docs, "Deployment", "nf-nodefabric-scheduler")
    paths = {v["name"]: v["hostPath"]["path"] for v in pod_spec(agent)["volumes"] if "hostPath" in v}
    assert (paths["host-sys"], paths["host-dev"]) == ("/opt/nodefabric/host/sys", "/opt/nodefabric/host/dev")
    assert "HOST_ROOT=/opt/nodefabric/host" in text


def test_the_mounted_host_yields_what_the_script_asserts(tmp_path: Path, capsys) -> None:
    """The generated tree, read by the real inventory and turned into labels by the real operator code:
    rdma.capable=true, rdma.numa=0_1, and usable endpoints (the allocatable the script expects)."""
    load_hack("kind_e2e").host(tmp_path / "host")
    assert (
        cli.main(["--log-level", "ERROR", "inventory", "--root", str(tmp_path / "host"), "-o", "json"]) == 0
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
    assert cli.main(["labels", "-f", str(path), "-o", "json"]) == 0
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
