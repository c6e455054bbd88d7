{{- define "tessera.fullname" -}}
{{- if contains "tessera" .Release.Name -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}{{- else -}}{{ printf "%s-tessera" .Release.Name | trunc 40 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{/* The image: repository:tag (the appVersion by default, what `make
images` builds), or repository@sha256:… when the tag is a digest. */}}
{{- define "tessera.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{ .Values.image.repository }}{{ if hasPrefix "sha256:" $tag }}@{{ else }}:{{ end }}{{ $tag }}
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
{{- $m := printf "r in ['%s/gpu', '%s/gpumem', '%s/gpumem-percentage', '%s/gpucores', '%s/gpumem-ceiling', '%s/gpu.shared'] || r.startsWith('%s/mig-')" $p $p $p $p $p $p $p -}}
{{- $u := printf "(has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, %s)) || (has(c.resources.requests) && c.resources.requests.exists(r, %s))))" $m $m -}}
{{- printf "object.spec.containers.exists(c, %s) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, %s)) || (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)" $u $u -}}
{{- end -}}

{{/* CEL: a ResourceClaim with a request of Tessera's DeviceClasses
(internal/webhook.ClaimMatchCondition writes the same). */}}
{{- define "tessera.claimMatchCondition" -}}
{{- $c := "['gpu.tessera.io', 'extended-resource.gpu.tessera.io', 'gpu.nvidia.com', 'nvidia-gpu']" -}}
{{- printf "has(object.spec.devices) && has(object.spec.devices.requests) && object.spec.devices.requests.exists(r, (has(r.exactly) && r.exactly.deviceClassName in %s) || (has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName in %s)))" $c $c -}}
{{- end -}}

{{/* The identities of the scheduler and the node agents (ServiceAccounts). */}}
{{- define "tessera.schedulerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "tessera.fullname" . }}-scheduler
{{- end }}
{{- define "tessera.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "tessera.fullname" . }}-node-agent
{{- end }}

{{/* CEL: a request by anyone but (index . 0) that changes annotation
(index . 1); internal/webhook.AnnotationWrittenByOthers writes the same. */}}
{{- define "tessera.writtenByOthers" -}}
{{- $user := index . 0 }}{{ $key := index . 1 -}}
!(request.userInfo.username in ['{{ $user }}']) && (object != null && has(object.metadata.annotations) && '{{ $key }}' in object.metadata.annotations ? object.metadata.annotations['{{ $key }}'] : '') != (oldObject != null && has(oldObject.metadata.annotations) && '{{ $key }}' in oldObject.metadata.annotations ? oldObject.metadata.annotations['{{ $key }}'] : '')
{{- end }}
