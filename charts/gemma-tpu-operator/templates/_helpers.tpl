{{- define "gemma-tpu-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gemma-tpu-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gemma-tpu-operator.labels" -}}
{{ include "gemma-tpu-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gemma-tpu
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gemma-tpu-operator.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "gemma-tpu-operator.fullname" .) -}}
{{- end -}}

{{/* Where the workloads' ServiceAccounts are created: where the CRs are expected to live. */}}
{{- define "gemma-tpu-operator.workloadNamespaces" -}}
{{- toJson (default (default (list .Release.Namespace) .Values.watchNamespaces) .Values.workloads.namespaces) -}}
{{- end -}}

{{- define "gemma-tpu-operator.leaseName" -}}
{{- printf "%s-leader" (include "gemma-tpu-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* OperatorSettings as the operator reads them, the workloads' ServiceAccounts wired in. */}}
{{- define "gemma-tpu-operator.settings" -}}
{{- $settings := deepCopy .Values.settings -}}
{{- range $role, $setting := dict "training" "training_service_account" "serving" "serving_service_account" -}}
{{- if not (hasKey $settings $setting) -}}
{{- $_ := set $settings $setting (index $.Values.workloads $role).serviceAccount.name -}}
{{- end -}}
{{- end -}}
{{- toYaml $settings -}}
{{- end -}}

{{/* The RBAC rules, generated from the operator's table of API calls (make manifests). */}}
{{- define "gemma-tpu-operator.rules" -}}
{{- .Files.Get "files/rbac-rules.yaml" | fromYaml | toJson -}}
{{- end -}}
