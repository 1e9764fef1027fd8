{{/*
What the announcement mode (values announce.mode: l2, bgp or none) adds,
in one place: the node configuration's keys, rivorad's capabilities, its
RBAC (cluster-wide and in the release's namespace), and its flags. Each
define below is included by the template that owns the object; a mode's
settings live under announce.<mode> in values.yaml.

The L2 speaker runs on every node whatever the mode (with Kubernetes,
rivorad starts it to serve AddressPools that ask for L2): its rights are
the base's. Mode l2 only adds `announce: l2`, which makes the VIPs of
every other pool L2's too.
*/}}

{{/* rivorad's node settings (the file's `node`), as a dict. */}}
{{- define "rivora.announce.node" -}}
{{- $node := deepCopy (.Values.rivorad.node | default dict) -}}
{{- if eq .Values.announce.mode "l2" -}}
{{- $_ := set $node "announce" "l2" -}}
{{- end -}}
{{- $l2 := dict "gratuitousInterval" .Values.announce.l2.gratuitousInterval "lease" .Values.announce.l2.lease -}}
{{- with .Values.announce.l2.interfaces }}{{ $_ := set $l2 "interfaces" . }}{{ end -}}
{{- with .Values.announce.l2.nodeSelector }}{{ $_ := set $l2 "nodeSelector" . }}{{ end -}}
{{- $_ := set $node "l2" $l2 -}}
{{- toYaml $node -}}
{{- end -}}

{{/* Top-level keys of rivorad's node configuration beside `node`. */}}
{{- define "rivora.announce.nodeConfig" -}}
{{- end -}}

{{/* Capabilities beyond the datapath's (a YAML list continued). The L2
speaker's AF_PACKET sockets: NET_RAW, in every mode. */}}
{{- define "rivora.announce.capabilities" }}
- NET_RAW
{{- end -}}

{{/* rivorad's cluster-wide rules (a YAML list continued). The L2
speaker: the AddressPools (which ask for L2, and where their VIPs are),
its own Node's labels (for node selectors: list and watch cannot be
limited to one name). */}}
{{- define "rivora.announce.clusterRules" -}}
- apiGroups: [rivora.io]
  resources: [addresspools]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
{{- end -}}

{{/* rivorad's rules in the release's namespace (a YAML list, may be
empty). The L2 speaker's Leases (rivora-l2-*): read through one watch,
created, renewed and released by replace. */}}
{{- define "rivora.announce.namespaceRules" -}}
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update]
{{- end -}}

{{/* rivorad's flags (a YAML list continued). */}}
{{- define "rivora.announce.args" -}}
{{- end -}}
