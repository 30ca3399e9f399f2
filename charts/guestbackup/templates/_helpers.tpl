{{/*
Names. Every object's name starts with the full name, so that two releases
in different namespaces never share a cluster-scoped object. The full name
is cut at 40 characters so that the longest Service name,
"<fullname>-controller-metrics", stays a valid DNS label (63).
*/}}
{{- define "guestbackup.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "guestbackup.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "guestbackup.controller" -}}{{ include "guestbackup.fullname" . }}-controller{{- end }}
{{- define "guestbackup.webhook" -}}{{ include "guestbackup.fullname" . }}-webhook{{- end }}
{{/* The Secret holding the webhook's serving certificate, from cert-manager or from the chart. */}}
{{- define "guestbackup.webhookTLSSecret" -}}{{ include "guestbackup.webhook" . }}-tls{{- end }}
{{/* The webhook's Certificate, whose CA cert-manager injects. */}}
{{- define "guestbackup.webhookCertificate" -}}{{ include "guestbackup.webhook" . }}{{- end }}
{{/* The ClusterRole the controller binds to the server pods of a BSLS with several replicas. */}}
{{- define "guestbackup.serverMaintenanceRole" -}}{{ include "guestbackup.fullname" . }}-server-maintenance{{- end }}
{{/* The ValidatingAdmissionPolicy (and its binding) guarding guestbackup's Secrets. */}}
{{- define "guestbackup.secretPolicy" -}}{{ include "guestbackup.fullname" . }}-managed-secrets{{- end }}
{{/* The ValidatingAdmissionPolicy (and its binding) that has the last word on a request's requester. */}}
{{- define "guestbackup.requestsPolicy" -}}{{ include "guestbackup.fullname" . }}-requester{{- end }}

{{/* Labels on every object: the chart's own, and commonLabels where they name other keys. */}}
{{- define "guestbackup.labels" -}}
{{- $own := dict
  "helm.sh/chart" (printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-")
  "app.kubernetes.io/version" .Chart.AppVersion
  "app.kubernetes.io/managed-by" .Release.Service }}
{{- $own = merge $own (include "guestbackup.selectorLabels" . | fromYaml) }}
{{- merge $own (.Values.commonLabels | default dict) | toYaml }}
{{- end }}

{{- define "guestbackup.selectorLabels" -}}
app.kubernetes.io/name: {{ include "guestbackup.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of one component: include with (list $ "controller"). */}}
{{- define "guestbackup.componentSelectorLabels" -}}
{{ include "guestbackup.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "guestbackup.componentLabels" -}}
{{- $labels := include "guestbackup.labels" (index . 0) | fromYaml }}
{{- merge (dict "app.kubernetes.io/component" (index . 1)) $labels | toYaml }}
{{- end }}

{{/*
A component's pod labels: its selector's win over podLabels, which win
over commonLabels. Include with (list $ "controller").
*/}}
{{- define "guestbackup.podLabels" -}}
{{- $root := index . 0 }}
{{- $values := index $root.Values (index . 1) }}
{{- $selector := include "guestbackup.componentSelectorLabels" . | fromYaml }}
{{- merge $selector ($values.podLabels | default dict) ($root.Values.commonLabels | default dict) | toYaml }}
{{- end }}

{{/* An image reference from {repository, tag, digest}, falling back to .Values.image and appVersion. */}}
{{- define "guestbackup.imageRef" -}}
{{- $root := index . 0 }}
{{- $img := index . 1 }}
{{- $repo := default $root.Values.image.repository $img.repository }}
{{- $digest := default $root.Values.image.digest $img.digest }}
{{- if $digest }}
{{- printf "%s@%s" $repo $digest }}
{{- else }}
{{- printf "%s:%s" $repo (default (default $root.Chart.AppVersion $root.Values.image.tag) $img.tag) }}
{{- end }}
{{- end }}

{{- define "guestbackup.image" -}}{{ include "guestbackup.imageRef" (list . .Values.image) }}{{- end }}
{{- define "guestbackup.serverImage" -}}{{ include "guestbackup.imageRef" (list . .Values.serverImage) }}{{- end }}

{{/*
The restricted Pod Security Standard, without a UID: the image runs as a
non-root user, and OpenShift's restricted SCC assigns its own UID, which a
fixed runAsUser or fsGroup would conflict with. A component's
podSecurityContext and securityContext values are merged over these
(include with the component's values).
*/}}
{{- define "guestbackup.podSecurityContext" -}}
{{- $default := dict "runAsNonRoot" true "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- mergeOverwrite $default (deepCopy (.podSecurityContext | default dict)) | toYaml }}
{{- end }}

{{- define "guestbackup.containerSecurityContext" -}}
{{- $default := dict
  "runAsNonRoot" true
  "allowPrivilegeEscalation" false
  "readOnlyRootFilesystem" true
  "capabilities" (dict "drop" (list "ALL"))
  "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- mergeOverwrite $default (deepCopy (.securityContext | default dict)) | toYaml }}
{{- end }}

{{/* What every component's pod spec takes from its values: scheduling and extra settings. Include with the component's values. */}}
{{- define "guestbackup.podScheduling" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The rules of a generated ClusterRole in files/rbac/ (hack/generate.sh copies them from config/rbac/). */}}
{{- define "guestbackup.generatedRules" -}}
{{- $file := printf "files/rbac/%s-role.yaml" .binary }}
{{- $role := .root.Files.Get $file | fromYaml }}
{{- if not $role.rules }}
{{- fail (printf "%s holds no rules: run make generate" $file) }}
{{- end }}
{{- toYaml $role.rules }}
{{- end }}
