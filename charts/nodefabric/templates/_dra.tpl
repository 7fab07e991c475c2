{{/* DRA needs resource.k8s.io/v1 (Kubernetes >= 1.34): refuse to render it for an older cluster. */}}
{{- define "nodefabric.draCheck" -}}
{{- if semverCompare "<1.34.0-0" .Capabilities.KubeVersion.Version -}}
{{- fail (printf "dra.enabled needs Kubernetes >= 1.34 (resource.k8s.io/v1); this cluster is %s" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}
