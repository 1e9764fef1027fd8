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

Mode bgp adds the file's `bgp:` section (from announce.bgp), with which
rivorad -kubernetes also watches BGPPeers and writes its node's
BGPNodeStatus; the rights for those and for the password Secrets in the
release's namespace and in announce.bgp.secretNamespaces; NET_BIND_SERVICE
when the listener's port is below 1024.
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

{{/* Top-level keys of rivorad's node configuration beside `node`. Mode
bgp: the `bgp:` section. Numbers go through int64: values files give
Helm float64s, which toYaml would write as 4.2e+09 for a 4-byte AS. */}}
{{- define "rivora.announce.nodeConfig" -}}
{{- if eq .Values.announce.mode "bgp" -}}
{{- $b := .Values.announce.bgp -}}
{{- include "rivora.announce.bgpCheck" . -}}
{{- $bgp := dict "asn" ($b.asn | int64) -}}
{{- with $b.routerId }}{{ $_ := set $bgp "routerId" . }}{{ end -}}
{{- if not (kindIs "invalid" $b.listenPort) }}{{ $_ := set $bgp "listenPort" ($b.listenPort | int64) }}{{ end -}}
{{- with $b.restartTime }}{{ $_ := set $bgp "restartTime" . }}{{ end -}}
{{- $peers := list -}}
{{- range $b.peers -}}
{{- $p := deepCopy . -}}
{{- range $k := list "asn" "port" "localPref" "med" -}}
{{- if hasKey $p $k }}{{ $_ := set $p $k (get $p $k | int64) }}{{ end -}}
{{- end -}}
{{- if and (kindIs "map" $p.bfd) (hasKey $p.bfd "multiplier") -}}
{{- $_ := set $p "bfd" (merge (dict "multiplier" ($p.bfd.multiplier | int64)) $p.bfd) -}}
{{- end -}}
{{- $peers = append $peers $p -}}
{{- end -}}
{{- with $peers }}{{ $_ := set $bgp "peers" . }}{{ end -}}
{{- $ads := list -}}
{{- range $b.advertisements -}}
{{- $a := deepCopy . -}}
{{- range $k := list "localPref" "med" -}}
{{- if hasKey $a $k }}{{ $_ := set $a $k (get $a $k | int64) }}{{ end -}}
{{- end -}}
{{- $ads = append $ads $a -}}
{{- end -}}
{{- with $ads }}{{ $_ := set $bgp "advertisements" . }}{{ end -}}
{{- toYaml (dict "bgp" $bgp) -}}
{{- end -}}
{{- end -}}

{{/* What the schema cannot say clearly ('not' failed): the values
rivorad would refuse at start, refused here with its reasons. */}}
{{- define "rivora.announce.bgpCheck" -}}
{{- $b := .Values.announce.bgp -}}
{{- if eq ($b.asn | int64) 23456 -}}
{{- fail "announce.bgp.asn: 23456 is AS_TRANS (RFC 6793), not an AS of its own" -}}
{{- end -}}
{{- range $i, $p := $b.peers -}}
{{- if eq ($p.asn | int64) 23456 -}}
{{- fail (printf "announce.bgp.peers[%d].asn: 23456 is AS_TRANS (RFC 6793), not an AS of its own" $i) -}}
{{- end -}}
{{- end -}}
{{- if has $b.routerId (list "0.0.0.0" "255.255.255.255") -}}
{{- fail (printf "announce.bgp.routerId: %s is not a router ID (an IPv4 address, not 0.0.0.0 or broadcast)" $b.routerId) -}}
{{- end -}}
{{- end -}}

{{/* Whether rivorad's BGP listener needs NET_BIND_SERVICE ("true" or
""): mode bgp on a port from 1 to 1023 (0: no listener). */}}
{{- define "rivora.announce.bgpPrivilegedPort" -}}
{{- if eq .Values.announce.mode "bgp" -}}
{{- $port := include "rivora.announce.bgpListenPort" . | int -}}
{{- if and (gt $port 0) (lt $port 1024) }}true{{ end -}}
{{- end -}}
{{- end -}}

{{/* The BGP listener's port: announce.bgp.listenPort, 179 when unset (as
rivorad's default), 0 for none (which `default` would take for unset). */}}
{{- define "rivora.announce.bgpListenPort" -}}
{{- if kindIs "invalid" .Values.announce.bgp.listenPort }}179{{ else }}{{ .Values.announce.bgp.listenPort | int64 }}{{ end -}}
{{- end -}}

{{/* Capabilities beyond the datapath's (a YAML list continued). The L2
speaker's AF_PACKET sockets: NET_RAW, in every mode. Mode bgp: binding
the listener to a port below 1024 (179) needs NET_BIND_SERVICE; TCP MD5
(TCP_MD5SIG) and BFD's sockets (TTL 255, IP_MINTTL) need no capability,
as tests/e2e_capabilities.rs shows against a real peer. */}}
{{- define "rivora.announce.capabilities" }}
- NET_RAW
{{- if include "rivora.announce.bgpPrivilegedPort" . }}
- NET_BIND_SERVICE
{{- end }}
{{- end -}}

{{/* rivorad's cluster-wide rules (a YAML list continued). The L2
speaker: its own Node's labels (for node selectors: list and watch cannot
be limited to one name); the AddressPools it reads are in rivorad's base
rules. */}}
{{- define "rivora.announce.clusterRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
{{- if eq .Values.announce.mode "bgp" }}
# The BGP speaker: the BGPPeers (those whose nodeSelector picks the node
# become sessions) and its own node's BGPNodeStatus, created and patched
# (it may not delete them, nor update them whole).
- apiGroups: [rivora.io]
  resources: [bgppeers]
  verbs: [get, list, watch]
- apiGroups: [rivora.io]
  resources: [bgpnodestatuses, bgpnodestatuses/status]
  verbs: [get, create, patch]
{{- end }}
{{- end -}}

{{/* rivorad's rules in the release's namespace (a YAML list, may be
empty). The L2 speaker's Leases (rivora-l2-*): read through one watch,
created, renewed and released by replace. */}}
{{- define "rivora.announce.namespaceRules" -}}
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update]
{{- if eq .Values.announce.mode "bgp" }}
# The BGP speaker: the TCP MD5 passwords of BGPPeers (passwordSecretRef),
# read by name with get (never listed or watched); so their Secrets live in
# this namespace, or in one of announce.bgp.secretNamespaces.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- end -}}

{{/* Mode bgp: the same `get` on Secrets in each namespace of
announce.bgp.secretNamespaces (other than the release's, which has it), as
documents of their own (a Role and its RoleBinding each). */}}
{{- define "rivora.announce.secretRoles" -}}
{{- if eq .Values.announce.mode "bgp" -}}
{{- $root := . -}}
{{- range .Values.announce.bgp.secretNamespaces | default list | uniq -}}
{{- if ne . $root.Release.Namespace }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: rivora:rivorad-bgp-secrets
  namespace: {{ . }}
  labels:
    {{- include "rivora.componentLabels" (dict "root" $root "component" "rivorad") | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: rivora:rivorad-bgp-secrets
  namespace: {{ . }}
  labels:
    {{- include "rivora.componentLabels" (dict "root" $root "component" "rivorad") | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: rivora:rivorad-bgp-secrets
subjects:
  - kind: ServiceAccount
    name: {{ include "rivora.rivoradServiceAccount" $root }}
    namespace: {{ $root.Release.Namespace }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* rivorad's flags (a YAML list continued). */}}
{{- define "rivora.announce.args" -}}
{{- end -}}
