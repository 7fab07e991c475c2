{{/* DRA needs resource.k8s.io/v1 (Kubernetes >= 1.34): refuse to render it for an older cluster. And the
driver name rdma.<domain> is at most 63 characters (ResourceSlice validation; the agent refuses a longer
one at start, on every node). */}}
{{- define "nodefabric.draCheck" -}}
{{- if semverCompare "<1.34.0-0" .Capabilities.KubeVersion.Version -}}
{{- fail (printf "dra.enabled needs Kubernetes >= 1.34 (resource.k8s.io/v1); this cluster is %s (under helm template, the version given by --kube-version, else helm's own default)" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if gt (len .Values.domain) 58 -}}
{{- fail (printf "dra.enabled needs a domain of at most 58 characters: the driver name rdma.%s has %d, and Kubernetes allows 63" .Values.domain (add 5 (len .Values.domain))) -}}
{{- end -}}
{{- end -}}
