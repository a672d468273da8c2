{{/* Chart name, truncated for label values. */}}
{{- define "infergate-tier1.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name. */}}
{{- define "infergate-tier1.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "infergate-tier1.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "infergate-tier1.selectorLabels" -}}
app.kubernetes.io/name: {{ include "infergate-tier1.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "infergate-tier1.labels" -}}
helm.sh/chart: {{ include "infergate-tier1.chart" . }}
{{ include "infergate-tier1.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: tier1
app.kubernetes.io/part-of: infergate
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "infergate-tier1.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "infergate-tier1.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Name of the Secret holding the client bearer token. */}}
{{- define "infergate-tier1.tokenSecretName" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecret -}}
{{- else -}}
{{- printf "%s-token" (include "infergate-tier1.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "infergate-tier1.tokenSecretKey" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecretKey -}}
{{- else -}}
token
{{- end -}}
{{- end -}}

{{- define "infergate-tier1.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* "true" when replicas share routing state (peers.enabled and more than
     one replica); empty otherwise. */}}
{{- define "infergate-tier1.peersEnabled" -}}
{{- if and .Values.peers.enabled (gt (int .Values.replicaCount) 1) -}}
true
{{- end -}}
{{- end -}}

{{/* Name of the Secret holding the peer token. */}}
{{- define "infergate-tier1.peersSecretName" -}}
{{- if .Values.peers.existingSecret -}}
{{- .Values.peers.existingSecret -}}
{{- else -}}
{{- printf "%s-peers-token" (include "infergate-tier1.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "infergate-tier1.peersSecretKey" -}}
{{- if .Values.peers.existingSecret -}}
{{- .Values.peers.existingSecretKey -}}
{{- else -}}
token
{{- end -}}
{{- end -}}
