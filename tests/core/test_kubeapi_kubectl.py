"""Real kubectl against the embedded API, as a user explores the demo (skipped where kubectl is absent)."""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from nodefabric_devicemanager import crd
from nodefabric_operator.demo.kubeapi import RunningAPI, running_api

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")

DEVICES = "worker.gpustack.ai/v1alpha1/devices"
CAPABLE = "feature.gpustack.ai/rdma.capable"


def devices_crd(short_names: list[str] | None = None) -> dict[str, Any]:
    body = copy.deepcopy(crd.devices_crd())
    if short_names is not None:
        body["spec"]["names"]["shortNames"] = short_names
    return body


async def kubectl(k: RunningAPI, cache: Path, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        "--kubeconfig",
        k.kubeconfig,
        "--cache-dir",
        str(cache),
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else None,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def seed(k: RunningAPI, rdma: int = 8) -> None:
    k.api.put_object("v1/nodes", {"metadata": {"name": "gpu-1", "labels": {CAPABLE: "true"}}})
    k.api.put_object("v1/nodes", {"metadata": {"name": "cpu-1"}})
    k.api.put_object(
        DEVICES,
        {
            "metadata": {"name": "gpu-1"},
            "spec": {"interfaces": [{"name": "ib0"}]},
            "status": {"rdmaServed": rdma, "rdmaEndpoints": rdma + 1, "bestDistance": "PIX"},
        },
    )


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


async def test_get_nodes_by_label_and_the_core_group_in_discovery(tmp_path):
    async with running_api([devices_crd()]) as k:
        seed(k)
        rc, out, err = await kubectl(k, tmp_path, "get", "nodes", "-l", f"{CAPABLE}=true")
        assert rc == 0, err
        table = rows(out)
        assert table[0] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
        assert [r[0] for r in table[1:]] == ["gpu-1"]

        rc, out, err = await kubectl(k, tmp_path, "get", "--raw", "/api/v1")
        assert rc == 0, err
        assert json.loads(out)["groupVersion"] == "v1"  # "/v1" made every core resource unknown

        rc, out, _ = await kubectl(k, tmp_path, "get", "nodes", "-l", "bad key=x")
        assert rc != 0  # kubectl or the server refuses a selector outside the label syntax


async def test_custom_resources_by_plural_short_name_and_category_with_printer_columns(tmp_path):
    async with running_api([devices_crd(short_names=["device", "dev"])]) as k:
        seed(k)
        for name in ("devices", "device", "dev", "devices.worker.gpustack.ai", "nodefabric"):
            rc, out, err = await kubectl(k, tmp_path, "get", name)
            assert rc == 0, (name, err)
            header, *body = rows(out)
            assert header[:4] == ["NAME", "RDMA", "DISTANCE", "FABRIC"], name
            assert body[0][:3] in (["gpu-1", "8", "PIX"], ["devices.worker.gpustack.ai/gpu-1", "8", "PIX"])
        rc, out, _ = await kubectl(k, tmp_path, "get", "devices", "-o", "wide")
        assert rows(out)[0] == [
            "NAME", "RDMA", "DISTANCE", "FABRIC", "FAILED", "UNREAD", "USABLE", "INTERFACES", "AGE"
        ]  # fmt: skip
        # FABRIC, FAILED and UNREAD are unset: the server's cells are null, printed empty.
        assert rows(out)[1][1:5] == ["8", "PIX", "9", "ib0"]


async def test_watch_prints_each_change_as_it_happens(tmp_path):
    async with running_api([devices_crd()]) as k:
        seed(k, rdma=8)
        proc = await asyncio.create_subprocess_exec(
            "kubectl",
            "--kubeconfig",
            k.kubeconfig,
            "--cache-dir",
            str(tmp_path),
            "get",
            "devices",
            "-w",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        try:
            seen: list[list[str]] = []

            async def until(rdma: str) -> None:
                while not any(r[:2] == ["gpu-1", rdma] for r in seen):
                    line = await asyncio.wait_for(proc.stdout.readline(), 30)  # type: ignore[union-attr]
                    assert line, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
                    seen.append(line.decode().split())

            await until("8")
            assert seen[0][:2] == ["NAME", "RDMA"]
            k.api.put_object(DEVICES, {**k.api.stored(DEVICES, "gpu-1"), "status": {"rdmaServed": 6}})
            await until("6")
        finally:
            proc.terminate()
            await proc.wait()


async def test_wait_for_a_condition_a_field_and_a_deletion(tmp_path):
    async with running_api([devices_crd()]) as k:
        seed(k)
        waiting = asyncio.create_task(
            kubectl(
                k, tmp_path, "wait", "--for=condition=InterfacesEnumerated", "devices/gpu-1", "--timeout=30s"
            )
        )
        await asyncio.sleep(0.5)
        assert not waiting.done()
        condition = {"type": "InterfacesEnumerated", "status": "True", "reason": "Read", "message": ""}
        status = {"rdmaEndpoints": 8, "conditions": [condition]}
        k.api.put_object(DEVICES, {**k.api.stored(DEVICES, "gpu-1"), "status": status})
        rc, out, err = await waiting
        assert rc == 0, err
        assert "condition met" in out

        rc, out, err = await kubectl(
            k, tmp_path, "wait", "--for=jsonpath={.status.rdmaEndpoints}=8", "devices/gpu-1", "--timeout=30s"
        )
        assert rc == 0, err

        waiting = asyncio.create_task(
            kubectl(k, tmp_path, "wait", "--for=delete", "node/cpu-1", "--timeout=30s")
        )
        await asyncio.sleep(0.5)
        k.api.remove_object("v1/nodes", "cpu-1")
        rc, _, err = await waiting
        assert rc == 0, err


async def test_explain_reads_the_crd_schema_from_openapi_v3(tmp_path):
    async with running_api([devices_crd()]) as k:
        rc, out, err = await kubectl(k, tmp_path, "explain", "devices.spec")
        assert rc == 0, err
        assert "KIND:       Devices" in out and "VERSION:    v1alpha1" in out
        assert "FIELD: spec <Object>" in out
        assert "interfaces\t<[]Object>" in out
        rc, out, err = await kubectl(k, tmp_path, "explain", "devices.spec.interfaces.mtu")
        assert rc == 0, err
        assert "<integer>" in out


async def test_the_server_refuses_what_a_cluster_refuses_and_kubectl_says_why(tmp_path):
    async with running_api([devices_crd()]) as k:
        seed(k)
        # kubectl label checks syntax itself; a patch reaches the server, which refuses it.
        patch = json.dumps({"metadata": {"labels": {"bad key": "x"}}})
        rc, _, err = await kubectl(k, tmp_path, "patch", "node", "gpu-1", "--type=merge", "-p", patch)
        assert rc == 1
        assert 'The Node "gpu-1" is invalid: metadata.labels: Invalid value: "bad key"' in err

        manifest = {
            "apiVersion": "worker.gpustack.ai/v1alpha1",
            "kind": "Devices",
            "metadata": {"name": "gpu-2"},
            "spec": {"interfaces": [{"name": "ib0", "mtu": "jumbo"}]},
        }
        rc, _, err = await kubectl(k, tmp_path, "create", "-f", "-", stdin=json.dumps(manifest))
        assert rc == 1
        assert 'spec.interfaces[0].mtu: Invalid value: "string"' in err
        assert "must be of type integer" in err

        # kubectl asks for strict field validation: an unknown field is refused, not dropped.
        manifest["spec"] = {"interfaces": [{"name": "ib0", "speed": 400}]}
        rc, _, err = await kubectl(k, tmp_path, "create", "-f", "-", stdin=json.dumps(manifest))
        assert rc == 1
        assert 'unknown field "spec.interfaces[0].speed"' in err

        manifest["spec"] = {"interfaces": [{"name": "ib0", "mtu": 9000}]}
        rc, _, err = await kubectl(k, tmp_path, "create", "-f", "-", stdin=json.dumps(manifest))
        assert rc == 0, err
        assert k.api.stored(DEVICES, "gpu-2")["spec"]["interfaces"][0]["mtu"] == 9000


async def test_field_selectors_and_pages_as_kubectl_uses_them(tmp_path):
    async with running_api([devices_crd()]) as k:
        for i in range(1203):  # more than kubectl's 500-item pages
            k.api.put_object("v1/nodes", {"metadata": {"name": f"n-{i:04d}"}})
        rc, out, err = await kubectl(k, tmp_path, "get", "nodes", "--no-headers")
        assert rc == 0, err
        assert [r[0] for r in rows(out)] == [f"n-{i:04d}" for i in range(1203)]
        assert k.count("GET", "v1/nodes", verb="list") == 3

        rc, out, err = await kubectl(
            k, tmp_path, "get", "nodes", "--field-selector", "metadata.name=n-0042", "--no-headers"
        )
        assert rc == 0, err
        assert [r[0] for r in rows(out)] == ["n-0042"]
        rc, _, err = await kubectl(k, tmp_path, "get", "nodes", "--field-selector", "spec.podCIDR=x")
        assert rc == 1
        assert "field label not supported: spec.podCIDR" in err


async def test_describe_label_annotate_and_delete_round_trip(tmp_path):
    async with running_api([devices_crd()]) as k:
        seed(k)
        rc, _, err = await kubectl(k, tmp_path, "label", "node", "gpu-1", "rack=r7")
        assert rc == 0, err
        rc, _, err = await kubectl(k, tmp_path, "annotate", "devices", "gpu-1", "note=hello")
        assert rc == 0, err
        assert k.api.stored("v1/nodes", "gpu-1")["metadata"]["labels"]["rack"] == "r7"
        assert k.api.stored(DEVICES, "gpu-1")["metadata"]["annotations"] == {"note": "hello"}
        rc, out, err = await kubectl(k, tmp_path, "describe", "node", "gpu-1")
        assert rc == 0, err
        assert "rack=r7" in out
        rc, _, err = await kubectl(k, tmp_path, "delete", "devices", "gpu-1")
        assert rc == 0, err
        assert k.api.stored(DEVICES, "gpu-1") is None
