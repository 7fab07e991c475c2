"""The knobs an operator reaches for in the first week: extra flags per component (the agent's
--walk-interval, --read-timeout, --debounce, --no-uevents; the operator's; the DRA driver's), probe
timings, terminationGracePeriodSeconds, topologySpreadConstraints, operator replicas with leader
election, ServiceMonitor relabelings, a PrometheusRule that is the README's alert table, and a
NetworkPolicy. Each through a real `helm template`, each command line through the real parser."""

from __future__ import annotations

import re
from typing import Any

import pytest
from chart_support import NAMESPACE, ROOT, Doc, container, of_kind, one, pod_spec
from test_chart_rbac import grants_of
from test_chart_validate import validate_all

from nodefabric_operator import console

AGENT = ("DaemonSet", "nf-nodefabric-agent", "agent")
OPERATOR = ("Deployment", "nf-nodefabric-operator", "operator")


def ctr(docs: list[Doc], which: tuple[str, str, str]) -> dict[str, Any]:
    return container(one(docs, which[0], which[1]), which[2])


def parsed(args: list[str]) -> Any:
    """The container's arguments as `nodefabric` parses them ($(NODE_NAME) and $(HOST_IP) as kubelet
    would expand them)."""
    argv = [a.replace("$(NODE_NAME)", "gpu-7").replace("$(HOST_IP)", "10.0.0.7") for a in args]
    parser, command = console.build_parser(argv)
    assert command is not None
    return parser.parse_args(argv)


def test_the_agents_timing_flags_reach_its_command_line(render: Any) -> None:
    extra = ["--walk-interval", "300", "--read-timeout", "30", "--debounce", "5", "--no-uevents"]
    docs = render({"agent": {"extraArgs": extra}})
    args = ctr(docs, AGENT)["args"]
    assert args[-len(extra) :] == extra  # after the chart's own: the last of a flag given twice wins
    got = parsed(args)
    assert (got.walk_interval, got.read_timeout, got.debounce, got.no_uevents) == (300.0, 30.0, 5.0, True)
    default = parsed(ctr(render(), AGENT)["args"])
    assert (default.walk_interval, default.no_uevents) != (300.0, True)


def test_the_dra_drivers_flags_go_to_the_agent_only_with_dra(render: Any) -> None:
    flags = ["--dra-plugin-dir", "/var/lib/kubelet/plugins/custom"]
    on = ctr(render({"dra": {"enabled": True, "extraArgs": flags}}, kube_version="1.34.0"), AGENT)["args"]
    assert on[-2:] == flags and parsed(on).dra_plugin_dir == "/var/lib/kubelet/plugins/custom"
    off = ctr(render({"dra": {"extraArgs": flags}}), AGENT)["args"]
    assert "/var/lib/kubelet/plugins/custom" not in off


def test_the_operators_flags_reach_its_command_line(render: Any) -> None:
    args = ctr(
        render({"operator": {"extraArgs": ["--idle-timeout", "5", "--bind-address", "10.1.2.3"]}}), OPERATOR
    )["args"]
    got = parsed(args)
    assert (got.idle_timeout, got.bind_address) == (5.0, "10.1.2.3")


def test_the_placement_and_extender_flags_reach_their_command_lines(render: Any) -> None:
    placement = ("Deployment", "nf-nodefabric-placement", "placement")
    args = ctr(render({"placement": {"extraArgs": ["--lease-duration", "30"]}}), placement)["args"]
    assert args[-2:] == ["--lease-duration", "30"] and parsed(args).lease_duration == 30.0
    scheduler = ("Deployment", "nf-nodefabric-scheduler", "extender")
    sidecar = render({"extender": {"enabled": True, "extraArgs": ["--unhealthy-after", "300"]}})
    args = ctr(sidecar, scheduler)["args"]
    assert args[-2:] == ["--unhealthy-after", "300"] and parsed(args).unhealthy_after == 300.0
    with pytest.raises(Exception, match="/placement/extraArgs/0"):
        render({"placement": {"extraArgs": [30]}})


@pytest.mark.parametrize(
    "bad",
    [[300], ["--debounce", 5], [{"a": "b"}], "--no-uevents", [None]],
)
def test_extra_args_are_strings_only(render: Any, bad: Any) -> None:
    with pytest.raises(Exception, match="extraArgs"):
        render({"agent": {"extraArgs": bad}})


