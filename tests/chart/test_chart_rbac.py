"""Least privilege: one ServiceAccount per component, exactly the verbs each uses, and the agent's
admission policy that confines it to its own node's Devices object."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import NAMESPACE, CelPolicy, Doc, of_kind, one, pod_spec, user_info, workloads

CLUSTER = "<cluster>"
# (scope, apiGroup, resource, resourceName or "") -> verbs; scope is a namespace or CLUSTER.
Grants = dict[tuple[str, str, str, str], set[str]]

AGENT: Grants = {
    # Its own object followed by a watch (list + watch by field selector), written by create and patch.
    (CLUSTER, "worker.gpustack.ai", "devices", ""): {"list", "watch", "create", "patch"},
    (CLUSTER, "worker.gpustack.ai", "devices/status", ""): {"patch"},
    (CLUSTER, "", "nodes", ""): {"get"},
    # Events on its Devices object: cluster-scoped, so they live in "default", and only there.
    ("default", "", "events", ""): {"create"},
}
OPERATOR_COMMON: Grants = {
    (CLUSTER, "worker.gpustack.ai", "devices", ""): {"get", "list", "watch"},
    (CLUSTER, "worker.gpustack.ai", "devices/status", ""): {"patch"},
    # One Event per label change on the cluster-scoped Devices object: in "default", and only there.
    ("default", "", "events", ""): {"create"},
}
OPERATOR_NODEFEATURE: Grants = {
    **OPERATOR_COMMON,
    (CLUSTER, "nfd.k8s-sigs.io", "nodefeatures", ""): {"list", "watch"},
    (NAMESPACE, "nfd.k8s-sigs.io", "nodefeatures", ""): {"get", "create", "patch"},
    # Nodes listed and watched for LabelsOnNode; a record not owned by its own Node gets that node read
    # by name before its NodeFeature is created.
    (CLUSTER, "", "nodes", ""): {"get", "list", "watch"},
}
OPERATOR_NODE: Grants = {**OPERATOR_COMMON, (CLUSTER, "", "nodes", ""): {"get", "list", "watch", "patch"}}
# operator.topology (on by default): the Node watch, its owner's uid, the report and the three targets.
OPERATOR_TOPOLOGY: Grants = {
    (CLUSTER, "rbac.authorization.k8s.io", "clusterroles", "nf-nodefabric-operator"): {"get"},
    (CLUSTER, "placement.gpustack.ai", "fabrictopologies", ""): {"create"},
    (CLUSTER, "placement.gpustack.ai", "fabrictopologies", "nodefabric"): {"get", "patch"},
    (CLUSTER, "kueue.x-k8s.io", "topologies", ""): {"create", "list", "delete"},
    (CLUSTER, "kueue.x-k8s.io", "topologies", "nodefabric"): {"get", "patch"},
    (CLUSTER, "kai.scheduler", "topologies", ""): {"create", "list", "delete"},
    (CLUSTER, "kai.scheduler", "topologies", "nodefabric"): {"get", "patch"},
    (CLUSTER, "topology.volcano.sh", "hypernodes", ""): {"get", "list", "create", "patch", "delete"},
}
# The extender runs in the scheduler's pod, as the scheduler's ServiceAccount: these it adds.
EXTENDER: Grants = {
    (CLUSTER, "", "nodes", ""): {"list", "watch"},
    (CLUSTER, "", "pods", ""): {"list", "watch", "patch"},
    (CLUSTER, "scheduling.x-k8s.io", "podgroups", ""): {"list", "watch"},
    (CLUSTER, "scheduling.volcano.sh", "podgroups", ""): {"list", "watch"},
    (CLUSTER, "placement.gpustack.ai", "placementgroups", ""): {"list", "watch"},
    (CLUSTER, "", "events", ""): {"create"},
}
SCHEDULER: Grants = {
    (NAMESPACE, "coordination.k8s.io", "leases", ""): {"create"},
    (NAMESPACE, "coordination.k8s.io", "leases", "nf-nodefabric-scheduler"): {"get", "update"},
}
# Roles the cluster already has, bound by name (scope, kind, name).
SCHEDULER_BUILTIN = {
    (CLUSTER, "ClusterRole", "system:kube-scheduler"),
    (CLUSTER, "ClusterRole", "system:volume-scheduler"),
    ("kube-system", "Role", "extension-apiserver-authentication-reader"),
}


# The optional second scheduler and its extender are off by default; this module covers them among the
# other components, so its renders turn them on (unless a test's values say otherwise).
pytestmark = pytest.mark.with_extender


def grants_of(docs: list[Doc], sa: str) -> tuple[Grants, set[tuple[str, str, str]]]:
    """What the ServiceAccount may do through the rendered bindings, and the built-in roles it is bound to."""
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}
    grants: Grants = {}
    builtin: set[tuple[str, str, str]] = set()
    for b in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding"):
        subjects = b.get("subjects", [])
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == sa and s["namespace"] == NAMESPACE
            for s in subjects
        ):
            continue
        scope = CLUSTER if b["kind"] == "ClusterRoleBinding" else b["metadata"]["namespace"]
        ref = b["roleRef"]
        role = roles.get(
            (ref["kind"], b["metadata"].get("namespace", "") if ref["kind"] == "Role" else "", ref["name"])
        )
        if role is None:
            builtin.add((scope, ref["kind"], ref["name"]))
            continue
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for name in rule.get("resourceNames", [""]):
                        grants.setdefault((scope, group, resource, name), set()).update(rule["verbs"])
    return grants, builtin


def sa_of(docs: list[Doc], kind: str, name: str) -> str:
    sa: str = pod_spec(one(docs, kind, name))["serviceAccountName"]
    return sa


def test_no_wildcards_in_any_rule(render) -> None:
    for docs in (render(), render({"labelSink": "node"})):
        for role in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"):
            assert role["rules"], role["metadata"]["name"]
            for rule in role["rules"]:
                for field in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
                    assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
                    assert not any("*" in v for v in rule.get(field, [])), (role["metadata"]["name"], rule)
                assert "nonResourceURLs" not in rule


def test_no_binding_to_broad_builtin_roles_or_non_serviceaccount_subjects(default_docs: list[Doc]) -> None:
    for b in of_kind(default_docs, "ClusterRoleBinding") + of_kind(default_docs, "RoleBinding"):
        assert b["roleRef"]["name"] not in {"cluster-admin", "admin", "edit", "view", "system:node"}
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount" and s["namespace"] == NAMESPACE, b["metadata"]["name"]


def test_one_serviceaccount_per_component(default_docs: list[Doc]) -> None:
    accounts = {sa["metadata"]["name"] for sa in of_kind(default_docs, "ServiceAccount")}
    used = [pod_spec(w)["serviceAccountName"] for w in workloads(default_docs)]
    # The extender container of the scheduler pod acts as its own account, through that account's token
    # Secret mounted where the in-cluster client reads one (kubelet then mounts no other token there).
    (token,) = [
        s for s in of_kind(default_docs, "Secret") if s["type"] == "kubernetes.io/service-account-token"
    ]
    extender = token["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert extender == "nf-nodefabric-extender"
    scheduler = one(default_docs, "Deployment", "nf-nodefabric-scheduler")
    (mount,) = [
        m
        for c in pod_spec(scheduler)["containers"]
        if c["name"] == "extender"
        for m in c["volumeMounts"]
        if m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    ]
    (vol,) = [v for v in pod_spec(scheduler)["volumes"] if v["name"] == mount["name"]]
    assert vol["secret"]["secretName"] == token["metadata"]["name"] and mount["readOnly"]
    kube = next(c for c in pod_spec(scheduler)["containers"] if c["name"] == "kube-scheduler")
    assert not [m for m in kube["volumeMounts"] if "serviceaccount" in m["mountPath"]]
    used.append(extender)
    assert sorted(used) == sorted(accounts), "every workload has its own account and every account a workload"
    assert len(set(used)) == len(used)
    for w in workloads(default_docs):
        assert pod_spec(w).get("automountServiceAccountToken", True)


def test_agent_may_do_exactly_what_it_needs(default_docs: list[Doc]) -> None:
    grants, builtin = grants_of(default_docs, sa_of(default_docs, "DaemonSet", "nf-nodefabric-agent"))
    assert grants == AGENT
    assert builtin == set()


@pytest.mark.parametrize(
    ("sink", "expected"), [("nodefeature", OPERATOR_NODEFEATURE), ("node", OPERATOR_NODE)]
)
def test_operator_may_do_exactly_what_its_sink_needs(render, sink: str, expected: Grants) -> None:
    docs = render({"labelSink": sink})
    grants, builtin = grants_of(docs, sa_of(docs, "Deployment", "nf-nodefabric-operator"))
    nodes = (CLUSTER, "", "nodes", "")
    assert grants == {**expected, **OPERATOR_TOPOLOGY, nodes: expected[nodes] | {"list", "watch"}}
    without = render({"labelSink": sink, "operator": {"topology": {"enabled": False}}})
    assert grants_of(without, sa_of(without, "Deployment", "nf-nodefabric-operator"))[0] == expected
    assert builtin == set()
    args = pod_spec(one(docs, "Deployment", "nf-nodefabric-operator"))["containers"][0]["args"]
    assert args[args.index("--sink") + 1] == sink
    assert args[args.index("--namespace") + 1] == NAMESPACE
    # One replica without kopf peering objects (which would need a peering CRD and rights on it).
    assert "--standalone" in args


def test_a_disabled_topology_target_may_only_read_and_delete_what_the_operator_wrote(render) -> None:
    """A target turned off (a `helm upgrade`): the operator removes what it wrote while the target was on
    (clean_disabled: the Topology of the configured name, read by name; the HyperNodes, listed by our
    label; each deleted only when labelled ours, at the version read). The chart granted nothing on a
    disabled target's kinds, so that removal was refused (403) and the objects stayed."""
    off = {"enabled": False}
    values = {"operator": {"topology": {"kueue": off, "kai": off, "volcano": off, "name": "gpus"}}}
    docs = render(values)
    grants, _ = grants_of(docs, sa_of(docs, "Deployment", "nf-nodefabric-operator"))
    targets = {
        g: v for g, v in grants.items() if g[1] in ("kueue.x-k8s.io", "kai.scheduler", "topology.volcano.sh")
    }
    assert targets == {
        (CLUSTER, "kueue.x-k8s.io", "topologies", "gpus"): {"get", "delete"},
        (CLUSTER, "kai.scheduler", "topologies", "gpus"): {"get", "delete"},
        (CLUSTER, "topology.volcano.sh", "hypernodes", ""): {"get", "list", "delete"},
    }
    docs = render({"operator": {"topology": {"kai": off, "name": "gpus"}}})
    grants, _ = grants_of(docs, sa_of(docs, "Deployment", "nf-nodefabric-operator"))
    assert grants[CLUSTER, "kueue.x-k8s.io", "topologies", "gpus"] == {"get", "patch"}
    assert grants[CLUSTER, "kueue.x-k8s.io", "topologies", ""] == {"create", "list", "delete"}
    assert grants[CLUSTER, "kai.scheduler", "topologies", "gpus"] == {"get", "delete"}
    assert (CLUSTER, "kai.scheduler", "topologies", "") not in grants


