#!/usr/bin/env bash
# End-to-end run on a kind cluster. kind nodes have no RDMA hardware, so each worker gets a generated host
# tree (the fixture builder's gpu8 layout: 8 GPUs, 5 ConnectX NICs with RDMA, two NUMA nodes) mounted into
# the node, and the agent reads it (agent.hostRoot). Then it checks what a user would:
#   - the CRD upgrade hook ran (the CRD carries the release's version) and a Devices record per node;
#   - rdma.* labels reach each Node through Node Feature Discovery (the operator's NodeFeature);
#   - the device plugin's three resources are in each Node's allocatable, with the record's counts;
#   - an agent may write only its own node's Devices object, and post Events only about it, in "default"
#     (its RBAC and the admission policies);
#   - an 8-pod group scheduled by the chart's scheduler lands where the extender said (its claim
#     annotation on every pod names one location; every pod's node is in it).
#
# Needs docker, kind, kubectl and python3; helm is taken from PATH or fetched by hack/fetch_helm.py.
# Usage: hack/kind-e2e.sh            (KEEP_CLUSTER=1 keeps the cluster for poking around)
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-nodefabric-e2e}
IMAGE=${IMAGE:-nodefabric:e2e}
NS=${NS:-nodefabric}
NFD_VERSION=${NFD_VERSION:-0.18.3}
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-}   # empty: kind's default; Kubernetes >= 1.30 is required
HELM=${HELM:-$(command -v helm || python3 hack/fetch_helm.py)}
DOMAIN=gpustack.ai
WORKERS=4
GROUP_SIZE=8
HOST_ROOT=/opt/nodefabric/host         # where each kind worker sees its generated host tree
WORK=$(mktemp -d "${TMPDIR:-/tmp}/nodefabric-e2e.XXXXXX")

step() { printf '\n=== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

# retry SECONDS CMD...: run CMD every 5 s until it succeeds or SECONDS pass.
retry() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 5
  done
}

