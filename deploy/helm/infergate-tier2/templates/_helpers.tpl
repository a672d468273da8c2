{{/* Chart name, truncated for label values. */}}
{{- define "infergate-tier2.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name. */}}
{{- define "infergate-tier2.fullname" -}}
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

{{- define "infergate-tier2.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "infergate-tier2.selectorLabels" -}}
app.kubernetes.io/name: {{ include "infergate-tier2.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "infergate-tier2.labels" -}}
helm.sh/chart: {{ include "infergate-tier2.chart" . }}
{{ include "infergate-tier2.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: tier2
app.kubernetes.io/part-of: infergate
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "infergate-tier2.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "infergate-tier2.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Name of the Secret holding the admin token. */}}
{{- define "infergate-tier2.adminSecretName" -}}
{{- if .Values.admin.existingSecret -}}
{{- .Values.admin.existingSecret -}}
{{- else -}}
{{- printf "%s-admin" (include "infergate-tier2.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "infergate-tier2.adminSecretKey" -}}
{{- if .Values.admin.existingSecret -}}
{{- .Values.admin.existingSecretKey -}}
{{- else -}}
token
{{- end -}}
{{- end -}}

{{- define "infergate-tier2.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Where TLS Secrets are mounted: one directory per listener. */}}
{{- define "infergate-tier2.tlsDir" -}}
/etc/infergate/tls
{{- end -}}

{{/* The Secret of tls.*: tls.secretName, else the one cert-manager writes
     (<fullname>-tls); empty when neither is set. */}}
{{- define "infergate-tier2.tlsSecretName" -}}
{{- if .Values.tls.secretName -}}
{{- .Values.tls.secretName -}}
{{- else if .Values.tls.certManager.enabled -}}
{{- printf "%s-tls" (include "infergate-tier2.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The Secret with Tier 2's client certificate for Tier 1. */}}
{{- define "infergate-tier2.tier1SecretName" -}}
{{- if .Values.tls.tier1.secretName -}}
{{- .Values.tls.tier1.secretName -}}
{{- else if .Values.tls.tier1.certManager.enabled -}}
{{- printf "%s-tier1-client" (include "infergate-tier2.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The TLS Secrets mounted into the container, as a JSON list of
     {name, dir, secret}; it also fails on settings that cannot work,
     naming the value to fix. */}}
{{- define "infergate-tier2.tlsMounts" -}}
{{- $dir := include "infergate-tier2.tlsDir" . -}}
{{- $main := include "infergate-tier2.tlsSecretName" . -}}
{{- $t := .Values.tls -}}
{{- if and $t.certManager.enabled (not $t.certManager.issuerRef.name) -}}
{{- fail "infergate-tier2: tls.certManager.enabled needs tls.certManager.issuerRef.name" -}}
{{- end -}}
{{- $mounts := list -}}
{{- $want := list -}}
{{- if $t.enabled -}}{{- $want = append $want (list "api" "tls.enabled" "") -}}{{- end -}}
{{- if $t.admin.enabled -}}{{- $want = append $want (list "admin" "tls.admin.enabled" $t.admin.secretName) -}}{{- end -}}
{{- if $t.metrics.enabled -}}{{- $want = append $want (list "metrics" "tls.metrics.enabled" $t.metrics.secretName) -}}{{- end -}}
{{- range $want -}}
{{- $secret := default $main (index . 2) -}}
{{- if not $secret -}}
{{- fail (printf "infergate-tier2: %s needs a certificate: set tls.secretName (an existing kubernetes.io/tls Secret) or tls.certManager.enabled" (index . 1)) -}}
{{- end -}}
{{- $mounts = append $mounts (dict "name" (printf "tls-%s" (index . 0)) "dir" (printf "%s/%s" $dir (index . 0)) "secret" $secret) -}}
{{- end -}}
{{- if $t.tier1.enabled -}}
{{- if and (not $t.tier1.secretName) $t.tier1.certManager.enabled (not $t.tier1.certManager.issuerRef.name) -}}
{{- fail "infergate-tier2: tls.tier1.certManager.enabled needs tls.tier1.certManager.issuerRef.name" -}}
{{- end -}}
{{- $secret := include "infergate-tier2.tier1SecretName" . -}}
{{- if not $secret -}}
{{- fail "infergate-tier2: tls.tier1.enabled needs tls.tier1.secretName (a kubernetes.io/tls Secret: Tier 2's client certificate and Tier 1's CA) or tls.tier1.certManager.enabled" -}}
{{- end -}}
{{- $mounts = append $mounts (dict "name" "tls-tier1" "dir" (printf "%s/tier1" $dir) "secret" $secret) -}}
{{- end -}}
{{- toJson $mounts -}}
{{- end -}}

{{/* A listener's TLS block (tlsfiles.Server) for the certificate mounted
     at .dir; client certificates are verified against its ca.crt when
     .clientAuth is set. */}}
{{- define "infergate-tier2.serverTLS" -}}
cert_file: {{ printf "%s/tls.crt" .dir }}
key_file: {{ printf "%s/tls.key" .dir }}
{{- if .clientAuth }}
client_ca_file: {{ printf "%s/ca.crt" .dir }}
client_auth: {{ .clientAuth }}
{{- end }}
{{- if .minVersion }}
min_version: {{ .minVersion | quote }}
{{- end }}
{{- end -}}

{{/* A probe on the API port follows its TLS: HTTPS (the kubelet does not
     verify the certificate), or a TCP check when client certificates are
     required, which the kubelet cannot present. */}}
{{- define "infergate-tier2.probe" -}}
{{- $p := deepCopy .probe -}}
{{- $t := .root.Values.tls -}}
{{- if and $t.enabled (hasKey $p "httpGet") -}}
{{- $port := toString $p.httpGet.port -}}
{{- if or (eq $port "http") (eq $port (toString .root.Values.ports.http)) -}}
{{- if eq $t.clientAuth "require" -}}
{{- $_ := set $p "tcpSocket" (dict "port" $p.httpGet.port) -}}
{{- $_ := unset $p "httpGet" -}}
{{- else -}}
{{- $_ := set $p.httpGet "scheme" "HTTPS" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $p -}}
{{- end -}}
