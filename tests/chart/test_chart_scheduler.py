"""The second scheduler and the extender beside it: one pod, the extender on 127.0.0.1 only, its
configuration, its rights on pods and the admission policy that confines them (CEL evaluated here)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from chart_support import (
    NAMESPACE,
    CelPolicy,
    Doc,
    RenderError,
    configmap_yaml,
    container,
    of_kind,
    one,
    pod_spec,
    refusal,
)
from test_chart_validate import validate_all

SCHEDULER = "nf-nodefabric-scheduler"
EXTENDER = "nf-nodefabric-extender"
# The configuration file the extender and the placement process share.
CONFIG = "nf-nodefabric-placement-config"
PLACEMENT = "nf-nodefabric-placement"
POLICY = "nf-nodefabric-extender-annotations"
SCHEDULER_USER = f"system:serviceaccount:{NAMESPACE}:{SCHEDULER}"
EXTENDER_USER = f"system:serviceaccount:{NAMESPACE}:{EXTENDER}"
DECISION, CLAIM = "placement.gpustack.ai/decision", "placement.gpustack.ai/claim"


# The optional second scheduler and its extender are off by default; this module covers them among the
# other components, so its renders turn them on (unless a test's values say otherwise).
pytestmark = pytest.mark.with_extender


def scheduler(docs: list[Doc]) -> Doc:
    return one(docs, "Deployment", SCHEDULER)


def scheduler_config(docs: list[Doc]) -> dict[str, Any]:
    cfg: dict[str, Any] = configmap_yaml(docs, SCHEDULER, "scheduler-config.yaml")
    return cfg


def extender_config(docs: list[Doc]) -> dict[str, Any]:
    cfg: dict[str, Any] = configmap_yaml(docs, CONFIG, "extender.yaml")
    return cfg


def parse(args: list[str]) -> Any:
    from nodefabric_operator.console import build_parser

    parser, command = build_parser(args)
    assert command is not None, args
    return parser.parse_args(args)


# Nobody else can reach it.


def test_the_profile_and_plugin_config_are_the_operators_to_shape(render) -> None:
    """scheduler.profile's fields go over the chart's (its name stays scheduler.name) and pluginConfig is
    passed as given, so a fleet can turn a score plugin off or set NodeResourcesFit's strategy."""
    plugins = {"score": {"disabled": [{"name": "NodeResourcesBalancedAllocation"}]}}
    fit = {
        "name": "NodeResourcesFit",
        "args": {"scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "cpu", "weight": 1}]}},
    }
    docs = render({"scheduler": {"profile": {"plugins": plugins}, "pluginConfig": [fit]}})
    (profile,) = scheduler_config(docs)["profiles"]
    assert profile == {
        "schedulerName": "nodefabric-scheduler",
        "percentageOfNodesToScore": 100,
        "plugins": plugins,
        "pluginConfig": [fit],
    }
    docs = render({"scheduler": {"profile": {"percentageOfNodesToScore": 50}}})
    assert scheduler_config(docs)["profiles"][0]["percentageOfNodesToScore"] == 50
    for bad in ({"profile": {"schedulerName": "default-scheduler"}}, {"pluginConfig": [{"args": {}}]}):
        with pytest.raises(RenderError):
            render({"scheduler": bad})


def test_a_plugin_config_given_twice_is_refused_not_dropped(render) -> None:
    """The profile's own pluginConfig would be replaced whole by scheduler.pluginConfig, without a word."""
    fit = {"name": "NodeResourcesFit", "args": {"scoringStrategy": {"type": "MostAllocated"}}}
    balanced = {"name": "NodeResourcesBalancedAllocation", "args": {}}
    said = refusal(render, {"scheduler": {"profile": {"pluginConfig": [fit]}, "pluginConfig": [balanced]}})
    assert "scheduler.profile.pluginConfig and scheduler.pluginConfig are both set" in said
    (profile,) = scheduler_config(render({"scheduler": {"profile": {"pluginConfig": [fit]}}}))["profiles"]
    assert profile["pluginConfig"] == [fit]


@pytest.mark.parametrize(
    ("profile", "pointer"),
    [
        (
            {"plugin": {"score": {"disabled": [{"name": "NodeResourcesBalancedAllocation"}]}}},
            "/scheduler/profile",
        ),
        ({"plugins": {"scores": {"disabled": [{"name": "ImageLocality"}]}}}, "/scheduler/profile/plugins"),
        (
            {"plugins": {"score": {"disable": [{"name": "ImageLocality"}]}}},
            "/scheduler/profile/plugins/score",
        ),
        (
            {"plugins": {"score": {"enabled": [{"nam": "ImageLocality"}]}}},
            "/scheduler/profile/plugins/score/enabled/0",
        ),
        ({"percentageOfNodesToScore": 101}, "/scheduler/profile/percentageOfNodesToScore"),
    ],
)
def test_a_profile_kube_scheduler_would_not_start_with_is_refused(
    render, profile: dict[str, Any], pointer: str
) -> None:
    """kube-scheduler decodes its configuration strictly: an unknown field in the profile (a typo) stops it
    at start, so the chart's second scheduler would crash-loop after an install that succeeded."""
    said = refusal(render, {"scheduler": {"profile": profile}})
    assert pointer in said, said


def test_the_scheduler_calls_its_own_extender_on_127_0_0_1(default_docs: list[Doc]) -> None:
    cfg = scheduler_config(default_docs)
    assert (
        cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1" and cfg["kind"] == "KubeSchedulerConfiguration"
    )
    (profile,) = cfg["profiles"]
    assert profile == {"schedulerName": "nodefabric-scheduler", "percentageOfNodesToScore": 100}
    (ext,) = cfg["extenders"]
    assert ext == {
        "urlPrefix": "http://127.0.0.1:8888",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": 5,
        "httpTimeout": "5s",
        "enableHTTPS": False,
        "nodeCacheCapable": True,
        "ignorable": False,
    }
    # The extender runs in the same pod and listens exactly there.
    ns = parse(container(scheduler(default_docs), "extender")["args"])
    assert (ns.address, ns.port, str(ns.config)) == ("127.0.0.1", 8888, "/etc/nodefabric/extender.yaml")
    assert (ns.metrics_port, ns.unhealthy_after) == (9102, 120.0)


def test_no_service_and_no_container_port_reach_filter_and_prioritize(default_docs: list[Doc]) -> None:
    assert not [d for d in default_docs if d["kind"] == "Deployment" and d["metadata"]["name"] == EXTENDER]
    extender = container(scheduler(default_docs), "extender")
    assert [p["containerPort"] for p in extender["ports"]] == [9102]
    for svc in of_kind(default_docs, "Service"):
        for port in svc["spec"]["ports"]:
            assert 8888 not in (port["port"], port.get("targetPort")), svc["metadata"]["name"]
    # The one Service of the scheduler pod carries metrics only.
    (metrics,) = [
        s for s in of_kind(default_docs, "Service") if s["metadata"]["name"] == f"{EXTENDER}-metrics"
    ]
    labels = scheduler(default_docs)["spec"]["template"]["metadata"]["labels"]
    assert metrics["spec"]["selector"].items() <= labels.items()
    assert metrics["spec"]["ports"] == [
        {"name": "metrics", "port": 9102, "targetPort": "ext-metrics", "protocol": "TCP"}
    ]


def test_probes_and_metrics_use_the_probe_listener(default_docs: list[Doc]) -> None:
    extender = container(scheduler(default_docs), "extender")
    assert extender["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "ext-metrics"}
    assert extender["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ext-metrics"}
    assert extender["securityContext"]["readOnlyRootFilesystem"] is True
    assert extender["resources"]["limits"]["memory"]


def test_ports_and_timings_follow_values(render) -> None:
    docs = render(
        {
            "scheduler": {"name": "gang-scheduler"},
            "extender": {
                "weight": 20,
                "httpTimeout": "2s",
                "port": 9999,
                "metricsPort": 9200,
                "unhealthyAfter": 300,
            },
            "serviceMonitor": {"enabled": True},
        }
    )
    cfg = scheduler_config(docs)
    assert cfg["profiles"][0]["schedulerName"] == "gang-scheduler"
    (ext,) = cfg["extenders"]
    assert (ext["weight"], ext["httpTimeout"], ext["urlPrefix"]) == (20, "2s", "http://127.0.0.1:9999")
    ns = parse(container(scheduler(docs), "extender")["args"])
    assert (ns.address, ns.port, ns.metrics_port, ns.unhealthy_after) == ("127.0.0.1", 9999, 9200, 300.0)
    (monitor,) = [m for m in of_kind(docs, "ServiceMonitor") if m["metadata"]["name"] == EXTENDER]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    service = one(docs, "Service", f"{EXTENDER}-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["port"] == 9200


def test_every_replica_runs_its_own_extender_and_one_leads(render) -> None:
    docs = render({"scheduler": {"replicas": 3}})
    d = scheduler(docs)
    assert d["spec"]["replicas"] == 3
    assert [c["name"] for c in pod_spec(d)["containers"]] == ["kube-scheduler", "extender"]
    election = scheduler_config(docs)["leaderElection"]
    assert election["leaderElect"] is True and election["resourceNamespace"] == NAMESPACE
    pdb = one(docs, "PodDisruptionBudget", SCHEDULER)
    assert pdb["spec"]["maxUnavailable"] == 1


def test_both_containers_restart_on_a_configuration_change(render, default_docs: list[Doc]) -> None:
    before = scheduler(default_docs)["spec"]["template"]["metadata"]["annotations"]
    after = scheduler(render({"extender": {"defaults": {"rank": "first-fit"}}}))["spec"]["template"][
        "metadata"
    ]
    assert after["annotations"]["checksum/extender-config"] != before["checksum/extender-config"]
    assert after["annotations"]["checksum/config"] == before["checksum/config"]
    d = scheduler(default_docs)
    mounts = {m["name"]: m for m in container(d, "extender")["volumeMounts"]}
    assert mounts["extender-config"] == {
        "name": "extender-config",
        "mountPath": "/etc/nodefabric",
        "readOnly": True,
    }
    (vol,) = [v for v in pod_spec(d)["volumes"] if v["name"] == "extender-config"]
    assert vol["configMap"]["name"] == CONFIG


# The extender's configuration file.


def test_extender_configuration_defaults_follow_the_domain(render, default_docs: list[Doc]) -> None:
    cfg = extender_config(default_docs)
    assert cfg["domain"] == "gpustack.ai"
    assert [lvl["name"] for lvl in cfg["levels"]] == ["fabric", "network-group", "zone", "region"]
    keys = {lvl["name"]: lvl["keys"] for lvl in cfg["levels"]}
    assert keys["fabric"] == ["feature.gpustack.ai/fabric.domain", "nvidia.com/gpu.clique"]
    assert keys["network-group"][0] == "topology.gpustack.ai/network-group"
    assert (keys["zone"], keys["region"]) == (
        ["topology.kubernetes.io/zone"],
        ["topology.kubernetes.io/region"],
    )
    assert (cfg["defaultLocality"], cfg["defaultRank"], cfg["homogeneousKeys"]) == ("prefer", "spread", [])
    assert cfg["homogeneousByResource"] == {
        "nvidia.com/gpu": ["nvidia.com/gpu.product"],
        "amd.com/gpu": ["amd.com/gpu.product-name"],
    }
    assert cfg["maxGroups"] == 10000
    other = extender_config(render({"domain": "example.com"}))
    assert other["levels"][0]["keys"][0] == "feature.example.com/fabric.domain"
    assert other["levels"][1]["keys"][0] == "topology.example.com/network-group"


def test_extender_configuration_follows_values(render) -> None:
    docs = render(
        {
            "extender": {
                "levels": {"networkGroup": ["example.com/rack"]},
                "defaults": {
                    "locality": "network_group",
                    "rank": "most_free_memory",
                    "homogeneous": ["example.com/torch"],
                    "homogeneousByResource": {
                        "nvidia.com/gpu": [],
                        "example.com/npu": ["example.com/npu.model"],
                    },
                },
                "maxGroups": 500,
                "extraConfig": {"claimTTLSeconds": 120},
            }
        }
    )
    cfg = extender_config(docs)
    assert cfg["levels"][1] == {
        "name": "network-group",
        "title": "network group",
        "keys": ["example.com/rack"],
    }
    assert (cfg["defaultLocality"], cfg["homogeneousKeys"], cfg["maxGroups"]) == (
        "network_group",
        ["example.com/torch"],
        500,
    )
    assert cfg["claimTTLSeconds"] == 120
    assert cfg["defaultRank"] == "most_free_memory"


# The settings the chart writes from values of its own; extraConfig may add the others, never these.
CHART_WRITES = {
    "domain": "domain",
    "levels": "extender.levels",
    "defaultLocality": "extender.defaults.locality",
    "defaultRank": "extender.defaults.rank",
    "homogeneousKeys": "extender.defaults.homogeneous",
    "homogeneousByResource": "extender.defaults.homogeneousByResource",
    "maxGroups": "extender.maxGroups",
    "groupReadyTimeoutSeconds": "placement.groupReadyTimeoutSeconds",
}


def extender_settings() -> set[str]:
    """Every key the extender's configuration file may hold, as its loader names them."""
    from nodefabric_operator.extender.config import ExtenderConfig

    return {f.alias or name for name, f in ExtenderConfig.model_fields.items()}


def test_extra_config_takes_every_setting_the_chart_does_not_write(render, tmp_path) -> None:
    from nodefabric_operator.extender.config import load_config

    assert set(CHART_WRITES) <= extender_settings()
    extra = {
        "acceleratorResources": ["nvidia.com/gpu", "example.com/npu"],
        "acceleratorMemoryLabel": "example.com/npu.memory",
        "claimTTLSeconds": 90.5,
        "reasonsWhenPlaced": False,
    }
    assert set(extra) == extender_settings() - set(CHART_WRITES), "a setting the test does not try"
    path = tmp_path / "extender.yaml"
    path.write_text(
        one(render({"extender": {"extraConfig": extra}}), "ConfigMap", CONFIG)["data"]["extender.yaml"]
    )
    loaded = load_config(path)
    assert loaded.accelerator_resources == ("nvidia.com/gpu", "example.com/npu")
    assert (loaded.accelerator_memory_label, loaded.claim_ttl_seconds, loaded.reasons_when_placed) == (
        "example.com/npu.memory",
        90.5,
        False,
    )


@pytest.mark.parametrize(("key", "value"), sorted(CHART_WRITES.items()))
def test_extra_config_never_silently_loses_to_a_value(render, key: str, value: str) -> None:
    """A setting the chart writes from a value of its own, given in extraConfig, is refused naming that
    value: it used to be dropped without a word."""
    complaint = refusal(render, {"extender": {"extraConfig": {key: "x"}}})
    assert f"extender.extraConfig.{key} is written from {value}: set that instead" in complaint


@pytest.mark.parametrize(
    ("extra", "complaint"),
    [
        ({"claimTTL": 300}, "invalid propertyName 'claimTTL'"),  # the extender refuses unknown keys at start
        ({"claimTTLSeconds": "5m"}, "/extender/extraConfig/claimTTLSeconds"),
        ({"claimTTLSeconds": 0}, "/extender/extraConfig/claimTTLSeconds"),
        ({"reasonsWhenPlaced": "no"}, "/extender/extraConfig/reasonsWhenPlaced"),
        ({"acceleratorResources": "nvidia.com/gpu"}, "/extender/extraConfig/acceleratorResources"),
        ({"acceleratorMemoryLabel": ["a"]}, "/extender/extraConfig/acceleratorMemoryLabel"),
    ],
)
def test_extra_config_the_extender_would_refuse_is_refused_at_render(
    render, extra: dict[str, Any], complaint: str
) -> None:
    assert complaint in refusal(render, {"extender": {"extraConfig": extra}})


@pytest.mark.parametrize("variant", ["default", "custom"])
def test_the_extender_accepts_the_rendered_configuration(render, tmp_path, variant: str) -> None:
    """The extender's own loader reads the file the chart writes: same keys, same defaults."""
    from nodefabric_operator.extender.config import ExtenderConfig, default_levels, load_config

    values = {} if variant == "default" else {
        "domain": "example.com",
        "extender": {
            "levels": {"zone": ["example.com/zone"]},
            "defaults": {
                "locality": "network_group",
                "rank": "first_fit",
                "homogeneousByResource": {"amd.com/gpu": [], "example.com/npu": ["example.com/npu.model"]},
            },
            "maxGroups": 7,
        },
    }  # fmt: skip
    path = tmp_path / "extender.yaml"
    path.write_text(one(render(values), "ConfigMap", CONFIG)["data"]["extender.yaml"])
    loaded = load_config(path)
    if variant == "default":
        assert loaded.levels == default_levels("gpustack.ai")
        defaults = ExtenderConfig()
        assert (loaded.default_locality, loaded.default_rank) == ("prefer", "spread")
        assert loaded.homogeneous_by_resource == defaults.homogeneous_by_resource
        assert (loaded.homogeneous_keys, loaded.max_groups) == (
            defaults.homogeneous_keys,
            defaults.max_groups,
        )
    else:
        assert loaded.domain == "example.com"
        assert loaded.levels[2].keys == ("example.com/zone",)
        assert loaded.levels[0].keys[0] == "feature.example.com/fabric.domain"
        assert (loaded.default_locality, loaded.default_rank, loaded.max_groups) == (
            "network-group",
            "first-fit",
            7,
        )
        assert loaded.homogeneity_for({"amd.com/gpu": 8}) == ()
        assert loaded.homogeneity_for({"example.com/npu": 1}) == ("example.com/npu.model",)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"extender": {"metricsPort": 0}}, "/extender/metricsPort"),
        ({"extender": {"unhealthyAfter": "2m"}}, "/extender/unhealthyAfter"),
        ({"extender": {"maxGroups": 0}}, "/extender/maxGroups"),
        ({"extender": {"defaults": {"rank": "random"}}}, "/extender/defaults/rank"),
        ({"extender": {"defaults": {"homogeneousByResource": {"nvidia.com/gpu": "nvidia.com/gpu.product"}}}},
         "/extender/defaults/homogeneousByResource"),
        ({"extender": {"defaults": {"homogeneousByResource": {"bad key!": []}}}},
         "invalid propertyName 'bad key!'"),
        # The extender runs in the scheduler's pod: pod-level knobs are the scheduler's.
        ({"extender": {"nodeSelector": {"a": "b"}}}, "nodeSelector"),
        ({"extender": {"admissionPolicy": {"enabled": "yes"}}}, "/extender/admissionPolicy/enabled"),
        ({"extender": {"metricsPort": 8888}}, "extender.port (8888) and extender.metricsPort (8888)"),
        ({"extender": {"port": 10259}}, "must differ from each other and from kube-scheduler's 10259"),
    ],
)  # fmt: skip
def test_values_schema_refuses_bad_extender_values(render, values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(RenderError) as refused:
        render(values)
    assert complaint in str(refused.value)


def test_renders_with_every_extender_knob_are_valid(render) -> None:
    docs = render(
        {
            "domain": "example.com",
            "scheduler": {"replicas": 2},
            "serviceMonitor": {"enabled": True},
            "extender": {
                "port": 9000,
                "metricsPort": 9001,
                "unhealthyAfter": 60,
                "maxGroups": 100,
                "defaults": {"locality": "zone", "rank": "first-fit", "homogeneous": ["example.com/torch"]},
                "admissionPolicy": {"enabled": True},
            },
        }
    )
    validate_all(docs)


# Least privilege on pods: patch, confined by an admission policy to the extender's own annotations.


def test_only_the_scheduler_account_may_patch_pods(default_docs: list[Doc]) -> None:
    holders = []
    for role in of_kind(default_docs, "ClusterRole") + of_kind(default_docs, "Role"):
        if any("pods" in r["resources"] and "patch" in r["verbs"] for r in role["rules"]):
            holders.append(role["metadata"]["name"])
    # The extender's annotation and the placement process's pinning, each confined by its own policy.
    assert sorted(holders) == [EXTENDER, PLACEMENT]
    (binding,) = [b for b in of_kind(default_docs, "ClusterRoleBinding") if b["roleRef"]["name"] == EXTENDER]
    # The extender's own account (its container uses that account's token), not kube-scheduler's.
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": EXTENDER, "namespace": NAMESPACE}]
    assert pod_spec(scheduler(default_docs))["serviceAccountName"] == SCHEDULER


def policy_parts(docs: list[Doc]) -> tuple[Doc, Doc]:
    return one(docs, "ValidatingAdmissionPolicy", POLICY), one(
        docs, "ValidatingAdmissionPolicyBinding", POLICY
    )


def test_the_policy_binds_denying_fails_closed_and_matches_every_pod_update(default_docs: list[Doc]) -> None:
    policy, binding = policy_parts(default_docs)
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    # A patch of pods arrives as UPDATE. pods/status too: the API server takes a pod's labels and
    # annotations in a status update as well (kube-scheduler holds that right for pod conditions).
    assert rule == {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["UPDATE"],
        "resources": ["pods", "pods/status"],
    }
    (cond,) = policy["spec"]["matchConditions"]
    # The extender's own account, and kube-scheduler's (its pod status writes are held to the same rule).
    assert cond["expression"] == f'request.userInfo.username in ["{EXTENDER_USER}","{SCHEDULER_USER}"]'


def test_the_policy_is_optional(render) -> None:
    docs = render({"extender": {"admissionPolicy": {"enabled": False}}})
    names = [d["metadata"]["name"] for d in docs]
    assert POLICY not in names
    assert "nf-nodefabric-agent-own-node" in names


class PodPolicy:
    """The extender's annotation policy for one pod UPDATE by `username`."""

    def __init__(self, policy: Doc) -> None:
        self.cel = CelPolicy(policy)

    def admit(self, username: str, old: Doc, new: Doc) -> tuple[bool, str]:
        return self.cel.admit({"operation": "UPDATE", "userInfo": {"username": username}}, new, old)


@pytest.fixture(scope="module")
def pod_policy(render) -> PodPolicy:
    return PodPolicy(policy_parts(render())[0])


POD: Doc = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "train-0",
        "namespace": "ml",
        "labels": {"placement.gpustack.ai/group": "train"},
        "annotations": {"placement.gpustack.ai/group-size": "8", "team": "ml"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u"}],
    },
    "spec": {"schedulerName": "nodefabric-scheduler", "containers": [{"name": "c", "image": "i"}]},
}


