"""The README's first command: the whole product on the embedded default, run once, output checked."""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import subprocess
import sys
import time

import pytest

# Under parallel workers this module's tests stay on one worker, so the demo (a module fixture) runs once.
pytestmark = pytest.mark.xdist_group("demo")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], str]:
    tmp = str(tmp_path_factory.mktemp("demo-tmp"))
    sockets_before = set(glob.glob("/tmp/dp-*"))
    result = subprocess.run(
        [sys.executable, "-m", "nodefabric_operator.console", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": tmp},
        check=False,
    )
    assert os.listdir(tmp) == [], "the demo left files behind"
    # A demo another test runs at the same moment (parallel workers) holds its own plugin directory for a
    # few seconds: a directory still there after that is a leftover.
    deadline = time.monotonic() + 30
    while (left := set(glob.glob("/tmp/dp-*")) - sockets_before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"the demo left its plugin directory behind: {left}"
    return result, result.stdout


def test_demo_succeeds_quietly(demo):
    result, out = demo
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == "", "the default demo prints its story on stdout and no component logs"
    assert "everything it started is stopped" in out


def _section(out: str, number: int) -> str:
    start = out.index(f"=== {number}.")
    end = out.find(f"=== {number + 1}.", start)
    return out[start : end if end > 0 else None]


def test_agent_writes_once_then_nothing(demo):
    agents = _section(demo[1], 2)
    assert agents.count("first pass: created; second pass: unchanged") == 4


def test_labels_follow_the_record(demo):
    labels = _section(demo[1], 3)
    nvl = labels[labels.index("nvl-7:") : labels.index("pcie-2s:")]
    assert "feature.gpustack.ai/fabric.domain=nvlink-5b0e112233445566778899aabbccddef-1" in nvl
    hgx = labels[labels.index("hgx-0:") : labels.index("nvl-7:")]
    assert "rdma.capable=true" in hgx and "rdma.distance=PIX" in hgx and "fabric.domain" not in hgx
    pcie = labels[labels.index("pcie-2s:") : labels.index("cpu-0:")]
    assert "rdma.capable=true" in pcie, "a broken NIC beside working ones keeps the node capable"
    assert labels[labels.index("cpu-0:") :].split("\n")[1].strip() == "(none)"


def test_kubectl_view_shows_the_printer_columns(demo):
    view = _section(demo[1], 3)
    header = next(line for line in view.splitlines() if line.startswith("NAME"))
    assert header.split()[:4] == ["NAME", "RDMA", "DISTANCE", "FABRIC"]
    rows = {
        line.split()[0]: line.split()
        for line in view.splitlines()[view.splitlines().index(header) + 1 :]
        if line
    }
    # What kubelet's keys draw on: 7 whole NICs and the 4 VFs of the eighth (which is not served whole).
    assert rows["hgx-0"][1:3] == ["11", "PIX"]
    assert rows["pcie-2s"][1] == "5"  # 5 NICs, one down: served (Unhealthy), and counted in FAILED
    assert rows["cpu-0"][1] == "0"


def test_each_family_allocates_its_own_endpoints(demo):
    plugin = _section(demo[1], 4)
    assert "device.gpustack.ai/rdma                capacity    7" in plugin  # NIC 7 serves only its VFs
    assert "device.gpustack.ai/rdma.shared         capacity  448" in plugin  # 7 x 64
    assert "device.gpustack.ai/rdma.partitioned    capacity    4" in plugin
    assert "env    NCCL_IB_HCA==mlx5_0,mlx5_1" in plugin
    assert "env    NCCL_IB_HCA==mlx5_8,mlx5_9" in plugin  # the VFs' own RDMA devices
    responses = plugin.split("granted")[1:]
    assert len(responses) == 3
    assert all(sum("rdma_cm" in line for line in r.splitlines()) == 1 for r in responses), "rdma_cm once each"


def test_training_group_lands_in_one_zone_with_its_reasons(demo):
    placement = _section(demo[1], 5)
    assert placement.count("-> us-east-1b-") == 8
    assert "the group landed in 1 zone(s): us-east-1b" in placement
    assert "phase Bound at level zone (us-east-1b)" in placement
    assert "fabric level skipped: largest fabric domain holds 4 now" in placement
    assert (
        "placement.gpustack.ai/decision:" in placement
        and "8 of 8 pods of group ml/explicit/train go to zone us-east-1b" in placement
    )


def test_the_group_goes_through_the_gate(demo):
    """The webhook gated each pod at creation; the placement controller released them whole."""
    placement = _section(demo[1], 5)
    assert "namespace ml opted in (label placement.gpustack.ai/admission=enabled)" in placement
    assert (
        "train-worker-0 created; the webhook gave it the gates ['placement.gpustack.ai/group']" in placement
    )
    assert (
        "train-worker-7 created; the webhook gave it the gates ['placement.gpustack.ai/group']" in placement
    )
    assert (
        "the placement controller admitted the whole group, pinned each pod and removed the gates"
        in placement
    )


def test_kubectl_get_placementgroups_shows_the_group(demo):
    placement = _section(demo[1], 5)
    table = placement[placement.index("$ kubectl get placementgroups -A") :].splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("NAMESPACE"))
    columns = table[header].split()
    assert columns == ["NAMESPACE", "NAME", "SIZE", "ADMITTED", "BOUND", "LEVEL", "LOCATION", "PHASE", "AGE"]
    row = table[header + 1].split()
    assert row[:8] == ["ml", "explicit-train", "8", "True", "True", "zone", "us-east-1b", "Bound"]


def test_dra_driver_publishes_hgx_slices_and_prepares_a_gpu_nic_claim(demo):
    dra = _section(demo[1], 6)
    assert "registered with kubelet's plugin watcher as rdma.gpustack.ai (v1.DRAPlugin)" in dra
    assert "pool hgx-0, generation 1, 11 devices" in dra  # 7 whole NICs and NIC 7's 4 VFs
    assert "pci-0000-1c-00-0  mlx5_0   pci0000:18  0     pf        PIX           ok" in dra
    assert "allocated gpu-0 (gpu.nvidia.com, pcieRoot pci0000:18) and pci-0000-1c-00-0" in dra
    assert '"NCCL_IB_HCA==mlx5_0"' in dra and '"path": "/dev/infiniband/uverbs0"' in dra
    assert "same answer True, spec files 1" in dra
    assert "NodeUnprepareResources: ok; spec files left: 0" in dra


async def test_ctrl_c_while_the_operator_starts_stops_everything_without_a_traceback(tmp_path):
    # The operator runs in a thread against the API served from the demo's loop. Stopping it used to
    # block that loop while joining it, so the operator's requests went unanswered: a traceback from its
    # thread, a 15 s wait, and sometimes the fixture hosts left behind.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodefabric_operator.console",
        "demo",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.stdout is not None
    try:
        seen = ""
        while "=== 3." not in seen:
            line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
            assert line, "the demo ended before the operator started"
            seen += line
        proc.send_signal(signal.SIGINT)
        rest, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130
    assert "Traceback" not in rest.decode() + err.decode(), err.decode()[-3000:]
    assert os.listdir(tmp_path) == [], "the fixture hosts are gone with it"


def test_topology_projections_for_kueue_kai_and_volcano(demo):
    topology = _section(demo[1], 7)
    assert "violations: 0" in topology
    levels = [line.split("nodeLabel: ")[1] for line in topology.splitlines() if "nodeLabel: " in line]
    assert levels == [
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "network.topology.nvidia.com/leaf",
        "feature.gpustack.ai/fabric.domain",
        "kubernetes.io/hostname",
    ]
    # nvl-7's NVLink domain is a tier-0 HyperNode inside its leaf.
    assert "fabric.nvlink-5b0e112233445566778899aabbccddef-1" in topology
    leaf = next(line for line in topology.splitlines() if line.strip().startswith("leaf.leaf-us-east-1a"))
    assert "HyperNode fabric.nvlink-5b0e112233445566778899aabbccddef-1" in leaf
