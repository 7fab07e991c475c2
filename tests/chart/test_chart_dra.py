"""The chart's DRA part: off by default; when on, DeviceClasses that select our devices, exactly the RBAC
the driver uses (measured by running it against the embedded API), the admission policy that confines an
agent to its own node's ResourceSlices, and the agent's sockets at the host's own paths."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pytest
from chart_support import NAMESPACE, CelPolicy, Doc, RenderError, container, of_kind, one, pod_spec, user_info
from test_chart_rbac import CLUSTER, grants_of
from test_chart_validate import validate_all

from nodefabric_devicemanager import inventory, nodeclient
from nodefabric_devicemanager.accelerators import Libraries
from nodefabric_devicemanager.accelerators.ascend import NoAscend
from nodefabric_devicemanager.accelerators.nvidia import Nvml
from nodefabric_devicemanager.models import DevicesSpec, LinkState, LinkVerdict
from nodefabric_devicemanager.testing.accelerators import nvswitch_node
from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
from nodefabric_deviceplugin.dra.claims import ClaimRef
from nodefabric_deviceplugin.dra.config import DriverConfig
from nodefabric_deviceplugin.dra.driver import DraDriver
from nodefabric_deviceplugin.dra.kube import DraApi
from nodefabric_deviceplugin.dra.slices import desired_slices
from nodefabric_deviceplugin.source import RecordSource
from nodefabric_deviceplugin.testing.drakubelet import DraKubelet
from nodefabric_operator.demo.kubeapi import running_api

DRA = {"dra": {"enabled": True}}
KUBE = "1.34.0"
DRIVER = "rdma.gpustack.ai"
AGENT_SA = f"system:serviceaccount:{NAMESPACE}:nf-nodefabric-agent"
DRA_GRANTS = {
    (CLUSTER, "resource.k8s.io", "resourceslices", ""): {"list", "watch", "create", "patch", "delete"},
    (CLUSTER, "resource.k8s.io", "resourceclaims", ""): {"get"},
}


@pytest.fixture(scope="module")
def dra_docs(render: Any) -> list[Doc]:
    return render(DRA, kube_version=KUBE)  # type: ignore[no-any-return]


def test_off_by_default(default_docs: list[Doc]) -> None:
    assert not of_kind(default_docs, "DeviceClass")
    agent = one(default_docs, "DaemonSet", "nf-nodefabric-agent")
    assert "--serve" not in container(agent, "agent")["args"]
    assert not [v for v in pod_spec(agent)["volumes"] if v["name"] in ("dra-plugin", "dra-registry", "cdi")]
    grants, _ = grants_of(default_docs, "nf-nodefabric-agent")
    assert not [k for k in grants if k[1] == "resource.k8s.io"]


def test_every_manifest_is_valid_kubernetes(dra_docs: list[Doc], render: Any) -> None:
    validate_all(dra_docs, KUBE)
    validate_all(
        render({"dra": {"enabled": True, "devicePlugin": True}, "domain": "example.com"}, kube_version=KUBE),
        KUBE,
    )


def test_refused_on_a_cluster_without_resource_k8s_io_v1(render: Any) -> None:
    with pytest.raises(RenderError, match=r"dra.enabled needs Kubernetes >= 1.34"):
        render(DRA, kube_version="1.33.0")


def test_dra_without_the_agent_is_refused(render: Any) -> None:
    """The driver runs in the agent's process: DRA asked for with no agent would silently be none."""
    with pytest.raises(RenderError) as refused:
        render({"dra": {"enabled": True}, "agent": {"enabled": False}}, kube_version=KUBE)
    assert "dra.enabled=true needs agent.enabled=true: the DRA driver runs in the agent's process" in str(
        refused.value
    )


@pytest.mark.parametrize(("agent", "dra"), [(True, True), (True, False), (False, False)])
def test_the_other_agent_and_dra_combinations_render(render: Any, agent: bool, dra: bool) -> None:
    docs = render({"dra": {"enabled": dra}, "agent": {"enabled": agent}}, kube_version=KUBE)
    assert bool(of_kind(docs, "DaemonSet")) == agent
    assert bool(of_kind(docs, "DeviceClass")) == dra


@pytest.mark.parametrize("path", ["relative/plugins", "/var/lib/../../etc"])
def test_the_schema_refuses_paths_kubelet_could_not_dial(render: Any, path: str) -> None:
    with pytest.raises(RenderError, match="kubeletPluginsPath"):
        render({"dra": {"enabled": True, "kubeletPluginsPath": path}}, kube_version=KUBE)


