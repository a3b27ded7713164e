{{/* Names and labels. */}}
{{- define "pitlab.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pitlab.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The name of an object outside the release's namespace (cluster-scoped: ClusterRole, ClusterRoleBinding,
ClusterTrainingRuntime; or in a watched namespace: Role, RoleBinding), which another release of the chart, of the
same name in another namespace, may also create: "<base>.<release namespace>". A namespace has no dots, so two
releases never get the same name; longer than 63 characters, it is cut and ends in a hash of the whole name.
Call with (list $ "<base>"). */}}
{{- define "pitlab.scopedName" -}}
{{- $ctx := index . 0 -}}
{{- $full := printf "%s.%s" (index . 1) $ctx.Release.Namespace -}}
{{- if le (len $full) 63 -}}
{{- $full -}}
{{- else -}}
{{- printf "%s-%s" (regexReplaceAll "[-.]+$" (trunc 54 $full) "") (sha256sum $full | trunc 8) -}}
{{- end -}}
{{- end -}}

{{/* The ClusterRole and ClusterRoleBinding of this release (and its Roles and RoleBindings in watched namespaces). */}}
{{- define "pitlab.rbacName" -}}
{{- include "pitlab.scopedName" (list . (include "pitlab.fullname" .)) -}}
{{- end -}}

{{/* The ClusterTrainingRuntime of this release: trainingRuntime.name, else "<fullname>-torch.<namespace>". */}}
{{- define "pitlab.trainingRuntimeName" -}}
{{- .Values.trainingRuntime.name | default (include "pitlab.scopedName" (list . (printf "%s-torch" (include "pitlab.fullname" .)))) -}}
{{- end -}}

{{/* The names of .Values.imagePullSecrets, comma-separated (the operator's PITLAB_IMAGE_PULL_SECRETS). */}}
{{- define "pitlab.imagePullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{- define "pitlab.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pitlab.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "pitlab.labels" -}}
{{ include "pitlab.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: pitlab
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "pitlab.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pitlab.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: with serviceAccount.create=false, name the existing ServiceAccount the operator runs as (the chart binds its ClusterRole to it; it would otherwise bind the namespace's default account)" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The rules of the resources the operator reconciles and creates (pitlab/operator/rbac.py: NAMESPACED_RULES). */}}
{{- define "pitlab.namespacedRules" -}}
- apiGroups: ["pitlab.io"]
  resources: ["pittrainings"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["pitlab.io"]
  resources: ["leakageevals"]
  verbs: ["get", "list", "watch", "patch", "create"]
- apiGroups: ["pitlab.io"]
  resources: ["pittrainings/status", "leakageevals/status"]
  verbs: ["patch"]
- apiGroups: ["pitlab.io"]
  resources: ["pittrainings/finalizers", "leakageevals/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "create"]
- apiGroups: ["kubeflow.org"]
  resources: ["pytorchjobs"]
  verbs: ["get", "create"]
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["trainjobs"]
  verbs: ["get", "create"]
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["get", "create"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
{{- end -}}

{{/* Cluster-scoped reads kopf needs to discover resources (pitlab/operator/rbac.py: CLUSTER_RULES). */}}
{{- define "pitlab.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["clustertrainingruntimes"]
  verbs: ["get"]
{{- end -}}

{{/* The training backend values, checked (pitlab/operator/config.py: TRAINING_BACKENDS). */}}
{{- define "pitlab.trainingBackend" -}}
{{- $b := toString .Values.trainingBackend -}}
{{- if not (has $b (list "auto" "trainjob" "jobset" "pytorchjob")) -}}
{{- fail (printf "trainingBackend: must be one of auto, trainjob, jobset, pytorchjob (got %q)" $b) -}}
{{- end -}}
{{- $b -}}
{{- end -}}

{{/* Whether to render the ClusterTrainingRuntime: trainingRuntime.install true; or auto when the cluster serves
ClusterTrainingRuntimes or trainingBackend is trainjob. */}}
{{- define "pitlab.installRuntime" -}}
{{- $install := toString .Values.trainingRuntime.install -}}
{{- if not (has $install (list "auto" "true" "false")) -}}
{{- fail (printf "trainingRuntime.install: must be one of auto, true, false (got %q)" $install) -}}
{{- end -}}
{{- $served := .Capabilities.APIVersions.Has "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime" -}}
{{- if or (eq $install "true") (and (eq $install "auto") (or $served (eq (include "pitlab.trainingBackend" .) "trainjob"))) -}}
true
{{- end -}}
{{- end -}}

{{/* The pod security context of every pod the operator creates (pitlab/operator/builders.py: _pod_spec). */}}
{{- define "pitlab.workloadPodSecurity" -}}
runAsNonRoot: true
runAsUser: 1000
runAsGroup: 1000
fsGroup: 1000
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The container security context of every container the operator creates (builders.py: _container). */}}
{{- define "pitlab.workloadContainerSecurity" -}}
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The variables every container the operator creates gets (builders.py: env_list). */}}
{{- define "pitlab.workloadEnv" -}}
- name: PITLAB_DATA_ROOT
  value: {{ .Values.storage.dataRoot | quote }}
- name: PYTHONUNBUFFERED
  value: "1"
- name: HOME
  value: /tmp
{{- $kc := .Values.storage.kernelCache | default "none" | toString }}
{{- if ne (lower $kc) "none" }}
{{- $root := clean (ternary $kc (printf "%s/%s" .Values.storage.mountPath $kc) (isAbs $kc)) }}
- name: TRITON_CACHE_DIR
  value: {{ printf "%s/triton" $root | quote }}
- name: TORCHINDUCTOR_CACHE_DIR
  value: {{ printf "%s/inductor" $root | quote }}
{{- end }}
{{- end -}}
