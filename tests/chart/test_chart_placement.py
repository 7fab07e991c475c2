"""The placement process in the chart: its Deployment, Service and budget, its account and rights, the
mutating webhook that gates pods (and its certificate), the admission policies that keep PlacementGroups
nodefabric's own and confine its pod writes (CEL evaluated here), and the shared configuration file."""

from __future__ import annotations

import base64
import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import (
    NAMESPACE,
    CelPolicy,
    Doc,
    configmap_yaml,
    container,
    of_kind,
    one,
    pod_spec,
    refusal,
)
from test_chart_rbac import CLUSTER, grants_of
from test_chart_validate import validate_all

PLACEMENT = "nf-nodefabric-placement"
CONFIG = "nf-nodefabric-placement-config"
USER = f"system:serviceaccount:{NAMESPACE}:{PLACEMENT}"
GATE = "placement.gpustack.ai/group"
DECISION = "placement.gpustack.ai/decision"
OPT_IN = "placement.gpustack.ai/admission"


def deployment(docs: list[Doc]) -> Doc:
    return one(docs, "Deployment", PLACEMENT)


# The process.


def test_the_default_install_runs_the_placement_process(default_docs: list[Doc]) -> None:
    d = deployment(default_docs)
    assert d["spec"]["replicas"] == 2
    c = container(d, "placement")
    assert c["args"] == [
        "--log-level", "INFO", "--log-format", "text",
        "placement", "--config", "/etc/nodefabric/extender.yaml", "--metrics-port", "9103",
        "--webhook-port", "9443", "--tls-cert-file", "/etc/nodefabric/tls/tls.crt",
        "--tls-private-key-file", "/etc/nodefabric/tls/tls.key",
    ]  # fmt: skip
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "valueFrom" in e}
    assert env == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["resources"]["limits"]["memory"] == "512Mi"
    assert pod_spec(d)["serviceAccountName"] == PLACEMENT
    assert one(default_docs, "ServiceAccount", PLACEMENT)
    # A standby replica keeps the webhook answering: a budget lets one go at a time.
    pdb = one(default_docs, "PodDisruptionBudget", PLACEMENT)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "placement"
    validate_all(default_docs)


def test_the_placement_process_reads_the_extenders_configuration_file(
    render, default_docs: list[Doc]
) -> None:
    d = deployment(default_docs)
    (vol,) = [v for v in pod_spec(d)["volumes"] if v["name"] == "config"]
    assert vol["configMap"]["name"] == CONFIG
    cfg = configmap_yaml(default_docs, CONFIG, "extender.yaml")
    assert cfg["groupReadyTimeoutSeconds"] == 600
    # The scheduler's extender mounts the very same ConfigMap.
    both = render({"extender": {"enabled": True}})
    (ext,) = [
        v
        for v in pod_spec(one(both, "Deployment", "nf-nodefabric-scheduler"))["volumes"]
        if v["name"] == "extender-config"
    ]
    assert ext["configMap"]["name"] == CONFIG
    # A change of the configuration restarts the placement pods.
    changed = render({"placement": {"groupReadyTimeoutSeconds": 120}})
    assert configmap_yaml(changed, CONFIG, "extender.yaml")["groupReadyTimeoutSeconds"] == 120
    key = "checksum/config"
    assert (
        deployment(changed)["spec"]["template"]["metadata"]["annotations"][key]
        != d["spec"]["template"]["metadata"]["annotations"][key]
    )


def test_the_rendered_configuration_loads(default_docs: list[Doc], tmp_path: Path) -> None:
    from nodefabric_operator.extender.config import load_config

    path = tmp_path / "extender.yaml"
    path.write_text(one(default_docs, "ConfigMap", CONFIG)["data"]["extender.yaml"])
    assert load_config(path).group_ready_timeout_seconds == 600


def test_the_service_reaches_metrics_and_the_webhook(default_docs: list[Doc]) -> None:
    svc = one(default_docs, "Service", PLACEMENT)
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "placement"
    assert {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        "metrics": (9103, "metrics"),
        "webhook": (443, "webhook"),
    }
    ports = {p["name"]: p["containerPort"] for p in container(deployment(default_docs), "placement")["ports"]}
    assert ports == {"metrics": 9103, "webhook": 9443}


IANA = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