def changed(edit: Any) -> Doc:
    new = copy.deepcopy(POD)
    edit(new)
    return new


@pytest.mark.parametrize(
    ("case", "edit"),
    [
        ("writes its decision", lambda p: p["metadata"]["annotations"].update({DECISION: "placed: ..."})),
        ("changes nothing", lambda p: None),
    ],
)  # fmt: skip
def test_the_extender_may_write_its_own_annotations(pod_policy: PodPolicy, case: str, edit: Any) -> None:
    assert pod_policy.admit(SCHEDULER_USER, POD, changed(edit)) == (True, "allowed"), case


def test_the_extender_writes_no_claim_any_more(pod_policy: PodPolicy) -> None:
    """Claims are neither written nor read back: a claim (even one a user wrote) is not the extender's
    to add, change or remove."""
    write = changed(lambda p: p["metadata"]["annotations"].update({DECISION: "x", CLAIM: "{}"}))
    assert pod_policy.admit(SCHEDULER_USER, POD, write) == (False, ANNOTATIONS_ONLY)
    old = changed(lambda p: p["metadata"]["annotations"].update({DECISION: "placed", CLAIM: "{}"}))
    new = changed(lambda p: p["metadata"]["annotations"].update({DECISION: "wait"}))
    assert pod_policy.admit(SCHEDULER_USER, old, new) == (False, ANNOTATIONS_ONLY)
    bare = copy.deepcopy(POD)
    del bare["metadata"]["annotations"]
    assert pod_policy.admit(SCHEDULER_USER, bare, changed(lambda p: None)) == (False, ANNOTATIONS_ONLY)


