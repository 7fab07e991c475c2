"""The API server's naming and format rules on the chart's renders, not only the OpenAPI schema.

`kubernetes-validate` checks types; the API server also refuses names: a container port name of 16
characters, a Service named with a dot, a label value with a space, an environment variable starting with
a digit. The rules are the embedded API's own (nodefabric_operator.demo.kubeapi.naming), and
chart_support.run_helm applies them to every render any chart test makes. Here: the rules themselves,
proof that the hook is on the path, and the variants rendered on purpose (every boolean and enum of the
values schema, each way, with the extender on; long release names; DRA, sinks, ServiceMonitor).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from chart_support import (
    CHART,
    RENDERS_CHECKED,
    ApiRefusal,
    Doc,
    api_refusals,
    container,
    one,
    refusal,
    run_helm,
)

from nodefabric_operator.demo.kubeapi.naming import (
    config_key_errors,
    dns1035_label_errors,
    env_var_name_errors,
    name_rule,
    object_causes,
    path_segment_errors,
    port_name_errors,
)

DRA_KUBE = "1.34.0"  # dra.enabled needs resource.k8s.io/v1; every variant renders for the same cluster
EXTENDER_ON: dict[str, Any] = {"extender": {"enabled": True}}


def merged(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        _merge(out, copy.deepcopy(part))
    return out


def _merge(into: dict[str, Any], more: dict[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


# --- the rules --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "errors"),
    [
        ("metrics", []),
        ("ext-metrics", []),
        ("a" * 15, []),
        ("extender-metrics", ["must be no more than 15 bytes"]),
        ("Metrics", ["must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"]),
        ("9102", ["must contain at least one letter (a-z)"]),
        ("a--b", ["must not contain consecutive hyphens"]),
        ("-a", ["must not begin or end with a hyphen"]),
        ("a-", ["must not begin or end with a hyphen"]),
        (
            "",
            [
                "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
                "must contain at least one letter (a-z)",
            ],
        ),
        ("métrics", ["must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"]),
    ],
)
def test_port_names_are_iana_service_names(name: str, errors: list[str]) -> None:
    assert port_name_errors(name) == errors


def test_the_other_syntaxes() -> None:
    assert dns1035_label_errors("nf-nodefabric-extender-metrics") == []
    assert dns1035_label_errors("1abc") and dns1035_label_errors("a.b") and dns1035_label_errors("a" * 64)
    assert env_var_name_errors("NODE_NAME") == [] and env_var_name_errors("my.env-name") == []
    assert "must not start with a digit" in env_var_name_errors("1BAD")[0]
    assert env_var_name_errors("..x") == ["must not start with '..'"]
    assert env_var_name_errors("A=B") and env_var_name_errors("")
    assert config_key_errors("extender.yaml") == [] and config_key_errors("a/b")
    assert path_segment_errors("system:nodefabric") == [] and path_segment_errors("a/b") == [
        "may not contain '/'"
    ]
    assert name_rule("", "Service") is dns1035_label_errors
    assert name_rule("rbac.authorization.k8s.io", "ClusterRole") is path_segment_errors


def test_object_causes_name_the_field_as_the_api_server_does() -> None:
    pod = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "ports": [{"name": "extender-metrics", "containerPort": 9102}],
                            "env": [{"name": "1BAD", "value": "x"}],
                            "livenessProbe": {"httpGet": {"path": "/", "port": "extender-metrics"}},
                        }
                    ]
                },
            },
        },
    }
    fields = [(c.field, c.message) for c in object_causes(pod)]
    too_long = 'Invalid value: "extender-metrics": must be no more than 15 bytes'
    assert fields[0] == ("spec.template.spec.containers[0].ports[0].name", too_long)
    assert fields[1][0] == "spec.template.spec.containers[0].env[0].name"
    assert fields[2] == ("spec.template.spec.containers[0].livenessProbe.httpGet.port", too_long)
    assert len(fields) == 3


def test_a_job_name_must_fit_the_label_its_pods_get() -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j" * 64}, "spec": {"template": {}}}
    assert [(c.field, c.message) for c in object_causes(job)] == [
        ("spec.template.labels", f'Invalid value: "{"j" * 64}": must be no more than 63 bytes')
    ]
    job["metadata"]["name"] = "j" * 63
    assert object_causes(job) == []


# --- the hook -------------------------------------------------------------------------------------------


def test_every_render_of_the_chart_tests_is_checked(render, helm, tmp_path) -> None:
    """A render through the fixture (values nothing else refuses) fails on the API server's rules."""
    before = RENDERS_CHECKED[0]
    # Each annotation is within the schema's rules; together they pass the API server's 256 KiB.
    too_much = {"operator": {"podAnnotations": {f"a{i}": "x" * 100_000 for i in range(3)}}}
    with pytest.raises(ApiRefusal) as refused:
        render(too_much)
    assert "Deployment nf-nodefabric-operator: spec.template.metadata.annotations: Too long" in str(
        refused.value
    )
    # run_helm's own callers too (helm template without the fixture); helm checks no namespace's syntax.
    with pytest.raises(ApiRefusal, match=r"metadata\.namespace: Invalid value: \"Bad_NS\""):
        run_helm(helm, "template", "nf", str(CHART), "--namespace", "Bad_NS", values=None, tmp=tmp_path)
    assert RENDERS_CHECKED[0] == before + 2


