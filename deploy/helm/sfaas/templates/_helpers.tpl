{{/* Names, labels, the shared environment and the checks of the values. */}}

{{- define "sfaas.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name; components append "-coordinator", "-worker", … (kept short
enough that a worker pod's name and its DNS label stay under 63 characters). */}}
{{- define "sfaas.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sfaas.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sfaas.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sfaas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sfaas.labels" -}}
helm.sh/chart: {{ include "sfaas.chart" . }}
{{ include "sfaas.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "sfaas.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}

{{- define "sfaas.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sfaas.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sfaas.coordinatorService" -}}{{ include "sfaas.fullname" . }}-coordinator{{- end -}}
{{/* The headless Service of the worker and standby pods: `<pod>.<this>` is a pod's stable
DNS name, the --host it registers with. */}}
{{- define "sfaas.workerService" -}}{{ include "sfaas.fullname" . }}-workers{{- end -}}
{{- define "sfaas.secretName" -}}{{ .Values.existingSecret | default (printf "%s-secret" (include "sfaas.fullname" .)) }}{{- end -}}

{{/* Fail unless .value is a whole number >= .min, naming the value .name. */}}
{{- define "sfaas.count" -}}
{{- $ok := or (kindIs "float64" .value) (kindIs "int64" .value) (kindIs "int" .value) -}}
{{- if $ok -}}
{{- $ok = and (ge (float64 .value) (float64 .min)) (eq (float64 (int64 .value)) (float64 .value)) -}}
{{- end -}}
{{- if not $ok -}}
{{- fail (printf "%s must be a whole number >= %v (%s), got %v" .name .min .what .value) -}}
{{- end -}}
{{- end -}}

{{/* Fail with a message naming the value when the values cannot make a cluster. Included
by every template that renders a process, so `helm template` and `helm install` stop. */}}
{{- define "sfaas.validate" -}}
{{- $v := .Values -}}
{{- include "sfaas.count" (dict "name" "workers" "value" $v.workers "min" 1 "what" "primary workers, SFAAS_WORKERS") -}}
{{- include "sfaas.count" (dict "name" "standbys" "value" $v.standbys "min" 0 "what" "standbys per worker, SFAAS_STANDBYS") -}}
{{- include "sfaas.count" (dict "name" "partitions" "value" $v.partitions "min" (int64 $v.workers) "what" "SFAAS_PARTITIONS, at least workers") -}}
{{- if not (kindIs "invalid" $v.kafka.replication) -}}
{{- include "sfaas.count" (dict "name" "kafka.replication" "value" $v.kafka.replication "min" 1 "what" "topic replication factor, SFAAS_REPLICATION") -}}
{{- end -}}
{{- include "sfaas.count" (dict "name" "gateway.replicas" "value" $v.gateway.replicas "min" 0 "what" "gateway pods") -}}
{{- if and (gt (float64 $v.standbys) 0.0) (not $v.snapshotInterval) -}}
{{- fail "standbys need snapshot rounds: snapshotInterval must be > 0 when standbys > 0" -}}
{{- end -}}
{{- $module := required "app.module is required: your app as package.module:attr (SFAAS_APP), e.g. examples.bank:app" $v.app.module -}}
{{- if not (regexMatch "^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$" $module) -}}
{{- fail (printf "app.module must be package.module:attr (SFAAS_APP), e.g. examples.bank:app, got %q" $module) -}}
{{- end -}}
{{- if not (regexMatch "^[A-Za-z0-9._-]{1,100}$" (toString $v.namespace)) -}}
{{- fail (printf "namespace must be 1-100 letters, digits, '.', '_' or '-' (it names Kafka topics; SFAAS_NAMESPACE), got %q" (toString $v.namespace)) -}}
{{- end -}}
{{- $_ := required "kafka.bootstrapServers is required: the Kafka bootstrap servers, e.g. my-cluster-kafka-bootstrap:9092" $v.kafka.bootstrapServers -}}
{{- $_ := required "s3.endpoint is required: the S3/MinIO endpoint host:port (https://host:port for TLS)" $v.s3.endpoint -}}
{{- $_ := required "image.repository is required: an image built FROM the sfaas image with your app" $v.image.repository -}}
{{- if and $v.s3.existingSecret.name (not $v.s3.existingSecret.key) -}}
{{- fail "s3.existingSecret.key is required when s3.existingSecret.name is set: the key holding the S3 secret key" -}}
{{- end -}}
{{- if and $v.gateway.enabled $v.gateway.token -}}
{{- if or (lt (len $v.gateway.token) 16) (regexMatch "[^!-~]" $v.gateway.token) -}}
{{- fail (printf "gateway.token must be at least 16 printable ASCII characters without blanks (SFAAS_GATEWAY_TOKEN; it has %d characters)" (len $v.gateway.token)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* An env entry read from the chart's Secret (or existingSecret). */}}
{{- define "sfaas.secretEnv" -}}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ include "sfaas.secretName" .ctx }}
      key: {{ .key }}
{{- end -}}

{{/* The environment every coordinator and worker container shares. */}}
{{- define "sfaas.clusterEnv" -}}
{{- $v := .Values -}}
- name: SFAAS_APP
  value: {{ $v.app.module | quote }}
- name: SFAAS_KAFKA
  value: {{ $v.kafka.bootstrapServers | quote }}
- name: SFAAS_NAMESPACE
  value: {{ $v.namespace | quote }}
{{- with $v.kafka.replication }}
- name: SFAAS_REPLICATION
  value: {{ int64 . | quote }}
{{- end }}
- name: SFAAS_COORDINATOR
  value: {{ printf "%s:%v" (include "sfaas.coordinatorService" .) $v.coordinator.port | quote }}
- name: SFAAS_WORKERS
  value: {{ int64 $v.workers | quote }}
- name: SFAAS_STANDBYS
  value: {{ int64 $v.standbys | quote }}
- name: SFAAS_PARTITIONS
  value: {{ int64 $v.partitions | quote }}
- name: SFAAS_SNAPSHOT_INTERVAL
  value: {{ $v.snapshotInterval | toString | quote }}
- name: SFAAS_SNAPSHOT_RETAIN
  value: {{ $v.snapshotRetain | toString | quote }}
- name: SFAAS_LOG_LEVEL
  value: {{ $v.logLevel | quote }}
- name: SFAAS_HOME
  value: /data
- name: SFAAS_METRICS_PORT
  value: {{ $v.metrics.port | toString | quote }}
- name: SFAAS_MINIO
  value: {{ $v.s3.endpoint | quote }}
- name: SFAAS_BUCKET
  value: {{ $v.s3.bucket | quote }}
{{ include "sfaas.secretEnv" (dict "ctx" . "env" "SFAAS_SECRET" "key" "sfaas-secret") }}
{{ include "sfaas.secretEnv" (dict "ctx" . "env" "SFAAS_MINIO_ACCESS_KEY" "key" "minio-access-key") }}
{{- if $v.s3.existingSecret.name }}
- name: SFAAS_MINIO_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $v.s3.existingSecret.name }}
      key: {{ $v.s3.existingSecret.key }}
{{- else if or $v.existingSecret $v.s3.secretKey }}
{{ include "sfaas.secretEnv" (dict "ctx" . "env" "SFAAS_MINIO_SECRET_KEY" "key" "minio-secret-key") }}
{{- end }}
{{- include "sfaas.tracingEnv" . }}
{{- include "sfaas.extraEnv" . }}
{{- end -}}

{{/* Tracing's environment (tracing.enabled): SFAAS_TRACING and the standard OTEL_*
variables, the endpoint the chart's Jaeger when none is given. */}}
{{- define "sfaas.tracingEnv" -}}
{{- $t := .Values.tracing -}}
{{- if $t.enabled }}
- name: SFAAS_TRACING
  value: "1"
- name: SFAAS_TRACE_SLOW
  value: {{ $t.slow | toString | quote }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ include "sfaas.otlpEndpoint" . | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $t.sampler | quote }}
{{- with $t.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | toString | quote }}
{{- end }}
{{- with $t.jaegerUi }}
- name: SFAAS_JAEGER_UI
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "sfaas.jaegerService" -}}{{ include "sfaas.fullname" . }}-jaeger{{- end -}}
{{- define "sfaas.otlpEndpoint" -}}
{{- if .Values.tracing.otlpEndpoint -}}
{{- .Values.tracing.otlpEndpoint -}}
{{- else if .Values.tracing.jaeger.enabled -}}
{{- printf "http://%s:4318" (include "sfaas.jaegerService" .) -}}
{{- else -}}
{{- fail "tracing.enabled needs somewhere to send the spans: set tracing.otlpEndpoint, or tracing.jaeger.enabled=true" -}}
{{- end -}}
{{- end -}}

{{/* extraEnv, each value a string (as `--set extraEnv[0].value=5` gives a number). */}}
{{- define "sfaas.extraEnv" -}}
{{- range .Values.extraEnv }}
{{- if hasKey . "value" }}
- name: {{ .name }}
  value: {{ .value | toString | quote }}
{{- else }}
-{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The pod-level part shared by every sfaas pod. */}}
{{- define "sfaas.podCommon" -}}
serviceAccountName: {{ include "sfaas.serviceAccountName" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Probes on the metrics port's /metrics (what every process serves from its start). */}}
{{- define "sfaas.metricsProbes" -}}
startupProbe:
  httpGet: {path: /metrics, port: metrics}
  {{- toYaml .Values.probes.startup | nindent 2 }}
livenessProbe:
  httpGet: {path: /metrics, port: metrics}
  {{- toYaml .Values.probes.liveness | nindent 2 }}
{{- end -}}

{{/* Changes with the credentials given in the values (not with generated ones, which stay
the same across upgrades): a pod annotation, so a new credential restarts the processes. */}}
{{- define "sfaas.credentialsChecksum" -}}
{{- list .Values.existingSecret .Values.secret .Values.s3 .Values.gateway.token | toJson | sha256sum | trunc 16 -}}
{{- end -}}
