{{/* The chart's name, truncated to the 63 characters a label allows. */}}
{{- define "arbiter.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: the release name, with the chart's unless it contains it. */}}
{{- define "arbiter.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the daemon's pods; they never change across upgrades. */}}
{{- define "arbiter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "arbiter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "arbiter.labels" -}}
{{ include "arbiter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: node-daemon
app.kubernetes.io/part-of: arbiter
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The service account the daemon runs as. */}}
{{- define "arbiter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "arbiter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The daemon's image. */}}
{{- define "arbiter.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Paths inside the container. */}}
{{- define "arbiter.configPath" -}}/etc/arbiter/config.yaml{{- end -}}
{{- define "arbiter.policyDir" -}}/etc/arbiter/policy.d{{- end -}}
{{- define "arbiter.bundleKeyDir" -}}/etc/arbiter/bundle-key{{- end -}}
{{- define "arbiter.bundleTokenDir" -}}/etc/arbiter/bundle-token{{- end -}}
{{- define "arbiter.tlsDir" -}}/etc/arbiter/tls{{- end -}}
{{- define "arbiter.socketPath" -}}/var/lib/kubelet/pod-resources/kubelet.sock{{- end -}}

{{/*
The security context of the daemon and of its recover step: capabilities
instead of privileged, every other capability dropped.
*/}}
{{- define "arbiter.securityContext" -}}
privileged: false
runAsUser: 0
runAsNonRoot: false
readOnlyRootFilesystem: true
{{- if .Values.capabilities.sysAdmin }}
# Kubernetes refuses allowPrivilegeEscalation: false next to CAP_SYS_ADMIN.
allowPrivilegeEscalation: true
appArmorProfile:
  type: Unconfined
{{- else }}
allowPrivilegeEscalation: false
{{- end }}
seccompProfile:
  {{- toYaml .Values.seccompProfile | nindent 2 }}
capabilities:
  drop: [ALL]
  add:
    {{- range .Values.capabilities.add }}
    - {{ . }}
    {{- end }}
    {{- if .Values.capabilities.sysAdmin }}
    - SYS_ADMIN
    {{- end }}
{{- end -}}

{{/* Mounts shared by the daemon and its recover step. */}}
{{- define "arbiter.hostMounts" -}}
- name: bpffs
  mountPath: {{ .Values.bpffs.hostPath }}
  mountPropagation: HostToContainer
- name: state
  mountPath: {{ .Values.stateDir }}
{{- end -}}