def test_scheduler_holds_the_stock_scheduler_roles_its_own_lease_and_the_extenders(
    default_docs: list[Doc],
) -> None:
    grants, builtin = grants_of(default_docs, sa_of(default_docs, "Deployment", "nf-nodefabric-scheduler"))
    assert grants == SCHEDULER
    assert builtin == SCHEDULER_BUILTIN
    # The extender's rights are its own account's, not kube-scheduler's.
    grants, builtin = grants_of(default_docs, "nf-nodefabric-extender")
    assert grants == EXTENDER and builtin == set()
    # Nobody else holds the scheduler's roles.
    for name in ("nf-nodefabric-agent", "nf-nodefabric-operator"):
        assert not grants_of(default_docs, name)[1]


# The agent's own-node admission policy.


def policy_parts(docs: list[Doc]) -> tuple[Doc, Doc]:
    name = "nf-nodefabric-agent-own-node"
    return one(docs, "ValidatingAdmissionPolicy", name), one(docs, "ValidatingAdmissionPolicyBinding", name)


def test_policy_binds_denying_and_fails_closed(default_docs: list[Doc]) -> None:
    policy, binding = policy_parts(default_docs)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "paramRef" not in binding["spec"]
    assert policy["spec"]["failurePolicy"] == "Fail"