ANNOTATIONS_ONLY = f"the nodefabric extender may change only the annotation {DECISION} of a pod"


@pytest.mark.parametrize(
    ("case", "edit", "message"),
    [
        ("a user's placement annotation", lambda p: p["metadata"]["annotations"].update(
            {"placement.gpustack.ai/group-size": "2"}), ANNOTATIONS_ONLY),
        ("another annotation removed", lambda p: p["metadata"]["annotations"].pop("team"), ANNOTATIONS_ONLY),
        ("an annotation added", lambda p: p["metadata"]["annotations"].update({"x": "y"}), ANNOTATIONS_ONLY),
        ("the node it runs on", lambda p: p["spec"].update(nodeName="gpu-7"),
         "the nodefabric extender may not change a pod's spec"),
        ("its scheduler", lambda p: p["spec"].update(schedulerName="default-scheduler"),
         "the nodefabric extender may not change a pod's spec"),
        ("a label", lambda p: p["metadata"]["labels"].update({"placement.gpustack.ai/group": "other"}),
         "the nodefabric extender may not change a pod's labels, finalizers or owners"),
        ("a finalizer", lambda p: p["metadata"].update(finalizers=["x/hold"]),
         "the nodefabric extender may not change a pod's labels, finalizers or owners"),
        ("its owner", lambda p: p["metadata"].pop("ownerReferences"),
         "the nodefabric extender may not change a pod's labels, finalizers or owners"),
    ],
)  # fmt: skip
def test_the_extender_may_change_nothing_else(
    pod_policy: PodPolicy, case: str, edit: Any, message: str
) -> None:
    assert pod_policy.admit(SCHEDULER_USER, POD, changed(edit)) == (False, message), case


