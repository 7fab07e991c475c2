"""What the operator tells the person running it: metrics on `/metrics` only (no `_created` series, the
process's own figures), `/healthz` only on its port, and log lines that carry our fields and nothing of
kopf's settings, one per event."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import io
import json
import logging
import platform
import socket
import urllib.error
import urllib.request

import kopf
import pytest
from operator_harness import Client, eventually, running_operator, settle
from operator_records import devices, gpu, group, nic, nvlink

from nodefabric_devicemanager import crd, logs
from nodefabric_operator import kopflog
from nodefabric_operator.demo.kubeapi import running_api


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fetch(url: str, accept: str = "") -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, "", ""


def gpu_record(name: str):
    return devices(name, interfaces=[nic()], groups=[group("nvidia", gpu(0, fabric=nvlink()))])


async def test_metrics_only_on_metrics_health_only_on_healthz():
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await c.node("n1")
        await c.put_devices(gpu_record("n1"))
        mport, hport = free_port(), free_port()
        async with running_operator(k, metrics_port=mport, health_port=hport) as metrics:
            await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 1)
            await settle(k)
            got = {
                (port, path): await asyncio.to_thread(fetch, f"http://127.0.0.1:{port}{path}")
                for port, path in [
                    (mport, "/metrics"),
                    (mport, "/"),
                    (mport, "/healthz"),
                    (mport, "/metrics/x"),
                    (hport, "/healthz"),
                    (hport, "/metrics"),
                ]
            }
            open_metrics = await asyncio.to_thread(
                fetch, f"http://127.0.0.1:{mport}/metrics", "application/openmetrics-text"
            )
    status, content_type, body = got[mport, "/metrics"]
    assert status == 200 and content_type.startswith("text/plain")
    assert [status for status, _, _ in got.values()] == [200, 404, 404, 404, 200, 404]
    # No `_created` series for any counter or histogram, ours or the runtime's.
    assert "_created" not in body
    assert 'nodefabric_operator_reconciles_total{outcome="published"} 1.0' in body
    assert 'nodefabric_operator_api_requests_total{resource="nodefeatures",verb="create"} 1.0' in body
    assert 'nodefabric_operator_api_requests_total{resource="devices/status",verb="patch"} 1.0' in body
    assert "nodefabric_operator_records 1.0" in body
    assert "nodefabric_operator_labels_not_on_node 1.0" in body  # no nfd-master copies the labels here
    version = importlib.metadata.version("nodefabric")
    python = platform.python_version()
    assert (
        f'nodefabric_build_info{{component="operator",python_version="{python}",version="{version}"}} 1.0'
        in body
    )
    for process in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "python_gc_objects_collected",
    ):
        assert process in body
    assert json.loads(got[hport, "/healthz"][2]) == {"nodes": 1, "sinkObjects": 1}
    status, content_type, body = open_metrics
    assert content_type.startswith("application/openmetrics-text") and body.rstrip().endswith("# EOF")


async def test_metrics_and_health_can_share_one_port():
    async with running_api([crd.devices_crd()]) as k:
        port = free_port()
        async with running_operator(k, metrics_port=port, health_port=port):
            codes = [
                (await asyncio.to_thread(fetch, f"http://127.0.0.1:{port}{path}"))[0]
                for path in ("/metrics", "/healthz", "/")
            ]
    assert codes == [200, 200, 404]


@contextlib.contextmanager
def captured_logs(formatter: logging.Formatter, level: int = logging.INFO):
    """Every log line of this process, formatted as the command formats them."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def operator_lines(text: str, fmt: str = "text") -> list[str]:
    """The operator's lines: the embedded API (kmock, its aiohttp server) shares this test's process."""

    def logger(line: str) -> str:
        return str(json.loads(line)["logger"]) if fmt == "json" else line.split(" ")[2]

    return [line for line in text.splitlines() if not logger(line).startswith(("aiohttp.", "kmock"))]


@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_a_first_sync_logs_one_short_line_per_record(fmt):
    n = 6
    formatter = logs.JsonFormatter() if fmt == "json" else logs.KeyValueFormatter()
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        for i in range(n):
            await c.node(f"n{i}")
            await c.put_devices(gpu_record(f"n{i}"))
        with captured_logs(formatter) as out:
            async with running_operator(k) as metrics:
                await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == n)
                await settle(k)
    lines = operator_lines(out.getvalue(), fmt)
    published = [line for line in lines if "labels published" in line]
    assert len(published) == n  # one per record, and the rest are the start's few lines
    assert len(lines) <= n + 10, lines
    for line in lines:
        assert "OperatorSettings" not in line and "settings" not in line and "k8s_ref" not in line, line
    # Before: about 8 KB of log per record (kopf's settings object in every handler line).
    assert sum(len(line) + 1 for line in published) / n < 400
    if fmt == "json":
        record = json.loads(published[0])
        assert set(record) == {"ts", "level", "logger", "msg", "node", "target", "changes"}
        assert record["changes"].startswith("+fabric.domain=nvlink-")


def test_kopf_object_records_name_the_object_in_one_field():
    """kopf's own per-object warnings still reach the log, with the object and none of the settings."""
    kopflog.configure(logging.INFO)
    body = kopf.Body(
        {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "Devices", "metadata": {"name": "n1"}}
    )
    logger = kopf._core.actions.loggers.ObjectLogger(body=body, settings=kopf.OperatorSettings())
    with captured_logs(logs.KeyValueFormatter()) as out:
        logger.info("Handler 'on_devices' succeeded.")  # routine: dropped below DEBUG
        logger.warning("Handler 'on_devices' failed temporarily: boom")
    (line,) = out.getvalue().splitlines()
    assert line.endswith("\"Handler 'on_devices' failed temporarily: boom\" object=Devices/n1"), line
    assert len(line) < 160
