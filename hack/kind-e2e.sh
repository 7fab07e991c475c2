#!/usr/bin/env bash
# End-to-end run on a kind cluster: build the image, install NFD and the chart, and check what a user
# would: a Devices record per node, the operator's NodeFeature per node, the three RDMA resources
# registered (with zero devices: kind nodes have no RDMA), the own-node admission policy, and pods
# placed by the second scheduler through the extender.
#
# Needs docker, kind and kubectl; helm is taken from PATH or fetched by hack/fetch_helm.py.
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
  if [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then kind delete cluster --name "$CLUSTER"; fi
}

step "kind cluster $CLUSTER (1 control plane, 2 workers)"
kind create cluster --name "$CLUSTER" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 120s --config - <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
  - role: worker
EOF
trap cleanup EXIT
kubectl version

step "image $IMAGE"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

step "Node Feature Discovery $NFD_VERSION"
"$HELM" install nfd oci://registry.k8s.io/nfd/charts/node-feature-discovery --version "$NFD_VERSION" \
  --namespace node-feature-discovery --create-namespace --wait --timeout 5m

step "nodefabric chart"
"$HELM" install nodefabric charts/nodefabric --namespace "$NS" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --wait --timeout 5m
kubectl -n "$NS" get pods -o wide

# The agent tolerates GPU taints only, so it runs on the workers, not on the tainted control plane.
mapfile -t NODES < <(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
((${#NODES[@]} == 2)) || fail "expected 2 worker nodes, got ${NODES[*]}"

step "a Devices record per node, labels published"
for node in "${NODES[@]}"; do
  retry 180 kubectl get devices "$node" -o name || fail "no Devices object for $node"
  kubectl wait --for=condition=LabelsPublished "devices/$node" --timeout=180s
  # The operator's NodeFeature for the node, in the release namespace, tagged for nfd-master.
  kubectl -n "$NS" get nodefeature "$node" -o jsonpath='{.metadata.labels.nfd\.node\.kubernetes\.io/node-name}' \
    | grep -qx "$node" || fail "no NodeFeature for $node"
done
kubectl get devices
kubectl get nodes -L "feature.$DOMAIN/rdma.capable,feature.$DOMAIN/rdma.numa,feature.$DOMAIN/fabric.domain"
# kind nodes have no RDMA device: claiming one would be a lie.
[[ -z "$(kubectl get nodes -l "feature.$DOMAIN/rdma.capable" -o name)" ]] || fail "rdma.capable on a kind node"

step "the three RDMA resources registered, with zero devices"
# capacity_is NODE KEY VALUE: the node's capacity for device.<domain>/KEY (dots escaped for jsonpath).
capacity_is() {
  local path="{.status.capacity.device\.${DOMAIN//./\\.}/${2//./\\.}}"
  [[ "$(kubectl get node "$1" -o jsonpath="$path")" == "$3" ]]
}
for node in "${NODES[@]}"; do
  for key in rdma rdma.shared rdma.partitioned; do
    retry 60 capacity_is "$node" "$key" 0 || fail "device.$DOMAIN/$key not registered with 0 devices on $node"
  done
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

step "pods placed by the second scheduler through the extender"
kubectl create namespace e2e-placement
for i in 0 1; do
  kubectl -n e2e-placement apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: worker-$i
  labels:
    placement.$DOMAIN/group: e2e-job
    placement.$DOMAIN/group-size: "2"
spec:
  schedulerName: nodefabric-scheduler
  containers:
    - name: pause
      image: registry.k8s.io/pause:3.10
EOF
done
kubectl -n e2e-placement wait --for=condition=PodScheduled pod/worker-0 pod/worker-1 --timeout=120s
kubectl -n e2e-placement get pods -o wide
kubectl -n e2e-placement get events --field-selector involvedObject.kind=Pod

step "PASS"
