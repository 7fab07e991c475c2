"""Values passed into a pod as Kubernetes objects (tolerations, resources, extraEnv, extraVolumes, affinity,
security contexts, NetworkPolicy peers) are refused at `helm install` when the API server's own validation
would refuse the pod: the OpenAPI types say only "string" for a toleration's operator or a quantity, so the
schema carries the API server's rules too (hack/gen_values_schema.py API_RULES). Without them helm renders
the object, and the install fails on the DaemonSet or Deployment after helm has created other objects."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import Doc, container, one, pod_spec, refusal

OPERATOR = ("Deployment", "nf-nodefabric-operator")


def node_term(expression: dict[str, Any], field: str = "matchExpressions") -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{field: [expression]}]}
        }
    }


# (values, the JSON pointer helm names in its refusal): each is a pod the API server refuses.
REFUSED = {
    "toleration Exists with a value": (
        {"agent": {"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}},
        "/agent/tolerations/0/value",
    ),
    "toleration of every key, not Exists": (
        {"operator": {"tolerations": [{"operator": "Equal", "value": "x"}]}},
        "/operator/tolerations/0",
    ),
    "tolerationSeconds without NoExecute": (
        {"agent": {"tolerations": [{"key": "a", "operator": "Exists", "tolerationSeconds": 5}]}},
        "/agent/tolerations/0",
    ),
    "toleration key with a space": (
        {"agent": {"tolerations": [{"key": "a b", "operator": "Exists"}]}},
        "/agent/tolerations/0/key",
    ),
    "toleration operator Gt": (
        {"agent": {"tolerations": [{"key": "a", "operator": "Gt"}]}},
        "/agent/tolerations/0/operator",
    ),
    "toleration effect NoScheduled": (
        {"agent": {"tolerations": [{"key": "a", "operator": "Exists", "effect": "NoScheduled"}]}},
        "/agent/tolerations/0/effect",
    ),
    "toleration value no label value": (
        {"agent": {"tolerations": [{"key": "a", "value": "x y"}]}},
        "/agent/tolerations/0/value",
    ),
    "quantity that is no quantity": (
        {"agent": {"resources": {"limits": {"cpu": "lots"}}}},
        "/agent/resources/limits/cpu",
    ),
    "negative quantity": (
        {"operator": {"resources": {"requests": {"memory": "-64Mi"}}}},
        "/operator/resources/requests/memory",
    ),
    "quantity with a space": (
        {"placement": {"resources": {"requests": {"memory": "64 Mi"}}}},
        "/placement/resources/requests/memory",
    ),
    "negative number quantity": (
        {"scheduler": {"resources": {"requests": {"cpu": -1}}}},
        "/scheduler/resources/requests/cpu",
    ),
    "env name starting with a digit": (
        {"agent": {"extraEnv": [{"name": "1X", "value": "x"}]}},
        "/agent/extraEnv/0/name",
    ),
    "env name ..": ({"prune": {"extraEnv": [{"name": "..", "value": "x"}]}}, "/prune/extraEnv/0/name"),
    "env value beside valueFrom": (
        {
            "operator": {
                "extraEnv": [
                    {"name": "NODE", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                ]
            }
        },
        "/operator/extraEnv/0/value",
    ),
    "env valueFrom with two sources": (
        {
            "operator": {
                "extraEnv": [
                    {
                        "name": "NODE",
                        "valueFrom": {
                            "fieldRef": {"fieldPath": "spec.nodeName"},
                            "secretKeyRef": {"name": "s", "key": "k"},
                        },
                    }
                ]
            }
        },
        "/operator/extraEnv/0/valueFrom",
    ),
    "volume name no DNS label": (
        {"operator": {"extraVolumes": [{"name": "Bad_Name", "emptyDir": {}}]}},
        "/operator/extraVolumes/0/name",
    ),
    "volume with two sources": (
        {"operator": {"extraVolumes": [{"name": "v", "emptyDir": {}, "configMap": {"name": "c"}}]}},
        "/operator/extraVolumes/0",
    ),
    "node affinity key with a space": (
        {"operator": {"affinity": node_term({"key": "a b", "operator": "In", "values": ["x"]})}},
        "/matchExpressions/0/key",
    ),
    "node affinity In without values": (
        {"operator": {"affinity": node_term({"key": "a", "operator": "In", "values": []})}},
        "/matchExpressions/0",
    ),
    "node affinity Exists with values": (
        {"operator": {"affinity": node_term({"key": "a", "operator": "Exists", "values": ["x"]})}},
        "/matchExpressions/0",
    ),
    "node affinity Gt with two values": (
        {"operator": {"affinity": node_term({"key": "a", "operator": "Gt", "values": ["1", "2"]})}},
        "/matchExpressions/0",
    ),
    "node affinity operator Equals": (
        {"operator": {"affinity": node_term({"key": "a", "operator": "Equals", "values": ["x"]})}},
        "/matchExpressions/0/operator",
    ),
    "node field other than metadata.name": (
        {
            "operator": {
                "affinity": node_term({"key": "spec.x", "operator": "In", "values": ["n"]}, "matchFields")
            }
        },
        "/matchFields/0/key",
    ),
    "pod anti-affinity without a topology key": (
        {
            "operator": {
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": ""}]
                    }
                }
            }
        },
        "/topologyKey",
    ),
    "pod affinity selector value with a space": (
        {
            "operator": {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "a b"}}}
                        ]
                    }
                }
            }
        },
        "/labelSelector",
    ),
    "topology spread key with a space": (
        {
            "operator": {
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "a b", "whenUnsatisfiable": "DoNotSchedule"}
                ]
            }
        },
        "/operator/topologySpreadConstraints/0/topologyKey",
    ),
    "topology spread selector operator In without values": (
        {
            "operator": {
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "zone",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]},
                    }
                ]
            }
        },
        "/labelSelector/matchExpressions/0",
    ),
    "runAsUser negative": (
        {"operator": {"containerSecurityContext": {"runAsUser": -1}}},
        "/operator/containerSecurityContext/runAsUser",
    ),
    "fsGroup past int32": (
        {"agent": {"securityContext": {"fsGroup": 2147483648}}},
        "/agent/securityContext/fsGroup",
    ),
    "sysctl name with a space": (
        {"operator": {"securityContext": {"sysctls": [{"name": "net ipv4", "value": "1"}]}}},
        "/operator/securityContext/sysctls/0/name",
    ),
    "seccomp type unknown": (
        {"operator": {"securityContext": {"seccompProfile": {"type": "Default"}}}},
        "/operator/securityContext/seccompProfile/type",
    ),
    "seccomp Localhost without a profile": (
        {"extender": {"containerSecurityContext": {"seccompProfile": {"type": "Localhost"}}}},
        "/extender/containerSecurityContext/seccompProfile",
    ),
    "seccomp profile without Localhost": (
        {
            "operator": {
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault", "localhostProfile": "p"}}
            }
        },
        "/operator/securityContext/seccompProfile/localhostProfile",
    ),
    "hostPath type unknown": (
        {"agent": {"extraVolumes": [{"name": "v", "hostPath": {"path": "/opt/x", "type": "Dir"}}]}},
        "/agent/extraVolumes/0/hostPath/type",
    ),
    "hostPath with ..": (
        {"agent": {"extraVolumes": [{"name": "v", "hostPath": {"path": "/opt/../etc"}}]}},
        "/agent/extraVolumes/0/hostPath/path",
    ),
    "mount propagation unknown": (
        {"agent": {"extraVolumeMounts": [{"name": "host", "mountPath": "/x", "mountPropagation": "Shared"}]}},
        "/agent/extraVolumeMounts/0/mountPropagation",
    ),
    "absolute subPath": (
        {"operator": {"extraVolumeMounts": [{"name": "tmp", "mountPath": "/x", "subPath": "/etc"}]}},
        "/operator/extraVolumeMounts/0/subPath",
    ),
    "configMap item outside the volume": (
        {
            "operator": {
                "extraVolumes": [
                    {"name": "c", "configMap": {"name": "c", "items": [{"key": "k", "path": "../k"}]}}
                ]
            }
        },
        "/operator/extraVolumes/0/configMap/items/0/path",
    ),
    "secret mode past 0777": (
        {"operator": {"extraVolumes": [{"name": "s", "secret": {"secretName": "s", "defaultMode": 1000}}]}},
        "/operator/extraVolumes/0/secret/defaultMode",
    ),
    "resource claim the pod does not have": (
        {"operator": {"resources": {"claims": [{"name": "gpu"}]}}},
        "/operator/resources/claims",
    ),
    "network policy peer naming nothing": ({"networkPolicy": {"from": [{}]}}, "/networkPolicy/from/0"),
    "network policy ipBlock beside a selector": (
        {"networkPolicy": {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}},
        "/networkPolicy/from/0",
    ),
    "network policy cidr that is no CIDR": (
        {"networkPolicy": {"from": [{"ipBlock": {"cidr": "10.0.0.0"}}]}},
        "/networkPolicy/from/0/ipBlock/cidr",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_value_the_api_server_refuses_is_refused_at_install(render, case: str) -> None:
    values, pointer = REFUSED[case]
    said = refusal(render, values)
    assert "values don't meet the specifications of the schema" in said, said
    assert pointer in said, said


def test_what_the_api_server_takes_still_renders(render) -> None:
    """The rules refuse no form the API server takes: quantities of every syntax, each toleration shape,
    env from a field, a volume without a source (an emptyDir), Gt, matchFields, a Localhost profile, an
    IPv6 block."""
    docs: list[Doc] = render(
        {
            "agent": {
                "resources": {
                    "requests": {"cpu": ".5", "memory": "1e3", "ephemeral-storage": "+1Gi"},
                    "limits": {"cpu": 2, "memory": 500000000.5},
                },
                "tolerations": [
                    {"key": "a", "operator": "Equal", "value": "x", "effect": "NoSchedule"},
                    {"operator": "Exists"},
                    {"key": "b", "value": ""},
                    {
                        "key": "node.kubernetes.io/unreachable",
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": 30,
                    },
                ],
                "extraEnv": [
                    {"name": "NODE", "value": "", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                ],
            },
            "operator": {
                "securityContext": {
                    "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/p.json"},
                    "sysctls": [
                        {"name": "net.ipv4.ip_forward", "value": "1"},
                        {"name": "kernel/shm_rmid_forced", "value": "0"},
                    ],
                    "supplementalGroups": [1000],
                    "fsGroup": 0,
                },
                "extraVolumes": [
                    {"name": "scratch"},
                    {
                        "name": "cfg",
                        "configMap": {"name": "c", "items": [{"key": "k", "path": "conf/k", "mode": 0o600}]},
                    },
                    {"name": "opt", "hostPath": {"path": "/opt/x..y", "type": "DirectoryOrCreate"}},
                ],
                "extraVolumeMounts": [
                    {"name": "cfg", "mountPath": "/cfg", "subPath": "conf", "mountPropagation": "None"}
                ],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "gpu.count", "operator": "Gt", "values": ["3"]},
                                        {"key": "x", "operator": "DoesNotExist"},
                                    ],
                                    "matchFields": [
                                        {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}
                                    ],
                                }
                            ]
                        }
                    }
                },
            },
            "networkPolicy": {
                "enabled": True,
                "from": [
                    {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
                    {"ipBlock": {"cidr": "fd00::/8"}},
                    {"podSelector": {"matchLabels": {"a": "b"}}, "namespaceSelector": {}},
                ],
            },
        }
    )
    operator = one(docs, *OPERATOR)
    assert pod_spec(operator)["securityContext"]["seccompProfile"]["localhostProfile"] == "profiles/p.json"
    assert {"name": "scratch"} in pod_spec(operator)["volumes"]
    agent = one(docs, "DaemonSet", "nf-nodefabric-agent")
    assert container(agent, "agent")["resources"]["requests"]["cpu"] == ".5"


@pytest.mark.parametrize(
    ("values", "said"),
    [
        # A limit under the chart's default request, which merges in beside it: the usual way to get one.
        ({"agent": {"resources": {"limits": {"memory": "32Mi"}}}}, "agent.resources: requests.memory (64Mi)"),
        ({"prune": {"resources": {"limits": {"memory": "32Mi"}}}}, "prune.resources: requests.memory (64Mi)"),
        (
            {"extender": {"enabled": True, "resources": {"limits": {"memory": "100Mi"}}}},
            "extender.resources: requests.memory (128Mi)",
        ),
        (
            {"operator": {"resources": {"requests": {"cpu": "701m"}, "limits": {"cpu": "0.7"}}}},
            "operator.resources: requests.cpu (701m) is above limits.cpu (0.7)",
        ),
        (
            {"placement": {"resources": {"requests": {"memory": "1.5Gi"}, "limits": {"memory": "1.5G"}}}},
            "placement.resources: requests.memory (1.5Gi)",
        ),
        # An extended resource is never overcommitted: a request needs the same limit.
        (
            {"operator": {"resources": {"requests": {"nvidia.com/gpu": 1}}}},
            "operator.resources: requests.nvidia.com/gpu needs limits.nvidia.com/gpu",
        ),
        (
            {"agent": {"resources": {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}}}},
            "agent.resources: requests.nvidia.com/gpu (1) must equal limits.nvidia.com/gpu (2)",
        ),
        # E is the exa suffix here, not an exponent.
        (
            {"operator": {"resources": {"requests": {"memory": "2E"}, "limits": {"memory": "1E"}}}},
            "operator.resources: requests.memory (2E)",
        ),
    ],
)
def test_a_request_above_its_limit_is_refused_at_install(render, values: dict[str, Any], said: str) -> None:
    assert said in refusal(render, values)


def test_a_request_equal_to_its_limit_in_another_spelling_renders(render) -> None:
    pairs = [("700m", "0.7"), ("1", "1000m"), ("1.5G", "1500M"), ("1Gi", "1024Mi"), ("100u", "0.0001")]
    for request, limit in pairs:
        docs = render({"operator": {"resources": {"requests": {"cpu": request}, "limits": {"cpu": limit}}}})
        assert container(one(docs, *OPERATOR), "operator")["resources"]["limits"]["cpu"] == limit
    gpu = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": 1}}
    assert container(one(render({"operator": {"resources": gpu}}), *OPERATOR), "operator")["resources"] == {
        "requests": {"cpu": "20m", "memory": "144Mi", "nvidia.com/gpu": "1"},
        "limits": {"memory": "512Mi", "nvidia.com/gpu": 1},
    }
    # A default request dropped with null leaves a limit alone.
    docs = render({"agent": {"resources": {"requests": {"memory": None}, "limits": {"memory": "32Mi"}}}})
    assert (
        "memory"
        not in container(one(docs, "DaemonSet", "nf-nodefabric-agent"), "agent")["resources"]["requests"]
    )
