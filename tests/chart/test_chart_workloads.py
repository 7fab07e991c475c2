"""What each component runs: command lines, host access, security contexts and the scheduler configuration."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import NAMESPACE, Doc, RenderError, container, of_kind, one, pod_spec, refusal, workloads

AGENT = "nf-nodefabric-agent"
SCHEDULER = "nf-nodefabric-scheduler"


# The optional second scheduler and its extender are off by default; this module covers them among the
# other components, so its renders turn them on (unless a test's values say otherwise).
pytestmark = pytest.mark.with_extender


def agent(docs: list[Doc]) -> Doc:
    return one(docs, "DaemonSet", AGENT)


def mounts_by_volume(workload: Doc, container_name: str) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container(workload, container_name)["volumeMounts"]}


def host_paths(workload: Doc) -> dict[str, dict[str, Any]]:
    return {v["name"]: v["hostPath"] for v in pod_spec(workload).get("volumes", []) if "hostPath" in v}


# The agent's command line, exactly as the agent parses it.


def test_agent_command_line_by_default(default_docs: list[Doc]) -> None:
    c = container(agent(default_docs), "agent")
    assert c["args"] == [
        "--log-level", "INFO", "--log-format", "text",
        "agent", "--node-name", "$(NODE_NAME)", "--root", "/host", "--interval", "60",
        "--bind-address", "$(HOST_IP)",
        "--metrics-port", "9464", "--health-port", "9465", "--domain", "gpustack.ai", "--shared-count", "64",
    ]  # fmt: skip
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # On the node's network the agent binds its ports on the node's own address.
    assert env["HOST_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert c["ports"] == [
        {"name": "metrics", "containerPort": 9464, "hostPort": 9464, "protocol": "TCP"},
        {"name": "health", "containerPort": 9465, "hostPort": 9465, "protocol": "TCP"},
    ]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_agent_command_line_follows_values(render) -> None:
    docs = render(
        {
            "domain": "example.com",
            "agent": {"interval": 15, "metricsPort": 9400, "sharedCount": 1000,
                      "families": {"shared": False, "partitioned": False}},
        }
    )  # fmt: skip
    args = container(agent(docs), "agent")["args"]
    assert args[args.index("--interval") + 1] == "15"
    assert args[args.index("--metrics-port") + 1] == "9400"
    assert args[args.index("--shared-count") + 1] == "1000"
    assert args[args.index("--domain") + 1] == "example.com"
    assert "--no-shared" in args and "--no-partitioned" in args
    only_shared_off = container(agent(render({"agent": {"families": {"shared": False}}})), "agent")["args"]
    assert "--no-shared" in only_shared_off and "--no-partitioned" not in only_shared_off


# Host access: only the agent touches the host, read-only except the kubelet socket directory.


def test_only_the_agent_touches_the_host(default_docs: list[Doc]) -> None:
    for w in workloads(default_docs):
        spec = pod_spec(w)
        assert not spec.get("hostPID") and not spec.get("hostIPC")
        if w["metadata"]["name"] != AGENT:
            assert not spec.get("hostNetwork"), w["metadata"]["name"]
            assert host_paths(w) == {}, w["metadata"]["name"]


def test_agent_runs_on_the_host_network_to_hear_link_uevents(render, default_docs: list[Doc]) -> None:
    spec = pod_spec(agent(default_docs))
    assert spec["hostNetwork"] is True
    # Cluster DNS still resolves the API server's service name from the node's network.
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    ports = {p["name"]: p for p in container(agent(default_docs), "agent")["ports"]}
    assert all(p["hostPort"] == p["containerPort"] for p in ports.values())
    moved = container(agent(render({"agent": {"metricsPort": 19464, "healthPort": 19465}})), "agent")
    assert {(p["containerPort"], p["hostPort"]) for p in moved["ports"]} == {(19464, 19464), (19465, 19465)}
    args = moved["args"]
    assert args[args.index("--metrics-port") + 1] == "19464"
    assert args[args.index("--health-port") + 1] == "19465"
    # Its own network namespace, when asked: no host ports, no host address, default DNS.
    own = agent(render({"agent": {"hostNetwork": False}}))
    spec, c = pod_spec(own), container(own, "agent")
    assert spec["hostNetwork"] is False and "dnsPolicy" not in spec
    assert not [p for p in c["ports"] if "hostPort" in p]
    assert "--bind-address" not in c["args"]
    assert "HOST_IP" not in {e["name"] for e in c["env"]}


def test_agent_host_mounts_are_read_only_except_the_device_plugin_directory(default_docs: list[Doc]) -> None:
    a = agent(default_docs)
    hosts = host_paths(a)
    mounts = mounts_by_volume(a, "agent")
    assert {v: h["path"] for v, h in hosts.items()} == {
        "host-sys": "/sys",
        "host-dev": "/dev",
        "device-plugins": "/var/lib/kubelet/device-plugins",
    }
    for volume, host in hosts.items():
        # Nothing is created on the host: a missing path fails the pod instead of leaving an empty dir behind.
        assert host["type"] == "Directory", volume
        mount = mounts[volume]
        if volume == "device-plugins":
            assert mount["mountPath"] == "/var/lib/kubelet/device-plugins"
            assert not mount.get("readOnly")
        else:
            assert mount["readOnly"] is True, volume
            assert mount["recursiveReadOnly"] == "IfPossible", volume
            assert "mountPropagation" not in mount
    # --root /host sees the host's /sys and /dev (for /dev/infiniband) at their usual places under it.
    assert mounts["host-sys"]["mountPath"] == "/host/sys"
    assert mounts["host-dev"]["mountPath"] == "/host/dev"


def test_kubelet_directory_follows_values(render) -> None:
    docs = render({"agent": {"kubeletDevicePluginsPath": "/data/kubelet/device-plugins"}})
    assert host_paths(agent(docs))["device-plugins"]["path"] == "/data/kubelet/device-plugins"
    # The plugin's own default path inside the container stays put: it is where the agent looks.
    assert (
        mounts_by_volume(agent(docs), "agent")["device-plugins"]["mountPath"]
        == "/var/lib/kubelet/device-plugins"
    )


def test_no_container_is_privileged_or_can_gain_privileges(default_docs: list[Doc]) -> None:
    for w in workloads(default_docs):
        for c in pod_spec(w)["containers"]:
            sc = c["securityContext"]
            where = f"{w['metadata']['name']}/{c['name']}"
            assert not sc.get("privileged"), where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where


def test_only_the_agent_runs_as_root(default_docs: list[Doc]) -> None:
    for w in workloads(default_docs):
        for c in pod_spec(w)["containers"]:
            sc = c["securityContext"]
            if w["metadata"]["name"] == AGENT:
                assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
            else:
                assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0, w["metadata"]["name"]
                assert pod_spec(w)["securityContext"]["runAsNonRoot"] is True


def test_agent_scheduling_follows_values(render, default_docs: list[Doc]) -> None:
    spec = pod_spec(agent(default_docs))
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert {t["key"] for t in spec["tolerations"]} == {"nvidia.com/gpu", "amd.com/gpu"}
    assert spec["priorityClassName"] == "system-node-critical"
    assert "runtimeClassName" not in spec
    custom = pod_spec(
        agent(
            render(
                {
                    "agent": {
                        "nodeSelector": {"node-role/gpu": "true"},
                        "tolerations": [{"operator": "Exists"}],
                        "priorityClassName": "",
                        "runtimeClassName": "nvidia",
                    }
                }
            )
        )
    )
    assert custom["nodeSelector"] == {"node-role/gpu": "true", "kubernetes.io/os": "linux"}
    assert custom["tolerations"] == [{"operator": "Exists"}]
    assert "priorityClassName" not in custom
    assert custom["runtimeClassName"] == "nvidia"


def test_image_follows_values(render, default_docs: list[Doc]) -> None:
    for name, in_container in (
        (AGENT, "agent"),
        ("nf-nodefabric-operator", "operator"),
        (SCHEDULER, "extender"),
    ):
        w = next(w for w in workloads(default_docs) if w["metadata"]["name"] == name)
        assert container(w, in_container)["image"] == "ghcr.io/gpustack/nodefabric:0.1.0"
    image = {"registry": "registry.local:5000", "repository": "gpu/nf", "tag": "dev", "pullPolicy": "Never"}
    docs = render({"image": image})
    c = container(agent(docs), "agent")
    assert (c["image"], c["imagePullPolicy"]) == ("registry.local:5000/gpu/nf:dev", "Never")
    # No registry: the repository is the whole reference (a kind-loaded image, a Docker Hub short name).
    bare = {"registry": "", "repository": "nodefabric", "tag": "e2e"}
    assert container(agent(render({"image": bare})), "agent")["image"] == "nodefabric:e2e"
    # A digest pins the image whatever the tag says, for every component.
    digest = "sha256:" + "ab" * 32
    docs = render({"image": {"digest": digest, "tag": "ignored"}})
    for w in workloads(docs):
        for c in pod_spec(w)["containers"]:
            if c["name"] != "kube-scheduler":
                assert c["image"] == f"ghcr.io/gpustack/nodefabric@{digest}", w["metadata"]["name"]


@pytest.mark.parametrize(
    "repository",
    [
        "ghcr.io/gpustack/nodefabric",  # chart 0.1.0's default, kept in a values file
        "registry.example.com/mirror/nodefabric",  # a mirror, as chart 0.1.0 took it
        "localhost/nodefabric",
    ],
)
def test_a_repository_that_names_its_registry_is_refused_not_doubled(render, repository: str) -> None:
    """Chart 0.1.0's image.repository was the whole reference; under image.registry it would silently pull
    <registry>/<registry>/...: every pod in ImagePullBackOff, the CRD hook first."""
    host = repository.split("/", 1)[0]
    complaint = refusal(render, {"image": {"repository": repository}})
    assert f'image.repository "{repository}" starts with a registry host ({host})' in complaint
    assert f"image.registry={host} image.repository={repository.split('/', 1)[1]}" in complaint
    # Given without a registry, it is the whole reference, as the README says.
    docs = render({"image": {"registry": "", "repository": repository, "tag": "1.0"}})
    assert container(agent(docs), "agent")["image"] == f"{repository}:1.0"


def test_single_writers_never_overlap(default_docs: list[Doc]) -> None:
    for name in ("nf-nodefabric-operator",):
        d = one(default_docs, "Deployment", name)
        assert d["spec"]["replicas"] == 1
        assert d["spec"]["strategy"] == {"type": "Recreate"}


def test_the_operator_is_sized_for_a_5000_node_fleet(default_docs: list[Doc]) -> None:
    """hack/bench_operator.py: a watch replay over 5,000 records peaks at 368 MiB resident, and kopf's
    decoding pauses the loop that answers /healthz for up to 6 s on a loaded machine."""
    operator = container(one(default_docs, "Deployment", "nf-nodefabric-operator"), "operator")
    limit = operator["resources"]["limits"]["memory"]
    assert limit.endswith("Mi") and int(limit[:-2]) >= 128 + 75 * 5, limit
    for probe in ("livenessProbe", "readinessProbe"):
        assert operator[probe]["timeoutSeconds"] >= 10, probe


# The second scheduler (its configuration and the extender beside it: test_chart_scheduler.py).


TAG_REQUIRED = "scheduler.image.tag is empty: set it to your cluster's Kubernetes version"


@pytest.mark.parametrize("kube_version", ["1.30.0", "1.33.0", "v1.32.9-eks-113cf36"])
def test_the_scheduler_image_is_never_guessed_from_the_kubernetes_version(render, kube_version: str) -> None:
    """helm template without --kube-version reports helm's own default version: a tag taken from it would
    silently run a kube-scheduler of another version than the cluster's. So the tag is a value."""
    with pytest.raises(RenderError) as refused:
        render(kube_version=kube_version, scheduler_tag=False)
    assert TAG_REQUIRED in str(refused.value)
    assert "kubectl version" in str(refused.value)
    # Set, it is exactly what runs, whatever version helm believes the cluster is.
    docs = render({"scheduler": {"image": {"tag": "v1.31.4"}}}, kube_version=kube_version)
    assert container(one(docs, "Deployment", SCHEDULER), "kube-scheduler")["image"] == (
        "registry.k8s.io/kube-scheduler:v1.31.4"
    )


