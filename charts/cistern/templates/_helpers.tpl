{{/* Labels on every object: what kustomize's base adds (part-of), and Helm's own. */}}
{{- define "cistern.labels" -}}
app.kubernetes.io/part-of: cistern
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* An image of Cistern's: cistern.image (list $ "node") */}}
{{- define "cistern.image" -}}
{{- $root := index . 0 -}}
{{- $repo := index $root.Values.image (index . 1) -}}
{{- $tag := $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{- if $root.Values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $root.Values.image.registry) (base $repo) $tag -}}
{{- else -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}
{{- end }}

{{/* The node plugins' pods: the default DaemonSet's and each labelled profile's. */}}
{{- define "cistern.nodePods" -}}
{{- if .Values.pools.labelledProfiles -}}
matchExpressions:
- key: app.kubernetes.io/name
  operator: In
  values:
  - cistern-node
  {{- range .Values.pools.labelledProfiles }}
  - cistern-node-{{ . }}
  {{- end }}
{{- else -}}
matchLabels:
  app.kubernetes.io/name: cistern-node
{{- end -}}
{{- end }}

{{/* The sidecars: root (the driver's socket is root's, mode 0755) without capabilities. */}}
{{- define "cistern.sidecarSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end }}
