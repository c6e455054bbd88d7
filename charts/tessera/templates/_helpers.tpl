{{- define "tessera.fullname" -}}
{{- if contains "tessera" .Release.Name -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}{{- else -}}{{ printf "%s-tessera" .Release.Name | trunc 40 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "tessera.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tessera.labels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The CEL match condition of the webhooks: pods naming a GPU resource
(internal/webhook.MatchCondition; TestChartWebhookConfigurations compares). */}}
{{- define "tessera.matchCondition" -}}
{{- $p := .Values.resourcePrefix -}}
{{- $m := printf "r in ['%s/gpu', '%s/gpumem', '%s/gpumem-percentage', '%s/gpucores', '%s/gpu.shared'] || r.startsWith('%s/mig-')" $p $p $p $p $p $p -}}
{{- $u := printf "(has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, %s)) || (has(c.resources.requests) && c.resources.requests.exists(r, %s))))" $m $m -}}
{{- printf "object.spec.containers.exists(c, %s) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, %s))" $u $u -}}
{{- end -}}
