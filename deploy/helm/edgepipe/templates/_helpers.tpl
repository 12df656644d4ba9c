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

{{/* A size in MiB: dict "v" value "what" its name. Accepts Mi, Gi, Ti and
MiB, GiB, TiB (what Kubernetes and the receiver's flags write); fails on
others. */}}
{{- define "edgepipe.mib" -}}
{{- $v := toString .v }}
{{- if not (regexMatch "^[0-9]+(Mi|Gi|Ti)B?$" $v) }}
{{- fail (printf "%s %q: use Mi, Gi or Ti (or MiB, GiB, TiB)" .what $v) }}
{{- end }}
{{- $n := regexReplaceAll "^([0-9]+).*$" $v "${1}" | int64 }}
{{- $unit := regexReplaceAll "^[0-9]+(Mi|Gi|Ti)B?$" $v "${1}" }}
{{- if eq $unit "Gi" }}{{ $n = mul $n 1024 }}{{ else if eq $unit "Ti" }}{{ $n = mul $n 1048576 }}{{ end }}
{{- $n }}
{{- end }}

{{/* The spool's size bound: receiver.spool.maxBytes, or 90% of the volume
(the filesystem and the segment being written need the rest). */}}
{{- define "edgepipe.spoolMaxBytes" -}}
{{- $s := .Values.receiver.spool }}
{{- if $s.maxBytes }}
{{- $s.maxBytes }}
{{- else }}
{{- $mib := include "edgepipe.mib" (dict "v" $s.size "what" "receiver.spool.size (or set receiver.spool.maxBytes)") | int64 }}
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
{{- $mib := include "edgepipe.mib" (dict "v" .Values.receiver.spool.size "what" "receiver.spool.size (or set receiver.deadLetter.maxBytes)") | int64 }}
{{- printf "%dMiB" (max 1 (div (mul $mib 5) 100)) }}
{{- end }}
{{- end }}

{{/* Refuses receiver sizes that cannot work, as the receiver would at start
(cmd/rtld-receiver checkSizes): a spool bound below two segments with room
for the largest batch, or an ingest memory bound below one request. */}}
{{- define "edgepipe.receiverSizesCheck" -}}
{{- $r := .Values.receiver }}
{{- $max := include "edgepipe.mib" (dict "v" (include "edgepipe.spoolMaxBytes" .) "what" "receiver.spool.maxBytes") | int64 }}
{{- $dec := include "edgepipe.mib" (dict "v" $r.ingest.maxDecodedBytes "what" "receiver.ingest.maxDecodedBytes") | int64 }}
{{- $mem := include "edgepipe.mib" (dict "v" $r.ingest.maxMemoryBytes "what" "receiver.ingest.maxMemoryBytes") | int64 }}
{{- $seg := max 1 (min 64 (div $max 16)) }}
{{- $need := mul 2 (add $seg $dec (div $dec 64) 1) }}
{{- if lt $max $need }}
{{- fail (printf "receiver.spool.size %v gives --spool.max-bytes=%dMiB, too small for batches of up to receiver.ingest.maxDecodedBytes=%v: the spool frees whole segments (%dMiB here), so it needs at least %dMiB; raise receiver.spool.size or lower receiver.ingest.maxDecodedBytes" $r.spool.size $max $r.ingest.maxDecodedBytes $seg $need) }}
{{- end }}
{{- $needMem := add 16 $dec (div (add $dec 3) 4) }}
{{- if lt $mem $needMem }}
{{- fail (printf "receiver.ingest.maxMemoryBytes=%v cannot hold one request of 16MiB as sent and receiver.ingest.maxDecodedBytes=%v decompressed: use at least %dMiB" $r.ingest.maxMemoryBytes $r.ingest.maxDecodedBytes $needMem) }}
{{- end }}
{{- end }}

{{/* The receiver's memory limit in MiB: receiver.resources.limits.memory,
or the sizing rule 4 x ingest.maxMemoryBytes + 512Mi (bodies in flight,
two delivery groups per sink, the runtime, and the garbage collector's
headroom; see the README). */}}
{{- define "edgepipe.receiverMemoryLimitMiB" -}}
{{- $l := dig "limits" "memory" "" .Values.receiver.resources }}
{{- if $l }}
{{- include "edgepipe.mib" (dict "v" $l "what" "receiver.resources.limits.memory") }}
{{- else }}
{{- $mem := include "edgepipe.mib" (dict "v" .Values.receiver.ingest.maxMemoryBytes "what" "receiver.ingest.maxMemoryBytes") | int64 }}
{{- add (mul 4 $mem) 512 }}
{{- end }}
{{- end }}

{{/* The receiver's resources: receiver.resources, with the memory limit
(and a request of half of it) filled in from the sizing rule when unset. */}}
{{- define "edgepipe.receiverResources" -}}
{{- $res := deepCopy .Values.receiver.resources }}
{{- $limit := include "edgepipe.receiverMemoryLimitMiB" . | int64 }}
{{- $limits := $res.limits | default dict }}
{{- $requests := $res.requests | default dict }}
{{- if not $limits.memory }}{{ $_ := set $limits "memory" (printf "%dMi" $limit) }}{{ end }}
{{- if not $requests.memory }}{{ $_ := set $requests "memory" (printf "%dMi" (div $limit 2)) }}{{ end }}
{{- $_ := set $res "limits" $limits }}
{{- $_ := set $res "requests" $requests }}
{{- toYaml $res }}
{{- end }}

{{/* Whether the receiver runs several replicas behind its Service. */}}
{{- define "edgepipe.receiverReplicated" -}}
{{- if or .Values.receiver.autoscaling.enabled (gt (int .Values.receiver.replicas) 1) }}true{{ end }}
{{- end }}

{{/* The receiver's reconciliation flags. Several replicas each spool part of
a bucket, so they count the records in ClickHouse's access_logs (exact
across replicas) and the first replica compares; without ClickHouse
reconciliation is off then. In simulate mode every replica has a platform
of its own and reconciles its own records. */}}
{{- define "edgepipe.receiverReconcileArgs" -}}
{{- $delay := toString .Values.receiver.reconcile.delay }}
{{- $off := or (eq $delay "0") (eq $delay "0s") }}
{{- if and (include "edgepipe.receiverReplicated" .) (not .Values.clickhouse.enabled) (not .Values.simulate) }}
{{- $off = true }}
{{- end }}
{{- if $off }}
- --reconcile.delay=0s
{{- else }}
- --reconcile.delay={{ $delay }}
{{- if and .Values.clickhouse.enabled (not .Values.simulate) }}
- --reconcile.counts=clickhouse
- --reconcile.leader={{ include "edgepipe.receiver.fullname" . }}-0
{{- end }}
{{- end }}
{{- end }}