def test_policy_covers_every_agent_write_to_devices(default_docs: list[Doc]) -> None:
    policy, _ = policy_parts(default_docs)
    crd = one(default_docs, "CustomResourceDefinition", "devices.worker.gpustack.ai")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [crd["spec"]["group"]]
    assert rule["apiVersions"] == [v["name"] for v in crd["spec"]["versions"]]
    assert set(rule["resources"]) == {"devices", "devices/status"}
    # Every write verb the agent's role grants reaches the policy (patch arrives as UPDATE).
    assert {"CREATE", "UPDATE"} <= set(rule["operations"])
    sa = sa_of(default_docs, "DaemonSet", "nf-nodefabric-agent")
    (cond,) = policy["spec"]["matchConditions"]
    assert cond["expression"] == f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{sa}"'


def test_policy_absent_when_disabled(render) -> None:
    docs = render({"agent": {"admissionPolicy": {"enabled": False}}})
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert "nf-nodefabric-agent-own-node" not in [d["metadata"]["name"] for d in of_kind(docs, kind)]


class AdmissionPolicy:
    """The own-node policy for one agent request on a Devices object."""

    def __init__(self, policy: Doc) -> None:
        self.cel = CelPolicy(policy)

    def admit(self, username: str, name: str, node_claim: list[str] | None) -> tuple[bool, str]:
        return self.cel.admit({"name": name, "userInfo": user_info(username, node_claim)})


