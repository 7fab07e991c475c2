"""`nodefabric agent` as a real process: SIGTERM ends it within seconds whatever a worker thread is stuck
in, and start-up problems are one line on stderr and exit 2."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pynvml
import pytest
from agent_fixtures import NODE, api_with_node, conditions, free_port, nodefabric_bin, stored, two_nic_host

from nodefabric_devicemanager.shell.signals import STOP_GRACE_S
from nodefabric_devicemanager.testing.accelerators import nvswitch_node
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder

# The real console script, with one vendor-library call made to hang: NVML's init never returns, as it
# does on a node whose GPU fell off the bus. The library edge is the only thing replaced.
HANGING_NVML = (
    "import sys, threading, pynvml\n"
    "pynvml.nvmlInit = lambda *a, **k: threading.Event().wait()\n"
    "from nodefabric_operator.console import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


async def _lines(stream: asyncio.StreamReader, into: list[dict]) -> None:
    while line := await stream.readline():
        try:
            into.append(json.loads(line))
        except ValueError:
            into.append({"msg": line.decode(errors="replace")})


async def _wait_for(lines: list[dict], msg: str, proc, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = next((line for line in lines if line.get("msg") == msg), None)
        if found is not None:
            return found
        assert proc.returncode is None, f"the agent exited early: {lines}"
        assert time.monotonic() < deadline, f"no {msg!r} in {lines}"
        await asyncio.sleep(0.05)


async def _stop_within_grace(proc) -> float:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(proc.wait(), STOP_GRACE_S + 5)
    return time.monotonic() - started


def _agent_args(root: Path, kubeconfig: str, *extra: str, health_port: int = 0) -> list[str]:
    return [
        "--log-format", "json", "agent", "--node-name", NODE, "--root", str(root), "--kubeconfig", kubeconfig,
        "--no-device-plugin", "--no-uevents", "--metrics-port", "0", "--health-port", str(health_port),
        "--bind-address", "127.0.0.1", *extra,
    ]  # fmt: skip


def _probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_sigterm_ends_the_agent_while_a_host_read_is_stuck_in_nvml(tmp_path):
    nvswitch_node(SysfsBuilder(tmp_path), state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
    port = free_port()
    async with api_with_node() as k:
        args = _agent_args(tmp_path, k.kubeconfig, "--read-timeout", "1", health_port=port)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HANGING_NVML, *args, stderr=asyncio.subprocess.PIPE
        )
        lines: list[dict] = []
        reader = asyncio.create_task(_lines(proc.stderr, lines))
        try:
            stuck = await _wait_for(lines, "the host read is stuck; failing the pass", proc)
            assert stuck["budget_s"] == 1.0 and stuck["level"] == "error"
            failed = await _wait_for(lines, "pass failed; the record was not brought up to date", proc)
            assert "did not finish within 1s" in failed["error"]
            # The failure is reported in the record, and nothing recorded was invented or dropped.
            cond = conditions(stored(k))["InterfacesEnumerated"]
            assert cond["status"] == "False" and cond["reason"] == "ReadTimeout"
            # The probes answer from memory on their own threads while the read stays stuck.
            status, reason = await asyncio.to_thread(_probe, port, "/readyz")
            assert status == 503 and "did not finish within 1s" in reason
            assert (await asyncio.to_thread(_probe, port, "/healthz"))[0] == 200

            took = await _stop_within_grace(proc)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await reader
        assert proc.returncode == 0, lines[-5:]
        assert took < STOP_GRACE_S, f"took {took:.1f}s"
        assert lines[-1]["msg"] == "stopped"


async def test_sigterm_ends_the_agent_while_an_api_call_hangs(tmp_path):
    two_nic_host(tmp_path)
    # An API server that accepts the connection and never answers.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{hole.getsockname()[1]}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        })
    )  # fmt: skip
    try:
        proc = await asyncio.create_subprocess_exec(
            nodefabric_bin(), *_agent_args(tmp_path, str(kubeconfig)), stderr=asyncio.subprocess.PIPE
        )
        lines: list[dict] = []
        reader = asyncio.create_task(_lines(proc.stderr, lines))
        try:
            await _wait_for(lines, "agent started", proc)
            await asyncio.sleep(0.5)  # the first pass is now waiting on the silent API server
            took = await _stop_within_grace(proc)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await reader
        assert took < STOP_GRACE_S, f"took {took:.1f}s"
        assert lines[-1]["msg"] == "stopped"
    finally:
        hole.close()


# --- start-up errors --------------------------------------------------------------------------------


async def _start(*argv: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    proc = await asyncio.create_subprocess_exec(
        nodefabric_bin(), *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBERNETES_SERVICE_HOST": "", **(env or {})},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, [line for line in (out + err).decode().splitlines() if line.strip()]


def _one_line_exit_2(code: int, lines: list[str], *words: str) -> None:
    assert code == 2, lines
    assert not any("Traceback" in line for line in lines), lines
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0], (word, lines)


@pytest.fixture
def kubeconfig(tmp_path) -> str:
    path = tmp_path / "kc"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return str(path)


async def test_a_busy_port_is_one_line_and_exit_2(tmp_path, kubeconfig):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        code, lines = await _start(
            "agent", "--node-name", NODE, "--root", str(tmp_path), "--kubeconfig", kubeconfig,
            "--no-device-plugin", "--bind-address", "127.0.0.1", "--metrics-port", str(busy.getsockname()[1]),
        )  # fmt: skip
    finally:
        busy.close()
    _one_line_exit_2(code, lines, "agent cannot start", "in use")


async def test_a_plugin_dir_under_a_regular_file_is_one_line_and_exit_2(tmp_path, kubeconfig):
    (tmp_path / "file").write_text("")
    code, lines = await _start(
        "agent", "--node-name", NODE, "--root", str(tmp_path), "--kubeconfig", kubeconfig,
        "--plugin-dir", str(tmp_path / "file" / "plugins"),
    )  # fmt: skip
    _one_line_exit_2(code, lines, "plugin directory", "Not a directory")


async def test_a_shared_count_kubelet_could_never_receive_is_one_line_and_exit_2(tmp_path, kubeconfig):
    code, lines = await _start(
        "agent", "--node-name", NODE, "--root", str(tmp_path), "--kubeconfig", kubeconfig,
        "--plugin-dir", str(tmp_path / "plugins"), "--shared-count", "1000000",
    )  # fmt: skip
    _one_line_exit_2(code, lines, "agent cannot start", "1000000")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--node-name", "Not_A_Node"], ["--node-name", "Not_A_Node"]),
        (["--driver-root", "/nonexistent"], ["--driver-root"]),
        (["--root", "/nonexistent"], ["--root"]),
    ],
)
async def test_bad_settings_are_one_line_and_exit_2(tmp_path, kubeconfig, argv, words):
    args = {
        "--node-name": NODE,
        "--root": str(tmp_path),
        "--kubeconfig": kubeconfig,
        "--no-device-plugin": None,
    }
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        args[flag] = value
    flat = [item for flag, value in args.items() for item in ((flag,) if value is None else (flag, value))]
    code, lines = await _start("agent", *flat)
    _one_line_exit_2(code, lines, *words)


async def test_a_kubeconfig_with_a_credential_plugin_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "kc"
    path.write_text(
        "apiVersion: v1\ncurrent-context: c\nclusters: [{name: c, cluster: {server: 'https://x'}}]\n"
        "users: [{name: u, user: {exec: {command: aws}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    code, lines = await _start(
        "agent", "--node-name", NODE, "--root", str(tmp_path), "--kubeconfig", str(path)
    )
    _one_line_exit_2(code, lines, "'exec'", "token")


@pytest.mark.parametrize(
    "flag",
    [
        "--interval=abc",
        "--interval=0",
        "--interval=inf",
        "--interval=nan",
        "--metrics-port=70000",
        "--shared-count=-1",
    ],
)
async def test_bad_flag_values_exit_2_naming_the_flag_without_a_traceback(tmp_path, flag):
    code, lines = await _start("agent", "--node-name", NODE, "--root", str(tmp_path), flag)
    assert code == 2 and not any("Traceback" in line for line in lines)
    assert flag.split("=")[0] in lines[-1], lines
