{{/* Names, labels and the operator's RBAC rules, shared by the templates. Every helper is namespaced "skiff.". */}}

{{/* The chart name, or nameOverride. */}}
{{- define "skiff.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every resource name: fullnameOverride, else <release>-skiff (just <release> if it contains the chart name). */}}
{{- define "skiff.fullname" -}}
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

{{/* Cluster-scoped objects carry the release namespace too, so releases of the same name in two namespaces (one
operator per team namespace) do not collide. */}}
{{- define "skiff.clusterName" -}}
{{- printf "%s-%s" (include "skiff.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Lease the replicas elect a leader on, and its Role and RoleBinding. */}}
{{- define "skiff.leaderName" -}}
{{- printf "%s-leader" (include "skiff.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "skiff.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels the operator Deployment selects its pod by; stable across upgrades. */}}
{{- define "skiff.selectorLabels" -}}
app.kubernetes.io/name: {{ include "skiff.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The labels on every object of the release. */}}
{{- define "skiff.labels" -}}
helm.sh/chart: {{ include "skiff.chart" . }}
{{ include "skiff.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "skiff.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "skiff.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "skiff.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The runtime image of models that name none (--default-runtime-image): runtimeImage, else skiff-runtime beside
the operator image (what `make push REGISTRY=host/ns` pushed), tagged with the chart's appVersion, not image.tag: a
helm upgrade to a new operator build leaves models that name no image on the runtime they run (e2e/test_install). */}}
{{- define "skiff.runtimeImage" -}}
{{- if .Values.runtimeImage }}
{{- .Values.runtimeImage }}
{{- else }}
{{- printf "%s/skiff-runtime:%s" (dir .Values.image.repository) .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* The admission policy's image prefixes, as a JSON list: admissionPolicy.allowedImagePrefixes, else the registry
and namespace the runtime image is in ("host/ns/"; a tag or digest never holds a "/"). */}}
{{- define "skiff.allowedImagePrefixes" -}}
{{- if .Values.admissionPolicy.allowedImagePrefixes }}
{{- .Values.admissionPolicy.allowedImagePrefixes | toJson }}
{{- else }}
{{- list (printf "%s/" (dir (include "skiff.runtimeImage" .))) | toJson }}
{{- end }}
{{- end }}

{{/* True (non-empty) when the operator watches every namespace: only with clusterWide, an explicit opt-in. */}}
{{- define "skiff.clusterwide" -}}
{{- if .Values.clusterWide }}
{{- if .Values.watchNamespaces }}
{{- fail "set either clusterWide=true or watchNamespaces, not both" }}
{{- end }}true
{{- end }}
{{- end }}

{{/* The namespaces served when not cluster-wide, as a JSON list: watchNamespaces, else the release namespace. */}}
{{- define "skiff.watchNamespaces" -}}
{{- if include "skiff.clusterwide" . }}[]
{{- else }}{{ default (list .Release.Namespace) .Values.watchNamespaces | toJson }}
{{- end }}
{{- end }}

{{/* What the operator does in a namespace it watches (docs/operator.md, "The operator's RBAC needs"). The verbs
are exactly what it calls; e2e/test_install.py runs the operator with only these and checks for no 403. */}}
{{- define "skiff.namespacedRules" -}}
# The InferenceModels: watched by kopf (event handlers only: kopf writes no annotations or finalizers on them),
# read by name for each reconcile; only their status is written.
- apiGroups: [skiff.dev]
  resources: [inferencemodels]
  verbs: [get, list, watch]
- apiGroups: [skiff.dev]
  resources: [inferencemodels/status]
  verbs: [patch]
# The children, applied with server-side apply. An apply (PATCH) that creates the object needs create as well as
# patch; list (label-selected) reads the model's children each reconcile; get looks up a name the model would
# write that is not among them, which it must not take over (NameConflict); watch is kopf's; delete is for
# versions removed from a model.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# spec.rollout reads the metrics of a version's pods only when the pod's controlling ReplicaSet is controlled by the
# version's Deployment (by uid): the model's ReplicaSets are listed, label-selected, for that check.
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [list]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
# Pod states feed the model's status: listed and watched with a label selector the API server applies (RBAC
# cannot scope a verb to labels; the operator never asks for unlabelled Pods).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# FailedScheduling events feed the status (a field-selected list); Events are posted on the model.
- apiGroups: [""]
  resources: [events]
  verbs: [list, create]
# A version's Deployment is held back while the claim in its modelUri is missing.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
# TLS: Secrets are read by name only (no list, no watch) and written by server-side apply (no update).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
- apiGroups: [cert-manager.io]
  resources: [certificates]
  verbs: [get, create, patch]
# The per-model NetworkPolicy (spec.networkPolicy): listed with the children, deleted when turned off.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, create, patch, delete]
# A PodDisruptionBudget per version of more than one replica: listed with the children, deleted with the version.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, create, patch, delete]
# Per-request traffic splits between versions (a GRPCRoute; with REST and a restSectionName, an HTTPRoute too); with
# TLS, how the gateway verifies the pods (a BackendTLSPolicy per version Service, and a ConfigMap with only the CA
# certificate it references).
- apiGroups: [gateway.networking.k8s.io]
  resources: [grpcroutes, httproutes, backendtlspolicies]
  verbs: [get, list, create, patch, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, create, patch, delete]
{{- end }}

{{/* Cluster-scoped reads, needed in both scopes: kopf watches CRDs to learn which resources exist (and which
optional APIs, such as GRPCRoute and Certificate, are installed), and watches Namespaces to follow the ones it
serves (without this rule kopf 1.45 retries for a minute, 403 after 403, before it starts handling models). */}}
{{- define "skiff.clusterRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
