#!/usr/bin/env bash
# End-to-end run on a kind cluster. kind nodes have no RDMA hardware, so each worker gets a generated host
# tree (the fixture builder's gpu8 layout: 8 GPUs, 5 ConnectX NICs with RDMA, two NUMA nodes) mounted into
# the node, and the agent reads it (agent.hostRoot). Then it checks what a user would:
#   - the CRD upgrade hook ran (the CRD carries the release's version) and a Devices record per node;
#   - rdma.* labels reach each Node through Node Feature Discovery (the operator's NodeFeature);
#   - the device plugin's three resources are in each Node's allocatable, with the record's counts;
#   - an agent may write only its own node's Devices object, and post Events only about it, in "default"
#     (its RBAC and the admission policies);
#   - an 8-pod group scheduled by the chart's optional second scheduler lands where the extender said
#     (its decision on every pod names one location; every pod's node is in it);
#   - an 8-pod indexed Job asking for device.<domain>/rdma, in a namespace opted in to group admission, is
#     gated by the webhook, admitted whole by `nodefabric placement` (its PlacementGroup Admitted and
#     AllBound) and bound by the stock kube-scheduler: every pod Running on the node its PlacementGroup
#     assigned, all in one zone;
#   - after `helm upgrade` with dra.enabled and dra.devicePlugin: each node's ResourceSlice pool of the
#     driver rdma.<domain> holds its endpoints, and a ResourceClaim of the DeviceClass rdma.<domain> is
#     allocated one device on its pod's node, whose container sees that device's NCCL_IB_HCA and one
#     verbs device (the CDI spec the driver wrote).
# kind workers have no /dev/infiniband: the script makes the fixture's verbs and rdma_cm nodes there
# (mknod, numbers from the fixture's sysfs), since a container runtime refuses a device it cannot stat.
#
# Needs bash >= 4.4, docker (with buildx), kind, kubectl, make and Python >= 3.10; helm is taken from PATH or fetched by
# hack/fetch_helm.py. Five kind nodes need more inotify instances than many distributions allow: see the
# README ("Test on kind").
#
# Usage: hack/kind-e2e.sh              run it; the cluster is deleted at the end unless KEEP_CLUSTER=1
#        KEEP_CLUSTER=1 hack/kind-e2e.sh    keep the cluster; a re-run finds it and runs on it again
#        hack/kind-e2e.sh --helm-args       print the nodefabric chart's flags (NUL-separated) and exit
#        hack/kind-e2e.sh --helm-args-dra   the same for the DRA upgrade (the first install's plus DRA's)
#        hack/kind-e2e.sh --manifests       print the objects it creates (YAML) and exit
#                                           (tests/chart/test_chart_kind_e2e.py renders exactly these)
# On failure, kind's logs, the events, pods' logs and the objects go to $ARTIFACTS (default: artifacts/
# in the work directory, which is then kept) before anything is cleaned up.
set -euo pipefail
CALLER_DIR=$PWD   # a relative ARTIFACTS is the caller's, not the repository's
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-nodefabric-e2e}
IMAGE=${IMAGE:-nodefabric:e2e}         # REPOSITORY:TAG
NS=${NS:-nodefabric}
NFD_VERSION=${NFD_VERSION:-0.18.3}
# Kubernetes >= 1.34 (resource.k8s.io/v1 for DRA): kind v0.30.0's own node image, pinned by digest.
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.34.0@sha256:7416a61b42b1662ca6ca89f02028ac133a309a2a30ba309614e8ec94d976dc5a}
PYTHON=${PYTHON:-python3}
DOMAIN=gpustack.ai
WORKERS=4
GROUP_SIZE=8
DRIVER=rdma.$DOMAIN                    # the DRA driver, and its DeviceClass of every endpoint
BUSYBOX=registry.k8s.io/e2e-test-images/busybox:1.36.1-1   # printenv and ls, for the DRA claim's pod
GATE_NS=e2e-gate                       # opted in to group admission
GROUP=job-e2e-gate                     # the PlacementGroup of the Job e2e-gate: <family>-<name>
DRA_NS=e2e-dra
HOST_ROOT=/opt/nodefabric/host         # where each kind worker sees its generated host tree

