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
{{- $rw := .Values.connectors.remoteWrite -}}
{{- if include "fleetmedic.runs" (list . "remoteWrite") -}}
{{- $receiver := dict "allow_unauthenticated" (and $rw.allowUnauthenticated (not $rw.auth.existingSecret)) -}}
{{- if $rw.auth.existingSecret -}}
{{- $dir := "/etc/fleetmedic/remote-write/" -}}
{{- $tls := dict "cert_file" (print $dir "tls.crt") "key_file" (print $dir "tls.key") -}}
{{- if $rw.auth.clientCertificates -}}
{{- $_ := set $tls "client_ca_file" (print $dir "ca.crt") -}}
{{- end -}}
{{- $_ := set $receiver "tls" $tls -}}
{{- $_ := set $receiver "auth" (dict "bearer_tokens_file" (print $dir "tokens")) -}}
{{- end -}}
{{- $_ := set $defaults "exporters" (dict "remote_write" $receiver) -}}
{{- end -}}
{{- with .Values.decide.admission -}}
{{- if .enabled -}}
{{- $_ := set $defaults "admission" (dict "enabled" true "listen" (printf "0.0.0.0:%v" .port)
      "cert_file" "/etc/fleetmedic/admission/tls.crt" "key_file" "/etc/fleetmedic/admission/tls.key") -}}
{{- end -}}
{{- end -}}
{{- $defaults = mustMergeOverwrite $defaults (include "fleetmedic.sourceConfig" . | fromJson) -}}
{{- with .Values.clusterName -}}
{{- $given := (($.Values.config | default dict).cluster | default dict).name | default "" -}}
{{- if and $given (ne $given .) -}}
{{- fail (printf "clusterName %q and config.cluster.name %q differ: set one of them" . $given) -}}
{{- end -}}
{{- $_ := set $defaults "cluster" (dict "name" .) -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $defaults (deepCopy .Values.config)) -}}
{{- end -}}

{{/* Pod volumes: include "fleetmedic.volumes" (dict "top" . "signing" true "operator" false "volumes" (list ...))
     - signing: whether the component gets the command key (decide signs, the executor verifies;
     nothing else needs it); operator: whether it gets the operator keys (decide only: it verifies
     operator commands); volumes: the component's own extra volumes. */}}
{{- define "fleetmedic.volumes" -}}
{{- $top := .top -}}
- name: config
  configMap:
    name: {{ include "fleetmedic.fullname" $top }}-config
{{- if .signing }}
- name: signing
  secret:
    secretName: {{ include "fleetmedic.signingSecret" $top }}
    defaultMode: 0400
{{- end }}
{{- if and .operator (include "fleetmedic.operatorSecret" $top) }}
- name: operator-keys
  secret:
    secretName: {{ include "fleetmedic.operatorSecret" $top }}
    defaultMode: 0400
{{- end }}
- name: tmp
  emptyDir: {}
{{- with .volumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "fleetmedic.metricsPort" -}}
{{ .Values.config.metrics.port | default 9108 }}
{{- end -}}

{{/* The container parts every component shares: include "fleetmedic.container" (dict "top" .
     "signing" true "operator" false "ports" (list ...) "mounts" (list ...) "securityContext" (dict ...)),
     signing and operator as for "fleetmedic.volumes"; ports and mounts: the component's own extra
     container ports and volume mounts; securityContext: replaces the chart-wide one (kmsg only).
     Every container serves /metrics, /healthz and /readyz on the `metrics` port (the worker once its
     state is prepared; fleetmedic/serving.py): liveness asks /healthz (an event loop that stopped
     turning fails it), readiness /readyz, and liveness counts only after the startup probe passed. */}}
{{- define "fleetmedic.container" -}}
{{- $top := .top -}}
image: {{ include "fleetmedic.image" $top }}
imagePullPolicy: {{ $top.Values.image.pullPolicy }}
securityContext: {{- toYaml (.securityContext | default $top.Values.securityContext) | nindent 2 }}
ports:
  - {name: metrics, containerPort: {{ include "fleetmedic.metricsPort" $top }}}
{{- with .ports }}
{{ toYaml . | indent 2 }}
{{- end }}
volumeMounts:
  - {name: config, mountPath: /etc/fleetmedic/fleetmedic.yaml, subPath: fleetmedic.yaml, readOnly: true}
{{- if .signing }}
  - {name: signing, mountPath: /etc/fleetmedic/signing, readOnly: true}
{{- end }}
{{- if and .operator (include "fleetmedic.operatorSecret" $top) }}
  # a folder, not a subPath: the kubelet updates it when the Secret changes (key rotation)
  - {name: operator-keys, mountPath: /etc/fleetmedic/operator-keys, readOnly: true}
{{- end }}
  - {name: tmp, mountPath: /tmp}
{{- with .mounts }}
{{ toYaml . | indent 2 }}
{{- end }}
{{- with $top.Values.probes.startup }}
startupProbe:
  httpGet: {path: /healthz, port: metrics}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $top.Values.probes.readiness }}