@pytest.mark.parametrize("values", [{}, {"extender": {"enabled": True}, "serviceMonitor": {"enabled": True}}])
def test_every_port_name_is_an_iana_service_name(render, values: dict[str, Any]) -> None:
    for d in render(values):
        if d["kind"] == "Service":
            names = [p["name"] for p in d["spec"]["ports"]]
        elif d["kind"] in ("Deployment", "DaemonSet", "Job"):
            names = [p["name"] for c in pod_spec(d)["containers"] for p in c.get("ports", [])]
        else:
            continue
        for name in names:
            assert len(name) <= 15 and IANA.match(name) and "--" not in name, (d["metadata"]["name"], name)


def test_ports_follow_values_and_may_not_collide(render) -> None:
    docs = render({"placement": {"metricsPort": 9200, "webhook": {"port": 10443}, "replicas": 1}})
    c = container(deployment(docs), "placement")
    assert c["args"][c["args"].index("--webhook-port") + 1] == "10443"
    assert c["args"][c["args"].index("--metrics-port") + 1] == "9200"
    assert not [p for p in of_kind(docs, "PodDisruptionBudget") if p["metadata"]["name"] == PLACEMENT]
    assert "must differ" in refusal(render, {"placement": {"metricsPort": 9443}})


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"placement": {"replicas": 0}}, "/placement/replicas"),
        ({"placement": {"webhook": {"failurePolicy": "Sometimes"}}}, "/placement/webhook/failurePolicy"),
        ({"placement": {"webhook": {"timeoutSeconds": 31}}}, "/placement/webhook/timeoutSeconds"),
        ({"placement": {"groupReadyTimeoutSeconds": "ten"}}, "/placement/groupReadyTimeoutSeconds"),
        ({"placement": {"webhook": {"certManager": {"issuerRef": {"kind": "Vault"}}}}}, "issuerRef/kind"),
        ({"placement": {"nope": 1}}, "nope"),
    ],
)
def test_values_schema_refuses_bad_placement_values(render, values: dict[str, Any], where: str) -> None:
    assert where in refusal(render, values)


def test_placement_is_optional(render) -> None:
    docs = render({"placement": {"enabled": False}})
    names = [d["metadata"]["name"] for d in docs if d["kind"] != "CustomResourceDefinition"]
    assert not [n for n in names if "placement" in n]
    # Without the webhook, only pods whose template carries the gate are admitted: no TLS, no webhook.
    docs = render({"placement": {"webhook": {"enabled": False}}})
    assert not of_kind(docs, "MutatingWebhookConfiguration") and not of_kind(docs, "Secret")
    c = container(deployment(docs), "placement")
    assert "--webhook-port" not in c["args"] and [p["name"] for p in c["ports"]] == ["metrics"]
    validate_all(docs)


# Rights.


def test_the_placement_account_holds_what_it_needs_and_no_more(default_docs: list[Doc]) -> None:
    grants, builtin = grants_of(default_docs, PLACEMENT)
    assert not builtin
    cluster = {(g, r): v for (s, g, r, n), v in grants.items() if s == CLUSTER}
    # Exactly its calls (nodefabric_operator/admission): pods and nodes listed and watched (state.py),
    # pods patched (release.py, writer.py); groups listed and watched, created or read after a 409
    # (writer.py), their status patched; Events created (extender/events.py Publisher), never patched.
    assert cluster[("", "pods")] == {"list", "watch", "patch"}
    assert cluster[("", "pods/eviction")] == {"create"}
    assert cluster[("", "nodes")] == {"list", "watch"}
    assert ("", "pods/binding") not in cluster and ("", "pods/status") not in cluster
    assert cluster[("placement.gpustack.ai", "placementgroups")] == {"get", "list", "watch", "create"}
    assert cluster[("placement.gpustack.ai", "placementgroups/status")] == {"patch"}
    assert cluster[("", "events")] == {"create"}
    assert ("events.k8s.io", "events") not in cluster
    # Owners, and the StatefulSets between a LeaderWorkerSet and its pods (admission/chain.py), are read
    # one at a time, never listed or written.
    owners = {
        ("batch", "jobs"), ("jobset.x-k8s.io", "jobsets"), ("leaderworkerset.x-k8s.io", "leaderworkersets"),
        ("apps", "statefulsets"),
        ("kubeflow.org", "pytorchjobs"), ("kubeflow.org", "mpijobs"), ("scheduling.x-k8s.io", "podgroups"),
        ("scheduling.k8s.io", "podgroups"),
    }  # fmt: skip
    for owner in owners:
        assert cluster[owner] == {"get"}, owner
    allowed = owners | {
        ("", "pods"), ("", "pods/eviction"), ("", "nodes"), ("", "events"), ("events.k8s.io", "events"),
        ("placement.gpustack.ai", "placementgroups"), ("placement.gpustack.ai", "placementgroups/status"),
    }  # fmt: skip
    extra = {k for k in cluster if k not in allowed and k[0] != "kubeflow.org"}
    assert not extra, extra
    leases = {(n, frozenset(v)) for (s, g, r, n), v in grants.items() if s == NAMESPACE and r == "leases"}
    assert leases == {("", frozenset({"create"})), ("nodefabric-placement", frozenset({"get", "update"}))}


