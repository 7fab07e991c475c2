"""`nodefabric demo --serve`: after the story the embedded API stays up for kubectl until Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

DEMO = [sys.executable, "-m", "nodefabric_devicemanager.cli", "demo"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
async def test_serve_keeps_the_api_up_for_kubectl_until_ctrl_c(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = await asyncio.create_subprocess_exec(
        *DEMO,
        "--serve",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        kubeconfig = ""
        while not kubeconfig:
            line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
            assert line, (await proc.stderr.read()).decode()[-3000:]
            if line.strip().startswith("export KUBECONFIG="):
                kubeconfig = line.strip().partition("=")[2]
        kubectl = await asyncio.create_subprocess_exec(
            "kubectl",
            "--kubeconfig",
            kubeconfig,
            "--cache-dir",
            str(tmp_path / "kube-cache"),
            "get",
            "devices",
            "--no-headers",
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(kubectl.communicate(), 60)
        assert sorted(row.split()[0] for row in out.decode().splitlines()) == [
            "cpu-0",
            "hgx-0",
            "nvl-7",
            "pcie-2s",
        ]
        proc.send_signal(signal.SIGINT)
        rest, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-3000:]
    assert err.decode() == "", "Ctrl-C is the way out, not an error"
    assert "stopping the embedded API" in rest.decode()
    assert "everything it started is stopped" in rest.decode()
    assert os.listdir(tmp) == [], "the kubeconfig and fixture hosts are gone with it"


def test_a_port_in_use_is_one_line_and_exit_2():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [*DEMO, "--serve", "--port", str(port)], capture_output=True, text=True, check=False
        )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"nodefabric demo: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
    assert result.stdout == ""
    bad = subprocess.run([*DEMO, "--port", "70000"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "not a port number" in bad.stderr and "Traceback" not in bad.stderr
