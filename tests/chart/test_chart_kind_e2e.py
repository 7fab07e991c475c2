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
    KUBE_VERSION,
    ROOT,
    configmap_yaml,
    container,
    load_hack,
    one,
    pod_spec,
    run_helm,
)

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
        pytest.skip("shellcheck is not installed (apt-get install shellcheck); bash -n still runs")
    done = subprocess.run([shellcheck, "-x", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


SCHEDULER_TAG = "v1.33.1"


def script_helm_args(**env: str) -> list[str]:
    """The nodefabric chart's flags as the script itself gives them (`--helm-args`, NUL-separated)."""
    done = subprocess.run(
        ["bash", str(SCRIPT), "--helm-args"],
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
    args = ["template", "nodefabric", str(CHART), "--namespace", "nodefabric", "--kube-version", KUBE_VERSION]
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
    assert "kind create cluster --name nodefabric-e2e --wait 120s --config" in "\n".join(calls)
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
    hosts = tmp_path / "nodefabric-e2e-nodefabric-e2e-hosts"
    for i in range(1, 5):
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
  version) [ "${2:-}" = -o ] && echo '{"serverVersion": {"gitVersion": "v1.33.1"}}'; exit 0 ;;
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