step() { printf '\n=== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

((BASH_VERSINFO[0] > 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] >= 4))) \
  || fail "bash >= 4.4 is needed (mapfile -d); this is $BASH_VERSION"
[[ "$CLUSTER" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || fail "CLUSTER '$CLUSTER' is not a valid kind cluster name"
[[ "$IMAGE" =~ ^[a-z0-9._-]+(:[0-9]+/[a-z0-9._-]+)?(/[a-z0-9._-]+)*:[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] \
  || fail "IMAGE '$IMAGE' is not REPOSITORY:TAG"

# The nodefabric chart's values, one flag each; strings with --set-string (`--set image.tag=2` is a
# number, which the schema refuses). An empty list or map is set with --set-json, never
# --set (`--set 'k={}'` is [""] to helm, which the chart's schema refuses), or not at all when the
# chart's default already is one: extender.defaults.homogeneous is [], so kind's nodes, which carry no GPU
# product label, need no homogeneity key for the group to be placed.
# IMAGE's registry host (a first component with a dot or a port, or localhost: Docker's rule) goes to
# image.registry, the rest to image.repository, as the chart's schema wants them.
nodefabric_values() {
  local ref=${IMAGE%:*} registry="" repository=${IMAGE%:*}
  local first=${ref%%/*}
  if [[ "$ref" == */* && ("$first" == *.* || "$first" == *:* || "$first" == localhost) ]]; then
    registry=$first repository=${ref#*/}
  fi
  printf '%s\0' \
    --set extender.enabled=true \
    --set-json "image.registry=\"$registry\"" \
    --set-string "image.repository=$repository" \
    --set-string "image.tag=${IMAGE##*:}" \
    --set image.pullPolicy=Never \
    --set-string "agent.hostRoot=$HOST_ROOT" \
    --set-string "scheduler.image.tag=$SCHEDULER_TAG"
}

# The DRA upgrade's flags on top: the driver rdma.<domain> serves the whole functions, the device plugin
# stays for the SR-IOV VFs (device.<domain>/rdma.partitioned).
dra_values() {
  printf '%s\0' --set dra.enabled=true --set dra.devicePlugin=true
}

# The objects the script creates, one function each (`--manifests` prints them for the test).
# A pod that names a group: the webhook gates it in any namespace. Only ever created with --dry-run=server.
webhook_probe_manifest() {
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: webhook-probe
  labels:
    placement.$DOMAIN/group: webhook-probe
    placement.$DOMAIN/group-size: "1"
spec:
  containers:
    - name: pause
      image: registry.k8s.io/pause:3.10
EOF
}

# One endpoint per pod (gpu8 has 5 per node): the group needs both nodes of a zone. It names no group
# itself: gated because its namespace opted in, sized from the Job (completions = parallelism).
gate_job_manifest() {
  cat <<EOF
apiVersion: batch/v1
kind: Job
metadata:
  name: ${GROUP#job-}
spec:
  completionMode: Indexed
  completions: $GROUP_SIZE
  parallelism: $GROUP_SIZE
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: pause
          image: registry.k8s.io/pause:3.10
          resources:
            limits:
              device.$DOMAIN/rdma: 1
EOF
}

# A claim for one device of the DeviceClass of every endpoint, and a pod that runs with it.
dra_manifests() {
  cat <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: nic
spec:
  devices:
    requests:
      - name: nic
        exactly:
          deviceClassName: $DRIVER
          count: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: nic-user
spec:
  resourceClaims:
    - name: nic
      resourceClaimName: nic
  containers:
    - name: app
      image: $BUSYBOX
      command: [sleep, "3600"]
      resources:
        claims:
          - name: nic
EOF
}

if [[ "${1:-}" == --manifests ]]; then
  webhook_probe_manifest; echo ---; gate_job_manifest; echo ---; dra_manifests
  exit 0
fi

if [[ "${1:-}" == --helm-args || "${1:-}" == --helm-args-dra ]]; then
  SCHEDULER_TAG=${SCHEDULER_TAG:?set SCHEDULER_TAG to the Kubernetes version of the cluster, e.g. v1.34.0}
  nodefabric_values
  [[ "$1" == --helm-args ]] || dra_values
  exit 0
fi

# retry SECONDS CMD...: run CMD every 5 s until it succeeds or SECONDS pass.
retry() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 5
  done
}

for tool in docker kind kubectl make "$PYTHON"; do
  command -v "$tool" >/dev/null || fail "$tool is not on PATH"
done
# The fixture builder uses dataclass(slots=True): Python 3.10 or newer.
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || fail "the fixture builder needs Python >= 3.10; $PYTHON is $("$PYTHON" -V 2>&1) (set PYTHON=...)"
# The image is built with `docker buildx build --load`: said now, not after the cluster is up.
buildx=$(docker buildx version 2>&1) || fail "docker buildx is needed (the docker-buildx plugin): $buildx"
# A daemon that does not answer (Docker Desktop not started) lists no kind cluster: a kept one would be
# taken for gone and its host trees deleted.
daemon=$(docker info 2>&1 >/dev/null) || fail "docker cannot reach its daemon: $daemon"
HELM=${HELM:-$(command -v helm || "$PYTHON" hack/fetch_helm.py | tail -n 1)}
# kind's known issue: each node runs a kubelet and a containerd that watch files; the usual defaults
# (128 instances) run out with five nodes, and pods then fail with "too many open files".
for limit in max_user_watches:524288 max_user_instances:512; do
  have=$(cat "/proc/sys/fs/inotify/${limit%%:*}" 2>/dev/null || true)
  if [[ -n "$have" ]] && ((have < ${limit##*:})); then
    printf 'WARNING: fs.inotify.%s is %s; kind needs %s: sudo sysctl fs.inotify.%s=%s\n' \
      "${limit%%:*}" "$have" "${limit##*:}" "${limit%%:*}" "${limit##*:}" >&2
  fi
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/nodefabric-e2e.XXXXXX")
ARTIFACTS=${ARTIFACTS:-$WORK/artifacts}
[[ "$ARTIFACTS" == /* ]] || ARTIFACTS=$CALLER_DIR/$ARTIFACTS
# The host trees outlive this run when the cluster does: a kept cluster's nodes mount them. Not a
# setting: the script deletes and rebuilds this directory.
HOSTS=${TMPDIR:-/tmp}/nodefabric-e2e-$CLUSTER-hosts
# A kubeconfig of this run's own: a re-run reaches its cluster whatever the current context is.
export KUBECONFIG="$WORK/kubeconfig"
CREATED=0   # this run created the cluster (only such a cluster is ever deleted)
REUSED=0    # a cluster kept by an earlier run (KEEP_CLUSTER=1), found and reused

# Not grep -q: it stops reading at the first match, and under pipefail kind's SIGPIPE would then say "no".
cluster_exists() { kind get clusters 2>/dev/null | grep -x "$CLUSTER" >/dev/null; }

# Everything worth reading after a failure, gathered while the cluster still exists.
collect_artifacts() {
  mkdir -p "$ARTIFACTS/logs"
  cluster_exists || return 0
  kind export logs "$ARTIFACTS/kind" --name "$CLUSTER" || true
  kubectl get events -A -o wide --sort-by=.lastTimestamp >"$ARTIFACTS/events.txt" 2>&1 || true
  kubectl get pods -A -o wide >"$ARTIFACTS/pods.txt" 2>&1 || true
  kubectl get nodes -o yaml >"$ARTIFACTS/nodes.yaml" 2>&1 || true
  kubectl get devices -o yaml >"$ARTIFACTS/devices.yaml" 2>&1 || true
  kubectl get nodefeatures -A -o yaml >"$ARTIFACTS/nodefeatures.yaml" 2>&1 || true
  kubectl get placementgroups -A -o yaml >"$ARTIFACTS/placementgroups.yaml" 2>&1 || true
  kubectl get resourceslices,resourceclaims -A -o yaml >"$ARTIFACTS/dra.yaml" 2>&1 || true
  "$HELM" -n "$NS" status nodefabric >"$ARTIFACTS/helm-status.txt" 2>&1 || true
  local ns pod
  for ns in "$NS" node-feature-discovery e2e-placement e2e-gate e2e-dra; do
    kubectl -n "$ns" describe pods >"$ARTIFACTS/logs/$ns.describe.txt" 2>&1 || true
    for pod in $(kubectl -n "$ns" get pods -o name 2>/dev/null); do
      kubectl -n "$ns" logs "$pod" --all-containers --prefix >"$ARTIFACTS/logs/$ns.${pod#pod/}.log" 2>&1 || true
      kubectl -n "$ns" logs "$pod" --all-containers --prefix --previous \
        >"$ARTIFACTS/logs/$ns.${pod#pod/}.previous.log" 2>/dev/null || true
    done
  done
}

cleanup() {
  local rc=$?
  trap - EXIT
  if ((rc != 0)); then
    collect_artifacts
    printf '\nFAILED (exit %s). Artifacts: %s; work directory kept: %s\n' "$rc" "$ARTIFACTS" "$WORK" >&2
  fi
  if ((CREATED)) && [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then
    kind delete cluster --name "$CLUSTER" || true
    ((rc != 0)) || rm -rf "$HOSTS"
  elif ((CREATED || REUSED)); then
    printf '\nCluster %s kept: kind export kubeconfig --name %s; delete it with kind delete cluster --name %s\n' \
      "$CLUSTER" "$CLUSTER" "$CLUSTER"
  fi
  ((rc != 0)) || rm -rf "$WORK"
  exit "$rc"
}

trap cleanup EXIT

# Whether the cluster exists decides what is deleted: a kind that cannot list its clusters stops the run.
clusters=$(kind get clusters 2>&1) || fail "kind get clusters failed: $clusters"
if grep -x "$CLUSTER" >/dev/null <<<"$clusters"; then
  step "kind cluster $CLUSTER exists (kept by an earlier run): reusing it"
  REUSED=1
  for i in $(seq 1 "$WORKERS"); do
    [[ -d "$HOSTS/worker-$i/sys/class/infiniband" ]] \
      || fail "cluster $CLUSTER exists but its host tree $HOSTS/worker-$i is gone: kind delete cluster --name $CLUSTER"
  done
  kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"
else
  step "a generated host tree per worker (fixture builder, gpu8 layout)"
  rm -rf "$HOSTS"
  mkdir -p "$HOSTS"
  for i in $(seq 1 "$WORKERS"); do
    # The builder makes every file readable by all, whatever the umask (the agent is not their owner).
    PYTHONPATH=devicemanager "$PYTHON" hack/kind_e2e.py host "$HOSTS/worker-$i"
  done
  chmod a+rx "$HOSTS"
  ls "$HOSTS/worker-1/sys/class/infiniband"

  step "kind cluster $CLUSTER (1 control plane, $WORKERS workers, each with its host tree at $HOST_ROOT)"
  {
    printf 'kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes:\n  - role: control-plane\n'
    for i in $(seq 1 "$WORKERS"); do
      printf '  - role: worker\n    extraMounts:\n      - hostPath: %s\n        containerPath: %s\n        readOnly: true\n' \
        "$HOSTS/worker-$i" "$HOST_ROOT"
    done
  } >"$WORK/kind.yaml"
  CREATED=1
  kind create cluster --name "$CLUSTER" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 120s --config "$WORK/kind.yaml"
fi
kubectl version
# DRA's resource.k8s.io/v1 is served from 1.34 (a kept cluster or KIND_NODE_IMAGE may be older).
KUBE_VERSION=$(kubectl version -o json | "$PYTHON" -c \
  'import json, re, sys; print(re.match(r"v\d+\.\d+\.\d+", json.load(sys.stdin)["serverVersion"]["gitVersion"]).group())')
IFS=. read -r server_major server_minor _ <<<"${KUBE_VERSION#v}"
((server_major > 1 || (server_major == 1 && server_minor >= 34))) \
  || fail "the cluster runs Kubernetes $KUBE_VERSION; the DRA step needs >= 1.34 (KIND_NODE_IMAGE, or delete a kept cluster)"

# The agent tolerates GPU taints only, so it runs on the workers, not on the tainted control plane.
mapfile -t NODES < <(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | sort)
((${#NODES[@]} == WORKERS)) || fail "expected $WORKERS worker nodes, got ${NODES[*]}"
# Two zones of two nodes: the extender has a location level to place the group in.
for idx in "${!NODES[@]}"; do
  kubectl label node "${NODES[$idx]}" "topology.kubernetes.io/zone=zone-$((idx / 2))" --overwrite
done

step "the fixture's verbs device nodes on every worker"
# A device-plugin grant and a CDI spec name /dev/infiniband/uverbsN and rdma_cm; the container runtime
# stats each one on the node. Character devices with the fixture's numbers stand in for the kernel's.
mapfile -t DEVNODES < <("$PYTHON" hack/kind_e2e.py devnodes "$HOSTS/worker-1")
((${#DEVNODES[@]} > 0)) || fail "the fixture host $HOSTS/worker-1 has no device nodes"
for node in "${NODES[@]}"; do
  for entry in "${DEVNODES[@]}"; do
    read -r name major minor <<<"$entry"
    docker exec "$node" sh -c "mkdir -p /dev/infiniband && { [ -c /dev/infiniband/$name ] || mknod -m 666 /dev/infiniband/$name c $major $minor; }"
  done
done

step "image $IMAGE"
# --load: a buildx builder other than the default one keeps its result in its own cache, not in Docker.
make image IMAGE="$IMAGE" DOCKER_BUILD="docker buildx build --load"
# `kind load docker-image` fails with "content digest ... not found" where Docker uses the containerd
# image store (the default of recent Docker; kind issue #3795): then a single-platform archive is loaded.
if ! kind load docker-image "$IMAGE" --name "$CLUSTER"; then
  echo "kind load docker-image failed: loading a single-platform archive (docker save | kind load image-archive)"
  platform=$(docker image inspect -f '{{.Os}}/{{.Architecture}}' "$IMAGE")
  docker image save --platform "$platform" -o "$WORK/image.tar" "$IMAGE" \
    || docker image save -o "$WORK/image.tar" "$IMAGE"
  kind load image-archive "$WORK/image.tar" --name "$CLUSTER"
fi

# unstick RELEASE NAMESPACE: an earlier run stopped during an install (Ctrl-C under --wait) leaves the
# release pending, and every `helm upgrade --install` after it fails ("another operation is in
# progress"): such a release is removed first.
unstick() {
  if "$HELM" -n "$2" list --pending -q 2>/dev/null | grep -x "$1" >/dev/null; then
    echo "the $1 release is pending (an interrupted run): uninstalling it before the install"
    "$HELM" -n "$2" uninstall "$1" --wait --timeout 5m
  fi
}

step "Node Feature Discovery $NFD_VERSION"
unstick nfd node-feature-discovery
"$HELM" upgrade --install nfd oci://registry.k8s.io/nfd/charts/node-feature-discovery --version "$NFD_VERSION" \
  --namespace node-feature-discovery --create-namespace \
  --set "master.config.extraLabelNs={feature.$DOMAIN}" --wait --timeout 5m

step "nodefabric chart (device plugin; placement and its webhook, the chart's default; the extender)"
# The second scheduler runs the cluster's own kube-scheduler version (the chart never guesses it).
SCHEDULER_TAG=$KUBE_VERSION
mapfile -d '' -t VALUES < <(nodefabric_values)
unstick nodefabric "$NS"
"$HELM" upgrade --install nodefabric charts/nodefabric --namespace "$NS" --create-namespace \
  "${VALUES[@]}" --wait --timeout 5m
if ((REUSED)); then
  # Same image tag as the last run, rebuilt: restart the pods so they run what was just loaded.
  for workload in $(kubectl -n "$NS" get daemonsets,deployments -l app.kubernetes.io/instance=nodefabric -o name); do
    kubectl -n "$NS" rollout restart "$workload"
    kubectl -n "$NS" rollout status "$workload" --timeout 5m
  done
fi
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
    | grep -x "$node" >/dev/null || fail "no NodeFeature for $node"
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
  retry 60 label_is "$node" rdma.numa 0_1 || fail "feature.$DOMAIN/rdma.numa on $node is not 0_1"
  # nfd-master, not the operator, put them there: it lists the labels it manages on the Node.
  kubectl get node "$node" -o jsonpath='{.metadata.annotations.nfd\.node\.kubernetes\.io/feature-labels}' \
    | grep "feature.$DOMAIN/rdma.capable" >/dev/null || fail "rdma.capable on $node was not set by NFD"
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
  # Each family registers with kubelet on its own: every one gets the same time to show up.
  retry 60 allocatable_is "$node" rdma "$endpoints" \
    || fail "device.$DOMAIN/rdma on $node is '$(allocatable "$node" rdma)', not $endpoints"
  retry 60 allocatable_is "$node" rdma.shared "$((endpoints * 64))" \
    || fail "device.$DOMAIN/rdma.shared on $node is '$(allocatable "$node" rdma.shared)', not $((endpoints * 64))"
  retry 60 allocatable_is "$node" rdma.partitioned 0 \
    || fail "device.$DOMAIN/rdma.partitioned on $node is '$(allocatable "$node" rdma.partitioned)', not 0"
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
# A re-run on a kept cluster starts from an empty namespace: the last run's group is already placed.
kubectl delete namespace e2e-placement --ignore-not-found --wait=true --timeout=120s
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
"$PYTHON" hack/kind_e2e.py placement "$WORK/pods.json" "$WORK/nodes.json" --domain "$DOMAIN" --size "$GROUP_SIZE" \
  || fail "the group is not where the extender said"
kubectl -n e2e-placement get pod worker-0 -o jsonpath="{.metadata.annotations.placement\.${DOMAIN//./\\.}/decision}"
echo

step "an $GROUP_SIZE-pod indexed Job admitted whole through the gate, bound by the stock kube-scheduler"
kubectl delete namespace "$GATE_NS" --ignore-not-found --wait=true --timeout=120s
kubectl create namespace "$GATE_NS"
kubectl label namespace "$GATE_NS" "placement.$DOMAIN/admission=enabled"
# The webhook's failure policy is Ignore: a pod created before it answers is not gated. A server-side
# dry run shows whether it gates now (it has no side effects).
webhook_gates() {
  webhook_probe_manifest \
    | kubectl -n "$GATE_NS" create --dry-run=server -o jsonpath='{.spec.schedulingGates[*].name}' -f - \
    | grep -w "placement.$DOMAIN/group" >/dev/null
}
retry 120 webhook_gates || fail "the placement webhook does not gate pods in $GATE_NS"
gate_job_manifest | kubectl -n "$GATE_NS" apply -f -
retry 120 kubectl -n "$GATE_NS" get placementgroup "$GROUP" -o name || fail "no PlacementGroup $GROUP"
kubectl -n "$GATE_NS" wait --for=condition=Admitted "placementgroup/$GROUP" --timeout=180s \
  || fail "PlacementGroup $GROUP was not admitted: $(kubectl -n "$GATE_NS" get placementgroup "$GROUP" -o jsonpath='{.status.decision}')"
kubectl -n "$GATE_NS" wait --for=condition=AllBound "placementgroup/$GROUP" --timeout=300s \
  || fail "PlacementGroup $GROUP is not AllBound"
kubectl get placementgroups -A
kubectl -n "$GATE_NS" get pods -o wide
kubectl -n "$GATE_NS" get placementgroup "$GROUP" -o json >"$WORK/group.json"
kubectl -n "$GATE_NS" get pods -o json >"$WORK/gate-pods.json"
kubectl get nodes -o json >"$WORK/nodes.json"
"$PYTHON" hack/kind_e2e.py gate "$WORK/group.json" "$WORK/gate-pods.json" "$WORK/nodes.json" --domain "$DOMAIN" \
  --size "$GROUP_SIZE" || fail "the group is not where its PlacementGroup assigned it"
echo "decision: $(kubectl -n "$GATE_NS" get placementgroup "$GROUP" -o jsonpath='{.status.decision}')"
# The Job holds endpoints the DRA driver is about to offer as its own: it goes before the upgrade.
kubectl delete namespace "$GATE_NS" --wait=true --timeout=180s

step "DRA: helm upgrade with dra.enabled and dra.devicePlugin; the pools of $DRIVER"
mapfile -d '' -t DRA_VALUES < <(nodefabric_values; dra_values)
"$HELM" upgrade nodefabric charts/nodefabric --namespace "$NS" "${DRA_VALUES[@]}" --wait --timeout 5m
kubectl get deviceclass "$DRIVER" "pf.$DRIVER" "vf.$DRIVER"
# pool_holds NODE COUNT: the driver publishes COUNT devices in NODE's pool.
pool_holds() {
  kubectl get resourceslices -o json >"$WORK/slices.json" \
    && "$PYTHON" hack/kind_e2e.py slices "$WORK/slices.json" --driver "$DRIVER" --node "$1" --count "$2"
}
for node in "${NODES[@]}"; do
  endpoints=$(kubectl get devices "$node" -o jsonpath='{.status.rdmaEndpoints}')
  retry 120 pool_holds "$node" "$endpoints" || fail "the pool of $node does not hold its $endpoints endpoints"
done
kubectl get resourceslices -o wide

step "DRA: a ResourceClaim of the DeviceClass $DRIVER, prepared for its pod"
kubectl delete namespace "$DRA_NS" --ignore-not-found --wait=true --timeout=120s
kubectl create namespace "$DRA_NS"
dra_manifests | kubectl -n "$DRA_NS" apply -f -
kubectl -n "$DRA_NS" wait --for=condition=Ready pod/nic-user --timeout=180s || fail "the claim's pod is not Ready"
kubectl -n "$DRA_NS" get resourceclaim nic -o json >"$WORK/claim.json"
kubectl -n "$DRA_NS" get pod nic-user -o json >"$WORK/dra-pod.json"
kubectl get resourceslices -o json >"$WORK/slices.json"
hca=$(kubectl -n "$DRA_NS" exec nic-user -- printenv NCCL_IB_HCA) || fail "the container has no NCCL_IB_HCA"
dev=$(kubectl -n "$DRA_NS" exec nic-user -- ls /dev/infiniband) || fail "the container has no /dev/infiniband"
"$PYTHON" hack/kind_e2e.py dra "$WORK/claim.json" "$WORK/dra-pod.json" "$WORK/slices.json" --driver "$DRIVER" \
  --hca "$hca" --dev "$dev" || fail "the claim is not what its container sees"
kubectl -n "$DRA_NS" get resourceclaims -o wide

step "PASS"
