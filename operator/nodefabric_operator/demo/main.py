"""`nodefabric demo`: the whole product end to end on an embedded default, no cluster needed.

Every part runs as it does in a cluster and talks over its real interface: the agent and the operator
reach an in-process Kubernetes API over HTTPS through a kubeconfig (its token required), the device
plugin registers with a test kubelet over unix sockets, and the training group goes through the admission
webhook and the placement controller to a kube-scheduler stand-in. Only the outside world is simulated:
the nodes' /sys trees, the NVIDIA driver's answers, the API server and kube-scheduler.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import kmock
from kubernetes.client import ApiextensionsV1Api

from nodefabric_devicemanager import crd, inventory, models, nodeclient, vocabulary
from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.accelerators.ascend import NoAscend
from nodefabric_devicemanager.accelerators.nvidia import NoNvidia, Nvml
from nodefabric_devicemanager.agent import wiring
from nodefabric_devicemanager.agent.core import Agent, AgentConfig
from nodefabric_devicemanager.agent.kube import DevicesClient
from nodefabric_devicemanager.hostroot import HostRoot
from nodefabric_devicemanager.kubeclient import load_client
from nodefabric_devicemanager.testing import scenarios
from nodefabric_devicemanager.testing.accelerators import FakeNvml, RecordedGpu, nvml_bus_id, nvswitch_node
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.resources import PluginConfig
from nodefabric_deviceplugin.testing.kubelet import KubeletEmulator
from nodefabric_operator import cli as operator_cli
from nodefabric_operator.admission.model import placement_crd
from nodefabric_operator.demo import temporary
from nodefabric_operator.demo.dra import dra_driver
from nodefabric_operator.demo.fleet import PLACEMENT_GROUPS, place_group
from nodefabric_operator.demo.kubeapi import RunningAPI, as_table, running_api
from nodefabric_operator.demo.topology import show_topology
from nodefabric_operator.topology.shell import TopologyOptions

DEVICES = f"{models.GROUP}/{models.VERSION}/{models.PLURAL}"
NODEFEATURES = "nfd.k8s-sigs.io/v1alpha1/nodefeatures"
NAMESPACE = "nodefabric"
DOMAIN = vocabulary.DOMAIN
CLIQUE_UUID = bytes.fromhex("5b0e112233445566778899aabbccddef")


@dataclass
class FixtureNode:
    name: str
    what: str
    zone: str
    libraries: Libraries


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep", metavar="DIR", help="lay the fixture hosts out here and keep them afterwards"
    )
    parser.add_argument("--verbose", action="store_true", help="show every component's logs on stderr")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="after the story, keep the embedded API running for kubectl (prints a kubeconfig) until Ctrl-C",
    )
    parser.add_argument(
        "--port",
        type=_port,
        default=0,
        help="the embedded API's port on 127.0.0.1 (default: any free port)",
    )


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r} (0-65535)")
    return port


def _port_taken(port: int) -> str | None:
    """Why 127.0.0.1:port cannot be listened on, or None; checked before the story starts."""
    if not port:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as err:
            return err.strerror or str(err)
    return None


def run(args: argparse.Namespace) -> int:
    if not args.verbose:
        # The components log as they would in their pods; here the printed story is the output.
        logging.getLogger().setLevel(logging.ERROR)
        # gRPC's C core logs on its own, e.g. an INFO line when a plugin server stops while kubelet's
        # connection is still closing (a loaded machine makes that race likely): the same threshold.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    taken = _port_taken(args.port)
    if taken:
        print(f"nodefabric demo: cannot listen on 127.0.0.1:{args.port}: {taken}", file=sys.stderr)
        return 2
    started = time.monotonic()
    # SIGTERM stops the demo as Ctrl-C does (KeyboardInterrupt, caught by the CLI): everything it
    # started is stopped and its temporary directory removed, at any moment (the default action would
    # end the process on the spot and leave the directory behind).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.ExitStack() as stack:
        workdir = args.keep or temporary.made(stack, "nodefabric-demo-")
        asyncio.run(demo(Path(workdir), sys.stdout, serve=args.serve, port=args.port or None))
    print(f"\ndemo finished in {time.monotonic() - started:.1f} s; everything it started is stopped.")
    return 0


# --- the fixture hosts ------------------------------------------------------------------------------------


def _hgx(root: Path, *, fabric: bool) -> Libraries:
    """An 8-GPU NVSwitch board with one ConnectX-7 beside each GPU; NIC 7 is split into 4 SR-IOV VFs."""
    b = SysfsBuilder(root)
    state = 3 if fabric else 0  # NVML_GPU_FABRIC_STATE_COMPLETED / NOT_SUPPORTED
    nvml = nvswitch_node(b, cluster_uuid=CLIQUE_UUID if fabric else bytes(16), clique_id=1, state=state)
    b.sriov("0000:e0:00.0", vfs=4, numa=1, rdma_prefix="mlx5_", first_rdma=8, first_verbs=8)
    b.virtual("lo", mtu=65536, operstate="unknown", flags="0x9")
    b.rdma_cm()
    return Libraries(nvidia=Nvml(nvml), ascend=NoAscend())


def _pcie_with_broken_nic(root: Path) -> Libraries:
    """Two sockets, 8 PCIe GPUs (no NVLink: NVML says "not supported"), 5 NICs; mlx5_1 is down."""
    b = scenarios.gpu8(root)
    b.write("/sys/class/infiniband/mlx5_1/ports/1/state", "1: DOWN\n")
    b.write("/sys/class/infiniband/mlx5_1/ports/1/phys_state", "3: Disabled\n")
    nvml = FakeNvml([RecordedGpu(nvml_bus_id(gpu)) for gpu in scenarios.gpu8_gpus()])
    return Libraries(nvidia=Nvml(nvml), ascend=NoAscend())


def _cpu_only(root: Path) -> Libraries:
    b = SysfsBuilder(root)
    b.bridge("0000:00:02.0", host_bridge="pci0000:00")
    b.virtio("eth0", "0000:00:03.0", index=0)
    b.virtual("lo", mtu=65536, operstate="unknown", flags="0x9")
    return Libraries(nvidia=NoNvidia(), ascend=NoAscend())


def lay_out_hosts(workdir: Path) -> list[FixtureNode]:
    layouts: list[tuple[str, str, str, Callable[[Path], Libraries]]] = [
        (
            "hgx-0",
            "8x H100 NVSwitch board, 8 ConnectX-7 (one as 4 VFs)",
            "us-east-1a",
            functools.partial(_hgx, fabric=False),
        ),
        ("nvl-7", "8x GPU in a multi-node NVLink clique", "us-east-1a", functools.partial(_hgx, fabric=True)),
        (
            "pcie-2s",
            "two-socket PCIe server, 8 GPUs, NIC mlx5_1 link down",
            "us-east-1b",
            _pcie_with_broken_nic,
        ),
        ("cpu-0", "CPU-only node, one virtio NIC", "us-east-1b", _cpu_only),
    ]
    nodes = []
    for name, what, zone, build in layouts:
        nodes.append(FixtureNode(name, what, zone, build(workdir / name)))
    return nodes


# --- the run --------------------------------------------------------------------------------------------


def _section(out: TextIO, title: str) -> None:
    out.write(f"\n=== {title} {'=' * max(0, 96 - len(title))}\n")


@contextlib.asynccontextmanager
async def operator_running(kubeconfig: str, topology: TopologyOptions | None = None) -> AsyncIterator[None]:
    """The real kopf operator in its own thread and event loop, as it runs in its own pod. It is stopped
    and joined without blocking this loop: the embedded API is served from it, and an operator that is
    stopped mid-request (Ctrl-C while it starts) needs its answers to stop at all."""
    stop, ready = threading.Event(), threading.Event()
    opts = operator_cli.Options(
        sink="nodefeature",
        namespace=NAMESPACE,
        domain=DOMAIN,
        kubeconfig=kubeconfig,
        standalone=True,
        topology=topology,
    )
    failure: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(operator_cli.serve(opts, stop_flag=stop, ready_flag=ready))
        except BaseException as err:  # reported by the demo, not as a thread's traceback
            failure.append(err)

    thread = threading.Thread(target=main, name="operator", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 15)
    if failure:
        raise RuntimeError(f"the operator stopped: {failure[0]}") from failure[0]


async def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def _kubectl_get(
    k: RunningAPI,
    args: list[str],
    resource: str,
    columns: list[dict[str, Any]],
    *,
    all_namespaces: bool = False,
) -> str:
    """`kubectl get ...` against the embedded API; without kubectl, the same server-side table printed
    the way kubectl prints it."""
    shown = "$ kubectl " + " ".join(args) + "\n"
    kubectl = shutil.which("kubectl")
    if kubectl:
        proc = await asyncio.create_subprocess_exec(
            kubectl,
            "--kubeconfig",
            k.kubeconfig,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await proc.communicate()
        finally:
            if proc.returncode is None:
                # Cancelled (Ctrl-C, SIGTERM): kubectl stops with the story, and its pipes close while the
                # loop still runs; a transport collected after asyncio.run would print a traceback.
                proc.kill()
                await proc.communicate()
        return shown + out.decode()
    items = [
        obj.raw
        for key, obj in k.api.objects.items()
        if key[0] == kmock.resource(resource) and not obj.deleted
    ]
    table = as_table(items, columns, {})
    rows = [[c["name"].upper() for c in table["columnDefinitions"]]]
    rows += [["<none>" if v is None else str(v) for v in r["cells"]] for r in table["rows"]]
    if all_namespaces:
        rows[0].insert(0, "NAMESPACE")
        for row, item in zip(rows[1:], items, strict=True):
            row.insert(0, item.get("metadata", {}).get("namespace", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return (
        shown
        + "(kubectl not installed: the same table)\n"
        + "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
        + "\n"
    )


async def _kubectl_get_devices(k: RunningAPI) -> str:
    columns = crd.devices_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    return await _kubectl_get(k, ["get", "devices", "-o", "wide"], DEVICES, columns)


async def _kubectl_get_placementgroups(k: RunningAPI) -> str:
    columns = placement_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    args = ["get", "placementgroups", "-A"]
    return await _kubectl_get(k, args, PLACEMENT_GROUPS, columns, all_namespaces=True)


def _describe_allocation(family: str, ids: list[str], response: Any) -> str:
    container = response.container_responses[0]
    lines = [f"{family}: granted {', '.join(ids)}"]
    lines += [f"    device {d.host_path} -> {d.container_path} ({d.permissions})" for d in container.devices]
    lines += [f"    env    {key}={value}" for key, value in sorted(container.envs.items())]
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def device_plugin(agent: Agent, root: Path, plugin_dir: Path) -> AsyncIterator[KubeletEmulator]:
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    config = PluginConfig(domain=DOMAIN)
    manager = wiring.device_plugin(agent.subscribe, HostRoot.at(root), config, str(plugin_dir))
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        yield kubelet
    finally:
        await kubelet.stop()  # kubelet first, so its streams close cleanly rather than on a GOAWAY
        stop.set()
        await asyncio.wait_for(task, 10)


async def serve_until_stopped(k: RunningAPI, out: TextIO) -> None:
    """Keep the embedded API up for kubectl until SIGINT or SIGTERM, then return cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in before:
        loop.add_signal_handler(signum, stop.set)
    _section(out, "The embedded API stays up: explore it with kubectl (Ctrl-C stops it)")
    out.write(f"  API server  {k.url}\n  kubeconfig  {k.kubeconfig}\n\n")
    out.write(f"  export KUBECONFIG={k.kubeconfig}\n")
    for example in (
        "kubectl get devices -o wide",
        "kubectl get nodefeatures -A -o yaml      # the labels, published through NFD",
        "kubectl get nodes --show-labels",
        "kubectl explain devices.spec",
        "kubectl get devices -w",
    ):
        out.write(f"  {example}\n")
    out.flush()
    try:
        await stop.wait()
    finally:
        for signum, handler in before.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, handler)  # a second signal while stopping still stops cleanly
    out.write("\n  stopping the embedded API\n")