def test_kube_schedulers_status_writes_pass_and_carry_no_metadata_change(pod_policy: PodPolicy) -> None:
    # What kube-scheduler writes through pods/status: its conditions and a nominated node.
    def unschedulable(p: Doc) -> None:
        p["status"] = {
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            "nominatedNodeName": "gpu-7",
        }

    assert pod_policy.admit(SCHEDULER_USER, POD, changed(unschedulable)) == (True, "allowed")

    # The same update carrying a label or another annotation is refused like a patch of the pod is.
    def relabel(p: Doc) -> None:
        unschedulable(p)
        p["metadata"]["labels"]["placement.gpustack.ai/group"] = "other"

    def annotate(p: Doc) -> None:
        unschedulable(p)
        p["metadata"]["annotations"]["placement.gpustack.ai/locality"] = "any"

    assert pod_policy.admit(SCHEDULER_USER, POD, changed(relabel)) == (
        False,
        "the nodefabric extender may not change a pod's labels, finalizers or owners",
    )
    assert pod_policy.admit(SCHEDULER_USER, POD, changed(annotate)) == (False, ANNOTATIONS_ONLY)


def test_other_users_are_not_confined_by_the_policy(pod_policy: PodPolicy) -> None:
    new = changed(lambda p: p["spec"].update(nodeName="gpu-7"))
    for user in (f"system:serviceaccount:{NAMESPACE}:nf-nodefabric-operator", "kubernetes-admin"):
        assert pod_policy.admit(user, POD, new) == (True, "not matched")


