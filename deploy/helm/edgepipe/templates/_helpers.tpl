{{/* Chart name, truncated to a DNS label. */}}
{{- define "edgepipe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name. */}}
{{- define "edgepipe.fullname" -}}
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

{{- define "edgepipe.exporter.fullname" -}}
{{- printf "%s-exporter" (include "edgepipe.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "edgepipe.receiver.fullname" -}}
{{- printf "%s-receiver" (include "edgepipe.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "edgepipe.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels: the chart's own and commonLabels. */}}
{{- define "edgepipe.labels" -}}
{{- include "edgepipe.labelsWith" (dict "ctx" . "extra" (dict)) }}
{{- end }}

{{/*
Common labels plus extra labels (a dict); call with (dict "ctx" $ "extra" $labels).
The chart's own labels win over extra, and extra over commonLabels.
*/}}
{{- define "edgepipe.labelsWith" -}}
{{- $c := .ctx }}
{{- $own := dict
  "helm.sh/chart" (include "edgepipe.chart" $c)
  "app.kubernetes.io/name" (include "edgepipe.name" $c)
  "app.kubernetes.io/instance" $c.Release.Name
  "app.kubernetes.io/version" $c.Chart.AppVersion
  "app.kubernetes.io/managed-by" $c.Release.Service
  "app.kubernetes.io/part-of" "edgepipe" }}
{{- toYaml (merge $own (deepCopy .extra) (deepCopy (default (dict) $c.Values.commonLabels))) }}
{{- end }}

{{/*
Labels of a component's pods: its selector labels, then podLabels (a dict),
then commonLabels; call with (dict "ctx" $ "component" "exporter" "podLabels" $labels).
Not used for selectors or volumeClaimTemplates, which cannot change after install.
*/}}
{{- define "edgepipe.podLabels" -}}
{{- $sel := include "edgepipe.selectorLabels" . | fromYaml }}
{{- toYaml (merge $sel (deepCopy (default (dict) .podLabels)) (deepCopy (default (dict) .ctx.Values.commonLabels))) }}
{{- end }}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "exporter"). */}}
{{- define "edgepipe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "edgepipe.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "edgepipe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "edgepipe.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image: repository@digest when image.digest is set (the tag is then ignored), else repository:tag. */}}
{{- define "edgepipe.image" -}}
{{- with .Values.image.digest }}
{{- printf "%s@%s" $.Values.image.repository . }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Name of the Secret holding credentials. */}}
{{- define "edgepipe.secretName" -}}
{{- if .Values.credentials.existingSecret }}
{{- .Values.credentials.existingSecret }}
{{- else }}
{{- include "edgepipe.fullname" . }}
{{- end }}
{{- end }}

{{- define "edgepipe.webConfigSecretName" -}}
{{- if .Values.webConfig.existingSecret }}
{{- .Values.webConfig.existingSecret }}
{{- else }}
{{- printf "%s-web-config" (include "edgepipe.fullname" .) }}
{{- end }}
{{- end }}

{{/* One env var read from the credentials Secret; call with (dict "ctx" $ "name" "EDGEPIPE_X" "key" "clientId" "optional" false). */}}
{{- define "edgepipe.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "edgepipe.secretName" .ctx }}
      key: {{ index .ctx.Values.credentials.keys .key }}
      {{- if .optional }}
      optional: true
      {{- end }}
{{- end }}

{{/* Settings both programs share: platform endpoints, API credentials, ClickHouse DSN. */}}
{{- define "edgepipe.commonEnv" -}}
{{- if not .Values.simulate }}
{{- with .Values.platform.apiUrl }}
- name: EDGEPIPE_API_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.platform.authUrl }}
- name: EDGEPIPE_AUTH_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.platform.environmentIds }}
- name: EDGEPIPE_ENVIRONMENT_ID
  value: {{ join "," . | quote }}
{{- end }}
{{ include "edgepipe.secretEnv" (dict "ctx" . "name" "EDGEPIPE_CLIENT_ID" "key" "clientId") }}
{{ include "edgepipe.secretEnv" (dict "ctx" . "name" "EDGEPIPE_CLIENT_SECRET" "key" "clientSecret") }}
{{- end }}
{{- if .Values.clickhouse.enabled }}
{{ include "edgepipe.secretEnv" (dict "ctx" . "name" "EDGEPIPE_CLICKHOUSE_DSN" "key" "clickhouseDsn") }}
{{ include "edgepipe.secretEnv" (dict "ctx" . "name" "EDGEPIPE_CLICKHOUSE_PASSWORD" "key" "clickhousePassword" "optional" true) }}
{{- end }}
{{- end }}

{{/* Web config flag. */}}
{{- define "edgepipe.webConfigArgs" -}}
{{- if .Values.webConfig.enabled }}
- --web.config.file=/etc/edgepipe/web/web-config.yml
{{- end }}
{{- end }}

{{- define "edgepipe.webConfigVolumeMounts" -}}
{{- if .Values.webConfig.enabled }}
- name: web-config
  mountPath: /etc/edgepipe/web
  readOnly: true
{{- if .Values.webConfig.tlsSecretName }}
- name: tls
  mountPath: /etc/edgepipe/tls
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{- define "edgepipe.webConfigVolumes" -}}
{{- if .Values.webConfig.enabled }}
- name: web-config
  secret:
    secretName: {{ include "edgepipe.webConfigSecretName" . }}
    items:
      - key: web-config.yml
        path: web-config.yml
{{- if .Values.webConfig.tlsSecretName }}
- name: tls
  secret:
    secretName: {{ .Values.webConfig.tlsSecretName }}
{{- end }}
{{- end }}
{{- end }}

{{/* Liveness /healthz and readiness /readyz on the named port "http"
(TCP checks when basic auth guards every path). */}}
{{- define "edgepipe.probes" -}}
{{- $scheme := ternary "HTTPS" "HTTP" (and .Values.webConfig.enabled .Values.webConfig.tls) }}
{{- $basic := and .Values.webConfig.enabled .Values.webConfig.basicAuth }}
livenessProbe:
  {{- if $basic }}
  tcpSocket:
    port: http
  {{- else }}
  httpGet:
    path: /healthz
    port: http
    scheme: {{ $scheme }}
  {{- end }}
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  {{- if $basic }}
  tcpSocket:
    port: http
  {{- else }}
  httpGet:
    path: /readyz
    port: http
    scheme: {{ $scheme }}
  {{- end }}
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- end }}