@pytest.fixture(scope="module")
def admission(render) -> AdmissionPolicy:
    return AdmissionPolicy(policy_parts(render())[0])


AGENT_USER = f"system:serviceaccount:{NAMESPACE}:nf-nodefabric-agent"


def test_agent_may_write_its_own_nodes_record(admission: AdmissionPolicy) -> None:
    assert admission.admit(AGENT_USER, "gpu-node-7", ["gpu-node-7"]) == (True, "allowed")


def test_agent_may_not_write_another_nodes_record(admission: AdmissionPolicy) -> None:
    allowed, message = admission.admit(AGENT_USER, "gpu-node-8", ["gpu-node-7"])
    assert not allowed
    assert (
        message == "the nodefabric agent on node gpu-node-7 may write only Devices gpu-node-7, not gpu-node-8"
    )


@pytest.mark.parametrize("claim", [None, [], ["gpu-node-7", "gpu-node-8"]])
def test_agent_token_without_one_node_claim_is_refused(
    admission: AdmissionPolicy, claim: list[str] | None
) -> None:
    allowed, message = admission.admit(AGENT_USER, "gpu-node-7", claim)
    assert not allowed
    assert "carries no single node-name claim" in message


def test_other_users_are_not_confined_by_the_policy(admission: AdmissionPolicy) -> None:
    operator = f"system:serviceaccount:{NAMESPACE}:nf-nodefabric-operator"
    assert admission.admit(operator, "gpu-node-8", None) == (True, "not matched")
    assert admission.admit("kubernetes-admin", "gpu-node-8", None) == (True, "not matched")


