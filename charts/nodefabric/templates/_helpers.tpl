{{/* Chart name, possibly overridden. */}}
{{- define "nodefabric.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object-name prefix; the longest suffix added to it is 22 characters ("-scheduler-auth-reader"), so trim to 40. */}}
{{- define "nodefabric.fullname" -}}
{{- $full := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $full = .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- $full = .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $full = printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- /* Services are named after it, and a Service's name is a DNS-1035 label: helm takes a release name
that starts with a digit or holds a dot, and the API server would then refuse them mid-install. */ -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $full) -}}
{{- fail (printf "the names of this release's objects start with %q, and its Services' names must be DNS-1035 labels (a lowercase letter first, then lowercase letters, digits or '-', no dots), which the API server would refuse otherwise: choose another release name, or set fullnameOverride to one" $full) -}}
{{- end -}}
{{- $full -}}
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
app.kubernetes.io/name: {{ include "nodefabric.name" .ctx | quote }}
app.kubernetes.io/instance: {{ .ctx.Release.Name | quote }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Name of one component's objects (and its ServiceAccount). */}}
{{- define "nodefabric.component" -}}
{{- printf "%s-%s" (include "nodefabric.fullname" .ctx) .component -}}
{{- end -}}

{{/* The nodefabric image: registry/repository, then @digest when one is set (the tag is then only
documentation), else :tag (default appVersion). */}}
{{- define "nodefabric.image" -}}
{{- $i := .Values.image -}}
{{- /* A first component with a dot or a port, or "localhost", is a registry host (Docker's own rule). Chart
0.1.0's image.repository was the whole reference: under a registry it would silently become
<registry>/<host>/..., so it is refused, saying both ways to write it. */ -}}
{{- $first := first (splitList "/" $i.repository) -}}
{{- if and $i.registry (gt (len (splitList "/" $i.repository)) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- fail (printf "image.repository %q starts with a registry host (%s), and image.registry is %q: the image would be %s/%s. The registry is a value of its own now (the first chart took the whole reference in image.repository): set image.registry=%s image.repository=%s, or image.registry=\"\" to give the whole reference in image.repository" $i.repository $first $i.registry $i.registry $i.repository $first (join "/" (rest (splitList "/" $i.repository)))) -}}
{{- end -}}
{{- $repo := ternary (printf "%s/%s" $i.registry $i.repository) $i.repository (ne $i.registry "") -}}
{{- include "nodefabric.imageRef" (dict "repository" $repo "tag" (default .Chart.AppVersion $i.tag) "digest" $i.digest) -}}
{{- end -}}

{{/* repository@digest when a digest is set, else repository:tag; call with (dict "repository" "tag" "digest"). */}}
{{- define "nodefabric.imageRef" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
{{- end -}}

{{/* The kube-scheduler image. Its version must be the API server's (or one minor older), and nothing the
chart can see says which that is: .Capabilities.KubeVersion is helm's own built-in default under
`helm template` without --kube-version (and even with --dry-run=server), so deriving the tag from it would
silently pick a version in exactly the GitOps renders that must not. The tag (or a digest) is a value. */}}
{{- define "nodefabric.schedulerImage" -}}
{{- $i := .Values.scheduler.image -}}
{{- if not (or $i.tag $i.digest) -}}
{{- fail "scheduler.image.tag is empty: set it to your cluster's Kubernetes version (the Server Version of `kubectl version`, e.g. --set scheduler.image.tag=v1.33.4; kube-scheduler may be one minor older than the API server, never newer), or pin scheduler.image.digest. Or set extender.enabled=false to run no second scheduler." -}}
{{- end -}}
{{- include "nodefabric.imageRef" (dict "repository" $i.repository "tag" $i.tag "digest" $i.digest) -}}
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
priorityClassName: {{ . | quote }}
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
{{- /* homogeneousByResource is a list by default so that a user's value replaces it whole (helm merges
maps key by key: a map default could not be cleared with {}); a map, {}, [] or null are taken too, and the
file always carries the key (an absent key would give the extender its own built-in default). */ -}}
{{- $hbr := dict -}}
{{- $given := $e.defaults.homogeneousByResource -}}
{{- if kindIs "slice" $given -}}
{{- range $given -}}
{{- if hasKey $hbr .resource -}}
{{- fail (printf "extender.defaults.homogeneousByResource names %s twice" .resource) -}}
{{- end -}}
{{- $_ := set $hbr .resource .keys -}}
{{- end -}}
{{- else if kindIs "map" $given -}}
{{- $hbr = $given -}}
{{- end -}}
{{- $cfg := dict "domain" $d "levels" $levels "defaultLocality" $e.defaults.locality "defaultRank" $e.defaults.rank "homogeneousKeys" $e.defaults.homogeneous "homogeneousByResource" $hbr "maxGroups" $e.maxGroups "groupReadyTimeoutSeconds" .Values.placement.groupReadyTimeoutSeconds -}}
{{- /* A setting written from a value of the chart's own is refused in extraConfig, naming that value: it
would otherwise be dropped without a word. */ -}}
{{- $from := dict "domain" "domain" "levels" "extender.levels" "defaultLocality" "extender.defaults.locality" "defaultRank" "extender.defaults.rank" "homogeneousKeys" "extender.defaults.homogeneous" "homogeneousByResource" "extender.defaults.homogeneousByResource" "maxGroups" "extender.maxGroups" "groupReadyTimeoutSeconds" "placement.groupReadyTimeoutSeconds" -}}
{{- range $key, $_ := $e.extraConfig -}}
{{- if hasKey $from $key -}}
{{- fail (printf "extender.extraConfig.%s is written from %s: set that instead" $key (get $from $key)) -}}
{{- end -}}
{{- end -}}
{{- toYaml (merge $cfg $e.extraConfig) -}}
{{- end -}}

{{/* The extender's annotation on a pod (a copy of its verdict for `kubectl describe pod`): the only change
the scheduler's account may make to one. It writes no claim any more, and reads none back. */}}
{{- define "nodefabric.extenderAnnotations" -}}
{{- printf "['placement.%s/decision']" .Values.domain -}}
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
  resourceNamespace: {{ .Release.Namespace | quote }}
# The profile: scheduler.profile's fields (plugins, ...) over the chart's, under the chart's own name;
# scheduler.pluginConfig as given. The extender judges a group's locality over every feasible node, so
# percentageOfNodesToScore is 100 unless the profile says otherwise: sampling would hide the zone that
# holds the whole group.
{{- $profile := merge (dict "schedulerName" .Values.scheduler.name) (deepCopy .Values.scheduler.profile) (dict "percentageOfNodesToScore" 100) }}
{{- with .Values.scheduler.pluginConfig }}
{{- if $.Values.scheduler.profile.pluginConfig }}
{{- fail "scheduler.profile.pluginConfig and scheduler.pluginConfig are both set: the second would replace the first whole; give the list once, in scheduler.pluginConfig" }}
{{- end }}
{{- $_ := set $profile "pluginConfig" . }}
{{- end }}
profiles:
  - {{- toYaml $profile | nindent 4 }}
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
metrics on the pod network. Call with (dict "ctx" $ "component" "extender" "values" .Values.extender): the
container-level knobs (containerSecurityContext, extraEnv, extraVolumeMounts, resources, logLevel,
logFormat) are the extender's; the pod-level ones are the scheduler's. */}}
{{- define "nodefabric.extenderContainer" -}}
{{- $e := .values -}}
- name: extender
  image: {{ include "nodefabric.image" .ctx }}
  imagePullPolicy: {{ .ctx.Values.image.pullPolicy }}
  args:
    {{- include "nodefabric.logArgs" . | nindent 4 }}
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
    {{- include "nodefabric.extraArgs" (dict "what" "extender.extraArgs" "args" $e.extraArgs) | nindent 4 }}
  {{- with $e.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: ext-metrics
      containerPort: {{ $e.metricsPort }}
      protocol: TCP
  # Alive while its node and pod watches work (a watch broken longer than unhealthyAfter restarts it);
  # ready once its caches are synced.
  livenessProbe:
    httpGet:
      path: /healthz
      port: ext-metrics
    initialDelaySeconds: 5
    periodSeconds: 20
  readinessProbe:
    httpGet:
      path: /readyz
      port: ext-metrics
    periodSeconds: 5
  {{- include "nodefabric.containerSecurityContext" . | nindent 2 }}
  {{- with $e.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: extender-config
      mountPath: /etc/nodefabric
      readOnly: true
    - name: extender-tmp
      mountPath: /tmp
    # Its own account's token where the in-cluster client reads one: the extender acts as
    # <fullname>-extender, not as kube-scheduler (kubelet mounts the pod's own token only in containers
    # that mount nothing at this path).
    - name: extender-token
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
    {{- with $e.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
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
{{- if eq ($sa.name | default "") "default" -}}
{{- fail (printf "%s.serviceAccount.name may not be \"default\": every pod of the namespace that names no account runs as it, and would get the %s's rights" .component .component) -}}
{{- else if $sa.create -}}
{{- default (include "nodefabric.component" .) $sa.name -}}
{{- else if $sa.name -}}
{{- $sa.name -}}
{{- else -}}
{{- fail (printf "%s.serviceAccount.create=false needs %s.serviceAccount.name: the existing ServiceAccount its pods run as" .component .component) -}}
{{- end -}}
{{- end -}}

{{/* Fail when two components would run as one account: the rights of one (kube-scheduler's pod binding,
the extender's pod patches, an agent's Devices writes) would go to the other's pods, e.g. to every node's
agent. Counts the enabled components (the scheduler runs with the extender) and the CRD hook's own account. */}}
{{- define "nodefabric.assertDistinctAccounts" -}}
{{- $seen := dict -}}
{{- if .Values.crds.upgradeJob.enabled -}}
{{- $_ := set $seen (include "nodefabric.component" (dict "ctx" . "component" "crd-upgrade")) "the CRD upgrade hook's account" -}}
{{- end -}}
{{- range $component, $enabled := dict "agent" .Values.agent.enabled "operator" .Values.operator.enabled "scheduler" (and .Values.extender.enabled (eq .Values.extender.mode "sidecar")) "extender" .Values.extender.enabled "placement" .Values.placement.enabled -}}
{{- if $enabled -}}
{{- $name := include "nodefabric.serviceAccountName" (dict "ctx" $ "component" $component "values" (index $.Values $component)) -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "%s and %s.serviceAccount both name the ServiceAccount %q: each component needs its own, or one's rights go to the other's pods" (get $seen $name) $component $name) -}}
{{- end -}}
{{- $_ := set $seen $name (printf "%s.serviceAccount" $component) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Fail when commonLabels, serviceMonitor.labels or prometheusRule.labels set a label key the chart writes on every object: the key
would be written twice (the last one wins), moving pod templates off their selectors and Services and
ServiceMonitors off what they select. */}}
{{- define "nodefabric.assertExtraLabels" -}}
{{- $ours := include "nodefabric.labels" (dict "ctx" (dict "Chart" .Chart "Release" .Release "Values" (dict "nameOverride" .Values.nameOverride)) "component" "any") | fromYaml -}}
{{- range $what, $labels := dict "commonLabels" .Values.commonLabels "serviceMonitor.labels" .Values.serviceMonitor.labels "prometheusRule.labels" .Values.prometheusRule.labels -}}
{{- range $key, $_ := $labels -}}
{{- if hasKey $ours $key -}}
{{- fail (printf "%s may not set %s: the chart sets it on every object" $what $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The component's ServiceAccount object, when the chart creates it. */}}
{{- define "nodefabric.serviceAccount" -}}
{{- if .values.serviceAccount.create }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "nodefabric.serviceAccountName" . | quote }}
  namespace: {{ .ctx.Release.Namespace | quote }}
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
  name: {{ include "nodefabric.serviceAccountName" . | quote }}
  namespace: {{ .ctx.Release.Namespace | quote }}
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
serviceAccountName: {{ include "nodefabric.serviceAccountName" . | quote }}
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
{{- define "nodefabric.pruneHook" -}}
helm.sh/hook: post-delete
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}

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

{{/* Fail on extra volumes and mounts Kubernetes would refuse, or that would silently replace one of the
chart's: a volume name used twice in the pod, a mount path used twice in one container, a mount of a volume
the pod does not have. A null list (extraVolumes: ~) is an empty one. Call with (dict "what" "scheduler"
"volumes" (list "tmp" ...) "extraVolumes" $s.extraVolumes "containers" (list (dict "what" "scheduler"
"mounts" (list "/tmp" ...) "extraVolumeMounts" $s.extraVolumeMounts) ...)): the chart's own volume names
and, per container, its own mount paths. */}}
{{- define "nodefabric.assertExtraVolumes" -}}
{{- $volumes := list -}}
{{- range .volumes }}{{ $volumes = append $volumes (dict "name" .) }}{{ end -}}
{{- $volumes = concat $volumes (.extraVolumes | default list) -}}
{{- include "nodefabric.assertUnique" (dict "what" (printf "%s.extraVolumes" .what) "key" "name" "items" $volumes) -}}
{{- range .containers -}}
{{- $what := printf "%s.extraVolumeMounts" .what -}}
{{- $extra := .extraVolumeMounts | default list -}}
{{- $mounts := list -}}
{{- range .mounts }}{{ $mounts = append $mounts (dict "mountPath" .) }}{{ end -}}
{{- include "nodefabric.assertUnique" (dict "what" $what "key" "mountPath" "items" (concat $mounts $extra)) -}}
{{- include "nodefabric.assertMountable" (dict "what" $what "volumes" $volumes "mounts" $extra) -}}
{{- end -}}
{{- end -}}

{{/* Fail on two ports of one container that are the same number; call with (dict "what" "agent" "ports"
(list metricsPort healthPort)). */}}
{{- define "nodefabric.assertPorts" -}}
{{- if ne (len .ports) (len (uniq .ports)) -}}
{{- fail (printf "%s.metricsPort and %s.healthPort must differ: both are %v" .what .what (index .ports 0)) -}}
{{- end -}}
{{- end -}}

{{/* A Role and RoleBinding in "default" that let a component create Events there and nowhere else: Events
about a cluster-scoped object (a Devices record) live in "default", as Kubernetes records them for Nodes,
and the agent and the operator post no others. Call with (dict "ctx" $ "component" "agent" "values" ...). */}}
{{- define "nodefabric.eventsRole" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ include "nodefabric.component" . }}-events
  namespace: default
  labels:
    {{- include "nodefabric.labels" . | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: [events]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ include "nodefabric.component" . }}-events
  namespace: default
  labels:
    {{- include "nodefabric.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ include "nodefabric.component" . }}-events
subjects:
  {{- include "nodefabric.serviceAccountSubject" . | nindent 2 }}
{{- end -}}

{{/* A component's extraArgs, appended after the chart's own flags (for a flag given twice the last wins):
call with (dict "what" "agent.extraArgs" "args" $list). Each must be a string: a number or a map would
reach the command as Go's rendering of it. */}}
{{- define "nodefabric.extraArgs" -}}
{{- range $i, $a := .args }}
{{- if not (kindIs "string" $a) }}
{{- fail (printf "%s[%d]: must be a string (quote numbers: \"%v\")" $.what $i $a) }}
{{- end }}
- {{ $a | quote }}
{{- end }}
{{- end -}}

{{/* A probe: the chart's httpGet and the timings from values (call with (dict "path" "/healthz" "port"
"health" "timings" $values.livenessProbe)). */}}
{{- define "nodefabric.probe" -}}
httpGet:
  path: {{ .path }}
  port: {{ .port }}
{{- with .timings }}
{{ toYaml . }}
{{- end }}
{{- end -}}


{{/* Fail on topology levels the operator refuses at start (exit 2, so it would crash-loop after the install):
a level name used twice, a key in two levels, kubernetes.io/hostname (every projection adds it itself).
Call with (dict "what" "operator.topology.levels" "levels" (list (dict "name" "fabric" "keys" $keys) ...)). */}}
{{- define "nodefabric.assertTopologyLevels" -}}
{{- $names := dict -}}
{{- $keys := dict -}}
{{- range .levels -}}
{{- $level := .name -}}
{{- if hasKey $names $level -}}
{{- fail (printf "%s: the level name %s is used twice; the operator would refuse to start" $.what $level) -}}
{{- end -}}
{{- $_ := set $names $level true -}}
{{- range .keys -}}
{{- if eq . "kubernetes.io/hostname" -}}
{{- fail (printf "%s: level %s: kubernetes.io/hostname is added by every projection as the lowest level, not a level of its own; the operator would refuse to start" $.what $level) -}}
{{- end -}}
{{- if hasKey $keys . -}}
{{- fail (printf "%s: the label key %s is in levels %s and %s: a node would be read at two levels by one label; the operator would refuse to start" $.what . (get $keys .) $level) -}}
{{- end -}}
{{- $_ := set $keys . $level -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A resource quantity ("64Mi", "500m", "1e3", 2) as a float in base units, to compare two of them. */}}
{{- define "nodefabric.quantity" -}}
{{- $q := toString . -}}
{{- $num := regexFind "^[+]?([0-9]+([.][0-9]*)?|[.][0-9]+)" $q -}}
{{- $suffix := trimPrefix $num $q -}}
{{- if regexMatch "^[eE][-+]?[0-9]+$" $suffix -}}
{{- float64 (trimPrefix "+" $q) -}}
{{- else -}}
{{- /* Fractions divide (700m is 700/1000, as "0.7" parses; 700*0.001 would be a hair above it). */ -}}
{{- $down := dict "n" 1e9 "u" 1e6 "m" 1e3 -}}
{{- $up := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- if hasKey $down $suffix -}}
{{- divf (float64 (trimPrefix "+" $num)) (get $down $suffix) -}}
{{- else -}}
{{- mulf (float64 (trimPrefix "+" $num)) (get $up $suffix) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Fail on a request above its limit, which the API server refuses: most often a limit set lower than the
chart's default request, which merges in beside it. Call with (dict "what" "agent.resources" "resources" $r). */}}
{{- define "nodefabric.assertRequestsWithinLimits" -}}
{{- $requests := .resources.requests | default dict -}}
{{- $limits := .resources.limits | default dict -}}
{{- /* An extended resource (a domain of its own: nvidia.com/gpu) or hugepages is never overcommitted: a
request needs a limit, and the same one. */ -}}
{{- range $name, $request := $requests -}}
{{- $native := or (not (contains "/" $name)) (contains "kubernetes.io/" $name) -}}
{{- if and (not (kindIs "invalid" $request)) (or (not $native) (hasPrefix "hugepages-" $name)) -}}
{{- $limit := get $limits $name -}}
{{- if or (not (hasKey $limits $name)) (kindIs "invalid" $limit) -}}
{{- fail (printf "%s: requests.%s needs limits.%s, and the same quantity: Kubernetes never overcommits it (or give only the limit)" $.what $name $name) -}}
{{- end -}}
{{- if ne (include "nodefabric.quantity" $request) (include "nodefabric.quantity" $limit) -}}
{{- fail (printf "%s: requests.%s (%v) must equal limits.%s (%v): Kubernetes never overcommits it" $.what $name $request $name $limit) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $name, $limit := $limits -}}
{{- $request := get $requests $name -}}
{{- if and (not (kindIs "invalid" $limit)) (not (kindIs "invalid" $request)) (hasKey $requests $name) -}}
{{- /* A relative margin of 1e-12: two spellings of one quantity never differ by more than rounding. */ -}}
{{- if gt (float64 (include "nodefabric.quantity" $request)) (mulf (float64 (include "nodefabric.quantity" $limit)) 1.000000000001) -}}
{{- fail (printf "%s: requests.%s (%v) is above limits.%s (%v), which Kubernetes refuses; the chart's default request merges with a limit you set, so lower requests.%s too (or set it to null)" $.what $name $request $name $limit $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