def test_a_half_done_port_rename_is_caught(render) -> None:
    """The API server takes a probe or a targetPort naming no container port; the pod never gets ready,
    or the Service never gets endpoints. The hook refuses that too."""
    docs = render(EXTENDER_ON)
    scheduler = one(docs, "Deployment", "nf-nodefabric-scheduler")
    extender = container(scheduler, "extender")
    extender["ports"][0]["name"] = "metrics"
    found = api_refusals(docs)
    assert any("container extender: livenessProbe.httpGet.port" in line for line in found), found
    assert any(
        "Service nf-nodefabric-extender-metrics: targetPort" in line and "no port of the pods" in line
        for line in found
    ), found


def test_a_service_monitor_scraping_a_port_no_service_has_is_caught(render) -> None:
    docs = render(merged(EXTENDER_ON, {"serviceMonitor": {"enabled": True}}))
    assert api_refusals(docs) == []
    monitor = one(docs, "ServiceMonitor", "nf-nodefabric-extender")
    monitor["spec"]["endpoints"][0]["port"] = "ext-metrics"
    assert api_refusals(docs) == [
        "ServiceMonitor nf-nodefabric-extender: port 'ext-metrics' is no port of ['metrics']"
    ]
    monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] = "nothing"
    assert "ServiceMonitor nf-nodefabric-extender: selects no Service" in api_refusals(docs)[0]


# --- the variants ---------------------------------------------------------------------------------------