def test_the_scheduler_image_without_helms_idea_of_a_version(helm, tmp_path) -> None:
    """The GitOps render itself: no --kube-version, no tag. Refused, naming the value."""
    from chart_support import CHART, run_helm

    args = ["template", "nf", str(CHART), "-n", "nodefabric", "-s", "templates/scheduler.yaml"]
    on = {"extender": {"enabled": True}}
    done = run_helm(helm, *args, values=on, tmp=tmp_path, kube_version=None)
    assert done.returncode != 0 and TAG_REQUIRED in done.stderr, done.stdout + done.stderr
    done = run_helm(
        helm,
        *args,
        values={**on, "scheduler": {"image": {"tag": "v1.30.2"}}},
        tmp=tmp_path,
        kube_version=None,
    )
    assert done.returncode == 0, done.stderr
    assert 'image: "registry.k8s.io/kube-scheduler:v1.30.2"\n' in done.stdout


def test_the_scheduler_image_by_digest_or_from_a_mirror(render) -> None:
    digest = "sha256:" + "5c" * 32
    # A digest pins it on its own (the tag, if any, is then only documentation).
    for tag in ("", "v1.33.4"):
        docs = render({"scheduler": {"image": {"tag": tag, "digest": digest}}}, scheduler_tag=False)
        image = container(one(docs, "Deployment", SCHEDULER), "kube-scheduler")["image"]
        assert image == f"registry.k8s.io/kube-scheduler@{digest}"
    mirror = {"repository": "mirror.local:5000/k8s/kube-scheduler", "tag": "v1.33.4", "pullPolicy": "Always"}
    c = container(one(render({"scheduler": {"image": mirror}}), "Deployment", SCHEDULER), "kube-scheduler")
    assert (c["image"], c["imagePullPolicy"]) == ("mirror.local:5000/k8s/kube-scheduler:v1.33.4", "Always")