@contextlib.asynccontextmanager
async def _served_after(k: RunningAPI, out: TextIO, *, serve: bool) -> AsyncIterator[None]:
    """With --serve, the story's end is not the API's: it stays up until Ctrl-C."""
    yield
    if serve:
        await serve_until_stopped(k, out)


def _sigterm_as_sigint() -> None:
    """Inside the event loop, SIGTERM gets what Ctrl-C gets: asyncio's own handler, which cancels the
    story where it is waiting, so every context manager closes in order."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


async def _admission(out: TextIO, k: RunningAPI) -> None:
    _section(out, "5. Group admission: an 8-pod training group placed whole through the scheduling gate")
    out.write(await place_group(k))
    out.write("\n" + await _kubectl_get_placementgroups(k))


async def _dra(out: TextIO, agent: Agent, root: Path, k: RunningAPI) -> None:
    _section(out, "6. The DRA driver on hgx-0: its ResourceSlices, and a GPU + NIC claim prepared")
    out.write(await dra_driver(agent, root, k))


# One statement per step of the story, read top to bottom; each step's work is in its own function.
async def demo(workdir: Path, out: TextIO, *, serve: bool = False, port: int | None = None) -> None:
    _sigterm_as_sigint()
    _section(out, "1. Four fixture hosts (their /sys trees are laid out on disk)")
    nodes = lay_out_hosts(workdir)
    for node in nodes:
        out.write(f"  {node.name:8} {node.zone:11} {node.what}\n")

    # Only who can read the kubeconfig (0600, in a 0700 directory) can use the API: any other local user
    # gets 401. Over https, since kubectl sends a kubeconfig's token only over TLS.
    async with (
        running_api(directory=str(workdir), port=port, tls=True, token=secrets.token_urlsafe(32)) as k,
        _served_after(k, out, serve=serve),
    ):
        api = load_client(k.kubeconfig)
        # What `helm install` does first: the CRD, through the API like any other object.
        body: Any = crd.devices_crd()  # the client takes a plain dict as readily as its model class
        await asyncio.to_thread(ApiextensionsV1Api(api).create_custom_resource_definition, body)
        k.api.put_object("v1/namespaces", {"metadata": {"name": NAMESPACE}})
        for node in nodes:
            labels = {"topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": node.zone}
            k.api.put_object("v1/nodes", {"metadata": {"name": node.name, "labels": labels}})

        _section(out, "2. The node agent reads each host and publishes its Devices record")
        agents: dict[str, Agent] = {}
        for node in nodes:
            reader = functools.partial(inventory.read, libraries=node.libraries)
            agent = Agent(
                AgentConfig(node=node.name, root=str(workdir / node.name)),
                DevicesClient(nodeclient.load(k.kubeconfig)),
                reader=reader,
            )
            outcome = await agent.run_pass()
            again = await agent.run_pass()
            agents[node.name] = agent
            out.write(
                f"  {node.name:8} first pass: {outcome.result}; second pass: {again.result} (no write)\n"
            )

        async with operator_running(k.kubeconfig):
            _section(out, "3. The operator derives each node's labels and publishes them through NFD")

            def published() -> bool:
                for node in nodes:
                    obj = k.api.stored(DEVICES, node.name)
                    if not obj or "labelsPublishedTime" not in obj.get("status", {}):
                        return False
                return True

            await _wait(published, 30, "the operator to publish every node's labels")
            for node in nodes:
                feature = k.api.stored(NODEFEATURES, node.name, NAMESPACE)
                labels = (feature or {}).get("spec", {}).get("labels", {})
                shown = (
                    "\n".join(f"      {key}={value}" for key, value in sorted(labels.items()))
                    or "      (none)"
                )
                out.write(f"  {node.name}:\n{shown}\n")
            out.write("\n" + await _kubectl_get_devices(k))

        _section(out, "4. The device plugin on hgx-0 registers three resources with kubelet")
        with contextlib.ExitStack() as made:
            # In /tmp: unix socket paths are short. A second Ctrl-C (the first cancels the story at an
            # await) would otherwise land between mkdtemp and the removal, or in the removal itself.
            plugin_dir = Path(temporary.made(made, "dp-", "/tmp"))
            async with device_plugin(agents["hgx-0"], workdir / "hgx-0", plugin_dir) as kubelet:
                await agents["hgx-0"].run_pass()
                families = [
                    vocabulary.resource_name(f, DOMAIN)
                    for f in (
                        vocabulary.RESOURCE_RDMA,
                        vocabulary.RESOURCE_RDMA_SHARED,
                        vocabulary.RESOURCE_RDMA_PARTITIONED,
                    )
                ]
                for family in families:
                    await kubelet.wait_registered(family)
                    devices = await kubelet.wait_devices(family, lambda ds: len(ds) > 0)
                    state = kubelet.resources[family]
                    out.write(
                        f"  {family:38} capacity {state.capacity:4}  allocatable {state.allocatable:4}\n"
                    )
                out.write("\n  One container's allocation from each family:\n")
                for family in families:
                    devices = await kubelet.wait_devices(family, lambda ds: len(ds) > 0)
                    ids = sorted(d.ID for d in devices)[:2]
                    response = await kubelet.plugin(family).allocate(ids)
                    out.write("  " + _describe_allocation(family, ids, response).replace("\n", "\n  ") + "\n")

        await _admission(out, k)
        await _dra(out, agents["hgx-0"], workdir / "hgx-0", k)
        await show_topology(
            k, out, functools.partial(operator_running, k.kubeconfig), NODEFEATURES, NAMESPACE
        )
