{{/*
The exporter's container, shared by its run container and the `exporter
check` init container (exporter.preflight.enabled), so the check tries
exactly the arguments, variables and files the exporter runs with.
*/}}

{{/* The ConfigMap holding --config.file, "" without one. */}}
{{- define "edgepipe.exporter.configMap" -}}
{{- if .Values.exporter.config }}
{{- printf "%s-config" (include "edgepipe.exporter.fullname" .) }}
{{- else }}
{{- .Values.exporter.existingConfigMap }}
{{- end }}
{{- end }}

{{/* The run command's arguments (`exporter check` takes the same). */}}
{{- define "edgepipe.exporter.args" -}}
- --web.listen-address=:{{ .Values.exporter.service.port }}
{{- if .Values.simulate }}
- --simulate
{{- end }}
- --granularity={{ .Values.exporter.granularity }}
- --poll-interval={{ .Values.exporter.pollInterval }}
- --inventory.interval={{ .Values.exporter.inventoryInterval }}
{{- with .Values.exporter.settleWindow }}
- --settle-window={{ . }}
{{- end }}
{{- with .Values.exporter.otlp.endpoint }}
- --otlp.endpoint={{ . }}
- --otlp.temporality={{ $.Values.exporter.otlp.temporality }}
{{- end }}
{{- if .Values.exporter.state.enabled }}
- --state.dir=/var/lib/edgepipe/state
{{- end }}
{{- if (include "edgepipe.exporter.configMap" .) }}
- --config.file=/etc/edgepipe/exporter/config.yaml
{{- end }}
{{- if ne (toString .Values.exporter.maxSeries) "" }}
- --prometheus.max-series={{ .Values.exporter.maxSeries | int64 }}
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
{{- if (gt (int .Values.exporter.replicas) 1) }}
# Kubernetes expands $(VAR) from the container's env: no shell needed.
- --shard.index=$(EDGEPIPE_SHARD_INDEX)
- --shard.count={{ .Values.exporter.replicas }}
{{- end }}
{{- with include "edgepipe.webConfigArgs" . }}{{ . | nindent 0 }}{{- end }}
{{- with .Values.exporter.extraArgs }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}

{{/* The variables of both containers (GOMEMLIMIT aside). */}}
{{- define "edgepipe.exporter.env" -}}
{{- if (gt (int .Values.exporter.replicas) 1) }}
# The StatefulSet ordinal (label set by Kubernetes >= 1.28).
- name: EDGEPIPE_SHARD_INDEX
  valueFrom:
    fieldRef:
      fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
{{- end }}
{{- if and (not .Values.simulate) .Values.platform.organizationIds }}
- name: EDGEPIPE_ORGANIZATION_ID
  value: {{ join "," .Values.platform.organizationIds | quote }}
{{- end }}
{{- with include "edgepipe.commonEnv" . }}{{ . | nindent 0 }}{{- end }}
{{- with .Values.exporter.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}

{{/* The files of both containers. */}}
{{- define "edgepipe.exporter.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if (include "edgepipe.exporter.configMap" .) }}
- name: config
  mountPath: /etc/edgepipe/exporter
  readOnly: true
{{- end }}
{{- if .Values.exporter.state.enabled }}
- name: state
  mountPath: /var/lib/edgepipe/state
{{- end }}
{{- with include "edgepipe.webConfigVolumeMounts" . }}{{ . | nindent 0 }}{{- end }}
{{- end }}