def test_no_scheduler_no_tag_needed(render) -> None:
    docs = render({"extender": {"enabled": False}}, scheduler_tag=False)
    assert not [d for d in docs if "scheduler" in d["metadata"]["name"]]


@pytest.mark.parametrize(
    ("image", "complaint"),
    [
        ({"tag": "v1.33 latest"}, "/scheduler/image/tag"),
        ({"tag": 1.33}, "/scheduler/image/tag"),
        ({"digest": "sha256:abc"}, "/scheduler/image/digest"),
        ({"repository": "https://registry.k8s.io/kube-scheduler"}, "/scheduler/image/repository"),
        ({"repository": "registry.k8s.io/kube-scheduler:v1.33.4"}, "/scheduler/image/repository"),
        ({"repository": "Registry.K8s.io/Kube-Scheduler"}, "/scheduler/image/repository"),
        ({"repository": ""}, "/scheduler/image/repository"),
        ({"pullPolicy": "Sometimes"}, "/scheduler/image/pullPolicy"),
        ({"registry": "registry.k8s.io"}, "registry"),
    ],
)
def test_bad_scheduler_images_are_refused_naming_the_key(
    render, image: dict[str, Any], complaint: str
) -> None:

    assert complaint in refusal(render, {"scheduler": {"image": image}})


