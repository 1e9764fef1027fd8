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

{{/* rivorad's metrics, /healthz and /readyz listener, when bindAddress
is set (else each node's address, given as -metrics-listen). */}}
{{- define "rivora.rivoradMetricsListen" -}}
{{- $a := .Values.rivorad.metrics.bindAddress -}}
{{- if contains ":" $a -}}[{{ $a }}]:{{ .Values.rivorad.metrics.port }}{{- else -}}{{ $a }}:{{ .Values.rivorad.metrics.port }}{{- end -}}
{{- end -}}

{{/* The probes' host: the pod's address (the node's) unless bindAddress
names one address. */}}
{{- define "rivora.rivoradProbeHost" -}}
{{- $a := .Values.rivorad.metrics.bindAddress -}}
{{- if and $a (ne $a "0.0.0.0") (ne $a "::") -}}
host: {{ $a | quote }}
{{- end -}}
{{- end -}}

{{/*
The capabilities rivorad needs, as measured (tests/e2e_capabilities.rs runs
rivorad with exactly this list, rendered from the chart, and it loads,
attaches and forwards; without any one of them it fails to start): BPF
(bpf(2): programs, maps, pins), PERFMON (the verifier allows the programs'
pointer arithmetic only with it), NET_ADMIN (XDP and TCX attachment,
netlink). Not SYS_RESOURCE: since Linux 5.11 maps are charged to the memory
cgroup, not RLIMIT_MEMLOCK, and Rivora needs 6.6. Plus what the
announcement mode needs (_announce.tpl).
*/}}
{{- define "rivora.rivoradCapabilities" -}}
- BPF
- NET_ADMIN
- PERFMON
{{- include "rivora.announce.capabilities" . }}
{{- end -}}
