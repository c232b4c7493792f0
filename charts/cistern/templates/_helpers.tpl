{{/* Labels on every object: what kustomize's base adds (part-of), and Helm's own. */}}
{{- define "cistern.labels" -}}
app.kubernetes.io/part-of: cistern
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* An image of Cistern's: cistern.image (list $ "node"). image.registry is required: the
chart names no default, so that no install pulls Cistern's images from a registry the project
does not control (cistern/node alone would be Docker Hub's). */}}
{{- define "cistern.image" -}}
{{- $root := index . 0 -}}
{{- $registry := required "image.registry is required: the registry holding Cistern's images, as `make push REGISTRY=...` pushed them (e.g. --set image.registry=registry.example.com/storage)" $root.Values.image.registry -}}
{{- $tag := $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) (index $root.Values.image (index . 1)) $tag -}}
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

{{/* What every pod of the chart has: its annotations (podAnnotations) and the registries' pull
secrets (imagePullSecrets), indented for a pod template's metadata and spec. */}}
{{- define "cistern.podAnnotations" -}}
{{- with .Values.podAnnotations -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "cistern.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The extra variables of every container (env: a proxy's HTTP_PROXY, HTTPS_PROXY, NO_PROXY),
after the container's own: cistern.env for a container with variables, cistern.envList for one
without. */}}
{{- define "cistern.env" -}}
{{- with .Values.env -}}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "cistern.envList" -}}
{{- with .Values.env -}}
env:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
