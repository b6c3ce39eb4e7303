{{/* Names and labels shared by every object of the release. */}}
{{- define "fleetmedic.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "fleetmedic.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: include "fleetmedic.selector" (list . "worker") */}}
{{- define "fleetmedic.selector" -}}
{{- $top := index . 0 -}}
app.kubernetes.io/name: {{ $top.Chart.Name }}
app.kubernetes.io/instance: {{ $top.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "fleetmedic.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "fleetmedic.signingSecret" -}}
{{- .Values.signing.existingSecret | default (printf "%s-signing" (include "fleetmedic.fullname" .)) -}}
{{- end -}}

{{/* The operator keys' Secret, "" when none is configured. */}}
{{- define "fleetmedic.operatorSecret" -}}
{{- $op := .Values.signing.operator | default dict -}}
{{- if $op.existingSecret -}}{{ $op.existingSecret }}
{{- else if $op.keys -}}{{ printf "%s-operator-keys" (include "fleetmedic.fullname" .) }}
{{- end -}}
{{- end -}}

{{/* The effective fleetmedic config: the release's namespace and the mounted keys as defaults, the
     user's `config` values over them. */}}
{{- define "fleetmedic.config" -}}
{{- $signing := dict "key_file" "/etc/fleetmedic/signing/signing-key" -}}
{{- if include "fleetmedic.operatorSecret" . -}}
{{- $_ := set $signing "operator_key_dir" "/etc/fleetmedic/operator-keys" -}}
{{- end -}}
{{- $defaults := dict
      "signing" $signing
      "executor" (dict "lease_namespace" .Release.Namespace "diagnostics_namespace" .Release.Namespace) -}}
{{- toYaml (mustMergeOverwrite $defaults (deepCopy .Values.config)) -}}
{{- end -}}

{{/* Pod volumes: include "fleetmedic.volumes" (list . true false) - the second item says whether
     the component gets the command key (decide signs, the executor verifies; nothing else needs it),
     the optional third whether it gets the operator keys (decide only: it verifies operator commands). */}}
{{- define "fleetmedic.volumes" -}}
{{- $top := index . 0 -}}
- name: config
  configMap:
    name: {{ include "fleetmedic.fullname" $top }}-config
{{- if index . 1 }}
- name: signing
  secret:
    secretName: {{ include "fleetmedic.signingSecret" $top }}
    defaultMode: 0400
{{- end }}
{{- if and (gt (len .) 2) (index . 2) (include "fleetmedic.operatorSecret" $top) }}
- name: operator-keys
  secret:
    secretName: {{ include "fleetmedic.operatorSecret" $top }}
    defaultMode: 0400
{{- end }}
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "fleetmedic.metricsPort" -}}
{{ .Values.config.metrics.port | default 9108 }}
{{- end -}}

{{/* The container parts every component shares: include "fleetmedic.container" (list . true false),
     the booleans as for "fleetmedic.volumes". */}}
{{- define "fleetmedic.container" -}}
{{- $top := index . 0 -}}
image: {{ include "fleetmedic.image" $top }}
imagePullPolicy: {{ $top.Values.image.pullPolicy }}
securityContext: {{- toYaml $top.Values.securityContext | nindent 2 }}
ports:
  - {name: metrics, containerPort: {{ include "fleetmedic.metricsPort" $top }}}
volumeMounts:
  - {name: config, mountPath: /etc/fleetmedic/fleetmedic.yaml, subPath: fleetmedic.yaml, readOnly: true}
{{- if index . 1 }}
  - {name: signing, mountPath: /etc/fleetmedic/signing, readOnly: true}
{{- end }}
{{- if and (gt (len .) 2) (index . 2) (include "fleetmedic.operatorSecret" $top) }}
  # a folder, not a subPath: the kubelet updates it when the Secret changes (key rotation)
  - {name: operator-keys, mountPath: /etc/fleetmedic/operator-keys, readOnly: true}
{{- end }}
  - {name: tmp, mountPath: /tmp}
{{- end -}}

{{- define "fleetmedic.podSpecCommon" -}}
securityContext: {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
