{{/*
The learner pod, shared by the StatefulSet (learners.mode: statefulset) and the Indexed Job
(learners.mode: job). Included at the pod template's place: `include "gradientmail.learnerPod" . | nindent 4`.
*/}}
{{- define "gradientmail.learnerPod" -}}
{{- $fullname := include "gradientmail.fullname" . -}}
{{- $job := eq .Values.learners.mode "job" -}}
{{- range .Values.learners.extraEnv }}
{{- if has .name (list "GRADIENTMAIL_RUN_KEY" "GRADIENTMAIL_RUN_KEY_FILE") }}
{{- fail (printf "learners.extraEnv: %s is the run key; the chart gives it from a Secret: set runKey.existingSecret and runKey.existingSecretKey instead" .name) }}
{{- else if hasPrefix "GRADIENTMAIL_" .name }}
{{- fail (printf "learners.extraEnv: %s is a node setting; set it as settings.%s instead" .name (lower (trimPrefix "GRADIENTMAIL_" .name))) }}
{{- else if and $job (eq .name "JOB_COMPLETION_INDEX") }}
{{- fail "learners.extraEnv: JOB_COMPLETION_INDEX is the learner's index in job mode; the chart sets it" }}
{{- end }}
{{- end }}
{{- if and .Values.script.configMap .Values.script.content }}
{{- fail "script: set script.configMap (your ConfigMap) or script.content (the chart makes one), not both" }}
{{- end }}
{{- $gpus := int .Values.gpu.count -}}
{{- if and (gt $gpus 1) (not .Values.learners.torchrun) }}
{{- fail (printf "gpu.count: %d gives each learner %d GPUs, but its job trains on one: set learners.torchrun: true with a script that wraps its model in DDP (examples/torchrun_learner.py), or gpu.count: 1" $gpus $gpus) }}
{{- end }}
{{- if and .Values.learners.torchrun (lt $gpus 2) }}
{{- fail "learners.torchrun runs one rank per GPU: it needs gpu.count of 2 or more" }}
{{- end }}
{{- if and .Values.learners.torchrun (not (or .Values.script.configMap .Values.script.content)) (not .Values.settings.entrypoint) }}
{{- fail "learners.torchrun needs a training script whose model is wrapped in DDP (script.content, script.configMap or settings.entrypoint): the default job trains on one device" }}
{{- end }}
metadata:
  labels:
    {{- include "gradientmail.labels" . | nindent 4 }}
    app.kubernetes.io/component: learner
    gradientmail.io/node: "true"
    {{- with .Values.learners.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/settings: {{ toJson .Values.settings | sha256sum | trunc 16 }}
    {{- if .Values.script.content }}
    checksum/script: {{ .Values.script.content | sha256sum | trunc 16 }}
    {{- end }}
    {{- with .Values.learners.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- if $job }}
  # exit 0 completes this learner's index; other exits fail the pod and the Job's
  # podFailurePolicy decides: 2 and 3 fail the whole Job, anything else gets a new pod
  restartPolicy: Never
  {{- end }}
  serviceAccountName: {{ include "gradientmail.serviceAccountName" . }}
  automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
  terminationGracePeriodSeconds: {{ .Values.learners.terminationGracePeriodSeconds }}
  {{- with .Values.learners.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- with .Values.learners.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.learners.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.learners.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.learners.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: learner
      image: {{ include "gradientmail.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      {{- if .Values.learners.torchrun }}
      # one rank per GPU; every rank runs `gradientmail node`, rank 0 is the run's learner
      command: ["torchrun"]
      args: ["--standalone", "--nproc-per-node", "{{ $gpus }}", "--no-python", "gradientmail", "node"]
      {{- else }}
      args: ["node"]
      {{- end }}
      ports:
        - name: metrics
          containerPort: {{ .Values.metrics.port }}
          protocol: TCP
      env:
        - name: GRADIENTMAIL_MAILBOX
          value: {{ include "gradientmail.mailboxUrl" . | quote }}
        {{- if $job }}
        # the Job's completion index (0 … learners-1): the learner id is <fullname>-<index>, the
        # names a StatefulSet's pods have, and a retried pod of the same index keeps it
        - name: JOB_COMPLETION_INDEX
          valueFrom:
            fieldRef:
              fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
        - name: GRADIENTMAIL_LEARNER_ID
          value: {{ printf "%s-$(JOB_COMPLETION_INDEX)" $fullname | quote }}
        {{- else }}
        - name: GRADIENTMAIL_LEARNER_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- end }}
        - name: GRADIENTMAIL_METRICS_PORT
          value: {{ .Values.metrics.port | quote }}
        {{- if or .Values.script.configMap .Values.script.content }}
        - name: GRADIENTMAIL_SCRIPT
          value: {{ printf "/opt/gradientmail-script/%s" .Values.script.key | quote }}
        {{- end }}
        {{- range $name, $value := .Values.settings }}
        {{- if not (kindIs "invalid" $value) }}
        - name: {{ printf "GRADIENTMAIL_%s" (upper $name) }}
          value: {{ $value | toString | quote }}
        {{- end }}
        {{- end }}
        {{- include "gradientmail.secretEnv" . | nindent 8 }}
        {{- if and .Values.learners.state.enabled (not .Values.settings.state_dir) }}
        # the learner state's volume (learners.state): a restarted or retried learner resumes
        - name: GRADIENTMAIL_STATE_DIR
          value: {{ .Values.learners.state.mountPath | quote }}
        {{- end }}
        # the root filesystem is read-only: caches and temporary files go to the emptyDir
        - name: HOME
          value: /tmp
        {{- with .Values.learners.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      # the node's own metrics endpoint answers while the process is alive and not wedged
      # (gradientmail/node.py); the startup probe allows for loading data and joining
      startupProbe:
        httpGet:
          path: /metrics
          port: metrics
        periodSeconds: 5
        failureThreshold: 60
      readinessProbe:
        httpGet:
          path: /metrics
          port: metrics
        periodSeconds: 15
        timeoutSeconds: 5
      livenessProbe:
        httpGet:
          path: /metrics
          port: metrics
        periodSeconds: 30
        timeoutSeconds: 10
        failureThreshold: 4
      resources:
        {{- $resources := deepCopy (.Values.learners.resources | default dict) }}
        {{- if gt (int .Values.gpu.count) 0 }}
        {{- $_ := set $resources "requests" (merge (dict .Values.gpu.resourceName (int .Values.gpu.count)) ($resources.requests | default dict)) }}
        {{- $_ := set $resources "limits" (merge (dict .Values.gpu.resourceName (int .Values.gpu.count)) ($resources.limits | default dict)) }}
        {{- end }}
        {{- toYaml $resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if .Values.learners.shm.enabled }}
        - name: shm
          mountPath: /dev/shm
        {{- end }}
        {{- if .Values.learners.state.enabled }}
        - name: state
          mountPath: {{ .Values.learners.state.mountPath }}
        {{- end }}
        {{- if or .Values.script.configMap .Values.script.content }}
        - name: script
          mountPath: /opt/gradientmail-script
          readOnly: true
        {{- end }}
        {{- with .Values.learners.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {}
    {{- if .Values.learners.shm.enabled }}
    # shared memory for data-loader workers (PyTorch DataLoader num_workers > 0): the
    # runtime's default /dev/shm is 64 MiB; this one is RAM, counted against the memory limit
    - name: shm
      emptyDir:
        medium: Memory
        {{- with .Values.learners.shm.sizeLimit }}
        sizeLimit: {{ . }}
        {{- end }}
    {{- end }}
    {{- if and .Values.learners.state.enabled (or .Values.learners.state.existingClaim (eq .Values.learners.mode "job")) }}
    # the learner state (learners.state): one claim every learner shares, each its own file
    - name: state
      persistentVolumeClaim:
        claimName: {{ .Values.learners.state.existingClaim | default (printf "%s-state" $fullname) }}
    {{- end }}
    {{- if or .Values.script.configMap .Values.script.content }}
    - name: script
      configMap:
        name: {{ .Values.script.configMap | default (printf "%s-script" $fullname) }}
        items:
          - key: {{ .Values.script.key }}
            path: {{ .Values.script.key }}
    {{- end }}
    {{- with .Values.learners.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
