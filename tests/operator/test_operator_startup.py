"""Start-up problems of `nodefabric operator`, through the real command: each one is a single log line on
stderr and exit status 2, before kopf starts, never a traceback."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time

import pytest
from aiohttp import web
from operator_harness import Client, answering_api, eventually, running_operator
from operator_records import devices, gpu, group, nic, nvlink

from nodefabric_devicemanager import crd
from nodefabric_devicemanager.shell.signals import STOP_GRACE_S
from nodefabric_operator import cli
from nodefabric_operator.console import main
from nodefabric_operator.demo.kubeapi import running_api, write_kubeconfig


def run_operator(*args: str) -> int:
    return main(["operator", "--standalone", *args])


def one_line(err: str) -> str:
    """The operator's only line. The embedded API runs in this test's process, so its access log shares
    stderr here (never in a real deployment): those lines are not the operator's."""
    lines = [line for line in err.splitlines() if line.strip() and " aiohttp.access " not in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen()
    return s


@pytest.mark.parametrize("flag", ["--metrics-port", "--health-port"])
async def test_a_busy_port_is_one_line_and_exit_2(flag, capsys):
    async with running_api([crd.devices_crd()]) as k:
        with busy_port() as s:
            port = s.getsockname()[1]
            assert await asyncio.to_thread(run_operator, "--kubeconfig", k.kubeconfig, flag, str(port)) == 2
    line = one_line(capsys.readouterr().err)
    what = "metrics" if flag == "--metrics-port" else "health"
    assert '"operator cannot start"' in line
    assert f'error="cannot serve {what} on 0.0.0.0 port {port}: Address already in use"' in line, line


async def test_an_api_server_nobody_answers_is_one_line_and_exit_2(capsys, tmp_path):
    with busy_port() as s:
        port = s.getsockname()[1]  # closed again: nothing listens there any more
    kubeconfig = write_kubeconfig(f"http://127.0.0.1:{port}", str(tmp_path))
    started = time.monotonic()
    code = await asyncio.to_thread(run_operator, "--kubeconfig", kubeconfig, "--startup-timeout", "1")
    assert code == 2
    assert time.monotonic() - started < 30  # it gives up; it does not retry forever
    line = one_line(capsys.readouterr().err)
    assert f'cannot reach the API server at 127.0.0.1:{port} (for 1 s): Connection refused"' in line, line


async def refusing_api(tmp_path, status: int, *, discovery: bool = False) -> tuple[web.AppRunner, str]:
    """An API server that answers `status` to everything (but the Devices group's discovery, if asked)."""

    async def answer(request: web.Request) -> web.Response:
        if discovery and request.path == "/apis/worker.gpustack.ai/v1alpha1":
            return web.json_response(
                {"kind": "APIResourceList", "groupVersion": "worker.gpustack.ai/v1alpha1"}
            )
        return web.json_response({"kind": "Status", "code": status}, status=status)

    return await answering_api(tmp_path, answer)


@pytest.mark.parametrize("status", [401, 403])
async def test_credentials_the_api_server_refuses_are_one_line_and_exit_2(status, capsys, tmp_path):
    runner, kubeconfig = await refusing_api(tmp_path, status)
    try:
        assert await asyncio.to_thread(run_operator, "--kubeconfig", kubeconfig) == 2
    finally:
        await runner.cleanup()
    line = one_line(capsys.readouterr().err)
    assert f"refused our credentials (HTTP {status}" in line, line


@pytest.mark.parametrize(
    ("status", "sink", "message"),
    [
        (403, "nodefeature", "cannot list NodeFeatures in nodefabric: HTTP 403"),
        (
            404,
            "nodefeature",
            "cannot list NodeFeatures in nodefabric: HTTP 404 Not Found (install NFD, or run",
        ),
        (403, "node", "cannot list Nodes and Devices: HTTP 403"),
    ],
)
async def test_a_sink_the_operator_may_not_list_is_one_line_and_exit_2(
    status, sink, message, capsys, tmp_path
):
    """RBAC without list on the sink, or no NFD: said once at start, not once per record."""
    runner, kubeconfig = await refusing_api(tmp_path, status, discovery=True)
    try:
        code = await asyncio.to_thread(run_operator, "--kubeconfig", kubeconfig, "--sink", sink)
    finally:
        await runner.cleanup()
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert '"operator cannot start"' in line and message in line, line


async def test_an_api_server_without_the_devices_crd_is_one_line_and_exit_2(capsys):
    async with running_api() as k:  # no CRD installed
        assert await asyncio.to_thread(run_operator, "--kubeconfig", k.kubeconfig) == 2
    line = one_line(capsys.readouterr().err)
    assert "does not serve worker.gpustack.ai/v1alpha1: install the Devices CRD" in line, line


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x00\xff\xfe garbage \x80", id="binary"),
        pytest.param(b"- a\n- b\n", id="a-list"),
        pytest.param(b"apiVersion: v1\nkind: Config\nclusters: 7\n", id="wrong-types"),
        pytest.param(b"clusters: [\n", id="broken-yaml"),
        pytest.param(b"apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n", id="missing-context"),
    ],
)
def test_an_unusable_kubeconfig_is_one_line_and_exit_2(content, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    monkeypatch.setenv("KUBECONFIG", str(path))  # serve() sets it from --kubeconfig: restored after
    assert run_operator("--kubeconfig", str(path)) == 2
    line = one_line(capsys.readouterr().err)
    assert '"operator cannot start"' in line and "cannot use the kubeconfig" in line, line


def test_a_kubeconfig_that_is_a_directory_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path))
    assert run_operator("--kubeconfig", str(tmp_path)) == 2
    assert "cannot use the kubeconfig" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--domain", "gpustack.ai\n"], "label domain 'gpustack.ai\\\\n'"),
        (["--domain", "Not_A_Domain"], "label domain 'Not_A_Domain'"),
        # A valid label prefix (feature.<domain>: 252 characters) whose managed-labels annotation's
        # prefix (nodefabric.<domain>: 255) is past 253: the Node sink's every write was refused (422).
        (["--domain", "a" * 244], "does not make a valid annotation prefix"),
        (["--namespace", "Bad_NS"], "--namespace 'Bad_NS' is not a namespace name"),
        (["--namespace", "ns\n"], "is not a namespace name"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(args, message, capsys):
    assert run_operator(*args) == 2
    line = one_line(capsys.readouterr().err)
    assert '"invalid arguments"' in line and message in line, line


@pytest.mark.parametrize(
    "args",
    [
        ["--metrics-port", "0"],
        ["--metrics-port", "65536"],
        ["--health-port", "-1"],
        ["--health-port", "\uff18\uff10"],  # fullwidth digits: int() takes them, a port number is ASCII
        ["--startup-timeout", "nan"],
        ["--startup-timeout", "-1"],
        ["--sink", "configmap"],
    ],
)
def test_a_malformed_flag_is_refused_by_the_parser_with_exit_2(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_operator(*args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"argument {args[0]}" in err, err


async def test_an_api_server_that_never_answers_costs_the_startup_timeout_not_more(capsys, tmp_path):
    with busy_port() as s:  # listening, never accepting: the connection opens, no answer ever comes
        kubeconfig = write_kubeconfig(f"http://127.0.0.1:{s.getsockname()[1]}", str(tmp_path))
        started = time.monotonic()
        code = await asyncio.to_thread(run_operator, "--kubeconfig", kubeconfig, "--startup-timeout", "1")
        elapsed = time.monotonic() - started
    assert code == 2
    assert elapsed < 15, elapsed  # one request of at most the time left, not 5 s per attempt forever
    line = one_line(capsys.readouterr().err)
    assert "cannot reach the API server at 127.0.0.1:" in line and "(for 1 s)" in line, line


async def test_sigterm_while_waiting_for_the_api_server_stops_it_at_once(tmp_path):
    """The start-up check retries for --startup-timeout; SIGTERM meanwhile (a rollout, a scale-down) ends
    it within the shell's grace and cleanly, before kopf ever owns the signals."""
    with busy_port() as s:
        port = s.getsockname()[1]  # closed again: nothing listens there any more
    kubeconfig = write_kubeconfig(f"http://127.0.0.1:{port}", str(tmp_path))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nodefabric_operator.console", "operator", "--standalone",
        "--kubeconfig", kubeconfig, "--startup-timeout", "600", "--log-level", "debug",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(60):
            while b"checking the API server" not in (line := await proc.stderr.readline()):
                # An operator that ended before checking (a module that is gone) fails here, not at the
                # timeout: end of output is b"", read again at once forever.
                assert line, f"the operator ended before checking the API server: {await proc.wait()}"
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = await asyncio.wait_for(proc.wait(), STOP_GRACE_S + 5)
        took = time.monotonic() - sent
        rest = (await proc.stderr.read()).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0 and took < STOP_GRACE_S, (code, took, rest)
    assert "stopping on signal" in rest and "did not stop in time" not in rest


def test_the_operator_without_a_usable_kubeconfig_exits_2_with_a_log_line(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "missing-kubeconfig"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(missing))  # serve() sets it from --kubeconfig: restored after
    assert main(["operator", "--standalone", "--kubeconfig", str(missing)]) == 2
    err = capsys.readouterr().err
    assert '"operator cannot start"' in err and "kube-config" in err, err
    assert "Traceback" not in err


async def test_the_operator_closes_its_api_client_when_it_stops(monkeypatch):
    clients = []

    def load_client(kubeconfig):
        api = real(kubeconfig)
        clients.append(api)
        return api

    real = cli.load_client
    monkeypatch.setattr(cli, "load_client", load_client)
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(
            devices("n1", interfaces=[nic()], groups=[group("nvidia", gpu(0, fabric=nvlink()))])
        )
        async with running_operator(k):
            await eventually(lambda: c.nodefeature("n1"))
            (api,) = clients
            assert len(api.rest_client.pool_manager.pools) > 0  # it did reach the API through this client
        assert len(api.rest_client.pool_manager.pools) == 0


def test_the_operator_collects_with_its_own_thresholds_once_it_serves(tmp_path, monkeypatch, capsys):
    """`run` sets the collector's thresholds before serving (cli.GC_THRESHOLDS: a first sync's full
    collections were a tenth of its CPU); arguments refused before that leave the process's alone."""
    import gc

    saved = gc.get_threshold()  # other tests here ran the operator in this process and left its own
    before = (700, 10, 10)  # CPython's
    gc.set_threshold(*before)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "missing-kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    try:
        assert run_operator("--namespace", "Bad_NS") == 2
        assert gc.get_threshold() == before
        assert run_operator("--kubeconfig", str(missing)) == 2
        assert gc.get_threshold() == cli.GC_THRESHOLDS != before
    finally:
        gc.set_threshold(*saved)
    capsys.readouterr()


async def garbling_api(tmp_path, page: bytes) -> tuple[web.AppRunner, str]:
    """An API server that serves the Devices group's discovery and answers every other request 200 with
    `page`."""

    async def answer(request: web.Request) -> web.Response:
        if request.path == "/apis/worker.gpustack.ai/v1alpha1":
            return web.json_response(
                {"kind": "APIResourceList", "groupVersion": "worker.gpustack.ai/v1alpha1"}
            )
        return web.Response(body=page, content_type="application/json")

    return await answering_api(tmp_path, answer)


@pytest.mark.parametrize(
    ("page", "said"),
    [
        (b"[]", "the API server answered a list, not an object"),
        (b"<html>proxy error</html>", "the API server's answer is not JSON"),
        (b'{"items":"n1"}', "whose items are a str, not a list"),
        (b'{"items":[],"metadata":{"continue":7}}', "whose continue token is a int, not text"),
    ],
)
@pytest.mark.parametrize("sink", ["nodefeature", "node"])
async def test_a_start_listing_answered_with_garbage_is_one_line_and_exit_2(
    page, said, sink, capsys, tmp_path
):
    """A list page that is no list (a proxy's page, a garbled answer): a start-up error that says what
    came, not a traceback."""
    runner, kubeconfig = await garbling_api(tmp_path, page)
    try:
        code = await asyncio.to_thread(run_operator, "--kubeconfig", kubeconfig, "--sink", sink)
    finally:
        await runner.cleanup()
    assert code == 2
    where = "NodeFeatures in nodefabric" if sink == "nodefeature" else "Nodes and Devices"
    line = one_line(capsys.readouterr().err)
    assert '"operator cannot start"' in line and f"cannot list {where}" in line and said in line, line
