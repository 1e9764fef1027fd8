{{/*
What the announcement mode (values announce.mode: l2, bgp or none) adds,
in one place: the node configuration's keys, rivorad's capabilities, its
RBAC (cluster-wide and in the release's namespace), and its flags. Each
define below is included by the template that owns the object; a mode's
settings live under announce.<mode> in values.yaml.
*/}}

{{/* Keys of rivorad's node configuration file. */}}
{{- define "rivora.announce.nodeConfig" -}}
{{- end -}}

{{/* Capabilities beyond the datapath's (a YAML list continued). */}}
{{- define "rivora.announce.capabilities" -}}
{{- end -}}

{{/* rivorad's cluster-wide rules (a YAML list continued). */}}
{{- define "rivora.announce.clusterRules" -}}
{{- end -}}

{{/* rivorad's rules in the release's namespace (a YAML list, may be empty). */}}
{{- define "rivora.announce.namespaceRules" -}}
{{- end -}}

{{/* rivorad's flags (a YAML list continued). */}}
{{- define "rivora.announce.args" -}}
{{- end -}}
