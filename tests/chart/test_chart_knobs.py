"""Every per-component knob reaches the pod it is for, merges with the chart's defaults the way Helm
values do, and a value Kubernetes would refuse is refused at render time with the key named."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from chart_support import NAMESPACE, Doc, RenderError, container, of_kind, one, pod_spec, refusal, workloads
from test_chart_rbac import grants_of
from test_chart_validate import validate_all

AGENT = ("DaemonSet", "nf-nodefabric-agent", "agent")
OPERATOR = ("Deployment", "nf-nodefabric-operator", "operator")
CRD_JOB = ("Job", "nf-nodefabric-crd-upgrade", "crd-apply")
SCHEDULER = ("Deployment", "nf-nodefabric-scheduler", "kube-scheduler")
# The extender is the scheduler pod's second container: it takes the container knobs, the pod's are the
# scheduler's.
EXTENDER = ("Deployment", "nf-nodefabric-scheduler", "extender")
PLACEMENT = ("Deployment", "nf-nodefabric-placement", "placement")
# values path -> (kind, workload, container), by the knobs the path takes.
PODS = {"agent": AGENT, "operator": OPERATOR, "crds.upgradeJob": CRD_JOB, "scheduler": SCHEDULER}
CONTAINERS = {**PODS, "extender": EXTENDER}
# logLevel/logFormat configure nodefabric's own command; kube-scheduler keeps its --v (scheduler.verbosity).
LOGGING = {"agent": AGENT, "operator": OPERATOR, "crds.upgradeJob": CRD_JOB, "extender": EXTENDER}
# Components with a ServiceAccount of their own a user may name or bring (the CRD hook's is its own).
ACCOUNTS = {"agent": AGENT, "operator": OPERATOR, "scheduler": SCHEDULER}


# The optional second scheduler and its extender are off by default; this module covers them among the
# other components, so its renders turn them on (unless a test's values say otherwise).
pytestmark = pytest.mark.with_extender


def nest(path: str, value: Any) -> dict[str, Any]:
    """{"a.b": v} as Helm values: {"a": {"b": v}}."""
    out: dict[str, Any] = value
    for key in reversed(path.split(".")):
        out = {key: out}
    return out


def merged(*sections: dict[str, Any]) -> dict[str, Any]:
    """Helm values merged key by key, the later section winning."""
    out: dict[str, Any] = {}
    for section in sections:
        for key, value in section.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


def workload(docs: list[Doc], which: tuple[str, str, str]) -> Doc:
    return one(docs, which[0], which[1])


def ctr(docs: list[Doc], which: tuple[str, str, str]) -> dict[str, Any]:
    return container(workload(docs, which), which[2])


POD_KNOBS: dict[str, Any] = {
    "nodeSelector": {"node-role.kubernetes.io/gpu": "true"},
    "tolerations": [
        {
            "key": "dedicated",
            "operator": "Equal",
            "value": "gpu",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        }
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}
                        ]
                    }
                ]
            }
        }
    },
    "priorityClassName": "gpu-infra",
    "podLabels": {"team": "gpu-platform", "cost-center": "ml-42"},
    "podAnnotations": {"example.com/owner": "gpu-platform"},
    "securityContext": {"fsGroup": 2000},
}
CONTAINER_KNOBS: dict[str, Any] = {
    "containerSecurityContext": {"readOnlyRootFilesystem": True, "runAsGroup": 3000},
    "extraEnv": [
        {"name": "HTTPS_PROXY", "value": "http://proxy.local:3128"},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ],
    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
}
LOG_KNOBS = {"logLevel": "debug", "logFormat": "json"}
EVERY_KNOB: dict[str, Any] = POD_KNOBS | CONTAINER_KNOBS | LOG_KNOBS
EXTRA_VOLUME = {"name": "ca", "configMap": {"name": "corporate-ca"}}
EXTRA_MOUNT = {"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}
SERVICE_ACCOUNT = {
    "serviceAccount": {"create": True, "name": "", "annotations": {"iam.example.com/role": "r"}}
}


def every_knob_values() -> dict[str, Any]:
    sections = []
    for path in PODS:
        knobs = POD_KNOBS | CONTAINER_KNOBS
        if path in LOGGING:
            knobs |= LOG_KNOBS
        if path in ACCOUNTS:  # the hook's account is its own; it mounts nothing
            knobs |= SERVICE_ACCOUNT | {"extraVolumes": [EXTRA_VOLUME], "extraVolumeMounts": [EXTRA_MOUNT]}
        sections.append(nest(path, knobs))
    # The extender container mounts the scheduler pod's extra volume too.
    sections.append({"extender": CONTAINER_KNOBS | LOG_KNOBS | {"extraVolumeMounts": [EXTRA_MOUNT]}})
    values = merged(*sections)
    values["image"] = {
        "registry": "registry.local:5000",
        "repository": "mirror/nodefabric",
        "digest": "sha256:" + "0f" * 32,
    }
    values["scheduler"] |= {
        "image": {"repository": "registry.local:5000/k8s/kube-scheduler", "tag": "v1.33.4"},
        "replicas": 2,
        "verbosity": 4,
    }
    values["agent"] |= {
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
        "runtimeClassName": "nvidia",
        "driverRoot": "/run/nvidia/driver",
        "hostRoot": "/",
        "metricsPort": 19464,
        "healthPort": 19465,
    }
    values["crds"]["upgradeJob"]["allowDowngrade"] = True
    values["apiPriorityAndFairness"] = {
        "matchingPrecedence": 500,
        "nominalConcurrencyShares": 40,
        "lendablePercent": 0,
        "queuing": {"queues": 64, "handSize": 8, "queueLengthLimit": 100},
    }
    return values


@pytest.fixture(scope="module")
def knobbed(render) -> list[Doc]:
    return render(every_knob_values())


@pytest.mark.parametrize("kube_version", ["1.30.0", "1.33.0", "latest"])
def test_every_knob_set_renders_valid_kubernetes(render, kube_version: str) -> None:
    from kubernetes_validate.utils import latest_version

    version = latest_version() if kube_version == "latest" else kube_version
    validate_all(render(every_knob_values(), kube_version=version), version)


@pytest.mark.parametrize("path", sorted(PODS))
def test_placement_knobs_reach_the_pod(knobbed: list[Doc], path: str) -> None:
    spec = pod_spec(workload(knobbed, PODS[path]))
    for key in ("tolerations", "affinity", "priorityClassName"):
        assert spec[key] == EVERY_KNOB[key], (path, key)
    # Helm merges maps: the agent keeps its default kubernetes.io/os=linux beside the added key.
    assert EVERY_KNOB["nodeSelector"].items() <= spec["nodeSelector"].items()


@pytest.mark.parametrize("path", sorted(PODS))
def test_pod_labels_and_annotations_are_added_to_the_charts(
    knobbed: list[Doc], default_docs: list[Doc], path: str
) -> None:
    w = workload(knobbed, PODS[path])
    meta = w["spec"]["template"]["metadata"]
    assert EVERY_KNOB["podLabels"].items() <= meta["labels"].items()
    if w["kind"] != "Job":  # a Job selects its pods by uid
        assert w["spec"]["selector"]["matchLabels"].items() <= meta["labels"].items()
    # The chart's own annotations (the scheduler's configuration checksums) stay beside the added ones.
    own = workload(default_docs, PODS[path])["spec"]["template"]["metadata"].get("annotations", {})
    assert EVERY_KNOB["podAnnotations"].items() <= meta["annotations"].items()
    assert set(meta["annotations"]) == set(own) | set(EVERY_KNOB["podAnnotations"])


def test_pod_annotations_do_not_replace_the_charts(render, default_docs: list[Doc]) -> None:
    """A configuration change must still restart the scheduler pod: its checksums win over podAnnotations."""
    own = workload(default_docs, SCHEDULER)["spec"]["template"]["metadata"]["annotations"]
    assert set(own) == {"checksum/config", "checksum/extender-config"}
    docs = render({"scheduler": {"podAnnotations": {"checksum/config": "pinned", "a.example.com/b": "c"}}})
    meta = workload(docs, SCHEDULER)["spec"]["template"]["metadata"]
    assert meta["annotations"] == {**own, "a.example.com/b": "c"}


@pytest.mark.parametrize("path", sorted(PODS))
def test_pod_labels_may_not_change_the_selector(render, path: str) -> None:
    with pytest.raises(RenderError, match=re.escape("podLabels may not set app.kubernetes.io/component")):
        render(nest(path, {"podLabels": {"app.kubernetes.io/component": "other"}}))


@pytest.mark.parametrize("path", sorted(PODS))
def test_the_pod_security_context_merges_with_the_hardened_default(render, path: str) -> None:
    spec = pod_spec(workload(render(nest(path, {"securityContext": {"fsGroup": 2000}})), PODS[path]))
    assert spec["securityContext"]["fsGroup"] == 2000
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("path", sorted(CONTAINERS))
def test_container_security_contexts_merge_with_the_hardened_defaults(
    render, default_docs: list[Doc], path: str
) -> None:
    which = CONTAINERS[path]
    default_sc = ctr(default_docs, which)["securityContext"]
    docs = render(nest(path, {"containerSecurityContext": {"runAsGroup": 3000}}))
    assert ctr(docs, which)["securityContext"] == {**default_sc, "runAsGroup": 3000}
    # Only the container the values are for: the other container of the scheduler pod keeps its own.
    for other in set(CONTAINERS.values()) - {which}:
        assert ctr(docs, other)["securityContext"] == ctr(default_docs, other)["securityContext"]
    # null drops a default, as everywhere in Helm values (OpenShift assigns its own UIDs).
    dropped = ctr(render(nest(path, {"containerSecurityContext": {"runAsUser": None}})), which)[
        "securityContext"
    ]
    assert "runAsUser" not in dropped
    assert dropped["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("path", ["agent", "scheduler", "extender"])
def test_privileged_needs_privilege_escalation_allowed(render, path: str) -> None:
    with pytest.raises(
        RenderError, match=re.escape(f"{path}.containerSecurityContext: privileged=true needs allowPrivilege")
    ):
        render(nest(path, {"containerSecurityContext": {"privileged": True}}))
    docs = render(
        nest(path, {"containerSecurityContext": {"privileged": True, "allowPrivilegeEscalation": True}})
    )
    assert ctr(docs, CONTAINERS[path])["securityContext"]["privileged"] is True
    validate_all(docs)


@pytest.mark.parametrize("path", sorted(CONTAINERS))
def test_extra_env_and_resources(render, knobbed: list[Doc], path: str) -> None:
    c = ctr(knobbed, CONTAINERS[path])
    values = every_knob_values()
    section = values
    for key in path.split("."):
        section = section[key]
    section["extraEnv"] = []
    without = ctr(render(values), CONTAINERS[path])
    # The chart's own variables first, unchanged; the extra ones after them.
    assert c["env"] == without.get("env", []) + EVERY_KNOB["extraEnv"]
    assert c["resources"] == EVERY_KNOB["resources"]


def test_each_container_of_the_scheduler_pod_takes_its_own_resources(render) -> None:
    small = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
    big = {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    docs = render({"scheduler": {"resources": small}, "extender": {"resources": big}})
    assert (ctr(docs, SCHEDULER)["resources"], ctr(docs, EXTENDER)["resources"]) == (small, big)


@pytest.mark.parametrize("path", ["agent", "operator", "scheduler"])
def test_extra_volumes_are_mounted_beside_the_charts(
    knobbed: list[Doc], default_docs: list[Doc], path: str
) -> None:
    which = PODS[path]
    spec, before = pod_spec(workload(knobbed, which)), pod_spec(workload(default_docs, which))
    assert spec["volumes"][-1] == EXTRA_VOLUME
    assert [v["name"] for v in spec["volumes"]][: len(before["volumes"])] == [
        v["name"] for v in before["volumes"]
    ]
    assert ctr(knobbed, which)["volumeMounts"][-1] == EXTRA_MOUNT


def test_the_extender_mounts_the_scheduler_pods_volumes(
    render, knobbed: list[Doc], default_docs: list[Doc]
) -> None:
    before = ctr(default_docs, EXTENDER)["volumeMounts"]
    assert ctr(knobbed, EXTENDER)["volumeMounts"] == [*before, EXTRA_MOUNT]
    # Only the container the mounts are for.
    docs = render(
        {"scheduler": {"extraVolumes": [EXTRA_VOLUME]}, "extender": {"extraVolumeMounts": [EXTRA_MOUNT]}}
    )
    assert ctr(docs, EXTENDER)["volumeMounts"] == [*before, EXTRA_MOUNT]
    assert ctr(docs, SCHEDULER)["volumeMounts"] == ctr(default_docs, SCHEDULER)["volumeMounts"]
    validate_all(docs)


@pytest.mark.parametrize(
    "path",
    [
        "agent.extraVolumes",
        "agent.extraVolumeMounts",
        "operator.extraVolumes",
        "operator.extraVolumeMounts",
        "scheduler.extraVolumes",
        "scheduler.extraVolumeMounts",
        "extender.extraVolumeMounts",
        "scheduler.extraEnv",
        "extender.extraEnv",
    ],
)
def test_a_null_list_is_an_empty_one(render, default_docs: list[Doc], path: str) -> None:
    """`extraVolumes: ~` (clearing a value in an overlay) renders as the defaults, not a template crash."""
    which = CONTAINERS[path.partition(".")[0]]
    assert pod_spec(workload(render(nest(path, None)), which)) == pod_spec(workload(default_docs, which))


@pytest.mark.parametrize("path", sorted(LOGGING))
def test_log_level_and_format_reach_the_command_line(knobbed: list[Doc], path: str) -> None:
    from test_chart_workloads import parse

    args = [
        a.replace("$(NODE_NAME)", "n").replace("$(HOST_IP)", "10.0.0.1")
        for a in ctr(knobbed, LOGGING[path])["args"]
    ]
    ns = parse(args)
    assert (ns.log_level, ns.log_format) == ("DEBUG", "json")


def test_kube_scheduler_keeps_its_own_verbosity(knobbed: list[Doc], default_docs: list[Doc]) -> None:
    assert ctr(default_docs, SCHEDULER)["command"][-1] == "--v=2"
    command = ctr(knobbed, SCHEDULER)["command"]
    assert command[-1] == "--v=4"
    assert not [a for a in command if a.startswith(("--log", "--logging"))]


def test_the_crd_job_parses_its_command_line(render, default_docs: list[Doc]) -> None:
    from test_chart_workloads import parse

    ns = parse(ctr(default_docs, CRD_JOB)["args"])
    assert (ns.crd_action, ns.allow_downgrade, ns.dry_run, ns.kubeconfig) == ("apply", False, False, None)
    allowed = parse(ctr(render({"crds": {"upgradeJob": {"allowDowngrade": True}}}), CRD_JOB)["args"])
    assert allowed.allow_downgrade is True


@pytest.mark.parametrize(
    ("classes", "admitted"),
    [
        ({"scheduler": "system-cluster-critical"}, ["system-cluster-critical", "system-node-critical"]),
        (
            {
                "agent": "gpu-infra",
                "scheduler": "system-cluster-critical",
                "operator": "system-cluster-critical",
            },
            ["system-cluster-critical"],
        ),
        ({"scheduler": "gpu-infra", "operator": ""}, ["system-node-critical"]),
        ({"placement": "system-cluster-critical"}, ["system-cluster-critical", "system-node-critical"]),
    ],
)
def test_the_critical_pods_quota_admits_every_components_system_class(
    render, classes: dict[str, str], admitted: list[str]
) -> None:
    """Where the API server admits system-* classes outside kube-system only against a quota (GKE), a
    scheduler given system-cluster-critical would otherwise never start."""
    docs = render({path: {"priorityClassName": name} for path, name in classes.items()})
    (quota,) = of_kind(docs, "ResourceQuota")
    (expr,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert (expr["scopeName"], expr["operator"], expr["values"]) == ("PriorityClass", "In", admitted)
    for path, name in classes.items():
        assert (
            pod_spec(workload(docs, {**PODS, "placement": PLACEMENT}[path])).get("priorityClassName", "")
            == name
        )
    validate_all([quota])


# ServiceAccounts: created or brought, named, annotated; every reference follows.

# The admission policy that names each component's account, where one does.
POLICIES = {"agent": "nf-nodefabric-agent-own-node", "scheduler": "nf-nodefabric-extender-annotations"}


def bindings_naming(docs: list[Doc], account: str) -> set[str]:
    """The (Cluster)RoleBindings with the account among their subjects."""
    return {
        f"{b['kind']}/{b['metadata'].get('namespace', '')}/{b['metadata']['name']}"
        for b in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding")
        for s in b["subjects"]
        if s["kind"] == "ServiceAccount" and s["name"] == account and s["namespace"] == NAMESPACE
    }


def references_to(docs: list[Doc], component: str) -> dict[str, str]:
    """Every place outside RBAC that names the component's account: its pods, its FlowSchema subject, the
    admission policy that confines it."""
    refs = {"pod": pod_spec(workload(docs, ACCOUNTS[component]))["serviceAccountName"]}
    if component in ("agent", "operator"):
        (fs,) = of_kind(docs, "FlowSchema")
        names = [s["serviceAccount"]["name"] for s in fs["spec"]["rules"][0]["subjects"]]
        refs["flowschema"] = names[0] if component == "agent" else names[1]
    if component in POLICIES:
        policy = one(docs, "ValidatingAdmissionPolicy", POLICIES[component])
        expression = policy["spec"]["matchConditions"][0]["expression"]
        if " in [" in expression:  # the extender's policy: [extender account, scheduler account]
            users = json.loads(expression.split(" in ", 1)[1])
            expression = users[1] if component == "scheduler" else users[0]
        refs["policy"] = expression.rsplit(":", 1)[1].rstrip('"')
    return refs


@pytest.mark.parametrize("component", sorted(ACCOUNTS))
def test_a_named_account_is_used_everywhere(render, default_docs: list[Doc], component: str) -> None:
    docs = render(
        {component: {"serviceAccount": {"name": "gpu-fabric", "annotations": {"a.example.com/b": "c"}}}}
    )
    sa = one(docs, "ServiceAccount", "gpu-fabric")
    assert sa["metadata"]["annotations"] == {"a.example.com/b": "c"}
    assert set(references_to(docs, component).values()) == {"gpu-fabric"}
    # Every binding that named the default account names this one, and nothing names the default any more.
    default = f"nf-nodefabric-{component}"
    assert bindings_naming(docs, "gpu-fabric") == bindings_naming(default_docs, default) != set()
    assert bindings_naming(docs, default) == set()
    assert not [s for s in of_kind(docs, "ServiceAccount") if s["metadata"]["name"] == default]


@pytest.mark.parametrize("component", sorted(ACCOUNTS))
def test_a_brought_account_is_used_and_not_created(render, default_docs: list[Doc], component: str) -> None:
    docs = render({component: {"serviceAccount": {"create": False, "name": "preprovisioned"}}})
    assert not [
        s
        for s in of_kind(docs, "ServiceAccount")
        if s["metadata"]["name"] in ("preprovisioned", f"nf-nodefabric-{component}")
    ]
    assert set(references_to(docs, component).values()) == {"preprovisioned"}
    # It gets exactly the grants (and the built-in roles) the chart's own account had: no more, no less.
    assert grants_of(docs, "preprovisioned") == grants_of(default_docs, f"nf-nodefabric-{component}")
    assert bindings_naming(docs, "preprovisioned") == bindings_naming(
        default_docs, f"nf-nodefabric-{component}"
    )
    validate_all(docs)


@pytest.mark.parametrize("component", sorted(ACCOUNTS))
def test_a_brought_account_must_be_named(render, component: str) -> None:
    with pytest.raises(RenderError) as refused:
        render({component: {"serviceAccount": {"create": False}}})
    assert f"/{component}/serviceAccount/name" in str(refused.value)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (
            {"scheduler": {"serviceAccount": {"create": False, "name": "nf-nodefabric-agent"}}},
            "agent.serviceAccount and scheduler.serviceAccount both name the ServiceAccount "
            '"nf-nodefabric-agent"',
        ),
        (
            {"agent": {"serviceAccount": {"name": "gpu"}}, "operator": {"serviceAccount": {"name": "gpu"}}},
            'agent.serviceAccount and operator.serviceAccount both name the ServiceAccount "gpu"',
        ),
        (
            {"operator": {"serviceAccount": {"create": False, "name": "nf-nodefabric-crd-upgrade"}}},
            "the CRD upgrade hook's account and operator.serviceAccount both name",
        ),
    ],
)
def test_two_components_never_share_an_account(render, values: dict[str, Any], complaint: str) -> None:
    """kube-scheduler may bind pods and the extender patch them: on a shared account every node's agent
    could too."""
    assert complaint in refusal(render, values)


@pytest.mark.parametrize("component", sorted(ACCOUNTS))
@pytest.mark.parametrize("create", [True, False])
def test_no_component_runs_as_the_namespaces_default_account(render, component: str, create: bool) -> None:
    complaint = refusal(render, {component: {"serviceAccount": {"create": create, "name": "default"}}})
    assert f'{component}.serviceAccount.name may not be "default"' in complaint


def test_a_disabled_component_shares_nothing(render) -> None:
    values = {"scheduler": {"serviceAccount": {"create": False, "name": "nf-nodefabric-agent"}}}
    docs = render(values | {"extender": {"enabled": False}})
    assert pod_spec(workload(docs, AGENT))["serviceAccountName"] == "nf-nodefabric-agent"


# The agent's own knobs.


def test_update_strategy(render, default_docs: list[Doc]) -> None:
    assert workload(default_docs, AGENT)["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    pct = render({"agent": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "25%"}}}})
    assert workload(pct, AGENT)["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "25%"}
    # OnDelete carries no rollingUpdate, even though the default values hold one.
    on_delete = render({"agent": {"updateStrategy": {"type": "OnDelete"}}})
    assert workload(on_delete, AGENT)["spec"]["updateStrategy"] == {"type": "OnDelete"}
    validate_all(on_delete)


def host_volumes(docs: list[Doc]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec(workload(docs, AGENT))["volumes"]}


def mounts(docs: list[Doc]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in ctr(docs, AGENT)["volumeMounts"]}


@pytest.mark.parametrize(
    ("root", "sys", "dev"),
    [
        ("/", "/sys", "/dev"),
        ("//", "/sys", "/dev"),
        ("/opt/fixture/host/", "/opt/fixture/host/sys", "/opt/fixture/host/dev"),
        ("/opt//fixture/./host", "/opt/fixture/host/sys", "/opt/fixture/host/dev"),
    ],
)
def test_host_root_moves_the_host_paths_the_agent_reads(render, root: str, sys: str, dev: str) -> None:
    docs = render({"agent": {"hostRoot": root}})
    vols = host_volumes(docs)
    assert (vols["host-sys"]["hostPath"]["path"], vols["host-dev"]["hostPath"]["path"]) == (sys, dev)
    # The agent reads them at the same place whatever the host path.
    args = ctr(docs, AGENT)["args"]
    assert args[args.index("--root") + 1] == "/host"
    assert (mounts(docs)["host-sys"]["mountPath"], mounts(docs)["host-dev"]["mountPath"]) == (
        "/host/sys",
        "/host/dev",
    )


def test_host_paths_reach_the_pod_exactly_as_given(render) -> None:
    """A path is a value, never YAML: "#" does not start a comment, ": " does not start a key."""
    odd = "/srv/kubelet #2/a: b"
    values = {
        "agent": {"hostRoot": odd, "kubeletDevicePluginsPath": odd + "/dp", "driverRoot": odd + "/nv"},
        "dra": {"enabled": True, "kubeletPluginsPath": odd + "/p", "kubeletRegistryPath": odd + "/r",
                "cdiPath": odd + "/c"},
    }  # fmt: skip
    docs = render(values, kube_version="1.34.0")
    paths = {name: v["hostPath"]["path"] for name, v in host_volumes(docs).items() if "hostPath" in v}
    assert paths == {
        "host-sys": odd + "/sys",
        "host-dev": odd + "/dev",
        "device-plugins": odd + "/dp",
        "driver-root": odd + "/nv",
        "dra-plugin": odd + "/p/rdma.gpustack.ai",
        "dra-registry": odd + "/r",
        "cdi": odd + "/c",
    }
    assert {n: mounts(docs)[n]["mountPath"] for n in ("dra-plugin", "dra-registry", "cdi")} == {
        "dra-plugin": odd + "/p/rdma.gpustack.ai",
        "dra-registry": odd + "/r",
        "cdi": odd + "/c",
    }
    args = ctr(docs, AGENT)["args"]
    assert [args[args.index(f) + 1] for f in ("--dra-plugin-dir", "--dra-registry-dir", "--dra-cdi-dir")] == [
        odd + "/p",
        odd + "/r",
        odd + "/c",
    ]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hostRoot", "/fixture\n            type: Socket"),
        ("kubeletDevicePluginsPath", "/var/lib/kubelet/device-plugins\n"),
        ("driverRoot", "/run/nvidia/driver\t"),
    ],
)
def test_a_host_path_with_a_control_character_is_refused(render, key: str, value: str) -> None:
    assert f"/agent/{key}" in refusal(render, {"agent": {key: value}})


def test_no_driver_root_by_default(default_docs: list[Doc]) -> None:
    assert "driver-root" not in host_volumes(default_docs)
    assert "NVIDIA_DRIVER_ROOT" not in {e["name"] for e in ctr(default_docs, AGENT)["env"]}
    assert "runtimeClassName" not in pod_spec(workload(default_docs, AGENT))


@pytest.mark.parametrize("driver_root", ["/run/nvidia/driver", "/", "/home/kubernetes/bin/nvidia"])
def test_driver_root_is_mounted_read_only_and_named_for_nvml(render, driver_root: str) -> None:
    docs = render({"agent": {"driverRoot": driver_root}})
    volume = host_volumes(docs)["driver-root"]["hostPath"]
    assert volume == {"path": driver_root, "type": "DirectoryOrCreate"}
    mount = mounts(docs)["driver-root"]
    # Read-only, and seeing the GPU Operator's driver container mount it after the agent started.
    assert mount == {
        "name": "driver-root",
        "mountPath": "/driver-root",
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }
    env = {e["name"]: e.get("value") for e in ctr(docs, AGENT)["env"]}
    assert env["NVIDIA_DRIVER_ROOT"] == mount["mountPath"]
    validate_all(docs)


def test_nvidia_runtime_knobs(render, default_docs: list[Doc]) -> None:
    env = {e["name"]: e.get("value") for e in ctr(default_docs, AGENT)["env"]}
    # Where the NVIDIA runtime runs the pod: every GPU's device node and NVML, nothing for compute.
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["NVIDIA_DRIVER_CAPABILITIES"]) == ("all", "utility")
    docs = render({"agent": {"runtimeClassName": "nvidia", "nvidiaVisibleDevices": ""}})
    assert pod_spec(workload(docs, AGENT))["runtimeClassName"] == "nvidia"
    names = {e["name"] for e in ctr(docs, AGENT)["env"]}
    assert not names & {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}


# Hostile values, refused with the key named before anything reaches a cluster.


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        # Names: a prefix of every object's name and the app.kubernetes.io/name label's value.
        ({"nameOverride": "Node_Fabric"}, "/nameOverride"),
        ({"nameOverride": "x\n  injected: yes"}, "/nameOverride"),
        ({"fullnameOverride": "GPU.fabric"}, "/fullnameOverride"),
        ({"fullnameOverride": "a" * 64}, "/fullnameOverride"),
        # Labels on every object: the label syntax, and never one of the chart's own keys, which would be
        # written twice (the last wins) and move a pod template off its selector.
        ({"commonLabels": {"team": "has spaces"}}, "/commonLabels/team"),
        ({"commonLabels": {"bad key!": "x"}}, "invalid propertyName 'bad key!'"),
        (
            {"commonLabels": {"app.kubernetes.io/component": "gpu"}},
            "commonLabels may not set app.kubernetes.io/component: the chart sets it on every object",
        ),
        (
            {"serviceMonitor": {"enabled": True, "labels": {"app.kubernetes.io/instance": "kps"}}},
            "serviceMonitor.labels may not set app.kubernetes.io/instance: the chart sets it on every object",
        ),
        ({"serviceMonitor": {"labels": {"release": "kube prometheus"}}}, "/serviceMonitor/labels/release"),
        (
            {"prometheusRule": {"enabled": True, "labels": {"app.kubernetes.io/managed-by": "argocd"}}},
            "prometheusRule.labels may not set app.kubernetes.io/managed-by: the chart sets it",
        ),
    ],
)
def test_names_and_labels_every_object_carries_are_checked(
    render, values: dict[str, Any], complaint: str
) -> None:
    assert complaint in refusal(render, values)


def test_common_labels_reach_every_object_once(render) -> None:
    docs = render(
        {
            "commonLabels": {"team": "gpu-platform"},
            "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
        }
    )
    for d in docs:
        if d["kind"] == "CustomResourceDefinition":
            continue
        assert d["metadata"]["labels"]["team"] == "gpu-platform", d["metadata"]["name"]
    for monitor in of_kind(docs, "ServiceMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "kps"


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"agent": {"containerSecurityContext": {"runAsUsr": 0}}}, "runAsUsr"),
        (
            {"agent": {"containerSecurityContext": {"runAsUser": "root"}}},
            "/agent/containerSecurityContext/runAsUser",
        ),
        ({"operator": {"securityContext": {"fsgroup": 1}}}, "fsgroup"),
        ({"agent": {"tolerations": [{"key": "a", "operater": "Exists"}]}}, "operater"),
        ({"operator": {"affinity": {"nodeAfinity": {}}}}, "nodeAfinity"),
        ({"agent": {"extraVolumes": [{"name": "x", "hostpath": {"path": "/x"}}]}}, "hostpath"),
        ({"agent": {"extraVolumeMounts": [{"name": "x"}]}}, "mountPath"),
        ({"agent": {"extraEnv": [{"value": "no name"}]}}, "name"),
        ({"agent": {"extraEnv": [{"name": "A", "valu": "typo"}]}}, "valu"),
        ({"operator": {"resources": {"request": {"cpu": "1"}}}}, "request"),
        ({"agent": {"podLabels": {"team": "has spaces"}}}, "/agent/podLabels/team"),
        ({"agent": {"podLabels": {"-bad-key": "x"}}}, "invalid propertyName '-bad-key'"),
        ({"agent": {"nodeSelector": {"k": "v" * 64}}}, "/agent/nodeSelector/k"),
        ({"agent": {"serviceAccount": {"name": "Not_A_Name"}}}, "/agent/serviceAccount/name"),
        ({"agent": {"serviceAccount": {"annotation": {}}}}, "annotation"),
        ({"agent": {"logLevel": "verbose"}}, "/agent/logLevel"),
        ({"operator": {"logFormat": "logfmt"}}, "/operator/logFormat"),
        ({"crds": {"upgradeJob": {"logLevel": "trace"}}}, "/crds/upgradeJob/logLevel"),
        ({"crds": {"upgradeJob": {"enable": False}}}, "enable"),
        ({"agent": {"updateStrategy": {"type": "Rolling"}}}, "/agent/updateStrategy/type"),
        ({"agent": {"updateStrategy": {"rollingUpdate": {"maxSurge": 1}}}}, "maxSurge"),
        (
            {"agent": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": 0}}}},
            "/agent/updateStrategy/rollingUpdate/maxUnavailable",
        ),
        (
            {"agent": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "150%"}}}},
            "/agent/updateStrategy/rollingUpdate/maxUnavailable",
        ),
        ({"agent": {"hostRoot": "opt/host"}}, "/agent/hostRoot"),
        ({"agent": {"hostRoot": "/opt/../etc"}}, "/agent/hostRoot"),
        ({"agent": {"driverRoot": "run/nvidia/driver"}}, "/agent/driverRoot"),
        (
            {"agent": {"kubeletDevicePluginsPath": "/var/lib/kubelet/../../etc"}},
            "/agent/kubeletDevicePluginsPath",
        ),
        ({"agent": {"hostNetwork": "yes"}}, "/agent/hostNetwork"),
        ({"agent": {"metricsPort": 0}}, "/agent/metricsPort"),
        ({"agent": {"healthPort": 70000}}, "/agent/healthPort"),
        ({"agent": {"runtimeClassName": "NVIDIA"}}, "/agent/runtimeClassName"),
        ({"agent": {"nvidiaVisibleDevices": "all; rm -rf /"}}, "/agent/nvidiaVisibleDevices"),
        ({"agent": {"priorityClassName": "Critical"}}, "/agent/priorityClassName"),
        ({"image": {"digest": "sha256:abc"}}, "/image/digest"),
        ({"image": {"registry": "https://ghcr.io"}}, "/image/registry"),
        ({"image": {"repository": "GPUStack/NodeFabric"}}, "/image/repository"),
        ({"image": {"tag": "v1 latest"}}, "/image/tag"),
        (
            {"apiPriorityAndFairness": {"queuing": {"handSize": 9}}},
            "/apiPriorityAndFairness/queuing/handSize",
        ),
        ({"apiPriorityAndFairness": {"matchingPrecedence": 0}}, "/apiPriorityAndFairness/matchingPrecedence"),
        ({"apiPriorityAndFairness": {"lendablePercent": 101}}, "/apiPriorityAndFairness/lendablePercent"),
        ({"apiPriorityAndFairness": {"shares": 5}}, "shares"),
        # A volume or mount that would replace one of the chart's (a host mount, silently).
        ({"agent": {"extraVolumeMounts": [{"name": "nope", "mountPath": "/x"}]}}, 'no volume named "nope"'),
        (
            {"operator": {"extraVolumeMounts": [{"name": "nope", "mountPath": "/x"}]}},
            'no volume named "nope"',
        ),
        (
            {"agent": {"healthPort": 9464}},
            "agent.metricsPort and agent.healthPort must differ: both are 9464",
        ),
        ({"operator": {"metricsPort": 8080}}, "operator.metricsPort and operator.healthPort must differ"),
        (
            {"agent": {"extraVolumes": [{"name": "tmp", "emptyDir": {}}]}},
            'agent.extraVolumes: name "tmp" is used twice',
        ),
        (
            {"agent": {"extraVolumes": [{"name": "x", "emptyDir": {}}, {"name": "x", "emptyDir": {}}]}},
            '"x" is used twice',
        ),
        (
            {"agent": {"extraVolumeMounts": [{"name": "tmp", "mountPath": "/host/sys"}]}},
            'mountPath "/host/sys" is used twice',
        ),
        (
            {
                "agent": {
                    "driverRoot": "/run/nvidia/driver",
                    "extraVolumes": [{"name": "driver-root", "emptyDir": {}}],
                }
            },
            '"driver-root"',
        ),
        (
            {"operator": {"extraVolumes": [{"name": "tmp", "emptyDir": {}}]}},
            'operator.extraVolumes: name "tmp"',
        ),
        (
            {"operator": {"extraVolumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}},
            'mountPath "/tmp" is used twice',
        ),
        # The scheduler pod: its pod-level knobs under scheduler, the extender container's under extender.
        ({"scheduler": {"containerSecurityContext": {"runAsUsr": 0}}}, "runAsUsr"),
        (
            {"extender": {"containerSecurityContext": {"runAsUser": "root"}}},
            "/extender/containerSecurityContext/runAsUser",
        ),
        ({"scheduler": {"securityContext": {"fsgroup": 1}}}, "fsgroup"),
        ({"scheduler": {"tolerations": [{"key": "a", "operater": "Exists"}]}}, "operater"),
        ({"scheduler": {"affinity": {"podAntiAfinity": {}}}}, "podAntiAfinity"),
        ({"scheduler": {"nodeSelector": {"k": "v" * 64}}}, "/scheduler/nodeSelector/k"),
        ({"scheduler": {"priorityClassName": "Critical"}}, "/scheduler/priorityClassName"),
        ({"scheduler": {"podLabels": {"team": "has spaces"}}}, "/scheduler/podLabels/team"),
        ({"scheduler": {"serviceAccount": {"name": "Not_A_Name"}}}, "/scheduler/serviceAccount/name"),
        ({"scheduler": {"serviceAccount": {"annotation": {}}}}, "annotation"),
        ({"scheduler": {"extraEnv": [{"name": "A", "valu": "typo"}]}}, "valu"),
        ({"extender": {"extraEnv": [{"value": "no name"}]}}, "name"),
        ({"scheduler": {"resources": {"limit": {"memory": "1Gi"}}}}, "limit"),
        ({"extender": {"resources": {"requests": {"cpu": []}}}}, "/extender/resources/requests/cpu"),
        ({"scheduler": {"extraVolumes": [{"name": "x", "hostpath": {"path": "/x"}}]}}, "hostpath"),
        ({"extender": {"extraVolumeMounts": [{"name": "x"}]}}, "mountPath"),
        ({"extender": {"logLevel": "verbose"}}, "/extender/logLevel"),
        ({"extender": {"logFormat": "logfmt"}}, "/extender/logFormat"),
        # kube-scheduler's logging is scheduler.verbosity (--v); the extender's volumes are the pod's.
        ({"scheduler": {"logLevel": "debug"}}, "logLevel"),
        ({"extender": {"extraVolumes": []}}, "extraVolumes"),
        ({"extender": {"securityContext": {}}}, "securityContext"),
        (
            {"scheduler": {"extraVolumes": [{"name": "extender-config", "emptyDir": {}}]}},
            'scheduler.extraVolumes: name "extender-config" is used twice',
        ),
        (
            {
                "scheduler": {
                    "extraVolumeMounts": [{"name": "tmp", "mountPath": "/etc/kubernetes/nodefabric"}]
                }
            },
            'scheduler.extraVolumeMounts: mountPath "/etc/kubernetes/nodefabric" is used twice',
        ),
        (
            {"extender": {"extraVolumeMounts": [{"name": "config", "mountPath": "/etc/nodefabric"}]}},
            'extender.extraVolumeMounts: mountPath "/etc/nodefabric" is used twice',
        ),
        (
            {"extender": {"extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate"}]}},
            'extender.extraVolumeMounts: no volume named "ca"',
        ),
        (
            {"scheduler": {"extraVolumeMounts": [{"name": "nope", "mountPath": "/x"}]}},
            'scheduler.extraVolumeMounts: no volume named "nope"',
        ),
    ],
)
def test_values_kubernetes_would_refuse_are_refused_naming_the_key(
    render, values: dict[str, Any], complaint: str
) -> None:
    assert complaint in refusal(render, values)


def test_every_workload_of_the_knobbed_render_runs_the_pinned_image(knobbed: list[Doc]) -> None:
    for w in workloads(knobbed):
        for c in pod_spec(w)["containers"]:
            if c["name"] != "kube-scheduler":
                assert c["image"] == "registry.local:5000/mirror/nodefabric@sha256:" + "0f" * 32


def test_components_stay_in_the_release_namespace(knobbed: list[Doc]) -> None:
    for d in knobbed:
        if "namespace" in d["metadata"]:
            # The scheduler's auth-reader binding is in kube-system by design (it reads a ConfigMap there),
            # and the agent's and operator's right to create Events in "default" (where Events about their
            # cluster-scoped Devices records live) is a Role there: nothing else leaves the namespace.
            namespace = d["metadata"]["namespace"]
            assert namespace in (NAMESPACE, "kube-system", "default"), d["metadata"]["name"]
            if namespace != NAMESPACE:
                assert d["kind"] in ("Role", "RoleBinding"), d["metadata"]["name"]
            if namespace == "default" and d["kind"] == "Role":
                assert d["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def readme_values(name: str) -> dict[str, Any]:
    """The values example of the chart README marked `# values: <name>`."""
    import yaml
    from chart_support import CHART

    text = (CHART / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(# values: (\S+)\n.*?)```", text, flags=re.S)
    (found,) = [block for block, label in blocks if label == name]
    values: dict[str, Any] = yaml.safe_load(found)
    return values


def test_the_ascend_example_of_the_readme_renders_valid_and_mounts_the_driver(render) -> None:
    docs = render(readme_values("ascend"))
    validate_all(docs)
    c = ctr(docs, AGENT)
    mounted = {m["mountPath"]: m for m in c["volumeMounts"]}
    for path in ("/usr/local/Ascend/driver", "/usr/local/dcmi"):
        assert mounted[path]["readOnly"] is True
    env = {e["name"]: e.get("value", "") for e in c["env"]}
    # libdcmi.so is loaded by name: the mounted directories must be on the loader's path.
    assert {"/usr/local/dcmi", "/usr/local/Ascend/driver/lib64"} <= set(env["LD_LIBRARY_PATH"].split(":"))
    assert c["securityContext"]["privileged"] is True


def test_helm_lint_strict_passes_with_every_knob(helm, tmp_path) -> None:
    from chart_support import CHART, KUBE_VERSION, run_helm

    args = ["lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION]
    done = run_helm(helm, *args, values=every_knob_values(), tmp=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