{{- define "edgepipe.metricsScheme" -}}
{{- ternary "https" "http" (and .Values.webConfig.enabled .Values.webConfig.tls) }}
{{- end }}

{{/* The spool's size bound: receiver.spool.maxBytes, or 90% of the volume
(the filesystem and the segment being written need the rest). */}}
{{- define "edgepipe.spoolMaxBytes" -}}
{{- $s := .Values.receiver.spool }}
{{- if $s.maxBytes }}
{{- $s.maxBytes }}
{{- else }}
{{- $mib := include "edgepipe.spoolSizeMiB" (dict "size" $s.size "what" "receiver.spool.maxBytes") | int64 }}
{{- printf "%dMiB" (div (mul $mib 9) 10) }}
{{- end }}
{{- end }}

{{/*
The dead-letter store's bound (--dead-letter.max-bytes): receiver.deadLetter.maxBytes,
or 5% of the spool volume (it shares the volume with the spool).
*/}}
{{- define "edgepipe.deadLetterMaxBytes" -}}
{{- with .Values.receiver.deadLetter.maxBytes }}
{{- . }}
{{- else }}
{{- $mib := include "edgepipe.spoolSizeMiB" (dict "size" .Values.receiver.spool.size "what" "receiver.deadLetter.maxBytes") | int64 }}
{{- printf "%dMiB" (max 1 (div (mul $mib 5) 100)) }}
{{- end }}
{{- end }}

{{/*
The spool volume's size in MiB; size must be in Mi, Gi or Ti, otherwise the
value named by "what" must be set.
*/}}
{{- define "edgepipe.spoolSizeMiB" -}}
{{- $m := regexFindAll "^([0-9]+)(Mi|Gi|Ti)$" (toString .size) 1 }}
{{- if not $m }}
{{- fail (printf "receiver.spool.size %q: use Mi, Gi or Ti, or set %s" (toString .size) .what) }}
{{- end }}
{{- $n := regexReplaceAll "^([0-9]+)(Mi|Gi|Ti)$" (toString .size) "${1}" | int64 }}
{{- $unit := regexReplaceAll "^([0-9]+)(Mi|Gi|Ti)$" (toString .size) "${2}" }}
{{- ternary $n (ternary (mul $n 1024) (mul $n 1048576) (eq $unit "Gi")) (eq $unit "Mi") }}
{{- end }}
