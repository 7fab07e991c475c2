"""The chart lints, renders for default and varied values, and every manifest is valid Kubernetes."""

from __future__ import annotations

import copy
import functools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils as kvutils
import pytest
import yaml
from chart_support import CHART, KUBE_VERSION, ROOT, Doc, of_kind, one, refusal, run_helm
from referencing import Registry, Resource

# Values a cluster operator plausibly sets; each must render and validate.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "node-sink": {"labelSink": "node"},
    "everything-on": {
        "serviceMonitor": {
            "enabled": True,
            "interval": "15s",
            "labels": {"release": "prometheus"},
            "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}],
            "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "python_gc_.*", "action": "drop"}],
        },
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
        "networkPolicy": {
            "enabled": True,
            "from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        },
        "scheduler": {"replicas": 2, "image": {"tag": "v1.33.4"}},
        "extender": {"enabled": True},
        "agent": {
            "families": {"shared": False, "partitioned": False},
            "runtimeClassName": "nvidia",
            "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.local:3128"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
                                ]
                            }
                        ]
                    }
                }
            },
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "commonLabels": {"team": "gpu-platform"},
        "operator": {"priorityClassName": "system-cluster-critical", "podAnnotations": {"a": "b"}},
    },
    "agent-only": {
        "operator": {"enabled": False},
        "extender": {"enabled": False},
        "placement": {"enabled": False},
    },
    "no-admission-policy": {"agent": {"admissionPolicy": {"enabled": False}}},
    "custom-domain-and-levels": {
        "domain": "example.com",
        "extender": {
            "enabled": True,
            "levels": {"networkGroup": ["example.com/rack"], "zone": ["example.com/zone"]},
            "defaults": {"locality": "zone", "rank": "first-fit", "homogeneous": []},
            "weight": 10,
            "httpTimeout": "2500ms",
        },
    },
}

PROMETHEUS_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
# Custom resources kubernetes-validate has no schema for, checked here against the fields we emit
# (a subset of monitoring.coreos.com/v1 ServiceMonitor from the prometheus-operator CRD).
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {
                                "type": "string",
                                "pattern": PROMETHEUS_DURATION,
                            },
                            "relabelings": {"type": "array", "items": {"type": "object"}},
                            "metricRelabelings": {"type": "array", "items": {"type": "object"}},
                        },
                    },
                },
            },
        },
    },
}
# The fields of monitoring.coreos.com/v1 PrometheusRule the chart emits.
PROMETHEUS_RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string"},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["alert", "expr"],
                                    "properties": {
                                        "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": PROMETHEUS_DURATION},
                                        "labels": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}
CUSTOM_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR_SCHEMA,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE_SCHEMA,
}


@functools.cache
def kube_validator(kind: str, api_version: str, kube_version: str) -> jsonschema.protocols.Validator:
    """kubernetes_validate.validate(doc, kube_version, strict=True) for one kind, built once: the library
    reads the version's 1.4 MB _definitions.json and resolves its references again on every call, a
    second per render; the chart tests validate hundreds. The same steps as the library's validate():
    the newest bundled schema version not newer than `kube_version`, its -local-strict directory."""
    if kvutils.major_minor(kube_version) > kvutils.latest_version():
        raise kubernetes_validate.VersionNotSupportedError(version=kvutils.major_minor(kube_version))
    wanted = kvutils.major_minor(kube_version)
    version = [v for v in kvutils.all_versions() if kvutils.major_minor(v) <= wanted][-1]
    # rbac.authorization.k8s.io/v1 -> rbac-v1
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    try:
        schema = kvutils.schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", kube_version)
    except FileNotFoundError:
        raise kubernetes_validate.SchemaNotFoundError(
            version=kvutils.major_minor(kube_version), kind=kind, api_version=api_version
        ) from None
    definitions = kvutils.schema_contents(f"{folder}/_definitions.json", kube_version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


@functools.cache
def custom_validator(key: tuple[str, str]) -> jsonschema.protocols.Validator:
    schema = CUSTOM_SCHEMAS[key]
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate_all(docs: list[Doc], kube_version: str = KUBE_VERSION) -> None:
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if key in CUSTOM_SCHEMAS:
            custom_validator(key).validate(doc)
            continue
        try:
            kube_validator(doc["kind"], doc["apiVersion"], kube_version).validate(doc)
        except jsonschema.ValidationError as e:
            pytest.fail(f"{where} is invalid at {'.'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"{where}: no schema, neither bundled nor in CUSTOM_SCHEMAS")


def test_the_cached_validator_judges_as_kubernetes_validate_does() -> None:
    good = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    }
    unknown_field = copy.deepcopy(good)
    # a field the schema does not name: strict mode refuses it
    unknown_field["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    wrong_type = copy.deepcopy(good)
    wrong_type["spec"]["replicas"] = "3"
    for version in (KUBE_VERSION, "1.30.0", kvutils.latest_version()):
        kubernetes_validate.validate(good, version, strict=True)
        kube_validator("Deployment", "apps/v1", version).validate(good)
        for bad in (unknown_field, wrong_type):
            with pytest.raises(kubernetes_validate.ValidationError) as theirs:
                kubernetes_validate.validate(bad, version, strict=True)
            with pytest.raises(jsonschema.ValidationError) as ours:
                kube_validator("Deployment", "apps/v1", version).validate(bad)
            assert list(ours.value.path) == list(theirs.value.path)
            assert ours.value.message == theirs.value.message
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "r"},
        "rules": [],
    }
    kube_validator("Role", "rbac.authorization.k8s.io/v1", KUBE_VERSION).validate(role)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kube_validator("Gadget", "example.com/v1", KUBE_VERSION)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_manifest_is_valid(render, variant: str) -> None:
    docs = render(VARIANTS[variant])
    assert docs
    validate_all(docs)


