{{/*
The receiver's container, shared by its run container and the
`rtld-receiver check` init container (receiver.preflight.enabled), so the
check tries exactly the arguments, variables and files the receiver runs
with.
*/}}

{{/* The URL the platform posts to: receiver.publicUrl, else https://<first ingress host> with the ingress; "" without either. */}}
{{- define "edgepipe.receiver.publicUrl" -}}
{{- if .Values.receiver.publicUrl }}
{{- .Values.receiver.publicUrl }}
{{- else if .Values.receiver.ingress.enabled }}
{{- printf "https://%s" (index .Values.receiver.ingress.hosts 0).host }}
{{- end }}
{{- end }}

{{/* The receiver's arguments after the command (`rtld-receiver check` takes the same). */}}
{{- define "edgepipe.receiver.args" -}}
- --web.listen-address=:{{ .Values.receiver.service.port }}
{{- if .Values.simulate }}
- --simulate
{{- end }}
- --spool.dir=/var/lib/edgepipe/spool
- --spool.max-bytes={{ include "edgepipe.spoolMaxBytes" . }}
- --dead-letter.max-bytes={{ include "edgepipe.deadLetterMaxBytes" . }}
- --ingest.max-memory-bytes={{ .Values.receiver.ingest.maxMemoryBytes }}
- --ingest.max-decoded-bytes={{ .Values.receiver.ingest.maxDecodedBytes }}
- --profile-name={{ .Values.receiver.profileName }}
{{- if not .Values.receiver.register }}
- --no-register
{{- end }}
{{- with .Values.receiver.downsamplingPercent }}
- --profile.downsampling-percent={{ . }}
{{- end }}
{{- include "edgepipe.receiverReconcileArgs" . | trim | nindent 0 }}
{{- if .Values.receiver.kafka.brokers }}
- --kafka.topic={{ .Values.receiver.kafka.topic }}
- --kafka.max-message-bytes={{ .Values.receiver.kafka.maxMessageBytes }}
- --kafka.write-timeout={{ .Values.receiver.kafka.writeTimeout }}
{{- with .Values.receiver.kafka.tls }}{{ if .enabled }}
- --kafka.tls
{{- if .secretName }}
{{- with .caFile }}
- --kafka.tls.ca-file=/etc/edgepipe/kafka-tls/{{ . }}
{{- end }}
{{- if and .certFile .keyFile }}
- --kafka.tls.cert-file=/etc/edgepipe/kafka-tls/{{ .certFile }}
- --kafka.tls.key-file=/etc/edgepipe/kafka-tls/{{ .keyFile }}
{{- end }}
{{- end }}
{{- if .insecureSkipVerify }}
- --kafka.tls.insecure-skip-verify
{{- end }}
{{- end }}{{ end }}
- --kafka.sasl.mechanism={{ .Values.receiver.kafka.sasl.mechanism }}
{{- end }}
{{- if .Values.clickhouse.enabled }}
{{- with .Values.clickhouse.cluster }}
- --clickhouse.cluster={{ . }}
{{- end }}
{{- if .Values.clickhouse.insertQuorum }}
- --clickhouse.insert-quorum={{ .Values.clickhouse.insertQuorum }}
{{- end }}
{{- with .Values.clickhouse.retention }}
- --clickhouse.retention={{ . }}
{{- end }}
{{- end }}
{{- with .Values.receiver.logMetrics }}
{{- if not .enabled }}
- --no-log-metrics.enabled
{{- else }}
{{- if kindIs "slice" .labels }}
- --log-metrics.labels={{ join "," .labels }}
{{- end }}
{{- if ne (toString .topN) "" }}
- --log-metrics.top-n={{ .topN | int }}
{{- end }}
{{- with .topNWindow }}
- --log-metrics.top-n-window={{ . }}
{{- end }}
{{- if ne (toString .maxSeries) "" }}
- --log-metrics.max-series={{ .maxSeries | int64 }}
{{- end }}
{{- with .seriesTTL }}
- --log-metrics.series-ttl={{ . }}
{{- end }}
{{- end }}
{{- end }}
{{- with include "edgepipe.webConfigArgs" . }}{{ . | nindent 0 }}{{- end }}
{{- with .Values.receiver.extraArgs }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}

{{/* The variables of both containers. */}}
{{- define "edgepipe.receiver.env" -}}
# Let the Go runtime collect before the kernel kills the
# container: 85% of the memory limit, the rest for stacks and
# what the runtime does not count.
- name: GOMEMLIMIT
  value: {{ printf "%dMiB" (div (mul (include "edgepipe.receiverMemoryLimitMiB" . | int64) 85) 100) | quote }}
{{- if (include "edgepipe.receiver.publicUrl" .) }}
- name: EDGEPIPE_PUBLIC_URL
  value: {{ (include "edgepipe.receiver.publicUrl" .) | quote }}
{{- end }}
{{- with .Values.receiver.kafka.brokers }}
- name: EDGEPIPE_KAFKA_BROKERS
  value: {{ . | quote }}
{{- end }}
{{- if and .Values.receiver.kafka.brokers (ne .Values.receiver.kafka.sasl.mechanism "none") }}
{{- include "edgepipe.secretEnv" (dict "ctx" . "name" "EDGEPIPE_KAFKA_USERNAME" "key" "kafkaUsername" "optional" true) | nindent 0 }}
{{- include "edgepipe.secretEnv" (dict "ctx" . "name" "EDGEPIPE_KAFKA_PASSWORD" "key" "kafkaPassword" "optional" true) | nindent 0 }}
{{- end }}
{{- if not .Values.simulate }}
{{- include "edgepipe.secretEnv" (dict "ctx" . "name" "EDGEPIPE_RTLD_USERNAME" "key" "rtldUsername") | nindent 0 }}
{{- include "edgepipe.secretEnv" (dict "ctx" . "name" "EDGEPIPE_RTLD_PASSWORD" "key" "rtldPassword") | nindent 0 }}
{{- end }}
{{- with include "edgepipe.commonEnv" . }}{{ . | nindent 0 }}{{- end }}
{{- with .Values.receiver.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}

{{/* The files of both containers. */}}
{{- define "edgepipe.receiver.volumeMounts" -}}
- name: spool
  mountPath: /var/lib/edgepipe/spool
- name: tmp
  mountPath: /tmp
{{- with include "edgepipe.webConfigVolumeMounts" . }}{{ . | nindent 0 }}{{- end }}
{{- if and .Values.receiver.kafka.brokers .Values.receiver.kafka.tls.enabled .Values.receiver.kafka.tls.secretName }}
- name: kafka-tls
  mountPath: /etc/edgepipe/kafka-tls
  readOnly: true
{{- end }}
{{- end }}
