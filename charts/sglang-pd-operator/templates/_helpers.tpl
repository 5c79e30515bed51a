{{/* Names, labels and the RBAC rules shared by the ClusterRole and the per-namespace Roles. */}}

{{- define "sglang-pd-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sglang-pd-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sglang-pd-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sglang-pd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sglang-pd-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sglang-pd-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sglang-pd-operator
{{- end }}

{{- define "sglang-pd-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sglang-pd-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sglang-pd-operator.leaseName" -}}
{{- default (include "sglang-pd-operator.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{- define "sglang-pd-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The permissions the operator needs where PDDeployments live: a ClusterRole (watchNamespaces
empty) or one Role per watched namespace. tests/unit/test_chart_rbac.py derives the same
set from the code (reconcilers, render, handlers) and fails when they differ either way.
*/}}
{{- define "sglang-pd-operator.workloadRules" -}}
# The operator keeps an in-memory view of its objects: kopf lists and watches each kind below
# (children with the label selector app.kubernetes.io/managed-by=sglang-pd-operator), and the
# control loop lists each kind once at start and every sweep period; reconciles read that view.
# PDDeployments: listed and watched.
- apiGroups: [pd.sglang-operator.io]
  resources: [pddeployments]
  verbs: [get, list, watch]
# KernelBuilds: listed and watched; kernels.cache: auto creates missing ones (server-side
# apply: create, patch); retention deletes an unused one.
- apiGroups: [pd.sglang-operator.io]
  resources: [kernelbuilds]
  verbs: [get, list, watch, create, patch, delete]
# PDRoleScales (one per role whose replicas is omitted): created at their seed count,
# applied (labels, owner), deleted when the role's count is fixed again; watched so
# kubectl scale, an HPA or KEDA reach the reconcile. The planner and the operator write
# counts through /scale (a PDRoleScale's; a serving group's Deployment, or a multi-node role's
# LeaderWorkerSet, while a new group surges).
- apiGroups: [pd.sglang-operator.io]
  resources: [pdrolescales]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [pd.sglang-operator.io]
  resources: [pdrolescales/scale]
  verbs: [patch]
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [patch]
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets/scale]
  verbs: [patch]
# Which PDRoleScale an HPA (or KEDA's) targets: the planner steps aside for it (read every 30 s).
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list]
# Status is the only thing the operator writes on the user's objects (merge patch); and its
# PDRoleScales' status (replicas and selector, read by /scale).
- apiGroups: [pd.sglang-operator.io]
  resources: [pddeployments/status, kernelbuilds/status, pdrolescales/status]
  verbs: [patch]
# Children carry ownerReferences with blockOwnerDeletion: clusters with the
# OwnerReferencesPermissionEnforcement admission plugin require update on the owner's finalizers.
- apiGroups: [pd.sglang-operator.io]
  resources: [pddeployments/finalizers, kernelbuilds/finalizers]
  verbs: [update]
# Prefill, decode and gateway Deployments: server-side apply (create/patch), prune drained
# groups; watched so status follows readiness.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# With LeaderWorkerSet installed (an optional dependency, sigs.k8s.io/lws): a role whose
# replicas span nodes is one LeaderWorkerSet per compat group: apply, prune, watched so
# status follows its groups. Harmless without LWS (the kind does not exist).
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch, delete]
# With NVIDIA's DRA driver (an optional dependency): a multi-node role on GB200 / GB300 gets
# one ComputeDomain (IMEX channels) per LeaderWorkerSet: create (its spec is immutable),
# prune, watched so a group counts Ready only once its nodes joined. Harmless without it.
- apiGroups: [resource.nvidia.com]
  resources: [computedomains]
  verbs: [get, list, watch, create, delete]
# With Kueue (an optional dependency, spec.scheduling.queueName): while a queued group's
# pods are gated, its Workloads' conditions say why (Ready WaitingForCapacity). Read only,
# not watched. Harmless without Kueue.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list]
# Kernel build Jobs (one per attempt): create, delete stale or superseded attempts; watched
# so a build's status follows its Job.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
# Per-role ConfigMaps and headless Services, the user-facing Service: apply, watch, prune.
# A KernelBuild's request ConfigMap: apply. get: the admin's catalog ConfigMap where it is
# not in the operator's own namespace's Role.
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [get, list, watch, create, patch, delete]
# A KernelBuild's cache volume: created once if missing (PVC specs are immutable).
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, create, patch]
# The gateway's ServiceAccount, Role and RoleBinding (pod discovery): apply, watched.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, list, watch, create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch]
# Pods: watched (scheduling, a build pod's result in its termination message, the SLO
# scraper's targets); get is held because the operator grants it (and list, watch) to the
# gateway's Role (RBAC lets it grant only what it holds).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# With the Prometheus Operator installed: a PodMonitor per PDDeployment, and a
# PrometheusRule with spec.slo (deleted when spec.slo is removed).
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [get, create, patch]
- apiGroups: [monitoring.coreos.com]
  resources: [prometheusrules]
  verbs: [get, create, patch, delete]
# Events on PDDeployments (InvalidSpec, rollout steps) and KernelBuilds (build failed, retrying).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{- define "sglang-pd-operator.oracleName" -}}
{{- printf "%s-oracle" (include "sglang-pd-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sglang-pd-operator.oracleImage" -}}
{{- with .Values.oracle.image }}
{{- if .digest }}
{{- printf "%s@%s" .repository .digest }}
{{- else }}
{{- printf "%s:%s" .repository (default $.Chart.AppVersion .tag) }}
{{- end }}
{{- end }}
{{- end }}
