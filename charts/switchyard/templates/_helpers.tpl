{{/* Chart name, overridable. */}}
{{- define "switchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Object-name prefix: "<release>-<chart>", or the release name alone when it already contains the
chart name. Truncated to leave room for the "-operator"/"-router" suffixes within 63 characters.
*/}}
{{- define "switchyard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 53 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 53 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 53 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "switchyard.operator.fullname" -}}
{{- printf "%s-operator" (include "switchyard.fullname" .) }}
{{- end }}

{{- define "switchyard.router.fullname" -}}
{{- printf "%s-router" (include "switchyard.fullname" .) }}
{{- end }}

{{- define "switchyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "switchyard.labels" -}}
helm.sh/chart: {{ include "switchyard.chart" . }}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchyard
{{- end }}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "router"). */}}
{{- define "switchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels of one component's objects; call with (dict "ctx" $ "component" "router"). */}}
{{- define "switchyard.componentLabels" -}}
{{ include "switchyard.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "switchyard.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "switchyard.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "switchyard.router.serviceAccountName" -}}
{{- if .Values.router.serviceAccount.create }}
{{- default (include "switchyard.router.fullname" .) .Values.router.serviceAccount.name }}
{{- else }}
{{- required "router.serviceAccount.name is required when router.serviceAccount.create is false" .Values.router.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The namespace whose resources are watched (and where namespaced RBAC is granted). */}}
{{- define "switchyard.watchNamespace" -}}
{{- default .Release.Namespace .Values.watch.namespace }}
{{- end }}

{{/* Arguments that select what both processes watch. */}}
{{- define "switchyard.watchArgs" -}}
{{- if .Values.watch.allNamespaces -}}
- --all-namespaces
{{- else -}}
- --namespace={{ include "switchyard.watchNamespace" . }}
{{- end }}
{{- end }}

{{- define "switchyard.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Environment both processes get: their pod identity (outcome reports, Lease holder). */}}
{{- define "switchyard.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: RUST_LOG
  value: {{ .Values.logLevel | quote }}
{{- end }}

{{/* The one binary writes nothing but may need a scratch /tmp on a read-only root. */}}
{{- define "switchyard.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{- define "switchyard.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 16Mi
{{- end }}

{{- define "switchyard.operator.leaseName" -}}
{{- default (include "switchyard.operator.fullname" .) .Values.operator.leaseName }}
{{- end }}
