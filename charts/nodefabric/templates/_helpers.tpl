{{/* Chart name, possibly overridden. */}}
{{- define "nodefabric.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object-name prefix; the longest suffix added to it is 22 characters ("-scheduler-auth-reader"), so trim to 40. */}}
{{- define "nodefabric.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "nodefabric.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels for every object; call with (dict "ctx" $ "component" "agent"). */}}
{{- define "nodefabric.labels" -}}
helm.sh/chart: {{ include "nodefabric.chart" .ctx }}
{{ include "nodefabric.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: nodefabric
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "nodefabric.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nodefabric.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Name of one component's objects (and its ServiceAccount). */}}
{{- define "nodefabric.component" -}}
{{- printf "%s-%s" (include "nodefabric.fullname" .ctx) .component -}}
{{- end -}}

{{/* registry/repository, then @digest when one is set (the tag is then only documentation), else :tag. */}}
{{- define "nodefabric.image" -}}
{{- $i := .Values.image -}}
{{- $repo := ternary (printf "%s/%s" $i.registry $i.repository) $i.repository (ne $i.registry "") -}}
{{- if $i.digest -}}
{{- printf "%s@%s" $repo $i.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion $i.tag) -}}
{{- end -}}
{{- end -}}

{{/* The cluster's own vMAJOR.MINOR.PATCH (provider suffixes such as -eks-1a2b dropped): no version skew. */}}
{{- define "nodefabric.schedulerImage" -}}
{{- $tag := .Values.scheduler.image.tag -}}
{{- if not $tag -}}
{{- $tag = regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- printf "%s:%s" .Values.scheduler.image.repository $tag -}}
{{- end -}}

{{/* Hardened container security context for the components that need no host access. */}}
{{- define "nodefabric.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Placement fields shared by every pod template; call with the component's values. */}}
{{- define "nodefabric.podPlacement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{- define "nodefabric.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The extender's configuration file (operator/nodefabric_operator/extender/config.py reads it);
empty level lists take the defaults, which follow the domain. */}}
{{- define "nodefabric.extenderConfig" -}}
{{- $d := .Values.domain -}}
{{- $e := .Values.extender -}}
{{- $levels := list
  (dict "name" "fabric" "title" "fabric domain" "keys" (default (list (printf "feature.%s/fabric.domain" $d) "nvidia.com/gpu.clique") $e.levels.fabric))
  (dict "name" "network-group" "title" "network group" "keys" (default (list (printf "topology.%s/network-group" $d) "network.topology.nvidia.com/leaf" "cloud.google.com/gce-topology-subblock" "topology.k8s.aws/network-node-layer-3") $e.levels.networkGroup))
  (dict "name" "zone" "keys" (default (list "topology.kubernetes.io/zone") $e.levels.zone))
  (dict "name" "region" "keys" (default (list "topology.kubernetes.io/region") $e.levels.region))
-}}
{{- $cfg := dict "domain" $d "levels" $levels "defaultLocality" $e.defaults.locality "defaultRank" $e.defaults.rank "homogeneousKeys" $e.defaults.homogeneous "homogeneousByResource" $e.defaults.homogeneousByResource "maxGroups" $e.maxGroups -}}
{{- toYaml (merge $cfg $e.extraConfig) -}}
{{- end -}}

{{/* The extender's annotations on a pod: the only change the scheduler's account may make to one. */}}
{{- define "nodefabric.extenderAnnotations" -}}
{{- printf "['placement.%s/decision', 'placement.%s/claim']" .Values.domain .Values.domain -}}
{{- end -}}

{{/* The second scheduler's configuration: the stock kube-scheduler with one profile that calls the
extender, its sidecar, on 127.0.0.1: no Service, no port another pod can reach. */}}
{{- define "nodefabric.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
# Always on, even with one replica: a rolling update briefly runs two schedulers. Only the leader
# schedules, so only its own sidecar is asked; the others' sidecars follow its claims through the API.
leaderElection:
  leaderElect: true
  resourceLock: leases
  resourceName: {{ include "nodefabric.component" (dict "ctx" . "component" "scheduler") }}
  resourceNamespace: {{ .Release.Namespace }}
profiles:
  - schedulerName: {{ .Values.scheduler.name }}
    # The extender judges a group's locality over every feasible node: sampling would hide the
    # zone that holds the whole group.
    percentageOfNodesToScore: 100
extenders:
  - urlPrefix: http://127.0.0.1:{{ .Values.extender.port }}
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: {{ .Values.extender.weight }}
    httpTimeout: {{ .Values.extender.httpTimeout }}
    enableHTTPS: false
    # Node names only in each request; the extender keeps its own node cache from a watch.
    nodeCacheCapable: true
    # A pod that asked for this scheduler asked for group locality: while the extender is down its
    # pods stay Pending and are retried, rather than being placed without it. Other pods are unaffected.
    ignorable: false
{{- end -}}


{{/* The extender container of the scheduler pod: filter and prioritize on 127.0.0.1 only; probes and
metrics on the pod network. */}}
{{- define "nodefabric.extenderContainer" -}}
{{- $e := .Values.extender -}}
- name: extender
  image: {{ include "nodefabric.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - extender
    - --config
    - /etc/nodefabric/extender.yaml
    - --address
    - 127.0.0.1
    - --port
    - {{ $e.port | quote }}
    - --metrics-port
    - {{ $e.metricsPort | quote }}
    - --unhealthy-after
    - {{ $e.unhealthyAfter | quote }}
  ports:
    - name: extender-metrics
      containerPort: {{ $e.metricsPort }}
      protocol: TCP
  # Alive while its node and pod watches work (a watch broken longer than unhealthyAfter restarts it);
  # ready once its caches are synced.
  livenessProbe:
    httpGet:
      path: /healthz
      port: extender-metrics
    initialDelaySeconds: 5
    periodSeconds: 20
  readinessProbe:
    httpGet:
      path: /readyz
      port: extender-metrics
    periodSeconds: 5
  securityContext:
    {{- include "nodefabric.restrictedContainer" . | nindent 4 }}
  resources:
    {{- toYaml $e.resources | nindent 4 }}
  volumeMounts:
    - name: extender-config
      mountPath: /etc/nodefabric
      readOnly: true
    - name: extender-tmp
      mountPath: /tmp
{{- end -}}

{{/*
Per-component knobs. Each takes (dict "ctx" $ "component" "agent" "values" .Values.agent), the same dict
"nodefabric.labels" takes plus the component's values block, so wiring one more pod is a few includes:

  serviceAccount: {create, name, annotations}   podLabels, podAnnotations   securityContext,
  containerSecurityContext   extraEnv, extraVolumes, extraVolumeMounts   resources   nodeSelector,
  affinity, tolerations, priorityClassName   logLevel, logFormat
*/}}

{{/* The account a component's pods run as. With create=false the account must exist and be named: falling
back to the namespace's "default" account would hand the component's cluster role to every pod there. */}}
{{- define "nodefabric.serviceAccountName" -}}
{{- $sa := .values.serviceAccount -}}
{{- if $sa.create -}}
{{- default (include "nodefabric.component" .) $sa.name -}}
{{- else if $sa.name -}}
{{- $sa.name -}}
{{- else -}}
{{- fail (printf "%s.serviceAccount.create=false needs %s.serviceAccount.name: the existing ServiceAccount its pods run as" .component .component) -}}
{{- end -}}
{{- end -}}

{{/* The component's ServiceAccount object, when the chart creates it. */}}
{{- define "nodefabric.serviceAccount" -}}
{{- if .values.serviceAccount.create }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "nodefabric.serviceAccountName" . }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "nodefabric.labels" . | nindent 4 }}
  {{- with .values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* The RBAC subject naming the component's ServiceAccount. */}}
{{- define "nodefabric.serviceAccountSubject" -}}
- kind: ServiceAccount
  name: {{ include "nodefabric.serviceAccountName" . }}
  namespace: {{ .ctx.Release.Namespace }}
{{- end -}}

{{/* Pod template metadata: the chart's labels plus podLabels (which may not touch the selector labels:
a pod template the selector does not match is refused), and podAnnotations plus the component's own
(pass "annotations" in the dict, e.g. a config checksum; those win). */}}
{{- define "nodefabric.podMetadata" -}}
{{- $labels := include "nodefabric.labels" . | fromYaml -}}
{{- $selector := include "nodefabric.selectorLabels" . | fromYaml -}}
{{- range $key, $_ := .values.podLabels -}}
{{- if hasKey $selector $key -}}
{{- fail (printf "%s.podLabels may not set %s: the chart's selector uses it" $.component $key) -}}
{{- end -}}
{{- end -}}
{{- $annotations := mergeOverwrite (deepCopy (.values.podAnnotations | default dict)) (.annotations | default dict) -}}
labels:
  {{- toYaml (mergeOverwrite $labels (.values.podLabels | default dict)) | nindent 2 }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod-level fields every component shares: account, pull secrets, placement, pod security context. */}}
{{- define "nodefabric.podSpec" -}}
serviceAccountName: {{ include "nodefabric.serviceAccountName" . }}
{{- with include "nodefabric.imagePullSecrets" .ctx | trim }}
{{ . }}
{{- end }}
{{- with include "nodefabric.podPlacement" .values | trim }}
{{ . }}
{{- end }}
{{- with .values.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The container's security context. privileged with allowPrivilegeEscalation=false is a contradiction the
API server refuses at apply time; say so at render time, naming the values. */}}
{{- define "nodefabric.containerSecurityContext" -}}
{{- $sc := .values.containerSecurityContext | default dict -}}
{{- if and $sc.privileged (eq (toString (dig "allowPrivilegeEscalation" "" $sc)) "false") -}}
{{- fail (printf "%s.containerSecurityContext: privileged=true needs allowPrivilegeEscalation=true (or unset); Kubernetes refuses the pair" .component) -}}
{{- end -}}
{{- with $sc -}}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* Global flags of the `nodefabric` command, before its subcommand. */}}
{{- define "nodefabric.logArgs" -}}
- --log-level
- {{ .values.logLevel | upper }}
- --log-format
- {{ .values.logFormat }}
{{- end -}}

{{/* Fail on a name used twice in a list of objects (volumes by name, mounts by mountPath): Kubernetes refuses
the pod, and an extra volume named like one of the chart's would otherwise replace a host mount silently.
Call with (dict "what" "agent.extraVolumes" "key" "name" "items" $list). */}}
{{- define "nodefabric.assertUnique" -}}
{{- $seen := dict -}}
{{- range .items -}}
{{- $k := toString (get . $.key) -}}
{{- if hasKey $seen $k -}}
{{- fail (printf "%s: %s %q is used twice (the chart's own volumes and mounts count)" $.what $.key $k) -}}
{{- end -}}
{{- $_ := set $seen $k true -}}
{{- end -}}
{{- end -}}

{{/* Annotations of the CRD upgrade hook's objects; call with the hook weight as a string. */}}
{{- define "nodefabric.crdHook" -}}
helm.sh/hook: pre-install,pre-upgrade
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}

{{/* Fail on a mount of a volume the pod does not have; call with (dict "what" "agent.extraVolumeMounts"
"volumes" $allVolumes "mounts" $extraMounts). Kubernetes would refuse the pod at apply time. */}}
{{- define "nodefabric.assertMountable" -}}
{{- $names := dict -}}
{{- range .volumes }}{{ $_ := set $names (toString .name) true }}{{ end -}}
{{- range .mounts -}}
{{- if not (hasKey $names (toString .name)) -}}
{{- fail (printf "%s: no volume named %q (the chart's volumes and extraVolumes count)" $.what (toString .name)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Fail on two ports of one container that are the same number; call with (dict "what" "agent" "ports"
(list metricsPort healthPort)). */}}
{{- define "nodefabric.assertPorts" -}}
{{- if ne (len .ports) (len (uniq .ports)) -}}
{{- fail (printf "%s.metricsPort and %s.healthPort must differ: both are %v" .what .what (index .ports 0)) -}}
{{- end -}}
{{- end -}}
