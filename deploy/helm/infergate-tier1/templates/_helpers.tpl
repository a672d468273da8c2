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

{{/* Where TLS Secrets are mounted: one directory per listener. */}}
{{- define "infergate-tier1.tlsDir" -}}
/etc/infergate/tls
{{- end -}}

{{/* The Secret of tls.*: tls.secretName, else the one cert-manager writes
     (<fullname>-tls); empty when neither is set. */}}
{{- define "infergate-tier1.tlsSecretName" -}}
{{- if .Values.tls.secretName -}}
{{- .Values.tls.secretName -}}
{{- else if .Values.tls.certManager.enabled -}}
{{- printf "%s-tls" (include "infergate-tier1.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The mesh certificate's Secret. */}}
{{- define "infergate-tier1.peersTLSSecretName" -}}
{{- default (printf "%s-peers-tls" (include "infergate-tier1.fullname" .)) .Values.peers.tls.secretName -}}
{{- end -}}

{{/* The TLS Secrets mounted into the container, as a JSON list of
     {name, dir, secret, listener}; it also fails on settings that cannot
     work, naming the value to fix. */}}
{{- define "infergate-tier1.tlsMounts" -}}
{{- $dir := include "infergate-tier1.tlsDir" . -}}
{{- $main := include "infergate-tier1.tlsSecretName" . -}}
{{- $t := .Values.tls -}}
{{- if and $t.certManager.enabled (not $t.certManager.issuerRef.name) -}}
{{- fail "infergate-tier1: tls.certManager.enabled needs tls.certManager.issuerRef.name" -}}
{{- end -}}
{{- $mounts := list -}}
{{- $want := list -}}
{{- if $t.enabled -}}{{- $want = append $want (list "api" "tls.enabled" "") -}}{{- end -}}
{{- if $t.metrics.enabled -}}{{- $want = append $want (list "metrics" "tls.metrics.enabled" $t.metrics.secretName) -}}{{- end -}}
{{- if $t.extProc.enabled -}}
{{- if not .Values.extProc.enabled -}}
{{- fail "infergate-tier1: tls.extProc.enabled needs extProc.enabled" -}}
{{- end -}}
{{- $want = append $want (list "ext-proc" "tls.extProc.enabled" $t.extProc.secretName) -}}
{{- end -}}
{{- if $t.upstream.enabled -}}{{- $want = append $want (list "upstream" "tls.upstream.enabled" $t.upstream.secretName) -}}{{- end -}}
{{- range $want -}}
{{- $secret := default $main (index . 2) -}}
{{- if not $secret -}}
{{- fail (printf "infergate-tier1: %s needs a certificate: set tls.secretName (an existing kubernetes.io/tls Secret) or tls.certManager.enabled" (index . 1)) -}}
{{- end -}}
{{- $mounts = append $mounts (dict "name" (printf "tls-%s" (index . 0)) "dir" (printf "%s/%s" $dir (index . 0)) "secret" $secret) -}}
{{- end -}}
{{- if include "infergate-tier1.peersEnabled" . -}}
{{- $p := .Values.peers.tls -}}
{{- if and (not $p.secretName) $p.certManager.enabled (not $p.certManager.issuerRef.name) -}}
{{- fail "infergate-tier1: peers.tls.certManager.enabled needs peers.tls.certManager.issuerRef.name" -}}
{{- end -}}
{{- $mounts = append $mounts (dict "name" "tls-peers" "dir" (printf "%s/peers" $dir) "secret" (include "infergate-tier1.peersTLSSecretName" .)) -}}
{{- end -}}
{{- toJson $mounts -}}
{{- end -}}

{{/* A listener's TLS block (tlsfiles.Server) for the certificate mounted
     at .dir; client certificates are verified against its ca.crt when
     .clientAuth is set. */}}
{{- define "infergate-tier1.serverTLS" -}}
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
{{- define "infergate-tier1.probe" -}}
{{- $p := deepCopy .probe -}}
{{- $t := .root.Values.tls -}}
{{- if and $t.enabled (hasKey $p "httpGet") -}}
{{- $port := toString $p.httpGet.port -}}
{{- if or (eq $port "http") (eq $port (toString .root.Values.containerPort)) -}}
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