def test_chart_refuses_clusters_without_admission_policies(render) -> None:
    from chart_support import RenderError

    with pytest.raises(RenderError, match="kubeVersion"):
        render(kube_version="1.29.9")


def test_every_workload_has_probes_and_resources(default_docs: list[Doc]) -> None:
    for w in workloads(default_docs):
        for c in pod_spec(w)["containers"]:
            where = f"{w['metadata']['name']}/{c['name']}"
            if w["kind"] != "Job":  # a run-to-completion Job has its deadline instead
                assert c["livenessProbe"] and c["readinessProbe"], where
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], where


def test_metrics_services_select_their_pods(default_docs: list[Doc]) -> None:
    pods = {
        w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"] for w in workloads(default_docs)
    }
    for svc in of_kind(default_docs, "Service"):
        matched = [n for n, labels in pods.items() if svc["spec"]["selector"].items() <= labels.items()]
        assert len(matched) == 1, svc["metadata"]["name"]


# The command lines, parsed by the real `nodefabric` CLI: a flag the program does not know fails here.


def parse(args: list[str]) -> Any:
    from nodefabric_operator.console import build_parser

    parser, command = build_parser(args)
    assert command is not None, args
    return parser.parse_args(args)


def test_the_agent_parses_its_rendered_command_line(render) -> None:
    docs = render({"agent": {"families": {"shared": False}, "sharedCount": 500, "interval": 30}})
    args = [
        a.replace("$(NODE_NAME)", "gpu-node-7").replace("$(HOST_IP)", "10.0.0.7")
        for a in container(agent(docs), "agent")["args"]
    ]
    ns = parse(args)
    assert (ns.node_name, ns.root, ns.interval) == ("gpu-node-7", "/host", 30.0)
    assert (ns.metrics_port, ns.health_port, ns.bind_address) == (9464, 9465, "10.0.0.7")
    assert (ns.log_level, ns.log_format) == ("INFO", "text")
    assert (ns.no_shared, ns.no_partitioned, ns.shared_count, ns.domain) == (True, False, 500, "gpustack.ai")
    # The plugin's socket directory default is where the chart mounts kubelet's.
    assert ns.plugin_dir == mounts_by_volume(agent(docs), "agent")["device-plugins"]["mountPath"]