def schema_variants() -> list[tuple[str, dict[str, Any]]]:
    """Every boolean of the values schema flipped and every enum value, each on top of the extender."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    out: list[tuple[str, dict[str, Any]]] = []

    def at(path: list[str]) -> Any:
        node: Any = defaults
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    def nest(path: list[str], value: Any) -> dict[str, Any]:
        for key in reversed(path):
            value = {key: value}
        return value

    def walk(node: dict[str, Any], path: list[str]) -> None:
        if "enum" in node:
            out.extend((".".join(path) + f"={v}", nest(path, v)) for v in node["enum"] if v != at(path))
        elif node.get("type") == "boolean":
            out.append((".".join(path) + f"={not at(path)}", nest(path, not at(path))))
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, [*path, key])

    walk(schema, [])
    return out


SCHEMA_VARIANTS = schema_variants()


def test_the_schema_variants_cover_the_knobs_that_change_objects() -> None:
    names = {name.split("=")[0] for name, _ in SCHEMA_VARIANTS}
    assert {
        "extender.enabled",
        "dra.enabled",
        "dra.devicePlugin",
        "labelSink",
        "serviceMonitor.enabled",
    } <= names


@pytest.mark.parametrize(("name", "values"), SCHEMA_VARIANTS, ids=[n for n, _ in SCHEMA_VARIANTS])
def test_each_schema_variant_renders_what_an_api_server_accepts(
    render, name: str, values: dict[str, Any]
) -> None:
    # The extender stays on unless this variant is the one that turns it off.
    base = {} if name.startswith("extender.enabled=") else EXTENDER_ON
    assert api_refusals(render(merged(base, values), kube_version=DRA_KUBE)) == []


LONG_RELEASE = "r" * 53  # helm's longest release name


@pytest.mark.parametrize(
    ("values", "release", "namespace"),
    [
        ({}, "nf", "nodefabric"),
        (EXTENDER_ON, "nf", "nodefabric"),
        (merged(EXTENDER_ON, {"dra": {"enabled": True}}), "nf", "nodefabric"),
        (merged(EXTENDER_ON, {"dra": {"enabled": True, "devicePlugin": True}}), "nf", "nodefabric"),
        (merged(EXTENDER_ON, {"labelSink": "node"}), "nf", "nodefabric"),
        (merged(EXTENDER_ON, {"labelSink": "nodefeature"}), "nf", "nodefabric"),
        (merged(EXTENDER_ON, {"serviceMonitor": {"enabled": True}}), "nf", "nodefabric"),
        (EXTENDER_ON, LONG_RELEASE, "n" * 63),
        (
            merged(EXTENDER_ON, {"dra": {"enabled": True}, "serviceMonitor": {"enabled": True}}),
            LONG_RELEASE,
            "nf",
        ),
        (merged(EXTENDER_ON, {"fullnameOverride": "f" * 60, "nameOverride": "m" * 63}), "nf", "nodefabric"),
        (merged(EXTENDER_ON, {"domain": "a" * 50 + ".example.com"}), "nf", "nodefabric"),
    ],
    ids=[
        "defaults",
        "extender",
        "extender+dra",
        "extender+dra+deviceplugin",
        "extender+sink-node",
        "extender+sink-nodefeature",
        "extender+servicemonitor",
        "extender+longest-release-and-namespace",
        "extender+dra+servicemonitor+longest-release",
        "extender+longest-overrides",
        "extender+long-domain",
    ],
)
def test_named_variants_render_what_an_api_server_accepts(
    render, values: dict[str, Any], release: str, namespace: str
) -> None:
    docs: list[Doc] = render(values, release=release, namespace=namespace, kube_version=DRA_KUBE)
    assert api_refusals(docs) == []
    if values.get("extender", {}).get("enabled"):
        scheduler = [
            d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-scheduler")
        ]
        assert scheduler, "the extender variant renders the scheduler"
        ports = {p["name"] for p in container(scheduler[0], "extender")["ports"]}
        assert all(not port_name_errors(p) for p in ports)


def test_a_toleration_the_api_server_refuses_is_refused_by_the_schema_and_the_rules(
    render, default_docs: list[Doc]
) -> None:
    """The API server refuses a toleration value that is no label value, or an empty key without Exists:
    the values schema refuses both at install (test_chart_api_rules.py), and the rules say the same of
    such a DaemonSet."""
    bad = [{"key": "gpu", "operator": "Equal", "value": "a100 80gb"}, {"value": "x"}]
    said = refusal(render, {"agent": {"tolerations": bad}})
    assert "/agent/tolerations/0/value" in said and "/agent/tolerations/1" in said, said
    docs = copy.deepcopy(default_docs)
    one(docs, "DaemonSet", "nf-nodefabric-agent")["spec"]["template"]["spec"]["tolerations"] = bad
    text = "\n".join(api_refusals(docs))
    assert 'spec.template.spec.tolerations[0].operator: Invalid value: "a100 80gb"' in text
    assert 'spec.template.spec.tolerations[1].operator: Invalid value: "": operator must be Exists' in text


@pytest.mark.parametrize(
    ("release", "values"),
    [
        ("1nf", None),
        ("nf.v1", None),
        ("nf", {"fullnameOverride": "9lives"}),
        ("2nodefabric", None),
    ],
    ids=[
        "digit-first-release",
        "dotted-release",
        "digit-first-fullnameOverride",
        "digit-first-containing-name",
    ],
)
def test_a_name_helm_takes_but_no_service_could_have_is_refused_at_render(
    helm, tmp_path, release: str, values: dict[str, Any] | None
) -> None:
    """Helm takes a release name that starts with a digit or holds a dot, and the values schema such a
    fullnameOverride; the Services the chart names after it must be DNS-1035 labels, so the API server
    would refuse them mid-install. The chart says so before anything is sent."""
    args = ["template", release, str(CHART), "--namespace", "nf", "--set", "scheduler.image.tag=v1.33.4"]
    done = run_helm(helm, *args, values=values, tmp=tmp_path)
    assert done.returncode != 0
    assert "DNS-1035" in done.stderr and "fullnameOverride" in done.stderr, done.stderr


def test_a_release_name_every_service_can_carry_renders(helm, tmp_path) -> None:
    for release, values in (("a", None), ("nf-2", None), ("1nf", {"fullnameOverride": "nf"})):
        args = ["template", release, str(CHART), "--namespace", "nf", "--set", "scheduler.image.tag=v1.33.4"]
        done = run_helm(helm, *args, values=values, tmp=tmp_path)
        assert done.returncode == 0, done.stderr


# Names YAML reads as another type when written bare: a number, a boolean (YAML 1.1's on/yes/y too) or
# null. Each is a name the schema (or helm, for releases and namespaces) takes.
TYPED_WORDS = ["123", "0x1f", "true", "on", "off", "no", "null"]


@pytest.mark.parametrize("word", TYPED_WORDS)
def test_a_name_yaml_would_read_as_another_type_stays_a_string(render, word: str) -> None:
    """Written bare, `priorityClassName: true` is a boolean the API server cannot decode, and
    `priorityClassName: null` silently drops the field; the chart quotes every name it is given."""
    from test_chart_validate import validate_all

    values = {
        "nameOverride": word,
        "domain": word,
        "placement": {
            "webhook": {"certManager": {"enabled": True, "issuerRef": {"name": word, "group": word}}}
        },
        "agent": {"runtimeClassName": word, "priorityClassName": word},
        "operator": {"serviceAccount": {"create": False, "name": word}, "topology": {"name": word}},
    }
    docs: list[Doc] = render(
        merged(EXTENDER_ON, {"fullnameOverride": "nf"}, values), release=word, namespace=word
    )
    validate_all([d for d in docs if d["apiVersion"].split("/")[0] != "cert-manager.io"])
    agent = one(docs, "DaemonSet", "nf-agent")
    spec = agent["spec"]["template"]["spec"]
    assert (spec["runtimeClassName"], spec["priorityClassName"]) == (word, word)
    assert agent["metadata"]["namespace"] == word
    labels = agent["spec"]["selector"]["matchLabels"]
    assert (labels["app.kubernetes.io/name"], labels["app.kubernetes.io/instance"]) == (word, word)
    operator = one(docs, "Deployment", "nf-operator")
    assert operator["spec"]["template"]["spec"]["serviceAccountName"] == word
    subjects = [s for b in docs if b["kind"] in ("ClusterRoleBinding", "RoleBinding") for s in b["subjects"]]
    assert {"kind": "ServiceAccount", "name": word, "namespace": word} in subjects
    names = {
        n for d in docs if d["kind"] == "ClusterRole" for r in d["rules"] for n in r.get("resourceNames", [])
    }
    assert word in names  # the Kueue and KAI Topology the operator may write
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--domain") + 1] == word
    (certificate,) = [d for d in docs if d["kind"] == "Certificate"]
    assert (certificate["spec"]["issuerRef"]["name"], certificate["spec"]["issuerRef"]["group"]) == (
        word,
        word,
    )


@pytest.mark.parametrize("word", ["true", "null"])
def test_a_fullname_yaml_would_read_as_another_type_stays_a_string(render, word: str) -> None:
    docs: list[Doc] = render({"fullnameOverride": word})
    assert one(docs, "FlowSchema", word)["spec"]["priorityLevelConfiguration"]["name"] == word
    assert one(docs, "PriorityLevelConfiguration", word)
