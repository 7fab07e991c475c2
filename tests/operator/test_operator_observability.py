"""What the operator tells the person running it: metrics on `/metrics` only (no `_created` series, the
process's own figures), `/healthz` only on its port, and log lines that carry our fields and nothing of
kopf's settings, one per event (a first sync's publications counted into one line)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import io
import json
import logging
import platform
import shlex
import socket
import urllib.error
import urllib.request

import kopf
import pytest
from operator_harness import Client, eventually, running_operator, settle
from operator_records import devices, gpu, gpu_record, group, nic, nvlink

from nodefabric_devicemanager import crd, logs
from nodefabric_devicemanager.models import LinkState
from nodefabric_operator import kopflog, progress
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


def fields(line: str, fmt: str) -> dict[str, str]:
    """A line's message and fields, from either format."""
    if fmt == "json":
        return {k: str(v) for k, v in json.loads(line).items()}
    ts, level, logger, rest = line.split(" ", 3)
    msg, _, tail = rest[1:].partition('" ')  # the message is JSON-quoted, the fields follow
    out = {"ts": ts, "level": level, "logger": logger, "msg": msg}
    for token in shlex.split(tail):
        key, _, value = token.partition("=")
        out[key] = value
    return out


async def seeded(k, c: Client, names: list[str]) -> None:
    for name in names:
        await c.node(name)
        await c.put_devices(gpu_record(name))


@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_a_first_sync_logs_one_summary_not_a_line_per_record(fmt, monkeypatch):
    """Records published for the first time (adding keys only) are counted into one line once they stop
    coming, which names the first few nodes; their own lines are DEBUG only."""
    monkeypatch.setattr(progress, "QUIET_S", 0.5)
    n = 7
    names = [f"n{i}" for i in range(n)]
    formatter = logs.JsonFormatter() if fmt == "json" else logs.KeyValueFormatter()
    async with running_api([crd.devices_crd()]) as k:
        await seeded(k, Client(k.kubeconfig), names)
        with captured_logs(formatter) as out:
            async with running_operator(k) as metrics:
                await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == n)
                await eventually(lambda: "labels published for the first time" in out.getvalue())
                await settle(k)
    lines = operator_lines(out.getvalue(), fmt)
    parsed = [fields(line, fmt) for line in lines]
    assert not [f for f in parsed if f["msg"] == "labels published"]
    summaries = [f for f in parsed if f["msg"] == "labels published for the first time"]
    assert len(summaries) == 1, lines
    (summary,) = summaries
    assert summary["level"] == "info" and summary["records"] == str(n)
    shown = summary["nodes"].split(" and ")[0].split()
    assert set(shown) <= set(names) and len(shown) == progress.NAMED
    assert summary["nodes"].endswith(f" and {n - progress.NAMED} more")
    assert float(summary["seconds"]) >= 0
    assert len(lines) <= 10, lines  # the start's few lines and the summary
    for line in lines:
        assert "OperatorSettings" not in line and "settings" not in line and "k8s_ref" not in line, line
    assert set(summary) == {"ts", "level", "logger", "msg", "records", "seconds", "nodes"}


async def test_each_record_s_first_publication_still_shows_at_debug():
    async with running_api([crd.devices_crd()]) as k:
        await seeded(k, Client(k.kubeconfig), ["n0", "n1"])
        with captured_logs(logs.JsonFormatter(), logging.DEBUG) as out:
            async with running_operator(k) as metrics:
                await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 2)
                await settle(k)
    lines = [json.loads(line) for line in operator_lines(out.getvalue(), "json")]
    own = [line for line in lines if line["msg"] == "labels published"]
    assert sorted(line["node"] for line in own) == ["n0", "n1"]
    assert {line["level"] for line in own} == {"debug"}
    assert all(line["changes"].startswith("+fabric.domain=nvlink-") for line in own)


async def test_a_progress_line_every_so_many_first_publications(monkeypatch):
    """Progress while a long first sync runs: a line each EVERY records, with the count so far; a stop
    before the quiet period ends still logs the summary of what was counted."""
    monkeypatch.setattr(progress, "EVERY", 2)
    monkeypatch.setattr(progress, "QUIET_S", 60.0)  # only the stop ends the count here
    n = 5
    async with running_api([crd.devices_crd()]) as k:
        await seeded(k, Client(k.kubeconfig), [f"n{i}" for i in range(n)])
        with captured_logs(logs.JsonFormatter()) as out:
            async with running_operator(k) as metrics:
                await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == n)
                await settle(k)
                assert "labels published for the first time" not in out.getvalue()
    lines = [json.loads(line) for line in operator_lines(out.getvalue(), "json")]
    progressed = [line["published"] for line in lines if line["msg"] == "first publications in progress"]
    assert progressed == [2, 4]
    (summary,) = [line for line in lines if line["msg"] == "labels published for the first time"]
    assert summary["records"] == n