def test_probe_timings_merge_over_the_defaults(render: Any, default_docs: list[Doc]) -> None:
    before = ctr(default_docs, OPERATOR)
    assert before["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "initialDelaySeconds": 10,
        "periodSeconds": 20,
        "timeoutSeconds": 10,
    }
    docs = render({"operator": {"livenessProbe": {"periodSeconds": 60, "failureThreshold": 5}},
                   "agent": {"readinessProbe": {"timeoutSeconds": 3}}})  # fmt: skip
    live = ctr(docs, OPERATOR)["livenessProbe"]
    assert live == {**before["livenessProbe"], "periodSeconds": 60, "failureThreshold": 5}
    ready = ctr(docs, AGENT)["readinessProbe"]
    assert ready == {
        "httpGet": {"path": "/readyz", "port": "health"},
        "periodSeconds": 10,
        "timeoutSeconds": 3,
    }
    assert ctr(default_docs, AGENT)["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "initialDelaySeconds": 10,
        "periodSeconds": 20,
        "failureThreshold": 3,
    }
    validate_all(docs)


@pytest.mark.parametrize(
    "bad",
    [{"periodSeconds": 0}, {"timeoutSeconds": "10s"}, {"httpGet": {"path": "/x"}}, {"periodSeconds": 1e9}],
)
def test_probe_timings_kubernetes_would_refuse_are_refused(render: Any, bad: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="livenessProbe"):
        render({"operator": {"livenessProbe": bad}})