readinessProbe:
  httpGet: {path: /readyz, port: metrics}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $top.Values.probes.liveness }}
livenessProbe:
  httpGet: {path: /healthz, port: metrics}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "fleetmedic.podSpecCommon" -}}
securityContext: {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The components this release runs (a JSON list of their names, the app.kubernetes.io/component
     label): the Services and NetworkPolicies are made for exactly these. */}}
{{- define "fleetmedic.components" -}}
{{- $c := list "detect" "decide" -}}
{{- if .Values.executor.enabled }}{{ $c = append $c "executor" }}{{ end -}}
{{- if include "fleetmedic.runs" (list . "nvml") }}{{ $c = append $c "nvml-exporter" }}{{ end -}}
{{- if .Values.jobWatcher.enabled }}{{ $c = append $c "job-watcher" }}{{ end -}}
{{- range $key, $component := include "fleetmedic.connectorComponents" . | fromJson }}
{{- if include "fleetmedic.runs" (list $ $key) }}{{ $c = append $c $component }}{{ end -}}
{{- end -}}
{{- toJson $c -}}
{{- end -}}

{{/* connectors.<key> -> the component (and object name suffix) it runs as */}}
{{- define "fleetmedic.connectorComponents" -}}
{{- toJson (dict "prometheus" "prometheus-exporter" "kafka" "kafka-exporter" "logs" "logs-exporter"
                 "infiniband" "infiniband-exporter" "kmsg" "kmsg-exporter" "remoteWrite" "remote-write") -}}
{{- end -}}

{{/* --- where GPU telemetry comes from (telemetry.source) ------------------------------------------
     One switch turns on what each source needs:
       nvml           the NVML exporter DaemonSet (nvmlExporter)
       dcgm-exporter  the Prometheus connector scraping the dcgm-exporter pods it discovers through
                      the API server (a ServiceAccount that may list and watch pods, egress to the
                      API server and to those pods)
       remote-write   the remote-write receiver (connectors.remoteWrite)
       kafka          the Kafka telemetry connector (connectors.kafka)
     connectors.<name>.enabled still turns a connector on beside the source. */}}
{{- define "fleetmedic.telemetrySources" -}}
{{- toJson (list "nvml" "dcgm-exporter" "remote-write" "kafka") -}}
{{- end -}}

{{/* Whether a component runs: include "fleetmedic.runs" (list . "prometheus") is "true" or "".
     The key is "nvml" or a key of connectors. */}}
{{- define "fleetmedic.runs" -}}
{{- $top := index . 0 -}}
{{- $key := index . 1 -}}
{{- $source := ($top.Values.telemetry | default dict).source | default "nvml" -}}
{{- if not (has $source (include "fleetmedic.telemetrySources" $top | fromJsonArray)) -}}
{{- fail (printf "telemetry.source: %q is none of nvml, dcgm-exporter, remote-write, kafka" $source) -}}
{{- end -}}
{{- if eq $key "nvml" -}}
{{- if and $top.Values.nvmlExporter.enabled (eq $source "nvml") }}true{{ end -}}
{{- else -}}
{{- $bySource := dict "prometheus" "dcgm-exporter" "remoteWrite" "remote-write" "kafka" "kafka" -}}
{{- if or (index $top.Values.connectors $key).enabled (eq $source (get $bySource $key)) }}true{{ end -}}
{{- end -}}
{{- end -}}

{{/* Whether the Prometheus connector finds its targets through the API server (pod discovery):
     telemetry.source dcgm-exporter, or config.exporters.prometheus.discovery.enabled. */}}
{{- define "fleetmedic.discovers" -}}
{{- if include "fleetmedic.runs" (list . "prometheus") -}}
{{- $exporters := .Values.config.exporters | default dict -}}
{{- $prom := $exporters.prometheus | default dict -}}
{{- $discovery := $prom.discovery | default dict -}}
{{- if or (eq (.Values.telemetry.source | default "nvml") "dcgm-exporter") $discovery.enabled }}true{{ end -}}
{{- end -}}
{{- end -}}

{{/* The config the telemetry source needs (the user's `config` overrides it): for dcgm-exporter,
     the Prometheus connector in scrape mode with pod discovery of the dcgm-exporter pods. */}}
{{- define "fleetmedic.sourceConfig" -}}
{{- $d := .Values.telemetry.dcgmExporter -}}
{{- if eq (.Values.telemetry.source | default "nvml") "dcgm-exporter" -}}
{{- $selector := list -}}
{{- range $k, $v := $d.podLabels }}{{ $selector = append $selector (printf "%s=%s" $k $v) }}{{ end -}}
{{- $discovery := dict "enabled" true "in_cluster" true "namespace" $d.namespace
      "label_selector" (join "," $selector) "port_name" $d.portName -}}
{{- toJson (dict "exporters" (dict "prometheus" (dict "mode" "scrape" "discovery" $discovery))) -}}
{{- else -}}
{{- toJson dict -}}
{{- end -}}
{{- end -}}