def test_users_may_read_placement_groups_through_view_never_edit(default_docs: list[Doc]) -> None:
    role = one(default_docs, "ClusterRole", f"{PLACEMENT}-view")
    labels = role["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert not [k for k in labels if "aggregate-to-edit" in k or "aggregate-to-admin" in k]
    assert role["rules"] == [
        {
            "apiGroups": ["placement.gpustack.ai"],
            "resources": ["placementgroups"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    # No other role of the chart grants a write on them.
    for r in of_kind(default_docs, "ClusterRole") + of_kind(default_docs, "Role"):
        if r["metadata"]["name"] == PLACEMENT:
            continue
        for rule in r["rules"]:
            if "placementgroups" in rule["resources"]:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}, r["metadata"]["name"]


def test_the_chart_ships_the_placementgroup_crd(default_docs: list[Doc]) -> None:
    from chart_support import CHART, ROOT

    crd = one(default_docs, "CustomResourceDefinition", "placementgroups.placement.gpustack.ai")
    assert crd["spec"]["scope"] == "Namespaced" and crd["spec"]["names"]["shortNames"] == ["plg"]
    name = "placement.gpustack.ai_placementgroups.yaml"
    assert (CHART / "crds" / name).read_text() == (ROOT / "crds" / name).read_text()


# The webhook.


def webhooks(docs: list[Doc]) -> dict[str, Doc]:
    cfg = one(docs, "MutatingWebhookConfiguration", PLACEMENT)
    return {w["name"]: w for w in cfg["webhooks"]}


def test_the_webhook_never_blocks_pods_nodefabric_does_not_manage(default_docs: list[Doc]) -> None:
    hooks = webhooks(default_docs)
    assert set(hooks) == {"namespaces.placement.gpustack.ai", "groups.placement.gpustack.ai"}
    for w in hooks.values():
        assert w["failurePolicy"] == "Ignore" and w["sideEffects"] == "None"
        assert w["timeoutSeconds"] == 5 and w["admissionReviewVersions"] == ["v1"]
        assert w["rules"] == [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
        assert w["clientConfig"]["service"] == {
            "name": PLACEMENT, "namespace": NAMESPACE, "port": 443,
            "path": "/mutate-pods" if w["name"].startswith("namespaces") else "/mutate-pods/explicit",
        }  # fmt: skip
        system = w["namespaceSelector"]["matchExpressions"][0]
        assert system == {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", NAMESPACE],
        }
        assert w["objectSelector"] == {
            "matchExpressions": [{"key": OPT_IN, "operator": "NotIn", "values": ["disabled"]}]
        }
    # Opted-in namespaces go to the first entry only; elsewhere only pods naming a group reach the second.
    assert hooks["namespaces.placement.gpustack.ai"]["namespaceSelector"]["matchExpressions"][1] == {
        "key": OPT_IN,
        "operator": "In",
        "values": ["enabled"],
    }
    assert hooks["groups.placement.gpustack.ai"]["namespaceSelector"]["matchExpressions"][1] == {
        "key": OPT_IN,
        "operator": "NotIn",
        "values": ["enabled"],
    }


def match(hook: Doc, pod: dict[str, Any]) -> bool:
    """The entry's matchConditions as the API server evaluates them (all must hold)."""
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    act = {"object": celpy.json_to_cel(pod), "request": celpy.json_to_cel({})}
    return all(bool(env.program(env.compile(c["expression"])).evaluate(act)) for c in hook["matchConditions"])


def test_the_webhooks_match_conditions(default_docs: list[Doc]) -> None:
    hooks = webhooks(default_docs)
    ns, groups = hooks["namespaces.placement.gpustack.ai"], hooks["groups.placement.gpustack.ai"]
    plain = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    bound = copy.deepcopy(plain)
    bound["spec"]["nodeName"] = "n1"
    labelled = copy.deepcopy(plain)
    labelled["metadata"]["labels"] = {GATE: "train"}
    annotated = copy.deepcopy(plain)
    annotated["metadata"]["annotations"] = {GATE: "train"}
    assert match(ns, plain) and not match(ns, bound)
    assert not match(groups, plain) and match(groups, labelled) and match(groups, annotated)
    labelled["spec"]["nodeName"] = "n1"
    assert not match(groups, labelled)


def openssl(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=False, timeout=30)


def test_the_chart_made_certificate_serves_the_service_name_and_is_the_bundles(
    default_docs: list[Doc], tmp_path: Path
) -> None:
    secret = one(default_docs, "Secret", f"{PLACEMENT}-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    for w in webhooks(default_docs).values():
        assert base64.b64decode(w["clientConfig"]["caBundle"]) == data["ca.crt"]
    (tmp_path / "ca.crt").write_bytes(data["ca.crt"])
    (tmp_path / "tls.crt").write_bytes(data["tls.crt"])
    done = openssl("verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt"))
    assert done.returncode == 0, done.stderr
    text = openssl("x509", "-noout", "-text", "-in", str(tmp_path / "tls.crt")).stdout.decode()
    assert f"DNS:{PLACEMENT}.{NAMESPACE}.svc" in text
    # The key is the certificate's.
    (tmp_path / "tls.key").write_bytes(data["tls.key"])
    a = openssl("x509", "-noout", "-pubkey", "-in", str(tmp_path / "tls.crt")).stdout
    b = openssl("pkey", "-pubout", "-in", str(tmp_path / "tls.key")).stdout
    assert a and a == b
    # Mounted as files, read-only, where the arguments say.
    d = deployment(default_docs)
    (vol,) = [v for v in pod_spec(d)["volumes"] if v["name"] == "tls"]
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]
    mount = {m["name"]: m for m in container(d, "placement")["volumeMounts"]}["tls"]
    assert (mount["mountPath"], mount["readOnly"]) == ("/etc/nodefabric/tls", True)


def test_cert_manager_issues_the_certificate_instead(render) -> None:
    docs = render({"placement": {"webhook": {"certManager": {"enabled": True}}}})
    assert not [s for s in of_kind(docs, "Secret") if "webhook" in s["metadata"]["name"]]
    cert = one(docs, "Certificate", f"{PLACEMENT}-webhook")
    assert cert["spec"]["secretName"] == f"{PLACEMENT}-webhook-tls"
    assert f"{PLACEMENT}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {
        "name": f"{PLACEMENT}-webhook",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert one(docs, "Issuer", f"{PLACEMENT}-webhook")["spec"] == {"selfSigned": {}}
    cfg = one(docs, "MutatingWebhookConfiguration", PLACEMENT)
    assert (
        cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{PLACEMENT}-webhook"
    )
    assert all("caBundle" not in w["clientConfig"] for w in cfg["webhooks"])
    # A kind without a name names no issuer: the self-signed one is made and used.
    docs = render(
        {"placement": {"webhook": {"certManager": {"enabled": True, "issuerRef": {"kind": "ClusterIssuer"}}}}}
    )
    assert one(docs, "Certificate", f"{PLACEMENT}-webhook")["spec"]["issuerRef"]["kind"] == "Issuer"
    assert one(docs, "Issuer", f"{PLACEMENT}-webhook")
    # A named issuer is used, and none is made.
    ref = {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    docs = render({"placement": {"webhook": {"certManager": {"enabled": True, "issuerRef": ref}}}})
    assert one(docs, "Certificate", f"{PLACEMENT}-webhook")["spec"]["issuerRef"] == ref
    assert not of_kind(docs, "Issuer")


def test_the_failure_policy_and_timeout_follow_values(render) -> None:
    docs = render({"placement": {"webhook": {"failurePolicy": "Fail", "timeoutSeconds": 12}}})
    for w in webhooks(docs).values():
        assert (w["failurePolicy"], w["timeoutSeconds"]) == ("Fail", 12)


def test_the_webhook_follows_the_domain(render) -> None:
    docs = render({"domain": "example.com"})
    hooks = webhooks(docs)
    assert set(hooks) == {"namespaces.placement.example.com", "groups.placement.example.com"}
    groups = hooks["groups.placement.example.com"]
    assert "placement.example.com/group" in groups["matchConditions"][1]["expression"]
    assert groups["objectSelector"]["matchExpressions"][0]["key"] == "placement.example.com/admission"


# The admission policies.


def test_only_the_placement_account_writes_placement_groups(default_docs: list[Doc]) -> None:
    policy = one(default_docs, "ValidatingAdmissionPolicy", f"{PLACEMENT}-groups")
    binding = one(default_docs, "ValidatingAdmissionPolicyBinding", f"{PLACEMENT}-groups")
    assert binding["spec"] == {"policyName": f"{PLACEMENT}-groups", "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    assert set(rule["resources"]) == {"placementgroups", "placementgroups/status"}
    cel = CelPolicy(policy)
    group = {"metadata": {"name": "job-train", "namespace": "team"}, "spec": {"key": "team/job/train"}}

    def admit(user: str, op: str) -> tuple[bool, str]:
        return cel.admit({"userInfo": {"username": user}, "operation": op}, group, group)

    for op in ("CREATE", "UPDATE", "DELETE"):
        assert admit(USER, op) == (True, "allowed")
        for intruder in (
            f"system:serviceaccount:{NAMESPACE}:nf-nodefabric-scheduler",
            "system:serviceaccount:team:default",
            "alice",
            f"system:serviceaccount:other:{PLACEMENT}",
        ):
            ok, why = admit(intruder, op)
            assert not ok and "only nodefabric's placement process" in why, (intruder, op)
    # A namespace being deleted can finish: its controller and the garbage collector may delete, no more.
    for system in ("namespace-controller", "generic-garbage-collector"):
        user = f"system:serviceaccount:kube-system:{system}"
        assert admit(user, "DELETE")[0] and not admit(user, "UPDATE")[0] and not admit(user, "CREATE")[0]


def gated_pod(affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {
            "name": "w-0",
            "namespace": "team",
            "labels": {"job-name": "train"},
            "annotations": {"user": "note"},
        },
        "spec": {
            "containers": [{"name": "c", "image": "trainer:1"}],
            "schedulingGates": [{"name": "other.example/gate"}, {"name": GATE}],
            "nodeSelector": {"pool": "gpu"},
        },
        "status": {"phase": "Pending"},
    }
    if affinity is not None:
        pod["spec"]["affinity"] = affinity
    return pod


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


PIN = {"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}
PREFERRED = {
    "nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "z", "operator": "Exists"}]}}
        ]
    }
}
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}


def terms_of(pod: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return terms


def pin_existing(pod: dict[str, Any]) -> None:
    for t in terms_of(pod):
        t["matchFields"] = [*t.get("matchFields", []), PIN]


def pin_fresh(pod: dict[str, Any]) -> None:
    pod["spec"]["affinity"] = required({"matchFields": [PIN]})


def ungate(pod: dict[str, Any]) -> None:
    pod["spec"]["schedulingGates"] = [g for g in pod["spec"]["schedulingGates"] if g["name"] != GATE]


@pytest.fixture(scope="module")
def pod_policy(render) -> CelPolicy:  # type: ignore[no-untyped-def]
    return CelPolicy(one(render(), "ValidatingAdmissionPolicy", f"{PLACEMENT}-pods"))


def pod_admit(cel: CelPolicy, old: dict[str, Any], new: dict[str, Any], user: str = USER) -> tuple[bool, str]:
    return cel.admit({"userInfo": {"username": user}, "operation": "UPDATE"}, new, old)


ALLOWED = {
    "pin every existing term": (
        lambda: gated_pod(
            required({"matchExpressions": [ZONE]}, {"matchExpressions": [ZONE], "matchFields": []})
        ),
        pin_existing,
    ),
    "pin a pod without node affinity": (gated_pod, pin_fresh),
    "remove its own gate": (gated_pod, ungate),
    "write the decision": (
        gated_pod,
        lambda p: p["metadata"]["annotations"].update({DECISION: "placed: 8 of 8 in zone a"}),
    ),
    "add kubernetes.io/hostname": (
        gated_pod,
        lambda p: p["spec"]["nodeSelector"].update({"kubernetes.io/hostname": "gpu-7"}),
    ),
}


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_the_placement_account_may_pin_ungate_and_explain(pod_policy: CelPolicy, case: str) -> None:
    make, edit = ALLOWED[case]
    old = make()
    new = copy.deepcopy(old)
    edit(new)
    assert pod_admit(pod_policy, old, new) == (True, "allowed")


def test_pin_ungate_and_explain_in_one_patch(pod_policy: CelPolicy) -> None:
    old = gated_pod(required({"matchExpressions": [ZONE]}))
    new = copy.deepcopy(old)
    pin_existing(new)
    ungate(new)
    new["metadata"]["annotations"][DECISION] = "placed"
    assert pod_admit(pod_policy, old, new) == (True, "allowed")


REFUSED = {
    "another gate removed": (
        lambda p: p["spec"].update(schedulingGates=[{"name": GATE}]),
        "its own scheduling gate",
    ),
    "a gate added": (
        lambda p: p["spec"]["schedulingGates"].append({"name": "x/y"}),
        "its own scheduling gate",
    ),
    "the claim annotation": (
        lambda p: p["metadata"]["annotations"].update({"placement.gpustack.ai/claim": "{}"}),
        "only the annotation",
    ),
    "a user's annotation changed": (
        lambda p: p["metadata"]["annotations"].update({"user": "x"}),
        "only the annotation",
    ),
    "a user's annotation removed": (lambda p: p["metadata"].update(annotations={}), "only the annotation"),
    "a label": (
        lambda p: p["metadata"]["labels"].update({"job-name": "other"}),
        "labels, finalizers or owners",
    ),
    "a finalizer": (lambda p: p["metadata"].update(finalizers=["x/y"]), "labels, finalizers or owners"),
    "the node selector changed": (
        lambda p: p["spec"]["nodeSelector"].update({"pool": "cpu"}),
        "node selector",
    ),
    "another node selector key": (lambda p: p["spec"]["nodeSelector"].update({"zone": "a"}), "node selector"),
    "a matchExpression added": (
        lambda p: p["spec"].update(affinity=required({"matchExpressions": [ZONE]})),
        "matchFields",
    ),
    "a matchFields on another key": (
        lambda p: p["spec"].update(affinity=required({"matchFields": [{**PIN, "key": "metadata.uid"}]})),
        "matchFields",
    ),
    "two fresh terms": (
        lambda p: p["spec"].update(affinity=required({"matchFields": [PIN]}, {"matchFields": [PIN]})),
        "matchFields",
    ),
    "a preferred term": (lambda p: p["spec"].update(affinity=PREFERRED), "matchFields"),
    "an image": (lambda p: p["spec"]["containers"][0].update(image="evil:1"), "images"),
    "a toleration": (lambda p: p["spec"].update(tolerations=[{"operator": "Exists"}]), "tolerations"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_placement_account_may_change_nothing_else(pod_policy: CelPolicy, case: str) -> None:
    edit, message = REFUSED[case]
    old = gated_pod()
    new = copy.deepcopy(old)
    edit(new)
    ok, why = pod_admit(pod_policy, old, new)
    assert not ok and message in why, why


def test_existing_terms_may_not_be_widened_or_dropped(pod_policy: CelPolicy) -> None:
    old = gated_pod(required({"matchExpressions": [ZONE]}, {"matchExpressions": [{**ZONE, "values": ["c"]}]}))
    for edit in (
        lambda p: terms_of(p).pop(),  # a term dropped
        lambda p: terms_of(p)[0].update(matchExpressions=[]),  # an expression dropped
        lambda p: terms_of(p)[0].update(matchFields=[{**PIN, "operator": "NotIn"}]),  # not a pin
    ):
        new = copy.deepcopy(old)
        edit(new)
        ok, why = pod_admit(pod_policy, old, new)
        assert not ok and "matchFields" in why, why


def test_other_users_are_not_confined_by_the_pod_policy(pod_policy: CelPolicy) -> None:
    old = gated_pod()
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["x"] = "y"
    assert pod_admit(pod_policy, old, new, user="alice") == (True, "not matched")


def test_the_policies_follow_the_domain_and_are_optional(render) -> None:
    docs = render({"domain": "example.com"})
    text = yaml.safe_dump(one(docs, "ValidatingAdmissionPolicy", f"{PLACEMENT}-pods"))
    assert "placement.example.com/group" in text and "placement.example.com/decision" in text
    assert "gpustack.ai" not in text
    docs = render({"placement": {"admissionPolicy": {"enabled": False}}})
    assert not [
        d for d in docs if d["metadata"]["name"].startswith(f"{PLACEMENT}-") and "Policy" in d["kind"]
    ]


# The homogeneity default: helm merges maps, so the default is a list a given value replaces whole.

GPU_DEFAULT = {"nvidia.com/gpu": ["nvidia.com/gpu.product"], "amd.com/gpu": ["amd.com/gpu.product-name"]}


@pytest.mark.parametrize(
    ("given", "written"),
    [
        ("absent", GPU_DEFAULT),
        ({}, {}),
        (None, {}),
        ([], {}),
        ({"nvidia.com/gpu": ["example.com/model"]}, {"nvidia.com/gpu": ["example.com/model"]}),
        (
            [{"resource": "example.com/npu", "keys": ["example.com/npu.model"]}],
            {"example.com/npu": ["example.com/npu.model"]},
        ),
    ],
)
def test_homogeneity_by_resource_can_be_turned_off_or_replaced(
    render, tmp_path: Path, given: Any, written: dict[str, list[str]]
) -> None:
    """Through `helm template`: `{}` and `null` both clear the default (a map default would survive `{}`),
    and the file always names the key, so the process never falls back to its own built-in default."""
    from nodefabric_operator.extender.config import load_config

    values = {} if given == "absent" else {"extender": {"defaults": {"homogeneousByResource": given}}}
    docs = render(values)
    text = one(docs, "ConfigMap", CONFIG)["data"]["extender.yaml"]
    assert yaml.safe_load(text)["homogeneousByResource"] == written
    path = tmp_path / "extender.yaml"
    path.write_text(text)
    assert load_config(path).homogeneous_by_resource == {k: tuple(v) for k, v in written.items()}


def test_homogeneity_by_resource_is_off_through_a_values_file_with_null(helm, tmp_path: Path) -> None:
    """The literal `homogeneousByResource: null` and `{}` in a -f file, as a user writes them."""
    from chart_support import CHART, run_helm

    for literal in ("null", "{}", "[]"):
        (tmp_path / "mine.yaml").write_text(f"extender:\n  defaults:\n    homogeneousByResource: {literal}\n")
        args = ["template", "nf", str(CHART), "-n", NAMESPACE, "-s", "templates/placement-config.yaml"]
        done = run_helm(
            helm, *args, "-f", str(tmp_path / "mine.yaml"), values=None, tmp=tmp_path, kube_version=None
        )
        assert done.returncode == 0, done.stderr
        (doc,) = [d for d in yaml.safe_load_all(done.stdout) if d]
        assert yaml.safe_load(doc["data"]["extender.yaml"])["homogeneousByResource"] == {}, literal


@pytest.mark.parametrize(
    ("given", "complaint"),
    [
        (
            [{"resource": "nvidia.com/gpu", "keys": []}, {"resource": "nvidia.com/gpu", "keys": ["a"]}],
            "names nvidia.com/gpu twice",
        ),
        ([{"resource": "nvidia.com/gpu"}], "homogeneousByResource"),
        ([{"resource": "nvidia.com/gpu", "keys": ["not a label!"]}], "homogeneousByResource"),
        ("nvidia.com/gpu.product", "homogeneousByResource"),
    ],
)
def test_bad_homogeneity_values_are_refused(render, given: Any, complaint: str) -> None:
    assert complaint in refusal(render, {"extender": {"defaults": {"homogeneousByResource": given}}})


def test_the_placement_process_accepts_the_rendered_arguments(default_docs: list[Doc]) -> None:
    """The real `nodefabric placement` parser reads the Deployment's arguments."""
    from nodefabric_operator.console import build_parser

    args = container(deployment(default_docs), "placement")["args"]
    parser, command = build_parser(args)
    assert command is not None, args
    ns = parser.parse_args(args)
    assert (str(ns.config), ns.metrics_port, ns.webhook_port) == ("/etc/nodefabric/extender.yaml", 9103, 9443)
    assert (str(ns.tls_cert_file), str(ns.tls_private_key_file)) == (
        "/etc/nodefabric/tls/tls.crt",
        "/etc/nodefabric/tls/tls.key",
    )