def test_grace_period_and_topology_spread(render: Any, default_docs: list[Doc]) -> None:
    spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
               "whenUnsatisfiable": "ScheduleAnyway",
               "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}}}]  # fmt: skip
    docs = render({"operator": {"terminationGracePeriodSeconds": 45, "topologySpreadConstraints": spread},
                   "agent": {"terminationGracePeriodSeconds": 5}})  # fmt: skip
    op = pod_spec(one(docs, "Deployment", "nf-nodefabric-operator"))
    assert op["terminationGracePeriodSeconds"] == 45 and op["topologySpreadConstraints"] == spread
    assert pod_spec(one(docs, "DaemonSet", "nf-nodefabric-agent"))["terminationGracePeriodSeconds"] == 5
    for kind, name in (("Deployment", "nf-nodefabric-operator"), ("DaemonSet", "nf-nodefabric-agent")):
        spec = pod_spec(one(default_docs, kind, name))
        assert "terminationGracePeriodSeconds" not in spec and "topologySpreadConstraints" not in spec
    validate_all(docs)
    with pytest.raises(Exception, match="topologySpreadConstraints"):
        render({"operator": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKee": "zone"}]}})
    with pytest.raises(Exception, match="terminationGracePeriodSeconds"):
        render({"operator": {"terminationGracePeriodSeconds": -1}})


def test_more_than_one_operator_replica_elects_a_leader_on_a_lease(
    render: Any, default_docs: list[Doc]
) -> None:
    one_replica = one(default_docs, "Deployment", "nf-nodefabric-operator")
    assert one_replica["spec"]["replicas"] == 1 and one_replica["spec"]["strategy"] == {"type": "Recreate"}
    assert "--standalone" in ctr(default_docs, OPERATOR)["args"]
    assert not [g for g in grants_of(default_docs, "nf-nodefabric-operator")[0] if g[2] == "leases"]

    docs = render({"operator": {"replicas": 3}})
    dep = one(docs, "Deployment", "nf-nodefabric-operator")
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    args = ctr(docs, OPERATOR)["args"]
    got = parsed(args)
    assert got.leader_elect and not got.standalone and got.lease_name == "nf-nodefabric-operator"
    assert got.namespace == NAMESPACE  # the Lease lives where the Role below grants it
    grants, _ = grants_of(docs, "nf-nodefabric-operator")
    leases = {k: v for k, v in grants.items() if k[2] == "leases"}
    assert leases == {
        (NAMESPACE, "coordination.k8s.io", "leases", "nf-nodefabric-operator"): {"get", "update"},
        (NAMESPACE, "coordination.k8s.io", "leases", ""): {"create"},
    }
    validate_all(docs)
    for bad in (0, 11, "2"):
        with pytest.raises(Exception, match="replicas"):
            render({"operator": {"replicas": bad}})


def test_servicemonitor_relabelings(render: Any) -> None:
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]
    drop = [{"sourceLabels": ["__name__"], "regex": "python_gc_.*", "action": "drop"}]
    docs = render({"serviceMonitor": {"enabled": True, "relabelings": relabel, "metricRelabelings": drop}})
    monitors = of_kind(docs, "ServiceMonitor")
    assert monitors
    for m in monitors:
        (endpoint,) = m["spec"]["endpoints"]
        assert endpoint["relabelings"] == relabel and endpoint["metricRelabelings"] == drop
    plain = render({"serviceMonitor": {"enabled": True}})
    assert all("relabelings" not in m["spec"]["endpoints"][0] for m in of_kind(plain, "ServiceMonitor"))
    with pytest.raises(Exception, match="relabelings"):
        render({"serviceMonitor": {"enabled": True, "relabelings": [{"action": "explode"}]}})


def readme_alerts() -> dict[str, tuple[str, str, str]]:
    """The README's alert table: name -> (expression, for, severity)."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| alert | expression | for | severity | means |") :].split("\n\n", 1)[0]
    out: dict[str, tuple[str, str, str]] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        name, expr, for_, severity = (c.strip("`") for c in cells[:4])
        out[name] = (expr, for_, severity)
    return out


def rule_alerts(docs: list[Doc]) -> dict[str, tuple[str, str, str]]:
    (rule,) = of_kind(docs, "PrometheusRule")
    (group,) = rule["spec"]["groups"]
    return {r["alert"]: (r["expr"], r.get("for", "0m"), r["labels"]["severity"]) for r in group["rules"]}


def test_the_prometheus_rule_is_the_readmes_alert_table(render: Any, default_docs: list[Doc]) -> None:
    assert not of_kind(default_docs, "PrometheusRule")
    docs = render({"prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}}})
    documented = readme_alerts()
    assert len(documented) >= 6
    assert rule_alerts(docs) == documented
    (rule,) = of_kind(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert all(r["annotations"]["summary"] for r in rule["spec"]["groups"][0]["rules"])
    validate_all(docs)
    # Only the running components' alerts.
    no_agent = rule_alerts(render({"prometheusRule": {"enabled": True}, "agent": {"enabled": False}}))
    assert set(no_agent) == {"NodefabricLabelsNotPublished", "NodefabricLabelsNotOnNode"}


@pytest.mark.parametrize("agent", [True, False])
@pytest.mark.parametrize("operator", [True, False])
@pytest.mark.parametrize("placement", [True, False])
def test_no_rule_group_is_rendered_without_rules(
    render: Any, agent: bool, operator: bool, placement: bool
) -> None:
    """The Prometheus operator's CRD wants a rules list in each group: with neither the agent nor the
    operator running there is no alert to carry, and so no PrometheusRule at all."""
    docs = render(
        {
            "prometheusRule": {"enabled": True},
            "agent": {"enabled": agent},
            "operator": {"enabled": operator},
            "placement": {"enabled": placement},
        }
    )
    rules = of_kind(docs, "PrometheusRule")
    assert len(rules) == (1 if agent or operator else 0)
    for rule in rules:
        assert rule["spec"]["groups"]
        for group in rule["spec"]["groups"]:
            assert isinstance(group["rules"], list) and group["rules"], group
    validate_all(docs)


def test_every_alert_names_a_metric_a_component_exports() -> None:
    """Each metric an alert reads is one the code registers (a renamed metric would silence its alert)."""
    sources = "".join(
        p.read_text() for d in ("devicemanager", "deviceplugin", "operator") for p in (ROOT / d).rglob("*.py")
    )
    for name, (expr, _, _) in readme_alerts().items():
        for metric in re.findall(r"nodefabric_[a-z_]+", expr):
            base = metric.removesuffix("_total")
            assert f'"{base}"' in sources or f'"{metric}"' in sources, (name, metric)


def test_the_network_policy_admits_only_the_metrics_and_probe_ports(
    render: Any, default_docs: list[Doc]
) -> None:
    assert not of_kind(default_docs, "NetworkPolicy")
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    docs = render({"networkPolicy": {"enabled": True, "from": peers}})
    policies = {p["metadata"]["name"]: p["spec"] for p in of_kind(docs, "NetworkPolicy")}
    assert set(policies) == {"nf-nodefabric-agent", "nf-nodefabric-operator"}
    for name, (kind, ports) in {
        "nf-nodefabric-agent": ("DaemonSet", [9464, 9465]),
        "nf-nodefabric-operator": ("Deployment", [9101, 8080]),
    }.items():
        spec = policies[name]
        assert spec["policyTypes"] == ["Ingress"]
        (rule,) = spec["ingress"]
        assert [p["port"] for p in rule["ports"]] == ports and rule["from"] == peers
        # It selects the component's pods, and nothing else.
        pods = one(docs, kind, name)["spec"]["template"]["metadata"]["labels"]
        assert spec["podSelector"]["matchLabels"].items() <= pods.items()
    validate_all(docs)
    anyone = render({"networkPolicy": {"enabled": True}})
    for p in of_kind(anyone, "NetworkPolicy"):
        (rule,) = p["spec"]["ingress"]
        assert "from" not in rule and len(rule["ports"]) == 2  # any source, those ports only
    with pytest.raises(Exception, match="from"):
        render({"networkPolicy": {"enabled": True, "from": [{"podSelektor": {}}]}})


@pytest.mark.parametrize("component", ["operator", "agent"])
def test_a_liveness_success_threshold_other_than_1_is_refused(render: Any, component: str) -> None:
    # The API server refuses the pod template (validateProbe: "must be 1" for liveness and startup), so
    # the install would fail half-way; a readiness probe may ask for more successes.
    with pytest.raises(Exception, match="livenessProbe"):
        render({component: {"livenessProbe": {"successThreshold": 2}}})
    docs = render({component: {"readinessProbe": {"successThreshold": 2}}})
    which = OPERATOR if component == "operator" else AGENT
    assert ctr(docs, which)["readinessProbe"]["successThreshold"] == 2


SPREAD = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}


@pytest.mark.parametrize(
    "bad",
    [
        {"maxSkew": 0},
        {"maxSkew": -1},
        {"whenUnsatisfiable": "Sometimes"},
        {"topologyKey": ""},
        {"minDomains": 0},
        {"minDomains": 2, "whenUnsatisfiable": "ScheduleAnyway"},
        {"nodeAffinityPolicy": "Always"},
        {"nodeTaintsPolicy": "honor"},
    ],
)
def test_a_topology_spread_constraint_the_api_server_refuses_is_refused(
    render: Any, bad: dict[str, Any]
) -> None:
    # ValidateTopologySpreadConstraints: maxSkew and minDomains at least 1, minDomains only with
    # DoNotSchedule, the two policies Honor or Ignore, a topology key.
    with pytest.raises(Exception, match="topologySpreadConstraints"):
        render({"operator": {"topologySpreadConstraints": [{**SPREAD, **bad}]}})


def test_a_topology_spread_constraint_the_api_server_takes_renders(render: Any) -> None:
    fine = {**SPREAD, "minDomains": 2, "nodeAffinityPolicy": "Honor", "nodeTaintsPolicy": "Ignore"}
    docs = render({"operator": {"topologySpreadConstraints": [fine]}})
    assert pod_spec(one(docs, "Deployment", "nf-nodefabric-operator"))["topologySpreadConstraints"] == [fine]
    validate_all(docs)


def test_the_link_alert_says_what_its_value_counts(render: Any) -> None:
    # nodefabric_deviceplugin_devices counts the tokens a family advertises: one failed NIC is 1 in rdma
    # and --shared-count (16 by default) in rdma.shared, so "{{ $value }} RDMA endpoints failed" told
    # the on-call 16 NICs were down. The summary names the family and counts its devices.
    (rule,) = of_kind(render({"prometheusRule": {"enabled": True}}), "PrometheusRule")
    (alert,) = [r for r in rule["spec"]["groups"][0]["rules"] if r["alert"] == "NodefabricRdmaLinkUnhealthy"]
    summary = alert["annotations"]["summary"]
    assert "{{ $labels.family }}" in summary and "endpoints" not in summary, summary