@pytest.mark.parametrize("kube_version", ["1.30.0", "latest"])
def test_manifests_are_valid_from_the_oldest_supported_to_the_newest_kubernetes(
    render, kube_version: str
) -> None:
    from kubernetes_validate.utils import latest_version

    version = latest_version() if kube_version == "latest" else kube_version
    validate_all(render(VARIANTS["everything-on"], kube_version=version), version)


@pytest.mark.parametrize("variant", ["default", "node-sink", "everything-on"])
def test_helm_lint_strict_passes(helm: Path, tmp_path: Path, variant: str) -> None:
    done = run_helm(
        helm,
        "lint",
        "--strict",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        values=VARIANTS[variant],
        tmp=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_kubernetes_validate_cli_accepts_the_default_render(helm: Path, tmp_path: Path) -> None:
    done = run_helm(
        helm,
        "template",
        "nf",
        str(CHART),
        "-n",
        "nodefabric",
        "--kube-version",
        KUBE_VERSION,
        "--include-crds",
        values=None,
        tmp=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(done.stdout)
    cli = Path(sys.executable).with_name("kubernetes-validate")
    checked = subprocess.run(
        [str(cli), "--strict", "-k", KUBE_VERSION, str(rendered)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Every document was checked against a schema, none merely warned about.
    assert "WARN" not in checked.stdout
    assert checked.stdout.count("passed for resource") == len(
        [d for d in yaml.safe_load_all(done.stdout) if d]
    )


def test_the_default_render_holds_each_component(default_docs: list[Doc]) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in default_docs}
    for expected in [
        ("CustomResourceDefinition", "devices.worker.gpustack.ai"),
        ("DaemonSet", "nf-nodefabric-agent"),
        ("Deployment", "nf-nodefabric-operator"),
        ("ValidatingAdmissionPolicy", "nf-nodefabric-agent-own-node"),
        ("ValidatingAdmissionPolicyBinding", "nf-nodefabric-agent-own-node"),
        # The placement process and its webhook (tests/chart/test_chart_placement.py).
        ("CustomResourceDefinition", "placementgroups.placement.gpustack.ai"),
        ("Deployment", "nf-nodefabric-placement"),
        ("MutatingWebhookConfiguration", "nf-nodefabric-placement"),
    ]:
        assert expected in kinds
    # Opt-in or only useful with a standby replica: the second scheduler and its extender are optional.
    assert not [n for k, n in kinds if "scheduler" in n or "extender" in n]
    assert not of_kind(default_docs, "ServiceMonitor")
    # The placement process runs two replicas (its webhook answers through a drain): its budget only.
    assert [p["metadata"]["name"] for p in of_kind(default_docs, "PodDisruptionBudget")] == [
        "nf-nodefabric-placement"
    ]


def test_the_chart_ships_the_devices_crd_generated_from_the_models(default_docs: list[Doc]) -> None:
    crd = one(default_docs, "CustomResourceDefinition", "devices.worker.gpustack.ai")
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["kind"] == "Devices"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    # helm installs crds/ as-is, so the chart's copy must be the generated file, not a drifted one.
    generated = ROOT / "crds" / "worker.gpustack.ai_devices.yaml"
    if generated.exists():
        assert (CHART / "crds" / generated.name).read_text() == generated.read_text()


def test_disabled_components_render_nothing_of_theirs(render) -> None:
    docs = render(VARIANTS["agent-only"])
    # The CRDs (crds/) are installed whatever the values say.
    names = [d["metadata"]["name"] for d in docs if d["kind"] != "CustomResourceDefinition"]
    assert not [
        n for n in names if "operator" in n or "extender" in n or "scheduler" in n or "placement" in n
    ]
    assert of_kind(docs, "DaemonSet")
    no_agent = render({"agent": {"enabled": False}})
    assert not [d for d in no_agent if "agent" in d["metadata"]["name"]]


def test_servicemonitors_select_a_service_port_that_exists(render) -> None:
    docs = render(VARIANTS["everything-on"])
    monitors = of_kind(docs, "ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {
        "nf-nodefabric-agent",
        "nf-nodefabric-operator",
        "nf-nodefabric-extender",
        "nf-nodefabric-placement",
    }
    services = of_kind(docs, "Service")
    for m in monitors:
        assert m["metadata"]["labels"]["release"] == "prometheus"
        wanted = m["spec"]["selector"]["matchLabels"]
        matched = [s for s in services if wanted.items() <= s["metadata"]["labels"].items()]
        assert len(matched) == 1, m["metadata"]["name"]
        ports = {p["name"] for p in matched[0]["spec"]["ports"]}
        assert m["spec"]["endpoints"][0]["port"] in ports
        assert m["spec"]["endpoints"][0]["interval"] == "15s"


def test_pdb_only_with_a_standby_scheduler(render) -> None:
    (pdb,) = of_kind(
        render({"scheduler": {"replicas": 2}, "extender": {"enabled": True}, "placement": {"replicas": 1}}),
        "PodDisruptionBudget",
    )
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "scheduler"


def test_names_fit_kubernetes_limits_with_a_long_release_name(render) -> None:
    release = "a-very-long-release-name-for-the-gpu-cluster-in-prod"
    assert len(release) <= 53  # helm's own limit on release names
    docs = render({"serviceMonitor": {"enabled": True}}, release=release)
    for d in docs:
        assert len(d["metadata"]["name"]) <= 63, d["metadata"]["name"]
    validate_all(docs)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"labelSink": "configmap"}, "/labelSink"),
        ({"agent": {"sharedCount": 0}}, "/agent/sharedCount"),
        ({"agent": {"interval": "60"}}, "/agent/interval"),
        ({"agent": {"intervall": 30}}, "intervall"),
        ({"domain": "Not A Domain"}, "/domain"),
        ({"extender": {"defaults": {"locality": "rack"}}}, "/extender/defaults/locality"),
        ({"extender": {"levels": {"zone": ["has spaces/zone"]}}}, "/extender/levels/zone/0"),
        ({"extender": {"httpTimeout": "5"}}, "/extender/httpTimeout"),
        ({"scheduler": {"name": "Nodefabric_Scheduler"}}, "/scheduler/name"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ],
)
def test_values_schema_refuses_bad_values_naming_the_key(
    render, values: dict[str, Any], complaint: str
) -> None:
    assert complaint in refusal(render, values)


def test_values_yaml_documents_every_key() -> None:
    """Every chart setting in values.yaml has a comment right above it; free-form maps and lists that
    pass straight into the pod (resources, nodeSelector, tolerations, ...) are documented as a whole."""
    free_form = {
        "resources", "nodeSelector", "tolerations", "affinity", "podAnnotations", "podLabels", "labels",
        "annotations", "securityContext", "containerSecurityContext", "extraEnv", "extraVolumes",
        "extraVolumeMounts", "livenessProbe", "readinessProbe",
    }  # fmt: skip
    undocumented = []
    path: list[tuple[int, str]] = []
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0]
        while path and path[-1][0] >= indent:
            path.pop()
        inside_free_form = any(k in free_form for _, k in path)
        path.append((indent, key))
        is_section = stripped.endswith(":")
        if inside_free_form or is_section:
            continue
        if not lines[i - 1].strip().startswith("#"):
            undocumented.append(".".join(k for _, k in path))
    assert not undocumented, undocumented