# --- the agent ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("device_plugin", "serve"), [(False, "dra"), (True, "both")])
def test_the_agent_serves_dra_with_its_sockets_at_the_hosts_paths(
    render: Any, device_plugin: bool, serve: str
) -> None:
    values = {"dra": {"enabled": True, "devicePlugin": device_plugin, "cdiPath": "/etc/cdi"}}
    agent = one(render(values, kube_version=KUBE), "DaemonSet", "nf-nodefabric-agent")
    args = container(agent, "agent")["args"]
    flags = {
        args[i]: args[i + 1]
        for i in range(len(args) - 1)
        if args[i].startswith("--dra-") or args[i] == "--serve"
    }
    assert flags == {
        "--serve": serve,
        "--dra-plugin-dir": "/var/lib/kubelet/plugins",
        "--dra-registry-dir": "/var/lib/kubelet/plugins_registry",
        "--dra-cdi-dir": "/etc/cdi",
    }
    mounts = {m["name"]: m["mountPath"] for m in container(agent, "agent")["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod_spec(agent)["volumes"] if "hostPath" in v}
    for name, path in (
        ("dra-plugin", f"/var/lib/kubelet/plugins/{DRIVER}"),
        ("dra-registry", "/var/lib/kubelet/plugins_registry"),
        ("cdi", "/etc/cdi"),
    ):
        # The same path inside and out: kubelet dials the endpoint the driver names from inside the pod.
        assert mounts[name] == volumes[name] == path


# --- DeviceClasses --------------------------------------------------------------------------------------


def hgx(root: Path) -> tuple[SysfsBuilder, DevicesSpec]:
    """An 8-GPU board with a NIC beside each GPU; NIC 7 split into two VFs."""
    b = SysfsBuilder(root)
    nvml = nvswitch_node(b, clique_id=1)
    b.sriov("0000:e0:00.0", vfs=2, numa=1, rdma_prefix="mlx5_", first_rdma=8, first_verbs=8)
    b.rdma_cm()
    reading = inventory.read(b.host, libraries=Libraries(nvidia=Nvml(nvml), ascend=NoAscend()))
    return b, reading.spec()


def cel_device(device: dict[str, Any]) -> dict[str, Any]:
    """A slice device as CEL sees it: attributes by domain, the unqualified ones under the driver's."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device["attributes"].items():
        domain, _, short = name.rpartition("/")
        attributes.setdefault(domain or DRIVER, {})[short] = next(iter(value.values()))
    return {"driver": DRIVER, "attributes": attributes}


def test_device_classes_select_our_devices_by_function(dra_docs: list[Doc], tmp_path: Path) -> None:
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    _, spec = hgx(tmp_path / "h")
    (desired,) = desired_slices(spec, DriverConfig(node_name="hgx-0"), {}) or []
    devices = desired.spec["devices"]
    selected: dict[str, set[str]] = {}
    for cls in of_kind(dra_docs, "DeviceClass"):
        (selector,) = cls["spec"]["selectors"]
        program = env.program(env.compile(selector["cel"]["expression"]))
        selected[cls["metadata"]["name"]] = {
            d["name"] for d in devices if program.evaluate({"device": celpy.json_to_cel(cel_device(d))})
        }
    every = {d["name"] for d in devices}
    vfs = {"pci-0000-e0-00-1", "pci-0000-e0-00-2"}
    assert selected == {DRIVER: every, f"pf.{DRIVER}": every - vfs, f"vf.{DRIVER}": vfs}
    other = cel_device(devices[0]) | {"driver": "gpu.nvidia.com"}
    program = env.program(
        env.compile(one(dra_docs, "DeviceClass", DRIVER)["spec"]["selectors"][0]["cel"]["expression"])
    )
    assert not program.evaluate({"device": celpy.json_to_cel(other)})


# --- RBAC: exactly what the driver uses ------------------------------------------------------------------


def test_the_agent_may_do_exactly_what_the_driver_does(
    dra_docs: list[Doc], default_docs: list[Doc], tmp_path: Path
) -> None:
    grants, _ = grants_of(dra_docs, "nf-nodefabric-agent")
    without, _ = grants_of(default_docs, "nf-nodefabric-agent")
    assert {k: v for k, v in grants.items() if k not in without} == DRA_GRANTS
    used = asyncio.run(driver_requests(tmp_path))
    assert used == DRA_GRANTS | {(CLUSTER, "", "nodes", ""): {"get"}}
    for key, verbs in used.items():
        assert verbs <= grants[key], key


VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


async def driver_requests(tmp_path: Path) -> dict[tuple[str, str, str, str], set[str]]:
    """Run the driver through its whole life (publish, republish, shrink, prepare, unprepare) against the
    embedded API; the RBAC verbs of every request it made."""
    b, spec = hgx(tmp_path / "h")
    base = tempfile.mkdtemp(prefix="nfch", dir="/tmp")
    config = DriverConfig(
        node_name="hgx-0", plugin_dir=f"{base}/p", registry_dir=f"{base}/r", cdi_dir=f"{base}/c"
    )
    async with running_api(directory=str(tmp_path)) as k:
        k.api.put_object("v1/nodes", {"metadata": {"name": "hgx-0"}})
        # A slice of an older run, to delete.
        for index in (7,):
            k.api.put_object(
                "resource.k8s.io/v1/resourceslices",
                {
                    "metadata": {"name": f"hgx-0-{DRIVER}-{index}"},
                    "spec": {
                        "driver": DRIVER,
                        "nodeName": "hgx-0",
                        "pool": {"name": "hgx-0", "generation": 1, "resourceSliceCount": 8},
                        "devices": [],
                    },
                },
            )
        uid = "0d6f5a3e-0000-4000-8000-000000000001"
        k.api.put_object(
            "resource.k8s.io/v1/resourceclaims",
            {
                "metadata": {"name": "c", "namespace": "ml", "uid": uid},
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "r",
                                    "driver": DRIVER,
                                    "pool": "hgx-0",
                                    "device": "pci-0000-1c-00-0",
                                }
                            ]
                        }
                    }
                },
            },
        )
        source = RecordSource(spec)
        driver = DraDriver(config, source, b.host, DraApi(nodeclient.load(k.kubeconfig), config))
        kubelet = DraKubelet(config.registry_dir)
        stop = asyncio.Event()
        task = asyncio.create_task(driver.run(stop))
        try:
            plugin = await kubelet.wait_registered(DRIVER)
            async with asyncio.timeout(20):
                while driver.publisher.syncs < 1 or driver.publisher.watch.connects < 1:
                    await asyncio.sleep(0.05)
                while not k.requests("GET", "resource.k8s.io/v1/resourceslices")[-1].params.get("watch"):
                    await asyncio.sleep(0.05)
            # A link fails: the pool is rewritten without that device.
            broken = spec.model_copy(deep=True)
            broken.interfaces[0].link = LinkVerdict(state=LinkState.FAILED, reason="down")
            source.update(broken)
            async with asyncio.timeout(20):
                while driver.publisher.syncs < 2:
                    await asyncio.sleep(0.05)
            claim = ClaimRef("ml", uid, "c")
            assert (await plugin.prepare(claim))[uid].error == ""
            assert await plugin.unprepare(claim) == {uid: ""}
        finally:
            await kubelet.stop()
            stop.set()
            await task
        used: dict[tuple[str, str, str, str], set[str]] = {}
        for req in k.requests():
            if req.resource is None:
                continue
            method = str(getattr(req.method, "value", req.method)).upper()
            watch = str(req.params.get("watch", "")).lower() in ("true", "1")
            verb = VERBS.get(method) or ("get" if req.name else "watch" if watch else "list")
            scope = CLUSTER
            used.setdefault((scope, req.resource.group, req.resource.plural, ""), set()).add(verb)
        return used


# --- the admission policy ----------------------------------------------------------------------------


class SlicePolicy:
    """The own-slices policy for one agent request on a ResourceSlice of node `old` / `new` (None: absent)."""

    def __init__(self, policy: Doc) -> None:
        self.cel = CelPolicy(policy)

    def admit(
        self,
        operation: str,
        old: str | None,
        new: str | None,
        claim: list[str] | None,
        *,
        user: str = AGENT_SA,
        driver: str = DRIVER,
    ) -> tuple[bool, str]:
        def obj(node: str | None) -> Doc | None:
            return None if node is None else {"spec": {"nodeName": node, "driver": driver}}

        return self.cel.admit(
            {"operation": operation, "userInfo": user_info(user, claim)}, obj(new), obj(old)
        )


@pytest.fixture(scope="module")
def slice_policy(dra_docs: list[Doc]) -> SlicePolicy:
    policy = one(dra_docs, "ValidatingAdmissionPolicy", "nf-nodefabric-agent-own-slices")
    binding = one(dra_docs, "ValidatingAdmissionPolicyBinding", "nf-nodefabric-agent-own-slices")
    assert binding["spec"] == {"policyName": "nf-nodefabric-agent-own-slices", "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"] and set(rule["operations"]) == {
        "CREATE",
        "UPDATE",
        "DELETE",
    }
    return SlicePolicy(policy)


@pytest.mark.parametrize(
    ("operation", "old", "new"),
    [("CREATE", None, "gpu-7"), ("UPDATE", "gpu-7", "gpu-7"), ("DELETE", "gpu-7", None)],
)
def test_an_agent_may_write_its_own_nodes_slices(
    slice_policy: SlicePolicy, operation: str, old: str | None, new: str | None
) -> None:
    assert slice_policy.admit(operation, old, new, ["gpu-7"]) == (True, "allowed")


@pytest.mark.parametrize(
    ("operation", "old", "new"),
    [
        ("CREATE", None, "gpu-8"),
        ("UPDATE", "gpu-8", "gpu-8"),
        ("UPDATE", "gpu-8", "gpu-7"),  # taking another node's slice over
        ("UPDATE", "gpu-7", "gpu-8"),
        ("DELETE", "gpu-8", None),  # withdrawing another node's devices
    ],
)
def test_an_agent_may_not_touch_another_nodes_slices(
    slice_policy: SlicePolicy, operation: str, old: str | None, new: str | None
) -> None:
    allowed, message = slice_policy.admit(operation, old, new, ["gpu-7"])
    assert not allowed
    assert (
        message == f"the nodefabric agent on node gpu-7 may write only {DRIVER} ResourceSlices of node gpu-7"
    )


def test_an_agent_may_not_write_another_drivers_slices(slice_policy: SlicePolicy) -> None:
    assert not slice_policy.admit("CREATE", None, "gpu-7", ["gpu-7"], driver="gpu.nvidia.com")[0]


@pytest.mark.parametrize("claim", [None, [], ["gpu-7", "gpu-8"]])
def test_a_token_without_one_node_claim_is_refused(
    slice_policy: SlicePolicy, claim: list[str] | None
) -> None:
    allowed, message = slice_policy.admit("CREATE", None, "gpu-7", claim)
    assert not allowed and "carries no single node-name claim" in message


def test_other_users_are_not_confined(slice_policy: SlicePolicy) -> None:
    assert slice_policy.admit("DELETE", "gpu-8", None, None, user="system:node:gpu-8") == (
        True,
        "not matched",
    )


def test_extra_volumes_may_not_clash_with_the_dra_mounts(render: Any) -> None:
    clash = {"name": "cdi", "emptyDir": {}}
    with pytest.raises(RenderError, match="extraVolumes"):
        render({"dra": {"enabled": True}, "agent": {"extraVolumes": [clash]}}, kube_version=KUBE)
    mount = {"name": "extra", "mountPath": "/var/run/cdi"}
    with pytest.raises(RenderError, match="extraVolumeMounts"):
        render(
            {"dra": {"enabled": True}, "agent": {"extraVolumes": [{"name": "extra", "emptyDir": {}}],
             "extraVolumeMounts": [mount]}},
            kube_version=KUBE,
        )  # fmt: skip


@pytest.mark.parametrize("account", [{"name": "gpu-fabric"}, {"create": False, "name": "preprovisioned"}])
def test_the_agents_own_account_gets_the_dra_rights_and_is_the_one_confined(
    render: Any, dra_docs: list[Doc], account: dict[str, Any]
) -> None:
    """A named agent account is the one the DRA binding grants and the slice policy confines: granting the
    default name instead would leave the agent without its rights, and hand them, unconfined by the
    policy, to whatever account of that name exists."""
    docs = render({**DRA, "agent": {"serviceAccount": account}}, kube_version=KUBE)
    name = account["name"]
    grants, _ = grants_of(docs, name)
    assert {k: v for k, v in grants.items() if k[1] == "resource.k8s.io"} == DRA_GRANTS
    assert not grants_of(docs, "nf-nodefabric-agent")[0]
    policy = one(docs, "ValidatingAdmissionPolicy", "nf-nodefabric-agent-own-slices")
    (condition,) = policy["spec"]["matchConditions"]
    assert (
        condition["expression"] == f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{name}"'
    )
    default = one(dra_docs, "ValidatingAdmissionPolicy", "nf-nodefabric-agent-own-slices")
    assert default["spec"]["matchConditions"][0]["expression"].endswith(':nf-nodefabric-agent"')


def test_a_domain_too_long_for_a_driver_name_is_refused_at_render(render: Any) -> None:
    """The driver name rdma.<domain> is at most 63 characters (ResourceSlice validation); the agent refuses
    a longer one at start, so rendering it would crash-loop the agent on every node."""
    longest = "d" * 55 + ".ai"  # rdma. + 58 = 63
    render({**DRA, "domain": longest}, kube_version=KUBE)
    with pytest.raises(RenderError, match=r"dra.enabled needs a domain of at most 58 characters"):
        render({**DRA, "domain": "d" + longest}, kube_version=KUBE)
    render({"domain": "d" + longest}, kube_version=KUBE)  # without DRA the label prefixes allow it