def test_the_policy_follows_the_domain(render) -> None:
    policy = PodPolicy(policy_parts(render({"domain": "example.com"}))[0])
    mine = changed(lambda p: p["metadata"]["annotations"].update({"placement.example.com/decision": "x"}))
    assert policy.admit(SCHEDULER_USER, POD, mine) == (True, "allowed")
    theirs = changed(lambda p: p["metadata"]["annotations"].update({DECISION: "x"}))
    assert policy.admit(SCHEDULER_USER, POD, theirs)[0] is False


def test_the_rendered_policy_is_yaml_a_cluster_accepts(default_docs: list[Doc]) -> None:
    policy, binding = policy_parts(default_docs)
    validate_all([policy, binding])
    assert yaml.safe_dump(policy)  # round-trips


def test_a_status_update_changes_nothing_but_the_status(pod_policy: PodPolicy) -> None:
    """kube-scheduler's own status writes (PodScheduled, nominatedNodeName) pass; a label, annotation or
    finalizer smuggled into a pods/status patch, which the API server would keep, does not."""
    scheduled = changed(
        lambda p: p.update(status={"conditions": [{"type": "PodScheduled", "status": "False"}]})
    )
    assert pod_policy.admit(SCHEDULER_USER, POD, scheduled) == (True, "allowed")
    relabelled = copy.deepcopy(scheduled)
    relabelled["metadata"]["labels"]["placement.gpustack.ai/group"] = "other"
    assert pod_policy.admit(SCHEDULER_USER, POD, relabelled)[0] is False
