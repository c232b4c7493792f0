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

{{/* A node plugin pod's labels: every profile's pods are cistern-node (the peer NetworkPolicy
selects them all), the profile label tells the DaemonSets' pods apart. */}}
{{- define "cistern.nodePodLabels" -}}
app.kubernetes.io/name: cistern-node
{{- if ne . "default" }}
cistern.csi.dev/pools-profile: {{ . }}
{{- end }}
{{- end }}

{{/* The sidecars: root (the driver's socket is root's, mode 0755) without capabilities. */}}
{{- define "cistern.sidecarSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end }}