# What the agent really asks of the API, against what its account may do.

VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def _requests_of_an_agents_life(tmp_path: Any) -> Grants:
    """Run a real agent against the embedded API through a pass that creates its record, one that
    changes it, and an NVIDIA node without NVML (its Warning Event); the RBAC verbs of every request."""
    import asyncio

    import pynvml

    from nodefabric_devicemanager import crd, inventory, nodeclient
    from nodefabric_devicemanager.accelerators import Libraries
    from nodefabric_devicemanager.accelerators.nvidia import Nvml
    from nodefabric_devicemanager.agent.core import Agent, AgentConfig
    from nodefabric_devicemanager.agent.kube import DevicesClient
    from nodefabric_devicemanager.nodeclient import Backoff
    from nodefabric_devicemanager.testing.accelerators import FakeNvml, nvswitch_node
    from nodefabric_devicemanager.testing.sysfs import SysfsBuilder
    from nodefabric_operator.demo.kubeapi import running_api

    b = SysfsBuilder(tmp_path / "host")
    nvswitch_node(b, cluster_uuid=bytes(16), clique_id=0, state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
    missing = Nvml(FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))

    async def run() -> Grants:
        async with running_api([crd.devices_crd()], directory=str(tmp_path)) as k:
            k.api.put_object("v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-7"}})
            agent = Agent(
                AgentConfig(node="gpu-7", root=str(b.root), backoff=Backoff(base=0.01, cap=0.05)),
                DevicesClient(nodeclient.load(k.kubeconfig)),
            )
            agent.reader = lambda host: inventory.read(host, libraries=Libraries(nvidia=missing))
            assert (await agent.run_pass()).ok
            b.nic("0000:c1:00.0", "ens9", numa=1, rdma="mlx5_9", verbs=9)  # a NIC appears: the spec changes
            assert "spec" in (await agent.run_pass()).wrote
            assert k.count("POST", "v1/events") == 1, "the NVML Event was posted"
            used: Grants = {}
            for req in k.requests():
                if req.resource is None:
                    continue
                method = str(getattr(req.method, "value", req.method)).upper()
                verb = VERBS.get(method) or ("get" if req.name else "list")
                plural = (
                    f"{req.resource.plural}/{req.subresource}" if req.subresource else req.resource.plural
                )
                scope = req.namespace or CLUSTER
                used.setdefault((scope, req.resource.group, plural, ""), set()).add(verb)
            return used

    return asyncio.run(run())


def test_the_agent_asks_for_nothing_its_account_may_not_do_and_may_do_nothing_more(
    default_docs: list[Doc], tmp_path: Any
) -> None:
    grants, _ = grants_of(default_docs, "nf-nodefabric-agent")
    used = _requests_of_an_agents_life(tmp_path)
    for (scope, group, resource, name), verbs in used.items():
        allowed = grants.get((scope, group, resource, name), set()) | grants.get(
            (CLUSTER, group, resource, name), set()
        )
        assert verbs <= allowed, (scope, group, resource, verbs)
    # Everything granted is used; the watch is the agent's loop, outside a pass.
    used[(CLUSTER, "worker.gpustack.ai", "devices", "")].add("watch")
    assert used == grants


# The agent's Events: about its own node's record only.


class EventPolicy:
    """The own-events policy for one Event an agent creates."""

    def __init__(self, policy: Doc) -> None:
        self.cel = CelPolicy(policy)

    def admit(self, event: Doc, node_claim: list[str] | None, *, user: str = "") -> tuple[bool, str]:
        request = {"operation": "CREATE", "userInfo": user_info(user or AGENT_USER, node_claim)}
        return self.cel.admit(request, event)