@pytest.mark.parametrize("sink", ["nodefeature", "node"])
def test_the_operator_parses_its_rendered_command_line(render, sink: str) -> None:
    docs = render({"labelSink": sink, "domain": "example.com"})
    ns = parse(container(one(docs, "Deployment", "nf-nodefabric-operator"), "operator")["args"])
    assert (ns.sink, ns.namespace, ns.domain, ns.standalone) == (sink, NAMESPACE, "example.com", True)
    assert (ns.metrics_port, ns.health_port) == (9101, 8080)


def test_critical_agent_pods_are_admitted_by_a_quota_for_their_class(render, default_docs: list[Doc]) -> None:
    (quota,) = of_kind(default_docs, "ResourceQuota")
    assert quota["metadata"]["namespace"] == NAMESPACE
    (expr,) = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert expr == {"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}
    assert int(quota["spec"]["hard"]["pods"]) >= 5000
    assert not of_kind(render({"agent": {"priorityClassName": "gpu-infra"}}), "ResourceQuota")
    assert not of_kind(render({"agent": {"criticalPodsQuota": 0}}), "ResourceQuota")


def test_rdma_selectors_reach_the_agent_as_a_file_it_accepts(render, default_docs: list[Doc]) -> None:
    from chart_support import configmap_yaml

    from nodefabric_deviceplugin.selection import parse

    default = container(agent(default_docs), "agent")
    assert "--rdma-selectors" not in default["args"], "the default: every whole function in both families"
    assert not [
        d for d in of_kind(default_docs, "ConfigMap") if d["metadata"]["name"].endswith("-rdma-selectors")
    ]
    selectors = {
        "exclusive": [{"ifNames": ["ens1f0"]}],
        "shared": [{"ifNames": ["ens2f0"], "sharedCount": 16}],
    }
    docs = render({"agent": {"rdmaSelectors": selectors}})
    c = container(agent(docs), "agent")
    path = c["args"][c["args"].index("--rdma-selectors") + 1]
    assert path == "/etc/nodefabric/rdma-selectors.yaml"
    [mount] = [m for m in c["volumeMounts"] if m["name"] == "rdma-selectors"]
    assert mount == {"name": "rdma-selectors", "mountPath": "/etc/nodefabric", "readOnly": True}
    [volume] = [v for v in pod_spec(agent(docs))["volumes"] if v["name"] == "rdma-selectors"]
    name = volume["configMap"]["name"]
    doc = configmap_yaml(docs, name, "rdma-selectors.yaml")
    assert doc == selectors
    assert not parse(doc).default  # what the agent will parse at start
    assert "rdmaSelectors" in refusal(render, {"agent": {"rdmaSelectors": {"exclusiv": []}}})


@pytest.mark.parametrize(
    ("selectors", "pointer"),
    [
        ({"exclusive": [{"ifName": ["ens1f0"]}]}, "/agent/rdmaSelectors/exclusive/0"),
        ({"exclusive": [{}]}, "/agent/rdmaSelectors/exclusive/0"),
        ({"shared": [{"ifNames": []}]}, "/agent/rdmaSelectors/shared/0/ifNames"),
        ({"shared": [{"ifNames": [""]}]}, "/agent/rdmaSelectors/shared/0/ifNames/0"),
        ({"partitioned": [{"vendors": ["15B3"]}]}, "/agent/rdmaSelectors/partitioned/0/vendors/0"),
        ({"exclusive": [{"linkLayers": ["IB"]}]}, "/agent/rdmaSelectors/exclusive/0/linkLayers/0"),
        ({"exclusive": [{"ifNames": ["a"], "sharedCount": 4}]}, "/agent/rdmaSelectors/exclusive/0"),
        ({"shared": [{"ifNames": ["a"], "sharedCount": 1593}]}, "/agent/rdmaSelectors/shared/0/sharedCount"),
    ],
)
def test_rdma_selectors_the_agent_refuses_at_start_are_refused_at_render(
    render, selectors: dict[str, Any], pointer: str
) -> None:
    """The agent reads the file at start and exits 2 on each of these, on every node: refused here instead,
    at the key (the schema has the agent's rules but the overlap of an exclusive and a shared selector)."""
    from nodefabric_deviceplugin.selection import SelectionError, parse

    with pytest.raises(SelectionError):
        parse(selectors)
    said = refusal(render, {"agent": {"rdmaSelectors": selectors}})
    assert pointer in said, said


def test_a_shared_count_the_agent_refuses_at_start_is_refused_at_render(render) -> None:
    """kubelet takes a device list of 4 MiB at most: the agent refuses at start a count whose rdma.shared
    list could exceed it, so every node's agent would crash-loop on a count the schema took."""
    from nodefabric_deviceplugin.limits import PLANNED_ENDPOINTS, _worst_case, fitting_shared_count

    most = fitting_shared_count(_worst_case(PLANNED_ENDPOINTS), 10**6)
    args = container(agent(render({"agent": {"sharedCount": most}})), "agent")["args"]
    assert args[args.index("--shared-count") + 1] == str(most)
    assert "/agent/sharedCount" in refusal(render, {"agent": {"sharedCount": most + 1}})
    shared = {"shared": [{"ifNames": ["a"], "sharedCount": most}]}
    render({"agent": {"rdmaSelectors": shared}})
