{{/*
Names, labels and small checks shared by every template.
*/}}

{{- define "ttsfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or <release> alone when it already contains the chart name.
*/}}
{{- define "ttsfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ttsfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ttsfleet.labels" -}}
helm.sh/chart: {{ include "ttsfleet.chart" . }}
{{ include "ttsfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ttsfleet
{{- end }}

{{- define "ttsfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ttsfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ttsfleet.operator.selectorLabels" -}}
{{ include "ttsfleet.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "ttsfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ttsfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Where the operator reads the run's catalog (the same path the operator mounts it at in the server
pods: ttsfleet.contracts.serving.CATALOG_PATH; tests/chart checks they agree).
*/}}
{{- define "ttsfleet.catalogDir" -}}
/etc/ttsfleet/catalog
{{- end }}
{{- define "ttsfleet.catalogPath" -}}
{{ include "ttsfleet.catalogDir" . }}/catalog.yaml
{{- end }}

{{/*
An image reference from {repository, tag, digest}: the digest wins when set.
*/}}
{{- define "ttsfleet.image" -}}
{{- if .digest }}
{{- printf "%s@%s" .repository .digest }}
{{- else }}
{{- printf "%s:%s" .repository .tag }}
{{- end }}
{{- end }}

{{/*
Cross-field checks that values.schema.json cannot express. Included by the operator Deployment
(always rendered) so a bad combination fails the whole release.
*/}}
{{- define "ttsfleet.validate" -}}
{{- $pc := .Values.priorityClasses }}
{{- if not (gt (int64 $pc.inference.value) (int64 $pc.training.value)) }}
{{- fail (printf "priorityClasses: inference.value (%d) must be greater than training.value (%d)" (int64 $pc.inference.value) (int64 $pc.training.value)) }}
{{- end }}
{{- if not (gt (int64 $pc.training.value) (int64 $pc.fill.value)) }}
{{- fail (printf "priorityClasses: training.value (%d) must be greater than fill.value (%d)" (int64 $pc.training.value) (int64 $pc.fill.value)) }}
{{- end }}
{{- if eq (int .Values.operator.metricsPort) (int .Values.operator.healthPort) }}
{{- fail "operator: metricsPort and healthPort must differ" }}
{{- end }}
{{- with .Values.operator.leaderElection }}
{{- if not (and (lt (int .retryPeriodSeconds) (int .renewDeadlineSeconds)) (lt (int .renewDeadlineSeconds) (int .leaseDurationSeconds))) }}
{{- fail "operator.leaderElection: needs retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Restricted-profile security contexts shared by every pod the chart runs.
*/}}
{{- define "ttsfleet.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ int64 .Values.operator.runAsUser }}
runAsGroup: {{ int64 .Values.operator.runAsGroup }}
fsGroup: {{ int64 .Values.operator.runAsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "ttsfleet.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
A DNS-1123 name segment from a file name: "TTS_Overview.json" -> "tts-overview",
"ttsfleet-fill.json" -> "fill" (the release name already says ttsfleet).
*/}}
{{- define "ttsfleet.fileSlug" -}}
{{- $stem := base . | trimSuffix (ext .) | lower | trimPrefix "ttsfleet-" | trimPrefix "ttsfleet_" }}
{{- regexReplaceAll "[^a-z0-9]+" $stem "-" | trimAll "-" }}
{{- end }}