async def test_a_publication_that_changes_a_published_record_keeps_its_own_line(monkeypatch):
    """Only first publications that add keys are counted together: a record whose labels change later
    (an RDMA link failing) gets its own INFO line, with what changed."""
    monkeypatch.setattr(progress, "QUIET_S", 0.3)
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await seeded(k, c, ["n0", "n1"])
        with captured_logs(logs.JsonFormatter()) as out:
            async with running_operator(k) as metrics:
                await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 2)
                await eventually(lambda: "labels published for the first time" in out.getvalue())
                failed = devices(
                    "n1",
                    interfaces=[nic(link=LinkState.FAILED)],
                    groups=[group("nvidia", gpu(0, fabric=nvlink()))],
                )
                await c.put_devices(failed)
                await eventually(lambda: metrics.reconciles.labels(outcome="published")._value.get() == 3)
                await settle(k)
    lines = [json.loads(line) for line in operator_lines(out.getvalue(), "json")]
    (own,) = [line for line in lines if line["msg"] == "labels published"]
    assert own["level"] == "info" and own["node"] == "n1"
    assert "-rdma.capable(was true)" in own["changes"]
    (summary,) = [line for line in lines if line["msg"] == "labels published for the first time"]
    assert summary["records"] == 2 and summary["nodes"] in ("n0 n1", "n1 n0")


async def test_a_failed_first_publication_keeps_its_own_error_line(monkeypatch):
    """A record that cannot be published (its Node does not exist) is named in an ERROR line of its own,
    and is not counted among the first publications."""
    monkeypatch.setattr(progress, "QUIET_S", 0.3)
    async with running_api([crd.devices_crd()]) as k:
        c = Client(k.kubeconfig)
        await seeded(k, c, ["n0"])
        await c.put_devices(gpu_record("ghost"), node_owner=False)  # no Node named ghost
        with captured_logs(logs.JsonFormatter()) as out:
            async with running_operator(k) as metrics:
                await eventually(lambda: metrics.reconciles.labels(outcome="error")._value.get() >= 1)
                await eventually(lambda: "labels published for the first time" in out.getvalue())
                await settle(k)
    lines = [json.loads(line) for line in operator_lines(out.getvalue(), "json")]
    errors = [line for line in lines if line["level"] == "error" and line.get("node") == "ghost"]
    assert errors and errors[0]["msg"] == "labels not published", lines
    summaries = [line for line in lines if line["msg"] == "labels published for the first time"]
    assert [(s["records"], s["nodes"]) for s in summaries] == [(1, "n0")]


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


async def test_first_publications_spread_out_but_never_quiet_make_one_summary(caplog):
    """The summary waits for a quiet period: records that keep coming, each within it of the last, are
    one summary however long they take (one timer re-armed, not one per record); a pause makes two."""
    # Records 0.05 s apart against a quiet period of 1 s: only a stall of the machine longer than that
    # would split them (the quiet period is a real timer).
    counted = progress.FirstPublications(every=1000, quiet_s=1.0)
    with caplog.at_level(logging.INFO, logger=progress.__name__):
        for i in range(6):
            counted.add(f"n{i}")
            await asyncio.sleep(0.05)
        await eventually(lambda: counted.count == 0)
        counted.add("late")
        await eventually(lambda: counted.count == 0)
        counted.flush()  # nothing counted: no line
    summaries = [r for r in caplog.records if r.getMessage() == "labels published for the first time"]
    assert [(r.records, r.nodes) for r in summaries] == [(6, "n0 n1 n2 n3 n4 and 1 more"), (1, "late")]
    assert 0.2 <= summaries[0].seconds <= 1.0  # from the first record to the last, not to the line


async def test_first_publications_that_never_stop_are_summed_up_at_least_every_so_often(caplog):
    """A slow trickle of new nodes, each within the quiet period of the last, still gets its summary
    lines (at least every `longest_s`), and together they count every record once."""
    counted = progress.FirstPublications(every=1000, quiet_s=0.2, longest_s=0.5)
    with caplog.at_level(logging.INFO, logger=progress.__name__):
        for i in range(14):
            counted.add(f"n{i}")
            await asyncio.sleep(0.1)
        await eventually(lambda: counted.count == 0)
    summaries = [r for r in caplog.records if r.getMessage() == "labels published for the first time"]
    assert len(summaries) >= 2
    assert sum(r.records for r in summaries) == 14
    # Each summary names its first five records in order: how many the first one holds depends on the
    # timers on a loaded machine, what it names does not.
    first = summaries[0]
    named = [f"n{i}" for i in range(min(first.records, 5))]
    more = f" and {first.records - 5} more" if first.records > 5 else ""
    assert first.nodes == " ".join(named) + more
