"""`nodefabric slices` and `nodefabric draplugin` as a user runs them (real processes, real sockets, real
HTTP to the embedded API)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from dra_helpers import DRIVER, NODE, Dirs, hgx, live_slices, put_claim, result

from nodefabric_devicemanager.testing import scenarios
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.testing.drakubelet import DraKubelet
from nodefabric_operator.demo.kubeapi import RunningAPI

NODEFABRIC = (sys.executable, "-m", "nodefabric_operator.console")


def nodefabric(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`nodefabric` as a user runs it: a real process (each command keeps one such smoke test)."""
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    return subprocess.run(
        [*NODEFABRIC, *args], capture_output=True, text=True, check=False, timeout=120, input=stdin, env=env
    )


@pytest.fixture
def cli(console):
    """`nodefabric` in this process (see tests/conftest.py), without a NODE_NAME from the environment."""
    return lambda *args, stdin=None: console(*args, stdin=stdin, unset=("NODE_NAME",))


# --- slices ----------------------------------------------------------------------------------------------


def test_slices_prints_what_the_host_would_publish(tmp_path: Path) -> None:
    hgx(tmp_path / "h")
    done = nodefabric("slices", "--root", str(tmp_path / "h"), "--node-name", NODE, "-o", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["kind"] == "List"
    (item,) = doc["items"]
    assert item["kind"] == "ResourceSlice" and item["metadata"]["name"] == f"{NODE}-{DRIVER}-0"
    assert item["spec"]["pool"] == {"name": NODE, "resourceSliceCount": 1, "generation": 1}
    devices = {d["name"]: d["attributes"] for d in item["spec"]["devices"]}
    assert len(devices) == 11
    assert devices["pci-0000-1c-00-0"]["linkLayer"] == {"string": "Ethernet"}  # read from the host
    assert devices["pci-0000-1c-00-0"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:18"}
    as_yaml = nodefabric(
        "slices", "--root", str(tmp_path / "h"), "--node-name", NODE, "--domain", "example.com"
    )
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout)["items"][0]["spec"]["driver"] == "rdma.example.com"


def test_slices_from_a_devices_object(cli, tmp_path: Path) -> None:
    hgx(tmp_path / "h")
    record = cli("inventory", "--root", str(tmp_path / "h"), "-o", "json")
    obj = {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "Devices", "metadata": {"name": "gpu-3"}}
    obj["spec"] = json.loads(record.stdout)["spec"]
    done = cli("slices", "-f", "-", "-o", "json", stdin=json.dumps(obj))
    assert done.returncode == 0, done.stderr
    (item,) = json.loads(done.stdout)["items"]
    assert item["spec"]["nodeName"] == "gpu-3"
    assert all("linkLayer" not in d["attributes"] for d in item["spec"]["devices"])  # not in the record


def test_slices_of_a_host_that_could_not_be_read_is_a_failure_not_an_empty_list(cli, tmp_path: Path) -> None:
    scenarios.escaping_symlink(tmp_path / "h")
    done = cli("slices", "--root", str(tmp_path / "h"), "--node-name", NODE)
    assert done.returncode == 1
    assert done.stdout == ""
    assert "could not enumerate" in done.stderr


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--root", "/nonexistent-root", "--node-name", NODE], "not a directory"),
        (["--root", "/"], "no node name"),
        (["--root", "/", "--node-name", "Bad_Name"], "node name must be a DNS subdomain"),
        (["--root", "/", "--node-name", NODE, "--domain=-bad-"], "domain"),
        (["-f", "/nonexistent.yaml", "--node-name", NODE], "cannot read"),
        (["-f", "-", "--node-name", NODE], "cannot read"),
    ],
)
def test_slices_usage_errors_are_one_line_and_exit_2(cli, args: list[str], why: str) -> None:
    done = cli("slices", *args, stdin="- just\n- a list\n")
    assert done.returncode == 2
    assert why in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


