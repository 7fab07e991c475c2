"""Every per-component knob reaches the pod it is for, merges with the chart's defaults the way Helm
values do, and a value Kubernetes would refuse is refused at render time with the key named."""

from __future__ import annotations

import re
from typing import Any

import pytest
from chart_support import NAMESPACE, Doc, RenderError, container, of_kind, one, pod_spec, refusal, workloads
from test_chart_rbac import grants_of
from test_chart_validate import validate_all

AGENT = ("DaemonSet", "nf-nodefabric-agent", "agent")
OPERATOR = ("Deployment", "nf-nodefabric-operator", "operator")
CRD_JOB = ("Job", "nf-nodefabric-crd-upgrade", "crd-apply")
# (values path, (kind, workload, container)) of every component that takes the per-component knobs.
COMPONENTS = {"agent": AGENT, "operator": OPERATOR, "crds.upgradeJob": CRD_JOB}


def nest(path: str, value: Any) -> dict[str, Any]:
    """{"a.b": v} as Helm values: {"a": {"b": v}}."""
    out: dict[str, Any] = value
    for key in reversed(path.split(".")):
        out = {key: out}
    return out


def workload(docs: list[Doc], which: tuple[str, str, str]) -> Doc:
    return one(docs, which[0], which[1])


def ctr(docs: list[Doc], which: tuple[str, str, str]) -> dict[str, Any]:
    return container(workload(docs, which), which[2])


EVERY_KNOB: dict[str, Any] = {
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
    "containerSecurityContext": {"readOnlyRootFilesystem": True, "runAsGroup": 3000},
    "extraEnv": [
        {"name": "HTTPS_PROXY", "value": "http://proxy.local:3128"},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ],
    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
    "logLevel": "debug",
    "logFormat": "json",
}
WITH_VOLUMES = {
    "extraVolumes": [{"name": "ca", "configMap": {"name": "corporate-ca"}}],
    "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
}
SERVICE_ACCOUNT = {
    "serviceAccount": {"create": True, "name": "", "annotations": {"iam.example.com/role": "r"}}
}