cleanup() {
  if [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then
    kind delete cluster --name "$CLUSTER" || true
    rm -rf "$WORK"
  fi
}

trap cleanup EXIT

step "a generated host tree per worker (fixture builder, gpu8 layout)"
for i in $(seq 1 "$WORKERS"); do
  PYTHONPATH=devicemanager python3 hack/kind_e2e.py host "$WORK/hosts/worker-$i"
done
ls "$WORK/hosts/worker-1/sys/class/infiniband"

step "kind cluster $CLUSTER (1 control plane, $WORKERS workers, each with its host tree at $HOST_ROOT)"
{
  printf 'kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes:\n  - role: control-plane\n'
  for i in $(seq 1 "$WORKERS"); do
    printf '  - role: worker\n    extraMounts:\n      - hostPath: %s\n        containerPath: %s\n        readOnly: true\n' \
      "$WORK/hosts/worker-$i" "$HOST_ROOT"
  done
} >"$WORK/kind.yaml"
kind create cluster --name "$CLUSTER" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 120s --config "$WORK/kind.yaml"
kubectl version

# The agent tolerates GPU taints only, so it runs on the workers, not on the tainted control plane.
mapfile -t NODES < <(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | sort)
((${#NODES[@]} == WORKERS)) || fail "expected $WORKERS worker nodes, got ${NODES[*]}"
# Two zones of two nodes: the extender has a location level to place the group in.
for idx in "${!NODES[@]}"; do
  kubectl label node "${NODES[$idx]}" "topology.kubernetes.io/zone=zone-$((idx / 2))" --overwrite
done

step "image $IMAGE"
make image IMAGE="$IMAGE"
kind load docker-image "$IMAGE" --name "$CLUSTER"

step "Node Feature Discovery $NFD_VERSION"
"$HELM" install nfd oci://registry.k8s.io/nfd/charts/node-feature-discovery --version "$NFD_VERSION" \
  --namespace node-feature-discovery --create-namespace \
  --set "master.config.extraLabelNs={feature.$DOMAIN}" --wait --timeout 5m

step "nodefabric chart"
# The second scheduler runs the cluster's own kube-scheduler version (the chart never guesses it).
SCHEDULER_TAG=$(kubectl version -o json | python3 -c \
  'import json, re, sys; print(re.match(r"v\d+\.\d+\.\d+", json.load(sys.stdin)["serverVersion"]["gitVersion"]).group())')
# No GPU product labels on kind nodes: the group needs no homogeneity key to be placed.
"$HELM" install nodefabric charts/nodefabric --namespace "$NS" --create-namespace \
  --set image.registry= --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
  --set image.pullPolicy=Never --set agent.hostRoot="$HOST_ROOT" \
  --set extender.enabled=true --set scheduler.image.tag="$SCHEDULER_TAG" \
  --set 'extender.defaults.homogeneous={}' \
  --wait --timeout 5m
kubectl -n "$NS" get pods -o wide

step "the CRD upgrade hook applied the Devices CRD of this version"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
recorded=$(kubectl get crd devices.worker.gpustack.ai -o jsonpath='{.metadata.annotations.nodefabric\.gpustack\.ai/version}')
[[ "$recorded" == "$version" ]] || fail "the CRD records version '$recorded', not $version: did the hook run?"

step "a Devices record per node, labels published"
for node in "${NODES[@]}"; do
  retry 180 kubectl get devices "$node" -o name || fail "no Devices object for $node"
  kubectl wait --for=condition=LabelsPublished "devices/$node" --timeout=180s
  # The operator's NodeFeature for the node, in the release namespace, tagged for nfd-master.
  kubectl -n "$NS" get nodefeature "$node" -o jsonpath='{.metadata.labels.nfd\.node\.kubernetes\.io/node-name}' \
    | grep -qx "$node" || fail "no NodeFeature for $node"
done
kubectl get devices -o wide

step "rdma.* labels on every Node, through NFD"
# label_is NODE KEY VALUE: the node's label feature.<domain>/KEY is VALUE.
label_is() {
  [[ "$(kubectl get node "$1" -o jsonpath="{.metadata.labels.feature\.${DOMAIN//./\\.}/${2//./\\.}}")" == "$3" ]]
}
for node in "${NODES[@]}"; do
  retry 120 label_is "$node" rdma.capable true || fail "no feature.$DOMAIN/rdma.capable=true on $node"
  # gpu8's NICs sit on NUMA nodes 0 and 1.
  label_is "$node" rdma.numa 0_1 || fail "feature.$DOMAIN/rdma.numa on $node is not 0_1"
  # nfd-master, not the operator, put them there: it lists the labels it manages on the Node.
  kubectl get node "$node" -o jsonpath='{.metadata.annotations.nfd\.node\.kubernetes\.io/feature-labels}' \
    | grep -q "feature.$DOMAIN/rdma.capable" || fail "rdma.capable on $node was not set by NFD"
done
kubectl get nodes -L "feature.$DOMAIN/rdma.capable,feature.$DOMAIN/rdma.numa,feature.$DOMAIN/rdma.distance"

step "the device plugin's resources in every Node's allocatable"
# allocatable NODE KEY: the node's allocatable device.<domain>/KEY (dots escaped for jsonpath).
allocatable() {
  kubectl get node "$1" -o jsonpath="{.status.allocatable.device\.${DOMAIN//./\\.}/${2//./\\.}}"
}
allocatable_is() { [[ "$(allocatable "$1" "$2")" == "$3" ]]; }
for node in "${NODES[@]}"; do
  # One exclusive token per usable whole-function endpoint: the record's RDMA column (gpu8 has no VFs).
  endpoints=$(kubectl get devices "$node" -o jsonpath='{.status.rdmaEndpoints}')
  ((endpoints > 0)) || fail "the record of $node counts no usable RDMA endpoint"
  retry 60 allocatable_is "$node" rdma "$endpoints" \
    || fail "device.$DOMAIN/rdma on $node is '$(allocatable "$node" rdma)', not $endpoints"
  allocatable_is "$node" rdma.shared "$((endpoints * 64))" || fail "rdma.shared on $node"
  allocatable_is "$node" rdma.partitioned 0 || fail "rdma.partitioned on $node"
done

step "an agent may write only its own node's Devices object"
A=${NODES[0]} B=${NODES[1]}
agent_pod=$(kubectl -n "$NS" get pods -l app.kubernetes.io/component=agent --field-selector "spec.nodeName=$A" \
  -o jsonpath='{.items[0].metadata.name}')
agent_sa=$(kubectl -n "$NS" get pod "$agent_pod" -o jsonpath='{.spec.serviceAccountName}')
# A token bound to the agent pod carries the node-name claim, exactly like the one the pod mounts.
token=$(kubectl -n "$NS" create token "$agent_sa" --bound-object-kind Pod --bound-object-name "$agent_pod")
server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
as_agent() { kubectl --kubeconfig=/dev/null --server="$server" --insecure-skip-tls-verify --token="$token" "$@"; }
as_agent patch devices "$A" --type=merge -p '{"metadata":{"annotations":{"e2e.nodefabric/own":"ok"}}}'
if out=$(as_agent patch devices "$B" --type=merge -p '{"metadata":{"annotations":{"e2e.nodefabric/other":"x"}}}' 2>&1); then
  fail "the agent on $A patched the Devices object of $B"
fi
grep -q "may write only Devices $A" <<<"$out" || fail "unexpected refusal: $out"
echo "refused as expected: $out"
# event_about NODE [NAMESPACE]: an Event about NODE's Devices record, as the agent posts them (in "default").
event_about() {
  printf 'apiVersion: v1\nkind: Event\nmetadata:\n  generateName: %s.\n  namespace: %s\n' "$1" "${2:-default}"
  printf 'involvedObject:\n  apiVersion: worker.gpustack.ai/v1alpha1\n  kind: Devices\n  name: %s\n' "$1"
  printf 'type: Warning\nreason: E2E\nmessage: e2e\nsource:\n  component: nodefabric-agent\n'
}
event_about "$A" | as_agent create -f - || fail "the agent on $A could not post an Event about its own record"
if out=$(event_about "$B" | as_agent create -f - 2>&1); then
  fail "the agent on $A posted an Event about the Devices object of $B"
fi
grep -q "may post Events only about Devices $A" <<<"$out" || fail "unexpected refusal: $out"
echo "refused as expected: $out"
if out=$(event_about "$A" kube-system | as_agent create -f - 2>&1); then
  fail "the agent on $A posted an Event outside the default namespace"
fi
grep -q "forbidden" <<<"$out" || fail "unexpected refusal: $out"
echo "refused as expected: $out"

step "an $GROUP_SIZE-pod group placed through the extender lands where it said"
kubectl create namespace e2e-placement
for i in $(seq 0 $((GROUP_SIZE - 1))); do
  kubectl -n e2e-placement apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: worker-$i
  labels:
    placement.$DOMAIN/group: e2e-job
    placement.$DOMAIN/group-size: "$GROUP_SIZE"
spec:
  schedulerName: nodefabric-scheduler
  containers:
    - name: pause
      image: registry.k8s.io/pause:3.10
EOF
done
kubectl -n e2e-placement wait --for=condition=PodScheduled pod --all --timeout=180s
kubectl -n e2e-placement get pods -o wide
kubectl get pods -n e2e-placement -o json >"$WORK/pods.json"
kubectl get nodes -o json >"$WORK/nodes.json"
python3 hack/kind_e2e.py placement "$WORK/pods.json" "$WORK/nodes.json" --domain "$DOMAIN" --size "$GROUP_SIZE" \
  || fail "the group is not where the extender said"
kubectl -n e2e-placement get pod worker-0 -o jsonpath="{.metadata.annotations.placement\.${DOMAIN//./\\.}/decision}"
echo

step "PASS"