# --- draplugin ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([], "no node name"),
        (["--node-name", NODE, "--cdi-dir", "relative"], "--cdi-dir must be an absolute path"),
        (["--node-name", NODE, "--registry-dir", os.fsdecode(b"/tmp/nf-registry-\xff")], "not valid UTF-8"),
        (["--node-name", NODE, "--root", "/nonexistent-root"], "not a directory"),
        (["--node-name", NODE, "--kubeconfig", "/nonexistent/kubeconfig"], "cannot reach the kubernetes api"),
        (["--node-name", NODE, "--interval", "0"], "must be between"),
        (["--node-name", NODE, "--metrics-port", "70000"], "not a TCP port"),
    ],
)
def test_draplugin_usage_errors_are_one_line_and_exit_2(cli, args: list[str], why: str) -> None:
    done = cli("draplugin", *args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    # One line saying why (argparse's own refusals come after its usage block, as for every command).
    assert why in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("flag", "path", "why"),
    [
        (
            "--registry-dir",
            "{file}",
            "the plugin-registration directory {file} exists and is not a directory",
        ),
        ("--cdi-dir", "{file}/cdi", "the CDI directory {file}/cdi cannot be created: Not a directory"),
        (
            "--plugin-dir",
            "{file}",
            f"the DRA socket directory {{file}}/{DRIVER} cannot be created: Not a directory",
        ),
    ],
)
def test_draplugin_refuses_directories_it_cannot_use_at_start(  # noqa: PLR0917 (fixtures and parameters)
    cli, tmp_path: Path, dirs: Dirs, flag: str, path: str, why: str
) -> None:
    file = tmp_path / "a-file"
    file.write_text("")
    done = cli(
        "draplugin", "--node-name", NODE, "--kubeconfig", "/none", "--plugin-dir", dirs.plugin,
        "--registry-dir", dirs.registry, "--cdi-dir", dirs.cdi, flag, path.format(file=file),
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()  # one structured line, as every command logs it
    assert '"draplugin cannot start"' in line and f'error="{why.format(file=file)}"' in line, line


def test_draplugin_with_its_metrics_port_taken_is_one_line_and_exit_2(
    cli, api: RunningAPI, dirs: Dirs
) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli(
            "draplugin", "--node-name", NODE, "--kubeconfig", api.kubeconfig, "--plugin-dir", dirs.plugin,
            "--registry-dir", dirs.registry, "--cdi-dir", dirs.cdi, "--metrics-port", str(port),
        )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert '"draplugin cannot start"' in line, line
    assert f'error="cannot serve metrics and health on 0.0.0.0 port {port}: Address already in use"' in line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""  # not listening yet


async def test_draplugin_standalone_publishes_prepares_and_stops_cleanly(
    tmp_path: Path, api: RunningAPI, dirs: Dirs
) -> None:
    hgx(tmp_path / "h")
    kubelet = DraKubelet(dirs.registry)
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        *NODEFABRIC, "draplugin", "--root", str(tmp_path / "h"), "--node-name", NODE,
        "--kubeconfig", api.kubeconfig, "--plugin-dir", dirs.plugin, "--registry-dir", dirs.registry,
        "--cdi-dir", dirs.cdi, "--interval", "0.5",
        "--bind-address", "127.0.0.1", "--metrics-port", str(port),
        stderr=(tmp_path / "stderr").open("w"),
    )  # fmt: skip
    try:
        plugin = await kubelet.wait_registered(DRIVER, timeout=60)
        async with asyncio.timeout(30):  # ready once kubelet's plugin watcher was told it is registered
            while (ready := await asyncio.to_thread(_get, port, "/readyz"))[0] != 200:
                await asyncio.sleep(0.1)
        assert ready == (200, f"DRA driver: registered as {DRIVER}\n")
        assert await asyncio.to_thread(_get, port, "/healthz") == (200, "ok\n")
        async with asyncio.timeout(30):
            while not live_slices(api):
                await asyncio.sleep(0.1)
        assert len(live_slices(api)[0]["spec"]["devices"]) == 11
        claim = put_claim(api, "standalone", [result("pci-0000-1c-00-0")])
        ref = ClaimRef("ml", claim["metadata"]["uid"], "standalone")
        answer = await plugin.prepare(ref)
        assert answer[ref.uid].error == ""
        assert os.listdir(dirs.cdi) == [f"{DRIVER}-nic_{ref.uid}.json"]
        assert await plugin.unprepare(ref) == {ref.uid: ""}
        status, text = await asyncio.to_thread(_get, port, "/metrics")
        assert status == 200 and "nodefabric_dra_prepares_total" in text
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=20) == 0
        assert os.listdir(dirs.registry) == []
        # The checkpoint directory stays (a claim's file until it is unprepared); the sockets are gone.
        assert sorted(os.listdir(f"{dirs.plugin}/{DRIVER}")) == ["checkpoint.d"]
        assert os.listdir(f"{dirs.plugin}/{DRIVER}/checkpoint.d") == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await kubelet.stop()
    assert "Traceback" not in (tmp_path / "stderr").read_text()


@pytest.mark.smoke
def test_slices_of_this_machine(cli) -> None:
    done = cli("slices", "--root", "/", "--node-name", "smoke-0")
    # Read or not read, it says which: a List (often empty here) or exit 1 with the reason.
    assert done.returncode in (0, 1), done.stderr
    if done.returncode == 0:
        assert yaml.safe_load(done.stdout)["kind"] == "List"
    else:
        assert "could not enumerate" in done.stderr
