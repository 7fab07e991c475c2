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

{{- define "nodefabric.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
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
