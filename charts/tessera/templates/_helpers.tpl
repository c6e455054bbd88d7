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

{{/* CEL: container c names a GPU resource in its limits or requests,
Volcano's vGPU resources included (internal/webhook.gpuUses). */}}
{{- define "tessera.gpuUses" -}}
{{- $p := .Values.resourcePrefix -}}
{{- $m := printf "r in ['%s/gpu', '%s/gpumem', '%s/gpumem-percentage', '%s/gpucores', '%s/gpumem-ceiling', '%s/gpu.shared', 'volcano.sh/vgpu-number', 'volcano.sh/vgpu-memory', 'volcano.sh/vgpu-memory-percentage', 'volcano.sh/vgpu-cores'] || r.startsWith('%s/mig-')" $p $p $p $p $p $p $p -}}
{{- printf "(has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, %s)) || (has(c.resources.requests) && c.resources.requests.exists(r, %s))))" $m $m -}}
{{- end -}}

{{/* The CEL match condition of the webhooks: pods naming a GPU resource or
using ResourceClaims, and where the environment selects devices (envvar)
pods setting or importing a device-selecting variable
(internal/webhook.MatchCondition, DeviceEnvCondition;
TestChartWebhookConfigurations compares). */}}
{{- define "tessera.matchCondition" -}}
{{- $u := include "tessera.gpuUses" . -}}
{{- printf "object.spec.containers.exists(c, %s) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, %s)) || (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)" $u $u -}}
{{- if eq .Values.nodeAgent.deviceListStrategy "envvar" -}}
{{- $set := "['NVIDIA_VISIBLE_DEVICES', 'NVIDIA_MIG_CONFIG_DEVICES', 'NVIDIA_MIG_MONITOR_DEVICES', 'NVIDIA_IMEX_CHANNELS']" -}}
{{- $s := printf "((has(c.env) && c.env.exists(e, e.name in %s)) || (has(c.envFrom) && c.envFrom.exists(f, !has(f.prefix) || %s.exists(n, n.startsWith(f.prefix) && n != f.prefix))))" $set $set -}}
{{- printf " || object.spec.containers.exists(c, %s) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, %s)) || (has(object.spec.ephemeralContainers) && object.spec.ephemeralContainers.exists(c, %s))" $s $s $s -}}
{{- end -}}
{{- end -}}

{{/* CEL: a workload whose pod template names a GPU resource
(internal/webhook.TemplateMatchCondition). */}}
{{- define "tessera.templateMatchCondition" -}}
{{- $u := include "tessera.gpuUses" . -}}
{{- $out := list -}}
{{- range $path := list (list "object" "spec" "template" "spec") (list "object" "spec" "jobTemplate" "spec" "template" "spec") (list "object" "template" "spec") -}}
{{- $has := list -}}
{{- range $i, $_ := $path -}}{{- if gt $i 0 -}}{{- $has = append $has (printf "has(%s)" (join "." (slice $path 0 (add $i 1)))) -}}{{- end -}}{{- end -}}
{{- $s := join "." $path -}}
{{- $out = append $out (printf "(%s && has(%s.containers) && (%s.containers.exists(c, %s) || (has(%s.initContainers) && %s.initContainers.exists(c, %s))))" (join " && " $has) $s $s $u $s $s $u) -}}
{{- end -}}
{{- join " || " $out -}}
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
