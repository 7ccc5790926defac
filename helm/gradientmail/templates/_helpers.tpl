{{/* Names and labels. */}}
{{- define "gradientmail.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gradientmail.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gradientmail.labels" -}}
app.kubernetes.io/name: {{ include "gradientmail.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gradientmail.learnerSelector" -}}
app.kubernetes.io/name: {{ include "gradientmail.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: learner
{{- end -}}

{{/* Every GradientMail node pod, learner or dedicated syncer: what the metrics Service and the
network policies select (the workloads select by component). */}}
{{- define "gradientmail.nodeSelector" -}}
app.kubernetes.io/name: {{ include "gradientmail.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
gradientmail.io/node: "true"
{{- end -}}

{{/* The dedicated syncer's image: the CPU flavour unless an image is pinned by digest or tag. */}}
{{- define "gradientmail.syncerImage" -}}
{{- $repository := .Values.image.repository -}}
{{- with .Values.image.registry }}{{ $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}{{ end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default (printf "%s-cpu" .Chart.AppVersion)) -}}
{{- end -}}
{{- end -}}

{{- define "gradientmail.minioSelector" -}}
app.kubernetes.io/name: {{ include "gradientmail.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: mailbox
{{- end -}}

{{- define "gradientmail.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gradientmail.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The learner image: [registry/]repository:tag, the tag <appVersion>-<flavor> unless given
(flavor "" is cuda when learners request GPUs, else cpu), or repository@digest. */}}
{{- define "gradientmail.flavor" -}}
{{- .Values.image.flavor | default (ternary "cuda" "cpu" (gt (int .Values.gpu.count) 0)) -}}
{{- end -}}

{{- define "gradientmail.image" -}}
{{- $repository := .Values.image.repository -}}
{{- with .Values.image.registry }}{{ $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}{{ end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion (include "gradientmail.flavor" .)) -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end -}}

{{/* MINIO_ROOT_USER and MINIO_ROOT_PASSWORD from the in-chart server's root Secret (setup steps only). */}}
{{- define "gradientmail.minioRootEnv" -}}
- name: MINIO_ROOT_USER
  valueFrom:
    secretKeyRef:
      name: {{ include "gradientmail.minioSecret" . }}
      key: rootUser
- name: MINIO_ROOT_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "gradientmail.minioSecret" . }}
      key: rootPassword
{{- end -}}

{{/* An S3 server's image, repository:tag, pinned by @digest when one is given. */}}
{{- define "gradientmail.pinnedImage" -}}
{{- printf "%s:%s" .repository (toString .tag) -}}
{{- with .digest }}{{ printf "@%s" . }}{{ end -}}
{{- end -}}

{{- define "gradientmail.minioName" -}}
{{- printf "%s-minio" (include "gradientmail.fullname" .) -}}
{{- end -}}

{{- define "gradientmail.minioSecret" -}}
{{- .Values.minio.existingSecret | default (include "gradientmail.minioName" .) -}}
{{- end -}}

{{/* The learners' scoped MinIO user's keys (minio.yaml): AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY. */}}
{{- define "gradientmail.minioLearnerSecret" -}}
{{- printf "%s-minio-learner" (include "gradientmail.fullname" .) -}}
{{- end -}}

{{/* The mailbox URL every learner gets (gradientmail/mailbox/url.py). */}}
{{- define "gradientmail.mailboxUrl" -}}
{{- $m := .Values.mailbox -}}
{{- $query := list -}}
{{- if .Values.minio.enabled -}}
{{- $query = append $query (printf "endpoint=http://%s:9000" (include "gradientmail.minioName" .)) -}}
{{- $query = append $query "addressing=path" -}}
{{- else -}}
{{- with $m.endpoint }}{{ $query = append $query (printf "endpoint=%s" .) }}{{ end -}}
{{- with $m.addressing }}{{ $query = append $query (printf "addressing=%s" .) }}{{ end -}}
{{- end -}}
{{- with $m.region }}{{ $query = append $query (printf "region=%s" .) }}{{ end -}}
{{- printf "s3://%s/%s" $m.bucket (trimAll "/" $m.prefix) -}}
{{- if $query }}?{{ join "&" $query }}{{ end -}}
{{- end -}}

{{/* The Secret holding the run key (docs/deploy.md#run-key), and the key inside it. */}}
{{- define "gradientmail.runKeySecret" -}}
{{- .Values.runKey.existingSecret | default (printf "%s-run-key" (include "gradientmail.fullname" .)) -}}
{{- end -}}

{{- define "gradientmail.runKeySecretKey" -}}
{{- ternary .Values.runKey.existingSecretKey "run-key" (ne .Values.runKey.existingSecret "") -}}
{{- end -}}

{{/* The store's credentials and the run key, as env entries of a node container (learners and
the dedicated syncer): from Secrets only, never as values. */}}
{{- define "gradientmail.secretEnv" -}}
{{- if or .Values.minio.enabled .Values.mailbox.existingSecret }}
# with the in-chart MinIO: the scoped user's keys (minio.yaml), never MinIO's root keys
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      {{- if .Values.minio.enabled }}
      name: {{ include "gradientmail.minioLearnerSecret" . }}
      key: AWS_ACCESS_KEY_ID
      {{- else }}
      name: {{ .Values.mailbox.existingSecret }}
      key: {{ .Values.mailbox.accessKeyIdKey }}
      {{- end }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      {{- if .Values.minio.enabled }}
      name: {{ include "gradientmail.minioLearnerSecret" . }}
      key: AWS_SECRET_ACCESS_KEY
      {{- else }}
      name: {{ .Values.mailbox.existingSecret }}
      key: {{ .Values.mailbox.secretAccessKeyKey }}
      {{- end }}
{{- end }}
{{- if .Values.runKey.enabled }}
# the run key: every record is signed with it (docs/deploy.md#run-key)
- name: GRADIENTMAIL_RUN_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "gradientmail.runKeySecret" . }}
      key: {{ include "gradientmail.runKeySecretKey" . }}
{{- end }}
{{- end -}}
