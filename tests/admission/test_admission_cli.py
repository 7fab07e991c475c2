"""`nodefabric placement` as a process: two replicas against the embedded API, one Lease holder admits,
probes answer, a lost leader is replaced, bad flags are one line and exit 2."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from admission_world import GATE, NS, eventually, fleet, job, jobs_world
from test_webhook import certs, post, review  # noqa: F401 (certs: the fixture, shared)

from nodefabric_operator.admission import model
from nodefabric_operator.demo.kubeapi import running_api


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _placement(*argv: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "nodefabric_operator.console", "--log-format", "json", "placement", *argv]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def test_bad_flags_and_configs_are_one_line_and_exit_2(console, tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("groupReadyTimeoutSeconds: -1\n")
    for argv, words in [
        (["--tls-cert-file", "/x"], "--tls-cert-file and --tls-private-key-file go together"),
        (["--config", str(bad), "--kubeconfig", "/nonexistent"], "groupReadyTimeoutSeconds"),
        (["--kubeconfig", str(tmp_path / "missing")], "missing"),
    ]:
        done = console("--log-format", "json", "placement", *argv)
        assert done.returncode == 2, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and words in lines[0], lines


async def test_two_replicas_one_leader_admits_and_a_lost_leader_is_replaced(tmp_path: Path) -> None:
    async with jobs_world(*fleet(), job("a", 2), job("b", 2)) as (k, w):
        ports = [_free_port(), _free_port()]
        procs = [
            _placement(
                "--kubeconfig", k.kubeconfig, "--namespace", "nodefabric", "--identity", f"r{i}",
                "--lease-duration", "2", "--metrics-address", "127.0.0.1", "--metrics-port", str(port),
            )
            for i, port in enumerate(ports)
        ]  # fmt: skip
        try:
            for port in ports:
                status = 0
                for _ in range(300):
                    status, _ = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/readyz")
                    if status == 200:
                        break
                    await asyncio.sleep(0.1)
                assert status == 200
                assert (await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/healthz"))[0] == 200

            def holder() -> str:
                lease = k.api.stored("coordination.k8s.io/v1/leases", "nodefabric-placement", "nodefabric")
                return ((lease or {}).get("spec") or {}).get("holderIdentity") or ""

            leader = await eventually(holder, what="a leader")
            await w.create(*w.job_pods("a", 2))
            await eventually(lambda: all(GATE not in w.gates(f"a-{i}") for i in range(2)), what="a ungated")
            first = int(leader[1])
            metrics = (await asyncio.to_thread(_get, f"http://127.0.0.1:{ports[first]}/metrics"))[1]
            assert "nodefabric_placement_leader 1.0" in metrics
            assert 'nodefabric_placement_groups{phase="Admitted"} 1.0' in metrics
            assert "nodefabric_placement_admission_duration_seconds_count 1.0" in metrics
            other = (await asyncio.to_thread(_get, f"http://127.0.0.1:{ports[1 - first]}/metrics"))[1]
            assert "nodefabric_placement_leader 0.0" in other

            procs[first].kill()  # no release: the other waits out the Lease
            await asyncio.to_thread(procs[first].wait, 10)
            await eventually(lambda: holder() == f"r{1 - first}", timeout=20, what="the other replica leads")
            await w.create(*w.job_pods("b", 2))
            await eventually(lambda: all(GATE not in w.gates(f"b-{i}") for i in range(2)), what="b ungated")
            assert w.status(f"{NS}/job/b")["phase"] == "Admitted"
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:  # the API answers from this loop: never block it
                _, err = await asyncio.to_thread(proc.communicate, None, 20)
                if proc.returncode not in (0, -9):
                    raise AssertionError(err.decode()[-2000:])
        logs = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
        assert any(rec.get("message", rec.get("msg", "")) == "placement started" for rec in logs), logs[:5]


async def test_every_replica_serves_the_webhook_over_https(certs: dict[str, Path]) -> None:  # noqa: F811
    """The webhook (admission/webhook.py) mounted by `nodefabric placement`: a pod of a Job in an
    opted-in namespace gets the gate, over TLS with the given certificate, leader or not."""
    async with running_api([model.placement_crd()]) as k:
        metrics, hook = _free_port(), _free_port()
        proc = _placement(
            "--kubeconfig", k.kubeconfig, "--namespace", "nodefabric", "--metrics-address", "127.0.0.1",
            "--metrics-port", str(metrics), "--webhook-port", str(hook),
            "--tls-cert-file", str(certs["cert"]), "--tls-private-key-file", str(certs["key"]),
        )  # fmt: skip
        try:
            status, out = 0, {}
            for _ in range(300):
                try:
                    status, out = await post(
                        f"https://127.0.0.1:{hook}/mutate-pods", certs["ca"], json.dumps(review()).encode()
                    )
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            assert status == 200
            assert out["response"]["allowed"] is True and out["response"]["patchType"] == "JSONPatch"
            patch = json.loads(base64.b64decode(out["response"]["patch"]))
            assert patch == [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
        finally:
            proc.terminate()
            _, err = await asyncio.to_thread(proc.communicate, None, 20)
        assert proc.returncode == 0, err.decode()[-2000:]