def every_knob_values() -> dict[str, Any]:
    values: dict[str, Any] = {}
    for path in COMPONENTS:
        knobs = {**EVERY_KNOB}
        if path != "crds.upgradeJob":  # the hook's account is its own; it mounts nothing
            knobs |= WITH_VOLUMES | SERVICE_ACCOUNT
        section = nest(path, knobs)
        for top, sub in section.items():
            values.setdefault(top, {}).update(sub)
    values["image"] = {
        "registry": "registry.local:5000",
        "repository": "mirror/nodefabric",
        "digest": "sha256:" + "0f" * 32,
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


@pytest.mark.parametrize("path", sorted(COMPONENTS))
def test_placement_knobs_reach_the_pod(knobbed: list[Doc], path: str) -> None:
    spec = pod_spec(workload(knobbed, COMPONENTS[path]))
    for key in ("tolerations", "affinity", "priorityClassName"):
        assert spec[key] == EVERY_KNOB[key], (path, key)
    # Helm merges maps: the agent keeps its default kubernetes.io/os=linux beside the added key.
    assert EVERY_KNOB["nodeSelector"].items() <= spec["nodeSelector"].items()


@pytest.mark.parametrize("path", sorted(COMPONENTS))
def test_pod_labels_and_annotations_are_added_to_the_charts(knobbed: list[Doc], path: str) -> None:
    w = workload(knobbed, COMPONENTS[path])
    meta = w["spec"]["template"]["metadata"]
    assert EVERY_KNOB["podLabels"].items() <= meta["labels"].items()
    if w["kind"] != "Job":  # a Job selects its pods by uid
        assert w["spec"]["selector"]["matchLabels"].items() <= meta["labels"].items()
    assert meta["annotations"] == EVERY_KNOB["podAnnotations"]


@pytest.mark.parametrize("path", sorted(COMPONENTS))
def test_pod_labels_may_not_change_the_selector(render, path: str) -> None:
    with pytest.raises(RenderError, match=re.escape("podLabels may not set app.kubernetes.io/component")):
        render(nest(path, {"podLabels": {"app.kubernetes.io/component": "other"}}))


@pytest.mark.parametrize("path", sorted(COMPONENTS))
def test_security_contexts_merge_with_the_hardened_defaults(
    render, default_docs: list[Doc], path: str
) -> None:
    which = COMPONENTS[path]
    default_sc = ctr(default_docs, which)["securityContext"]
    docs = render(
        nest(path, {"securityContext": {"fsGroup": 2000}, "containerSecurityContext": {"runAsGroup": 3000}})
    )
    sc = ctr(docs, which)["securityContext"]
    assert sc == {**default_sc, "runAsGroup": 3000}
    assert pod_spec(workload(docs, which))["securityContext"]["fsGroup"] == 2000
    assert pod_spec(workload(docs, which))["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # null drops a default, as everywhere in Helm values (OpenShift assigns its own UIDs).
    dropped = ctr(render(nest(path, {"containerSecurityContext": {"runAsUser": None}})), which)[
        "securityContext"
    ]
    assert "runAsUser" not in dropped
    assert dropped["capabilities"] == {"drop": ["ALL"]}


def test_privileged_needs_privilege_escalation_allowed(render) -> None:
    with pytest.raises(RenderError, match="privileged=true needs allowPrivilegeEscalation=true"):
        render({"agent": {"containerSecurityContext": {"privileged": True}}})
    docs = render(
        {"agent": {"containerSecurityContext": {"privileged": True, "allowPrivilegeEscalation": True}}}
    )
    assert ctr(docs, AGENT)["securityContext"]["privileged"] is True
    validate_all(docs)


@pytest.mark.parametrize("path", sorted(COMPONENTS))
def test_extra_env_and_resources(render, knobbed: list[Doc], path: str) -> None:
    c = ctr(knobbed, COMPONENTS[path])
    values = every_knob_values()
    section = values
    for key in path.split("."):
        section = section[key]
    section["extraEnv"] = []
    without = ctr(render(values), COMPONENTS[path])
    # The chart's own variables first, unchanged; the extra ones after them.
    assert c["env"] == without.get("env", []) + EVERY_KNOB["extraEnv"]
    assert c["resources"] == EVERY_KNOB["resources"]


@pytest.mark.parametrize("path", ["agent", "operator"])
def test_extra_volumes_are_mounted_beside_the_charts(
    knobbed: list[Doc], default_docs: list[Doc], path: str
) -> None:
    which = COMPONENTS[path]
    spec, before = pod_spec(workload(knobbed, which)), pod_spec(workload(default_docs, which))
    assert spec["volumes"][-1] == WITH_VOLUMES["extraVolumes"][0]
    assert [v["name"] for v in spec["volumes"]][: len(before["volumes"])] == [
        v["name"] for v in before["volumes"]
    ]
    assert ctr(knobbed, which)["volumeMounts"][-1] == WITH_VOLUMES["extraVolumeMounts"][0]


@pytest.mark.parametrize("path", sorted(COMPONENTS))
def test_log_level_and_format_reach_the_command_line(knobbed: list[Doc], path: str) -> None:
    from test_chart_workloads import parse

    args = [
        a.replace("$(NODE_NAME)", "n").replace("$(HOST_IP)", "10.0.0.1")
        for a in ctr(knobbed, COMPONENTS[path])["args"]
    ]
    ns = parse(args)
    assert (ns.log_level, ns.log_format) == ("DEBUG", "json")


def test_the_crd_job_parses_its_command_line(render, default_docs: list[Doc]) -> None:
    from test_chart_workloads import parse

    ns = parse(ctr(default_docs, CRD_JOB)["args"])
    assert (ns.crd_action, ns.allow_downgrade, ns.dry_run, ns.kubeconfig) == ("apply", False, False, None)
    allowed = parse(ctr(render({"crds": {"upgradeJob": {"allowDowngrade": True}}}), CRD_JOB)["args"])
    assert allowed.allow_downgrade is True


# ServiceAccounts: created or brought, named, annotated; every reference follows.


def references_to(docs: list[Doc], component: str) -> dict[str, str]:
    """Every place the rendered chart names the component's account."""
    kind, name, _ = AGENT if component == "agent" else OPERATOR
    refs = {"pod": pod_spec(one(docs, kind, name))["serviceAccountName"]}
    for b in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding"):
        if b["metadata"]["name"] == name:
            (subject,) = b["subjects"]
            refs[f"{b['kind']}"] = subject["name"]
    (fs,) = of_kind(docs, "FlowSchema")
    names = [s["serviceAccount"]["name"] for s in fs["spec"]["rules"][0]["subjects"]]
    refs["flowschema"] = names[0] if component == "agent" else names[1]
    if component == "agent":
        policy = one(docs, "ValidatingAdmissionPolicy", "nf-nodefabric-agent-own-node")
        refs["policy"] = policy["spec"]["matchConditions"][0]["expression"].rsplit(":", 1)[1].rstrip('"')
    return refs


@pytest.mark.parametrize("component", ["agent", "operator"])
def test_a_named_account_is_used_everywhere(render, component: str) -> None:
    docs = render(
        {component: {"serviceAccount": {"name": "gpu-fabric", "annotations": {"a.example.com/b": "c"}}}}
    )
    sa = one(docs, "ServiceAccount", "gpu-fabric")
    assert sa["metadata"]["annotations"] == {"a.example.com/b": "c"}
    assert set(references_to(docs, component).values()) == {"gpu-fabric"}


@pytest.mark.parametrize("component", ["agent", "operator"])
def test_a_brought_account_is_used_and_not_created(render, component: str) -> None:
    docs = render({component: {"serviceAccount": {"create": False, "name": "preprovisioned"}}})
    assert not [
        s
        for s in of_kind(docs, "ServiceAccount")
        if s["metadata"]["name"] in ("preprovisioned", f"nf-nodefabric-{component}")
    ]
    assert set(references_to(docs, component).values()) == {"preprovisioned"}
    # It still gets exactly its role's grants.
    grants, _ = grants_of(docs, "preprovisioned")
    assert grants == grants_of(render(), f"nf-nodefabric-{component}")[0]
    validate_all(docs)


def test_a_brought_account_must_be_named(render) -> None:
    with pytest.raises(RenderError) as refused:
        render({"agent": {"serviceAccount": {"create": False}}})
    assert "/agent/serviceAccount/name" in str(refused.value)


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
            # The scheduler's auth-reader binding is in kube-system by design (it reads a ConfigMap there).
            assert d["metadata"]["namespace"] in (NAMESPACE, "kube-system"), d["metadata"]["name"]


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
