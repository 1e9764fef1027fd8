{{/*
Names. Rivora runs once per cluster (it serves every LoadBalancer Service
of its class), so its objects have fixed names, as Cilium's do: a second
release in the same cluster fails on the cluster-scoped ones instead of
fighting over Services.
*/}}
{{- define "rivora.rivorad" -}}rivorad{{- end -}}
{{- define "rivora.controller" -}}rivora-controller{{- end -}}

{{- define "rivora.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{- define "rivora.labels" -}}
app.kubernetes.io/name: rivora
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: rivora
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of a component: never change across upgrades. */}}
{{- define "rivora.selector" -}}
app.kubernetes.io/name: rivora
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "rivora.componentLabels" -}}
{{ include "rivora.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The ServiceAccount names. */}}
{{- define "rivora.rivoradServiceAccount" -}}
{{- .Values.rivorad.serviceAccount.name | default (include "rivora.rivorad" .) -}}
{{- end -}}
{{- define "rivora.controllerServiceAccount" -}}
{{- .Values.controller.serviceAccount.name | default (include "rivora.controller" .) -}}
{{- end -}}

{{/* rivorad's metrics, /healthz and /readyz listener. */}}
{{- define "rivora.rivoradMetricsListen" -}}
{{- $a := .Values.rivorad.metrics.bindAddress -}}
{{- if contains ":" $a -}}[{{ $a }}]:{{ .Values.rivorad.metrics.port }}{{- else -}}{{ $a }}:{{ .Values.rivorad.metrics.port }}{{- end -}}
{{- end -}}

{{/*
The capabilities rivorad needs, as measured (tests/e2e_capabilities.rs:
rivorad loads, attaches and forwards with exactly these, and fails without
each): BPF (bpf(2) object and map operations), PERFMON (the programs' packet
and map pointer arithmetic the verifier allows only with it), NET_ADMIN
(XDP and TCX attachment, netlink), SYS_RESOURCE (RLIMIT_MEMLOCK for the
maps on kernels that charge it), plus what the announcement mode needs.
*/}}
{{- define "rivora.rivoradCapabilities" -}}
- BPF
- NET_ADMIN
- PERFMON
- SYS_RESOURCE
{{- include "rivora.announce.capabilities" . }}
{{- end -}}