@pytest.fixture(scope="module")
def event_policy(render) -> EventPolicy:
    docs = render()
    name = "nf-nodefabric-agent-own-events"
    policy = one(docs, "ValidatingAdmissionPolicy", name)
    binding = one(docs, "ValidatingAdmissionPolicyBinding", name)
    assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule == {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["events"],
    }
    return EventPolicy(policy)


def _event_the_agent_posts(tmp_path: Any) -> Doc:
    """The body of the Event a real agent posts for its node gpu-7 (NVML missing on an NVIDIA node)."""
    from nodefabric_devicemanager.agent.kube import DevicesClient

    posted: list[Doc] = []

    class Capture:
        def call(self, what: str, method: str, path: str, body: Doc | None = None, **_: Any) -> None:
            posted.append(body or {})

    DevicesClient(Capture()).post_event(  # type: ignore[arg-type]
        "gpu-7", {"metadata": {"uid": "u-7"}}, "Warning", "LibraryUnavailable", "no NVML"
    )
    (event,) = posted
    return event


def test_the_agent_may_post_events_about_its_own_record(event_policy: EventPolicy, tmp_path: Any) -> None:
    assert event_policy.admit(_event_the_agent_posts(tmp_path), ["gpu-7"]) == (True, "allowed")


@pytest.mark.parametrize(
    ("case", "involved", "about"),
    [
        ("another node's record", {"name": "gpu-8"}, "worker.gpustack.ai/v1alpha1 Devices gpu-8"),
        ("a pod", {"apiVersion": "v1", "kind": "Pod", "namespace": "ml", "name": "gpu-7"}, "v1 Pod ml/gpu-7"),
        ("a node", {"apiVersion": "v1", "kind": "Node"}, "v1 Node gpu-7"),
        ("a namespaced look-alike", {"namespace": "ml"}, "worker.gpustack.ai/v1alpha1 Devices ml/gpu-7"),
        ("another group's Devices", {"apiVersion": "example.com/v1"}, "example.com/v1 Devices gpu-7"),
    ],
)  # fmt: skip
def test_the_agent_may_not_post_events_about_anything_else(
    event_policy: EventPolicy, tmp_path: Any, case: str, involved: Doc, about: str
) -> None:
    event = _event_the_agent_posts(tmp_path)
    event["involvedObject"] = {**event["involvedObject"], **involved}
    allowed, message = event_policy.admit(event, ["gpu-7"])
    assert not allowed, case
    assert (
        message
        == f"the nodefabric agent on node gpu-7 may post Events only about Devices gpu-7, not about {about}"
    )


@pytest.mark.parametrize("claim", [None, [], ["gpu-7", "gpu-8"]])
def test_an_event_without_one_node_claim_is_refused(
    event_policy: EventPolicy, tmp_path: Any, claim: list[str] | None
) -> None:
    allowed, message = event_policy.admit(_event_the_agent_posts(tmp_path), claim)
    assert not allowed and "carries no single node-name claim" in message


def test_other_accounts_events_are_not_confined(event_policy: EventPolicy, tmp_path: Any) -> None:
    event = _event_the_agent_posts(tmp_path) | {"involvedObject": {"kind": "Pod", "name": "x"}}
    operator = f"system:serviceaccount:{NAMESPACE}:nf-nodefabric-operator"
    assert event_policy.admit(event, None, user=operator) == (True, "not matched")


def test_the_events_policy_follows_the_agents_account_and_switch(render) -> None:
    docs = render({"agent": {"serviceAccount": {"name": "gpu-fabric"}}})
    (cond,) = one(docs, "ValidatingAdmissionPolicy", "nf-nodefabric-agent-own-events")["spec"][
        "matchConditions"
    ]
    assert cond["expression"].endswith(':gpu-fabric"')
    off = render({"agent": {"admissionPolicy": {"enabled": False}}})
    assert "nf-nodefabric-agent-own-events" not in [d["metadata"]["name"] for d in off]
